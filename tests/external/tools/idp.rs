//! The test authorization server, tests/idp/server.mjs (oidc-provider, pinned by
//! tests/idp/package-lock.json), run by node as a child process, and what tests ask of it:
//! client-credentials tokens, an end-user's tokens by the authorization-code flow with PKCE
//! (driven headlessly from here), key rotation, and signature checks against its JWKS. [`sdk`]
//! runs the Python SDK's OAuth pieces (tests/interop/oauth_*.py) against it.
//!
//! `MRTR_IDP_DIR` (exported by scripts/test.sh from `bash tests/idp/setup.sh`) names tests/idp
//! with its node_modules installed; without it these tests fail, they never skip.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use bytes::Bytes;
use http::{header, HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use ring::signature::{RsaPublicKeyComponents, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, RSA_PKCS1_2048_8192_SHA256};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::support::{client, Answer, HttpClient, REQUEST_DEADLINE};

pub mod sdk;

/// How long a child may take to say it is ready (node, or Python importing the SDK).
const READY_DEADLINE: Duration = Duration::from_secs(60);
/// The redirect URI the headless flows register; never contacted, the code is read off the
/// redirect that points there.
const REDIRECT_URI: &str = "http://127.0.0.1:1/callback";
const MAX_REDIRECTS: usize = 10;

/// The JWS algorithms the server signs access tokens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alg {
    Es256,
    Rs256,
}

impl Alg {
    pub fn name(self) -> &'static str {
        match self {
            Alg::Es256 => "ES256",
            Alg::Rs256 => "RS256",
        }
    }
}

/// A pre-registered client_credentials client whose tokens `alg` signs.
#[derive(Clone, Debug)]
pub struct IdpClient {
    pub id: String,
    pub secret: String,
    pub alg: Alg,
}

/// server.mjs's options; `None` leaves its default (see the head of server.mjs).
#[derive(Clone, Debug, Default)]
pub struct IdpOptions {
    pub resources: Vec<String>,
    pub clients: Vec<IdpClient>,
    pub scopes: Option<Vec<String>>,
    pub default_alg: Option<Alg>,
    pub default_user: Option<String>,
    pub token_ttl: Option<Duration>,
}

impl IdpOptions {
    pub fn resource(mut self, url: &str) -> Self {
        self.resources.push(url.to_string());
        self
    }

    pub fn client(mut self, id: &str, secret: &str, alg: Alg) -> Self {
        self.clients.push(IdpClient {
            id: id.into(),
            secret: secret.into(),
            alg,
        });
        self
    }

    fn args(&self) -> Vec<String> {
        let mut args = vec!["--port".to_string(), "0".to_string()];
        let mut flag = |name: &str, value: String| args.extend([format!("--{name}"), value]);
        for r in &self.resources {
            flag("resource", r.clone());
        }
        for c in &self.clients {
            flag("client", format!("{}:{}:{}", c.id, c.secret, c.alg.name()));
        }
        if let Some(s) = &self.scopes {
            flag("scopes", s.join(" "));
        }
        if let Some(a) = self.default_alg {
            flag("alg", a.name().to_string());
        }
        if let Some(u) = &self.default_user {
            flag("user", u.clone());
        }
        if let Some(t) = self.token_ttl {
            flag("ttl", t.as_secs().max(1).to_string());
        }
        args
    }
}

/// A child process that printed its ready line; killed on drop. Its stdin is held open: the
/// scripts exit when it closes, so one outlives no test process, however that process ends.
pub struct ReadyChild {
    /// Held for its drop, which kills the process.
    _child: Child,
    _stdin: ChildStdin,
    stderr: Arc<Mutex<String>>,
}

impl ReadyChild {
    /// Starts `command` and waits (bounded) for the first stdout line that `ready` accepts.
    pub(crate) async fn start(
        what: &str,
        mut command: Command,
        ready: impl Fn(&str) -> Option<Value>,
    ) -> (ReadyChild, Value) {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().unwrap_or_else(|e| panic!("start {what}: {e}"));
        let stdin = child.stdin.take().unwrap();
        let stderr = super::collect_stderr(&mut child);
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let found = tokio::time::timeout(READY_DEADLINE, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(v) = ready(&line) {
                    return Some(v);
                }
            }
            None
        })
        .await;
        let started = ReadyChild {
            _child: child,
            _stdin: stdin,
            stderr,
        };
        match found {
            Ok(Some(v)) => {
                // Keep reading stdout so the child never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                (started, v)
            }
            Ok(None) => panic!("{what} exited before it was ready; stderr:\n{}", started.stderr()),
            Err(_) => panic!(
                "{what} not ready within {READY_DEADLINE:?}; stderr:\n{}",
                started.stderr()
            ),
        }
    }

    /// What the child wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// The running authorization server.
