//! A full VM's screen: keyboard and mouse input (`POST
//! /v1/sandboxes/{id}/screen/...`). The screenshot itself is a PNG body.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/screen/keys`: key combos pressed one after the
/// other, e.g. `["ctrl-alt-delete"]`, `["h", "i", "ret"]`. Names are
/// QEMU's key codes (`a`, `ret`, `esc`, `f1`, `kp_add`, `bracket_left`...)
/// or common aliases (`enter`, `escape`, `control`, `super`); a combo joins
/// them with `-` or `+`, modifiers first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenKeysRequest {
    pub keys: Vec<String>,
}

/// `POST /v1/sandboxes/{id}/screen/type`: text typed on a US keyboard
/// layout (printable ASCII, newline, tab).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenTypeRequest {
    pub text: String,
}

/// `POST /v1/sandboxes/{id}/screen/move`: the pointer to pixel (x, y) of
/// the screen as it is now (origin top left).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenMoveRequest {
    pub x: u32,
    pub y: u32,
}

/// `POST /v1/sandboxes/{id}/screen/click`: a click of `button` (`left`,
/// `right`, `middle`; default `left`), at (x, y) if both are given, else
/// where the pointer is.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenClickRequest {
    #[serde(default)]
    pub x: Option<u32>,
    #[serde(default)]
    pub y: Option<u32>,
    #[serde(default)]
    pub button: Option<String>,
    /// A double click.
    #[serde(default)]
    pub double: bool,
}
