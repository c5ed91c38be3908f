//! An issuer's JSON Web Key Set (RFC 7517 §5) as the immutable [`KeySet`] access tokens are
//! verified against (docs/src/authorization.md, "The issuer's keys"). The router swaps a whole new
//! set in when it fetches one; a set is never changed in place.
//!
//! Which keys are kept, each for the algorithms it may verify:
//! - `kty` `RSA` (`n`, `e`): RS256 and PS256, or only the one its `alg` names; a modulus of
//!   2048 to 8192 bits, an odd exponent of 3 to 32 bits (what `ring` verifies with);
//! - `kty` `EC`, `crv` `P-256` (`x`, `y`, 32 bytes each): ES256;
//! - `kty` `OKP`, `crv` `Ed25519` (`x`, 32 bytes): EdDSA.
//!
//! A key whose `use` is not `sig`, whose `key_ops` lack `verify`, whose `alg` is another or
//! does not fit its type, of another type or curve, or with a member that is not base64url
//! (unpadded, canonical) is skipped, and said so in [`ParsedKeySet::skipped`]: one bad key
//! never costs the others. Only a document that is not a key set at all (not a JSON object
//! with a `keys` array, or not UTF-8), or is larger than [`MAX_JWKS_BYTES`], is an error. At most
//! [`MAX_KEYS`] keys are read; the rest are skipped.
//!
//! An access token's `kid` picks the keys of that `kid`; a key without `kid` serves only access
//! tokens without one. Of the keys a `kid` picks, the first (in the document's order) that may
//! verify the access token's algorithm verifies it: one signature check per access token at most,
//! whatever the set holds. Several keys may share a `kid` (RFC 7517 §4.5 allows it for keys of
//! different types).

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::config::{Algorithm, AlgorithmSet};

/// The largest key-set document read: 1 MiB, room for [`MAX_KEYS`] keys with certificate
/// chains (`x5c`), far beyond any issuer's few keys.
pub const MAX_JWKS_BYTES: usize = 1 << 20;

/// The most keys a set holds; keys past it are skipped.
pub const MAX_KEYS: usize = 100;

/// The RSA modulus sizes accepted, in bits (what `ring`'s `RSA_*_2048_8192_*` verify).
const RSA_MIN_BITS: usize = 2048;
const RSA_MAX_BITS: usize = 8192;

/// Why a document is not a key set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksError {
    /// Larger than [`MAX_JWKS_BYTES`].
    TooLarge { len: usize },
    /// Not UTF-8, or not a JSON object with a `keys` array (the reason).
    NotJwks(String),
}

impl fmt::Display for JwksError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JwksError::TooLarge { len } => write!(f, "the key set is {len} bytes, over the limit of {MAX_JWKS_BYTES}"),
            JwksError::NotJwks(why) => write!(f, "not a JSON Web Key Set: {why}"),
        }
    }
}

impl std::error::Error for JwksError {}

/// A key of the document that the set does not hold, and why (for the router's log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedKey {
    /// Its `kid`, when it has a readable one.
    pub kid: Option<String>,
    pub reason: &'static str,
}

/// What a document gave: the keys kept, and those skipped.
#[derive(Debug, Clone)]
pub struct ParsedKeySet {
    pub keys: KeySet,
    pub skipped: Vec<SkippedKey>,
}

/// An issuer's verification keys, by `kid`.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    /// Sorted by `kid` (keys without one first), the document's order kept within a `kid`.
    keys: Vec<Key>,
}

/// One public key, with the algorithms it may verify.
#[derive(Clone)]
pub struct Key {
    kid: Option<Box<str>>,
    algorithms: AlgorithmSet,
    public: Public,
}

#[derive(Clone)]
enum Public {
    /// Big-endian, without leading zeros (as `ring` reads them).
    Rsa {
        n: Box<[u8]>,
        e: Box<[u8]>,
    },
    /// The uncompressed point `0x04 || x || y`.
    P256(Box<[u8; 65]>),
    Ed25519([u8; 32]),
}

