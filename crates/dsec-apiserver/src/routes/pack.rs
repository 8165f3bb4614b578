//! `pack_diff`: a sandbox's changes captured as a new image.

use axum::extract::{Path, State};
use axum::Json;
use dsec_api as api;
use dsec_edge::PackRequest;

use crate::auth::Auth;
use crate::error::ApiResult;
use crate::extract::{ApiJson, IdempotencyKey};
use crate::state::AppState;

/// Pack what the sandbox changed into a new image: its layers plus one
/// workspace layer with the changes (only those since its previous pack,
/// when it was packed before). The sandbox is frozen while its changes are
/// copied, then keeps running. Residue (histories, /tmp, caches, logs) is
/// left out of the layer; the image records who built it from what. With
/// an `Idempotency-Key` header, a retry returns the first pack's report
/// (`created: false`) instead of packing again.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/pack", tag = "images",
    params(("id" = String, Path), ("idempotency-key" = Option<String>, Header)), request_body = api::PackRequest,
    responses((status = 200, body = api::PackResult), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn pack(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    IdempotencyKey(key): IdempotencyKey,
    ApiJson(req): ApiJson<api::PackRequest>,
) -> ApiResult<Json<api::PackResult>> {
    let req = PackRequest { name: req.name, scrub: req.scrub };
    let o = st.nodes.owner(&id)?.pack_diff_keyed(&caller, &id, req, key.as_deref()).await?;
    Ok(Json(api::PackResult {
        image: o.image,
        layer: o.layer,
        layer_size: o.layer_size,
        layers: o.layers,
        incremental: o.incremental,
        entries: o.entries,
        bytes: o.bytes,
        whiteouts: o.whiteouts,
        scrubbed: o.scrubbed,
        frozen_ms: o.copy_ms,
        build_ms: o.build_ms,
        created: o.created,
    }))
}
