//! Users and groups of the sandbox, read from its own /etc/passwd and
//! /etc/group.
//!
//! The agent is a static binary and the image's NSS configuration is not
//! ours to trust, so the two files are parsed by hand (the same fields
//! Docker and runc use).

use dsec_agent_proto::{AgentError, ErrorKind};
use rustix::fs::{Mode, OFlags};

use crate::paths::{Root, SandboxPath};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// Everything a command needs to run as someone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary group included).
    pub groups: Vec<u32>,
    /// `None` for a numeric uid the passwd file does not know.
    pub name: Option<String>,
    pub home: String,
    pub shell: String,
}

impl User {
    pub fn root() -> Self {
        Self { uid: 0, gid: 0, groups: vec![0], name: Some("root".into()), home: "/root".into(), shell: "/bin/sh".into() }
    }
}

/// Lines `name:pw:uid:gid:gecos:home:shell`; comments and malformed lines are
/// skipped (an image's broken line must not hide every other user).
pub fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 4 || f[0].is_empty() {
                return None;
            }
            Some(PasswdEntry {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: f.get(5).copied().unwrap_or("").to_string(),
                shell: f.get(6).copied().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// Lines `name:pw:gid:member,member`.
pub fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() < 3 || f[0].is_empty() {
                return None;
            }
            Some(GroupEntry {
                name: f[0].to_string(),
                gid: f[2].parse().ok()?,
                members: f.get(3).map(|m| m.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()).unwrap_or_default(),
            })
        })
        .collect()
}

fn unknown(spec: &str) -> AgentError {
    AgentError::new(ErrorKind::UnknownUser, format!("no such user or group: {spec:?}"))
}

/// Resolves `user`, `uid`, `user:group` or `uid:gid` against the two files.
///
/// A numeric uid without a passwd entry is accepted (as Docker does) with
/// gid 0 and home `/`; an unknown name is `UnknownUser`.
pub fn resolve(spec: &str, passwd: &[PasswdEntry], groups: &[GroupEntry]) -> Result<User, AgentError> {
    let spec = spec.trim();
    let (user_part, group_part) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let entry = if user_part.is_empty() {
        passwd.iter().find(|e| e.uid == 0)
    } else if let Ok(uid) = user_part.parse::<u32>() {
        passwd.iter().find(|e| e.uid == uid)
    } else {
        match passwd.iter().find(|e| e.name == user_part) {
            Some(e) => Some(e),
            // Images without a passwd file (scratch, distroless) still run
            // as root.
            None if user_part == "root" => None,
            None => return Err(unknown(spec)),
        }
    };
    let mut user = match entry {
        Some(e) => User {
            uid: e.uid,
            gid: e.gid,
            groups: Vec::new(),
            name: Some(e.name.clone()),
            home: if e.home.is_empty() { "/".into() } else { e.home.clone() },
            shell: if e.shell.is_empty() { "/bin/sh".into() } else { e.shell.clone() },
        },
        None if user_part.is_empty() || user_part == "0" || user_part == "root" => User::root(),
        None => {
            let uid: u32 = user_part.parse().map_err(|_| unknown(spec))?;
            User { uid, gid: 0, groups: Vec::new(), name: None, home: "/".into(), shell: "/bin/sh".into() }
        }
    };
    if let Some(g) = group_part {
        user.gid = match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => groups.iter().find(|e| e.name == g).ok_or_else(|| unknown(spec))?.gid,
        };
    }
    // Supplementary groups: the primary one, plus every group listing the
    // user as a member (only when no group was forced, as `su` and Docker do).
    user.groups.retain(|&g| g != user.gid);
    user.groups.insert(0, user.gid);
    if let (None, Some(name)) = (group_part, &user.name) {
        for g in groups.iter().filter(|g| g.members.iter().any(|m| m == name)) {
            if !user.groups.contains(&g.gid) {
                user.groups.push(g.gid);
            }
        }
    }
    Ok(user)
}

