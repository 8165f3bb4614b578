//! Projects (the tenants of before are top-level ones) and their bearer
//! tokens, kept in the shared store (`dsec-store`); the IAM rules on top
//! are in `iam`.
//!
//! Tokens are random 256-bit values shown once, at creation; the store
//! keeps only their SHA-256. Every request asks the store what its token
//! grants: with SQLite (one apiserver) that is an in-memory lookup; with
//! PostgreSQL (replicas) one indexed query, so a token created or revoked
//! through any replica holds, or stops holding, on every replica at once.

use std::path::Path;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use dsec_api::ErrorCode;
use dsec_edge::model::now_ms;
use dsec_edge::Caller;
use dsec_store::{AnyStore, Database, NewToken, Principal, Store, StoreError};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::AppState;

pub const ADMIN_TENANT: &str = "admin";

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("admin token file {path}: {source}")]
    TokenFile { path: String, source: std::io::Error },
    #[error("tenant {0:?} already exists")]
    Exists(String),
    #[error("tenant names are 1-64 characters of a-z, 0-9, '-' and '_' (got {0:?})")]
    BadName(String),
}

#[derive(Debug, Clone)]
pub struct Tenant {
    pub name: String,
    pub admin: bool,
    pub created_at_ms: u64,
}

impl From<Principal> for Tenant {
    fn from(p: Principal) -> Self {
        Tenant { name: p.name, admin: p.admin, created_at_ms: p.created_at_ms }
    }
}

pub struct TokenStore {
    store: AnyStore,
    /// Signs port URLs with a key derived from the admin token.
    signer: crate::ports::signed::UrlSigner,
    /// What each project holds against its quota (and the quotas).
    ledger: std::sync::Arc<crate::quota::Ledger>,
}

pub(crate) fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

pub(crate) fn new_token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    format!("dsec_{}", hex::encode(b))
}

impl TokenStore {
    /// Opens the store and makes the token in `admin_token_file` an admin
    /// token, writing a new one there (mode 0600) if the file is missing.
    /// With SQLite the file's token is the only admin token; with
    /// PostgreSQL each replica's file adds its own (give them the same file
    /// to share one).
    pub async fn open(db: &Database, admin_token_file: &Path) -> Result<TokenStore, AuthError> {
        let store = AnyStore::open(db).await?;
        let admin = ensure_admin(&store, admin_token_file).await?;
        let ledger = std::sync::Arc::new(crate::quota::Ledger::new(store.quotas().await?));
        Ok(TokenStore { store, signer: crate::ports::signed::UrlSigner::from_secret(&admin), ledger })
    }
}

/// Makes the token in `file` (written if missing) the admin token; returns it.
async fn ensure_admin(store: &AnyStore, file: &Path) -> Result<String, AuthError> {
    let file_err = |source| AuthError::TokenFile { path: file.display().to_string(), source };
    let token = match std::fs::read_to_string(file) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        _ => {
            let t = new_token();
            write_private(file, &t).map_err(file_err)?;
            t
        }
    };
    let record = NewToken { hash: hash(&token), created_at_ms: now_ms(), expires_at_ms: None };
    store.set_admin_token(ADMIN_TENANT, record, store.is_exclusive()).await?;
    Ok(token)
}

impl TokenStore {
    /// A store opened by someone else, with no admin token of its own (the
    /// watcher: it only checks the tokens apiservers present, so it signs
    /// no port URL and holds no quota ledger of its own).
    pub fn from_store(store: AnyStore) -> TokenStore {
        TokenStore {
            store,
            signer: crate::ports::signed::UrlSigner::from_secret(&new_token()),
            ledger: std::sync::Arc::new(crate::quota::Ledger::new(Vec::new())),
        }
    }

    /// The tenant `token` stands for; `None` if unknown, revoked or expired.
    pub async fn verify(&self, token: &str) -> Result<Option<Tenant>, StoreError> {
        Ok(self.store.grant(&hash(token), now_ms()).await?.map(|g| g.principal.into()))
    }

    /// What `token` grants, and its hash; `None` if unknown, revoked or
    /// expired.
    pub async fn grant(&self, token: &str) -> Result<Option<(dsec_store::Grant, dsec_store::TokenHash)>, StoreError> {
        let h = hash(token);
        Ok(self.store.grant(&h, now_ms()).await?.map(|g| (g, h)))
    }

    /// The quota ledger.
    pub fn ledger(&self) -> &std::sync::Arc<crate::quota::Ledger> {
        &self.ledger
    }

