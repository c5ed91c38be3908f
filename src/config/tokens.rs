//! `[tokens]`: the keys that seal routing tokens (docs/src/tokens.md), checked and built once here.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::reader::{key, quoted, Section};
use super::{defaults, ConfigError};
use crate::token::SealingKeys;

#[derive(Clone)]
pub struct TokensConfig {
    /// The keys' bytes (the first signs, all verify): compared, never printed.
    pub(crate) keys: Vec<Vec<u8>>,
    pub token_ttl: Duration,
    /// Lifetime of wrapped `Mcp-Session-Id` values.
    pub session_ttl: Duration,
    /// The keys, ready to seal routing tokens and `requestState`s (`token_ttl`).
    pub calls: Arc<SealingKeys>,
    /// The same keys for wrapped session ids (`session_ttl`).
    pub sessions: Arc<SealingKeys>,
    /// With `[auth]` on too, handles of the kinds the router seals are still taken in the clear
    /// (while a fleet switches `[tokens]` on; docs/src/authorization.md).
    pub accept_clear_handles: bool,
}

impl PartialEq for TokensConfig {
    fn eq(&self, other: &Self) -> bool {
        (&self.keys, self.token_ttl, self.session_ttl, self.accept_clear_handles)
            == (
                &other.keys,
                other.token_ttl,
                other.session_ttl,
                other.accept_clear_handles,
            )
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
    let keys = key(
        "keys",
        "The keys that seal routing tokens, each at least 32 bytes: the first seals, all open (rotate \
         by putting a new one first); never printed.",
    )
    .example("${MRTR_TOKEN_KEY}");
    let token_ttl = key(
        "token_ttl",
        "Lifetime of routing tokens and sealed `requestState` values.",
    );
    let session_ttl = key(
        "session_ttl",
        "Lifetime of wrapped `Mcp-Session-Id` values (clients keep them for the whole session).",
    );
    let accept_clear = key(
        "accept_clear_handles",
        "With `[auth]` on too: still take a `requestState`, task id or `Mcp-Session-Id` the router did \
         not seal (issued before `[tokens]` was on), bound to no caller. Only while a fleet switches \
         `[tokens]` on: a caller could then present another's handle.",
    );
    let (secrets, list_span) = s.required_secrets(keys)?;
    let keys: Vec<Vec<u8>> = secrets.iter().map(|k| k.value.clone().into_bytes()).collect();
    let hidden = vec![quoted("<redacted>"); keys.len()].join(", ");
    s.print("keys", format!("[{hidden}]   # values hidden"));
    let token_ttl = s.duration(token_ttl, defaults::TOKEN_TTL)?;
    let session_ttl = s.duration(session_ttl, defaults::SESSION_TOKEN_TTL)?;
    let accept_clear_handles = s.bool(accept_clear, defaults::ACCEPT_CLEAR_HANDLES)?;
    let calls = SealingKeys::build(&keys, token_ttl).or_else(|p| {
        let span = p.index.and_then(|i| secrets[i].span.clone()).or(list_span.clone());
        s.err(span, p.message)
    })?;
    let sessions = calls
        .with_ttl(session_ttl)
        .or_else(|e| s.err(list_span.clone(), e.replace("token_ttl", "session_ttl")))?;
    s.finish(false)?;
    Ok(Some(TokensConfig {
        keys,
        token_ttl,
        session_ttl,
        calls: Arc::new(calls),
        sessions: Arc::new(sessions),
        accept_clear_handles,
    }))
}
