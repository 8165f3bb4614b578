//! Signed port URLs: for clients that cannot add an `Authorization` header
//! (a browser, a tool given only a URL). The query carries the tenant, an
//! expiry and an HMAC-SHA256 over sandbox id, port, tenant and expiry; the
//! key is derived from the apiserver's admin token, so replicas sharing
//! one admin token file accept each other's URLs and replacing that token
//! revokes every URL made before.

use dsec_api::ErrorCode;
use dsec_edge::Caller;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::ApiError;

pub const EXPIRES_PARAM: &str = "dsec_expires";
pub const TENANT_PARAM: &str = "dsec_tenant";
pub const SIGNATURE_PARAM: &str = "dsec_sig";

/// The longest a signed URL may live: a week.
pub const MAX_TTL_S: u64 = 7 * 24 * 3600;

type HmacSha256 = Hmac<Sha256>;

/// Makes and checks signed URLs with one key.
pub struct UrlSigner {
    key: [u8; 32],
}

impl UrlSigner {
    /// The signer whose key derives from `secret` (the admin token).
    pub fn from_secret(secret: &str) -> Self {
        let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
        mac.update(b"dsec port URL signing key v1");
        Self { key: mac.finalize().into_bytes().into() }
    }

    fn mac(&self, id: &str, port: u16, tenant: &str, expires: u64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        // Fields joined by NUL: none of them may contain one.
        mac.update(format!("{id}\0{port}\0{tenant}\0{expires}").as_bytes());
        mac
    }

    /// The query (without `?`) granting `tenant` access to `port` of
    /// sandbox `id` until `expires` (Unix seconds).
    pub fn query(&self, id: &str, port: u16, tenant: &str, expires: u64) -> String {
        let sig = hex::encode(self.mac(id, port, tenant, expires).finalize().into_bytes());
        form_urlencoded::Serializer::new(String::new())
            .append_pair(EXPIRES_PARAM, &expires.to_string())
            .append_pair(TENANT_PARAM, tenant)
            .append_pair(SIGNATURE_PARAM, &sig)
            .finish()
    }

    /// A path segment granting the same as [`UrlSigner::query`], for
    /// clients that take only a base URL and append their own paths
    /// (`/v1/port-urls/{token}/...`): `ID~PORT~TENANT~EXPIRES~SIG` (no
    /// field holds a `~`).
    pub fn path_token(&self, id: &str, port: u16, tenant: &str, expires: u64) -> String {
        let sig = hex::encode(self.mac(id, port, tenant, expires).finalize().into_bytes());
        format!("{id}~{port}~{tenant}~{expires}~{sig}")
    }

    /// `(id, port, caller)` of a path token, checked at `now`.
    pub fn verify_token(&self, token: &str, now: u64) -> Result<(String, u16, Caller), ApiError> {
        let refused = |why: &str| ApiError::new(ErrorCode::Unauthorized, format!("signed URL refused: {why}"));
        let parts: Vec<&str> = token.split('~').collect();
        let [id, port, tenant, expires, sig] = parts[..] else { return Err(refused("malformed token")) };
        let port: u16 = port.parse().map_err(|_| refused("the port is not a number"))?;
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair(EXPIRES_PARAM, expires)
            .append_pair(TENANT_PARAM, tenant)
            .append_pair(SIGNATURE_PARAM, sig)
            .finish();
        let caller = self.verify(id, port, &query, now)?.ok_or_else(|| refused("no signature"))?;
        Ok((id.to_string(), port, caller))
    }

    /// The caller a signed query stands for, checked at `now` (Unix
    /// seconds); `Ok(None)` if the query carries no signature.
    pub fn verify(&self, id: &str, port: u16, query: &str, now: u64) -> Result<Option<Caller>, ApiError> {
        let (mut expires, mut tenant, mut sig) = (None, None, None);
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                EXPIRES_PARAM => expires = Some(v.into_owned()),
                TENANT_PARAM => tenant = Some(v.into_owned()),
                SIGNATURE_PARAM => sig = Some(v.into_owned()),
                _ => {}
            }
        }
        let Some(sig) = sig else { return Ok(None) };
        let refused = |why: &str| ApiError::new(ErrorCode::Unauthorized, format!("signed URL refused: {why}"));
        let (Some(expires), Some(tenant)) = (expires, tenant) else {
            return Err(refused(&format!("it needs {EXPIRES_PARAM} and {TENANT_PARAM} beside {SIGNATURE_PARAM}")));
        };
        let expires: u64 = expires.parse().map_err(|_| refused("the expiry is not a number"))?;
        let sig = hex::decode(&sig).map_err(|_| refused("the signature is not hex"))?;
        // verify_slice compares in constant time.
        self.mac(id, port, &tenant, expires).verify_slice(&sig).map_err(|_| refused("the signature does not match"))?;
        if now >= expires {
            return Err(refused("it has expired"));
        }
        Ok(Some(Caller { tenant, admin: false }))
    }
}

/// Removes the signature's parameters from a query (the sandbox's server
/// never sees them); `None` if nothing is left.
pub fn strip(query: &str) -> Option<String> {
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| {
            let key = kv.split('=').next().unwrap_or("");
            !kv.is_empty() && ![EXPIRES_PARAM, TENANT_PARAM, SIGNATURE_PARAM].contains(&key)
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_query_verifies_until_it_expires_and_only_for_its_port() {
        let s = UrlSigner::from_secret("admin-token");
        let q = s.query("n1.abc", 8000, "team-a", 1000);
        assert_eq!(s.verify("n1.abc", 8000, &q, 999).unwrap().unwrap().tenant, "team-a");
        assert_eq!(s.verify("n1.abc", 8000, &q, 1000).unwrap_err().code, ErrorCode::Unauthorized);
        assert!(s.verify("n1.abc", 8001, &q, 999).is_err(), "another port");
        assert!(s.verify("n1.abd", 8000, &q, 999).is_err(), "another sandbox");
        let later = q.replace("dsec_expires=1000", "dsec_expires=2000");
        assert!(s.verify("n1.abc", 8000, &later, 999).is_err(), "an altered expiry");
        let other = q.replace("team-a", "team-b");
        assert!(s.verify("n1.abc", 8000, &other, 999).is_err(), "an altered tenant");
        assert!(UrlSigner::from_secret("other").verify("n1.abc", 8000, &q, 999).is_err(), "another key");
        assert!(s.verify("n1.abc", 8000, "a=1", 999).unwrap().is_none(), "unsigned");
    }

    #[test]
    fn a_path_token_verifies_like_the_query() {
        let s = UrlSigner::from_secret("admin-token");
        let t = s.path_token("n1.abc", 8000, "team-a", 1000);
        let (id, port, c) = s.verify_token(&t, 999).unwrap();
        assert_eq!((id.as_str(), port, c.tenant.as_str()), ("n1.abc", 8000, "team-a"));
        assert!(s.verify_token(&t, 1000).is_err(), "expired");
        assert!(s.verify_token(&t.replace("~8000~", "~8001~"), 999).is_err(), "another port");
        assert!(s.verify_token("n1.abc~8000", 999).is_err(), "malformed");
    }

    #[test]
    fn strip_keeps_the_applications_own_parameters() {
        assert_eq!(strip("a=1&dsec_expires=5&dsec_tenant=t&dsec_sig=ff&b=2").as_deref(), Some("a=1&b=2"));
        assert_eq!(strip("dsec_sig=ff"), None);
        assert_eq!(strip(""), None);
    }
}
