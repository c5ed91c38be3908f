//! The keys that seal and open tokens of the current format: each configured key's AEAD key
//! and stable-nonce key (HKDF-SHA-256), the first sealing, all opening, and the same keys for
//! tokens of the previous format (`v1`), opened during a rolling upgrade. The format itself
//! (the layout, the kinds, the text) is `super`'s.

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};

use super::{
    carried_as_is, check_keys, split, text, ttl_secs, v1, with_body, CallTag, Claims, KeyProblem, Kind, PrincipalTag,
    Rejected, CALL_LEN, FIXED, FLAGS_BOUND, FLAG_BASE64, FLAG_CALL, FLAG_CALL_BY_ROUTING_ID, FLAG_PRINCIPAL,
    FLAG_WRAPPED, HEAD, MAX_BODY_CHARS, NONCE_LEN, PREFIX, PRINCIPAL_LEN, STACK_BODY, TAG_LEN,
};

/// The keys (the first seals, all open) and the lifetime of the tokens they issue.
pub struct SealingKeys {
    keys: Vec<Key>,
    ttl_secs: u32,
    /// The same keys, for tokens of the previous format.
    legacy: v1::SealingKeys,
}

struct Key {
    id: u32,
    aead: LessSafeKey,
    /// Derives the nonce of a stable token from what it seals ([`SealingKeys::seal_stable`]).
    nonces: ring::hmac::Key,
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

/// The AEAD key and the stable-nonce key a configured key stands for (HKDF-SHA-256).
fn derive(id: u32, key: &[u8]) -> Key {
    let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"mrtr-token-v2");
    let prk = salt.extract(key);
    let aead = prk
        .expand(&[b"chacha20-poly1305"], &CHACHA20_POLY1305)
        .expect("32 bytes is a valid HKDF-SHA-256 output length");
    let nonces = prk
        .expand(&[b"stable-nonce"], ring::hmac::HMAC_SHA256)
        .expect("32 bytes is a valid HKDF-SHA-256 output length");
    Key {
        id,
        aead: LessSafeKey::new(UnboundKey::from(aead)),
        nonces: ring::hmac::Key::from(nonces),
    }
}

impl SealingKeys {
    /// Keys in config order (the first seals) and the lifetime of new tokens. The error names
    /// the offending setting, e.g. `tokens.keys[1]: must be at least 32 bytes (got 5)`.
    pub fn new(keys: Vec<Vec<u8>>, ttl: Duration) -> Result<SealingKeys, String> {
        SealingKeys::build(&keys, ttl).map_err(|p| p.message)
    }

    /// [`SealingKeys::new`], with the key at fault.
    pub fn build(keys: &[Vec<u8>], ttl: Duration) -> Result<SealingKeys, KeyProblem> {
        let ids = check_keys(keys)?;
        let ttl_secs = ttl_secs(ttl).map_err(|message| KeyProblem { index: None, message })?;
        let built = ids.iter().zip(keys).map(|(&id, key)| derive(id, key)).collect();
        Ok(SealingKeys {
            keys: built,
            ttl_secs,
            legacy: v1::SealingKeys::from_checked(keys, &ids, ttl_secs),
        })
    }

    /// The same keys issuing tokens with another lifetime.
    pub fn with_ttl(&self, ttl: Duration) -> Result<SealingKeys, String> {
        let ttl_secs = ttl_secs(ttl)?;
        Ok(SealingKeys {
            keys: self
                .keys
                .iter()
                .map(|k| Key {
                    id: k.id,
                    aead: k.aead.clone(),
                    nonces: k.nonces.clone(),
                })
                .collect(),
            ttl_secs,
            legacy: self.legacy.clone(),
        })
    }

