//! Projects, their quotas and scoped tokens (`/v1/projects`, `/v1/tokens`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A project's limits; a limit left out is none of its own (its
/// ancestors' still hold). Signed, so a negative value gets a clear error
/// rather than a parse failure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// Live sandboxes (paused ones count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<i64>,
    /// CPU cores: the sum of the sandboxes' CPU limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// MiB: the sum of the sandboxes' memory limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<i64>,
    /// MiB: the sum of the sandboxes' disk limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mb: Option<i64>,
    /// Creations per second (a token bucket with bursts of one second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creations_per_s: Option<i64>,
    /// FnCall calls per second (a token bucket too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fncall_per_s: Option<i64>,
    /// Give more than the parent has not handed out yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overcommit: bool,
}

/// `POST /v1/projects`: `name` is the path (`team-rl/exp-42`); its parent
/// must exist.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProjectRequest {
    pub name: String,
    #[serde(default)]
    pub quota: Option<QuotaSpec>,
}

/// `PATCH /v1/projects/{path}`: sets the quota (`null`: removes it).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProjectRequest {
    pub quota: Option<QuotaSpec>,
}

/// One limit of a project against what it (with everything below it) uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct LimitUsage {
    /// `sandboxes`, `cpu` (cores), `memory_mb`, `disk_mb`, `creations_per_s`, `fncall_per_s`.
    pub name: String,
    /// The project's own limit; `None`: none of its own.
    pub limit: Option<f64>,
    /// Held now (for rates: tokens taken and not yet refilled).
    pub used: f64,
    /// Handed out to its sub-projects' quotas.
    pub allocated: f64,
}

/// A project as `GET /v1/projects/{path}` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProjectInfo {
    pub name: String,
    pub parent: Option<String>,
    pub created_at: String,
    pub quota: Option<QuotaSpec>,
    /// Every limit, with its use (only in `show`; empty in lists).
    #[serde(default)]
    pub usage: Vec<LimitUsage>,
    /// Its sub-projects were given more than its limits (explicitly), or it
    /// was given more than its parent's free share.
    #[serde(default)]
    pub overcommitted: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProjectList {
    pub projects: Vec<ProjectInfo>,
}

/// `POST /v1/tokens`: a token for `project` (the caller's or one below
/// it) of `role` (`admin`, `builder`, `solver`; at most what the caller
/// holds), living `ttl_s` seconds (at most what the caller's has left).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    pub project: String,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub ttl_s: Option<i64>,
}

/// A token as listed; `token` (the secret) only in the answer that made it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenInfo {
    /// What `DELETE /v1/tokens/{id}` takes (derived from the token's hash).
    pub id: String,
    pub project: String,
    pub role: String,
    pub created_at: String,
    pub expires_at: Option<String>,
    pub revoked_at: Option<String>,
    /// The id of the token that issued it.
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenInfo>,
}
