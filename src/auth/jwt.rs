//! One bearer access token verified: a compact JWS (RFC 7515) whose claims (RFC 7519, the JWT
//! access-token profile RFC 9068) make it this resource's, now (docs/src/authorization.md,
//! "Access tokens").
//!
//! A failed authentication costs little, as anyone can send one: the checks go from the
//! cheapest to the dearest and stop at the first that fails.
//! 1. The length: at most [`MAX_BEARER_BYTES`], before anything is decoded.
//! 2. The form: three base64url parts (a JWE's five are refused, and so is an empty signature).
//! 3. The header: `alg` is one of the [`Policy`]'s (never `none`, never an HMAC algorithm);
//!    no `crit` (the router understands no extension) and no `enc`; `typ`, if present, is
//!    `at+jwt`, `application/at+jwt` or `JWT` (any case).
//! 4. The claims, none needing a signature check: `iss` is the policy's issuer, exactly; `aud`
//!    (a string or an array) holds one of the policy's audiences, exactly (RFC 8707: an access
//!    token minted for another resource is refused); `exp` is present and `now < exp + leeway`;
//!    `nbf` and `iat`, when present, are at most `now + leeway`; a subject is named (`sub`, or
//!    else `client_id`); the scopes (`scope`, or else `scp`) are valid scopes. Before the key:
//!    an access token that could never be valid never makes the router fetch the issuer's keys.
//! 5. The key: `kid` names a key of the set that may verify `alg` (an unknown `kid` is
//!    [`AuthFailure::UnknownKey`], on which the router may fetch the issuer's keys again).
//! 6. Only then the signature, one check with the one key `kid` picks.
//!
//! Member names are read as JSON object keys: a header or claim set that repeats one is
//! malformed, never read one way here and another way by the issuer.

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;

use super::jwks::{KeySet, Lookup};
use super::principal::Principal;
use super::scopes::Scopes;
use crate::config::{Algorithm, AlgorithmSet};

/// The longest access token read: 8 KiB. Access tokens are a few hundred bytes to 2 KiB; 8 KiB
/// is also the size of the head hyper reads a header in.
pub const MAX_BEARER_BYTES: usize = 8 * 1024;

/// The longest signature: an RSA-8192 one (decoded on the stack).
const MAX_SIGNATURE_BYTES: usize = 8192 / 8;

/// The latest `exp` kept as a time (year 9999): a later one is taken as this.
const LATEST_EXPIRY_SECS: f64 = 253_402_300_799.0;

/// What makes an access token this resource's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The issuer's identifier: `iss` must be exactly this.
    pub issuer: String,
    /// This resource's identifiers: `aud` must hold one, exactly.
    pub audiences: Vec<String>,
    /// The signature algorithms accepted.
    pub algorithms: AlgorithmSet,
    /// The clock skew allowed on `exp`, `nbf` and `iat` (in whole seconds).
    pub leeway: Duration,
}

/// An access token that verified: who presented it, what it grants, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub issuer: String,
    /// `sub`, or without one the client's id (a client acting for itself).
    pub subject: String,
    /// `client_id` (RFC 9068), or else `azp`.
    pub client_id: Option<String>,
    /// The access token had no `sub`: `subject` is the client's id.
    pub subject_is_client: bool,
    pub scopes: Scopes,
    pub expires_at: SystemTime,
}

impl Verified {
    /// The caller as sealed handles name it.
    pub fn principal(&self) -> Principal {
        match self.subject_is_client {
            true => Principal::client(self.issuer.clone(), self.subject.clone()),
            false => Principal::new(self.issuer.clone(), self.subject.clone()),
        }
    }
}

/// A part of a bearer (a compact JWS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The whole: not three base64url parts.
    Whole,
    Header,
    Claims,
    Signature,
}

/// Why an access token is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthFailure {
    /// Longer than [`MAX_BEARER_BYTES`].
    TooLong {
        len: usize,
    },
    /// A part is not base64url, not JSON, or holds a member of the wrong type.
    Malformed(Part),
    /// `alg` is missing, `none`, an HMAC algorithm, unsupported, or not the policy's.
    Algorithm,
    /// The header has `crit` or `enc`.
    UnsupportedHeader,
    /// `typ` says it is not an access token.
    Type,
    /// No key of the set has the access token's `kid` (`None`: the access token has none, and no
    /// key lacks one).
    UnknownKey {
        kid: Option<String>,
    },
    /// The key `kid` names may not verify `alg` (another key type, or another `alg`): an RS256
    /// access token against an EC key, say.
    KeyMismatch,
    Issuer,
    Audience,
    MissingExpiry,
    Expired,
    /// `nbf` or `iat` is later than now (beyond the leeway).
    NotYetValid,
    /// Neither `sub` nor `client_id`.
    NoSubject,
    BadSignature,
}