    /// Lifetime of the tokens this issues.
    pub fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_secs.into())
    }

    /// A token for a routing header: names the backend and the call's rounds.
    pub fn seal(&self, kind: Kind, backend: &str, rounds: u32, now: SystemTime) -> String {
        self.seal_for(None, None, kind, backend, rounds, now)
    }

    /// [`SealingKeys::seal`], bound to the caller `principal` and to its `call` when known.
    pub fn seal_for(
        &self,
        principal: Option<&PrincipalTag>,
        call: Option<CallTag>,
        kind: Kind,
        backend: &str,
        rounds: u32,
        now: SystemTime,
    ) -> String {
        self.issue(kind, backend, rounds, None, (principal, call), Stamp::Issued(now))
    }

    /// Wraps a value the client echoes (a `requestState`, a session or task id) so that it also
    /// names the backend. Any string round-trips byte for byte through [`SealingKeys::open_value`],
    /// the empty one included.
    pub fn seal_value(&self, kind: Kind, value: &str, backend: &str, rounds: u32, now: SystemTime) -> String {
        self.seal_value_for(None, None, kind, value, backend, rounds, now)
    }

    /// [`SealingKeys::seal_value`], bound to the caller `principal` and to its `call` when known.
    #[allow(clippy::too_many_arguments)]
    pub fn seal_value_for(
        &self,
        principal: Option<&PrincipalTag>,
        call: Option<CallTag>,
        kind: Kind,
        value: &str,
        backend: &str,
        rounds: u32,
        now: SystemTime,
    ) -> String {
        self.issue(
            kind,
            backend,
            rounds,
            Some(value),
            (principal, call),
            Stamp::Issued(now),
        )
    }

    /// Wraps `value` as [`SealingKeys::seal_value`] does, but the same value, backend and key give
    /// the same token every time, on every replica: for a handle that must stay one string for
    /// as long as it lives (a task id appears again in every answer about the task). The nonce
    /// is a keyed digest of what is sealed, so equal tokens tell only that they are equal; the
    /// token carries no time and does not expire (the task's server decides how long it lives).
    pub fn seal_stable(&self, kind: Kind, value: &str, backend: &str) -> String {
        self.seal_stable_for(None, kind, value, backend)
    }

    /// [`SealingKeys::seal_stable`], bound to the caller `principal` when there is one: stable for
    /// that caller, and another caller's token for the same value differs (the principal is in
    /// the nonce's derivation, as everything sealed is, so no two plaintexts share a nonce).
    pub fn seal_stable_for(&self, principal: Option<&PrincipalTag>, kind: Kind, value: &str, backend: &str) -> String {
        let key = &self.keys[0];
        let mut ctx = ring::hmac::Context::with_key(&key.nonces);
        ctx.update(&[kind as u8]);
        ctx.update(&(backend.len() as u64).to_be_bytes());
        ctx.update(backend.as_bytes());
        if let Some(p) = principal {
            ctx.update(&[FLAG_PRINCIPAL]);
            ctx.update(p);
        }
        ctx.update(value.as_bytes());
        let digest = ctx.sign();
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&digest.as_ref()[..NONCE_LEN]);
        self.issue(kind, backend, 0, Some(value), (principal, None), Stamp::Stable(nonce))
    }

    /// Checks a token from [`SealingKeys::seal`] made for `kind`.
    pub fn verify(&self, kind: Kind, token: &str, now: SystemTime) -> Result<Claims, Rejected> {
        if token.starts_with(v1::PREFIX) {
            return self.legacy.verify(token, now).map(v1::Claims::upgrade);
        }
        let (body, value) = split(token, PREFIX, MAX_BODY_CHARS)?;
        if value.is_some() {
            return Err(Rejected::Malformed);
        }
        with_body(body, |body| self.open(kind, body, 0, b"", now))
    }

    /// Checks a value from [`SealingKeys::seal_value`] made for `kind`, and returns the original
    /// value and the claims. The value is borrowed from `wrapped` when it was carried as is.
    pub fn open_value<'a>(
        &self,
        kind: Kind,
        wrapped: &'a str,
        now: SystemTime,
    ) -> Result<(Cow<'a, str>, Claims), Rejected> {
        if wrapped.starts_with(v1::PREFIX) {
            let (value, claims) = self.legacy.open_value(wrapped, now)?;
            return Ok((value, claims.upgrade()));
        }
        let (body, value) = split(wrapped, PREFIX, MAX_BODY_CHARS)?;
        let value = value.ok_or(Rejected::Malformed)?;
        with_body(body, |body| {
            let flags = *body.get(4).ok_or(Rejected::Malformed)?;
            let value: Cow<'a, str> = match flags & !FLAGS_BOUND {
                FLAG_WRAPPED => Cow::Borrowed(value),
                f if f == FLAG_WRAPPED | FLAG_BASE64 => {
                    let bytes = URL_SAFE_NO_PAD.decode(value).map_err(|_| Rejected::Malformed)?;
                    Cow::Owned(String::from_utf8(bytes).map_err(|_| Rejected::Malformed)?)
                }
                _ => return Err(Rejected::Malformed),
            };
            let claims = self.open(kind, body, flags & !FLAGS_BOUND, value.as_bytes(), now)?;
            Ok((value, claims))
        })
    }

    fn issue(
        &self,
        kind: Kind,
        backend: &str,
        rounds: u32,
        value: Option<&str>,
        (principal, call): (Option<&PrincipalTag>, Option<CallTag>),
        stamp: Stamp,
    ) -> String {
        let key = &self.keys[0];
        let raw = value.is_none_or(carried_as_is);
        let mut flags = match value {
            None => 0,
            Some(_) if raw => FLAG_WRAPPED,
            Some(_) => FLAG_WRAPPED | FLAG_BASE64,
        };
        let principal_len = principal.map_or(0, |_| PRINCIPAL_LEN);
        let bound = principal_len + call.map_or(0, |_| CALL_LEN);
        if principal.is_some() {
            flags |= FLAG_PRINCIPAL;
        }
        if let Some(c) = call {
            flags |= FLAG_CALL;
            if c.by_routing_id {
                flags |= FLAG_CALL_BY_ROUTING_ID;
            }
        }
        let len = HEAD + FIXED + bound + backend.len() + TAG_LEN;
        let mut stack = [0u8; STACK_BODY];
        let mut heap = Vec::new();
        let body: &mut [u8] = if len <= STACK_BODY {
            &mut stack[..len]
        } else {
            heap.resize(len, 0);
            &mut heap
        };
        let (nonce, issued_ms, ttl_secs) = match stamp {
            Stamp::Issued(now) => (rand::random(), unix_ms(now), self.ttl_secs),
            Stamp::Stable(nonce) => (nonce, 0, u32::MAX),
        };
        body[0..4].copy_from_slice(&key.id.to_be_bytes());
        body[4] = flags;
        body[5..HEAD].copy_from_slice(&nonce);
        let (head, rest) = body.split_at_mut(HEAD);
        let (plain, tag_out) = rest.split_at_mut(FIXED + bound + backend.len());
        plain[0..8].copy_from_slice(&issued_ms.to_be_bytes());
        plain[8..12].copy_from_slice(&ttl_secs.to_be_bytes());
        plain[12..16].copy_from_slice(&rounds.to_be_bytes());
        if let Some(p) = principal {
            plain[FIXED..FIXED + PRINCIPAL_LEN].copy_from_slice(p);
        }
        if let Some(c) = call {
            let at = FIXED + principal_len;
            plain[at..at + CALL_LEN].copy_from_slice(&c.digest.to_be_bytes());
        }
        plain[FIXED + bound..].copy_from_slice(backend.as_bytes());
        let aad = aad(kind, &head[..5], value.unwrap_or("").as_bytes());
        let tag = key
            .aead
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&aad), plain)
            .expect("a token is far below ChaCha20-Poly1305's length limit");
        tag_out.copy_from_slice(tag.as_ref());

        text(PREFIX, body, value, raw)
    }

    /// Decrypts and authenticates a decoded body (`flags` as the value's encoding requires),
    /// then checks the expiry.
    fn open(&self, kind: Kind, body: &[u8], flags: u8, value: &[u8], now: SystemTime) -> Result<Claims, Rejected> {
        let found = *body.get(4).ok_or(Rejected::Malformed)?;
        let by_routing_id = found & FLAG_CALL_BY_ROUTING_ID != 0;
        if found & !FLAGS_BOUND != flags || (by_routing_id && found & FLAG_CALL == 0) {
            return Err(Rejected::Malformed);
        }
        let principal_len = if found & FLAG_PRINCIPAL != 0 { PRINCIPAL_LEN } else { 0 };
        let call_len = if found & FLAG_CALL != 0 { CALL_LEN } else { 0 };
        let bound = principal_len + call_len;
        if body.len() < HEAD + FIXED + bound + TAG_LEN {
            return Err(Rejected::Malformed);
        }
        let id = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        let key = self.keys.iter().find(|k| k.id == id).ok_or(Rejected::UnknownKey)?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&body[5..HEAD]);
        let aad = aad(kind, &body[..5], value);
        let mut sealed = [0u8; STACK_BODY];
        let mut heap = Vec::new();
        let sealed: &mut [u8] = match body.len() - HEAD {
            n if n <= STACK_BODY => {
                sealed[..n].copy_from_slice(&body[HEAD..]);
                &mut sealed[..n]
            }
            _ => {
                heap.extend_from_slice(&body[HEAD..]);
                &mut heap
            }
        };
        let plain = key
            .aead
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&aad), sealed)
            .map_err(|_| Rejected::BadSignature)?;
        let be8 = |b: &[u8]| u64::from_be_bytes(b.try_into().expect("8 bytes"));
        let be4 = |b: &[u8]| u32::from_be_bytes(b.try_into().expect("4 bytes"));
        let issued_ms = be8(&plain[0..8]);
        let ttl = be4(&plain[8..12]);
        let rounds = be4(&plain[12..16]);
        let principal = (principal_len > 0).then(|| {
            let mut p = [0u8; PRINCIPAL_LEN];
            p.copy_from_slice(&plain[FIXED..FIXED + PRINCIPAL_LEN]);
            p
        });
        let call = (call_len > 0).then(|| {
            let at = FIXED + principal_len;
            CallTag {
                digest: u128::from_be_bytes(plain[at..at + CALL_LEN].try_into().expect("16 bytes")),
                by_routing_id,
            }
        });
        let backend = std::str::from_utf8(&plain[FIXED + bound..]).map_err(|_| Rejected::Malformed)?;
        let expires = (issued_ms / 1000).saturating_add(ttl.into());
        if unix_ms(now) / 1000 > expires {
            return Err(Rejected::Expired);
        }
        Ok(Claims {
            backend: backend.to_owned(),
            key_id: id,
            issued_ms,
            expires,
            rounds: Some(rounds),
            principal,
            call,
        })
    }
}

/// When a token is made: now, with a random nonce and the configured lifetime; or stably (see
/// [`SealingKeys::seal_stable`]), with the nonce given, no issue time and no expiry.
enum Stamp {
    Issued(SystemTime),
    Stable([u8; NONCE_LEN]),
}

/// The authenticated data of a token: version, kind, key id, flags and the wrapped value.
fn aad(kind: Kind, key_id_and_flags: &[u8], value: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(4 + 1 + 5 + value.len());
    aad.extend_from_slice(b"mrt2");
    aad.push(kind as u8);
    aad.extend_from_slice(key_id_and_flags);
    aad.extend_from_slice(value);
    aad
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
