//! The rows of the auth tables: a request ([`Req`]), what the contract says of it ([`Want`]),
//! and [`check`], which sends one and asserts all of it: status, `Mcp-Router-Error`, the
//! JSON-RPC error and id, the `WWW-Authenticate` challenge, whether a backend saw it and what it
//! saw, and that `mrtr_auth_total` moved by exactly one, under the right result.

use std::sync::Arc;

use bytes::Bytes;
use http::Method;
use mrtr_router::example::Worker;
use serde_json::{json, Value};

use super::{auth_counts, auth_moves, challenge, claims, start_knowing_its_url, Issuer, Recorder, ISSUER};
use crate::support::{metric, send, Answer, BackendSpec, Fleet};

/// A router with `[auth]` (its keys in a file) in front of a recording backend, or of example
/// workers.
pub struct Env {
    pub fleet: Fleet,
    /// The recording backend, when the router has one (rows that pass read what it saw).
    pub recorder: Option<Arc<Recorder>>,
    pub issuer: Issuer,
    /// `http://127.0.0.1:<port>`: the router's own origin.
    pub origin: String,
    /// `<origin>/mcp`.
    pub resource: String,
    /// What `required_scopes` says.
    pub required: Vec<&'static str>,
    /// `forward = "passthrough"`.
    pub passthrough: bool,
    /// `identity_headers`.
    pub identity: bool,
}

impl Env {
    /// In front of one [`Recorder`]; `auth` writes the `[auth]` config of the issuer and the
    /// router's origin.
    pub async fn start(required: &[&'static str], auth: impl FnOnce(&Issuer, &str) -> String) -> Env {
        let (spec, recorder) = Recorder::start("recorder").await;
        Env::start_with(Vec::new(), Some((spec, recorder)), required, auth).await
    }

    /// In front of `workers` and the `recorder`, if any.
    pub async fn start_with(
        workers: Vec<Worker>,
        recorder: Option<(BackendSpec, Arc<Recorder>)>,
        required: &[&'static str],
        auth: impl FnOnce(&Issuer, &str) -> String,
    ) -> Env {
        let issuer = Issuer::new();
        let mut specs = crate::support::specs_of(&workers);
        specs.extend(recorder.as_ref().map(|(spec, _)| spec.clone()));
        let mut origin = String::new();
        let fleet = start_knowing_its_url(workers, &specs, |o| {
            origin = o.to_string();
            auth(&issuer, o)
        })
        .await;
        Env {
            fleet,
            recorder: recorder.map(|(_, r)| r),
            resource: format!("{origin}/mcp"),
            origin,
            issuer,
            required: required.to_vec(),
            passthrough: false,
            identity: true,
        }
    }

    /// Requests that reached any backend.
    pub fn served(&self) -> usize {
        self.fleet.total_requests() as usize + self.recorder.as_ref().map_or(0, |r| r.count())
    }

    pub fn metadata_url(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource/mcp", self.origin)
    }

    /// Good claims of `alice` with `scope`, changed by `edit`.
    pub fn claims(&self, scope: &str, edit: impl FnOnce(&mut Value)) -> Value {
        let mut c = claims(&self.resource, "alice", scope);
        edit(&mut c);
        c
    }

    /// A good bearer of `alice` with `scope` (ES256).
    pub fn bearer(&self, scope: &str) -> String {
        self.issuer.ec.bearer(&self.claims(scope, |_| {}))
    }
}

/// What a row sends: `target` is the path and query on the router.
pub struct Req {
    pub method: Method,
    pub target: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Value>,
}

/// A JSON-RPC request (its `id` is the row's, set when sent) to `/mcp`.
pub fn post(method: &str, params: Value) -> Req {
    Req {
        method: Method::POST,
        target: "/mcp".into(),
        headers: Vec::new(),
        body: Some(json!({"jsonrpc": "2.0", "method": method, "params": params})),
    }
}

pub fn ping() -> Req {
    post("ping", json!({}))
}

pub fn tool(name: &str) -> Req {
    post("tools/call", json!({"name": name, "arguments": {}}))
}

pub fn get(target: &str) -> Req {
    Req {
        method: Method::GET,
        target: target.into(),
        headers: Vec::new(),
        body: None,
    }
}

impl Req {
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Req {
        self.headers.push((name, value.into()));
        self
    }

    pub fn bearer(self, token: impl std::fmt::Display) -> Req {
        self.header("authorization", format!("Bearer {token}"))
    }

    pub fn at(mut self, target: impl Into<String>) -> Req {
        self.target = target.into();
        self
    }
}

/// The challenge a refusal carries.
pub enum Expect {
    /// None at all.
    Absent,
    /// `Bearer` with `resource_metadata` and `scope` (the required scopes, when any), no `error`.
    Missing,
    /// `Bearer` with `resource_metadata`; `error` unchecked.
    Unauthorized,
    /// `error="invalid_token"` with a description.
    Invalid,
    /// `error="insufficient_scope"` naming exactly these scopes.
    Scope(&'static [&'static str]),
}

pub enum Want {
    /// Forwarded and counted `ok`; the backend sees these headers (values; none: absent).
    Ok(Vec<(&'static str, Vec<&'static str>)>),
    /// Forwarded without a check (a public path): nothing counted.
    Unchecked,
    /// Answered by the router.
    Refused {
        status: u16,
        reason: &'static str,
        code: i64,
        challenge: Expect,
        result: &'static str,
    },
}

pub fn unauthorized(challenge: Expect, result: &'static str) -> Want {
    Want::Refused {
        status: 401,
        reason: "unauthorized",
        code: -32010,
        challenge,
        result,
    }
}

pub fn invalid(result: &'static str) -> Want {
    unauthorized(Expect::Invalid, result)
}

pub fn short_of(scopes: &'static [&'static str]) -> Want {
    Want::Refused {
        status: 403,
        reason: "insufficient_scope",
        code: -32011,
        challenge: Expect::Scope(scopes),
        result: "scope",
    }
}

