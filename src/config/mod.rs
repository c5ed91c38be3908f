//! Configuration: the TOML file (docs/src/configuration.md) read section by section into the
//! validated [`Config`] the rest of the router uses; nothing else sees an unchecked value. Each
//! key is declared once, beside where its section is read (`reader`), which also writes `check`'s
//! printout and, read in reference mode, the reference and the example config (`reference`).

mod algorithm;
mod auth;
mod catalog;
mod cidr;
pub mod defaults;
mod file;
mod fleet;
mod lock;
mod log;
mod printable;
mod quotas;
mod reader;
mod reference;
mod routing;
mod server;
mod tokens;
mod tracing;
mod upstream;

use std::fmt;
use std::path::{Path, PathBuf};

pub use algorithm::{Algorithm, AlgorithmSet};
pub use auth::{fetch_url, AuthConfig, Forward, JwksSource, ResourceMetadata, Scoped};
pub use catalog::{CatalogConfig, LockFile};
pub use cidr::Cidr;
pub use file::{ConfigFile, Reread};
pub use fleet::{BackendConfig, DiscoveryConfig, HealthConfig};
pub use lock::{hex, Lock};
pub use log::{LogConfig, LogFormat};
pub use printable::printable;
pub use quotas::{CallerSource, QuotaStore, QuotasConfig, Rate, StoreFailure, ToolQuota};
pub use reference::{KeyDefault, KeyDoc, Kind, Reference, SectionDoc, REGENERATE};
pub use routing::{OnPinLost, RoutingConfig};
pub use server::{AdminConfig, AdminSecret, ServerConfig, TlsConfig};
pub use tokens::TokensConfig;
pub use tracing::TracingConfig;
pub use upstream::{Retry, TlsClients, UpstreamConfig, UpstreamTls};

use reader::{Doc, Section};

/// A configuration problem, with the file and line where it was found when known.
#[derive(Debug)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file.display(), line, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub admin: AdminConfig,
    pub routing: RoutingConfig,
    pub health: HealthConfig,
    /// `[tokens]`: present when sealed routing tokens are on (docs/src/tokens.md).
    pub tokens: Option<TokensConfig>,
    /// `[auth]` with `mode = "strict"`: the router checks every caller's token
    /// (docs/src/authorization.md).
    pub auth: Option<AuthConfig>,
    /// `[quotas]`: fair shares between callers; present turns them on.
    pub quotas: Option<QuotasConfig>,
    /// `[discovery]`: backends from DNS, merged with the static ones.
    pub discovery: Option<DiscoveryConfig>,
    /// `[upstream]`: how backends are reached (TLS, HTTP/2, idle pooled connections).
    pub upstream: UpstreamConfig,
    /// Static backends; may be empty when discovery is configured.
    pub backends: Vec<BackendConfig>,
    pub log: LogConfig,
    /// `[tracing]` with an `otlp_endpoint`: OpenTelemetry traces on.
    pub tracing: Option<TracingConfig>,
    /// `[catalog]` with `enabled = true`: the fleet's tools learned (docs/src/catalog.md).
    pub catalog: Option<CatalogConfig>,
    /// The effective configuration as TOML, every default spelled out (see [`Config::to_toml`]).
    printout: String,
}

impl Config {
    /// What one client connection's request bodies may hold at once (docs/src/limits.md, "Body
    /// budget"): `[quotas] max_body_bytes_per_connection` when set, else a sixteenth of
    /// `server.max_body_buffer_bytes` (at least one whole body), so that no one connection can
    /// take the budget every client shares.
    pub fn connection_body_share(&self) -> usize {
        let configured = self.quotas.as_ref().and_then(|q| q.max_body_bytes_per_connection);
        configured.unwrap_or_else(|| {
            defaults::connection_body_share(self.server.max_body_bytes, self.server.max_body_buffer_bytes)
        })
    }

    /// Every section and key of the config file, read from the section readers themselves.
    pub fn reference() -> Result<Reference, ConfigError> {
        let mut doc = Doc::reference();
        Config::read(&mut doc)?;
        Ok(Reference {
            sections: doc.into_reference(),
        })
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::parse(path, &Config::read_text(path)?)
    }

