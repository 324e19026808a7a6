//! The operator console: static pages compiled into the gateway, served at `/console` when the
//! configuration asks (`console`), that stamp every API request in the browser themselves.
//!
//! The pages hold no power of their own: the gateway serves them like any file, and every call
//! they make is an ordinary stamped API request checked as any client's. What the headers below
//! buy is that nothing but these files runs in the page: no inline script, no other origin's
//! script or style, no framing, no form posting elsewhere, no outgoing connection but to this
//! gateway, and nothing kept by a cache.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The page's own files, compiled in: `(path, content type, body)`.
const FILES: &[(&str, &str, &str)] = &[
    ("/console", "text/html; charset=utf-8", include_str!("../console/index.html")),
    ("/console/app.js", "text/javascript; charset=utf-8", include_str!("../console/app.js")),
    ("/console/app.css", "text/css; charset=utf-8", include_str!("../console/app.css")),
];

/// Only this origin's files and API; no inline code, frames, plugins, forms or base rewriting.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The console's routes, merged into the API router when the configuration serves it.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut router = Router::new();
    for &(path, content_type, body) in FILES {
        router = router.route(path, get(move || async move { page(content_type, body) }));
    }
    router.route("/console/", get(|| async { axum::response::Redirect::permanent("/console") }))
}

fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert("cross-origin-opener-policy", HeaderValue::from_static("same-origin"));
    h.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    h.insert("permissions-policy", HeaderValue::from_static("camera=(), microphone=(), geolocation=(), payment=()"));
    response
}

/// `X-Content-Type-Options: nosniff` on every answer of the API listener, so that no JSON answer
/// (which may echo a caller's words) is ever read by a browser as a page or a script.
pub async fn no_sniffing(mut response: Response) -> Response {
    (response.headers_mut()).insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pages_load_nothing_from_elsewhere_and_run_no_inline_script() {
        let (_, _, html) = FILES[0];
        assert!(!html.contains("<script>") && !html.contains("onclick=") && !html.contains("style=\""));
        for (_, _, body) in FILES {
            assert!(!body.contains("http://") && !body.contains("https://"), "no other origin is named");
        }
        assert!(html.contains(r#"<script src="/console/app.js" defer></script>"#));
    }

    #[test]
    fn the_first_load_fits_the_budget() {
        let total: usize = FILES.iter().map(|(_, _, b)| b.len()).sum();
        assert!(total < 200 * 1024, "the console is {total} bytes");
    }
}
