//! `[tokens]`: the keys that seal routing tokens (DESIGN §5), checked and built once here.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::reader::{quoted, Section};
use super::{defaults, ConfigError};
use crate::token::TokenKeys;

#[derive(Clone)]
pub struct TokensConfig {
    /// The keys' bytes (the first signs, all verify): compared, never printed.
    pub(crate) keys: Vec<Vec<u8>>,
    pub token_ttl: Duration,
    /// Lifetime of wrapped `Mcp-Session-Id` values.
    pub session_ttl: Duration,
    /// The keys, ready to seal routing tokens and `requestState`s (`token_ttl`).
    pub calls: Arc<TokenKeys>,
    /// The same keys for wrapped session ids (`session_ttl`).
    pub sessions: Arc<TokenKeys>,
}

impl PartialEq for TokensConfig {
    fn eq(&self, other: &Self) -> bool {
        (&self.keys, self.token_ttl, self.session_ttl) == (&other.keys, other.token_ttl, other.session_ttl)
    }
}

impl fmt::Debug for TokensConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TokensConfig {{ keys: <{} redacted>, token_ttl: {:?} }}",
            self.keys.len(),
            self.token_ttl
        )
    }
}

impl TokensConfig {
    /// How many keys there are (the values are never shown).
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

pub(super) fn tokens(mut s: Section) -> Result<Option<TokensConfig>, ConfigError> {
    if !s.present() {
        return s.finish(false).map(|()| None);
    }
    let Some((texts, list_span)) = s.strings("keys")? else {
        return s.err(s.span(), "tokens.keys: at least one key is required");
    };
    let mut keys = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let value = expand_env(text.value).or_else(|e| s.err(text.span.clone(), format!("tokens.keys[{i}]: {e}")))?;
        keys.push(value.into_bytes());
    }
    let hidden = vec![quoted("<redacted>"); keys.len()].join(", ");
    s.print("keys", format!("[{hidden}]   # values hidden"));
    let token_ttl = s.duration("token_ttl", defaults::TOKEN_TTL)?;
    let session_ttl = s.duration("session_ttl", defaults::SESSION_TOKEN_TTL)?;
    let calls = TokenKeys::build(&keys, token_ttl).or_else(|p| {
        let span = p.index.and_then(|i| texts[i].span.clone()).or(Some(list_span.clone()));
        s.err(span, p.message)
    })?;
    let sessions = calls
        .with_ttl(session_ttl)
        .or_else(|e| s.err(Some(list_span.clone()), e.replace("token_ttl", "session_ttl")))?;
    s.finish(false)?;
    Ok(Some(TokensConfig {
        keys,
        token_ttl,
        session_ttl,
        calls: Arc::new(calls),
        sessions: Arc::new(sessions),
    }))
}

/// Replaces `${NAME}` with the environment variable NAME (which must be set).
pub(super) fn expand_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start + 2..].find('}') else {
            return Err("unterminated ${".into());
        };
        let name = &rest[start + 2..start + 2 + len];
        out.push_str(&std::env::var(name).map_err(|_| format!("environment variable {name} is not set"))?);
        rest = &rest[start + 3 + len..];
    }
    out.push_str(rest);
    Ok(out)
}