/// What an access token's `kid` and algorithm find in a set.
pub(super) enum Lookup<'a> {
    Found(&'a Key),
    /// No key has that `kid` (or, for an access token without `kid`, no key lacks one).
    NoKey,
    /// Keys have that `kid`, but none may verify the algorithm (another key type, or another
    /// `alg`).
    Mismatch,
}

impl KeySet {
    /// Reads a JWKS document (the module doc says which keys are kept).
    pub fn parse(document: &[u8]) -> Result<ParsedKeySet, JwksError> {
        if document.len() > MAX_JWKS_BYTES {
            return Err(JwksError::TooLarge { len: document.len() });
        }
        #[derive(Deserialize)]
        struct Document<'a> {
            #[serde(borrow)]
            keys: Vec<&'a RawValue>,
        }
        // JSON is UTF-8 (RFC 8259 §8.1); checked whole, so no key is read from a broken text.
        let text = std::str::from_utf8(document).map_err(|e| JwksError::NotJwks(e.to_string()))?;
        let doc: Document = serde_json::from_str(text).map_err(|e| JwksError::NotJwks(e.to_string()))?;
        let mut keys = Vec::new();
        let mut skipped = Vec::new();
        for (n, raw) in doc.keys.into_iter().enumerate() {
            let jwk: Option<Jwk> = serde_json::from_str(raw.get()).ok();
            let kid = jwk.as_ref().and_then(|k| k.kid.clone());
            let kept = match jwk {
                _ if n >= MAX_KEYS => Err("beyond the limit of keys in a set"),
                None => Err("not a JWK object"),
                Some(jwk) => jwk.into_key(),
            };
            match kept {
                Ok(key) => keys.push(key),
                Err(reason) => skipped.push(SkippedKey { kid, reason }),
            }
        }
        // Stable: the document's order stays within a `kid`.
        keys.sort_by(|a, b| a.kid.cmp(&b.kid));
        Ok(ParsedKeySet {
            keys: KeySet { keys },
            skipped,
        })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Key> {
        self.keys.iter()
    }

    /// The key that verifies an access token with this `kid` and algorithm (see the module doc).
    pub(super) fn find(&self, kid: Option<&str>, alg: Algorithm) -> Lookup<'_> {
        let from = self.keys.partition_point(|k| k.kid.as_deref() < kid);
        let same_kid = self.keys[from..].iter().take_while(|k| k.kid.as_deref() == kid);
        let mut any = false;
        for key in same_kid {
            if key.algorithms.contains(alg) {
                return Lookup::Found(key);
            }
            any = true;
        }
        match any {
            true => Lookup::Mismatch,
            false => Lookup::NoKey,
        }
    }
}

impl Key {
    pub fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }

    /// The algorithms this key may verify.
    pub fn algorithms(&self) -> AlgorithmSet {
        self.algorithms
    }

    /// Whether `signature` is this key's signature of `message` by `alg` (false too for an
    /// algorithm the key may not verify).
    pub fn verify(&self, alg: Algorithm, message: &[u8], signature: &[u8]) -> bool {
        if !self.algorithms.contains(alg) {
            return false;
        }
        let verified = match (&self.public, alg) {
            (Public::Rsa { n, e }, Algorithm::Rs256 | Algorithm::Ps256) => {
                let params = match alg {
                    Algorithm::Rs256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    _ => &signature::RSA_PSS_2048_8192_SHA256,
                };
                RsaPublicKeyComponents { n: &**n, e: &**e }.verify(params, message, signature)
            }
            (Public::P256(point), Algorithm::Es256) => {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &point[..]).verify(message, signature)
            }
            (Public::Ed25519(x), Algorithm::EdDsa) => {
                UnparsedPublicKey::new(&signature::ED25519, &x[..]).verify(message, signature)
            }
            _ => return false,
        };
        verified.is_ok()
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kty = match &self.public {
            Public::Rsa { n, .. } => format!("RSA {} bits", bit_length(n)),
            Public::P256(_) => "EC P-256".to_owned(),
            Public::Ed25519(_) => "OKP Ed25519".to_owned(),
        };
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("kty", &kty)
            .field("algorithms", &self.algorithms)
            .finish()
    }
}

