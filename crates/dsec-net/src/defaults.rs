//! The default network configuration of a node: its named services are
//! the package indexes the host itself uses, so `{"pypi": true}` in a
//! sandbox reaches what `pip install` on the host reaches.
//!
//! - `pypi`: pip's `index-url` and `extra-index-url` (`PIP_INDEX_URL`,
//!   `PIP_EXTRA_INDEX_URL`, then /etc/pip.conf, /etc/xdg/pip/pip.conf,
//!   ~/.config/pip/pip.conf, ~/.pip/pip.conf); PyPI itself (pypi.org and
//!   files.pythonhosted.org, where its files live) when none is set.
//! - `npm`: npm's `registry` (`NPM_CONFIG_REGISTRY`, then ~/.npmrc,
//!   /etc/npmrc, /usr/etc/npmrc); registry.npmjs.org when none is set.
//! - `debian`: every host of apt's sources (one-line `.list` files and
//!   deb822 `.sources`).
//!
//! Each service names the index's host as a domain endpoint on the URL's
//! port (its scheme's when it has none), TCP only; the node's resolver
//! opens what the host's resolver answers for it. A host given as an IPv4
//! address becomes a /32 prefix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

/// Where the host's configuration files are read from (`/` on a real
/// host; a directory standing in for it in tests) and its environment.
pub struct Host {
    pub root: PathBuf,
    pub home: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
}

impl Host {
    /// This host: `/`, `$HOME` and the process's environment.
    pub fn this() -> Host {
        Host { root: PathBuf::from("/"), home: std::env::var_os("HOME").map(PathBuf::from), env: std::env::vars().collect() }
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(path.trim_start_matches('/'))).ok()
    }

    fn read_home(&self, rel: &str) -> Option<String> {
        let home = self.home.as_ref()?;
        std::fs::read_to_string(self.root.join(home.strip_prefix("/").unwrap_or(home)).join(rel)).ok()
    }

    fn files_in(&self, dir: &str, ext: &str) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.root.join(dir.trim_start_matches('/'))) else { return Vec::new() };
        let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == ext)).collect();
        paths.sort();
        paths.iter().filter_map(|p| std::fs::read_to_string(p).ok()).collect()
    }
}

/// One index: a host and a port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Index {
    pub host: String,
    pub port: u16,
}

impl Index {
    fn from_url(s: &str) -> Option<Index> {
        let u = url::Url::parse(s.trim()).ok()?;
        Some(Index { host: u.host_str()?.to_ascii_lowercase(), port: u.port_or_known_default()? })
    }
}

/// The indexes of each service, as found on `host`.
pub fn discover(host: &Host) -> BTreeMap<&'static str, Vec<Index>> {
    let mut out = BTreeMap::new();
    out.insert("pypi", pip_indexes(host));
    out.insert("npm", npm_registry(host));
    let debian = apt_hosts(host);
    if !debian.is_empty() {
        out.insert("debian", debian);
    }
    out
}

/// The configuration file's JSON for the discovered services: masquerading
/// on (mirrors beyond the node have no route to the sandbox subnet), the
/// other settings at their defaults.
pub fn config_json(services: &BTreeMap<&'static str, Vec<Index>>) -> Value {
    let services: serde_json::Map<String, Value> = services
        .iter()
        .map(|(name, indexes)| {
            let eps: Vec<Value> = indexes
                .iter()
                .map(|i| {
                    let key = if i.host.parse::<std::net::Ipv4Addr>().is_ok() { "cidr" } else { "domain" };
                    let target = if key == "cidr" { format!("{}/32", i.host) } else { i.host.clone() };
                    json!({ key: target, "ports": i.port.to_string(), "protocols": ["tcp"] })
                })
                .collect();
            (name.to_string(), Value::Array(eps))
        })
        .collect();
    json!({ "forward": true, "nat": true, "services": services })
}

fn pip_indexes(host: &Host) -> Vec<Index> {
    let mut urls = Vec::new();
    let env_urls = ["PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"].iter().filter_map(|k| host.env.get(*k)).flat_map(|v| split_urls(v));
    urls.extend(env_urls);
    if !host.env.contains_key("PIP_INDEX_URL") {
        let files = [
            host.read("/etc/pip.conf"),
            host.read("/etc/xdg/pip/pip.conf"),
            host.read_home(".config/pip/pip.conf"),
            host.read_home(".pip/pip.conf"),
        ];
        for text in files.iter().flatten() {
            urls.extend(ini_values(text, &["index-url", "extra-index-url"]));
        }
    }
    let mut found: Vec<Index> = urls.iter().filter_map(|u| Index::from_url(u)).collect();
    let default_pypi = found.is_empty() || found.iter().any(|i| i.host == "pypi.org");
    if default_pypi {
        found.push(Index { host: "pypi.org".into(), port: 443 });
        found.push(Index { host: "files.pythonhosted.org".into(), port: 443 });
    }
    dedup(found)
}

fn npm_registry(host: &Host) -> Vec<Index> {
    let from_env = host.env.get("NPM_CONFIG_REGISTRY").or_else(|| host.env.get("npm_config_registry")).cloned();
    let from_files = || {
        [host.read_home(".npmrc"), host.read("/etc/npmrc"), host.read("/usr/etc/npmrc")]
            .into_iter()
            .flatten()
            .find_map(|t| ini_values(&t, &["registry"]).into_iter().next())
    };
    let registry = from_env.or_else(from_files);
    let found: Vec<Index> = registry.iter().filter_map(|u| Index::from_url(u)).collect();
    if found.is_empty() {
        vec![Index { host: "registry.npmjs.org".into(), port: 443 }]
    } else {
        found
    }
}

