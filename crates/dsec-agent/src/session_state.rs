//! What the agent keeps of each session (its cwd, environment, user and the
//! process groups of its commands), and the parsing of what a session's
//! shell reports after each command: its working directory, a NUL, then the
//! output of `export -p`.
//!
//! `export -p` is a builtin in every shell we meet, so this works in images
//! with no coreutils at all. Its format differs by shell:
//! - bash: `declare -x NAME="value"`, or `NAME=$'...'` (ANSI-C quoting) when
//!   the value has control characters, or `declare -x NAME` when exported
//!   but unset;
//! - dash, busybox ash: `export NAME='value'`, with `'"'"'` for a quote.
//!
//! Values may span lines (a quoted newline), so this is a small tokenizer of
//! shell words, not a line splitter.

use std::collections::HashMap;

use crate::envs::Env;
use crate::pgroup::group_alive;

pub struct Session {
    pub cwd: String,
    pub env: Env,
    pub user: Option<String>,
    /// Process groups of this session's commands (for CloseSession).
    pub groups: Vec<i32>,
}

/// The open sessions, by id.
#[derive(Default)]
pub struct Sessions {
    map: HashMap<String, Session>,
    next: u64,
}

impl Sessions {
    /// Opens a session; its id.
    pub fn open(&mut self, cwd: String, env: Env, user: Option<String>) -> String {
        self.next += 1;
        let id = format!("s{}", self.next);
        self.map.insert(id.clone(), Session { cwd, env, user, groups: Vec::new() });
        id
    }

    pub fn get(&self, id: &str) -> Option<&Session> {
        self.map.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Session> {
        self.map.get_mut(id)
    }

    pub fn remove(&mut self, id: &str) -> Option<Session> {
        self.map.remove(id)
    }

    /// Records a command's process group (pruning groups that have emptied).
    pub fn note_group(&mut self, id: &str, pgid: i32) {
        if let Some(s) = self.map.get_mut(id) {
            s.groups.retain(|&g| group_alive(g));
            s.groups.push(pgid);
        }
    }
}

/// Splits the state pipe's content into (cwd, exported environment).
/// `None` if the report is incomplete (the shell died mid-way).
pub fn parse_state(bytes: &[u8]) -> Option<(String, Env)> {
    let nul = bytes.iter().position(|&b| b == 0)?;
    let cwd = String::from_utf8_lossy(&bytes[..nul]).into_owned();
    if !cwd.starts_with('/') {
        return None;
    }
    Some((cwd, parse_export_p(&bytes[nul + 1..])))
}

/// Parses `export -p` output; unknown lines are skipped.
pub fn parse_export_p(text: &[u8]) -> Env {
    let mut p = Parser { s: text, i: 0 };
    let mut env = Env::new();
    while p.i < p.s.len() {
        p.skip_blank_lines();
        if p.i >= p.s.len() {
            break;
        }
        if let Some(entry) = p.entry() {
            if let (name, Some(value)) = entry {
                env.push((name, value));
            }
        } else {
            p.skip_line();
        }
    }
    env
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, lit: &[u8]) -> bool {
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }

    fn skip_blank_lines(&mut self) {
        while matches!(self.peek(), Some(b'\n' | b' ' | b'\t')) {
            self.i += 1;
        }
    }

    fn skip_line(&mut self) {
        while let Some(c) = self.peek() {
            self.i += 1;
            if c == b'\n' {
                break;
            }
        }
    }

