//! Who may do what with projects, quotas and tokens.
//!
//! A token belongs to one project and holds one role there (see
//! `dsec_store::Role`); it reaches its project and every project below it.
//! The platform's admin token (the token file's) reaches everything.
//! Creating or deleting a project, or setting its quota, takes an `admin`
//! token of a project above it: nobody raises their own quota. A token
//! grants only what it holds: a role it may grant, for a project it
//! reaches, expiring no later than itself; revoking it revokes what it
//! issued.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use dsec_api::ErrorCode;
use dsec_store::projects::{is_within, token_id};
use dsec_store::{Grant, Quota, Role, TokenHash};

use crate::error::ApiError;
use crate::state::AppState;

/// The holder of the request's token, with what it grants.
pub struct Holder {
    pub grant: Grant,
    pub hash: TokenHash,
}

impl Holder {
    pub fn project(&self) -> &str {
        &self.grant.principal.name
    }

    pub fn role(&self) -> Role {
        self.grant.role
    }

    /// The platform's admin (the token file's principal).
    pub fn is_platform_admin(&self) -> bool {
        self.grant.principal.admin && self.grant.role == Role::Admin
    }

    /// Whether `project` is the holder's or below it.
    pub fn reaches(&self, project: &str) -> bool {
        self.is_platform_admin() || is_within(project, self.project())
    }

    /// Whether the holder may create, delete and set the quota of
    /// `project`: an admin token of a project strictly above it.
    pub fn administers(&self, project: &str) -> Result<(), ApiError> {
        if self.is_platform_admin() {
            return Ok(());
        }
        if !self.reaches(project) || project == self.project() {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("a token of project {:?} may manage only the projects below it, not {project:?}", self.project()),
            ));
        }
        if !self.role().administers() {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("a {} token cannot manage projects (an admin token can)", self.role().as_str()),
            ));
        }
        Ok(())
    }

    pub fn id(&self) -> String {
        token_id(&self.hash)
    }
}

impl FromRequestParts<AppState> for Holder {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let Some(tokens) = state.auth.tokens() else {
            return Err(ApiError::new(ErrorCode::NotFound, "projects and tokens are managed by the apiserver, not by an edge"));
        };
        let header = parts.headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let token = header.and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")));
        let Some(token) = token.map(str::trim) else {
            return Err(ApiError::new(ErrorCode::Unauthorized, "missing 'Authorization: Bearer TOKEN' header"));
        };
        match tokens.grant(token).await? {
            Some((grant, hash)) => Ok(Holder { grant, hash }),
            None => Err(ApiError::new(ErrorCode::Unauthorized, "invalid token")),
        }
    }
}

/// A quota from the wire: every limit given must be at least 1.
pub fn quota_in(spec: &dsec_api::QuotaSpec) -> Result<Quota, ApiError> {
    let positive = |name: &str, v: Option<i64>| -> Result<Option<u64>, ApiError> {
        match v {
            Some(v) if v < 1 => Err(ApiError::new(
                ErrorCode::InvalidLimits,
                format!("quota limit {name} must be at least 1 (got {v}); leave it out for no limit"),
            )),
            v => Ok(v.map(|v| v as u64)),
        }
    };
    let cpu_millis = match spec.cpu {
        Some(c) if !c.is_finite() || c * 1000.0 < 1.0 => {
            return Err(ApiError::new(ErrorCode::InvalidLimits, format!("quota limit cpu must be at least 0.001 cores (got {c})")))
        }
        Some(c) => Some((c * 1000.0).round().min(u64::MAX as f64) as u64),
        None => None,
    };
    Ok(Quota {
        sandboxes: positive("sandboxes", spec.sandboxes)?,
        cpu_millis,
        memory_mb: positive("memory_mb", spec.memory_mb)?,
        disk_mb: positive("disk_mb", spec.disk_mb)?,
        creations_per_s: positive("creations_per_s", spec.creations_per_s)?,
        fncall_per_s: positive("fncall_per_s", spec.fncall_per_s)?,
        overcommit: spec.overcommit,
    })
}

pub fn quota_out(q: &Quota) -> dsec_api::QuotaSpec {
    let i = |v: Option<u64>| v.map(|v| v.min(i64::MAX as u64) as i64);
    dsec_api::QuotaSpec {
        sandboxes: i(q.sandboxes),
        cpu: q.cpu_millis.map(|m| m as f64 / 1000.0),
        memory_mb: i(q.memory_mb),
        disk_mb: i(q.disk_mb),
        creations_per_s: i(q.creations_per_s),
        fncall_per_s: i(q.fncall_per_s),
        overcommit: q.overcommit,
    }
}

/// A store error of the IAM calls, as the API answers it.
pub fn store_error(e: dsec_store::StoreError) -> ApiError {
    use dsec_store::{QuotaError, StoreError};
    match e {
        StoreError::NoSuchPrincipal(p) => ApiError::new(ErrorCode::NotFound, format!("no project {p:?}")),
        StoreError::Exists(what) => ApiError::new(ErrorCode::AlreadyExists, format!("{what} already exists")),
        StoreError::HasChildren(p) => {
            ApiError::new(ErrorCode::ProjectNotEmpty, format!("project {p:?} has sub-projects: delete them first"))
        }
        StoreError::IssuerRevoked => ApiError::new(ErrorCode::Unauthorized, "the token issuing this one was revoked meanwhile"),
        StoreError::Quota(e @ QuotaError::Zero { .. }) => ApiError::new(ErrorCode::InvalidLimits, e.to_string()),
        StoreError::Quota(e @ QuotaError::AboveParentShare { .. }) => ApiError::new(ErrorCode::Forbidden, e.to_string()),
        other => other.into(),
    }
}