fn apt_hosts(host: &Host) -> Vec<Index> {
    let mut texts: Vec<String> = host.read("/etc/apt/sources.list").into_iter().collect();
    texts.extend(host.files_in("/etc/apt/sources.list.d", "list"));
    let mut urls: Vec<String> = texts.iter().flat_map(|t| one_line_sources(t)).collect();
    urls.extend(host.files_in("/etc/apt/sources.list.d", "sources").iter().flat_map(|t| deb822_uris(t)));
    dedup(urls.iter().filter_map(|u| Index::from_url(u)).collect())
}

/// `KEY = VALUE` lines of an INI-like file (pip.conf, .npmrc), in any
/// section; a value may go on over indented lines (pip's extra-index-url).
fn ini_values(text: &str, keys: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut continuing = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if continuing && line.starts_with(char::is_whitespace) && !trimmed.is_empty() {
            out.extend(split_urls(trimmed));
            continue;
        }
        continuing = false;
        let Some((k, v)) = trimmed.split_once('=') else { continue };
        if keys.contains(&k.trim()) {
            out.extend(split_urls(v));
            continuing = true;
        }
    }
    out
}

fn split_urls(v: &str) -> Vec<String> {
    v.split_whitespace().map(str::to_string).collect()
}

/// `deb [options] URI suite components` lines.
fn one_line_sources(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("deb ") || l.starts_with("deb-src "))
        .filter_map(|l| {
            let rest = l.split_once(' ')?.1.trim_start();
            // Options in brackets come before the URI.
            let rest = if rest.starts_with('[') { rest.split_once(']')?.1 } else { rest };
            rest.split_whitespace().next().map(str::to_string)
        })
        .collect()
}

/// The `URIs:` fields of deb822 stanzas (several URIs may share one).
fn deb822_uris(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("URIs:"))
        .flat_map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

fn dedup(mut v: Vec<Index>) -> Vec<Index> {
    v.sort();
    v.dedup();
    v
}

/// Where `dsec up` looks for the node's configuration in its data dir.
pub fn path_in(data_dir: &Path) -> PathBuf {
    data_dir.join("network.json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Endpoint, NetConfig};

    fn host(files: &[(&str, &str)], env: &[(&str, &str)]) -> (tempfile::TempDir, Host) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let h = Host {
            root: dir.path().to_path_buf(),
            home: Some(PathBuf::from("/root")),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        (dir, h)
    }

    #[test]
    fn a_bare_host_gets_pypi_and_npmjs() {
        let (_d, h) = host(&[], &[]);
        let s = discover(&h);
        assert_eq!(
            s["pypi"],
            vec![Index { host: "files.pythonhosted.org".into(), port: 443 }, Index { host: "pypi.org".into(), port: 443 }]
        );
        assert_eq!(s["npm"], vec![Index { host: "registry.npmjs.org".into(), port: 443 }]);
        assert!(!s.contains_key("debian"), "no apt sources, no service");
    }

    #[test]
    fn the_hosts_own_mirrors_are_found() {
        let (_d, h) = host(
            &[
                ("/etc/pip.conf", "[global]\nindex-url = http://pypi.mirror.example:3141/root/pypi/+simple/\nextra-index-url =\n    https://wheels.example.org/simple\n"),
                ("/root/.npmrc", "fund=false\nregistry=https://npm.mirror.example/\n"),
                ("/etc/apt/sources.list", "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://deb.debian.org/debian bookworm main\ndeb-src http://deb.debian.org/debian bookworm main\n"),
                ("/etc/apt/sources.list.d/debian.sources", "Types: deb\nURIs: http://deb.debian.org/debian-security https://10.1.2.3:8443/debian\nSuites: bookworm\n"),
                ("/etc/apt/sources.list.d/ignored.txt", "deb http://not.read.example/ x y\n"),
            ],
            &[],
        );
        let s = discover(&h);
        assert_eq!(
            s["pypi"],
            vec![Index { host: "pypi.mirror.example".into(), port: 3141 }, Index { host: "wheels.example.org".into(), port: 443 }],
            "a mirror replaces PyPI"
        );
        assert_eq!(s["npm"], vec![Index { host: "npm.mirror.example".into(), port: 443 }]);
        assert_eq!(s["debian"], vec![Index { host: "10.1.2.3".into(), port: 8443 }, Index { host: "deb.debian.org".into(), port: 80 }]);
        // What is written parses as a configuration, with both endpoint kinds.
        let cfg = NetConfig::parse(&config_json(&s).to_string()).unwrap();
        assert!(cfg.nat);
        assert!(matches!(&cfg.services["debian"][0], Endpoint::Prefix { cidr, .. } if cidr.to_string() == "10.1.2.3/32"));
        assert!(matches!(&cfg.services["debian"][1], Endpoint::Domain(d) if d.matches("deb.debian.org")));
    }

    #[test]
    fn the_environment_wins_over_files() {
        let (_d, h) = host(
            &[("/etc/pip.conf", "[global]\nindex-url = https://file.example/simple\n")],
            &[("PIP_INDEX_URL", "https://env.example/simple"), ("NPM_CONFIG_REGISTRY", "http://npm.env.example:4873")],
        );
        let s = discover(&h);
        assert_eq!(s["pypi"], vec![Index { host: "env.example".into(), port: 443 }]);
        assert_eq!(s["npm"], vec![Index { host: "npm.env.example".into(), port: 4873 }]);
    }
}
