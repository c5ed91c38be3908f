//! The JWS signature algorithms `[auth] algorithms` may name and the router verifies (RFC 7518 §3, RFC 8037): RS256, PS256,
//! ES256 and EdDSA (Ed25519), all with the issuer's public keys, all by `ring`. `none` and the
//! HMAC algorithms (HS256…) are never accepted: an HMAC "verified" with a public key as its
//! secret is the classic key-confusion forgery (docs/src/authorization.md, "Algorithms").

use std::fmt;

/// One signature algorithm the router can verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256 (an RSA key).
    Rs256,
    /// RSASSA-PSS with SHA-256 and MGF1 with SHA-256 (an RSA key).
    Ps256,
    /// ECDSA on P-256 with SHA-256, `r || s` (an EC key, `crv` P-256).
    Es256,
    /// Ed25519 (an OKP key, `crv` Ed25519).
    EdDsa,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [Algorithm::Rs256, Algorithm::Ps256, Algorithm::Es256, Algorithm::EdDsa];

    /// Its JOSE name, as `alg` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Rs256 => "RS256",
            Algorithm::Ps256 => "PS256",
            Algorithm::Es256 => "ES256",
            Algorithm::EdDsa => "EdDSA",
        }
    }

    /// The algorithm `alg` names (case-sensitive, RFC 7515 §4.1.1), if the router verifies it.
    pub fn from_name(alg: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == alg)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of algorithms: the ones a policy allows, the ones a key may verify.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AlgorithmSet(u8);

impl AlgorithmSet {
    pub const EMPTY: AlgorithmSet = AlgorithmSet(0);
    pub const ALL: AlgorithmSet = AlgorithmSet(0b1111);

    pub fn of(algorithms: &[Algorithm]) -> AlgorithmSet {
        algorithms.iter().fold(AlgorithmSet::EMPTY, |set, &a| set.with(a))
    }

    /// The algorithms named (an `[auth] algorithms` list): each must be one the router
    /// verifies; the error says why a name is refused.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<AlgorithmSet, String> {
        let mut set = AlgorithmSet::EMPTY;
        for name in names {
            let name = name.as_ref();
            match Algorithm::from_name(name) {
                Some(a) => set = set.with(a),
                None if name.eq_ignore_ascii_case("none") => {
                    return Err("\"none\" (an unsigned token) is never accepted".to_owned())
                }
                None if name.get(..2).is_some_and(|p| p.eq_ignore_ascii_case("HS")) => {
                    return Err(format!(
                        "{name:?} is an HMAC algorithm: the router verifies with the issuer's public keys only"
                    ))
                }
                None => {
                    return Err(format!(
                        "{name:?} is not an algorithm the router verifies (RS256, PS256, ES256, EdDSA)"
                    ))
                }
            }
        }
        Ok(set)
    }

    pub fn union(self, other: AlgorithmSet) -> AlgorithmSet {
        AlgorithmSet(self.0 | other.0)
    }

    pub fn with(self, a: Algorithm) -> AlgorithmSet {
        AlgorithmSet(self.0 | a.bit())
    }

    pub fn contains(self, a: Algorithm) -> bool {
        self.0 & a.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Algorithm> {
        Algorithm::ALL.into_iter().filter(move |&a| self.contains(a))
    }
}

impl fmt::Debug for AlgorithmSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}
