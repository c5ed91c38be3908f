//! The previous token format, `mrt1.` (HMAC-SHA-256, the backend name readable, not bound to a
//! kind of handle), kept so that a rolling upgrade of the routers loses no call: a router
//! accepts the `mrt1.` tokens the previous release issued for the rest of their lifetime
//! (at most `token_ttl`, or `session_ttl` for sessions) and never issues one. Issuing stays for
//! the tests of that upgrade.
//!
//! ```text
//! token   = "mrt1." B64(body)                 ; Mcp-Routing-Id header
//! wrapped = "mrt1." B64(body) "." value-seg   ; requestState, Mcp-Session-Id
//!
//! body    = key_id u32 | flags u8 | issued u64 | ttl u32 | backend (rest) | mac [32]   (big-endian)
//! flags   = bit 0: wrapped, bit 1: value-seg is B64(value) (else the value itself); others 0
//! mac     = HMAC-SHA-256(key, "mrt1." | key_id | flags | issued | ttl
//!                             | len(backend) u64 | backend | value)
//! ```

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::hmac;

use super::{carried_as_is, split, text, with_body, Rejected, STACK_BODY};

/// Text every token and wrapped value starts with: format version 1.
pub const PREFIX: &str = "mrt1.";
/// Longest base64 body accepted (the wrapped value after it is not counted).
pub const MAX_BODY_CHARS: usize = 64 * 1024;

const FIXED: usize = 4 + 1 + 8 + 4;
const MAC_LEN: usize = 32;
const FLAG_WRAPPED: u8 = 1;
const FLAG_BASE64: u8 = 2;
const FLAG_WRAPPED_BASE64: u8 = FLAG_WRAPPED | FLAG_BASE64;

/// The keys (the first signs, all verify) and the lifetime of the tokens they issue.
#[derive(Clone)]
pub struct SealingKeys {
    keys: Vec<Key>,
    ttl_secs: u32,
}

#[derive(Clone)]
struct Key {
    id: u32,
    /// HMAC-SHA-256 under the configured key.
    mac: hmac::Key,
}

/// What an authentic, unexpired token of this format says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The backend the token names (not necessarily still configured: the caller checks).
    pub backend: String,
    /// Id of the key that signed it ([`key_id`]).
    pub key_id: u32,
    /// Seconds since the UNIX epoch.
    pub issued: u64,
    /// Seconds since the UNIX epoch; valid through this second.
    pub expires: u64,
}

impl Claims {
    /// The claims in today's terms: issued at the start of its second, no round count.
    pub fn upgrade(self) -> super::Claims {
        super::Claims {
            backend: self.backend,
            key_id: self.key_id,
            issued_ms: self.issued.saturating_mul(1000),
            expires: self.expires,
            rounds: None,
            principal: None,
            call: None,
        }
    }
}

impl fmt::Debug for SealingKeys {
    /// Key ids and ttl only, never key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<String> = self.keys.iter().map(|k| format!("{:08x}", k.id)).collect();
        f.debug_struct("SealingKeys")
            .field("key_ids", &ids)
            .field("ttl_secs", &self.ttl_secs)
            .finish()
    }
}

impl SealingKeys {
    /// Keys in config order (the first signs) and the lifetime of new tokens: for the tests of
    /// a rolling upgrade, which need tokens of the previous release.
    pub fn new(keys: Vec<Vec<u8>>, ttl: std::time::Duration) -> Result<SealingKeys, String> {
        let ids = super::check_keys(&keys).map_err(|p| p.message)?;
        Ok(SealingKeys::from_checked(&keys, &ids, super::ttl_secs(ttl)?))
    }

    /// Keys [`super::check_keys`] accepted, with their ids.
    pub fn from_checked(keys: &[Vec<u8>], ids: &[u32], ttl_secs: u32) -> SealingKeys {
        let keys = keys
            .iter()
            .zip(ids)
            .map(|(key, &id)| Key {
                id,
                mac: hmac::Key::new(hmac::HMAC_SHA256, key),
            })
            .collect();
        SealingKeys { keys, ttl_secs }
    }

