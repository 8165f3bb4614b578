//! Projects, roles, quotas and issued tokens: the records of IAM, and the
//! rules both engines apply to them the same way (project paths, what a
//! role may grant, how much of a parent's quota a child may take).

use crate::TokenHash;

/// What a token may do in its project (and the projects below it).
///
/// | role | sandboxes (create, use, list, delete) | issue tokens | sub-projects, quotas, revoking others' tokens |
/// |---|---|---|---|
/// | `admin` | yes | of any role | yes |
/// | `builder` | yes | `builder` only | no |
/// | `solver` | yes | `solver` only | no |
///
/// The tenants' tokens of before are `admin` tokens of their projects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Admin,
    Builder,
    Solver,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Admin, Role::Builder, Role::Solver];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Builder => "builder",
            Role::Solver => "solver",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether a holder of `self` may issue a token of `other`: only
    /// permissions it holds (an admin holds every role's).
    pub fn may_grant(self, other: Role) -> bool {
        self == Role::Admin || self == other
    }

    /// Whether it may create and delete sub-projects, set their quotas and
    /// revoke tokens it did not issue.
    pub fn administers(self) -> bool {
        self == Role::Admin
    }
}

/// Why a project path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("project paths are 1-255 characters: segments of 1-64 characters of a-z, 0-9, '-' and '_', joined by '/' (got {0:?})")]
    Malformed(String),
    #[error("project paths nest at most {MAX_DEPTH} deep (got {0:?})")]
    TooDeep(String),
}

/// The deepest a project may nest.
pub const MAX_DEPTH: usize = 16;

/// Checks a project path (`team-rl/exp-42`). A project's parent is its
/// path without the last segment, so the tree is the paths' prefix order
/// and can hold no cycle: a project cannot be made its own ancestor.
pub fn check_path(path: &str) -> Result<(), PathError> {
    let segment_ok =
        |s: &str| (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if path.len() > 255 || !path.split('/').all(segment_ok) {
        return Err(PathError::Malformed(path.to_string()));
    }
    if path.split('/').count() > MAX_DEPTH {
        return Err(PathError::TooDeep(path.to_string()));
    }
    Ok(())
}

/// `path` and each of its ancestors, nearest first: `a/b/c`, `a/b`, `a`.
pub fn self_and_ancestors(path: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(Some(path), |p| p.rsplit_once('/').map(|(parent, _)| parent))
}

/// Whether `project` is `ancestor` or below it.
pub fn is_within(project: &str, ancestor: &str) -> bool {
    project == ancestor || project.strip_prefix(ancestor).is_some_and(|rest| rest.starts_with('/'))
}

/// One kind of limit a quota may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// Live sandboxes (paused ones count: they keep their disk and come back
    /// without asking).
    Sandboxes,
    /// CPU, in thousandths of a core (the sum of the sandboxes' limits).
    CpuMillis,
    /// Memory in MiB (the sum of the sandboxes' limits).
    MemoryMb,
    /// Writable disk in MiB (the sum of the sandboxes' limits).
    DiskMb,
    /// Creations per second (a token bucket: this rate, bursts of as many).
    CreationsPerS,
    /// FnCall calls per second (a token bucket too).
    FncallPerS,
}

impl Limit {
    pub const ALL: [Limit; 6] =
        [Limit::Sandboxes, Limit::CpuMillis, Limit::MemoryMb, Limit::DiskMb, Limit::CreationsPerS, Limit::FncallPerS];

    /// The limit's name in messages and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Sandboxes => "sandboxes",
            Limit::CpuMillis => "cpu",
            Limit::MemoryMb => "memory_mb",
            Limit::DiskMb => "disk_mb",
            Limit::CreationsPerS => "creations_per_s",
            Limit::FncallPerS => "fncall_per_s",
        }
    }

    /// Whether it bounds what is held (rather than a rate).
    pub fn is_held(self) -> bool {
        !matches!(self, Limit::CreationsPerS | Limit::FncallPerS)
    }
}

/// A project's quota: each limit `None` is no limit of its own (its
/// ancestors' still hold).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    pub sandboxes: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub memory_mb: Option<u64>,
    pub disk_mb: Option<u64>,
    pub creations_per_s: Option<u64>,
    pub fncall_per_s: Option<u64>,
    /// Set explicitly to give this project more than its parent has not
    /// handed out yet (shown by `project show`).
    pub overcommit: bool,
}

impl Quota {
    pub fn get(&self, l: Limit) -> Option<u64> {
        match l {
            Limit::Sandboxes => self.sandboxes,
            Limit::CpuMillis => self.cpu_millis,
            Limit::MemoryMb => self.memory_mb,
            Limit::DiskMb => self.disk_mb,
            Limit::CreationsPerS => self.creations_per_s,
            Limit::FncallPerS => self.fncall_per_s,
        }
    }

    pub fn set(&mut self, l: Limit, v: Option<u64>) {
        let slot = match l {
            Limit::Sandboxes => &mut self.sandboxes,
            Limit::CpuMillis => &mut self.cpu_millis,
            Limit::MemoryMb => &mut self.memory_mb,
            Limit::DiskMb => &mut self.disk_mb,
            Limit::CreationsPerS => &mut self.creations_per_s,
            Limit::FncallPerS => &mut self.fncall_per_s,
        };
        *slot = v;
    }

    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        Limit::ALL.iter().all(|l| self.get(*l).is_none())
    }
}

