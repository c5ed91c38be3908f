//! Sealed routing tokens (docs/src/tokens.md): the backend a follow-up belongs to, written into what the
//! client echoes, encrypted and authenticated with ChaCha20-Poly1305 (ring), so any replica with
//! the same keys routes it without a shared store and a token reveals nothing about the fleet.
//!
//! Two forms, both visible ASCII (a valid header value, and valid in a JSON string unescaped):
//!
//! ```text
//! token   = "mrt2." B64(body)                 ; Mcp-Routing-Id header           (SealingKeys::seal)
//! wrapped = "mrt2." B64(body) "." value-seg   ; requestState, session, task id  (SealingKeys::seal_value)
//!
//! body      = key_id u32 | flags u8 | nonce [12] | sealed          (big-endian)
//! sealed    = ChaCha20-Poly1305(aead_key, nonce, plaintext, aad)   (ciphertext, then the 16-byte tag)
//! plaintext = issued_ms u64 | ttl_s u32 | rounds u32 | [principal [16]] | [call [16]] | backend (rest)
//! aad       = "mrt2" | kind u8 | key_id u32 | flags u8 | value
//! flags     = bit 0: wrapped, bit 1: value-seg is B64(value) (else the value itself),
//!             bit 2: the plaintext holds a principal, bit 3: it holds a call,
//!             bit 4: that call is known by its routing id (else by its messageId, or its tool);
//!             others 0
//! ```
//!
//! `B64` is URL-safe base64 without padding; `"mrt2"` is the format version. `aead_key` is
//! HKDF-SHA-256 of the configured key (salt `"mrtr-token-v2"`); `key_id` is derived from the key
//! ([`key_id`]), so a token verifies wherever its key sits in the list; the nonce is random per
//! token. The `kind` ([`Kind`]) of handle a token seals is in the authenticated data only: a
//! token minted for one kind fails as another. So does the wrapped value: a token cannot be
//! moved onto another value, and any changed byte is detected. `principal`, when `[auth]` is on, is the [`PrincipalTag`] of the
//! caller the handle was issued to (docs/src/authorization.md, "Handles bound to their principal"):
//! another caller presenting it is refused. `rounds` is the call's round
//! count, so `max_rounds` holds across replicas. A value made only of visible ASCII other than
//! `"` and `\` (hex session ids, base64 states) is carried as is and unwraps without a copy;
//! any other value is carried as `B64(value)`.
//!
//! Tokens of the previous format (`mrt1.`, [`v1`]) are still accepted for their lifetime
//! during a rolling upgrade of the routers, never issued. [`is_token`] is the cheap test for
//! "one of ours"; anything else passes untouched.
//!
//! This file is the format: its constants and types, the checks of a list of keys, and the
//! token's text, which both formats write alike. The keys that seal and open are
//! `sealing_keys`; the previous format, `v1`.

mod sealing_keys;
mod v1;

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

pub use sealing_keys::SealingKeys;
pub use v1::SealingKeys as LegacySealingKeys;

/// Text every token and wrapped value of this format starts with.
pub const PREFIX: &str = "mrt2.";
/// Shortest key accepted.
pub const MIN_KEY_LEN: usize = 32;
/// Longest base64 body accepted (the wrapped value after it is not counted).
pub const MAX_BODY_CHARS: usize = 4 * 1024;

const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// key_id, flags, nonce.
const HEAD: usize = 4 + 1 + NONCE_LEN;
/// issued_ms, ttl, rounds.
const FIXED: usize = 8 + 4 + 4;
const FLAG_WRAPPED: u8 = 1;
const FLAG_BASE64: u8 = 2;
const FLAG_PRINCIPAL: u8 = 4;
const FLAG_CALL: u8 = 8;
const FLAG_CALL_BY_ROUTING_ID: u8 = 16;
/// Flags that say what the plaintext holds beyond its fixed part, not how the value is carried.
const FLAGS_BOUND: u8 = FLAG_PRINCIPAL | FLAG_CALL | FLAG_CALL_BY_ROUTING_ID;
const PRINCIPAL_LEN: usize = 16;
const CALL_LEN: usize = 16;

