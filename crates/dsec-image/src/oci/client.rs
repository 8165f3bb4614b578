//! HTTP to one repository of an OCI registry (the distribution API), shared
//! by pull and push: the URLs, the answer to a `401` challenge (`Basic`
//! credentials, or a `Bearer` token from the realm the registry names), and
//! the mapping of HTTP failures to [`RegistryError`].

use std::io::{self, Read};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;

use super::registry::{RegistryError, RegistryRef};

/// Manifests and config blobs are read whole; nothing legitimate is larger.
const MAX_DOCUMENT_BYTES: u64 = 16 << 20;

/// How to reach the registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Plain HTTP even for a non-loopback registry.
    pub plain_http: bool,
    /// `(user, password)` for registries that want them.
    pub credentials: Option<(String, String)>,
}

/// A request body that can be produced again: a request answered `401`
/// is sent a second time with the credentials, and a streamed body is
/// gone after the first try.
pub(crate) type Body<'a> = &'a dyn Fn() -> io::Result<(Box<dyn Read + Send + 'a>, u64)>;

pub(crate) struct Client {
    agent: ureq::Agent,
    base: String,
    repository: String,
    credentials: Option<(String, String)>,
    /// `Authorization` value once a challenge was answered.
    auth: Mutex<Option<String>>,
}

impl Client {
    pub(crate) fn new(r: &RegistryRef, options: &RegistryOptions) -> Client {
        let scheme = if options.plain_http || r.is_loopback() { "http" } else { "https" };
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(15))
            .timeout_read(Duration::from_secs(120))
            .user_agent(concat!("dsec/", env!("CARGO_PKG_VERSION")))
            // A redirect of an upload must not be followed as a GET.
            .redirects(0)
            .build();
        Client {
            agent,
            base: format!("{scheme}://{}", r.registry),
            repository: r.repository.clone(),
            credentials: options.credentials.clone(),
            auth: Mutex::new(None),
        }
    }

    pub(crate) fn url_manifest(&self, reference: &str) -> String {
        format!("{}/v2/{}/manifests/{reference}", self.base, self.repository)
    }

    pub(crate) fn url_blob(&self, digest: &str) -> String {
        format!("{}/v2/{}/blobs/{digest}", self.base, self.repository)
    }

    pub(crate) fn url_uploads(&self) -> String {
        format!("{}/v2/{}/blobs/uploads/", self.base, self.repository)
    }

    /// A `Location` header made absolute (registries may answer a path).
    pub(crate) fn absolute(&self, location: &str) -> String {
        if location.starts_with("http://") || location.starts_with("https://") {
            location.to_string()
        } else if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            format!("{}/{location}", self.base)
        }
    }

    /// `GET /v2/`: whether the registry answers and takes our credentials,
    /// before any slow work is done for it.
    pub(crate) fn ping(&self) -> Result<(), RegistryError> {
        let url = format!("{}/v2/", self.base);
        self.get(&url, None).map(|_| ())
    }

    /// The manifest named by a tag or digest, and the media type the
    /// registry gave it.
    pub(crate) fn manifest(&self, reference: &str, accept: &str) -> Result<(Vec<u8>, String), RegistryError> {
        let url = self.url_manifest(reference);
        let resp = self.get(&url, Some(accept))?;
        let media_type = resp.content_type().to_string();
        let bytes = read_limited(&url, resp)?;
        Ok((bytes, media_type))
    }

    /// A blob small enough to hold in memory (a config).
    pub(crate) fn small_blob(&self, digest: &str) -> Result<Vec<u8>, RegistryError> {
        let url = self.url_blob(digest);
        read_limited(&url, self.get(&url, None)?)
    }

    /// Whether the repository holds the blob (`HEAD`).
    pub(crate) fn has_blob(&self, digest: &str) -> Result<bool, RegistryError> {
        match self.send("HEAD", &self.url_blob(digest), &[], None) {
            Ok(_) => Ok(true),
            Err(RegistryError::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A blob as a stream.
    pub(crate) fn blob(&self, digest: &str) -> Result<Box<dyn Read + Send>, RegistryError> {
        Ok(self.get(&self.url_blob(digest), None)?.into_reader())
    }

    fn get(&self, url: &str, accept: Option<&str>) -> Result<ureq::Response, RegistryError> {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
        self.send("GET", url, &headers, None)
    }

    /// One request with the current authorisation; on a `401` answers the
    /// challenge once and retries (each request may need its own: a token
    /// for `pull` does not allow `push`).
    pub(crate) fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<Body<'_>>,
    ) -> Result<ureq::Response, RegistryError> {
        type Payload<'b> = Option<(Box<dyn Read + Send + 'b>, u64)>;
        let payload = || -> Result<Payload<'_>, RegistryError> {
            body.map(|make| make()).transpose().map_err(|source| RegistryError::LocalRead { url: url.to_string(), source })
        };
        let attempt = |auth: Option<&str>| -> Result<Result<ureq::Response, ureq::Error>, RegistryError> {
            let mut req = self.agent.request(method, url);
            for (k, v) in headers {
                req = req.set(k, v);
            }
            if let Some(a) = auth {
                req = req.set("Authorization", a);
            }
            Ok(match payload()? {
                // An explicit length: ureq would otherwise send chunked,
                // which some registries refuse for blob uploads.
                Some((reader, len)) => req.set("Content-Length", &len.to_string()).send(reader),
                None => req.call(),
            })
        };
        let current = self.auth.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match attempt(current.as_deref())? {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(401, resp)) => {
                let challenge = resp.header("www-authenticate").unwrap_or_default().to_string();
                let auth = self.answer(url, &challenge)?;
                *self.auth.lock().unwrap_or_else(|e| e.into_inner()) = Some(auth.clone());
                attempt(Some(&auth))?.map_err(|e| status_error(url, e))
            }
            Err(e) => Err(status_error(url, e)),
        }
    }

    /// `Basic` -> the credentials; `Bearer realm=...,service=...,scope=...`
    /// -> a token from the realm (anonymous unless credentials are set).
    fn answer(&self, url: &str, challenge: &str) -> Result<String, RegistryError> {
        let basic = || {
            self.credentials
                .as_ref()
                .map(|(u, p)| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))))
        };
        let (scheme, params) = challenge.split_once(' ').unwrap_or((challenge, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return basic().ok_or(RegistryError::Denied { url: url.to_string(), status: 401 });
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(RegistryError::Denied { url: url.to_string(), status: 401 });
        }
        let params = parse_challenge(params);
        let realm = params.iter().find(|(k, _)| k == "realm").map(|(_, v)| v.clone()).ok_or_else(|| RegistryError::Protocol {
            url: url.to_string(),
            message: format!("bearer challenge without a realm: {challenge}"),
        })?;
        let mut req = self.agent.get(&realm);
        for (k, v) in &params {
            if k == "service" || k == "scope" {
                req = req.query(k, v);
            }
        }
        if let Some(b) = basic() {
            req = req.set("Authorization", &b);
        }
        let resp = req.call().map_err(|e| status_error(&realm, e))?;
        let body = read_limited(&realm, resp)?;
        let token: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| RegistryError::Protocol { url: realm.clone(), message: format!("token response is not JSON: {e}") })?;
        let token = token
            .get("token")
            .or_else(|| token.get("access_token"))
            .and_then(|t| t.as_str())
            .ok_or_else(|| RegistryError::Protocol { url: realm.clone(), message: "token response has no token".into() })?;
        Ok(format!("Bearer {token}"))
    }
}

