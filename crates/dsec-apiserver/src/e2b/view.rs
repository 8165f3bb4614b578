//! E2B's control-plane wire types, and the view of a dsec sandbox in them.
//!
//! A template is a dsec image; metadata are labels; a sandbox's timeout is
//! its hard lifetime (E2B has no idle timeout); `running` is every live
//! state but a pause, `paused` a pause in any phase. A stopped or failed
//! sandbox is gone, as a killed one is in E2B.

use std::collections::BTreeMap;

use dsec_api::{self as api, SandboxState};
use serde::{Deserialize, Serialize};

/// The envd version the sandboxes report: the SDK turns on what it knows
/// this version serves (stdin control, CloseStdin, octet-stream and gzip
/// uploads) and leaves off what it does not (upload metadata, watch events
/// carrying entries).
pub const ENVD_VERSION: &str = "0.5.7";

/// Labels under this prefix belong to the translation, not to the user:
/// hidden from metadata and refused in it.
pub const RESERVED_PREFIX: &str = "dsec.e2b/";
/// The label holding the sandbox's envd access token.
pub const TOKEN_LABEL: &str = "dsec.e2b/envd-access-token";

/// The template E2B's SDK asks for when none is named.
pub const DEFAULT_TEMPLATE: &str = "base";
/// Seconds a sandbox lives when the request does not say (E2B's default).
pub const DEFAULT_TIMEOUT_S: u64 = 300;

/// `POST /sandboxes` and `POST /v2/sandboxes`. Fields E2B added for its own
/// cloud (MCP, volumes, network transforms, IAM) are not read, nor is
/// `secure`: every sandbox's envd is secured by its access token, which
/// older SDKs use whenever the answer carries one.
#[derive(Debug, Deserialize)]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "envVars")]
    pub env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
pub struct Timeout {
    pub timeout: u64,
}

/// The body of resume and connect (`timeout` optional on both here).
#[derive(Debug, Default, Deserialize)]
pub struct Reconnect {
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// What names a sandbox in every answer.
#[derive(Debug, Serialize)]
pub struct Ids {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
}

fn ids(s: &api::Sandbox, tenant: &str) -> Ids {
    Ids { template_id: s.image.clone(), sandbox_id: s.id.clone(), client_id: tenant.to_string() }
}

/// A created, resumed or connected sandbox.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    #[serde(flatten)]
    pub ids: Ids,
    pub envd_version: &'static str,
    pub envd_access_token: Option<String>,
    pub alias: String,
    pub domain: Option<String>,
    pub traffic_access_token: Option<String>,
}

/// A sandbox in `GET /sandboxes/{id}` and the lists.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    #[serde(flatten)]
    pub ids: Ids,
    pub alias: String,
    pub started_at: String,
    pub end_at: String,
    pub envd_version: &'static str,
    pub cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub state: &'static str,
    pub metadata: BTreeMap<String, String>,
    /// Only in `GET /sandboxes/{id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
}

/// E2B's name for a live sandbox's state; `None`: it is gone.
pub fn state(s: SandboxState) -> Option<&'static str> {
    match s {
        SandboxState::Queued | SandboxState::Creating | SandboxState::Running => Some("running"),
        SandboxState::Pausing | SandboxState::Paused | SandboxState::Resuming => Some("paused"),
        SandboxState::Stopping | SandboxState::Stopped | SandboxState::Failed | SandboxState::Unknown => None,
    }
}

/// The user's metadata: the labels without the translation's own.
pub fn metadata(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels.iter().filter(|(k, _)| !k.starts_with(RESERVED_PREFIX)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// `domain`: the API's sandbox domain, where `get_host(port)` builds
/// `PORT-ID.DOMAIN` (served by the port proxy).
pub fn created(s: &api::Sandbox, tenant: &str, domain: Option<&str>) -> Created {
    Created {
        ids: ids(s, tenant),
        envd_version: ENVD_VERSION,
        envd_access_token: s.labels.get(TOKEN_LABEL).cloned(),
        alias: s.image.clone(),
        domain: domain.map(str::to_string),
        traffic_access_token: None,
    }
}

/// `None` if the sandbox is gone (stopped, failed).
pub fn detail(s: &api::Sandbox, tenant: &str, with_token: bool) -> Option<Detail> {
    let state = state(s.state)?;
    let started_ms = parse_rfc3339_ms(&s.created_at).unwrap_or(0);
    Some(Detail {
        ids: ids(s, tenant),
        alias: s.image.clone(),
        started_at: s.created_at.clone(),
        end_at: dsec_image::rfc3339_millis(started_ms + s.max_lifetime_s * 1000),
        envd_version: ENVD_VERSION,
        cpu_count: (s.limits.cpu_cores_limit.ceil() as u64).max(1),
        memory_mb: s.limits.memory_limit_mb,
        disk_size_mb: s.limits.disk_limit_mb,
        state,
        metadata: metadata(&s.labels),
        envd_access_token: if with_token { s.labels.get(TOKEN_LABEL).cloned() } else { None },
    })
}

/// When the sandbox ends by its lifetime, in ms since the epoch.
pub fn end_ms(s: &api::Sandbox) -> u64 {
    parse_rfc3339_ms(&s.created_at).unwrap_or(0) + s.max_lifetime_s * 1000
}

/// Milliseconds since the epoch of the UTC timestamps this API writes
/// (`YYYY-MM-DDTHH:MM:SS[.fff]Z`); `None` for anything else.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let millis: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(((days * 24 + hh) * 60 + mm) * 60 + ss).ok().map(|secs| secs * 1000 + millis as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_with_the_formatter() {
        for ms in [0u64, 951_782_400_000, 1_764_633_600_123, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339_ms(&dsec_image::rfc3339_millis(ms)), Some(ms), "{}", dsec_image::rfc3339_millis(ms));
        }
        assert_eq!(parse_rfc3339_ms("2026-12-02T00:00:00Z"), Some(1_796_169_600_000));
        assert_eq!(parse_rfc3339_ms("2026-13-02T00:00:00Z"), None);
        assert_eq!(parse_rfc3339_ms("yesterday"), None);
    }

    #[test]
    fn states_and_metadata_follow_e2b() {
        assert_eq!(state(SandboxState::Creating), Some("running"));
        assert_eq!(state(SandboxState::Resuming), Some("paused"));
        assert_eq!(state(SandboxState::Stopped), None);
        let labels = BTreeMap::from([("a".to_string(), "1".to_string()), (TOKEN_LABEL.to_string(), "t".to_string())]);
        assert_eq!(metadata(&labels), BTreeMap::from([("a".to_string(), "1".to_string())]));
    }
}
