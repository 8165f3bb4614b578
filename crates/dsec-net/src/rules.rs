//! A sandbox's network rules: parsed from the API's `{key: bool}` map and
//! compiled into the entries of the eBPF allowlist.
//!
//! Keys (the paper's `{"npm": False, "pypi": True}` is the first kind):
//! - a named service of the node's configuration: `pypi`;
//! - an IPv4 prefix with optional protocol and ports:
//!   `198.18.0.0/24`, `198.18.0.7:443`, `udp:198.18.0.7:53`,
//!   `tcp:198.18.0.0/24:8000-8999`;
//! - a domain, answered by the node's resolver, with optional ports:
//!   `files.example.org`, `*.example.org:443` (`*.` = any subdomain),
//!   `*` (any name: with `0.0.0.0/0`, the open internet).
//!
//! `true` allows; `false` allows nothing (it states the intent, and is
//! checked like an allow, so a typo is still an error). Everything no rule
//! allows is denied. Without protocol a prefix or domain opens TCP and UDP.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

use crate::config::{Endpoint, NetConfig};

pub const PROTO_TCP: u8 = 1;
pub const PROTO_UDP: u8 = 2;
pub const PROTO_ICMP: u8 = 4;

/// Port ranges one allowlist entry can hold (`MAX_RANGES` in the eBPF
/// program).
pub const MAX_RANGES: usize = 8;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuleError {
    #[error("unknown network service {0:?} (this node knows: {1})")]
    UnknownService(String, String),
    #[error("network rule {0:?}: {1}")]
    Bad(String, String),
    #[error("{0:?}: not an IPv4 prefix ({1})")]
    BadCidr(String, String),
}

/// An IPv4 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    pub fn addr_u32(&self) -> u32 {
        u32::from(self.addr)
    }

    fn mask(&self) -> u32 {
        if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - self.len)
        }
    }

    /// Whether `self` contains all of `other`.
    pub fn covers(&self, other: &Cidr) -> bool {
        self.len <= other.len && (other.addr_u32() & self.mask()) == self.addr_u32()
    }

    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.covers(other) || other.covers(self)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl std::str::FromStr for Cidr {
    type Err = RuleError;
    fn from_str(s: &str) -> Result<Cidr, RuleError> {
        let bad = |why: &str| RuleError::BadCidr(s.to_string(), why.to_string());
        let (a, len) = match s.split_once('/') {
            Some((a, l)) => (a, l.parse::<u8>().map_err(|_| bad("the prefix length must be 0-32"))?),
            None => (s, 32),
        };
        if len > 32 {
            return Err(bad("the prefix length must be 0-32"));
        }
        let addr: Ipv4Addr = a.parse().map_err(|_| bad("bad address"))?;
        let c = Cidr { addr, len };
        if c.addr_u32() & !c.mask() != 0 {
            return Err(bad("host bits are set (write the network address)"));
        }
        Ok(c)
    }
}

/// Ports `lo..=hi` open for the protocols in `protos` (PROTO_* bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub lo: u16,
    pub hi: u16,
    pub protos: u8,
}

/// `"443"`, `"80,443"`, `"8000-8999"`, combinations of those.
pub fn parse_ports(s: &str, protos: u8) -> Result<Vec<PortRange>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let p = |x: &str| x.parse::<u16>().ok().filter(|v| *v > 0).ok_or_else(|| format!("bad port {part:?} (1-65535)"));
        let (lo, hi) = (p(lo)?, p(hi)?);
        if lo > hi {
            return Err(format!("bad port range {part:?}"));
        }
        out.push(PortRange { lo, hi, protos });
    }
    Ok(out)
}

pub fn is_service_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A domain rule: `pattern` is lowercase, without the `*.` of a wildcard;
/// empty with `subdomains` for `*`, any name.
#[derive(Debug, Clone, PartialEq)]
pub struct DomainRule {
    pub pattern: String,
    pub subdomains: bool,
    pub ranges: Vec<PortRange>,
}

impl DomainRule {
    pub fn matches(&self, name: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if self.subdomains && self.pattern.is_empty() {
            !name.is_empty()
        } else if self.subdomains {
            name.len() > self.pattern.len() && name.ends_with(&self.pattern) && name.as_bytes()[name.len() - self.pattern.len() - 1] == b'.'
        } else {
            name == self.pattern
        }
    }
}

/// The parsed rules of one sandbox.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuleSet {
    /// Prefixes allowed by services and CIDR rules.
    pub static_allow: Vec<(Cidr, Vec<PortRange>)>,
    pub domains: Vec<DomainRule>,
}

impl RuleSet {
    /// The domain rule allowing `name`, if any.
    pub fn domain(&self, name: &str) -> Option<&DomainRule> {
        self.domains.iter().find(|d| d.matches(name))
    }
}

