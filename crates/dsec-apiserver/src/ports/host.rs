//! Host-based routing to sandbox ports: a request whose host is
//! `PORT-ID.DOMAIN` (the shape E2B's `get_host` builds), with DOMAIN the
//! API's sandbox domain (`--sandbox-domain`), goes to `port` of sandbox
//! `id` with its path and query unchanged. Runs before every route, so
//! such a host never reaches the API's own routes.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

/// The host name of `port` of sandbox `id` under `domain`.
pub fn name_of(id: &str, port: u16, domain: &str) -> String {
    format!("{port}-{id}.{domain}")
}

/// `(port, id)` of a host `PORT-ID.DOMAIN` (any `:port` suffix ignored).
/// The host name of a `Host` header's authority, without its port
/// (`a.b:8080` -> `a.b`, `[fd00::1]:8080` -> `fd00::1`).
pub fn without_port(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit())).map_or(authority, |(h, _)| h)
}

pub fn parse(host: &str, domain: &str) -> Option<(u16, String)> {
    let host = without_port(host).to_ascii_lowercase();
    let name = host.strip_suffix(&domain.to_ascii_lowercase())?.strip_suffix('.')?;
    let (port, id) = name.split_once('-')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    (!id.is_empty()).then(|| (port, id.to_string()))
}

pub async fn by_host(State(st): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let Some(domain) = st.sandbox_domain.as_deref() else { return next.run(req).await };
    let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).or_else(|| req.uri().host());
    let Some((port, id)) = host.and_then(|h| parse(h, domain)) else { return next.run(req).await };
    let path = req.uri().path().to_string();
    super::serve(&st, &id, port, &path, req).await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_of_an_authority() {
        assert_eq!(without_port("node1.example:8080"), "node1.example");
        assert_eq!(without_port("10.0.0.2"), "10.0.0.2");
        assert_eq!(without_port("[fd00::1]:8080"), "fd00::1");
    }

    #[test]
    fn hosts_of_the_domain_name_a_port_and_a_sandbox() {
        let d = "sb.example.com";
        assert_eq!(parse("8000-n1.abcdefghijkl.sb.example.com", d), Some((8000, "n1.abcdefghijkl".into())));
        assert_eq!(parse("8000-n1.abc.SB.example.com:8080", d), Some((8000, "n1.abc".into())));
        assert_eq!(parse(&name_of("node-2.x", 3000, d), d), Some((3000, "node-2.x".into())));
        assert_eq!(parse("sb.example.com", d), None, "the API's own host");
        assert_eq!(parse("8000-n1.abc.other.com", d), None);
        assert_eq!(parse("0-n1.abc.sb.example.com", d), None);
        assert_eq!(parse("x-n1.abc.sb.example.com", d), None);
        assert_eq!(parse("8000-.sb.example.com", d), None);
        assert_eq!(parse("8000-n1.abcsb.example.com", d), None, "a suffix that is not a whole label");
    }
}