/// Reads a small text file of the sandbox; missing or unreadable is empty.
fn read_small(root: &Root, path: &str) -> String {
    let Ok(p) = SandboxPath::parse(path) else { return String::new() };
    let Ok(fd) = root.open_at(&p, OFlags::RDONLY, Mode::empty()) else { return String::new() };
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Images have passwd files of a few KiB; 4 MiB guards against a
    // sandbox replacing it with something endless.
    while out.len() < 4 << 20 {
        match rustix::io::read(&fd, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Looks a user up in the sandbox's own files (read fresh each time: a
/// command may have run `useradd` since).
pub fn lookup(root: &Root, spec: &str) -> Result<User, AgentError> {
    let passwd = parse_passwd(&read_small(root, "/etc/passwd"));
    let groups = if spec.contains(':') || !passwd.is_empty() { parse_group(&read_small(root, "/etc/group")) } else { Vec::new() };
    resolve(spec, &passwd, &groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # a comment\n\
        daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n\
        broken line\n\
        alice:x:1000:1000:Alice,,,:/home/alice:/bin/sh\n\
        nohome:x:1001:1001::\n";
    const GROUP: &str = "root:x:0:\n\
        wheel:x:10:alice,bob\n\
        alice:x:1000:\n\
        docker:x:999:bob,alice\n\
        bad\n";

    fn r(spec: &str) -> Result<User, AgentError> {
        resolve(spec, &parse_passwd(PASSWD), &parse_group(GROUP))
    }

    #[test]
    fn passwd_parsing_skips_junk() {
        let p = parse_passwd(PASSWD);
        assert_eq!(p.len(), 4);
        assert_eq!(p[2], PasswdEntry { name: "alice".into(), uid: 1000, gid: 1000, home: "/home/alice".into(), shell: "/bin/sh".into() });
        let g = parse_group(GROUP);
        assert_eq!(g.len(), 4);
        assert_eq!(g[1].members, ["alice", "bob"]);
        assert!(g[0].members.is_empty());
    }

    #[test]
    fn by_name_with_supplementary_groups() {
        let u = r("alice").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.groups, [1000, 10, 999]);
        assert_eq!(u.home, "/home/alice");
        assert_eq!(u.name.as_deref(), Some("alice"));
    }

    #[test]
    fn by_uid_known_and_unknown() {
        assert_eq!(r("1000").unwrap().name.as_deref(), Some("alice"));
        let u = r("4242").unwrap();
        assert_eq!((u.uid, u.gid, u.name.clone(), u.home.as_str()), (4242, 0, None, "/"));
        assert_eq!(u.groups, [0]);
    }

    #[test]
    fn explicit_group() {
        let u = r("alice:wheel").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 10));
        assert_eq!(u.groups, [10]);
        assert_eq!(r("1000:55").unwrap().gid, 55);
        assert_eq!(r("alice:nogroup").unwrap_err().kind, ErrorKind::UnknownUser);
    }

    #[test]
    fn unknown_name_is_an_error_and_defaults_fill_in() {
        assert_eq!(r("mallory").unwrap_err().kind, ErrorKind::UnknownUser);
        let u = r("nohome").unwrap();
        assert_eq!((u.home.as_str(), u.shell.as_str()), ("/", "/bin/sh"));
        assert_eq!(r("root").unwrap().home, "/root");
        assert_eq!(r("").unwrap().uid, 0);
    }

    #[test]
    fn root_without_any_passwd_file() {
        assert_eq!(resolve("root", &[], &[]).unwrap(), User::root());
        assert_eq!(resolve("alice", &[], &[]).unwrap_err().kind, ErrorKind::UnknownUser);
        assert_eq!(resolve("0", &[], &[]).unwrap(), User::root());
        assert_eq!(resolve("", &[], &[]).unwrap(), User::root());
    }
}
