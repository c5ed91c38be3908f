//! `[auth]` in tests (docs/src/authorization.md): an issuer whose keys sign access tokens (the
//! fixture signer), its key set in a file or served over HTTP, a router that knows its own URL
//! before its config is written (the resource it protects), and readers of what a refusal
//! carries: the `WWW-Authenticate` challenge and the `mrtr_auth_total` counts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use mrtr_router::internals::AUTH_RESULTS;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use super::{Answer, BackendSpec, Fleet};

pub mod rows;

#[path = "../../fixtures/jwt/signer.rs"]
pub mod signer;
pub use signer::Signer;

/// The issuer every test config names; never contacted (its keys come from a file or a local
/// server).
pub const ISSUER: &str = "https://idp.example.com";

/// Seconds since the epoch, as token claims write time.
pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The issuer's signing keys, one of each type, and their public halves in a JWKS file.
pub struct Issuer {
    pub rsa: Signer,
    pub ec: Signer,
    pub ed: Signer,
    pub jwks_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Issuer {
    pub fn new() -> Issuer {
        let dir = tempfile::tempdir().unwrap();
        let jwks_path = dir.path().join("jwks.json");
        let issuer = Issuer {
            rsa: Signer::rsa(Some("rsa-1")),
            ec: Signer::p256(Some("ec-1")),
            ed: Signer::ed25519([7; 32], Some("ed-1")),
            jwks_path,
            _dir: dir,
        };
        std::fs::write(&issuer.jwks_path, issuer.jwks()).unwrap();
        issuer
    }

    /// The JWKS of the three keys.
    pub fn jwks(&self) -> String {
        signer::jwks(&[self.rsa.jwk(), self.ec.jwk(), self.ed.jwk()])
    }
}

/// The claims of a good access token for `resource`: this issuer, `sub`, `client_id`
/// `app-1`, `scope`, valid for five minutes from a second ago, with a fresh `jti`.
pub fn claims(resource: &str, sub: &str, scope: &str) -> Value {
    static JTI: AtomicU64 = AtomicU64::new(0);
    let now = now_secs();
    json!({
        "iss": ISSUER,
        "aud": resource,
        "sub": sub,
        "client_id": "app-1",
        "scope": scope,
        "iat": now - 1,
        "exp": now + 300,
        "jti": format!("jti-{}", JTI.fetch_add(1, Ordering::Relaxed)),
    })
}

/// A router in front of `workers` and `specs` whose proxy listener is bound first, so that
/// `extra` can name the router's own origin (`http://127.0.0.1:<port>`), as
/// `[auth.resource_metadata] resource` must.
pub async fn start_knowing_its_url(
    workers: Vec<mrtr_router::example::Worker>,
    specs: &[BackendSpec],
    extra: impl FnOnce(&str) -> String,
) -> Fleet {
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let extra = extra(&format!("http://{}", proxy.local_addr().unwrap()));
    Fleet::start_on(proxy, workers, specs, extra).await
}

/// A `WWW-Authenticate` challenge: its scheme and its auth-params (RFC 9110 §11.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: BTreeMap<String, String>,
}

impl Challenge {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// The space-separated words of `name`, sorted (a `scope` value names a set).
    pub fn words(&self, name: &str) -> Vec<String> {
        let mut words: Vec<String> = self.get(name).unwrap_or("").split(' ').map(str::to_string).collect();
        words.retain(|w| !w.is_empty());
        words.sort();
        words
    }
}

/// The one `WWW-Authenticate` challenge of `a`: `None` without the header; panics on a second
/// header, a repeated parameter or one that does not parse.
pub fn challenge(a: &Answer) -> Option<Challenge> {
    let mut all = a.headers.get_all("www-authenticate").iter();
    let value = all.next()?.to_str().expect("an ASCII challenge");
    assert!(all.next().is_none(), "one WWW-Authenticate header: {a:?}");
    Some(parse_challenge(value).unwrap_or_else(|why| panic!("{why}: {value:?}")))
}

/// `scheme 1*SP auth-param *( OWS "," OWS auth-param )`, each value a token or a
/// quoted-string (with `\` escapes).
pub fn parse_challenge(text: &str) -> Result<Challenge, String> {
    let (scheme, mut rest) = text.split_once(' ').unwrap_or((text, ""));
    let mut params = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if rest.is_empty() {
            break;
        }
        let (name, after) = rest.split_once('=').ok_or("an auth-param without `=`")?;
        let name = name.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(quoted) => {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let end = loop {
                    match chars.next().ok_or("an unterminated quoted-string")? {
                        (_, '\\') => value.push(chars.next().ok_or("a dangling `\\`")?.1),
                        (i, '"') => break i + 1,
                        (_, c) => value.push(c),
                    }
                };
                (value, &quoted[end..])
            }
            None => {
                let end = after.find([',', ' ']).unwrap_or(after.len());
                (after[..end].to_string(), &after[end..])
            }
        };
        let next = next.trim_start();
        if !(next.is_empty() || next.starts_with(',')) {
            return Err(format!("text after the value of {name}"));
        }
        if params.insert(name.clone(), value).is_some() {
            return Err(format!("{name} given twice"));
        }
        rest = next;
    }
    Ok(Challenge {
        scheme: scheme.to_string(),
        params,
    })
}

/// `mrtr_auth_total` by result, every label of `AUTH_RESULTS` (0 when not exported yet).
pub fn auth_counts(metrics: &str) -> BTreeMap<&'static str, f64> {
    AUTH_RESULTS
        .iter()
        .map(|r| {
            let series = format!("mrtr_auth_total{{result=\"{r}\"}}");
            (*r, super::metric(metrics, &series).unwrap_or(0.0))
        })
        .collect()
}

