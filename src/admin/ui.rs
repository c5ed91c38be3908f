//! The status page's assets, embedded in the binary (`src/admin/ui/`: plain HTML, CSS and
//! JavaScript, no build step, nothing fetched from elsewhere), and the headers every answer of
//! the page's paths carries: a Content-Security-Policy without inline script, no sniffing, no
//! referrer, no framing.

use http::{header, HeaderMap, HeaderValue, Response, StatusCode};

use super::reply;
use crate::body::ProxyBody;

/// The page's Content-Security-Policy: everything from the admin listener itself, no inline
/// script, no framing, no form posting anywhere.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Every asset: its path, content type and bytes.
pub const ASSETS: [(&str, &str, &str); 3] = [
    ("/", "text/html; charset=utf-8", include_str!("ui/index.html")),
    (
        "/ui/status.css",
        "text/css; charset=utf-8",
        include_str!("ui/status.css"),
    ),
    (
        "/ui/status.js",
        "text/javascript; charset=utf-8",
        include_str!("ui/status.js"),
    ),
];

/// The bytes of every asset together (the page's weight, uncompressed).
#[cfg(test)]
pub fn weight() -> usize {
    ASSETS.iter().map(|(_, _, body)| body.len()).sum()
}

/// The asset at `path`, or 404.
pub fn asset(path: &str) -> Response<ProxyBody> {
    match ASSETS.iter().find(|(p, _, _)| *p == path) {
        Some((_, content_type, body)) => {
            let mut resp = reply(StatusCode::OK, content_type, *body);
            // Assets change only with the binary; revalidating costs a few KiB per page load.
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            resp
        }
        None => reply(StatusCode::NOT_FOUND, "text/plain", "no such asset\n"),
    }
}

/// The headers of every answer on the page's paths (assets and data alike).
pub fn secure(headers: &mut HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_answer_carries_the_page_headers() {
        let mut resp = asset("/");
        secure(resp.headers_mut());
        let h = resp.headers();
        assert_eq!(
            h[header::CONTENT_SECURITY_POLICY],
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
        );
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(h[header::REFERRER_POLICY], "no-referrer");
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(asset("/ui/nothing.js").status(), StatusCode::NOT_FOUND);
        assert_eq!(
            asset("/ui/status.js").headers()[header::CONTENT_TYPE],
            "text/javascript; charset=utf-8"
        );
    }

    #[test]
    fn the_page_is_self_contained_and_light() {
        // docs/src/observability.md states the weight: under 100 KiB, all assets together.
        assert!(weight() < 100 * 1024, "{} bytes", weight());
        for (path, _, body) in ASSETS {
            // Nothing from another host, no inline script or handler, no markup built from data.
            for banned in [
                "http://",
                "https://",
                "//cdn",
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "eval(",
            ] {
                assert!(!body.contains(banned), "{path} contains {banned}");
            }
        }
        let html = ASSETS[0].2;
        assert!(!html.contains("<script>"), "no inline script");
        // No inline handler: no attribute ` on...=`.
        let handler = html.match_indices(" on").any(|(at, _)| {
            let rest = html[at + 3..].trim_start_matches(|c: char| c.is_ascii_lowercase());
            rest.len() < html.len() - at - 3 && rest.starts_with('=')
        });
        assert!(!handler, "no inline event handler");
        assert!(html.contains("<script src=\"/ui/status.js\""));
    }
}