/// The call a handle continues: a digest of the call's key (its `messageId`, or routing id,
/// for a routing token; its method and tool for a `requestState`), so that a handle proves a
/// follow-up of that call only, never of another request that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTag {
    pub digest: u128,
    /// The call is known by the routing id it was started with (it had no `messageId`).
    pub by_routing_id: bool,
}

/// Who a handle was issued to: the first 16 bytes of the caller's principal digest (issuer and
/// subject; never the token, which step-up and refresh replace).
pub type PrincipalTag = [u8; PRINCIPAL_LEN];
/// Bodies up to this size are built and decoded on the stack.
const STACK_BODY: usize = 256;

/// The kind of handle a token seals; part of what is authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// The `Mcp-Routing-Id` answer header of a pinned call.
    RoutingId = 1,
    /// A `requestState` in an `input_required` result.
    RequestState = 2,
    /// An `Mcp-Session-Id`.
    Session = 3,
    /// A task id.
    Task = 4,
}

/// Does `s` look like one of our tokens or wrapped values (this format or the previous one)? A
/// prefix check only: values that do not pass it are not ours and are forwarded untouched;
/// values that do must verify.
pub fn is_token(s: &str) -> bool {
    s.starts_with(PREFIX) || s.starts_with(v1::PREFIX)
}

/// The key id a token made with `key` carries: the first 4 bytes of
/// SHA-256(`"mrtr-token-key-id\0"` | key), big-endian. Safe to log.
pub fn key_id(key: &[u8]) -> u32 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(b"mrtr-token-key-id\0");
    ctx.update(key);
    let digest = ctx.finish();
    let digest = digest.as_ref();
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

/// What an authentic, unexpired token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The backend the token names (not necessarily still configured: the caller checks).
    pub backend: String,
    /// Id of the key that made it ([`key_id`]).
    pub key_id: u32,
    /// Milliseconds since the UNIX epoch (a token of the previous format: the start of the
    /// second it was issued in).
    pub issued_ms: u64,
    /// Seconds since the UNIX epoch; valid through this second.
    pub expires: u64,
    /// The call's rounds so far; `None` in a token of the previous format, which had no count.
    pub rounds: Option<u32>,
    /// The caller it was issued to, when `[auth]` was on.
    pub principal: Option<PrincipalTag>,
    /// The call it belongs to (a routing token, a `requestState`; none in tokens made before
    /// handles named their call).
    pub call: Option<CallTag>,
}

/// Why a token was refused. Never chooses a backend; the router answers 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Rejected {
    /// Wrong prefix or version, bad base64, wrong lengths or flags, a plain token where a
    /// wrapped value was expected or the reverse.
    #[error("malformed routing token")]
    Malformed,
    /// Made with a key that is not configured (or a forged key id).
    #[error("routing token signed with an unknown key")]
    UnknownKey,
    /// It does not authenticate: some byte was changed, or it was made for another kind of handle.
    #[error("routing token signature does not match")]
    BadSignature,
    /// Authentic but past its expiry.
    #[error("routing token expired")]
    Expired,
}

impl Rejected {
    /// Every variant, e.g. to initialise metric labels.
    pub const ALL: [Rejected; 4] = [
        Rejected::Malformed,
        Rejected::UnknownKey,
        Rejected::BadSignature,
        Rejected::Expired,
    ];

    /// The `reason` label of `mrtr_tokens_rejected_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Rejected::Malformed => "malformed",
            Rejected::UnknownKey => "unknown_key",
            Rejected::BadSignature => "bad_signature",
            Rejected::Expired => "expired",
        }
    }
}

