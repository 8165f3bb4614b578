//! One HTTP exchange (or WebSocket session) over a connection to a port
//! inside a sandbox. Bodies stream in both directions (nothing is
//! buffered whole); a client that goes away drops the request or the
//! response stream, which closes the connection to the sandbox; the
//! sandbox ending drops the connection, even mid-stream or mid-upgrade.

use axum::body::Body;
use axum::http::{header, Request, Response, StatusCode};
use dsec_api::ErrorCode;
use dsec_edge::PortConnection;
use hyper_util::rt::TokioIo;

use crate::error::ApiError;

/// Sends `req` (its URI already the sandbox-side origin form) over `conn`.
pub async fn exchange(conn: PortConnection, mut req: Request<Body>) -> Result<Response<Body>, ApiError> {
    let PortConnection { stream, ended, activity } = conn;
    let bad_gateway = |e: hyper::Error| ApiError::new(ErrorCode::PortClosed, format!("the sandbox's server failed the request: {e}"));
    let client_upgrade = req.headers().contains_key(header::UPGRADE).then(|| hyper::upgrade::on(&mut req));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(bad_gateway)?;
    // Both the connection's task and, after an upgrade, the splice watch
    // the sandbox and count as activity while they run.
    let watch = std::sync::Arc::new((ended, activity));
    let conn_watch = watch.clone();
    // The connection serves this one exchange and ends (closing the socket)
    // when the exchange is over, at an upgrade, or when the sandbox ends.
    tokio::spawn(async move {
        tokio::select! {
            _ = connection.with_upgrades() => {}
            _ = conn_watch.0.wait() => {}
        }
    });
    let mut resp = sender.send_request(req).await.map_err(bad_gateway)?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::new(ErrorCode::PortClosed, "the sandbox's server switched protocols on a plain request"));
        };
        let sandbox_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = tokio::join!(client_upgrade, sandbox_upgrade) {
                let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                    _ = watch.0.wait() => {}
                }
            }
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)))
}