    /// Creates a tenant and returns its token (shown only this once).
    pub async fn create(&self, name: &str) -> Result<(Tenant, String), AuthError> {
        let ok =
            (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(AuthError::BadName(name.to_string()));
        }
        let token = new_token();
        let principal = Principal::tenant(name, false, now_ms());
        let first = NewToken { hash: hash(&token), created_at_ms: principal.created_at_ms, expires_at_ms: None };
        match self.store.create_principal(&principal, Some(first)).await {
            Ok(()) => Ok((principal.into(), token)),
            Err(StoreError::Exists(_)) => Err(AuthError::Exists(name.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    /// Revokes a token; `false` if it was not live.
    pub async fn revoke(&self, token: &str) -> Result<bool, StoreError> {
        self.store.revoke_token(&hash(token), now_ms()).await
    }

    pub async fn list(&self) -> Result<Vec<Tenant>, StoreError> {
        Ok(self.store.principals().await?.into_iter().map(Tenant::from).collect())
    }

    /// The signer of port URLs.
    pub fn url_signer(&self) -> &crate::ports::signed::UrlSigner {
        &self.signer
    }

    /// The store itself, for what else the control plane keeps there.
    pub fn store(&self) -> &AnyStore {
        &self.store
    }
}

fn write_private(path: &Path, token: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    f.write_all(token.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Who may call this API, and how callers are named.
pub enum Authenticator {
    /// Users' bearer tokens (the apiserver, `dsec up`).
    Tokens(TokenStore),
    /// An edge serving its node to apiservers only: requests carry the
    /// cluster's shared secret as bearer token and name the caller (already
    /// authenticated by the apiserver) in `x-dsec-tenant` / `x-dsec-admin`.
    Cluster { secret_sha256: [u8; 32] },
}

pub const TENANT_HEADER: &str = "x-dsec-tenant";
pub const ADMIN_HEADER: &str = "x-dsec-admin";

impl Authenticator {
    pub fn cluster(secret: &str) -> Self {
        Authenticator::Cluster { secret_sha256: hash(secret) }
    }

    pub fn tokens(&self) -> Option<&TokenStore> {
        match self {
            Authenticator::Tokens(t) => Some(t),
            Authenticator::Cluster { .. } => None,
        }
    }

    pub async fn authenticate(&self, headers: &axum::http::HeaderMap) -> Result<Caller, ApiError> {
        let header = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let token = header.and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")));
        let Some(token) = token.map(str::trim) else {
            return Err(ApiError::new(ErrorCode::Unauthorized, "missing 'Authorization: Bearer TOKEN' header"));
        };
        match self {
            Authenticator::Tokens(store) => match store.verify(token).await? {
                Some(t) => Ok(Caller { tenant: t.name, admin: t.admin }),
                None => Err(ApiError::new(ErrorCode::Unauthorized, "invalid token")),
            },
            Authenticator::Cluster { secret_sha256 } => {
                // Constant-time compare of the hashes.
                let h = hash(token);
                if h.iter().zip(secret_sha256).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
                    return Err(ApiError::new(ErrorCode::Unauthorized, "invalid cluster token"));
                }
                let tenant = headers.get(TENANT_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("");
                if tenant.is_empty() {
                    return Err(ApiError::invalid(format!("cluster calls must name the caller in {TENANT_HEADER}")));
                }
                let admin = headers.get(ADMIN_HEADER).and_then(|v| v.to_str().ok()) == Some("true");
                Ok(Caller { tenant: tenant.to_string(), admin })
            }
        }
    }
}

/// The authenticated caller of a request.
pub struct Auth(pub Caller);

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        state.auth.authenticate(&parts.headers).await.map(Auth)
    }
}

/// An authenticated admin.
pub struct Admin(pub Caller);

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let Auth(c) = Auth::from_request_parts(parts, state).await?;
        if !c.admin {
            return Err(ApiError::new(ErrorCode::Forbidden, "this call needs the admin token"));
        }
        Ok(Admin(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn sqlite(dir: &Path) -> Database {
        Database::Sqlite(dir.join("api.db"))
    }

    #[tokio::test]
    async fn admin_token_is_written_once_private_and_verifies() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("admin-token");
        let s = TokenStore::open(&sqlite(d.path()), &file).await.unwrap();
        let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(s.verify(&token).await.unwrap().unwrap().admin);
        assert!(s.verify("nope").await.unwrap().is_none());
        drop(s);
        let s = TokenStore::open(&sqlite(d.path()), &file).await.unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token, "the token is kept across restarts");
        assert!(s.verify(&token).await.unwrap().is_some());
        drop(s);
        // A new token file (the old one deleted): the old token stops working.
        std::fs::remove_file(&file).unwrap();
        let s = TokenStore::open(&sqlite(d.path()), &file).await.unwrap();
        assert!(s.verify(&token).await.unwrap().is_none());
        assert!(s.verify(std::fs::read_to_string(&file).unwrap().trim()).await.unwrap().unwrap().admin);
    }

    #[tokio::test]
    async fn cluster_mode_takes_the_caller_from_headers_only_with_the_secret() {
        use axum::http::HeaderMap;
        let auth = Authenticator::cluster("s3cret");
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer s3cret".parse().unwrap());
        assert!(auth.authenticate(&h).await.is_err(), "the tenant header is required");
        h.insert(TENANT_HEADER, "team-a".parse().unwrap());
        assert_eq!(auth.authenticate(&h).await.unwrap(), Caller { tenant: "team-a".into(), admin: false });
        h.insert(ADMIN_HEADER, "true".parse().unwrap());
        assert!(auth.authenticate(&h).await.unwrap().admin);
        h.insert("authorization", "Bearer wrong".parse().unwrap());
        assert_eq!(auth.authenticate(&h).await.unwrap_err().code, ErrorCode::Unauthorized);
    }

    #[tokio::test]
    async fn tenants_get_their_own_tokens_and_revoked_ones_stop_working() {
        let d = tempfile::tempdir().unwrap();
        let s = TokenStore::open(&sqlite(d.path()), &d.path().join("t")).await.unwrap();
        let (t, token) = s.create("team-a").await.unwrap();
        assert!(!t.admin);
        assert_eq!(s.verify(&token).await.unwrap().unwrap().name, "team-a");
        assert!(matches!(s.create("team-a").await, Err(AuthError::Exists(_))));
        assert!(matches!(s.create("Bad Name").await, Err(AuthError::BadName(_))));
        assert_eq!(s.list().await.unwrap().len(), 2);
        assert!(s.revoke(&token).await.unwrap());
        assert!(s.verify(&token).await.unwrap().is_none());
    }
}
