//! `[auth]`: the router as the fleet's OAuth resource server (docs/src/authorization.md): the
//! issuer whose JWT access tokens it accepts, where that issuer's keys come from, the scopes
//! each operation needs, what it forwards to backends, and the Protected Resource Metadata it
//! serves. Absent, or `mode = "off"`: no request is checked.

//!
//! The keys are declared in `keys` (name, meaning, what leaving one out means); this file reads
//! them in their order and checks each value, the section's own checks in named steps, and puts
//! the sections together (`combine`).

mod keys;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use super::reader::{quoted, Key, Section, Text};
use super::reference::Kind;
use super::{defaults, Algorithm, AlgorithmSet, ConfigError};

/// `[auth]` with `mode = "strict"`: every request outside `public_paths` needs a valid token.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// The exact `iss` of accepted tokens.
    pub issuer: String,
    /// Accepted `aud` values: a token must name one (RFC 8707).
    pub audiences: Vec<String>,
    pub jwks: JwksSource,
    /// Signature algorithms accepted (never `none`, never an HMAC one).
    pub algorithms: AlgorithmSet,
    /// Clock skew allowed on `exp`, `nbf` and `iat`.
    pub leeway: Duration,
    /// How often the key set is fetched again: `Cache-Control: max-age` within these bounds.
    pub jwks_refresh_min: Duration,
    pub jwks_refresh_max: Duration,
    /// The shortest time between two fetches made because a token named an unknown key.
    pub jwks_kid_refetch: Duration,
    /// A fetch (discovery included) that takes longer fails.
    pub jwks_timeout: Duration,
    /// Verified tokens remembered, so a token's signature is checked once, not per request.
    pub token_cache: usize,
    /// Scopes every request needs.
    pub required_scopes: Vec<String>,
    /// `[[auth.tool]]`: the scopes a `tools/call` of each tool needs (beside the required ones).
    pub tools: Vec<Scoped>,
    /// `[[auth.method]]`: the scopes each JSON-RPC method needs.
    pub methods: Vec<Scoped>,
    /// Request paths served without a token: exact, or a prefix when ending in `*`.
    pub public_paths: Vec<String>,
    pub forward: Forward,
    /// The verified identity goes to backends in headers the router sets itself.
    pub identity_headers: bool,
    /// `Origin` values accepted (a request with another is refused 403).
    pub allowed_origins: Vec<String>,
    pub resource: ResourceMetadata,
}

/// Where the issuer's JSON Web Key Set comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum JwksSource {
    /// Fetched from this URL (https, or http on a loopback address).
    Uri(http::Uri),
    /// Found in the issuer's metadata (`/.well-known/oauth-authorization-server`, then
    /// `/.well-known/openid-configuration`), then fetched.
    Discovered,
    /// Read from this file (at load and at every reload).
    File { path: PathBuf, contents: Vec<u8> },
}

/// What the router does with the client's `Authorization` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// Removed: backends never see the client's token (the MCP security practices forbid
    /// passing it through).
    Strip,
    /// Sent on, for fleets whose servers validate the token again.
    Passthrough,
}

/// A tool or method and the scopes it needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Scoped {
    pub name: String,
    pub scopes: Vec<String>,
}

/// `[auth.resource_metadata]`: the Protected Resource Metadata document (RFC 9728).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceMetadata {
    /// The URL clients dial (`https://mcp.example.com/mcp`): the document's `resource`.
    pub resource: String,
    /// The resource's origin (`https://mcp.example.com`).
    pub origin: String,
    /// The resource's path (`/mcp`): the document is also served at
    /// `/.well-known/oauth-protected-resource/mcp`.
    pub path: String,
    pub authorization_servers: Vec<String>,
    pub scopes_supported: Vec<String>,
}

impl ResourceMetadata {
    /// Where the document is served, as a URL for `WWW-Authenticate`'s `resource_metadata`.
    pub fn url(&self) -> String {
        format!(
            "{}/.well-known/oauth-protected-resource{}",
            self.origin,
            self.path.trim_end_matches('/')
        )
    }
}

/// What `[auth]` says, read every time; `[auth.resource_metadata]`, `[[auth.tool]]` and
/// `[[auth.method]]` are read after, then [`combine`]d.
pub(super) struct AuthSection {
    on: bool,
    issuer: String,
    audiences: Option<Vec<String>>,
    jwks: JwksSource,
    algorithms: AlgorithmSet,
    leeway: Duration,
    jwks_refresh_min: Duration,
    jwks_refresh_max: Duration,
    jwks_kid_refetch: Duration,
    jwks_timeout: Duration,
    token_cache: usize,
    required_scopes: Vec<String>,
    public_paths: Vec<String>,
    forward: Forward,
    identity_headers: bool,
    allowed_origins: Option<Vec<String>>,
}

