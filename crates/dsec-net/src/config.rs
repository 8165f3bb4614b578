//! The node's network configuration file: the sandbox address range, the
//! warm pool's size, the DNS upstream, whether traffic leaving the node is
//! masqueraded, and the named services (`pypi`, `npm`, ...) that rules may
//! allow, each mapped to endpoints: IPv4 prefixes, or domains that the
//! node's resolver opens when a sandbox asks for them (as a domain rule
//! does). `dsec network-config init` writes one from the host's own
//! package indexes (`defaults`).
//!
//! ```json
//! {
//!   "subnet": "10.213.0.0/16",
//!   "pool_size": 8,
//!   "forward": true,
//!   "nat": true,
//!   "dns_upstream": ["127.0.0.1:53"],
//!   "services": {
//!     "pypi": [{"domain": "pypi.org", "ports": "443", "protocols": ["tcp"]},
//!              {"domain": "files.pythonhosted.org", "ports": "443", "protocols": ["tcp"]}],
//!     "npm":  [{"cidr": "198.18.0.11/32", "ports": "443"}]
//!   }
//! }
//! ```

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use serde::Deserialize;

use crate::rules::{parse_domain, parse_ports, Cidr, DomainRule, PortRange, RuleError, PROTO_ICMP, PROTO_TCP, PROTO_UDP};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {0}: {1}")]
    Read(String, std::io::Error),
    #[error("{0}: {1}")]
    Parse(String, String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_subnet")]
    subnet: String,
    #[serde(default = "default_pool")]
    pool_size: usize,
    #[serde(default = "default_true")]
    forward: bool,
    #[serde(default)]
    nat: bool,
    #[serde(default)]
    dns_upstream: Vec<SocketAddr>,
    #[serde(default)]
    services: BTreeMap<String, Vec<RawEndpoint>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    #[serde(default)]
    cidr: Option<String>,
    #[serde(default)]
    domain: Option<String>,
    #[serde(default)]
    ports: Option<String>,
    #[serde(default)]
    protocols: Option<Vec<String>>,
}

fn default_subnet() -> String {
    "10.213.0.0/16".into()
}
fn default_pool() -> usize {
    8
}
fn default_true() -> bool {
    true
}

/// One endpoint of a named service and what is open on it.
#[derive(Debug, Clone, PartialEq)]
pub enum Endpoint {
    /// An IPv4 prefix, open from the start.
    Prefix { cidr: Cidr, ranges: Vec<PortRange> },
    /// A domain (or `*.` its subdomains): the addresses the node's
    /// resolver answers for it to the sandbox are opened.
    Domain(DomainRule),
}

#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Sandbox addresses: a /31 per sandbox (host side even, sandbox odd);
    /// the first pair is the node's DNS resolver.
    pub subnet: Cidr,
    /// Network namespaces kept ready, veth and addresses set up.
    pub pool_size: usize,
    /// Let allowed traffic leave the node (forwarding on the host side of
    /// each sandbox's veth). Off: only addresses of the node itself.
    pub forward: bool,
    /// Masquerade what leaves the node from the sandbox subnet (one
    /// POSTROUTING rule while the edge runs): mirrors beyond the node then
    /// need no route back to the subnet.
    pub nat: bool,
    /// Where the resolver asks; empty: the nameservers of /etc/resolv.conf.
    pub dns_upstream: Vec<SocketAddr>,
    pub services: BTreeMap<String, Vec<Endpoint>>,
}