/// Checks and parses the API's rules against the node's configuration.
pub fn parse(map: &BTreeMap<String, bool>, cfg: &NetConfig) -> Result<RuleSet, RuleError> {
    let mut set = RuleSet::default();
    for (key, allow) in map {
        let parsed = parse_key(key, cfg)?;
        if !allow {
            continue;
        }
        match parsed {
            Parsed::Allow(entries) => set.static_allow.extend(entries),
            Parsed::Domain(d) => set.domains.push(d),
            Parsed::Service(endpoints) => {
                for ep in endpoints {
                    match ep {
                        Endpoint::Prefix { cidr, ranges } => set.static_allow.push((*cidr, ranges.clone())),
                        Endpoint::Domain(d) => set.domains.push(d.clone()),
                    }
                }
            }
        }
    }
    Ok(set)
}

enum Parsed<'c> {
    Allow(Vec<(Cidr, Vec<PortRange>)>),
    Domain(DomainRule),
    Service(&'c [Endpoint]),
}

fn parse_key<'c>(key: &str, cfg: &'c NetConfig) -> Result<Parsed<'c>, RuleError> {
    let bad = |why: String| RuleError::Bad(key.to_string(), why);
    if key.is_empty() || key.len() > 253 {
        return Err(bad("empty or longer than 253 characters".into()));
    }
    if is_service_name(key) {
        return match cfg.services.get(key) {
            Some(eps) => Ok(Parsed::Service(eps)),
            None => {
                let known: Vec<&str> = cfg.services.keys().map(String::as_str).collect();
                Err(RuleError::UnknownService(key.to_string(), if known.is_empty() { "none".into() } else { known.join(", ") }))
            }
        };
    }
    let (protos, rest, explicit_proto) = match key.split_once(':') {
        Some(("tcp", r)) => (PROTO_TCP, r, true),
        Some(("udp", r)) => (PROTO_UDP, r, true),
        Some(("icmp", r)) => (PROTO_ICMP, r, true),
        _ => (PROTO_TCP | PROTO_UDP, key, false),
    };
    // The allowlist is keyed by IPv4 prefix; IPv6 is refused whole.
    if rest.starts_with('[') || rest.matches(':').count() > 1 {
        return Err(bad("IPv6 destinations cannot be allowed: sandboxes have IPv4 egress only (IPv6 is refused whole)".into()));
    }
    let (target, ports) = match rest.rsplit_once(':') {
        Some((t, p)) => (t, Some(p)),
        None => (rest, None),
    };
    if protos == PROTO_ICMP && ports.is_some() {
        return Err(bad("ICMP has no ports".into()));
    }
    let ranges = parse_ports(ports.unwrap_or("1-65535"), protos).map_err(bad)?;
    let looks_numeric = target.bytes().all(|b| b.is_ascii_digit() || b == b'.' || b == b'/');
    if looks_numeric {
        let cidr: Cidr = target.parse()?;
        // A prefix covering the subnet is fine (the subnet's deny entry is
        // longer, so it wins); one inside it would open sandboxes.
        if cfg.subnet.covers(&cidr) {
            return Err(bad(format!("lies in the sandbox subnet {} (sandboxes never reach each other)", cfg.subnet)));
        }
        let ranges = if protos == PROTO_ICMP { vec![PortRange { lo: 0, hi: 65535, protos }] } else { ranges };
        return Ok(Parsed::Allow(vec![(cidr, ranges)]));
    }
    if explicit_proto && protos == PROTO_ICMP {
        return Err(bad("ICMP rules take an address or prefix, not a domain".into()));
    }
    parse_domain(target, ranges).map(Parsed::Domain).map_err(|_| bad("not a service name, an IPv4 prefix or a domain".into()))
}

/// A domain (`files.example.org`) or its subdomains (`*.example.org`) with
/// the ports it opens; Err says why it is not a domain.
pub(crate) fn parse_domain(target: &str, ranges: Vec<PortRange>) -> Result<DomainRule, String> {
    if target == "*" {
        return Ok(DomainRule { pattern: String::new(), subdomains: true, ranges });
    }
    let (subdomains, name) = match target.strip_prefix("*.") {
        Some(n) => (true, n),
        None => (false, target),
    };
    let valid_label =
        |l: &str| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') && !l.starts_with('-');
    if name.len() > 253 || !name.contains('.') || !name.split('.').all(valid_label) {
        return Err("not a domain (labels of letters, digits and '-', at least two)".into());
    }
    Ok(DomainRule { pattern: name.to_ascii_lowercase(), subdomains, ranges })
}

/// One entry of the eBPF allowlist of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub cidr: Cidr,
    pub ranges: Vec<PortRange>,
}

