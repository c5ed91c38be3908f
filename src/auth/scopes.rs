//! The scopes an access token grants, and which of an operation's required scopes they lack
//! (docs/src/authorization.md, "Scopes and step-up").
//!
//! A scope is RFC 6749 §3.3's scope-token: one or more printable ASCII characters other than
//! space, `"` and `\` (`%x21 / %x23-5B / %x5D-7E`).
//!
//! Hierarchy (the MCP authorization specification: "a broader scope implies narrower ones"):
//! the scopes form a tree by `:`. A granted scope `a` satisfies a required scope `r` when
//! `r == a` or `r` starts with `a:`, so `files` implies `files:write` and `files:write:all`,
//! `mcp:tools` implies `mcp:tools:call`; `files` does not imply `filesystem` (the prefix ends
//! at a colon), and a narrower scope never implies a broader one (`files:write` does not grant
//! `files`). Comparisons are exact and case-sensitive.

use std::fmt;

/// Whether `s` is one scope, as RFC 6749 writes one (its scope-token).
pub fn is_valid_scope(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| matches!(b, 0x21 | 0x23..=0x5B | 0x5D..=0x7E))
}

/// A text that is not a scope (the first such, in a list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidScope(pub String);

impl fmt::Display for InvalidScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a scope token (printable ASCII without space, '\"' or '\\')",
            self.0
        )
    }
}

impl std::error::Error for InvalidScope {}

/// A set of granted scopes: sorted, without duplicates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scopes {
    granted: Vec<Box<str>>,
}

impl Scopes {
    /// The scopes of a space-delimited `scope` value (RFC 6749 §3.3; runs of spaces are taken
    /// as one, as some issuers write them).
    pub fn parse(text: &str) -> Result<Scopes, InvalidScope> {
        Scopes::from_values(text.split(' ').filter(|s| !s.is_empty()))
    }

    /// The scopes of a list (an `scp` array); each must be one scope.
    pub fn from_values<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<Scopes, InvalidScope> {
        let mut granted = Vec::new();
        for scope in values {
            if !is_valid_scope(scope) {
                return Err(InvalidScope(scope.to_owned()));
            }
            granted.push(Box::from(scope));
        }
        granted.sort_unstable();
        granted.dedup();
        Ok(Scopes { granted })
    }

    /// Whether a granted scope is `required` or broader than it (see the module doc).
    pub fn satisfies(&self, required: &str) -> bool {
        // Every scope that can imply `required` is a prefix of it ending where a `:` starts
        // (or `required` whole): at most one binary search per colon.
        let implied_by = |prefix: &str| self.granted.binary_search_by(|g| (**g).cmp(prefix)).is_ok();
        implied_by(required)
            || required
                .match_indices(':')
                .any(|(at, _)| at > 0 && implied_by(&required[..at]))
    }

    /// The scopes of `required` that the granted ones do not satisfy, in `required`'s order,
    /// each once: what an `insufficient_scope` challenge names.
    pub fn missing(&self, required: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in required {
            if !self.satisfies(r) && !out.contains(r) {
                out.push(r.clone());
            }
        }
        out
    }

    /// The granted scopes, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.granted.iter().map(|s| &**s)
    }

    pub fn len(&self) -> usize {
        self.granted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.granted.is_empty()
    }
}

impl fmt::Display for Scopes {
    /// Space-delimited, as a `scope` value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, s) in self.iter().enumerate() {
            if n > 0 {
                f.write_str(" ")?;
            }
            f.write_str(s)?;
        }
        Ok(())
    }
}