/// Why a list of keys cannot seal: the message names the setting, `index` the key (if one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyProblem {
    /// Which of `tokens.keys` is at fault; `None` for the list or the ttl.
    pub index: Option<usize>,
    pub message: String,
}

/// Every check of token keys: at least one, each at least [`MIN_KEY_LEN`] bytes, no two with
/// one key id. Returns the key ids.
fn check_keys(keys: &[Vec<u8>]) -> Result<Vec<u32>, KeyProblem> {
    let problem = |index, message: String| KeyProblem { index, message };
    if keys.is_empty() {
        return Err(problem(None, "tokens.keys: at least one key is required".into()));
    }
    let mut ids: Vec<u32> = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        if key.len() < MIN_KEY_LEN {
            let message = format!(
                "tokens.keys[{i}]: must be at least {MIN_KEY_LEN} bytes (got {})",
                key.len()
            );
            return Err(problem(Some(i), message));
        }
        let id = key_id(key);
        if let Some(j) = ids.iter().position(|k| *k == id) {
            let message = if keys[j] == *key {
                format!("tokens.keys[{i}]: same key as tokens.keys[{j}]")
            } else {
                format!("tokens.keys[{i}]: key id collides with tokens.keys[{j}]; generate another key")
            };
            return Err(problem(Some(i), message));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// A token lifetime in whole seconds: at least one, at most `u32::MAX`.
fn ttl_secs(ttl: Duration) -> Result<u32, String> {
    if ttl.as_secs() == 0 {
        return Err("tokens.token_ttl: must be at least 1s".into());
    }
    u32::try_from(ttl.as_secs()).map_err(|_| format!("tokens.token_ttl: must be at most {}s", u32::MAX))
}

/// `prefix body ["." value]` → `(body, value)`, the body at most `max_body` characters.
fn split<'t>(token: &'t str, prefix: &str, max_body: usize) -> Result<(&'t str, Option<&'t str>), Rejected> {
    let rest = token.strip_prefix(prefix).ok_or(Rejected::Malformed)?;
    let (body, value) = match memchr::memchr(b'.', rest.as_bytes()) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    if body.len() > max_body {
        return Err(Rejected::Malformed);
    }
    Ok((body, value))
}

/// Decodes a base64 body (on the stack when small) and hands it to `f`.
fn with_body<R>(text: &str, f: impl FnOnce(&[u8]) -> Result<R, Rejected>) -> Result<R, Rejected> {
    let estimate = base64::decoded_len_estimate(text.len());
    let mut stack = [0u8; STACK_BODY];
    let mut heap = Vec::new();
    let buf: &mut [u8] = if estimate <= STACK_BODY {
        &mut stack[..estimate]
    } else {
        heap.resize(estimate, 0);
        &mut heap
    };
    let n = URL_SAFE_NO_PAD
        .decode_slice(text, buf)
        .map_err(|_| Rejected::Malformed)?;
    f(&buf[..n])
}

/// Values carried as is: visible ASCII that needs no escaping in a JSON string.
fn carried_as_is(value: &str) -> bool {
    value
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\')
}

/// A token's text: `prefix`, the body in base64, and the wrapped value, if any, after a `.`
/// (as it is when `raw`, else in base64). Both formats write it alike.
fn text(prefix: &str, body: &[u8], value: Option<&str>, raw: bool) -> String {
    let value_len = match value {
        None => 0,
        Some(v) if raw => 1 + v.len(),
        Some(v) => 1 + b64_len(v.len()),
    };
    let mut out = String::with_capacity(prefix.len() + b64_len(body.len()) + value_len);
    out.push_str(prefix);
    URL_SAFE_NO_PAD.encode_string(body, &mut out);
    if let Some(v) = value {
        out.push('.');
        if raw {
            out.push_str(v);
        } else {
            URL_SAFE_NO_PAD.encode_string(v, &mut out);
        }
    }
    out
}

fn b64_len(n: usize) -> usize {
    n.div_ceil(3) * 4
}

#[cfg(test)]
mod tests;