impl AuthSection {
    /// Whether auth is on (`[auth]` present, `mode = "strict"`).
    pub(super) fn on(&self) -> bool {
        self.on
    }
}

/// `[auth]`: its keys in the order the reference lists them.
pub(super) fn auth(mut s: Section) -> Result<AuthSection, ConfigError> {
    let present = s.present();
    let on = s.choice(keys::MODE, "strict", &[("strict", true), ("off", false)])? && present;
    let issuer = issuer(&mut s, on)?;
    let audiences = list(&mut s, keys::AUDIENCES, Kind::Url)?;
    let jwks = jwks_source(&mut s, on)?;
    let algorithms = algorithms(&mut s)?;
    let leeway = s.duration(keys::LEEWAY, defaults::AUTH_LEEWAY)?;
    let (jwks_refresh_min, jwks_refresh_max) = refresh_bounds(&mut s)?;
    let jwks_kid_refetch = s.duration(keys::JWKS_KID_REFETCH, defaults::JWKS_KID_REFETCH)?;
    let jwks_timeout = s.duration(keys::JWKS_TIMEOUT, defaults::JWKS_TIMEOUT)?;
    let token_cache = s.int(keys::TOKEN_CACHE, defaults::AUTH_TOKEN_CACHE, 0..=1_000_000)? as usize;
    let required_scopes = scopes(&mut s, keys::REQUIRED_SCOPES)?;
    let public_paths = public_paths(&mut s)?;
    let forward = s.choice(
        keys::FORWARD,
        "strip",
        &[("strip", Forward::Strip), ("passthrough", Forward::Passthrough)],
    )?;
    let identity_headers = s.bool(keys::IDENTITY_HEADERS, true)?;
    let allowed_origins = list(&mut s, keys::ALLOWED_ORIGINS, Kind::String)?;
    s.nested(&["resource_metadata", "tool", "method"]);
    s.finish(false)?;
    Ok(AuthSection {
        on,
        issuer,
        audiences,
        jwks,
        algorithms,
        leeway,
        jwks_refresh_min,
        jwks_refresh_max,
        jwks_kid_refetch,
        jwks_timeout,
        token_cache,
        required_scopes,
        public_paths,
        forward,
        identity_headers,
        allowed_origins,
    })
}

/// `issuer`: required when auth is on; printed then.
fn issuer(s: &mut Section, on: bool) -> Result<String, ConfigError> {
    let issuer = match on {
        true => s.required(keys::ISSUER, Kind::Url)?,
        false => s
            .text(keys::ISSUER, Kind::Url)?
            .unwrap_or(Text { value: "", span: None }),
    };
    let issuer_text = issuer.value.trim().to_string();
    if on {
        s.print("issuer", quoted(&issuer_text));
    }
    Ok(issuer_text)
}

/// `jwks_uri` or `jwks_file` (not both), else discovered from the issuer's metadata. A file is
/// read now, and must hold a key set when auth is on.
fn jwks_source(s: &mut Section, on: bool) -> Result<JwksSource, ConfigError> {
    let uri = s.text(keys::JWKS_URI, Kind::Url)?;
    let file = s.text(keys::JWKS_FILE, Kind::Path)?;
    Ok(match (uri, file) {
        (Some(u), Some(_)) => return s.err(u.span, "auth.jwks_uri and auth.jwks_file: set one, not both"),
        (Some(u), None) => {
            let uri = fetch_url(u.value).or_else(|e| s.err(u.span.clone(), format!("auth.jwks_uri: {e}")))?;
            s.print("jwks_uri", quoted(u.value.trim()));
            JwksSource::Uri(uri)
        }
        (None, Some(f)) => {
            let path = s.doc().resolve(f.value);
            let contents = match std::fs::read(&path) {
                Ok(c) => c,
                Err(e) if on => return s.err(f.span, format!("auth.jwks_file: cannot read {}: {e}", path.display())),
                Err(_) => Vec::new(),
            };
            if on && !looks_like_jwks(&contents) {
                return s.err(
                    f.span,
                    format!("auth.jwks_file: {} is not a JSON Web Key Set", path.display()),
                );
            }
            s.print("jwks_file", quoted(&path.to_string_lossy()));
            JwksSource::File { path, contents }
        }
        (None, None) => JwksSource::Discovered,
    })
}