pub struct Idp {
    process: ReadyChild,
    issuer: String,
    metadata: Value,
    clients: Vec<IdpClient>,
    http: HttpClient,
}

/// What `POST /test/rotate` did.
#[derive(Debug)]
pub struct Rotation {
    /// The new signing keys' kids.
    pub es256: String,
    pub rs256: String,
    /// Every kid in the JWKS now.
    pub published: Vec<String>,
}

/// An end-user's tokens from the authorization-code flow.
#[derive(Debug)]
pub struct UserTokens {
    pub access_token: String,
    pub refresh_token: Option<String>,
    /// The client registered (dynamically) for the flow.
    pub client_id: String,
    pub scope: String,
}

fn idp_dir() -> PathBuf {
    let dir = std::env::var_os("MRTR_IDP_DIR").map(PathBuf::from).expect(
        "MRTR_IDP_DIR is not set: run `export MRTR_IDP_DIR=\"$(bash tests/idp/setup.sh | tail -n1)\"` \
         (scripts/test.sh does) to install the test authorization server",
    );
    assert!(
        dir.join("node_modules/oidc-provider").is_dir(),
        "{}/node_modules/oidc-provider is missing: run `bash tests/idp/setup.sh`",
        dir.display()
    );
    dir
}

impl Idp {
    /// Starts server.mjs and reads its metadata document (RFC 8414), as a client discovers it.
    pub async fn start(options: IdpOptions) -> Idp {
        let dir = idp_dir();
        let mut command = Command::new("node");
        command
            .arg(dir.join("server.mjs"))
            .args(options.args())
            .current_dir(&dir);
        let (process, ready) = ReadyChild::start(
            "the test authorization server (node tests/idp/server.mjs)",
            command,
            |line| {
                serde_json::from_str::<Value>(line)
                    .ok()
                    .filter(|v| v["issuer"].is_string())
            },
        )
        .await;
        let issuer = ready["issuer"].as_str().unwrap().to_string();
        let mut idp = Idp {
            process,
            issuer,
            metadata: Value::Null,
            clients: options.clients,
            http: client(),
        };
        let url = format!("{}/.well-known/oauth-authorization-server", idp.issuer);
        let a = idp.exchange(Method::GET, &url, &[], Bytes::new()).await;
        assert_eq!(a.status, 200, "{url}: {a:?}\n{}", idp.stderr());
        idp.metadata = a.json();
        idp
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The authorization server metadata document.
    pub fn metadata(&self) -> &Value {
        &self.metadata
    }

    fn endpoint(&self, name: &str) -> String {
        let url = self.metadata[name].as_str();
        url.unwrap_or_else(|| panic!("no {name} in {}", self.metadata))
            .to_string()
    }

    pub fn jwks_uri(&self) -> String {
        self.endpoint("jwks_uri")
    }

    pub fn token_endpoint(&self) -> String {
        self.endpoint("token_endpoint")
    }

    /// What the server wrote to stderr so far (the library's notices, errors).
    pub fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// One request to the server, bounded by [`REQUEST_DEADLINE`].
    pub async fn exchange(&self, method: Method, url: &str, headers: &[(&str, String)], body: Bytes) -> Answer {
        let mut req = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req.body(Full::new(body)).unwrap();
        let fut = async {
            let resp = self.http.request(req).await.expect("the authorization server answers");
            let (parts, body) = resp.into_parts();
            Answer {
                status: parts.status,
                headers: parts.headers,
                body: body.collect().await.expect("whole answer").to_bytes(),
            }
        };
        tokio::time::timeout(REQUEST_DEADLINE, fut)
            .await
            .unwrap_or_else(|_| panic!("{url}: no answer within {REQUEST_DEADLINE:?}"))
    }

    async fn post_form(&self, url: &str, pairs: &[(&str, &str)], basic: Option<(&str, &str)>) -> Answer {
        let mut headers = vec![("content-type", "application/x-www-form-urlencoded".to_string())];
        if let Some((id, secret)) = basic {
            // RFC 6749 §2.3.1: each part form-encoded before base64.
            let pair = format!("{}:{}", form_encode(id), form_encode(secret));
            headers.push((
                "authorization",
                format!("Basic {}", base64::prelude::BASE64_STANDARD.encode(pair)),
            ));
        }
        self.exchange(Method::POST, url, &headers, Bytes::from(form(pairs)))
            .await
    }

    /// A token request with `pairs` as its form, authenticated by client_secret_basic.
    pub async fn token_request(&self, pairs: &[(&str, &str)], basic: Option<(&str, &str)>) -> Answer {
        self.post_form(&self.token_endpoint(), pairs, basic).await
    }

    /// The raw answer to a client_credentials request of the pre-registered `client`.
    pub async fn client_credentials(&self, client: &str, scopes: &str, resource: Option<&str>) -> Answer {
        let c = self.clients.iter().find(|c| c.id == client);
        let c = c.unwrap_or_else(|| panic!("{client} is not one of the clients this server was started with"));
        let mut pairs = vec![("grant_type", "client_credentials"), ("scope", scopes)];
        pairs.extend(resource.map(|r| ("resource", r)));
        self.token_request(&pairs, Some((&c.id, &c.secret))).await
    }

    /// A client_credentials access token of `client` for `resource` (a JWT whose aud it is).
    pub async fn client_credentials_token(&self, client: &str, scopes: &str, resource: &str) -> String {
        let a = self.client_credentials(client, scopes, Some(resource)).await;
        assert_eq!(
            a.status,
            200,
            "client_credentials for {client}: {a:?}\n{}",
            self.stderr()
        );
        a.json()["access_token"].as_str().unwrap().to_string()
    }

    /// `POST /test/rotate`: new ES256 and RS256 keys sign from now on; `retire` drops the old ones
    /// from the JWKS, otherwise they stay published.
    pub async fn rotate_keys(&self, retire: bool) -> Rotation {
        let url = format!("{}/test/rotate{}", self.issuer, if retire { "?retire=1" } else { "" });
        let a = self.exchange(Method::POST, &url, &[], Bytes::new()).await;
        assert_eq!(a.status, 200, "{a:?}");
        let v = a.json();
        let kids = v["published"].as_array().unwrap();
        Rotation {
            es256: v["kids"]["ES256"].as_str().unwrap().into(),
            rs256: v["kids"]["RS256"].as_str().unwrap().into(),
            published: kids.iter().map(|k| k.as_str().unwrap().into()).collect(),
        }
    }

    /// `POST /test/resource`: the server mints tokens for `url` from now on.
    pub async fn add_resource(&self, url: &str) {
        let target = format!("{}/test/resource?{}", self.issuer, form(&[("url", url)]));
        let a = self.exchange(Method::POST, &target, &[], Bytes::new()).await;
        assert_eq!(a.status, 200, "{a:?}");
    }

    /// The JWKS as published now.
    pub async fn jwks(&self) -> Value {
        let a = self.exchange(Method::GET, &self.jwks_uri(), &[], Bytes::new()).await;
        assert_eq!(a.status, 200, "{a:?}");
        a.json()
    }

    /// `user`'s tokens for `resource`, as an MCP client gets them: dynamic registration of a
    /// public client, then the authorization-code flow with PKCE (S256) through the server's
    /// scripted login (`login_hint`) and consent, followed headlessly with a cookie jar, then
    /// the code exchange. Every call registers a new client and signs in afresh.
    pub async fn user_tokens(&self, user: &str, scopes: &str, resource: &str) -> UserTokens {
        let registration = json!({"redirect_uris": [REDIRECT_URI], "application_type": "native",
            "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
            "token_endpoint_auth_method": "none", "client_name": "mrtr tests/external/tools/idp.rs"});
        let json_type = [("content-type", "application/json".to_string())];
        let reg_url = self.endpoint("registration_endpoint");
        let reg = self
            .exchange(
                Method::POST,
                &reg_url,
                &json_type,
                Bytes::from(registration.to_string()),
            )
            .await;
        assert_eq!(reg.status, 201, "registration: {reg:?}");
        let client_id = reg.json()["client_id"].as_str().unwrap().to_string();

        let verifier = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
        let challenge = URL_SAFE_NO_PAD.encode(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()));
        let state = URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>());
        let query = form(&[
            ("response_type", "code"),
            ("client_id", &client_id),
            ("redirect_uri", REDIRECT_URI),
            ("scope", scopes),
            ("resource", resource),
            ("state", &state),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("login_hint", user),
        ]);
        let mut url = format!("{}?{query}", self.endpoint("authorization_endpoint"));
        let mut cookies = Cookies::default();
        let mut hops = 0;
        while !url.starts_with(REDIRECT_URI) {
            hops += 1;
            assert!(
                hops <= MAX_REDIRECTS,
                "no redirect to {REDIRECT_URI} within {MAX_REDIRECTS} hops"
            );
            let a = self
                .exchange(Method::GET, &url, &[("cookie", cookies.header())], Bytes::new())
                .await;
            cookies.store(&a.headers);
            let location = a.headers.get(header::LOCATION).map(|l| l.to_str().unwrap().to_string());
            let location = location.unwrap_or_else(|| panic!("{url} answered {a:?}\n{}", self.stderr()));
            url = if location.starts_with('/') {
                format!("{}{location}", self.issuer)
            } else {
                location
            };
        }
        let param = |name: &str| query_param(&url, name);
        assert_eq!(param("error"), None, "authorization refused: {url}");
        assert_eq!(param("state").as_deref(), Some(state.as_str()), "{url}");
        assert_eq!(
            param("iss").as_deref(),
            Some(self.issuer.as_str()),
            "RFC 9207 iss: {url}"
        );
        let code = param("code").unwrap_or_else(|| panic!("no code in {url}"));