impl AuthFailure {
    /// The `result` label of `mrtr_auth_total` (one of `AUTH_RESULTS`).
    pub fn result(&self) -> &'static str {
        match self {
            AuthFailure::Expired | AuthFailure::NotYetValid => "expired",
            AuthFailure::Audience => "audience",
            _ => "invalid",
        }
    }

    /// A short description for `WWW-Authenticate: error_description` (visible ASCII and spaces,
    /// no `"` or `\`, so it quotes as is). Names no key, issuer or audience.
    pub fn description(&self) -> &'static str {
        match self {
            AuthFailure::TooLong { .. } => "the token is too long",
            AuthFailure::Malformed(Part::Whole) => "the token is not a compact JWS",
            AuthFailure::Malformed(Part::Header) => "the token header is malformed",
            AuthFailure::Malformed(Part::Claims) => "the token claims are malformed",
            AuthFailure::Malformed(Part::Signature) => "the token signature is malformed",
            AuthFailure::Algorithm => "the token signing algorithm is not accepted",
            AuthFailure::UnsupportedHeader => "the token header asks for an unsupported extension",
            AuthFailure::Type => "the token is not an access token",
            AuthFailure::UnknownKey { .. } => "the token signing key is unknown",
            AuthFailure::KeyMismatch => "the token signing algorithm does not fit its key",
            AuthFailure::Issuer => "the token is from another issuer",
            AuthFailure::Audience => "the token is for another resource",
            AuthFailure::MissingExpiry => "the token has no expiry",
            AuthFailure::Expired => "the token has expired",
            AuthFailure::NotYetValid => "the token is not valid yet",
            AuthFailure::NoSubject => "the token names no subject",
            AuthFailure::BadSignature => "the token signature does not verify",
        }
    }
}

impl fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())?;
        match self {
            AuthFailure::TooLong { len } => write!(f, " ({len} bytes)"),
            AuthFailure::UnknownKey { kid: Some(kid) } => write!(f, " (kid {kid:?})"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for AuthFailure {}

/// The header members the router reads (RFC 7515 §4.1).
#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Option<Cow<'a, str>>,
    #[serde(borrow)]
    typ: Option<Cow<'a, str>>,
    #[serde(borrow)]
    kid: Option<Cow<'a, str>>,
    #[serde(default)]
    crit: Present,
    #[serde(default)]
    enc: Present,
}

/// Whether a member is there at all (whatever its value, `null` too).
#[derive(Default)]
struct Present(bool);

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Present, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Present(true))
    }
}

/// The claims the router reads (RFC 7519 §4.1, RFC 9068 §2.2, RFC 8693 §4.2).
#[derive(Deserialize)]
struct Claims<'a> {
    #[serde(borrow)]
    iss: Option<Cow<'a, str>>,
    #[serde(borrow)]
    aud: Option<OneOrMany<'a>>,
    exp: Option<f64>,
    nbf: Option<f64>,
    iat: Option<f64>,
    #[serde(borrow)]
    sub: Option<Cow<'a, str>>,
    #[serde(borrow)]
    client_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    azp: Option<Cow<'a, str>>,
    #[serde(borrow)]
    scope: Option<Cow<'a, str>>,
    #[serde(borrow)]
    scp: Option<OneOrMany<'a>>,
}

