//! The OpenAPI document, generated from the handlers' annotations and the
//! wire types, served at `/openapi.json`. The Python SDK ships a copy
//! (`sdk/python/dsec/openapi.json`) that its unit tests check their fake
//! server against; a test keeps the copy current (regenerate with
//! `DSEC_WRITE_OPENAPI=1 cargo test -p dsec-apiserver --lib openapi`).

use serde_json::Value;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::routes::{
    admin, audit, build, cluster, events, files, fncall, jobs, metrics, pack, pause, projects, sandboxes, screen, snapshots, stream,
    tokens, trajectory, usage, volumes,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "dsec API", description = "Sandboxes for agentic RL: create, exec, files, streaming. Errors use the codes in components.schemas.ErrorCode."),
    paths(
        admin::healthz, metrics::metrics, admin::nodes, usage::node, admin::create_tenant, admin::list_tenants, admin::list_images, admin::delete_image, build::build,
        projects::create, projects::list, projects::show, projects::update, projects::delete, tokens::create, tokens::list, tokens::revoke,
        cluster::create_join_token, cluster::join, cluster::drain, cluster::undrain, cluster::remove,
        sandboxes::create, sandboxes::list, sandboxes::get, sandboxes::update, sandboxes::stop, sandboxes::delete,
        pause::pause, pause::resume, pause::set_timeout, pack::pack, snapshots::take, snapshots::list, snapshots::delete, volumes::create, volumes::list, volumes::delete, events::sandbox, audit::list, usage::sandbox, audit::set_network,
        jobs::pause, jobs::resume, events::job,
        sandboxes::exec, sandboxes::create_session, sandboxes::delete_session,
        stream::exec_stream, stream::pty,
        files::read, files::write, files::remove, files::stat, files::list, files::mkdir,
        files::archive_get, files::archive_put,
        trajectory::get, trajectory::replay,
        screen::screenshot, screen::keys, screen::type_text, screen::move_to, screen::click,
        crate::ports::expose, crate::ports::tcp::create, crate::ports::proxy, crate::ports::proxy_by_token,
        fncall::call, fncall::batch, fncall::pools, fncall::sandboxfusion_run_code, fncall::open_run_code,
    ),
    components(schemas(dsec_api::ErrorCode, dsec_api::StreamMessage)),
    modifiers(&BearerAuth, &Unauthorized, &ServerErrors),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

/// The document as pretty JSON whose objects have their keys sorted, so its
/// text depends on its content only (not on the order of maps or of
/// annotations): the served document and the SDK's copy are the same bytes.
pub fn openapi_json() -> String {
    serde_json::to_value(ApiDoc::openapi()).and_then(|doc| serde_json::to_string_pretty(&sorted(doc))).unwrap_or_default()
}

fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
    }
}

/// Every operation that takes the bearer token answers 401 `unauthorized`
/// without a good one: said here once instead of on each handler.
struct Unauthorized;

impl Modify for Unauthorized {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let public = |op: &Operation| op.security.as_ref().is_some_and(|s| s.contains(&SecurityRequirement::default()));
        for item in doc.paths.paths.values_mut() {
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for op in ops.into_iter().flatten().filter(|op| !public(op)) {
                let responses = &mut op.responses.responses;
                if !responses.contains_key("401") && !responses.contains_key("4XX") {
                    let body = Content::new(Some(Ref::from_schema_name("ErrorBody")));
                    let answer =
                        ResponseBuilder::new().description("The bearer token is missing or wrong.").content("application/json", body);
                    responses.insert("401".into(), RefOr::T(answer.build()));
                }
            }
        }
    }
}

/// Any operation may answer a server-side failure (5xx: `internal`,
/// `edge_unavailable`, `no_capacity`, ...) with the usual error body: said
/// here once, as the `5XX` range, instead of on each handler.
struct ServerErrors;

impl Modify for ServerErrors {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        for item in doc.paths.paths.values_mut() {
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for op in ops.into_iter().flatten() {
                let body = Content::new(Some(Ref::from_schema_name("ErrorBody")));
                let answer = ResponseBuilder::new()
                    .description("A failure on the server's side; the code says which (see ErrorCode).")
                    .content("application/json", body);
                op.responses.responses.entry("5XX".into()).or_insert_with(|| RefOr::T(answer.build()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_sorted(value: &Value) -> bool {
        match value {
            Value::Object(map) => map.keys().zip(map.keys().skip(1)).all(|(a, b)| a < b) && map.values().all(keys_sorted),
            Value::Array(items) => items.iter().all(keys_sorted),
            _ => true,
        }
    }

    #[test]
    fn openapi_text_is_canonical() {
        let text = openapi_json();
        let doc: Value = serde_json::from_str(&text).expect("the document is JSON");
        assert!(doc["paths"]["/v1/sandboxes/{id}/exec"]["post"].is_object());
        assert!(keys_sorted(&doc));
        assert_eq!(text, openapi_json());
    }

    #[test]
    fn unauthorized_is_documented_where_a_token_is_needed() {
        let doc: Value = serde_json::from_str(&openapi_json()).expect("the document is JSON");
        let answers = |path: &str, method: &str| doc["paths"][path][method]["responses"].clone();
        assert_eq!(
            answers("/v1/sandboxes", "get")["401"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorBody"
        );
        // Covered by its range already.
        assert!(answers("/v1/sandboxes/{id}/exec", "post")["401"].is_null());
        // Public: no token.
        assert!(answers("/healthz", "get")["401"].is_null());
        assert!(answers("/run_code", "post")["401"].is_null());
    }

    #[test]
    fn server_errors_are_documented_on_every_operation() {
        let doc: Value = serde_json::from_str(&openapi_json()).expect("the document is JSON");
        let paths = doc["paths"].as_object().expect("paths");
        assert!(paths.len() > 40);
        for (path, item) in paths {
            for (method, op) in item.as_object().expect("a path item") {
                assert_eq!(
                    op["responses"]["5XX"]["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/ErrorBody",
                    "{method} {path}"
                );
            }
        }
    }

    /// The SDK's copy of the document must equal this one.
    #[test]
    fn sdk_openapi_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../sdk/python/dsec/openapi.json");
        let want = openapi_json() + "\n";
        if std::env::var_os("DSEC_WRITE_OPENAPI").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        let first_difference =
            have.lines().zip(want.lines()).position(|(h, w)| h != w).unwrap_or(have.lines().count().min(want.lines().count()));
        assert!(
            have == want,
            "sdk/python/dsec/openapi.json is stale (from line {}): run DSEC_WRITE_OPENAPI=1 cargo test -p dsec-apiserver --lib openapi",
            first_difference + 1
        );
    }
}