    /// Lifetime of the tokens this issues.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs.into())
    }

    /// Token for a routing header: names the backend.
    pub fn seal(&self, backend: &str, now: SystemTime) -> String {
        self.issue(backend, None, now)
    }

    /// Wraps a value the client echoes (a requestState or an Mcp-Session-Id) so that it also
    /// names the backend. Any string round-trips byte for byte through [`SealingKeys::open_value`],
    /// the empty one included; the MAC covers the value too, so the token cannot be moved onto
    /// another value and any changed byte is detected.
    pub fn seal_value(&self, value: &str, backend: &str, now: SystemTime) -> String {
        self.issue(backend, Some(value), now)
    }

    /// Checks a token from [`SealingKeys::seal`].
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Claims, Rejected> {
        let (body, value) = split(token, PREFIX, MAX_BODY_CHARS)?;
        if value.is_some() {
            return Err(Rejected::Malformed);
        }
        with_body(body, |body| {
            let parsed = Parsed::new(body)?;
            if parsed.flags != 0 {
                return Err(Rejected::Malformed);
            }
            let key = self.key(parsed.key_id)?;
            self.check(key, &parsed, b"", now)
        })
    }

    /// Checks a value from [`SealingKeys::seal_value`] and returns the original value and the claims.
    /// The value is borrowed from `wrapped` when it was carried as is.
    pub fn open_value<'a>(&self, wrapped: &'a str, now: SystemTime) -> Result<(Cow<'a, str>, Claims), Rejected> {
        let (body, value) = split(wrapped, PREFIX, MAX_BODY_CHARS)?;
        let value = value.ok_or(Rejected::Malformed)?;
        with_body(body, |body| {
            let parsed = Parsed::new(body)?;
            let key = self.key(parsed.key_id)?;
            let value: Cow<'a, str> = match parsed.flags {
                FLAG_WRAPPED => Cow::Borrowed(value),
                FLAG_WRAPPED_BASE64 => {
                    let bytes = URL_SAFE_NO_PAD.decode(value).map_err(|_| Rejected::Malformed)?;
                    Cow::Owned(String::from_utf8(bytes).map_err(|_| Rejected::Malformed)?)
                }
                _ => return Err(Rejected::Malformed),
            };
            let claims = self.check(key, &parsed, value.as_bytes(), now)?;
            Ok((value, claims))
        })
    }

    fn issue(&self, backend: &str, value: Option<&str>, now: SystemTime) -> String {
        let key = &self.keys[0];
        let raw = value.is_none_or(carried_as_is);
        let flags = match value {
            None => 0,
            Some(_) if raw => FLAG_WRAPPED,
            Some(_) => FLAG_WRAPPED_BASE64,
        };
        let head_len = FIXED + backend.len();
        let len = head_len + MAC_LEN;
        let mut stack = [0u8; STACK_BODY];
        let mut heap = Vec::new();
        let body: &mut [u8] = if len <= STACK_BODY {
            &mut stack[..len]
        } else {
            heap.resize(len, 0);
            &mut heap
        };
        body[0..4].copy_from_slice(&key.id.to_be_bytes());
        body[4] = flags;
        body[5..13].copy_from_slice(&unix_secs(now).to_be_bytes());
        body[13..17].copy_from_slice(&self.ttl_secs.to_be_bytes());
        body[FIXED..head_len].copy_from_slice(backend.as_bytes());
        let tag = hmac::sign(&key.mac, &signed(&body[..head_len], value.unwrap_or("").as_bytes()));
        body[head_len..].copy_from_slice(tag.as_ref());

        text(PREFIX, body, value, raw)
    }

    fn key(&self, id: u32) -> Result<&Key, Rejected> {
        self.keys.iter().find(|k| k.id == id).ok_or(Rejected::UnknownKey)
    }

    /// MAC (constant time), then backend name, then expiry.
    fn check(&self, key: &Key, parsed: &Parsed<'_>, value: &[u8], now: SystemTime) -> Result<Claims, Rejected> {
        hmac::verify(&key.mac, &signed(parsed.head, value), parsed.mac).map_err(|_| Rejected::BadSignature)?;
        let backend = std::str::from_utf8(&parsed.head[FIXED..]).map_err(|_| Rejected::Malformed)?;
        let expires = parsed.issued.saturating_add(parsed.ttl.into());
        if unix_secs(now) > expires {
            return Err(Rejected::Expired);
        }
        Ok(Claims {
            backend: backend.to_owned(),
            key_id: key.id,
            issued: parsed.issued,
            expires,
        })
    }
}