/// The allowlist entries of a sandbox: its static rules, the addresses its
/// domains resolved to, and a deny entry for the sandbox subnet.
///
/// The eBPF map is an LPM trie, so the *longest* matching prefix decides:
/// an entry therefore carries the ports of every entry that covers it
/// (allowing 10.0.0.0/8 on 443 and 10.1.0.0/16 on 80 gives the /16 both),
/// except the subnet's deny entry, which nothing covers into. Ranges are
/// merged where they touch; more than `MAX_RANGES` on one prefix is an
/// error.
pub fn compile(set: &RuleSet, learned: &[(Ipv4Addr, Vec<PortRange>)], subnet: Cidr) -> Result<Vec<Entry>, RuleError> {
    let mut by_prefix: BTreeMap<Cidr, Vec<PortRange>> = BTreeMap::new();
    for (c, r) in &set.static_allow {
        by_prefix.entry(*c).or_default().extend(r);
    }
    for (ip, r) in learned {
        by_prefix.entry(Cidr { addr: *ip, len: 32 }).or_default().extend(r);
    }
    let prefixes: Vec<Cidr> = by_prefix.keys().copied().collect();
    let mut out = Vec::new();
    for p in &prefixes {
        let mut ranges: Vec<PortRange> = Vec::new();
        for q in &prefixes {
            if q.covers(p) {
                ranges.extend(&by_prefix[q]);
            }
        }
        let ranges = merge(ranges);
        if ranges.len() > MAX_RANGES {
            return Err(RuleError::Bad(p.to_string(), format!("more than {MAX_RANGES} port ranges apply to this prefix")));
        }
        out.push(Entry { cidr: *p, ranges });
    }
    out.push(Entry { cidr: subnet, ranges: Vec::new() });
    Ok(out)
}