/// `realm="x",service="y"` -> pairs (values may contain commas inside
/// their quotes).
pub(crate) fn parse_challenge(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            match quoted.split_once('"') {
                Some((v, n)) => (v.to_string(), n),
                None => (quoted.to_string(), ""),
            }
        } else {
            match after.split_once(',') {
                Some((v, n)) => (v.trim().to_string(), n),
                None => (after.trim().to_string(), ""),
            }
        };
        out.push((key, value));
        rest = next.trim_start_matches(',').trim();
    }
    out
}

pub(crate) fn read_limited(url: &str, resp: ureq::Response) -> Result<Vec<u8>, RegistryError> {
    let mut out = Vec::new();
    resp.into_reader()
        .take(MAX_DOCUMENT_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| RegistryError::Unreachable { url: url.to_string(), message: e.to_string() })?;
    if out.len() as u64 > MAX_DOCUMENT_BYTES {
        return Err(RegistryError::Protocol { url: url.to_string(), message: "document larger than 16 MiB".into() });
    }
    Ok(out)
}

fn status_error(url: &str, e: ureq::Error) -> RegistryError {
    match e {
        ureq::Error::Status(404, _) => RegistryError::NotFound { url: url.to_string() },
        ureq::Error::Status(s @ (401 | 403), _) => RegistryError::Denied { url: url.to_string(), status: s },
        ureq::Error::Status(status, resp) => {
            RegistryError::Status { url: url.to_string(), status, body: resp.into_string().unwrap_or_default().chars().take(300).collect() }
        }
        ureq::Error::Transport(t) => RegistryError::Unreachable { url: url.to_string(), message: t.to_string() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges() {
        let p = parse_challenge(r#"realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#);
        assert_eq!(p[0], ("realm".into(), "https://auth.example/token".into()));
        assert_eq!(p[2], ("scope".into(), "repository:a/b:pull,push".into()));
    }
}