/// A decoded body; nothing in it is trusted before [`SealingKeys::check`].
struct Parsed<'b> {
    key_id: u32,
    flags: u8,
    issued: u64,
    ttl: u32,
    /// Everything the MAC covers from the body: fixed fields and backend.
    head: &'b [u8],
    mac: &'b [u8],
}

impl<'b> Parsed<'b> {
    fn new(body: &'b [u8]) -> Result<Parsed<'b>, Rejected> {
        if body.len() < FIXED + MAC_LEN {
            return Err(Rejected::Malformed);
        }
        let (head, mac) = body.split_at(body.len() - MAC_LEN);
        let be4 = |at: usize| [head[at], head[at + 1], head[at + 2], head[at + 3]];
        let mut issued = [0u8; 8];
        issued.copy_from_slice(&head[5..13]);
        Ok(Parsed {
            key_id: u32::from_be_bytes(be4(0)),
            flags: head[4],
            issued: u64::from_be_bytes(issued),
            ttl: u32::from_be_bytes(be4(13)),
            head,
            mac,
        })
    }
}

/// What the MAC covers: the prefix, a body's head (its fixed fields, then the backend's length
/// and name) and the wrapped value.
fn signed(head: &[u8], value: &[u8]) -> Vec<u8> {
    let mut input = Vec::with_capacity(PREFIX.len() + head.len() + 8 + value.len());
    input.extend_from_slice(PREFIX.as_bytes());
    input.extend_from_slice(&head[..FIXED]);
    input.extend_from_slice(&((head.len() - FIXED) as u64).to_be_bytes());
    input.extend_from_slice(&head[FIXED..]);
    input.extend_from_slice(value);
    input
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::{is_token, key_id};

    const TTL: Duration = Duration::from_secs(3600);

    fn key(b: u8) -> Vec<u8> {
        vec![b; 32]
    }

    fn keys(list: &[u8]) -> SealingKeys {
        SealingKeys::new(list.iter().map(|&b| key(b)).collect(), TTL).unwrap()
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    const NOW: u64 = 1_750_000_000;

    #[test]
    fn seal_verify_round_trip() {
        let k = keys(&[1]);
        let t = k.seal("worker-1", at(NOW));
        assert!(is_token(&t), "{t}");
        assert!(
            t.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
            "{t}"
        );
        let c = k.verify(&t, at(NOW + 10)).unwrap();
        assert_eq!(
            c,
            Claims {
                backend: "worker-1".into(),
                key_id: key_id(&key(1)),
                issued: NOW,
                expires: NOW + 3600
            }
        );
        // Any backend name, including non-ASCII and the empty one.
        for b in ["", "10.0.0.7:8000", "wörker \"x\"", &"b".repeat(300)] {
            assert_eq!(k.verify(&k.seal(b, at(NOW)), at(NOW)).unwrap().backend, b);
        }
    }

    #[test]
    fn wrap_unwrap_awkward_values() {
        let k = keys(&[1]);
        let long_state = "eyJhbGciOi.JIUzI1NiJ9/+=".repeat(40);
        let values = [
            "",
            "0123456789abcdef0123456789abcdef",
            &long_state,
            "a.b.c",
            "mrt1.looks.like.ours",
            "has space",
            "quote\" and \\ backslash",
            "unicode é € 🦀",
            "ctl\u{0}\n\t",
            "=",
        ];
        for v in values {
            let w = k.seal_value(v, "w2", at(NOW));
            assert!(is_token(&w));
            assert!(
                w.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b'"' && b != b'\\'),
                "{w}"
            );
            let (got, c) = k.open_value(&w, at(NOW)).unwrap();
            assert_eq!(got, v);
            assert_eq!(c.backend, "w2");
            assert_eq!(matches!(got, Cow::Borrowed(_)), carried_as_is(v), "{v:?}");
        }
        // Safe values are carried as is: a hex session id grows only by the token.
        let w = k.seal_value("abcdef", "w2", at(NOW));
        assert!(w.ends_with(".abcdef"), "{w}");
    }

    #[test]
    fn plain_and_wrapped_are_not_interchangeable() {
        let k = keys(&[1]);
        let t = k.seal("w", at(NOW));
        assert_eq!(k.open_value(&t, at(NOW)), Err(Rejected::Malformed));
        assert_eq!(k.open_value(&format!("{t}."), at(NOW)), Err(Rejected::Malformed));
        let w = k.seal_value("", "w", at(NOW));
        assert_eq!(k.verify(&w, at(NOW)), Err(Rejected::Malformed));
        assert_eq!(k.verify(w.trim_end_matches('.'), at(NOW)), Err(Rejected::Malformed));
    }

    #[test]
    fn rotation() {
        let old = keys(&[1]);
        let t = old.seal("w", at(NOW));
        let w = old.seal_value("state", "w", at(NOW));
        let rotated = keys(&[2, 1]);
        assert_eq!(rotated.verify(&t, at(NOW)).unwrap().key_id, key_id(&key(1)));
        assert_eq!(rotated.open_value(&w, at(NOW)).unwrap().0, "state");
        // The new first key signs; the old list does not know it.
        let t2 = rotated.seal("w", at(NOW));
        assert_eq!(rotated.verify(&t2, at(NOW)).unwrap().key_id, key_id(&key(2)));
        assert_eq!(old.verify(&t2, at(NOW)), Err(Rejected::UnknownKey));
        // Dropping the old key ends its tokens.
        assert_eq!(keys(&[2]).verify(&t, at(NOW)), Err(Rejected::UnknownKey));
    }

    #[test]
    fn expiry() {
        let k = keys(&[1]);
        let t = k.seal("w", at(NOW));
        assert!(k.verify(&t, at(NOW + 3600)).is_ok());
        assert_eq!(k.verify(&t, at(NOW + 3601)), Err(Rejected::Expired));
        let w = k.seal_value("s", "w", at(NOW));
        assert_eq!(k.open_value(&w, at(NOW + 3601)), Err(Rejected::Expired));
        // Issued "in the future" (another replica's clock ahead) is fine.
        assert!(k.verify(&t, at(NOW - 30)).is_ok());
    }

    #[test]
    fn foreign_key_id_and_forged_key_id() {
        let k = keys(&[1]);
        assert_eq!(
            k.verify(&keys(&[9]).seal("w", at(NOW)), at(NOW)),
            Err(Rejected::UnknownKey)
        );
        // A token from another key list that claims our key id fails the MAC.
        let foreign = keys(&[9]).seal("w", at(NOW));
        let mut body = URL_SAFE_NO_PAD.decode(&foreign[PREFIX.len()..]).unwrap();
        body[0..4].copy_from_slice(&key_id(&key(1)).to_be_bytes());
        let forged = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(&body));
        assert_eq!(k.verify(&forged, at(NOW)), Err(Rejected::BadSignature));
    }

