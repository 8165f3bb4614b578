//! The web dashboard at `/ui/`: three static files compiled into the
//! binary (no build step, nothing fetched at run time), which call the
//! public API with the signed-in user's token.
//!
//! The files themselves are public (they hold no data); every figure they
//! show comes from the API, behind the same tokens as any client. The
//! answers carry a strict Content-Security-Policy: scripts only from these
//! files (no inline script, no `eval`), requests only to this origin, no
//! framing; a sandbox's metadata that slipped past the page's own escaping
//! could still not run.

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use dsec_api::ErrorCode;

use crate::error::ApiError;

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const APP_CSS: &str = include_str!("../ui/app.css");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
            // The files change with the binary: always revalidate.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `/ui`: the page's relative asset links need the trailing slash.
pub async fn redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

/// `/ui/`: the page.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `/ui/{file}`: its script and style sheet.
pub async fn file(Path(name): Path<String>) -> Result<Response, ApiError> {
    match name.as_str() {
        "app.js" => Ok(asset("text/javascript; charset=utf-8", APP_JS)),
        "app.css" => Ok(asset("text/css; charset=utf-8", APP_CSS)),
        "index.html" => Ok(index().await),
        _ => Err(ApiError::new(ErrorCode::NotFound, format!("the dashboard has no file {name:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files_and_no_inline_script() {
        // Inline script would need 'unsafe-inline' in the policy; the page
        // must not depend on it, nor on anything from another origin.
        assert!(!INDEX_HTML.contains("<script>"), "no inline script");
        assert!(INDEX_HTML.contains(r#"<script src="app.js" defer></script>"#));
        assert!(!INDEX_HTML.contains("http://") && !INDEX_HTML.contains("https://"));
        assert!(!APP_JS.contains("http://") && !APP_JS.contains("https://"), "no request leaves the origin");
        assert!(!APP_CSS.contains("url("), "the style sheet fetches nothing");
        // Everything shown is inserted as text.
        for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
            assert!(!APP_JS.contains(sink), "app.js must not use {sink}");
        }
        assert!(!CSP.contains("unsafe"));
    }
}
