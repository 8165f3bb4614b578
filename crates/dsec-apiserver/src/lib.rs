//! The apiserver: the one door between the trusted training side and the
//! sandboxes. HTTP/JSON with streaming over WebSocket, token auth, and
//! routing of every sandbox request to the edge that owns it.
//!
//! API boundary: [`router`] builds the axum `Router` from an [`AppState`].
//! Invariant: no per-sandbox state lives here; a sandbox id names its node.

pub mod auth;
pub mod cluster_tls;
mod convert;
mod e2b;
pub mod error;
mod exposition;
mod extract;
pub mod http_metrics;
pub mod iam;
pub mod lingering;
pub mod nodes;
mod openapi;
mod ports;
mod proxy;
pub mod quota;
pub mod registry;
pub mod remote;
mod routes;
mod sandboxfusion;
pub mod state;
pub mod tls_listener;
mod ui;
pub mod watcher;

use axum::routing::{any, get, post, put};
use axum::Router;
use dsec_api::ErrorCode;
pub use openapi::openapi_json;
pub use routes::fncall::FnCallBackend;
pub use state::{ApiLimits, AppState, ImageCatalog};

use crate::error::ApiError;
use crate::routes::{
    admin, audit, build, cluster, events, files, fncall, jobs, metrics, pack, pause, projects, sandboxes, screen, snapshots, stream,
    tokens, trajectory, usage, volumes,
};

pub fn router(state: AppState) -> Router {
    let doc = openapi_json();
    Router::new()
        .route("/healthz", get(admin::healthz))
        .route("/openapi.json", get(move || async move { ([("content-type", "application/json")], doc) }))
        .route("/metrics", get(metrics::metrics))
        .route("/ui", get(ui::redirect))
        .route("/ui/", get(ui::index))
        .route("/ui/{file}", get(ui::file))
        .route("/v1/nodes", get(admin::nodes))
        .route("/v1/nodes/{node}/metrics", get(usage::node))
        .route("/v1/nodes/{node}", axum::routing::delete(cluster::remove))
        .route("/v1/nodes/{node}/drain", post(cluster::drain))
        .route("/v1/nodes/{node}/undrain", post(cluster::undrain))
        .route("/v1/cluster/join-tokens", post(cluster::create_join_token))
        .route("/v1/cluster/join", post(cluster::join))
        .route("/v1/tenants", post(admin::create_tenant).get(admin::list_tenants))
        .route("/v1/projects", post(projects::create).get(projects::list))
        .route("/v1/projects/{*path}", get(projects::show).patch(projects::update).delete(projects::delete))
        .route("/v1/tokens", post(tokens::create).get(tokens::list))
        .route("/v1/tokens/{id}", axum::routing::delete(tokens::revoke))
        .route("/v1/images", get(admin::list_images))
        .route("/v1/images/build", post(build::build))
        .route("/v1/images/{*name}", axum::routing::delete(admin::delete_image))
        .route("/v1/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route("/v1/sandboxes/{id}", get(sandboxes::get).patch(sandboxes::update).delete(sandboxes::delete))
        .route("/v1/sandboxes/{id}/stop", post(sandboxes::stop))
        .route("/v1/sandboxes/{id}/pause", post(pause::pause))
        .route("/v1/sandboxes/{id}/resume", post(pause::resume))
        .route("/v1/sandboxes/{id}/timeout", post(pause::set_timeout))
        .route("/v1/sandboxes/{id}/pack", post(pack::pack))
        .route("/v1/sandboxes/{id}/snapshot", post(snapshots::take))
        .route("/v1/snapshots", get(snapshots::list))
        .route("/v1/snapshots/{name}", axum::routing::delete(snapshots::delete))
        .route("/v1/volumes", post(volumes::create).get(volumes::list))
        .route("/v1/volumes/{name}", axum::routing::delete(volumes::delete))
        .route("/v1/sandboxes/{id}/events", get(events::sandbox))
        .route("/v1/sandboxes/{id}/audit", get(audit::list))
        .route("/v1/sandboxes/{id}/metrics", get(usage::sandbox))
        .route("/v1/sandboxes/{id}/network", put(audit::set_network))
        .route("/v1/sandboxes/{id}/screenshot", get(screen::screenshot))
        .route("/v1/sandboxes/{id}/screen/keys", post(screen::keys))
        .route("/v1/sandboxes/{id}/screen/type", post(screen::type_text))
        .route("/v1/sandboxes/{id}/screen/move", post(screen::move_to))
        .route("/v1/sandboxes/{id}/screen/click", post(screen::click))
        .route("/v1/jobs/{job}/pause", post(jobs::pause))
        .route("/v1/jobs/{job}/resume", post(jobs::resume))
        .route("/v1/jobs/{job}/events", get(events::job))
        .route("/v1/sandboxes/{id}/exec", post(sandboxes::exec))
        .route("/v1/sandboxes/{id}/exec/stream", get(stream::exec_stream))
        .route("/v1/sandboxes/{id}/pty", get(stream::pty))
        .route("/v1/sandboxes/{id}/sessions", post(sandboxes::create_session))
        .route("/v1/sandboxes/{id}/sessions/{sid}", axum::routing::delete(sandboxes::delete_session))
        .route("/v1/sandboxes/{id}/files", get(files::read).put(files::write).delete(files::remove))
        .route("/v1/sandboxes/{id}/files/stat", get(files::stat))
        .route("/v1/sandboxes/{id}/files/list", get(files::list))
        .route("/v1/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/v1/sandboxes/{id}/archive", get(files::archive_get).put(files::archive_put))
        .route("/v1/sandboxes/{id}/expose", post(ports::expose))
        .route("/v1/sandboxes/{id}/forwards", post(ports::tcp::create))
        .route("/v1/sandboxes/{id}/ports/{port}", any(ports::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/", any(ports::proxy))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(ports::proxy))
        .route("/v1/port-urls/{token}", any(ports::proxy_by_token))
        .route("/v1/port-urls/{token}/", any(ports::proxy_by_token))
        .route("/v1/port-urls/{token}/{*path}", any(ports::proxy_by_token))
        .route("/v1/sandboxes/{id}/trajectory", get(trajectory::get))
        .route("/v1/sandboxes/{id}/replay", post(trajectory::replay))
        .route("/v1/fncall", post(fncall::call))
        .route("/v1/fncall/batch", post(fncall::batch))
        .route("/v1/fncall/pools", get(fncall::pools))
        .route("/run_code", post(fncall::open_run_code))
        .route("/sandboxfusion/{token}/run_code", post(fncall::sandboxfusion_run_code))
        .layer(axum::middleware::from_fn_with_state(state.clone(), proxy::forward_remote))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async { ApiError::new(ErrorCode::MethodNotAllowed, "method not allowed on this route") })
        // Uploads are streamed and bounded by ApiLimits, not by axum's
        // default 2 MB body limit.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state.clone())
        .merge(e2b::router(state.clone()))
        // Before every route: a sandbox's host name never reaches the API.
        .layer(axum::middleware::from_fn_with_state(state.clone(), ports::host::by_host))
        // Outermost, so a forwarded request and a refused one are timed too.
        .layer(axum::middleware::from_fn_with_state(state, http_metrics::observe))
}
