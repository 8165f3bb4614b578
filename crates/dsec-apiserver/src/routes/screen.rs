//! A full VM's screen: a PNG screenshot, keyboard and mouse input. A
//! sandbox without a screen answers 409 `no_screen`; malformed input 400.

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use dsec_api as api;
use dsec_edge::ScreenInput;

use crate::auth::Auth;
use crate::error::ApiResult;
use crate::extract::ApiJson;
use crate::state::AppState;

/// The screen as PNG; its size is also in `x-screen-width` and
/// `x-screen-height`.
#[utoipa::path(get, path = "/v1/sandboxes/{id}/screenshot", tag = "screen",
    params(("id" = String, Path)),
    responses((status = 200, content_type = "image/png", body = Vec<u8>), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn screenshot(State(st): State<AppState>, Auth(caller): Auth, Path(id): Path<String>) -> ApiResult<Response> {
    let shot = st.nodes.owner(&id)?.screenshot(&caller, &id).await?;
    let headers = [
        (header::CONTENT_TYPE, "image/png".to_string()),
        (header::HeaderName::from_static("x-screen-width"), shot.width.to_string()),
        (header::HeaderName::from_static("x-screen-height"), shot.height.to_string()),
    ];
    Ok((headers, shot.png).into_response())
}

async fn send(st: &AppState, caller: &dsec_edge::Caller, id: &str, action: ScreenInput) -> ApiResult<StatusCode> {
    st.nodes.owner(id)?.screen_input(caller, id, action).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Press key combos one after the other.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/screen/keys", tag = "screen",
    params(("id" = String, Path)), request_body = api::ScreenKeysRequest,
    responses((status = 204), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn keys(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<api::ScreenKeysRequest>,
) -> ApiResult<StatusCode> {
    send(&st, &caller, &id, ScreenInput::Keys(req.keys)).await
}

/// Type text (US keyboard layout).
#[utoipa::path(post, path = "/v1/sandboxes/{id}/screen/type", tag = "screen",
    params(("id" = String, Path)), request_body = api::ScreenTypeRequest,
    responses((status = 204), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn type_text(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<api::ScreenTypeRequest>,
) -> ApiResult<StatusCode> {
    send(&st, &caller, &id, ScreenInput::Text(req.text)).await
}

/// Move the pointer to a pixel of the screen.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/screen/move", tag = "screen",
    params(("id" = String, Path)), request_body = api::ScreenMoveRequest,
    responses((status = 204), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn move_to(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<api::ScreenMoveRequest>,
) -> ApiResult<StatusCode> {
    send(&st, &caller, &id, ScreenInput::Move { x: req.x, y: req.y }).await
}

/// Click a mouse button, at a pixel if given.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/screen/click", tag = "screen",
    params(("id" = String, Path)), request_body = api::ScreenClickRequest,
    responses((status = 204), (status = 400, body = api::ErrorBody), (status = 404, body = api::ErrorBody), (status = 409, body = api::ErrorBody)))]
pub async fn click(
    State(st): State<AppState>,
    Auth(caller): Auth,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<api::ScreenClickRequest>,
) -> ApiResult<StatusCode> {
    let at = match (req.x, req.y) {
        (Some(x), Some(y)) => Some((x, y)),
        (None, None) => None,
        _ => return Err(crate::error::ApiError::invalid("give both x and y, or neither")),
    };
    let button = req.button.unwrap_or_else(|| "left".into());
    send(&st, &caller, &id, ScreenInput::Click { at, button, double: req.double }).await
}