/// A string, or an array of strings (`aud`; `scp`), borrowed from the decoded part where they
/// have no escapes.
enum OneOrMany<'a> {
    One(Cow<'a, str>),
    Many(Vec<Cow<'a, str>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for OneOrMany<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<OneOrMany<'a>, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = OneOrMany<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<OneOrMany<'a>, E> {
                Ok(OneOrMany::One(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<OneOrMany<'a>, E> {
                Ok(OneOrMany::One(Cow::Owned(s.to_owned())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMany<'a>, A::Error> {
                // Each element read as one of these (a plain `Cow` would copy every string).
                let mut all = Vec::new();
                while let Some(element) = seq.next_element::<OneOrMany<'a>>()? {
                    match element {
                        OneOrMany::One(s) => all.push(s),
                        OneOrMany::Many(_) => return Err(de::Error::custom("an array in an array")),
                    }
                }
                Ok(OneOrMany::Many(all))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

impl OneOrMany<'_> {
    fn iter(&self) -> impl Iterator<Item = &str> {
        let (one, many) = match self {
            OneOrMany::One(s) => (Some(&**s), &[][..]),
            OneOrMany::Many(v) => (None, &v[..]),
        };
        one.into_iter().chain(many.iter().map(|s| &**s))
    }
}

impl Policy {
    /// Verifies `bearer` (the access token, without `Bearer `) against the issuer's `keys`
    /// at `now`, in the order of the module doc.
    pub fn verify(&self, bearer: &str, keys: &KeySet, now: SystemTime) -> Result<Verified, AuthFailure> {
        if bearer.len() > MAX_BEARER_BYTES {
            return Err(AuthFailure::TooLong { len: bearer.len() });
        }
        let (signed, signature) = bearer.rsplit_once('.').ok_or(AuthFailure::Malformed(Part::Whole))?;
        let (header, payload) = signed.split_once('.').ok_or(AuthFailure::Malformed(Part::Whole))?;
        if payload.contains('.') {
            return Err(AuthFailure::Malformed(Part::Whole));
        }

        let header = URL_SAFE_NO_PAD.decode(header).map_err(malformed(Part::Header))?;
        let header: Header = serde_json::from_slice(&header).map_err(malformed(Part::Header))?;
        let alg = header
            .alg
            .as_deref()
            .and_then(Algorithm::from_name)
            .filter(|&a| self.algorithms.contains(a))
            .ok_or(AuthFailure::Algorithm)?;
        if header.crit.0 || header.enc.0 {
            return Err(AuthFailure::UnsupportedHeader);
        }
        if !header.typ.as_deref().is_none_or(is_access_token_type) {
            return Err(AuthFailure::Type);
        }
        let claims = URL_SAFE_NO_PAD.decode(payload).map_err(malformed(Part::Claims))?;
        let claims: Claims = serde_json::from_slice(&claims).map_err(malformed(Part::Claims))?;
        let verified = self.check_claims(claims, now)?;

        let key = match keys.find(header.kid.as_deref(), alg) {
            Lookup::Found(key) => key,
            Lookup::NoKey => {
                return Err(AuthFailure::UnknownKey {
                    kid: header.kid.map(Cow::into_owned),
                })
            }
            Lookup::Mismatch => return Err(AuthFailure::KeyMismatch),
        };

        let mut decoded = [0; MAX_SIGNATURE_BYTES];
        let len = match signature.is_empty() {
            true => return Err(AuthFailure::Malformed(Part::Signature)),
            false => URL_SAFE_NO_PAD
                .decode_slice(signature, &mut decoded)
                .map_err(malformed(Part::Signature))?,
        };
        match key.verify(alg, signed.as_bytes(), &decoded[..len]) {
            true => Ok(verified),
            false => Err(AuthFailure::BadSignature),
        }
    }

    /// Step 4 of the module doc.
    fn check_claims<'a>(&self, claims: Claims<'a>, now: SystemTime) -> Result<Verified, AuthFailure> {
        let issuer = claims
            .iss
            .filter(|iss| *iss == self.issuer)
            .ok_or(AuthFailure::Issuer)?;
        let ours = |aud: &str| self.audiences.iter().any(|a| a == aud);
        if !claims.aud.is_some_and(|aud| aud.iter().any(ours)) {
            return Err(AuthFailure::Audience);
        }
        let now = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as f64;
        let leeway = self.leeway.as_secs() as f64;
        let exp = claims.exp.ok_or(AuthFailure::MissingExpiry)?;
        if now >= exp + leeway {
            return Err(AuthFailure::Expired);
        }
        if [claims.nbf, claims.iat].into_iter().flatten().any(|t| t > now + leeway) {
            return Err(AuthFailure::NotYetValid);
        }
        let named = |s: Option<Cow<'a, str>>| s.filter(|s| !s.is_empty());
        let client_id = named(claims.client_id).or_else(|| named(claims.azp));
        let sub = named(claims.sub);
        // Backends receive them as header values (`X-Mcp-Auth-*`): a control character could be
        // neither written nor left out without the backend seeing someone else.
        if [Some(&issuer), sub.as_ref(), client_id.as_ref()]
            .into_iter()
            .flatten()
            .any(|s| s.chars().any(char::is_control))
        {
            return Err(AuthFailure::Malformed(Part::Claims));
        }
        let subject_is_client = sub.is_none();
        let subject = sub.or_else(|| client_id.clone()).ok_or(AuthFailure::NoSubject)?;
        let scopes = match (claims.scope, claims.scp) {
            (Some(scope), _) => Scopes::parse(&scope),
            (None, Some(OneOrMany::One(scp))) => Scopes::parse(&scp),
            (None, Some(scp)) => Scopes::from_values(scp.iter()),
            (None, None) => Ok(Scopes::default()),
        }
        .map_err(|_| AuthFailure::Malformed(Part::Claims))?;
        Ok(Verified {
            issuer: issuer.into_owned(),
            subject: subject.into_owned(),
            client_id: client_id.map(Cow::into_owned),
            subject_is_client,
            scopes,
            expires_at: UNIX_EPOCH + Duration::from_secs_f64(exp.clamp(0.0, LATEST_EXPIRY_SECS)),
        })
    }
}

/// The error of decoding `part`, whatever went wrong.
fn malformed<E>(part: Part) -> impl Fn(E) -> AuthFailure {
    move |_| AuthFailure::Malformed(part)
}

/// The `typ` values of an access token: RFC 9068's, and the plain `JWT` many issuers write.
fn is_access_token_type(typ: &str) -> bool {
    ["at+jwt", "application/at+jwt", "JWT"]
        .iter()
        .any(|t| t.eq_ignore_ascii_case(typ))
}