pub fn origin_refused() -> Want {
    Want::Refused {
        status: 403,
        reason: "origin_not_allowed",
        code: -32012,
        challenge: Expect::Absent,
        result: "origin",
    }
}

pub fn ok() -> Want {
    Want::Ok(Vec::new())
}

/// Whether a refusal comes before the body is read (the Origin, the bearer token, the issuer's
/// keys: a request without a valid token costs no body read), so that its `id` is unknown and
/// answered `null` (docs/src/errors.md); the scope and principal checks come after the body
/// scan, and echo it.
pub fn decided_from_the_head(reason: &str) -> bool {
    ["origin_not_allowed", "unauthorized", "auth_unavailable"].contains(&reason)
}

/// Sends row `i` and checks everything the contract says of it.
pub async fn check(env: &Env, i: usize, name: &str, req: Req, want: &Want) {
    let what = format!("row {i} ({name})");
    let id = json!(format!("row-{i}"));
    let body = req.body.map(|mut b| {
        b["id"] = id.clone();
        Bytes::from(b.to_string())
    });
    let echoed_id = if body.is_some() { id } else { Value::Null };
    let headers: Vec<(&str, &str)> = req.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let before = env.fleet.metrics().await;
    let served_before = env.served();
    let url = format!("http://{}{}", env.fleet.router, req.target);
    let a = send(&env.fleet.client, req.method, &url, &headers, body.unwrap_or_default()).await;
    let after = env.fleet.metrics().await;
    let moved = auth_moves(&auth_counts(&before), &auth_counts(&after));
    let reached = env.served() - served_before;
    match want {
        Want::Ok(_) | Want::Unchecked if a.status != 200 => panic!("{what}: not forwarded: {a:?}"),
        Want::Ok(sees) => {
            assert_eq!(
                (reached, moved),
                (1, vec![("ok", 1.0)]),
                "{what}: forwarded once, counted ok"
            );
            assert!(challenge(&a).is_none() && a.router_error().is_none(), "{what}: {a:?}");
            let seen = env
                .recorder
                .as_ref()
                .and_then(|r| r.last())
                .expect("the recorder saw it");
            let sent = req.headers.iter().filter(|(k, _)| *k == "authorization");
            let token: Vec<String> = sent.map(|(_, v)| v.clone()).filter(|_| env.passthrough).collect();
            assert_eq!(
                seen.header("authorization"),
                token,
                "{what}: the token stripped or passed"
            );
            match env.identity {
                true => assert_eq!(seen.header("x-mcp-auth-issuer"), [ISSUER], "{what}"),
                false => assert_eq!(seen.names_starting("x-mcp-auth-"), Vec::<String>::new(), "{what}"),
            }
            for (header, values) in sees {
                let mut got = seen.header(header);
                if *header == "x-mcp-auth-scopes" {
                    got = got.iter().flat_map(|v| v.split(' ').map(str::to_string)).collect();
                    got.sort();
                }
                assert_eq!(got, *values, "{what}: {header}");
            }
        }
        Want::Unchecked => {
            assert_eq!((reached, moved), (1, vec![]), "{what}: forwarded once, nothing counted");
            let seen = env
                .recorder
                .as_ref()
                .and_then(|r| r.last())
                .expect("the recorder saw it");
            assert_eq!(
                seen.header("authorization"),
                Vec::<String>::new(),
                "{what}: the token is stripped"
            );
            assert_eq!(
                seen.names_starting("x-mcp-auth-"),
                Vec::<String>::new(),
                "{what}: no identity"
            );
        }
        Want::Refused {
            status,
            reason,
            code,
            challenge: expect,
            result,
        } => {
            assert_eq!(a.status, *status, "{what}: {a:?}");
            assert_eq!(a.router_error(), Some(*reason), "{what}: {a:?}");
            assert!(
                a.headers["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with("application/json"),
                "{what}"
            );
            let v = a.json();
            let echoed_id = if decided_from_the_head(reason) {
                &Value::Null
            } else {
                &echoed_id
            };
            assert_eq!(
                (&v["error"]["code"], &v["id"], &v["error"]["data"]["reason"]),
                (&json!(code), echoed_id, &json!(reason)),
                "{what}: {v}"
            );
            assert_eq!(reached, 0, "{what}: no backend saw it");
            check_challenge(env, &what, &a, expect);
            let series = format!("mrtr_router_errors_total{{reason=\"{reason}\"}}");
            let errors = |m: &str| metric(m, &series).unwrap_or(0.0);
            assert_eq!(errors(&after) - errors(&before), 1.0, "{what}: {series}");
            // Last, so that a row failing here failed nothing else.
            assert_eq!(moved, vec![(*result, 1.0)], "{what}: mrtr_auth_total moved by one");
        }
    }
}

fn check_challenge(env: &Env, what: &str, a: &Answer, expect: &Expect) {
    let c = match (expect, challenge(a)) {
        (Expect::Absent, c) => return assert!(c.is_none(), "{what}: no challenge, not {c:?}"),
        (_, None) => panic!("{what}: no WWW-Authenticate: {a:?}"),
        (_, Some(c)) => c,
    };
    assert!(c.scheme.eq_ignore_ascii_case("Bearer"), "{what}: {c:?}");
    assert_eq!(
        c.get("resource_metadata"),
        Some(env.metadata_url().as_str()),
        "{what}: {c:?}"
    );
    match expect {
        Expect::Absent | Expect::Unauthorized => {}
        Expect::Missing => {
            assert_eq!(c.get("error"), None, "{what}: no error without a token (RFC 6750 §3.1)");
            assert_eq!(c.words("scope"), sorted(&env.required), "{what}: {c:?}");
            if env.required.is_empty() {
                assert_eq!(c.get("scope"), None, "{what}: {c:?}");
            }
        }
        Expect::Invalid => {
            assert_eq!(c.get("error"), Some("invalid_token"), "{what}: {c:?}");
            assert!(
                c.get("error_description").is_some_and(|d| !d.is_empty()),
                "{what}: {c:?}"
            );
        }
        Expect::Scope(scopes) => {
            assert_eq!(c.get("error"), Some("insufficient_scope"), "{what}: {c:?}");
            assert_eq!(c.words("scope"), sorted(scopes), "{what}: every needed scope");
        }
    }
}

pub fn sorted(words: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    out.sort();
    out
}

/// Checks every row, each on its own (a failing row does not hide the next), then fails naming
/// every row that failed.
pub async fn check_all(env: &Env, rows: Vec<(&'static str, Req, Want)>) {
    use futures_util::FutureExt;
    let mut failed = Vec::new();
    let total = rows.len();
    for (i, (name, req, want)) in rows.into_iter().enumerate() {
        let row = std::panic::AssertUnwindSafe(check(env, i, name, req, &want));
        if row.catch_unwind().await.is_err() {
            failed.push(format!("row {i} ({name})"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {total} rows failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