/// `algorithms`: each one a JWS algorithm the router verifies, at least one.
fn algorithms(s: &mut Section) -> Result<AlgorithmSet, ConfigError> {
    let (algorithm_texts, span) =
        s.strings_or(keys::ALGORITHMS, Kind::String, &["RS256", "PS256", "ES256", "EdDSA"])?;
    let mut algorithms = AlgorithmSet::EMPTY;
    for t in &algorithm_texts {
        match AlgorithmSet::from_names(&[&t.value]) {
            Ok(one) => algorithms = algorithms.union(one),
            Err(why) => return s.err(t.span.clone(), format!("auth.algorithms: {why}")),
        }
    }
    if algorithms.is_empty() {
        return s.err(span, "auth.algorithms: at least one");
    }
    s.print_strings("algorithms", algorithms.iter().map(Algorithm::name));
    Ok(algorithms)
}

/// `jwks_refresh_min` and `jwks_refresh_max`, the bounds on a key set's `max-age`, in order.
fn refresh_bounds(s: &mut Section) -> Result<(Duration, Duration), ConfigError> {
    let jwks_refresh_min = s.duration(keys::JWKS_REFRESH_MIN, defaults::JWKS_REFRESH_MIN)?;
    let jwks_refresh_max = s.duration(keys::JWKS_REFRESH_MAX, defaults::JWKS_REFRESH_MAX)?;
    if jwks_refresh_max < jwks_refresh_min {
        let span = s.span();
        return s.err(span, "auth.jwks_refresh_max: must be at least auth.jwks_refresh_min");
    }
    Ok((jwks_refresh_min, jwks_refresh_max))
}

/// `public_paths`: each an absolute path, or a prefix ending in `*`.
fn public_paths(s: &mut Section) -> Result<Vec<String>, ConfigError> {
    let (paths, _) = s.strings_or(keys::PUBLIC_PATHS, Kind::String, &[])?;
    let mut public_paths = Vec::new();
    for p in paths {
        if !p.value.starts_with('/') {
            return s.err(p.span, format!("auth.public_paths: {:?} must start with `/`", p.value));
        }
        public_paths.push(p.value.to_string());
    }
    s.print_strings("public_paths", public_paths.iter().map(String::as_str));
    Ok(public_paths)
}

/// `[auth.resource_metadata]`.
pub(super) struct MetadataSection {
    resource: Option<(String, Option<Range<usize>>)>,
    authorization_servers: Option<Vec<String>>,
    scopes_supported: Option<Vec<String>>,
}

/// `[auth.resource_metadata]`: `resource` required when auth is on.
pub(super) fn resource_metadata(mut s: Section, on: bool) -> Result<MetadataSection, ConfigError> {
    let resource = match on {
        true => Some(s.required(keys::METADATA_RESOURCE, Kind::Url)?),
        false => s.text(keys::METADATA_RESOURCE, Kind::Url)?,
    };
    let resource = resource.map(|t| (t.value.trim().to_string(), t.span));
    if let Some((r, _)) = &resource {
        s.print("resource", quoted(r));
    }
    let authorization_servers = list(&mut s, keys::METADATA_AUTHORIZATION_SERVERS, Kind::Url)?;
    let scopes_supported = list(&mut s, keys::METADATA_SCOPES_SUPPORTED, Kind::String)?;
    s.finish(false)?;
    Ok(MetadataSection {
        resource,
        authorization_servers,
        scopes_supported,
    })
}

/// One `[[auth.tool]]` or `[[auth.method]]`.
pub(super) fn scoped(mut s: Section, what: &str, seen: &[Scoped]) -> Result<Scoped, ConfigError> {
    let name_text = s.required(keys::SCOPED_NAME, Kind::String)?;
    if seen.iter().any(|t| t.name == name_text.value) {
        return s.err(
            name_text.span,
            format!("auth.{what}: {:?} is listed twice", name_text.value),
        );
    }
    let name = name_text.value.to_string();
    s.print("name", quoted(&name));
    let scopes = scopes(&mut s, keys::SCOPED_SCOPES)?;
    s.finish(false)?;
    Ok(Scoped { name, scopes })
}