    /// Reads a config file's text, with an error naming the file.
    pub fn read_text(path: &Path) -> Result<String, ConfigError> {
        std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: None,
            message: format!("cannot read: {e}"),
        })
    }

    /// Validates config text; `path` names the file in errors, and relative paths in the config
    /// (TLS files) are taken from its directory.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        Config::read(&mut Doc::new(path, text))
    }

    /// Reads every section, in the order the reference lists them.
    fn read(doc: &mut Doc) -> Result<Config, ConfigError> {
        let root = doc.tables()?;
        let root = root.get_ref();
        let about = "The proxy listener: its address, limits and timeouts, and TLS.";
        let server = server::server(doc.section(root, "server", about)?)?;
        let about = "The admin listener: `/metrics`, `/healthz`, `/readyz`, `/backends`, `/debug/route` (HTTP/1.1).";
        let admin = server::admin(doc.section(root, "admin", about)?, &server)?;
        let about = "Where client keys come from, the hash ring, and how long pins live and how many there may be.";
        let routing = routing::routing(doc.section(root, "routing", about)?)?;
        let about = "Active health checks of every backend, and when a backend is ejected and re-admitted.";
        let health = fleet::health(doc.section(root, "health", about)?)?;
        let about = "Sealed routing tokens, so that every replica (and a restarted router) routes the calls in \
                     flight: present turns them on.";
        let tokens = tokens::tokens(doc.section(root, "tokens", about)?)?;
        let about = "The router as the fleet's OAuth resource server: the JWT access tokens it accepts and the \
                     scopes each operation needs; present turns it on.";
        let auth_section = auth::auth(doc.section(root, "auth", about)?)?;
        let about = "The Protected Resource Metadata (RFC 9728) the router serves, from which clients find the \
                     authorization server.";
        let metadata = auth::resource_metadata(
            doc.section_in(root, "auth", "resource_metadata", "auth.resource_metadata", about)?,
            auth_section.on(),
        )?;
        let mut scoped = [Vec::new(), Vec::new()];
        for (list, (key, about)) in scoped.iter_mut().zip([
            (
                "tool",
                "The scopes a `tools/call` of one tool needs; repeat for each tool.",
            ),
            (
                "method",
                "The scopes one JSON-RPC method needs (`tasks/get`, `resources/read`, ...); repeat for each.",
            ),
        ]) {
            let name = if key == "tool" { "auth.tool" } else { "auth.method" };
            for (table, span) in doc.elements_in(root, "auth", key, name, about)? {
                let element = Section::element(doc, name, table, span);
                let entry = auth::scoped(element, key, list)?;
                list.push(entry);
            }
        }
        let [tools, methods] = scoped;
        let auth = auth::combine(auth_section, metadata, tools, methods, |span, message| {
            doc.err::<()>(span, message).unwrap_err()
        })?;
        let about = "Fair shares between callers: who a caller is, the rate of new calls, requests in flight, \
                     open calls and buffered body bytes each may have; present turns them on.";
        let quotas_section = quotas::quotas(doc.section(root, "quotas", about)?, auth.is_some(), &server)?;
        let about = "The quotas of one tool (a `tools/call` of it); repeat for each tool.";
        let mut quota_tools = Vec::new();
        for (table, span) in doc.elements_in(root, "quotas", "tool", "quotas.tool", about)? {
            let element = Section::element(doc, "quotas.tool", table, span);
            let tool = quotas::tool(element, &quota_tools)?;
            quota_tools.push(tool);
        }
        let quotas = quotas::combine(quotas_section, quota_tools, |span, message| {
            doc.err::<()>(span, message).unwrap_err()
        })?;
        let about = "Backends found in DNS, merged with the static ones: present turns it on.";
        let discovery = fleet::discovery(doc.section(root, "discovery", about)?)?;
        let about = "How backends are reached: the TLS roots and client certificate, HTTP/2, pooled connections.";
        let mut upstream = upstream::upstream(doc.section(root, "upstream", about)?)?;
        let about = "One static backend; repeat the section for each. At least one is required unless \
                     `[discovery]` is set.";
        let mut backends: Vec<BackendConfig> = Vec::new();
        for (table, span) in doc.elements(root, "backend", about)? {
            let element = Section::element(doc, "backend", table, span);
            let b = fleet::backend(element, &backends, upstream.http2)?;
            backends.push(b);
        }
        let about = "The router's own log lines (stderr) and the access log (stdout).";
        let log = log::log(doc.section(root, "log", about)?)?;
        let about = "OpenTelemetry traces over OTLP/HTTP: on when `otlp_endpoint` is set.";
        let tracing = tracing::tracing(doc.section(root, "tracing", about)?)?;
        let about = "The fleet's tools: each backend's, learned and fingerprinted, for routing by tool, \
                     drift detection and a lock of approved definitions; off by default.";
        let scopes_tools = auth.as_ref().is_some_and(|a| !a.tools.is_empty());
        let catalog = catalog::catalog(doc.section(root, "catalog", about)?, scopes_tools)?;
        doc.only_sections_read(root)?;
        if backends.is_empty() && discovery.is_none() {
            return doc.err(
                None,
                "no [[backend]] configured: at least one backend (or [discovery]) is required",
            );
        }
        let https = |scheme: &http::uri::Scheme| *scheme == http::uri::Scheme::HTTPS;
        // The issuer's keys are fetched over the same client (src/auth/fetch.rs).
        let auth_fetches_https = auth.as_ref().is_some_and(|a| match &a.jwks {
            JwksSource::Uri(uri) => uri.scheme().is_some_and(https),
            JwksSource::Discovered => a.issuer.starts_with("https://"),
            JwksSource::File { .. } => false,
        });
        let needs_tls = backends.iter().any(|b| https(&b.scheme))
            || discovery.as_ref().is_some_and(|d| https(&d.scheme))
            || auth_fetches_https;
        upstream::build_clients(doc, &mut upstream.tls, needs_tls)?;
        Ok(Config {
            server,
            admin,
            routing,
            health,
            tokens,
            auth,
            quotas,
            discovery,
            upstream,
            backends,
            log,
            tracing,
            catalog,
            printout: doc.take_printout(),
        })
    }

    /// What an operator should know about this config that is not an error (printed by
    /// `check`, logged at start).
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.tokens.is_none() {
            notes.push(
                "no [tokens]: the backend of each call in flight is known only to this process, so a restart \
                 (or another replica) loses the calls in flight; configure [tokens] even for one replica"
                    .to_string(),
            );
        }
        if let Some(q) = &self.quotas {
            let none = q.rate.is_none()
                && q.max_in_flight.is_none()
                && q.max_open_calls.is_none()
                && q.max_body_bytes_per_connection.is_none()
                && q.max_body_bytes_per_caller.is_none()
                && q.tools.is_empty();
            if none {
                notes.push("[quotas] sets no quota: every caller is unlimited".to_string());
            }
            if matches!(q.caller, CallerSource::Ip) && q.trusted_proxies.is_empty() && !self.server.proxy_protocol {
                notes.push(
                    "[quotas] caller = \"ip\" with no trusted_proxies: behind a load balancer, every \
                     client is the balancer's one address"
                        .to_string(),
                );
            }
        }
        notes
    }

    /// The effective configuration as TOML, every default spelled out (for `check`). Strings
    /// are written as TOML strings (quotes, backslashes and control characters escaped), so
    /// the output loads back as the same config (but for token keys, which are never printed).
    pub fn to_toml(&self) -> String {
        self.printout.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("test.toml"), text)
    }

    const ONE: &str = "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9001\"\n";

    #[test]
    fn defaults_apply() {
        let c = parse(ONE).unwrap();
        assert_eq!(c.routing.virtual_nodes, 160);
        assert_eq!(c.routing.header.as_str(), "mcp-routing-id");
        assert_eq!(c.backends[0].weight, 1);
        assert_eq!(c.server.max_body_bytes, 1 << 20);
        // The printed effective config parses back to the same config.
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
    }

    #[test]
    fn tokens_discovery_and_health_sections() {
        std::env::set_var("MRTR_TEST_TOKEN_KEY", "k".repeat(40));
        let c = parse(&format!(
            "{ONE}[tokens]\nkeys = [\"${{MRTR_TEST_TOKEN_KEY}}\", \"{}\"]\ntoken_ttl = \"5m\"\n[discovery]\ndns = \"mcp.svc:8000\"\n[health]\npath = \"/healthz\"\n",
            "o".repeat(32)
        ))
        .unwrap();
        let t = c.tokens.as_ref().unwrap();
        assert_eq!(
            (t.keys[0].len(), t.keys.len(), t.token_ttl),
            (40, 2, Duration::from_secs(300))
        );
        let d = c.discovery.as_ref().unwrap();
        assert_eq!((d.host.as_str(), d.port), ("mcp.svc", 8000));
        assert_eq!(c.health.path, "/healthz");
        assert!(!format!("{t:?}").contains("kkkk"), "keys never printed");
        // Discovery alone is enough; no static backend needed.
        assert!(parse("[discovery]\ndns = \"mcp.svc:8000\"\n")
            .unwrap()
            .backends
            .is_empty());
    }

    #[test]
    fn log_and_tracing_sections() {
        let c = parse(ONE).unwrap();
        assert_eq!(
            (c.log.format, c.log.access, c.tracing.is_none()),
            (LogFormat::Text, false, true)
        );
        let c = parse(&format!(
            "{ONE}[log]\nformat = \"json\"\naccess = true\n[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\nsample_ratio = 0.25\n"
        ))
        .unwrap();
        assert_eq!((c.log.format, c.log.access), (LogFormat::Json, true));
        let t = c.tracing.as_ref().unwrap();
        assert_eq!(t.traces_url.to_string(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!((t.service_name.as_str(), t.sample_ratio), ("mrtr-router", 0.25));
        assert_eq!(parse(&c.to_toml()).unwrap(), c, "{}", c.to_toml());
        // A [tracing] without an endpoint is checked, and off.
        let c = parse(&format!("{ONE}[tracing]\nservice_name = \"edge\"\n")).unwrap();
        assert!(c.tracing.is_none());
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
        for (bad, names) in [
            ("[log]\nformat = \"xml\"\n", "log.format"),
            ("[log]\naccess = \"yes\"\n", "log.access"),
            ("[tracing]\nsample_ratio = 1.5\n", "tracing.sample_ratio"),
            (
                "[tracing]\notlp_endpoint = \"https://c:4318\"\n",
                "tracing.otlp_endpoint",
            ),
            ("[tracing]\nservice_name = \"\"\n", "tracing.service_name"),
        ] {
            let e = parse(&format!("{ONE}{bad}")).unwrap_err();
            assert!(e.to_string().contains(names) && e.line == Some(5), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_key_and_line() {
        let e = parse(&format!("{ONE}[routing]\npin_idle_ttl = \"ten\"\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("routing.pin_idle_ttl"), "{e}");
        let e = parse(&format!("{ONE}[routing]\nbogus = 1\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = parse("[[backend]]\nname = \"a\"\nurl = \"ftp://x\"\n").unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        let e = parse(&format!("{ONE}{ONE}")).unwrap_err();
        assert!(e.to_string().contains("defined twice"), "{e}");
        assert!(parse("").unwrap_err().to_string().contains("no [[backend]]"));
        let e = parse(&format!("{ONE}[routing]\nvirtual_nodes = 10\n")).unwrap_err();
        assert!(e.to_string().contains("virtual_nodes"), "{e}");
        let e = parse(&format!("{ONE}[tokens]\nkeys = [\"short\"]\n")).unwrap_err();
        assert!(e.to_string().contains("tokens.keys[0]") && e.line == Some(5), "{e}");
        let e = parse(&format!("{ONE}[tokens]\nkeys = [\"${{MRTR_SURELY_UNSET_VAR}}\"]\n")).unwrap_err();
        assert!(e.to_string().contains("MRTR_SURELY_UNSET_VAR"), "{e}");
        let e = parse(&format!("{ONE}[discovery]\ndns = \"workers\"\n")).unwrap_err();
        assert!(e.to_string().contains("name:port"), "{e}");
        let e = parse(&format!("{ONE}[health]\npath = \"healthz\"\n")).unwrap_err();
        assert!(e.to_string().contains("health.path"), "{e}");
        // A required key missing: its name, and an example of it.
        let e = parse("[[backend]]\nurl = \"http://127.0.0.1:9001\"\n").unwrap_err();
        assert!(
            e.to_string().contains("backend.name: required, e.g. \"worker-1\""),
            "{e}"
        );
        let e = parse(&format!("{ONE}[tokens]\ntoken_ttl = \"5m\"\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("tokens.keys: required, e.g. [\"${MRTR_TOKEN_KEY}\"]")
                && e.line == Some(4),
            "{e}"
        );
        let e = parse(&format!("{ONE}[bogus]\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown section `bogus` (expected one of: server, admin,"),
            "{e}"
        );
    }

    #[test]
    fn the_printed_config_escapes_strings_and_loads_back_the_same() {
        let c = parse(
            "[routing]\nbody_field = 'say \"hi\" \\ bye'\nload_factor = 1.25\n[discovery]\ndns = \"[::1]:8000\"\n\
             [[backend]]\nname = 'a\"b\\c \\\" d'\nurl = \"http://127.0.0.1:9001/p\"\nweight = 3\n",
        )
        .unwrap();
        assert_eq!(c.backends[0].name, r#"a"b\c \" d"#);
        assert_eq!(c.routing.body_field, r#"say "hi" \ bye"#);
        let printed = c.to_toml();
        let again = parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(again, c, "{printed}");
        // And what it printed is a TOML document on its own.
        let doc: toml::Table = printed.parse().unwrap();
        assert_eq!(doc["backend"][0]["name"].as_str(), Some(r#"a"b\c \" d"#));
    }

    #[test]
    fn the_admin_token_comes_from_the_environment_and_is_never_printed() {
        std::env::set_var("MRTR_TEST_ADMIN_TOKEN", "s3cret-admin-token");
        let c = parse(&format!(
            "{ONE}[admin]\ntoken = \"${{MRTR_TEST_ADMIN_TOKEN}}\"\nprotect_reads = true\nmax_connections = 8\n"
        ))
        .unwrap();
        let token = c.admin.token.as_ref().unwrap();
        assert!(token.matches(b"s3cret-admin-token"));
        assert!(!token.matches(b"s3cret-admin-tokem") && !token.matches(b""));
        assert!(c.admin.protect_reads);
        assert_eq!(c.admin.max_connections, 8);
        let printed = c.to_toml();
        assert!(
            !printed.contains("s3cret") && printed.contains("token = \"<redacted>\""),
            "{printed}"
        );
        assert!(!format!("{c:?}").contains("s3cret"));
        // Defaults: no token, reads open, the admin listener's own limits.
        let c = parse(ONE).unwrap();
        assert_eq!(
            (c.admin.token.is_none(), c.admin.protect_reads, c.admin.max_connections),
            (true, false, 64)
        );
        assert_eq!(c.server.max_body_buffer_bytes, 256 << 20);
        for (bad, names) in [
            (
                "[admin]\nprotect_reads = true\n",
                "admin.protect_reads: needs admin.token",
            ),
            (
                "[admin]\ntoken = \"${MRTR_SURELY_UNSET_VAR}\"\n",
                "MRTR_SURELY_UNSET_VAR",
            ),
            ("[admin]\ntoken = \"\"\n", "admin.token: empty"),
            (
                "[server]\nmax_body_bytes = 4096\nmax_body_buffer_bytes = 1024\n",
                "must be at least server.max_body_bytes",
            ),
        ] {
            let e = parse(&format!("{ONE}{bad}")).unwrap_err();
            assert!(e.to_string().contains(names), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_are_capped_at_ten_years() {
        let e = parse(&format!("{ONE}[routing]\ndrain_timeout = \"18446744073709551615s\"\n")).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(
            e.to_string().contains("routing.drain_timeout: at most 3650 days"),
            "{e}"
        );
        let e = parse(&format!("{ONE}[server]\nupstream_timeout = \"3651days\"\n")).unwrap_err();
        assert!(
            e.to_string().contains("server.upstream_timeout: at most 3650 days"),
            "{e}"
        );
        // The maximum itself is accepted, and prints back to the same value.
        let c = parse(&format!("{ONE}[routing]\ndrain_timeout = \"3650days\"\n")).unwrap();
        assert_eq!(c.routing.drain_timeout, defaults::MAX_DURATION);
        assert_eq!(parse(&c.to_toml()).unwrap(), c);
        let c = parse(&format!(
            "{ONE}[routing]\ndrain_timeout = \"{}s\"\n",
            defaults::MAX_DURATION.as_secs()
        ))
        .unwrap();
        assert_eq!(c.routing.drain_timeout, defaults::MAX_DURATION);
    }
}