/// What moved between two readings of [`auth_counts`]: each result whose count changed, and by
/// how much.
pub fn auth_moves(
    before: &BTreeMap<&'static str, f64>,
    after: &BTreeMap<&'static str, f64>,
) -> Vec<(&'static str, f64)> {
    after
        .iter()
        .map(|(r, n)| (*r, n - before.get(r).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d != 0.0)
        .collect()
}

/// An issuer's JWKS endpoint on a real socket: `GET /jwks` answers the current document with
/// `Cache-Control: max-age=60`; anything else 404. Counts the fetches.
pub struct JwksServer {
    document: Arc<Mutex<String>>,
    pub fetches: Arc<AtomicU64>,
}

impl JwksServer {
    /// Serves `document` on `listener`.
    pub fn start(listener: TcpListener, document: String) -> JwksServer {
        let document = Arc::new(Mutex::new(document));
        let fetches = Arc::new(AtomicU64::new(0));
        let (doc, count) = (document.clone(), fetches.clone());
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (doc, count) = (doc.clone(), count.clone());
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (doc, count) = (doc.clone(), count.clone());
                    async move {
                        let response = match req.uri().path() {
                            "/jwks" => {
                                count.fetch_add(1, Ordering::SeqCst);
                                let body = doc.lock().unwrap().clone();
                                http::Response::builder()
                                    .header("content-type", "application/json")
                                    .header("cache-control", "max-age=60")
                                    .body(Full::new(Bytes::from(body)))
                            }
                            _ => http::Response::builder().status(404).body(Full::new(Bytes::new())),
                        };
                        Ok::<_, std::convert::Infallible>(response.unwrap())
                    }
                });
                let io = hyper_util::rt::TokioIo::new(sock);
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
            }
        });
        JwksServer { document, fetches }
    }

    /// The document later fetches get.
    pub fn publish(&self, document: String) {
        *self.document.lock().unwrap() = document;
    }
}

/// One request as a [`Recorder`] received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: http::Method,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Seen {
    /// The values of header `name`, in order.
    pub fn header(&self, name: &str) -> Vec<String> {
        let values = self.headers.get_all(name).iter();
        values.map(|v| v.to_str().unwrap().to_string()).collect()
    }

    /// The names of the headers starting with `prefix` (lowercase).
    pub fn names_starting(&self, prefix: &str) -> Vec<String> {
        let names = self.headers.keys().map(|k| k.as_str().to_string());
        names.filter(|n| n.starts_with(prefix)).collect()
    }
}

/// A backend that keeps every request it receives, whole, and answers each one as told
/// ([`Recorder::start`]: 200, a POST with a JSON-RPC result echoing its `id`, anything else with
/// `{}`). For asserting what a backend sees, and that a refused request reached none.
#[derive(Default)]
pub struct Recorder {
    seen: Mutex<Vec<Seen>>,
}

/// How a [`Recorder`] answers a request.
pub type Answering = fn(&Seen) -> http::Response<Full<Bytes>>;

/// A JSON answer of `status`.
pub fn json_answer(status: u16, v: &Value) -> http::Response<Full<Bytes>> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap()
}

/// The answer of [`Recorder::start`].
fn empty_result(seen: &Seen) -> http::Response<Full<Bytes>> {
    match serde_json::from_slice::<Value>(&seen.body) {
        Ok(v) if seen.method == http::Method::POST => {
            json_answer(200, &json!({"jsonrpc": "2.0", "id": v["id"], "result": {}}))
        }
        _ => json_answer(200, &json!({})),
    }
}

impl Recorder {
    /// Starts one on a real socket; `name` is its backend name.
    pub async fn start(name: &str) -> (BackendSpec, Arc<Recorder>) {
        Recorder::start_answering(name, empty_result).await
    }

    /// One that answers each request with `answer`.
    pub async fn start_answering(name: &str, answer: Answering) -> (BackendSpec, Arc<Recorder>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let recorder = Arc::new(Recorder::default());
        let kept = recorder.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let kept = kept.clone();
                let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let kept = kept.clone();
                    async move {
                        use http_body_util::BodyExt;
                        let (parts, body) = req.into_parts();
                        let seen = Seen {
                            method: parts.method,
                            headers: parts.headers,
                            body: body.collect().await?.to_bytes(),
                        };
                        let response = answer(&seen);
                        kept.seen.lock().unwrap().push(seen);
                        Ok::<_, hyper::Error>(response)
                    }
                });
                let io = hyper_util::rt::TokioIo::new(sock);
                tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
            }
        });
        let spec = BackendSpec {
            name: name.to_string(),
            url: format!("http://{addr}"),
            weight: 1,
        };
        (spec, recorder)
    }

    /// How many requests it received.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Every request it received, in order.
    pub fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The latest request it received.
    pub fn last(&self) -> Option<Seen> {
        self.seen.lock().unwrap().last().cloned()
    }
}

/// Waits until the samples of metric `name` with labels `with` sum to at least `want` (a
/// counter the router moves in the background), for at most `limit`.
pub async fn wait_metric_at_least(fleet: &Fleet, name: &str, with: &[&str], want: f64, limit: std::time::Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let m = fleet.metrics().await;
        let got = super::metric_sum(&m, name, with);
        if got >= want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}{with:?} is {got} after {limit:?}, not {want} or more"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