    /// `declare -FLAGS NAME[=WORD]` or `export NAME[=WORD]`.
    fn entry(&mut self) -> Option<(String, Option<String>)> {
        if self.eat(b"declare -") {
            while matches!(self.peek(), Some(c) if c.is_ascii_alphabetic()) {
                self.i += 1;
            }
            if !self.eat(b" ") {
                return None;
            }
        } else if !self.eat(b"export ") {
            return None;
        }
        let start = self.i;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_') {
            self.i += 1;
        }
        if self.i == start {
            return None;
        }
        let name = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        match self.peek() {
            None | Some(b'\n') => Some((name, None)),
            Some(b'=') => {
                self.i += 1;
                let value = self.word()?;
                Some((name, Some(String::from_utf8_lossy(&value).into_owned())))
            }
            _ => None,
        }
    }

    /// One shell word up to an unquoted newline or blank.
    fn word(&mut self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(c) = self.peek() {
            match c {
                b'\n' | b' ' | b'\t' => break,
                b'\'' => {
                    self.i += 1;
                    loop {
                        let c = self.peek()?;
                        self.i += 1;
                        if c == b'\'' {
                            break;
                        }
                        out.push(c);
                    }
                }
                b'"' => {
                    self.i += 1;
                    loop {
                        let c = self.peek()?;
                        self.i += 1;
                        match c {
                            b'"' => break,
                            b'\\' => {
                                let n = self.peek()?;
                                self.i += 1;
                                match n {
                                    b'$' | b'`' | b'"' | b'\\' => out.push(n),
                                    b'\n' => {}
                                    _ => out.extend_from_slice(&[b'\\', n]),
                                }
                            }
                            _ => out.push(c),
                        }
                    }
                }
                b'$' if self.s.get(self.i + 1) == Some(&b'\'') => {
                    self.i += 2;
                    self.ansi_c(&mut out)?;
                }
                b'\\' => {
                    self.i += 1;
                    let n = self.peek()?;
                    self.i += 1;
                    if n != b'\n' {
                        out.push(n);
                    }
                }
                _ => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
        Some(out)
    }

    /// The body of `$'...'` after the opening quote.
    fn ansi_c(&mut self, out: &mut Vec<u8>) -> Option<()> {
        loop {
            let c = self.peek()?;
            self.i += 1;
            match c {
                b'\'' => return Some(()),
                b'\\' => {
                    let n = self.peek()?;
                    self.i += 1;
                    match n {
                        b'a' => out.push(7),
                        b'b' => out.push(8),
                        b'e' | b'E' => out.push(27),
                        b'f' => out.push(12),
                        b'n' => out.push(b'\n'),
                        b'r' => out.push(b'\r'),
                        b't' => out.push(b'\t'),
                        b'v' => out.push(11),
                        b'\\' | b'\'' | b'"' | b'?' => out.push(n),
                        b'0'..=b'7' => {
                            let mut v = u32::from(n - b'0');
                            for _ in 0..2 {
                                match self.peek() {
                                    Some(d @ b'0'..=b'7') => {
                                        v = v * 8 + u32::from(d - b'0');
                                        self.i += 1;
                                    }
                                    _ => break,
                                }
                            }
                            out.push(v as u8);
                        }
                        b'x' => {
                            let v = self.hex(2);
                            match v {
                                Some(v) => out.push(v as u8),
                                None => out.extend_from_slice(b"\\x"),
                            }
                        }
                        b'u' | b'U' => {
                            let digits = if n == b'u' { 4 } else { 8 };
                            match self.hex(digits).and_then(char::from_u32) {
                                Some(ch) => {
                                    let mut buf = [0u8; 4];
                                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                                }
                                None => out.extend_from_slice(&[b'\\', n]),
                            }
                        }
                        b'c' => {
                            let x = self.peek()?;
                            self.i += 1;
                            out.push(x & 0x1f);
                        }
                        other => out.extend_from_slice(&[b'\\', other]),
                    }
                }
                _ => out.push(c),
            }
        }
    }

    /// Up to `max` hex digits; `None` if there is none.
    fn hex(&mut self, max: usize) -> Option<u32> {
        let mut v = 0u32;
        let mut n = 0;
        while n < max {
            match self.peek().and_then(|c| (c as char).to_digit(16)) {
                Some(d) => {
                    v = v * 16 + d;
                    self.i += 1;
                    n += 1;
                }
                None => break,
            }
        }
        (n > 0).then_some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(env: &'a Env, k: &str) -> Option<&'a str> {
        crate::envs::get(env, k)
    }

    #[test]
    fn bash_format() {
        let text = b"declare -x A=$'x\\'y\"z$w\\\\v\\nnl'\n\
            declare -x B=\"\"\n\
            declare -x C\n\
            declare -x D=\"say \\\"hi\\\" \\$HOME \\\\ \\`x\\`\"\n\
            declare -rx RO=\"1\"\n\
            declare -x T=$'tab\\there\\x41\\101\\u00e9\\cA'\n\
            declare -x M=\"multi\nline\"\n";
        let env = parse_export_p(text);
        assert_eq!(get(&env, "A"), Some("x'y\"z$w\\v\nnl"));
        assert_eq!(get(&env, "B"), Some(""));
        assert_eq!(get(&env, "C"), None, "exported but unset has no value");
        assert_eq!(get(&env, "D"), Some("say \"hi\" $HOME \\ `x`"));
        assert_eq!(get(&env, "RO"), Some("1"));
        assert_eq!(get(&env, "T"), Some("tab\thereAA\u{e9}\u{1}"));
        assert_eq!(get(&env, "M"), Some("multi\nline"));
        assert_eq!(env.len(), 6);
    }

    #[test]
    fn ash_and_dash_format() {
        let text = b"export A='x'\"'\"'y\"z$w\\v\nnl'\nexport B=''\nexport C\nexport P='/bin:/usr/bin'\n";
        let env = parse_export_p(text);
        assert_eq!(get(&env, "A"), Some("x'y\"z$w\\v\nnl"));
        assert_eq!(get(&env, "B"), Some(""));
        assert_eq!(get(&env, "C"), None);
        assert_eq!(get(&env, "P"), Some("/bin:/usr/bin"));
    }

    #[test]
    fn junk_lines_are_skipped_and_truncation_is_tolerated() {
        let env = parse_export_p(b"garbage here\nexport OK='1'\nexport =bad\nexport BAD='unterminated");
        assert_eq!(env, vec![("OK".to_string(), "1".to_string())]);
    }

    #[test]
    fn state_needs_cwd_and_nul() {
        let (cwd, env) = parse_state(b"/tmp/x y\0export A='1'\n").unwrap();
        assert_eq!(cwd, "/tmp/x y");
        assert_eq!(get(&env, "A"), Some("1"));
        assert!(parse_state(b"/tmp").is_none());
        assert!(parse_state(b"").is_none());
        assert!(parse_state(b"rel\0").is_none());
    }

    /// The real shells of this machine, when present, must round-trip
    /// awkward values through `export -p` and this parser.
    #[test]
    fn real_shells_round_trip() {
        let nasty = "q'uote \"dq\" $dollar `tick` back\\slash\nnewline\ttab \u{e9}";
        for shell in ["/bin/bash", "/bin/dash", "/bin/busybox"] {
            if !std::path::Path::new(shell).exists() {
                continue;
            }
            let mut cmd = std::process::Command::new(shell);
            if shell.ends_with("busybox") {
                cmd.arg("sh");
            }
            let out = cmd.args(["-c", "export -p"]).env_clear().env("NASTY", nasty).env("CTRL", "a\u{1}b\u{7f}").output().unwrap();
            let env = parse_export_p(&out.stdout);
            assert_eq!(get(&env, "NASTY"), Some(nasty), "{shell}");
            assert_eq!(get(&env, "CTRL"), Some("a\u{1}b\u{7f}"), "{shell}");
        }
    }
}