/// Puts the sections together: `None` when auth is off.
pub(super) fn combine(
    section: AuthSection,
    metadata: MetadataSection,
    tools: Vec<Scoped>,
    methods: Vec<Scoped>,
    err: impl Fn(Option<std::ops::Range<usize>>, String) -> ConfigError,
) -> Result<Option<AuthConfig>, ConfigError> {
    if !section.on {
        return Ok(None);
    }
    let (resource, span) = metadata.resource.unwrap_or_default();
    let uri: http::Uri = resource.parse().map_err(|e| {
        err(
            span.clone(),
            format!("auth.resource_metadata.resource: {resource:?} is not a URL ({e})"),
        )
    })?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(err(
            span,
            format!("auth.resource_metadata.resource: {resource:?} needs a scheme and a host"),
        ));
    };
    if uri.query().is_some() || resource.contains('#') {
        return Err(err(
            span,
            "auth.resource_metadata.resource: no query or fragment (RFC 9728)".into(),
        ));
    }
    let origin = format!("{scheme}://{authority}");
    let path = match uri.path() {
        "/" => String::new(),
        p => p.to_string(),
    };
    let mut scopes_supported = metadata.scopes_supported.unwrap_or_else(|| {
        let all = section
            .required_scopes
            .iter()
            .chain(tools.iter().chain(&methods).flat_map(|t| &t.scopes));
        let mut all: Vec<String> = all.cloned().collect();
        all.sort();
        all.dedup();
        all
    });
    scopes_supported.dedup();
    Ok(Some(AuthConfig {
        audiences: section.audiences.unwrap_or_else(|| vec![resource.clone()]),
        allowed_origins: section.allowed_origins.unwrap_or_else(|| vec![origin.clone()]),
        resource: ResourceMetadata {
            authorization_servers: metadata
                .authorization_servers
                .unwrap_or_else(|| vec![section.issuer.clone()]),
            scopes_supported,
            resource,
            origin,
            path,
        },
        issuer: section.issuer,
        jwks: section.jwks,
        algorithms: section.algorithms,
        leeway: section.leeway,
        jwks_refresh_min: section.jwks_refresh_min,
        jwks_refresh_max: section.jwks_refresh_max,
        jwks_kid_refetch: section.jwks_kid_refetch,
        jwks_timeout: section.jwks_timeout,
        token_cache: section.token_cache,
        required_scopes: section.required_scopes,
        tools,
        methods,
        public_paths: section.public_paths,
        forward: section.forward,
        identity_headers: section.identity_headers,
    }))
}

/// An optional list of strings, printed when set.
fn list(s: &mut Section, key: Key, kind: Kind) -> Result<Option<Vec<String>>, ConfigError> {
    let Some((texts, _)) = s.strings(key, kind)? else {
        return Ok(None);
    };
    let values: Vec<String> = texts.iter().map(|t| t.value.trim().to_string()).collect();
    s.print_strings(key.name(), values.iter().map(String::as_str));
    Ok(Some(values))
}

/// A list of scopes (RFC 6749: printable ASCII but space, `"` and `\`), default none, printed.
fn scopes(s: &mut Section, key: Key) -> Result<Vec<String>, ConfigError> {
    let (texts, _) = s.strings_or(key, Kind::String, &[])?;
    let mut out: Vec<String> = Vec::new();
    for t in texts {
        let valid = !t.value.is_empty() && t.value.bytes().all(|b| b > 0x20 && b < 0x7f && b != b'"' && b != b'\\');
        if !valid {
            return s.err(
                t.span,
                format!("{}: {:?} is not a scope", s.key_name(key.name()), t.value),
            );
        }
        if !out.iter().any(|o| o == t.value) {
            out.push(t.value.to_string());
        }
    }
    s.print_strings(key.name(), out.iter().map(String::as_str));
    Ok(out)
}

/// A URL the router fetches keys or metadata from: `https://`, or `http://` to a loopback
/// address (a sidecar, a test).
pub fn fetch_url(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text
        .trim()
        .parse()
        .map_err(|e| format!("{text:?} is not a URL ({e})"))?;
    let host = uri.host().ok_or_else(|| format!("{text:?} has no host"))?;
    match uri.scheme_str() {
        Some("https") => Ok(uri),
        Some("http") if is_loopback(host) => Ok(uri),
        Some("http") => Err(format!("{text:?}: http:// only to a loopback address; use https://")),
        _ => Err(format!("{text:?}: needs https://")),
    }
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether `contents` is a JSON object with a `keys` array (the keys themselves are read when
/// the router builds its key set).
fn looks_like_jwks(contents: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Set {
        #[allow(dead_code)]
        keys: Vec<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Set>(contents).is_ok()
}
