//! The edge <-> monitor messages (see the guest agent's fncall/): a request is
//! `<length>\n<JSON>`, a response one JSON line.

use std::collections::BTreeMap;

use serde::Deserialize;

// The requests are the monitor's own definition (one for both ends).
pub use dsec_agent_proto::fncall::{CallLimits as ZLimits, MonitorRequest as ZRequest};

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ZResponse {
    #[serde(default)]
    pub id: Option<u64>,
    /// The request could not be served (bad input the edge should have
    /// caught, or a fault in the runner).
    #[serde(default)]
    pub error: Option<String>,
    /// The runner itself is broken: retire it.
    #[serde(default)]
    pub fatal: bool,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub wall_ms: f64,
    #[serde(default)]
    pub cpu_ms: f64,
    #[serde(default)]
    pub peak_memory_kb: u64,
    /// base64, in answers the worker writes itself (compiles).
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub output_exceeded: bool,
    /// A language whose runtime holds the memory limit (Java, JavaScript,
    /// Go) peaked above it.
    #[serde(default)]
    pub memory_exceeded: bool,
    #[serde(default)]
    pub binary: Option<String>,
    /// Raw parts that follow the line, in order: `["stdout", len]`,
    /// `["stderr", len]`, `["file:NAME", len]`.
    #[serde(default)]
    pub raw: Vec<(String, usize)>,
    /// Filled by the runner from `raw` (or from the base64 fields).
    #[serde(skip)]
    pub out: Vec<u8>,
    #[serde(skip)]
    pub err: Vec<u8>,
    #[serde(skip)]
    pub fetched: BTreeMap<String, Vec<u8>>,
    /// A call process did not die within the monitor's deadline.
    #[serde(default)]
    pub unclean: bool,
}

impl ZResponse {
    /// Total bytes of the raw parts after the line.
    pub fn raw_len(&self) -> usize {
        self.raw.iter().map(|(_, n)| *n).sum()
    }

    /// Splits the bytes that followed the line into the announced parts.
    pub fn take_raw(&mut self, mut data: Vec<u8>) {
        for (name, n) in std::mem::take(&mut self.raw) {
            let rest = data.split_off(n.min(data.len()));
            let part = std::mem::replace(&mut data, rest);
            match name.as_str() {
                "stdout" => self.out = part,
                "stderr" => self.err = part,
                other => {
                    if let Some(file) = other.strip_prefix("file:") {
                        self.fetched.insert(file.to_string(), part);
                    }
                }
            }
        }
    }
}

/// The monitor's first line.
#[derive(Debug, Clone, Deserialize)]
pub struct ZReady {
    pub ready: bool,
    #[serde(default)]
    pub languages: Vec<String>,
    #[serde(default)]
    pub preloaded: Vec<String>,
}

/// `<length>\n<JSON>`.
pub fn frame(req: &ZRequest<'_>) -> Vec<u8> {
    let body = serde_json::to_vec(req).expect("runner requests always serialize");
    let mut out = format!("{}\n", body.len()).into_bytes();
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_the_exact_length() {
        let mut r = ZRequest::new("run", ZLimits { time_ms: 1, memory_bytes: 0, output_bytes: 1, file_bytes: 1 });
        r.language = "python".into();
        r.code = "print('é')".into();
        let f = frame(&r);
        let nl = f.iter().position(|b| *b == b'\n').unwrap();
        let len: usize = std::str::from_utf8(&f[..nl]).unwrap().parse().unwrap();
        assert_eq!(len, f.len() - nl - 1);
        let v: serde_json::Value = serde_json::from_slice(&f[nl + 1..]).unwrap();
        assert_eq!(v["code"], "print('é')");
        assert!(v.get("stdin").is_none(), "empty fields are left out");
    }

    #[test]
    fn raw_parts_are_split_as_announced() {
        let mut r: ZResponse = serde_json::from_str(r#"{"id":1,"raw":[["stdout",3],["stderr",0],["file:a/b",2]]}"#).unwrap();
        assert_eq!(r.raw_len(), 5);
        r.take_raw(b"outhi".to_vec());
        assert_eq!((r.out.as_slice(), r.err.as_slice()), (&b"out"[..], &b""[..]));
        assert_eq!(r.fetched["a/b"], b"hi");
    }
}