/// One member of `keys`, the fields the router reads (RFC 7517 §4, RFC 7518 §6, RFC 8037 §2).
#[derive(Deserialize)]
struct Jwk {
    kty: Option<String>,
    kid: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    key_ops: Option<Vec<String>>,
    alg: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

impl Jwk {
    fn into_key(self) -> Result<Key, &'static str> {
        if self.use_.as_deref().is_some_and(|u| u != "sig") {
            return Err("use is not \"sig\"");
        }
        if self
            .key_ops
            .as_ref()
            .is_some_and(|ops| !ops.iter().any(|op| op == "verify"))
        {
            return Err("key_ops lacks \"verify\"");
        }
        let (public, fits) = match (self.kty.as_deref(), self.crv.as_deref()) {
            (Some("RSA"), _) => {
                let n = strip_zeros(decode(self.n.as_deref())?);
                let e = strip_zeros(decode(self.e.as_deref())?);
                match bit_length(&n) {
                    bits if bits < RSA_MIN_BITS => return Err("RSA modulus under 2048 bits"),
                    bits if bits > RSA_MAX_BITS => return Err("RSA modulus over 8192 bits"),
                    _ => {}
                }
                if e.len() > 4 || bit_length(&e) < 2 || e.last().is_none_or(|b| b & 1 == 0) {
                    return Err("RSA exponent not odd, or not of 3 to 32 bits");
                }
                let public = Public::Rsa {
                    n: n.into(),
                    e: e.into(),
                };
                (public, AlgorithmSet::of(&[Algorithm::Rs256, Algorithm::Ps256]))
            }
            (Some("EC"), Some("P-256")) => {
                let x: [u8; 32] = fixed(decode(self.x.as_deref())?)?;
                let y: [u8; 32] = fixed(decode(self.y.as_deref())?)?;
                let mut point = Box::new([0x04; 65]);
                point[1..33].copy_from_slice(&x);
                point[33..].copy_from_slice(&y);
                (Public::P256(point), AlgorithmSet::of(&[Algorithm::Es256]))
            }
            (Some("OKP"), Some("Ed25519")) => {
                let x = fixed(decode(self.x.as_deref())?)?;
                (Public::Ed25519(x), AlgorithmSet::of(&[Algorithm::EdDsa]))
            }
            (Some("EC" | "OKP"), _) => return Err("unsupported curve"),
            (Some(_), _) => return Err("unsupported key type"),
            (None, _) => return Err("no kty"),
        };
        let algorithms = match self.alg.as_deref() {
            None => fits,
            Some(alg) => match Algorithm::from_name(alg) {
                Some(a) if fits.contains(a) => AlgorithmSet::of(&[a]),
                Some(_) => return Err("alg does not fit the key type"),
                None => return Err("unsupported alg"),
            },
        };
        Ok(Key {
            kid: self.kid.map(String::into_boxed_str),
            algorithms,
            public,
        })
    }
}

fn decode(member: Option<&str>) -> Result<Vec<u8>, &'static str> {
    let text = member.ok_or("a key member is missing")?;
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| "a key member is not base64url")
}

fn fixed<const N: usize>(bytes: Vec<u8>) -> Result<[u8; N], &'static str> {
    bytes.try_into().map_err(|_| "a key member has the wrong length")
}

fn strip_zeros(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|&&b| b == 0).count();
    bytes.drain(..zeros);
    bytes
}

/// The bit length of a big-endian number without leading zero bytes.
fn bit_length(be: &[u8]) -> usize {
    match be.first() {
        None => 0,
        Some(&top) => (be.len() - 1) * 8 + (8 - top.leading_zeros() as usize),
    }
}