    #[test]
    fn tampering_is_detected() {
        let k = keys(&[1]);
        let t = k.seal("worker-1", at(NOW));
        // Change the backend inside a well-formed body.
        let mut body = URL_SAFE_NO_PAD.decode(&t[PREFIX.len()..]).unwrap();
        body[FIXED] = b'W';
        let changed = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(&body));
        assert_eq!(k.verify(&changed, at(NOW)), Err(Rejected::BadSignature));
        // Extend the lifetime.
        let mut body = URL_SAFE_NO_PAD.decode(&t[PREFIX.len()..]).unwrap();
        body[16] = 0xff;
        let changed = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(&body));
        assert_eq!(k.verify(&changed, at(NOW)), Err(Rejected::BadSignature));
        // Truncated MAC, empty, other versions.
        assert_eq!(k.verify(&t[..t.len() - 4], at(NOW)), Err(Rejected::BadSignature));
        for bad in ["", "mrt1.", "mrt1", "mrt2.AAAA", "xyz", "mrt1.!!!!", "MRT1.AAAA"] {
            assert_eq!(k.verify(bad, at(NOW)), Err(Rejected::Malformed), "{bad:?}");
            assert_eq!(k.open_value(bad, at(NOW)), Err(Rejected::Malformed), "{bad:?}");
        }
        let huge = format!("{PREFIX}{}", "A".repeat(MAX_BODY_CHARS + 4));
        assert_eq!(k.verify(&huge, at(NOW)), Err(Rejected::Malformed));
    }

    #[test]
    fn wrapped_token_cannot_move_to_another_value() {
        let k = keys(&[1]);
        let a = k.seal_value("session-a", "w1", at(NOW));
        let b = k.seal_value("session-b", "w2", at(NOW));
        for (token, other) in [(&a, "session-b"), (&b, "session-a")] {
            let moved = format!("{}.{other}", token.rsplit_once('.').unwrap().0);
            assert_eq!(k.open_value(&moved, at(NOW)), Err(Rejected::BadSignature));
        }
        // Same for values carried as base64.
        let a = k.seal_value("a\"b", "w1", at(NOW));
        let b = k.seal_value("c\"d", "w1", at(NOW));
        let moved = format!("{}.{}", a.rsplit_once('.').unwrap().0, b.rsplit_once('.').unwrap().1);
        assert_eq!(k.open_value(&moved, at(NOW)), Err(Rejected::BadSignature));
        // A plain token's body with a value appended.
        let t = k.seal("w1", at(NOW));
        assert!(k.open_value(&format!("{t}.x"), at(NOW)).is_err());
    }

    /// Every single-character change, deletion and truncation of sample tokens is rejected
    /// (never Ok, never a panic).
    #[test]
    fn every_mutation_is_rejected() {
        let k = keys(&[1, 2]);
        let samples = [
            (k.seal("worker-1", at(NOW)), false),
            (k.seal_value("0123456789abcdef", "worker-1", at(NOW)), true),
            (k.seal_value("st\"ate/+=é", "worker-1", at(NOW)), true),
            (k.seal_value("", "w", at(NOW)), true),
        ];
        let check = |s: &str, wrapped: bool| {
            let r = if wrapped {
                k.open_value(s, at(NOW)).map(|_| ())
            } else {
                k.verify(s, at(NOW)).map(|_| ())
            };
            assert!(r.is_err(), "accepted mutation {s:?}");
        };
        let mut alphabet: Vec<char> = (0u8..0x80).map(char::from).collect();
        alphabet.extend(['é', '€', '🦀']);
        let mut tried = 0;
        for (token, wrapped) in &samples {
            assert!(if *wrapped {
                k.open_value(token, at(NOW)).is_ok()
            } else {
                k.verify(token, at(NOW)).is_ok()
            });
            for end in 0..token.len() {
                check(&token[..end], *wrapped);
                tried += 1;
            }
            for (i, orig) in token.char_indices() {
                let (before, after) = (&token[..i], &token[i + orig.len_utf8()..]);
                check(&format!("{before}{after}"), *wrapped);
                for &c in alphabet.iter().filter(|&&c| c != orig) {
                    check(&format!("{before}{c}{after}"), *wrapped);
                    tried += 1;
                }
            }
            for c in ['A', 'g', '.', '=', '0'] {
                check(&format!("{token}{c}"), *wrapped);
            }
        }
        assert!(tried > 10_000, "{tried}");
    }

    #[test]
    fn arbitrary_input_never_panics() {
        let k = keys(&[1]);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 120) as usize;
            let s: String = (0..len)
                .map(|i| b"AZaz09-_.=+/mrt1"[((x >> (i % 60)) as usize + i) % 16] as char)
                .collect();
            let s = format!("{PREFIX}{s}");
            assert!(k.verify(&s, at(NOW)).is_err());
            assert!(k.open_value(&s, at(NOW)).is_err());
        }
    }
}
