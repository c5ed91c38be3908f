//! This resource as `[auth]` describes it, built once per config: the access token
//! [`Policy`], the Protected Resource Metadata document (RFC 9728) and where it is served, and
//! the scopes each operation needs (docs/src/authorization.md, "Scopes and step-up").

use std::sync::Arc;

use bytes::Bytes;

use super::cache::VerifiedBearers;
use super::jwt::Policy;
use super::principal::Caller;
use crate::config::{AuthConfig, Scoped};

/// The metadata's well-known path (RFC 9728 §3).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

pub struct Resource {
    pub policy: Policy,
    /// The bearers this policy accepted, as long as they hold.
    pub bearers: VerifiedBearers<Caller>,
    /// The config it was built from: a snapshot with the same one keeps this resource (and
    /// its cache).
    pub config: AuthConfig,
    /// `resource_metadata` of every challenge: the path-suffixed document's URL.
    pub metadata_url: Arc<str>,
    /// The document, served at [`METADATA_PATH`] and at it followed by the resource's path.
    pub metadata: Bytes,
    metadata_suffixed: String,
    required: Vec<String>,
    tools: Vec<Scoped>,
    methods: Vec<Scoped>,
}

impl Resource {
    pub fn new(cfg: &AuthConfig) -> Resource {
        let meta = &cfg.resource;
        let document = serde_json::json!({
            "resource": meta.resource,
            "authorization_servers": meta.authorization_servers,
            "scopes_supported": meta.scopes_supported,
            "bearer_methods_supported": ["header"],
        });
        Resource {
            policy: Policy {
                issuer: cfg.issuer.clone(),
                audiences: cfg.audiences.clone(),
                algorithms: cfg.algorithms,
                leeway: cfg.leeway,
            },
            bearers: VerifiedBearers::new(cfg.token_cache, cfg.leeway),
            config: cfg.clone(),
            metadata_url: meta.url().into(),
            metadata: Bytes::from(document.to_string()),
            metadata_suffixed: format!("{METADATA_PATH}{}", meta.path.trim_end_matches('/')),
            required: cfg.required_scopes.clone(),
            tools: cfg.tools.clone(),
            methods: cfg.methods.clone(),
        }
    }

    /// Whether `path` is where the metadata document is served.
    pub fn is_metadata_path(&self, path: &str) -> bool {
        path == METADATA_PATH || path == self.metadata_suffixed
    }

    /// Every scope a request needs: the required ones, and for each of its messages (a batch
    /// has several) its JSON-RPC method's and, for `tools/call`, its tool's (`params.name` as the
    /// verified body gives it). Each once.
    pub fn needed<'a, 'm>(
        &'a self,
        messages: impl IntoIterator<Item = (Option<&'m str>, Option<&'m str>)>,
    ) -> Vec<&'a str> {
        let of = |list: &'a [Scoped], name: Option<&str>| {
            name.and_then(|n| list.iter().find(|s| s.name == n))
                .map_or(&[][..], |s| &s.scopes[..])
        };
        let mut all: Vec<&str> = Vec::new();
        let mut add = |scopes: &'a [String]| {
            for scope in scopes {
                if !all.contains(&scope.as_str()) {
                    all.push(scope);
                }
            }
        };
        add(&self.required);
        for (method, tool) in messages {
            add(of(&self.methods, method));
            add(of(&self.tools, tool.filter(|_| method == Some("tools/call"))));
        }
        all
    }

    /// The scopes `[[auth.tool]]` asks of a call of `tool` (none when it names no such tool).
    pub fn tool_scopes(&self, tool: &str) -> &[String] {
        self.tools
            .iter()
            .find(|s| s.name == tool)
            .map_or(&[][..], |s| &s.scopes[..])
    }

    /// The scopes a request without an access token is told it needs: the required ones.
    pub fn required(&self) -> Option<String> {
        (!self.required.is_empty()).then(|| self.required.join(" "))
    }
}
