//! The requests the edge sends a FnCall runner's monitor (`dsec-agent
//! fncall-monitor`, in the runner): `<length>\n<JSON>` on the monitor's
//! socket. One definition for both ends, the edge's dsec-fncall writing and
//! the monitor reading, so that they cannot drift apart. Empty fields are
//! left out on the wire and read back as empty.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The socket the monitor listens on, in a directory of its own that only
/// root may enter, until the edge connects to it from the host, beneath
/// the runner's root.
pub const MONITOR_SOCKET: &str = "/var/lib/dsec-fncall/edge/monitor.sock";

/// A call's limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallLimits {
    pub time_ms: u64,
    /// RLIMIT_AS of a compiled program; growth allowed beyond the warm
    /// interpreter for Python. 0: none.
    #[serde(default)]
    pub memory_bytes: u64,
    pub output_bytes: u64,
    /// RLIMIT_FSIZE of the call (the monitor raises it to cover the output).
    #[serde(default)]
    pub file_bytes: u64,
}

/// One request. The edge borrows its strings from the call it serves; the
/// monitor borrows them from the bytes it read where JSON allows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MonitorRequest<'a> {
    /// Chosen by the edge, echoed in the answer.
    #[serde(default)]
    pub id: u64,
    /// `run`, `compile`, `install`, `ping`.
    #[serde(borrow, default)]
    pub op: Cow<'a, str>,
    #[serde(borrow, default, skip_serializing_if = "empty_str")]
    pub language: Cow<'a, str>,
    #[serde(borrow, default, skip_serializing_if = "empty_str")]
    pub code: Cow<'a, str>,
    /// base64.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stdin: String,
    /// relative path -> base64.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "empty_list")]
    pub fetch_files: Cow<'a, [String]>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Always sent by the edge; a run or compile without them is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<CallLimits>,
    #[serde(default)]
    pub max_binary_bytes: u64,
    /// `install`: the program, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
}

impl<'a> MonitorRequest<'a> {
    pub fn new(op: &'a str, limits: CallLimits) -> Self {
        MonitorRequest { op: Cow::Borrowed(op), limits: Some(limits), ..Default::default() }
    }
}

// serde's `skip_serializing_if` passes the field itself, a `&Cow`.
#[allow(clippy::ptr_arg)]
fn empty_str(s: &Cow<'_, str>) -> bool {
    s.is_empty()
}

#[allow(clippy::ptr_arg)]
fn empty_list(l: &Cow<'_, [String]>) -> bool {
    l.is_empty()
}
