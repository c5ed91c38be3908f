//! Who a verified caller is: its issuer and subject, and the fixed-size digest of the two that
//! sealed handles carry (docs/src/authorization.md, "Handles bound to their principal"; docs/src/tokens.md).
//!
//! The digest names the principal, never the access token: a step-up or a refresh issues a new
//! access token (other scopes, another `jti`, another expiry) for the same principal, and the calls
//! it holds stay its own.
//!
//! ```text
//! digest = SHA-256( "mrtr-principal-v1" 0x00 | len(issuer) u64 | issuer | len(subject) u64 | subject
//!                   [| 0x01 when the subject is a client id] )
//! ```
//!
//! (lengths big-endian, in bytes of UTF-8). The lengths keep `("ab", "c")` and `("a", "bc")` apart.
//! An access token without `sub` names its client as the subject; the trailing byte keeps that
//! client apart from a user whose `sub` happens to be the same string. The format is stable:
//! changing it makes every sealed handle in flight refused as another principal's, so a new one
//! takes a new tag.

use ring::digest::{Context, SHA256};

/// The tag that starts every digest (and versions its format).
const DIGEST_TAG: &[u8] = b"mrtr-principal-v1\0";

/// A caller as the issuer knows it: `iss` and `sub` (or, without `sub`, `client_id`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub issuer: String,
    pub subject: String,
    /// The subject is the client's id: the access token had no `sub` (a client acting for itself).
    pub is_client: bool,
}

impl Principal {
    pub fn new(issuer: impl Into<String>, subject: impl Into<String>) -> Principal {
        Principal {
            issuer: issuer.into(),
            subject: subject.into(),
            is_client: false,
        }
    }

    /// A client acting for itself: an access token without `sub`, named by its `client_id`.
    pub fn client(issuer: impl Into<String>, client_id: impl Into<String>) -> Principal {
        Principal {
            is_client: true,
            ..Principal::new(issuer, client_id)
        }
    }

    /// The stable 32-byte digest of issuer and subject (the module doc has its format).
    pub fn digest(&self) -> [u8; 32] {
        let mut ctx = Context::new(&SHA256);
        ctx.update(DIGEST_TAG);
        for part in [&self.issuer, &self.subject] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part.as_bytes());
        }
        if self.is_client {
            ctx.update(&[1]);
        }
        let mut out = [0; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    /// What sealed handles carry of it: the digest's first 16 bytes (a `token::PrincipalTag`).
    pub fn tag(&self) -> [u8; 16] {
        let mut tag = [0; 16];
        tag.copy_from_slice(&self.digest()[..16]);
        tag
    }
}

/// A caller whose access token verified, with what every request of that access token needs from
/// it, made once per access token (`cache`): its principal's tag, and the identity headers backends
/// receive.
pub struct Caller {
    pub verified: super::Verified,
    /// What the handles sealed for it carry (a `token::PrincipalTag`).
    pub tag: [u8; 16],
    /// `X-Mcp-Auth-Subject`, `-Client-Id`, `-Issuer`, `-Scopes` (docs/src/authorization.md,
    /// "What backends receive"); a value that is no valid header value is left out.
    pub identity: [(&'static str, Option<http::HeaderValue>); 4],
}

/// The headers that carry the verified identity to backends.
pub const IDENTITY_HEADERS: [&str; 4] = [
    "x-mcp-auth-subject",
    "x-mcp-auth-client-id",
    "x-mcp-auth-issuer",
    "x-mcp-auth-scopes",
];

impl Caller {
    pub fn new(verified: super::Verified) -> Caller {
        let value = |v: &str| http::HeaderValue::from_str(v).ok();
        let scopes: Vec<&str> = verified.scopes.iter().collect();
        let identity = [
            (IDENTITY_HEADERS[0], value(&verified.subject)),
            (IDENTITY_HEADERS[1], verified.client_id.as_deref().and_then(value)),
            (IDENTITY_HEADERS[2], value(&verified.issuer)),
            (IDENTITY_HEADERS[3], value(&scopes.join(" "))),
        ];
        Caller {
            tag: verified.principal().tag(),
            verified,
            identity,
        }
    }
}
