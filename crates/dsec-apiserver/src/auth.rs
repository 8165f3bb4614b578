//! Tenants and their bearer tokens.
//!
//! Tokens are random 256-bit values shown once, at creation; the database
//! keeps only their SHA-256. Lookups hit an in-memory map, so checking a token
//! costs one hash per request.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, RwLock};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use dsec_api::ErrorCode;
use dsec_edge::Caller;
use rand::RngCore;
use rusqlite::{params, Connection};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::state::AppState;

pub const ADMIN_TENANT: &str = "admin";

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("apiserver database: {0}")]
    Sqlite(#[from] rusqlite::Error),
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

pub struct TokenStore {
    conn: Mutex<Connection>,
    by_hash: RwLock<HashMap<[u8; 32], Tenant>>,
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn new_token() -> String {
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    format!("dsec_{}", hex::encode(b))
}

use dsec_edge::model::now_ms;

impl TokenStore {
    /// Opens the tenant database; on first start creates the admin tenant and
    /// writes its token to `admin_token_file` (mode 0600).
    pub fn open(db: &Path, admin_token_file: &Path) -> Result<TokenStore, AuthError> {
        let conn = Connection::open(db)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS tenants (
                 name TEXT PRIMARY KEY,
                 token_sha256 BLOB NOT NULL UNIQUE,
                 admin INTEGER NOT NULL,
                 created_at_ms INTEGER NOT NULL
             );",
        )?;
        let store = TokenStore { conn: Mutex::new(conn), by_hash: RwLock::new(HashMap::new()) };
        store.ensure_admin(admin_token_file)?;
        store.reload()?;
        Ok(store)
    }

    fn ensure_admin(&self, file: &Path) -> Result<(), AuthError> {
        let file_err = |source| AuthError::TokenFile { path: file.display().to_string(), source };
        let token = match std::fs::read_to_string(file) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            _ => {
                let t = new_token();
                write_private(file, &t).map_err(file_err)?;
                t
            }
        };
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.execute(
            "INSERT INTO tenants (name, token_sha256, admin, created_at_ms) VALUES (?1, ?2, 1, ?3)
             ON CONFLICT(name) DO UPDATE SET token_sha256 = excluded.token_sha256, admin = 1",
            params![ADMIN_TENANT, hash(&token).to_vec(), now_ms() as i64],
        )?;
        Ok(())
    }

    fn reload(&self) -> Result<(), AuthError> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let mut stmt = conn.prepare("SELECT name, token_sha256, admin, created_at_ms FROM tenants")?;
        let rows = stmt.query_map([], |r| {
            let h: Vec<u8> = r.get(1)?;
            Ok((h, Tenant { name: r.get(0)?, admin: r.get::<_, i64>(2)? != 0, created_at_ms: r.get::<_, i64>(3)? as u64 }))
        })?;
        let mut map = HashMap::new();
        for row in rows {
            let (h, t) = row?;
            if let Ok(h) = <[u8; 32]>::try_from(h.as_slice()) {
                map.insert(h, t);
            }
        }
        *self.by_hash.write().unwrap_or_else(|p| p.into_inner()) = map;
        Ok(())
    }

    pub fn verify(&self, token: &str) -> Option<Tenant> {
        self.by_hash.read().unwrap_or_else(|p| p.into_inner()).get(&hash(token)).cloned()
    }

    /// Creates a tenant and returns its token (shown only this once).
    pub fn create(&self, name: &str) -> Result<(Tenant, String), AuthError> {
        let ok =
            (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(AuthError::BadName(name.to_string()));
        }
        let token = new_token();
        let tenant = Tenant { name: name.to_string(), admin: false, created_at_ms: now_ms() };
        {
            let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            let r = conn.execute(
                "INSERT INTO tenants (name, token_sha256, admin, created_at_ms) VALUES (?1, ?2, 0, ?3)",
                params![name, hash(&token).to_vec(), tenant.created_at_ms as i64],
            );
            match r {
                Ok(_) => {}
                Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::ConstraintViolation => {
                    return Err(AuthError::Exists(name.to_string()))
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.by_hash.write().unwrap_or_else(|p| p.into_inner()).insert(hash(&token), tenant.clone());
        Ok((tenant, token))
    }

    pub fn list(&self) -> Vec<Tenant> {
        let mut v: Vec<Tenant> = self.by_hash.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
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

    pub fn authenticate(&self, headers: &axum::http::HeaderMap) -> Result<Caller, ApiError> {
        let header = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let token = header.and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")));
        let Some(token) = token.map(str::trim) else {
            return Err(ApiError::new(ErrorCode::Unauthorized, "missing 'Authorization: Bearer TOKEN' header"));
        };
        match self {
            Authenticator::Tokens(store) => match store.verify(token) {
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
        state.auth.authenticate(&parts.headers).map(Auth)
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

    #[test]
    fn admin_token_is_written_once_private_and_verifies() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("admin-token");
        let s = TokenStore::open(&d.path().join("api.db"), &file).unwrap();
        let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(s.verify(&token).unwrap().admin);
        assert!(s.verify("nope").is_none());
        drop(s);
        let s = TokenStore::open(&d.path().join("api.db"), &file).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), token, "the token is kept across restarts");
        assert!(s.verify(&token).is_some());
    }

    #[test]
    fn cluster_mode_takes_the_caller_from_headers_only_with_the_secret() {
        use axum::http::HeaderMap;
        let auth = Authenticator::cluster("s3cret");
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer s3cret".parse().unwrap());
        assert!(auth.authenticate(&h).is_err(), "the tenant header is required");
        h.insert(TENANT_HEADER, "team-a".parse().unwrap());
        assert_eq!(auth.authenticate(&h).unwrap(), Caller { tenant: "team-a".into(), admin: false });
        h.insert(ADMIN_HEADER, "true".parse().unwrap());
        assert!(auth.authenticate(&h).unwrap().admin);
        h.insert("authorization", "Bearer wrong".parse().unwrap());
        assert_eq!(auth.authenticate(&h).unwrap_err().code, ErrorCode::Unauthorized);
    }

    #[test]
    fn tenants_get_their_own_tokens() {
        let d = tempfile::tempdir().unwrap();
        let s = TokenStore::open(&d.path().join("api.db"), &d.path().join("t")).unwrap();
        let (t, token) = s.create("team-a").unwrap();
        assert!(!t.admin);
        assert_eq!(s.verify(&token).unwrap().name, "team-a");
        assert!(matches!(s.create("team-a"), Err(AuthError::Exists(_))));
        assert!(matches!(s.create("Bad Name"), Err(AuthError::BadName(_))));
        assert_eq!(s.list().len(), 2);
    }
}