/// Why a quota cannot be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("limit {limit} of project {project:?} is zero: a limit must be at least 1 (leave it out for no limit)")]
    Zero { project: String, limit: &'static str },
    #[error(
        "project {project:?} asks {asked} of limit {limit}, but its parent {parent:?} has only {free} of its {total} not handed out yet (set overcommit to give more)"
    )]
    AboveParentShare { project: String, parent: String, limit: &'static str, asked: u64, free: u64, total: u64 },
}

/// Checks that `quota` may be given to `project`, whose parent `parent`
/// has `parent_quota` and whose siblings hold `siblings`: every limit at
/// least 1, and (unless `quota.overcommit`) each limit at most what the
/// parent has not handed out to the siblings.
pub fn check_delegation(project: &str, quota: &Quota, parent: Option<(&str, &Quota)>, siblings: &[Quota]) -> Result<(), QuotaError> {
    for l in Limit::ALL {
        if quota.get(l) == Some(0) {
            return Err(QuotaError::Zero { project: project.to_string(), limit: l.name() });
        }
    }
    let Some((parent, pq)) = parent else { return Ok(()) };
    if quota.overcommit {
        return Ok(());
    }
    for l in Limit::ALL {
        let (Some(total), Some(asked)) = (pq.get(l), quota.get(l)) else { continue };
        let handed: u64 = siblings.iter().filter_map(|s| s.get(l)).fold(0u64, u64::saturating_add);
        let free = total.saturating_sub(handed);
        if asked > free {
            return Err(QuotaError::AboveParentShare {
                project: project.to_string(),
                parent: parent.to_string(),
                limit: l.name(),
                asked,
                free,
                total,
            });
        }
    }
    Ok(())
}

/// A token as listed: never the secret, only an id derived from its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub hash: TokenHash,
    pub principal: String,
    pub role: Role,
    pub created_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    pub revoked_at_ms: Option<u64>,
    /// The token that issued it (`None`: made by the platform, as the
    /// token file's or a tenant's first).
    pub issuer: Option<TokenHash>,
}

/// The id a token is listed and revoked by: the first 8 bytes of its
/// hash, in hex (the secret cannot be recovered from it).
pub fn token_id(hash: &TokenHash) -> String {
    hash[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_nest_and_refuse_what_could_not_be_a_tree() {
        assert!(check_path("team-rl").is_ok());
        assert!(check_path("team-rl/exp-42").is_ok());
        for bad in ["", "/a", "a/", "a//b", "A", "a/../b", "a/./b", "a b", &"x".repeat(65)] {
            assert!(matches!(check_path(bad), Err(PathError::Malformed(_))), "{bad:?}");
        }
        let deep = vec!["a"; MAX_DEPTH + 1].join("/");
        assert!(matches!(check_path(&deep), Err(PathError::TooDeep(_))));
        assert_eq!(self_and_ancestors("a/b/c").collect::<Vec<_>>(), ["a/b/c", "a/b", "a"]);
        assert!(is_within("a/b", "a") && is_within("a", "a") && !is_within("ab", "a") && !is_within("a", "a/b"));
    }

    #[test]
    fn roles_grant_only_what_they_hold() {
        assert!(Role::ALL.iter().all(|r| Role::Admin.may_grant(*r)));
        assert!(Role::Solver.may_grant(Role::Solver) && !Role::Solver.may_grant(Role::Builder) && !Role::Solver.may_grant(Role::Admin));
        assert!(!Role::Builder.may_grant(Role::Admin) && !Role::Builder.administers());
        assert_eq!(Role::parse("builder"), Some(Role::Builder));
        assert_eq!(Role::parse("root"), None);
    }

    fn q(sandboxes: u64) -> Quota {
        Quota { sandboxes: Some(sandboxes), ..Quota::default() }
    }

    #[test]
    fn a_child_gets_at_most_the_parents_unallocated_share() {
        let parent = Quota { sandboxes: Some(10), cpu_millis: Some(4000), ..Quota::default() };
        let p = Some(("team", &parent));
        assert!(check_delegation("team/a", &q(10), p, &[]).is_ok());
        assert!(check_delegation("team/b", &q(4), p, &[q(6)]).is_ok());
        let e = check_delegation("team/b", &q(5), p, &[q(6)]).unwrap_err();
        assert_eq!(
            e,
            QuotaError::AboveParentShare {
                project: "team/b".into(),
                parent: "team".into(),
                limit: "sandboxes",
                asked: 5,
                free: 4,
                total: 10
            }
        );
        // Unlimited siblings hand nothing out; a parent without the limit
        // bounds nothing.
        assert!(check_delegation("team/b", &q(10), p, &[Quota::default()]).is_ok());
        assert!(check_delegation("team/b", &Quota { memory_mb: Some(1 << 40), ..Quota::default() }, p, &[]).is_ok());
        // Overcommit is explicit.
        assert!(check_delegation("team/b", &Quota { overcommit: true, ..q(50) }, p, &[q(10)]).is_ok());
        // A top-level project takes anything but zero.
        assert!(check_delegation("team", &q(u64::MAX), None, &[]).is_ok());
        assert!(matches!(check_delegation("team", &q(0), None, &[]), Err(QuotaError::Zero { limit: "sandboxes", .. })));
        assert!(matches!(check_delegation("team/b", &Quota { overcommit: true, ..q(0) }, p, &[]), Err(QuotaError::Zero { .. })));
    }

    #[test]
    fn token_ids_are_the_hash_prefix() {
        let mut h = [0u8; 32];
        h[0] = 0xab;
        h[7] = 0x01;
        assert_eq!(token_id(&h), "ab00000000000001");
    }
}