/// Sorted, with ranges of the same protocols that overlap or touch joined.
fn merge(mut v: Vec<PortRange>) -> Vec<PortRange> {
    v.sort_by_key(|r| (r.protos, r.lo, r.hi));
    let mut out: Vec<PortRange> = Vec::new();
    for r in v {
        match out.last_mut() {
            Some(l) if l.protos == r.protos && u32::from(r.lo) <= u32::from(l.hi) + 1 => l.hi = l.hi.max(r.hi),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NetConfig {
        NetConfig::parse(
            r#"{"subnet": "10.213.0.0/16", "dns_upstream": ["127.0.0.1:53"], "services": {
                "pypi": [{"cidr": "198.18.0.10/32", "ports": "443", "protocols": ["tcp"]}],
                "npm": [{"cidr": "198.18.0.11/32", "ports": "443", "protocols": ["tcp"]}]}}"#,
        )
        .unwrap()
    }

    fn rules(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn the_papers_rules_allow_pypi_only() {
        let set = parse(&rules(&[("npm", false), ("pypi", true)]), &cfg()).unwrap();
        assert_eq!(set.static_allow, vec![("198.18.0.10/32".parse().unwrap(), vec![PortRange { lo: 443, hi: 443, protos: PROTO_TCP }])]);
        let entries = compile(&set, &[], cfg().subnet).unwrap();
        assert_eq!(entries.len(), 2, "pypi plus the subnet's deny entry");
        assert!(entries[1].ranges.is_empty());
    }

    #[test]
    fn a_service_of_domains_allows_them_through_the_resolver() {
        let cfg = NetConfig::parse(
            r#"{"services": {"pypi": [{"domain": "pypi.org", "ports": "443", "protocols": ["tcp"]},
                                      {"cidr": "198.18.0.10/32", "ports": "443", "protocols": ["tcp"]}]}}"#,
        )
        .unwrap();
        let set = parse(&rules(&[("pypi", true)]), &cfg).unwrap();
        assert_eq!(set.static_allow.len(), 1, "the prefix is open from the start");
        assert!(set.domain("PyPI.org.").is_some(), "the domain is opened as it resolves");
        assert!(set.domain("files.pythonhosted.org").is_none());
        assert_eq!(parse(&rules(&[("pypi", false)]), &cfg).unwrap(), RuleSet::default());
    }

    #[test]
    fn unknown_services_and_bad_prefixes_are_errors() {
        assert!(
            matches!(parse(&rules(&[("pipy", true)]), &cfg()), Err(RuleError::UnknownService(n, known)) if n == "pipy" && known == "npm, pypi")
        );
        assert!(matches!(parse(&rules(&[("github", false)]), &cfg()), Err(RuleError::UnknownService(..))), "false is checked too");
        assert!(matches!(parse(&rules(&[("10.0.0.1/8", true)]), &cfg()), Err(RuleError::BadCidr(..))));
        assert!(matches!(parse(&rules(&[("300.1.1.1", true)]), &cfg()), Err(RuleError::BadCidr(..))));
        assert!(matches!(parse(&rules(&[("10.213.4.0/24", true)]), &cfg()), Err(RuleError::Bad(..))), "the sandbox subnet");
        assert!(parse(&rules(&[("0.0.0.0/0", true)]), &cfg()).is_ok(), "covering the subnet is fine: its deny entry is longer");
        assert!(matches!(parse(&rules(&[("198.18.0.1:0", true)]), &cfg()), Err(RuleError::Bad(..))));
        assert!(matches!(parse(&rules(&[("icmp:198.18.0.1:7", true)]), &cfg()), Err(RuleError::Bad(..))));
        assert!(matches!(parse(&rules(&[("no spaces.com", true)]), &cfg()), Err(RuleError::Bad(..))));
    }

    #[test]
    fn prefixes_protocols_and_domains_parse() {
        let set = parse(
            &rules(&[
                ("udp:198.18.1.0/24:53", true),
                ("198.18.2.7:8000-8010", true),
                ("icmp:198.18.3.0/24", true),
                ("*.Example.org:443", true),
                ("a.example.com", true),
            ]),
            &cfg(),
        )
        .unwrap();
        assert!(set.static_allow.contains(&("198.18.1.0/24".parse().unwrap(), vec![PortRange { lo: 53, hi: 53, protos: PROTO_UDP }])));
        assert!(set
            .static_allow
            .contains(&("198.18.2.7/32".parse().unwrap(), vec![PortRange { lo: 8000, hi: 8010, protos: PROTO_TCP | PROTO_UDP }])));
        assert!(set.domain("files.example.org.").is_some());
        assert!(set.domain("example.org").is_none(), "*. means subdomains only");
        assert!(set.domain("badexample.org").is_none());
        assert!(set.domain("a.example.com").is_some());
        assert!(set.domain("b.a.example.com").is_none());
    }

    #[test]
    fn a_lone_star_allows_every_name() {
        let set = parse(&rules(&[("*:443", true)]), &cfg()).unwrap();
        assert!(set.domain("example.org").is_some() && set.domain("a.b.example.com.").is_some() && set.domain("localhost").is_some());
        assert!(set.domain("").is_none() && set.domain(".").is_none());
        assert_eq!(set.domains[0].ranges, vec![PortRange { lo: 443, hi: 443, protos: PROTO_TCP | PROTO_UDP }]);
        assert!(parse(&rules(&[("*.", true)]), &cfg()).is_err() && parse(&rules(&[("**", true)]), &cfg()).is_err());
    }

    #[test]
    fn longer_prefixes_inherit_the_ports_of_those_covering_them() {
        let set = parse(&rules(&[("198.18.0.0/16:443", true), ("198.18.5.0/24:80", true), ("198.18.5.0/24:81", true)]), &cfg()).unwrap();
        let e = compile(&set, &[(Ipv4Addr::new(198, 18, 5, 9), vec![PortRange { lo: 8080, hi: 8080, protos: PROTO_TCP }])], cfg().subnet)
            .unwrap();
        let get = |c: &str| e.iter().find(|x| x.cidr == c.parse().unwrap()).unwrap().ranges.clone();
        let tu = PROTO_TCP | PROTO_UDP;
        assert_eq!(get("198.18.0.0/16"), vec![PortRange { lo: 443, hi: 443, protos: tu }]);
        assert_eq!(get("198.18.5.0/24"), vec![PortRange { lo: 80, hi: 81, protos: tu }, PortRange { lo: 443, hi: 443, protos: tu }]);
        assert_eq!(
            get("198.18.5.9/32"),
            vec![
                PortRange { lo: 8080, hi: 8080, protos: PROTO_TCP },
                PortRange { lo: 80, hi: 81, protos: tu },
                PortRange { lo: 443, hi: 443, protos: tu }
            ]
        );
        assert_eq!(get("10.213.0.0/16"), vec![], "the subnet stays denied");
    }

    #[test]
    fn ipv6_destinations_are_refused_with_a_reason() {
        for key in ["2001:db8::/32", "tcp:2001:db8::1:443", "[2001:db8::1]:443", "::ffff:198.18.0.1"] {
            let err = parse(&rules(&[(key, true)]), &cfg()).unwrap_err().to_string();
            assert!(err.contains("IPv6"), "{key}: {err}");
        }
        assert!(parse(&rules(&[("tcp:198.18.0.7:443", true)]), &cfg()).is_ok());
    }

    #[test]
    fn too_many_ranges_on_one_prefix_is_an_error() {
        let many: Vec<(String, bool)> = (0..9).map(|i| (format!("198.18.0.1:{}", 100 + 2 * i), true)).collect();
        let set = parse(&many.into_iter().collect(), &cfg()).unwrap();
        assert!(compile(&set, &[], cfg().subnet).is_err());
    }
}
