//! Bearer access tokens and key sets (`mrtr_router_fuzz::check_jwt_text`, `check_jwks`,
//! `check_jwt_claims`, `check_jwt_changes`). Input: the text checked as a token and as a JWKS
//! document; the same bytes, read as claims, a policy and a moment, make a signed token whose
//! verdict must be the model's, and, read as a subject and up to 16 byte changes, make an
//! accepted token of which each change must be refused (every bit of every byte is the proptest
//! property's job: here it would cost thousands of verifications per input).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use mrtr_router_fuzz::{check_jwks, check_jwt_changes, check_jwt_claims, check_jwt_text, Aud, JwtClaims};
use mrtr_router_fuzz::{JWT_AUDIENCE, JWT_ISSUER};

/// A name that is often the policy's own.
#[derive(Arbitrary, Debug)]
enum Name {
    Ours,
    Other(String),
}

impl Name {
    fn text(self, ours: &str) -> String {
        match self {
            Name::Ours => ours.to_owned(),
            Name::Other(s) => s,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Case {
    iss: Option<Name>,
    aud: Option<Result<Name, Vec<Name>>>,
    /// Offsets from `now`, in seconds.
    exp: Option<i16>,
    nbf: Option<i16>,
    iat: Option<i16>,
    sub: Option<String>,
    client_id: Option<String>,
    audiences: Vec<Name>,
    leeway: u8,
    now: u32,
    signer: u8,
    changes: Vec<(u16, u8)>,
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    check_jwt_text(data);
    check_jwks(data);
    let Ok(c) = Case::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let now = 1_700_000_000 + u64::from(c.now);
    let at = |offset: Option<i16>| offset.map(|o| now as i64 + i64::from(o));
    let mut audiences: Vec<String> = c.audiences.into_iter().take(4).map(|n| n.text(JWT_AUDIENCE)).collect();
    if audiences.is_empty() {
        audiences.push(JWT_AUDIENCE.to_owned());
    }
    let sub = c.sub.clone();
    let case = JwtClaims {
        iss: c.iss.map(|n| n.text(JWT_ISSUER)),
        aud: match c.aud {
            None => Aud::Absent,
            Some(Ok(one)) => Aud::One(one.text(JWT_AUDIENCE)),
            Some(Err(many)) => Aud::Many(many.into_iter().take(4).map(|n| n.text(JWT_AUDIENCE)).collect()),
        },
        exp: at(c.exp),
        nbf: at(c.nbf),
        iat: at(c.iat),
        sub: c.sub,
        client_id: c.client_id,
        audiences,
        leeway: u64::from(c.leeway),
        now,
        signer: usize::from(c.signer),
    };
    let _ = check_jwt_claims(&case);
    let sub = sub.filter(|s| !s.is_empty()).unwrap_or_else(|| "subject".to_owned());
    let changes: Vec<(usize, u8)> = c
        .changes
        .iter()
        .take(16)
        .map(|&(at, to)| (usize::from(at), to))
        .collect();
    let accepted = JwtClaims::accepted(usize::from(c.signer), &sub, 600);
    check_jwt_changes(&accepted.bearer(), Some(&changes));
});