        let a = self
            .token_request(
                &[
                    ("grant_type", "authorization_code"),
                    ("code", &code),
                    ("redirect_uri", REDIRECT_URI),
                    ("client_id", &client_id),
                    ("code_verifier", &verifier),
                    ("resource", resource),
                ],
                None,
            )
            .await;
        assert_eq!(a.status, 200, "code exchange: {a:?}\n{}", self.stderr());
        let v = a.json();
        UserTokens {
            access_token: v["access_token"].as_str().unwrap().into(),
            refresh_token: v["refresh_token"].as_str().map(String::from),
            client_id,
            scope: v["scope"].as_str().unwrap_or_default().into(),
        }
    }
}

/// The headless browser's cookies, by name, all sent back to the one server. oidc-provider
/// scopes its interaction cookies by path; each new one replaces its predecessor by name, so
/// sending them everywhere is what a browser would send where it matters.
#[derive(Default)]
struct Cookies(BTreeMap<String, String>);

impl Cookies {
    fn store(&mut self, headers: &HeaderMap) {
        for set in headers.get_all(header::SET_COOKIE) {
            let pair = set.to_str().unwrap().split(';').next().unwrap_or_default();
            if let Some((name, value)) = pair.split_once('=') {
                // A cleared cookie comes back empty (and expired).
                if value.is_empty() {
                    self.0.remove(name.trim());
                } else {
                    self.0.insert(name.trim().to_string(), value.to_string());
                }
            }
        }
    }

