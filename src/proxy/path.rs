//! The request path as every reader will take it: a path that a backend, or the router's own
//! path rules (`[auth] public_paths`, the Protected Resource Metadata, the MCP endpoint), could
//! read as another path is refused before any decision reads it (docs/src/limits.md, "Paths").

use crate::error::RouterError;

/// Refuses a path with a segment that is `.` or `..` (percent-encoded or not, or followed by
/// `;` parameters), an empty segment inside it (`//`), an encoded `/`, `\` or `.` (`%2f`, `%5c`,
/// `%2e`, in any case), or a `\`: readers resolve these differently (nginx merges slashes and
/// resolves dot segments, Envoy can, most frameworks decode before they route), so a path rule
/// that matched what the router saw could be skipped for what the backend sees. A trailing `/`
/// is fine.
pub(super) fn check(path: &str) -> Result<(), RouterError> {
    let bytes = path.as_bytes();
    // The usual path (`/mcp`) has none of `.`, `%`, `\` or a second `/` in a row: one pass
    // over a few bytes decides it.
    let mut previous = 0;
    let plain = bytes.iter().all(|&b| {
        let doubled = b == b'/' && previous == b'/';
        previous = b;
        !doubled && !matches!(b, b'.' | b'%' | b'\\')
    });
    if plain {
        return Ok(());
    }
    let mut segments = bytes.split(|&b| b == b'/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if segment.is_empty() && !last {
            return Err(RouterError::InvalidPath);
        }
        let before_params = segment.split(|&b| b == b';').next().unwrap_or(segment);
        if matches!(before_params, b"." | b"..") {
            return Err(RouterError::InvalidPath);
        }
        for (i, &b) in segment.iter().enumerate() {
            let encoded = |hex: &[u8; 2]| segment.get(i + 1..i + 3).is_some_and(|h| h.eq_ignore_ascii_case(hex));
            if b == b'\\' || (b == b'%' && (encoded(b"2e") || encoded(b"2f") || encoded(b"5c"))) {
                return Err(RouterError::InvalidPath);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn paths_that_read_two_ways_are_refused() {
        for ok in [
            "/mcp",
            "/mcp/",
            "/",
            "*",
            "/health/live",
            "/.well-known/oauth-protected-resource/mcp",
            "/files/a.b",
            "/files/...",
            "/a%20b",
        ] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in [
            "/health/../mcp",
            "/health/./mcp",
            "/health/..",
            "/health/%2e%2e/mcp",
            "/health/%2E./mcp",
            "/health/..%2fmcp",
            "/health/..%2Fmcp",
            "/health/..%5cmcp",
            "/health\\..\\mcp",
            "//mcp",
            "/health//mcp",
            "/health/..;/mcp",
            "/health/.;x/mcp",
            "/a%2eb",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
    }
}
