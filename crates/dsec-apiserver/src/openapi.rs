//! The OpenAPI document, generated from the handlers' annotations and the
//! wire types, served at `/openapi.json`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes::{admin, audit, events, files, fncall, jobs, metrics, pack, pause, sandboxes, screen, snapshots, stream, trajectory};

#[derive(OpenApi)]
#[openapi(
    info(title = "dsec API", description = "Sandboxes for agentic RL: create, exec, files, streaming. Errors use the codes in components.schemas.ErrorCode."),
    paths(
        admin::healthz, metrics::metrics, admin::nodes, admin::create_tenant, admin::list_tenants, admin::list_images, admin::delete_image,
        sandboxes::create, sandboxes::list, sandboxes::get, sandboxes::stop, sandboxes::delete,
        pause::pause, pause::resume, pause::set_timeout, pack::pack, snapshots::take, snapshots::list, snapshots::delete, events::sandbox, audit::list, audit::set_network,
        jobs::pause, jobs::resume, events::job,
        sandboxes::exec, sandboxes::create_session, sandboxes::delete_session,
        stream::exec_stream, stream::pty,
        files::read, files::write, files::remove, files::stat, files::list, files::mkdir,
        files::archive_get, files::archive_put,
        trajectory::get, trajectory::replay,
        screen::screenshot, screen::keys, screen::type_text, screen::move_to, screen::click,
        fncall::call, fncall::batch, fncall::pools, fncall::sandboxfusion_run_code, fncall::open_run_code,
    ),
    components(schemas(dsec_api::ErrorCode, dsec_api::StreamMessage)),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
    }
}