    fn header(&self) -> String {
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.join("; ")
    }
}

/// application/x-www-form-urlencoded, every byte outside the unreserved set percent-encoded.
pub fn form(pairs: &[(&str, &str)]) -> String {
    let pairs: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
        .collect();
    pairs.join("&")
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The decoded value of query parameter `name` of `url`.
fn query_param(url: &str, name: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let (_, value) = uri
        .query()?
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == name)?;
    let mut out = Vec::new();
    let mut bytes = value.bytes();
    while let Some(b) = bytes.next() {
        out.push(match b {
            b'+' => b' ',
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?
            }
            b => b,
        });
    }
    String::from_utf8(out).ok()
}

fn b64url(s: &str) -> Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|e| format!("not base64url ({e}): {s:.40}"))
}

/// A JWT's header and claims, decoded without checking the signature.
pub fn jwt_parts(token: &str) -> (Value, Value) {
    let mut parts = token.split('.');
    let mut part = || {
        let bytes = b64url(parts.next().expect("a JWT has three parts")).unwrap();
        serde_json::from_slice::<Value>(&bytes).expect("a JWT part is JSON")
    };
    (part(), part())
}

/// Checks `token`'s signature (ES256 or RS256) with the key of its kid in `jwks`: its claims,
/// or why it does not verify. Claims (exp, aud, iss) are the caller's to check.
pub fn verify_jwt(token: &str, jwks: &Value) -> Result<Value, String> {
    let (head, claims) = jwt_parts(token);
    let kid = head["kid"].as_str().ok_or("the JWT names no kid")?;
    let keys = jwks["keys"].as_array().ok_or("no keys in the JWKS")?;
    let key = keys
        .iter()
        .find(|k| k["kid"] == kid)
        .ok_or_else(|| format!("kid {kid} is not in the JWKS"))?;
    if key["alg"] != head["alg"] {
        return Err(format!("the JWT's alg {} is not its key's {}", head["alg"], key["alg"]));
    }
    let field = |name: &str| b64url(key[name].as_str().unwrap_or_default());
    let (signed, signature) = token.rsplit_once('.').ok_or("not a JWT")?;
    let signature = b64url(signature)?;
    let verified = match head["alg"].as_str() {
        Some("ES256") => {
            let point = [vec![4u8], field("x")?, field("y")?].concat();
            UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point).verify(signed.as_bytes(), &signature)
        }
        Some("RS256") => RsaPublicKeyComponents {
            n: field("n")?,
            e: field("e")?,
        }
        .verify(&RSA_PKCS1_2048_8192_SHA256, signed.as_bytes(), &signature),
        other => return Err(format!("unexpected alg {other:?}")),
    };
    verified.map_err(|_| format!("bad signature for kid {kid}"))?;
    Ok(claims)
}
