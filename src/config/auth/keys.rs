//! The keys of `[auth]`, `[auth.resource_metadata]` and `[[auth.tool]]`/`[[auth.method]]`,
//! declared: each one's name and meaning, and for a key without a default what leaving it out
//! means and an example, as the reference and the example config print them. Reading and
//! checking them is the section's (`super`).

use crate::config::reader::{key, Key};

// `[auth]`, in the order the section reads them.
pub(super) const MODE: Key = key(
    "mode",
    "`strict`: every request but the public paths needs a valid token; `off`: none is checked \
     (the section present turns auth on).",
);

pub(super) const ISSUER: Key =
    key("issuer", "The exact `iss` of the access tokens accepted.").example("https://idp.example.com");

pub(super) const AUDIENCES: Key = key(
    "audiences",
    "`aud` values accepted: a token must name one of them (RFC 8707), else it was minted for another resource.",
)
.unset("the resource's URL (`resource_metadata.resource`)")
.example(r#"["https://mcp.example.com/mcp"]"#);

pub(super) const JWKS_URI: Key = key(
    "jwks_uri",
    "Where the issuer's keys (JWKS) are fetched: `https://`, or `http://` on a loopback address.",
)
.unset("found in the issuer's metadata (`/.well-known/oauth-authorization-server`, then openid-configuration)")
.example("https://idp.example.com/jwks");

pub(super) const JWKS_FILE: Key = key(
    "jwks_file",
    "The issuer's keys from a file instead (air-gapped fleets), read again at each reload.",
)
.unset("fetched (`jwks_uri`)")
.example("jwks.json");

pub(super) const ALGORITHMS: Key = key("algorithms", "Signature algorithms accepted.");

pub(super) const LEEWAY: Key = key("leeway", "Clock skew allowed on a token's `exp`, `nbf` and `iat`.");

pub(super) const JWKS_REFRESH_MIN: Key = key(
    "jwks_refresh_min",
    "The keys are fetched again after the issuer's `Cache-Control: max-age`, but never sooner than this.",
);

pub(super) const JWKS_REFRESH_MAX: Key = key(
    "jwks_refresh_max",
    "The keys are fetched again at least this often, whatever the issuer's `max-age`.",
);

pub(super) const JWKS_KID_REFETCH: Key = key(
    "jwks_kid_refetch",
    "A token naming a key the set lacks fetches the keys again at once, at most once per this long.",
);

pub(super) const JWKS_TIMEOUT: Key = key("jwks_timeout", "A key fetch (or discovery) that takes longer fails.");

pub(super) const TOKEN_CACHE: Key = key(
    "token_cache",
    "Verified access tokens remembered (about 1 KiB each) until they expire or the keys change, so a \
     token's signature is checked once, not on every request; 0: none.",
);

pub(super) const REQUIRED_SCOPES: Key = key("required_scopes", "Scopes every request needs.");

pub(super) const PUBLIC_PATHS: Key = key(
    "public_paths",
    "Request paths served without a token: exact, or a prefix ending in `*` (the metadata is always public).",
);

pub(super) const FORWARD: Key = key(
    "forward",
    "`strip`: backends never see the client's token; `passthrough`: it is sent on, for servers that validate it again.",
);

pub(super) const IDENTITY_HEADERS: Key = key(
    "identity_headers",
    "Send the verified identity to backends in `X-Mcp-Auth-Subject`, `-Client-Id`, `-Issuer` and \
     `-Scopes` (any such header a client sent is removed).",
);

pub(super) const ALLOWED_ORIGINS: Key = key(
    "allowed_origins",
    "`Origin` values accepted; a request with another is refused 403 `origin_not_allowed` (DNS rebinding).",
)
.unset("the resource's origin only")
.example(r#"["https://app.example.com"]"#);

// `[auth.resource_metadata]`.
pub(super) const METADATA_RESOURCE: Key = key(
    "resource",
    "The URL clients dial (the MCP endpoint, e.g. `https://mcp.example.com/mcp`), configured: never \
     guessed from a `Host` header. Required when auth is on.",
)
.unset("auth cannot be on")
.example("https://mcp.example.com/mcp");

pub(super) const METADATA_AUTHORIZATION_SERVERS: Key =
    key("authorization_servers", "The authorization servers the metadata names.")
        .unset("the issuer")
        .example(r#"["https://idp.example.com"]"#);

pub(super) const METADATA_SCOPES_SUPPORTED: Key = key("scopes_supported", "The scopes the metadata lists.")
    .unset("every scope the config names")
    .example(r#"["mcp:tools"]"#);

// One `[[auth.tool]]` or `[[auth.method]]`.
pub(super) const SCOPED_NAME: Key = key(
    "name",
    "The tool (or JSON-RPC method) name, as the request body gives it.",
)
.example("transfer-funds");

pub(super) const SCOPED_SCOPES: Key =
    key("scopes", "The scopes it needs, beside `required_scopes`.").example(r#"["payments:write"]"#);
