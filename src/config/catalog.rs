//! `[catalog]`: the router learns the fleet's tools (docs/src/catalog.md); off by default.

use std::path::PathBuf;
use std::time::Duration;

use super::lock::Lock;
use super::reader::{key, quoted, Section};
use super::reference::Kind;
use super::{defaults, ConfigError};

#[derive(Debug, Clone, PartialEq)]
pub struct CatalogConfig {
    /// How often each backend is asked (at least a second).
    pub interval: Duration,
    /// One ask's whole time.
    pub timeout: Duration,
    /// Tools one backend may list, and bytes its answers may take, before its catalog is
    /// refused (its last good one is kept).
    pub max_tools: usize,
    pub max_bytes: usize,
    /// The MCP endpoint's path on the backends (asked with `tools/list`).
    pub path: String,
    /// New calls go only to the backends that expose their tool, prompt or resource.
    pub route_by_tool: bool,
    /// A `tools/list` answer is cut to the tools the caller's scopes reach (`[auth]` with
    /// `[[auth.tool]]` scopes).
    pub filter_list_by_scope: bool,
    /// The approved definitions (`mrtr-router catalog lock`): a call of a tool whose served
    /// definition differs is refused.
    pub lock: Option<LockFile>,
}

/// The lock file and what it held when the config was read.
#[derive(Debug, Clone, PartialEq)]
pub struct LockFile {
    pub path: PathBuf,
    pub lock: Lock,
    /// The file did not exist: nothing is approved yet (`mrtr-router catalog lock` writes it).
    pub missing: bool,
}

/// `None` unless `enabled = true`; the other keys are checked either way.
pub(super) fn catalog(mut s: Section, auth_scopes_tools: bool) -> Result<Option<CatalogConfig>, ConfigError> {
    let enabled = key(
        "enabled",
        "Learn each backend's tools (asked as an MCP client would) and use them: routing by tool, drift \
         detection, the lock.",
    );
    let interval = key(
        "interval",
        "How often each backend is asked for its tools (at least 1s).",
    );
    let timeout = key("timeout", "One ask's whole time, every page of `tools/list` included.");
    let max_tools = key(
        "max_tools",
        "Tools one backend may list; past it, its catalog is refused (the last good one stays).",
    );
    let max_bytes = key(
        "max_bytes",
        "Bytes one ask's answers may take, as `N`, `NKiB` or `NMiB`; past it, its catalog is refused.",
    );
    let path = key("path", "The MCP endpoint's path on the backends.");
    let route_by_tool = key(
        "route_by_tool",
        "A new `tools/call` goes by consistent hash over the backends that expose its tool (among \
         those whose `inputSchema` accepts its arguments, when they differ), a `prompts/get` or \
         `resources/read` over those that list its prompt or resource; one no backend is known to \
         expose is routed as any call.",
    );
    let filter = key(
        "filter_list_by_scope",
        "Drop from each `tools/list` answer the tools whose `[[auth.tool]]` scopes the caller's access token \
         lacks (needs `[auth]` with `[[auth.tool]]` scopes). Off, every caller sees every tool and a call \
         past its scopes is refused 403 with the scope to ask for (step-up).",
    );
    let lock = key(
        "lock",
        "A lock file of approved definitions (`mrtr-router catalog lock`): a call of a tool whose served \
         definition differs from it is refused 409 `tool_definition_changed`.",
    )
    .unset("no lock: every definition is served")
    .example("tools.lock");
    let on = s.bool(enabled, false)?;
    let interval = s.duration_at_least(interval, defaults::CATALOG_INTERVAL, Duration::from_secs(1))?;
    let timeout = s.duration(timeout, defaults::CATALOG_TIMEOUT)?;
    let max_tools = s.int(max_tools, defaults::CATALOG_MAX_TOOLS as i64, 1..=1_000_000)? as usize;
    let size = s.text_or(max_bytes, Kind::String, defaults::CATALOG_MAX_BYTES)?;
    let max_bytes = parse_size(size.value).or_else(|e| s.err(size.span.clone(), format!("catalog.max_bytes: {e}")))?;
    s.print("max_bytes", quoted(size.value));
    let (path, span) = s.string(path, defaults::CATALOG_PATH)?;
    if !path.starts_with('/') {
        return s.err(span, "catalog.path: must start with /");
    }
    let route_by_tool = s.bool(route_by_tool, true)?;
    let filter_list_by_scope = s.bool(filter, false)?;
    if filter_list_by_scope && !auth_scopes_tools {
        let span = s.span();
        return s.err(
            span,
            "catalog.filter_list_by_scope needs [auth] with [[auth.tool]] scopes to filter by",
        );
    }
    let lock = match s.text(lock, Kind::Path)? {
        Some(text) => {
            s.print("lock", quoted(text.value.trim()));
            let path = s.doc().resolve(text.value);
            match read_lock(&path) {
                Ok((lock, missing)) => Some(LockFile { path, lock, missing }),
                Err(why) => return s.err(text.span.clone(), format!("catalog.lock: {}: {why}", path.display())),
            }
        }
        None => None,
    };
    s.finish(false)?;
    Ok(on.then_some(CatalogConfig {
        interval,
        timeout,
        max_tools,
        max_bytes,
        path,
        route_by_tool,
        filter_list_by_scope,
        lock,
    }))
}

/// The lock file's approved definitions; a file that does not exist approves nothing (and
/// says so: `true`).
fn read_lock(path: &std::path::Path) -> Result<(Lock, bool), String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Lock::parse(&text).map(|l| (l, false)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Lock::default(), true)),
        Err(e) => Err(e.to_string()),
    }
}

/// `N`, `NKiB`, `NMiB` or `NGiB` bytes.
fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (`4194304`, `4MiB`)"))?;
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("{other:?} is not a unit: B, KiB, MiB or GiB")),
    };
    n.checked_mul(scale)
        .filter(|&n| n >= 1024)
        .ok_or_else(|| format!("{text:?}: at least 1KiB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("4194304"), Ok(4 << 20));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
        assert!(parse_size("4MB").is_err());
        assert!(parse_size("10").is_err());
        assert!(parse_size("").is_err());
    }
}