impl NetConfig {
    pub fn load(path: &Path) -> Result<NetConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.display().to_string(), e))?;
        NetConfig::parse(&text).map_err(|e| ConfigError::Parse(path.display().to_string(), e))
    }

    pub fn parse(text: &str) -> Result<NetConfig, String> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let subnet: Cidr = raw.subnet.parse().map_err(|e: RuleError| format!("subnet: {e}"))?;
        if subnet.len > 29 {
            return Err(format!("subnet {subnet} is too small (at most /29)"));
        }
        let mut services = BTreeMap::new();
        for (name, eps) in raw.services {
            if !crate::rules::is_service_name(&name) {
                return Err(format!("service name {name:?}: use lowercase letters, digits, '-' and '_'"));
            }
            let mut out = Vec::new();
            for ep in eps {
                let protos = match ep.protocols {
                    None => PROTO_TCP | PROTO_UDP,
                    Some(list) => {
                        let mut bits = 0;
                        for p in list {
                            bits |= match p.as_str() {
                                "tcp" => PROTO_TCP,
                                "udp" => PROTO_UDP,
                                "icmp" => PROTO_ICMP,
                                other => return Err(format!("service {name}: unknown protocol {other:?} (tcp, udp, icmp)")),
                            };
                        }
                        bits
                    }
                };
                let ranges = parse_ports(ep.ports.as_deref().unwrap_or("1-65535"), protos).map_err(|e| format!("service {name}: {e}"))?;
                out.push(match (ep.cidr, ep.domain) {
                    (Some(cidr), None) => {
                        let cidr: Cidr = cidr.parse().map_err(|e: RuleError| format!("service {name}: {e}"))?;
                        if subnet.covers(&cidr) {
                            return Err(format!("service {name}: {cidr} lies in the sandbox subnet {subnet}"));
                        }
                        Endpoint::Prefix { cidr, ranges }
                    }
                    (None, Some(domain)) => {
                        if protos & PROTO_ICMP != 0 {
                            return Err(format!("service {name}: a domain endpoint takes tcp and udp, not icmp"));
                        }
                        Endpoint::Domain(parse_domain(&domain, ranges).map_err(|e| format!("service {name}: {domain:?}: {e}"))?)
                    }
                    _ => return Err(format!("service {name}: each endpoint has either \"cidr\" or \"domain\"")),
                });
            }
            services.insert(name, out);
        }
        let dns_upstream = if raw.dns_upstream.is_empty() { system_nameservers() } else { raw.dns_upstream };
        Ok(NetConfig { subnet, pool_size: raw.pool_size, forward: raw.forward, nat: raw.nat, dns_upstream, services })
    }

    /// The resolver's address (the second address of the subnet).
    pub fn resolver_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.subnet.addr_u32() + 1)
    }

    /// Host-side and sandbox-side addresses of slot `slot` (>= 1).
    pub fn slot_addrs(&self, slot: u32) -> (Ipv4Addr, Ipv4Addr) {
        let base = self.subnet.addr_u32() + 2 * slot;
        (Ipv4Addr::from(base), Ipv4Addr::from(base + 1))
    }

    /// How many sandboxes the subnet has room for.
    pub fn max_slots(&self) -> u32 {
        ((1u64 << (32 - self.subnet.len)) / 2 - 1) as u32
    }
}

fn system_nameservers() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_map_to_endpoints() {
        let c = NetConfig::parse(
            r#"{"subnet": "10.9.0.0/16", "dns_upstream": ["127.0.0.1:5353"],
                "services": {"pypi": [{"cidr": "198.18.0.10/32", "ports": "80,443", "protocols": ["tcp"]}]}}"#,
        )
        .unwrap();
        let Endpoint::Prefix { cidr, ranges } = &c.services["pypi"][0] else { panic!("a prefix endpoint") };
        assert_eq!(cidr.to_string(), "198.18.0.10/32");
        assert_eq!(ranges, &vec![PortRange { lo: 80, hi: 80, protos: PROTO_TCP }, PortRange { lo: 443, hi: 443, protos: PROTO_TCP }]);
        assert!(!c.nat, "no masquerading unless asked");
        assert_eq!(c.resolver_ip(), Ipv4Addr::new(10, 9, 0, 1));
        assert_eq!(c.slot_addrs(1), (Ipv4Addr::new(10, 9, 0, 2), Ipv4Addr::new(10, 9, 0, 3)));
        assert_eq!(c.max_slots(), 32767);
    }

    #[test]
    fn services_may_name_domains() {
        let c = NetConfig::parse(
            r#"{"nat": true, "services": {"debian": [{"domain": "deb.debian.org", "ports": "80,443", "protocols": ["tcp"]},
                                                     {"domain": "*.debian.org"}]}}"#,
        )
        .unwrap();
        assert!(c.nat);
        let [Endpoint::Domain(exact), Endpoint::Domain(wild)] = &c.services["debian"][..] else { panic!("two domain endpoints") };
        assert!(exact.matches("deb.debian.org") && !exact.subdomains);
        assert_eq!(exact.ranges.len(), 2);
        assert!(wild.matches("security.debian.org") && !wild.matches("debian.org"));
        for bad in [
            r#"{"services": {"x": [{"cidr": "1.2.3.0/24", "domain": "a.example.org"}]}}"#,
            r#"{"services": {"x": [{"ports": "443"}]}}"#,
            r#"{"services": {"x": [{"domain": "not a name"}]}}"#,
            r#"{"services": {"x": [{"domain": "a.example.org", "protocols": ["icmp"]}]}}"#,
        ] {
            assert!(NetConfig::parse(bad).unwrap_err().contains("service x"), "{bad}");
        }
    }

    #[test]
    fn bad_configs_say_why() {
        assert!(NetConfig::parse(r#"{"services": {"x": [{"cidr": "10.213.1.0/24"}]}}"#).unwrap_err().contains("sandbox subnet"));
        assert!(NetConfig::parse(r#"{"services": {"x": [{"cidr": "1.2.3.0/24", "protocols": ["sctp"]}]}}"#).unwrap_err().contains("sctp"));
        assert!(NetConfig::parse(r#"{"subnet": "10.0.0.0/30"}"#).unwrap_err().contains("too small"));
        assert!(NetConfig::parse(r#"{"servics": {}}"#).is_err());
    }
}
