//! `[auth]`: the router as the fleet's OAuth resource server (docs/src/authorization.md): the
//! issuer whose JWT access tokens it accepts, where that issuer's keys come from, the scopes
//! each operation needs, what it forwards to backends, and the Protected Resource Metadata it
//! serves. Absent, or `mode = "off"`: no request is checked.

use std::path::PathBuf;
use std::time::Duration;

use super::reader::{key, quoted, Section, Text};
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

/// The keys of `[auth]`, read every time; the section reader of `[auth.resource_metadata]`,
/// `[[auth.tool]]` and `[[auth.method]]` comes after. `None`: auth off.
pub(super) struct AuthKeys {
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

impl AuthKeys {
    /// Whether auth is on (`[auth]` present, `mode = "strict"`).
    pub(super) fn on(&self) -> bool {
        self.on
    }
}

pub(super) fn auth(mut s: Section) -> Result<AuthKeys, ConfigError> {
    let present = s.present();
    let mode = key(
        "mode",
        "`strict`: every request but the public paths needs a valid token; `off`: none is checked \
         (the section present turns auth on).",
    );
    let issuer = key("issuer", "The exact `iss` of the access tokens accepted.").example("https://idp.example.com");
    let audiences = key(
        "audiences",
        "`aud` values accepted: a token must name one of them (RFC 8707), else it was minted for another resource.",
    )
    .unset("the resource's URL (`resource_metadata.resource`)")
    .example(r#"["https://mcp.example.com/mcp"]"#);
    let jwks_uri = key(
        "jwks_uri",
        "Where the issuer's keys (JWKS) are fetched: `https://`, or `http://` on a loopback address.",
    )
    .unset("found in the issuer's metadata (`/.well-known/oauth-authorization-server`, then openid-configuration)")
    .example("https://idp.example.com/jwks");
    let jwks_file = key(
        "jwks_file",
        "The issuer's keys from a file instead (air-gapped fleets), read again at each reload.",
    )
    .unset("fetched (`jwks_uri`)")
    .example("jwks.json");
    let algorithms = key("algorithms", "Signature algorithms accepted.");
    let leeway = key("leeway", "Clock skew allowed on a token's `exp`, `nbf` and `iat`.");
    let refresh_min = key(
        "jwks_refresh_min",
        "The keys are fetched again after the issuer's `Cache-Control: max-age`, but never sooner than this.",
    );
    let refresh_max = key(
        "jwks_refresh_max",
        "The keys are fetched again at least this often, whatever the issuer's `max-age`.",
    );
    let kid_refetch = key(
        "jwks_kid_refetch",
        "A token naming a key the set lacks fetches the keys again at once, at most once per this long.",
    );
    let jwks_timeout = key("jwks_timeout", "A key fetch (or discovery) that takes longer fails.");
    let token_cache = key(
        "token_cache",
        "Verified access tokens remembered (about 1 KiB each) until they expire or the keys change, so a \
         token's signature is checked once, not on every request; 0: none.",
    );
    let required_scopes = key("required_scopes", "Scopes every request needs.");
    let public_paths = key(
        "public_paths",
        "Request paths served without a token: exact, or a prefix ending in `*` (the metadata is always public).",
    );
    let forward = key(
        "forward",
        "`strip`: backends never see the client's token; `passthrough`: it is sent on, for servers that validate it again.",
    );
    let identity_headers = key(
        "identity_headers",
        "Send the verified identity to backends in `X-Mcp-Auth-Subject`, `-Client-Id`, `-Issuer` and \
         `-Scopes` (any such header a client sent is removed).",
    );
    let allowed_origins = key(
        "allowed_origins",
        "`Origin` values accepted; a request with another is refused 403 `origin_not_allowed` (DNS rebinding).",
    )
    .unset("the resource's origin only")
    .example(r#"["https://app.example.com"]"#);

    let on = s.choice(mode, "strict", &[("strict", true), ("off", false)])? && present;
    let issuer = match on {
        true => s.required(issuer, Kind::Url)?,
        false => s.text(issuer, Kind::Url)?.unwrap_or(Text { value: "", span: None }),
    };
    let issuer_text = issuer.value.trim().to_string();
    if on {
        s.print("issuer", quoted(&issuer_text));
    }
    let audiences = list(&mut s, audiences, Kind::Url)?;
    let uri = s.text(jwks_uri, Kind::Url)?;
    let file = s.text(jwks_file, Kind::Path)?;
    let jwks = match (uri, file) {
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
    };
    let (algorithm_texts, span) = s.strings_or(algorithms, Kind::String, &["RS256", "PS256", "ES256", "EdDSA"])?;
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
    let leeway = s.duration(leeway, defaults::AUTH_LEEWAY)?;
    let jwks_refresh_min = s.duration(refresh_min, defaults::JWKS_REFRESH_MIN)?;
    let jwks_refresh_max = s.duration(refresh_max, defaults::JWKS_REFRESH_MAX)?;
    if jwks_refresh_max < jwks_refresh_min {
        let span = s.span();
        return s.err(span, "auth.jwks_refresh_max: must be at least auth.jwks_refresh_min");
    }
    let jwks_kid_refetch = s.duration(kid_refetch, defaults::JWKS_KID_REFETCH)?;
    let jwks_timeout = s.duration(jwks_timeout, defaults::JWKS_TIMEOUT)?;
    let token_cache = s.int(token_cache, defaults::AUTH_TOKEN_CACHE, 0..=1_000_000)? as usize;
    let required_scopes = scopes(&mut s, required_scopes)?;
    let (paths, _) = s.strings_or(public_paths, Kind::String, &[])?;
    let mut public_paths = Vec::new();
    for p in paths {
        if !p.value.starts_with('/') {
            return s.err(p.span, format!("auth.public_paths: {:?} must start with `/`", p.value));
        }
        public_paths.push(p.value.to_string());
    }
    s.print_strings("public_paths", public_paths.iter().map(String::as_str));
    let forward = s.choice(
        forward,
        "strip",
        &[("strip", Forward::Strip), ("passthrough", Forward::Passthrough)],
    )?;
    let identity_headers = s.bool(identity_headers, true)?;
    let allowed_origins = list(&mut s, allowed_origins, Kind::String)?;
    s.nested(&["resource_metadata", "tool", "method"]);
    s.finish(false)?;
    Ok(AuthKeys {
        on,
        issuer: issuer_text,
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

/// `[auth.resource_metadata]`.
pub(super) struct MetadataKeys {
    resource: Option<(String, Option<std::ops::Range<usize>>)>,
    authorization_servers: Option<Vec<String>>,
    scopes_supported: Option<Vec<String>>,
}

pub(super) fn resource_metadata(mut s: Section, on: bool) -> Result<MetadataKeys, ConfigError> {
    let resource = key(
        "resource",
        "The URL clients dial (the MCP endpoint, e.g. `https://mcp.example.com/mcp`), configured: never \
         guessed from a `Host` header. Required when auth is on.",
    )
    .unset("auth cannot be on")
    .example("https://mcp.example.com/mcp");
    let servers = key("authorization_servers", "The authorization servers the metadata names.")
        .unset("the issuer")
        .example(r#"["https://idp.example.com"]"#);
    let supported = key("scopes_supported", "The scopes the metadata lists.")
        .unset("every scope the config names")
        .example(r#"["mcp:tools"]"#);
    let resource = match on {
        true => Some(s.required(resource, Kind::Url)?),
        false => s.text(resource, Kind::Url)?,
    };
    let resource = resource.map(|t| (t.value.trim().to_string(), t.span));
    if let Some((r, _)) = &resource {
        s.print("resource", quoted(r));
    }
    let authorization_servers = list(&mut s, servers, Kind::Url)?;
    let scopes_supported = list(&mut s, supported, Kind::String)?;
    s.finish(false)?;
    Ok(MetadataKeys {
        resource,
        authorization_servers,
        scopes_supported,
    })
}

/// One `[[auth.tool]]` or `[[auth.method]]`.
pub(super) fn scoped(mut s: Section, what: &str, seen: &[Scoped]) -> Result<Scoped, ConfigError> {
    let name = key(
        "name",
        "The tool (or JSON-RPC method) name, as the request body gives it.",
    )
    .example("transfer-funds");
    let needs = key("scopes", "The scopes it needs, beside `required_scopes`.").example(r#"["payments:write"]"#);
    let name_text = s.required(name, Kind::String)?;
    if seen.iter().any(|t| t.name == name_text.value) {
        return s.err(
            name_text.span,
            format!("auth.{what}: {:?} is listed twice", name_text.value),
        );
    }
    let name = name_text.value.to_string();
    s.print("name", quoted(&name));
    let scopes = scopes(&mut s, needs)?;
    s.finish(false)?;
    Ok(Scoped { name, scopes })
}

/// Puts the sections together: `None` when auth is off.
pub(super) fn combine(
    keys: AuthKeys,
    metadata: MetadataKeys,
    tools: Vec<Scoped>,
    methods: Vec<Scoped>,
    err: impl Fn(Option<std::ops::Range<usize>>, String) -> ConfigError,
) -> Result<Option<AuthConfig>, ConfigError> {
    if !keys.on {
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
        let all = keys
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
        audiences: keys.audiences.unwrap_or_else(|| vec![resource.clone()]),
        allowed_origins: keys.allowed_origins.unwrap_or_else(|| vec![origin.clone()]),
        resource: ResourceMetadata {
            authorization_servers: metadata
                .authorization_servers
                .unwrap_or_else(|| vec![keys.issuer.clone()]),
            scopes_supported,
            resource,
            origin,
            path,
        },
        issuer: keys.issuer,
        jwks: keys.jwks,
        algorithms: keys.algorithms,
        leeway: keys.leeway,
        jwks_refresh_min: keys.jwks_refresh_min,
        jwks_refresh_max: keys.jwks_refresh_max,
        jwks_kid_refetch: keys.jwks_kid_refetch,
        jwks_timeout: keys.jwks_timeout,
        token_cache: keys.token_cache,
        required_scopes: keys.required_scopes,
        tools,
        methods,
        public_paths: keys.public_paths,
        forward: keys.forward,
        identity_headers: keys.identity_headers,
    }))
}

/// An optional list of strings, printed when set.
fn list(s: &mut Section, key: super::reader::Key, kind: Kind) -> Result<Option<Vec<String>>, ConfigError> {
    let Some((texts, _)) = s.strings(key, kind)? else {
        return Ok(None);
    };
    let values: Vec<String> = texts.iter().map(|t| t.value.trim().to_string()).collect();
    s.print_strings(key.name(), values.iter().map(String::as_str));
    Ok(Some(values))
}

/// A list of scopes (RFC 6749: printable ASCII but space, `"` and `\`), default none, printed.
fn scopes(s: &mut Section, key: super::reader::Key) -> Result<Vec<String>, ConfigError> {
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const BACKEND: &str = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";

    fn parse(auth: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("test.toml"), &format!("{BACKEND}{auth}"))
    }

    fn error(auth: &str) -> String {
        parse(auth).unwrap_err().message
    }

    const STRICT: &str = "[auth]\nissuer = \"https://idp.example.com\"\n\
        [auth.resource_metadata]\nresource = \"https://mcp.example.com/mcp\"\n";

    #[test]
    fn off_unless_the_section_is_there_and_strict() {
        assert_eq!(parse("").unwrap().auth, None);
        assert_eq!(parse("[auth]\nmode = \"off\"\n").unwrap().auth, None);
        let c = parse(STRICT).unwrap();
        let a = c.auth.as_ref().unwrap();
        assert_eq!(a.audiences, ["https://mcp.example.com/mcp"]);
        assert_eq!(a.allowed_origins, ["https://mcp.example.com"]);
        assert_eq!(a.resource.authorization_servers, ["https://idp.example.com"]);
        assert_eq!(
            a.resource.url(),
            "https://mcp.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(a.jwks, JwksSource::Discovered);
        assert_eq!(a.forward, Forward::Strip);
        assert!(a.identity_headers);
        assert_eq!(a.algorithms, AlgorithmSet::ALL);
        // The printout reads back as the same config.
        assert_eq!(Config::parse(Path::new("t.toml"), &c.to_toml()).unwrap(), c);
    }

    #[test]
    fn tools_methods_and_scopes() {
        let text = "[auth]\nissuer = \"https://idp.example.com\"\nrequired_scopes = [\"mcp\"]\n\
            jwks_uri = \"http://127.0.0.1:9999/jwks\"\n\
            [auth.resource_metadata]\nresource = \"https://mcp.example.com\"\n\
            [[auth.tool]]\nname = \"transfer\"\nscopes = [\"pay:write\", \"pay:write\"]\n\
            [[auth.method]]\nname = \"tasks/get\"\nscopes = [\"tasks\"]\n";
        let a = parse(text).unwrap().auth.unwrap();
        assert_eq!(
            a.tools,
            [Scoped {
                name: "transfer".into(),
                scopes: vec!["pay:write".into()]
            }]
        );
        assert_eq!(a.methods[0].scopes, ["tasks"]);
        assert_eq!(a.resource.scopes_supported, ["mcp", "pay:write", "tasks"]);
        assert_eq!(
            a.resource.url(),
            "https://mcp.example.com/.well-known/oauth-protected-resource"
        );
        assert!(matches!(a.jwks, JwksSource::Uri(_)));
    }

    #[test]
    fn mistakes_are_refused_with_the_key_named() {
        let cases = [
            ("[auth]\n", "auth.issuer: required"),
            (
                "[auth]\nissuer = \"https://i\"\n",
                "auth.resource_metadata.resource: required",
            ),
            (&format!("{STRICT}[auth.x]\n"), "unknown key `x`"),
            (
                "[auth]\nissuer = \"https://i\"\njwks_uri = \"http://idp.example.com/jwks\"\n",
                "http:// only to a loopback",
            ),
            (
                "[auth]\nissuer = \"https://i\"\njwks_uri = \"https://i/j\"\njwks_file = \"j.json\"\n",
                "set one, not both",
            ),
            (
                "[auth]\nissuer = \"https://i\"\nalgorithms = [\"HS256\"]\n",
                "is an HMAC algorithm",
            ),
            ("[auth]\nissuer = \"https://i\"\nalgorithms = []\n", "at least one"),
            (
                "[auth]\nissuer = \"https://i\"\nrequired_scopes = [\"a b\"]\n",
                "auth.required_scopes: \"a b\" is not a scope",
            ),
            (
                "[auth]\nissuer = \"https://i\"\npublic_paths = [\"health\"]\n",
                "must start with `/`",
            ),
            (
                "[auth]\nissuer = \"https://i\"\njwks_refresh_min = \"2h\"\n",
                "jwks_refresh_max: must be at least",
            ),
            (
                "[auth]\nissuer = \"https://i\"\njwks_file = \"/nonexistent/jwks.json\"\n",
                "auth.jwks_file: cannot read",
            ),
        ];
        for (text, want) in cases {
            let got = error(text);
            assert!(got.contains(want), "{text:?}: {got}");
        }
        let tools = format!("{STRICT}[[auth.tool]]\nname = \"t\"\n[[auth.tool]]\nname = \"t\"\n");
        assert!(
            error(&tools).contains("auth.tool: \"t\" is listed twice"),
            "{}",
            error(&tools)
        );
        let query = "[auth]\nissuer = \"https://i\"\n[auth.resource_metadata]\nresource = \"https://m/mcp?x=1\"\n";
        assert!(error(query).contains("no query or fragment"), "{}", error(query));
    }
}
