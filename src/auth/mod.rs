//! The router as an OAuth 2.1 resource server: the verification core of bearer access tokens,
//! pure code without I/O (docs/src/authorization.md says the rules; this folder implements
//! them). The request path, the `[auth]` config and the fetching of the issuer's keys build on
//! it:
//! - `jwks`      an issuer's JSON Web Key Set (RFC 7517) → an immutable [`KeySet`] by `kid`
//! - `jwt`       one compact JWS access token (RFC 7519, RFC 9068) checked against a
//!   [`Policy`] and a [`KeySet`] → [`Verified`] or an [`AuthFailure`]
//! - `scopes`    the granted [`Scopes`] and what an operation's required scopes lack, with
//!   scope hierarchies (`files` implies `files:write`)
//! - `issuer_keys` the issuer's key set in use, loaded from a file or fetched (one fetch at a
//!   time, shared by whoever waits for it), the last good set kept
//! - `fetch`     GETting the key set, or the issuer's metadata naming it, over HTTPS, bounded
//! - `refresh`   the loop that fetches the keys again as their `Cache-Control` says
//! - `cache`     access tokens already verified (bearers), so a signature is checked once per
//!   access token
//! - `resource`  this resource as `[auth]` describes it: the policy, the metadata, the scopes
//!   each operation needs
//! - `principal` who the caller is ([`Principal`]: issuer + subject) and its stable digest,
//!   the one sealed into routing tokens
//!
//! [`AUTH_RESULTS`] are the values of the `result` label of `mrtr_auth_total`; each failure
//! names its own with [`AuthFailure::result`].

mod cache;
mod fetch;
mod issuer_keys;
mod jwks;
mod jwt;
mod principal;
mod refresh;
mod resource;
mod scopes;

pub use crate::config::{Algorithm, AlgorithmSet};
pub use issuer_keys::{FetchOutcome, IssuerKeys, REFRESH_RESULTS};
pub use jwks::{Key, KeySet, MAX_JWKS_BYTES, MAX_KEYS};
pub use jwt::{AuthFailure, Policy, Verified, MAX_BEARER_BYTES};
pub use principal::{Caller, Principal};
pub use refresh::{keep_fresh, JwksConfig};
pub use resource::Resource;
pub use scopes::{is_valid_scope, InvalidScope, Scopes};

/// The values of the `result` label of `mrtr_auth_total`, every one a request can end with: `ok`
/// (verified and sufficient), `missing` (no bearer token), `invalid`, `expired`, `audience` (an
/// access token for another resource), `scope` (insufficient), `jwks_unavailable` (the issuer's
/// keys cannot be loaded), `origin` (an `Origin` not allowed), `principal` (a sealed handle
/// presented by another principal).
pub const AUTH_RESULTS: [&str; 9] = [
    "ok",
    "missing",
    "invalid",
    "expired",
    "audience",
    "scope",
    "jwks_unavailable",
    "origin",
    "principal",
];

#[cfg(test)]
#[path = "../../tests/fixtures/jwt/signer.rs"]
mod signer;

#[cfg(test)]
mod tests;
