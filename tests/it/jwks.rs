//! The issuer's keys fetched and kept fresh (src/auth/issuer_keys.rs, fetch.rs, refresh.rs) against an
//! issuer on 127.0.0.1 whose every answer the test chooses: key sets made by
//! tests/fixtures/jwt/signer.rs, metadata documents, failures (500, a redirect, garbage, a
//! body over the limit, a hang), and keys rotated while the router runs. The issuer counts
//! and timestamps every request, so schedules are read off its log, not guessed.

use crate::support::tls_backend;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::auth::signer;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use mrtr_router::internals::{
    keep_fresh, AlgorithmSet, AuthPolicy, FetchOutcome, IssuerKeys, JwksConfig, KeySet, MAX_JWKS_BYTES,
};
use mrtr_router::Config;
use prometheus::{IntCounterVec, Opts};
use serde_json::json;
use signer::{jwks, Signer};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the issuer answers on one path (a path it was given nothing for answers 404).
#[derive(Clone)]
enum Answer {
    Json {
        body: String,
        cache_control: Option<&'static str>,
    },
    Status(u16),
    Redirect(String),
    /// Never answers.
    Hang,
    /// `body` padded with spaces to `len` bytes, with a `Content-Length` or chunked.
    Padded {
        body: String,
        len: usize,
        chunked: bool,
    },
}

fn json(body: impl Into<String>) -> Answer {
    Answer::Json {
        body: body.into(),
        cache_control: None,
    }
}

fn keys_of(signers: &[&Signer]) -> String {
    jwks(&signers.iter().map(|s| s.jwk()).collect::<Vec<_>>())
}

type Body = BoxBody<Bytes, Infallible>;

/// The test's issuer.
struct Issuer {
    addr: SocketAddr,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    /// How long each answer waits first.
    delay: Arc<Mutex<Duration>>,
    /// Every request: its path and when it arrived.
    log: Arc<Mutex<Vec<(String, Instant)>>>,
    arrived: watch::Receiver<usize>,
}

impl Issuer {
    async fn start() -> Issuer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let answers: Arc<Mutex<HashMap<String, Answer>>> = Default::default();
        let delay: Arc<Mutex<Duration>> = Default::default();
        let log: Arc<Mutex<Vec<(String, Instant)>>> = Default::default();
        let (arrive, arrived) = watch::channel(0);
        let arrive = Arc::new(arrive);
        let (a, d, l) = (answers.clone(), delay.clone(), log.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (a, d, l, arrive) = (a.clone(), d.clone(), l.clone(), arrive.clone());
                let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let path = req.uri().path().to_string();
                    l.lock().unwrap().push((path.clone(), Instant::now()));
                    arrive.send_modify(|n| *n += 1);
                    let answer = a.lock().unwrap().get(&path).cloned();
                    let delay = *d.lock().unwrap();
                    async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, Infallible>(respond(answer).await)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Issuer {
            addr,
            answers,
            delay,
            log,
            arrived,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn answer(&self, path: &str, answer: Answer) {
        self.answers.lock().unwrap().insert(path.to_string(), answer);
    }

    fn delay(&self, by: Duration) {
        *self.delay.lock().unwrap() = by;
    }

    fn times(&self, path: &str) -> Vec<Instant> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|(p, _)| p == path).map(|(_, t)| *t).collect()
    }

    fn hits(&self, path: &str) -> usize {
        self.times(path).len()
    }

    /// Waits until `path` was asked for `n` times, at most `limit`.
    async fn wait_hits(&self, path: &str, n: usize, limit: Duration) {
        let mut arrived = self.arrived.clone();
        let reached = tokio::time::timeout(limit, arrived.wait_for(|_| self.hits(path) >= n)).await;
        assert!(
            reached.is_ok(),
            "{path} asked for {} times within {limit:?}, not {n}",
            self.hits(path)
        );
    }
}

async fn respond(answer: Option<Answer>) -> Response<Body> {
    let full = |status: u16, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r
    };
    match answer {
        None => full(404, "not here".into()),
        Some(Answer::Json { body, cache_control }) => {
            let mut r = full(200, body);
            r.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            if let Some(cc) = cache_control {
                r.headers_mut().insert("cache-control", cc.parse().unwrap());
            }
            r
        }
        Some(Answer::Status(status)) => full(status, "failing".into()),
        Some(Answer::Redirect(to)) => {
            let mut r = full(302, String::new());
            r.headers_mut().insert("location", to.parse().unwrap());
            r
        }
        Some(Answer::Hang) => std::future::pending().await,
        Some(Answer::Padded { body, len, chunked }) => {
            let mut bytes = body.into_bytes();
            bytes.resize(len, b' ');
            if !chunked {
                return full(200, String::from_utf8(bytes).unwrap());
            }
            let chunks: Vec<Result<Frame<Bytes>, Infallible>> = bytes
                .chunks(64 * 1024)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            Response::new(StreamBody::new(futures_util::stream::iter(chunks)).boxed())
        }
    }
}

/// A config whose `[auth]` holds `auth` (its keys: `jwks_uri`, or discovered), with `upstream`
/// as the `[upstream]` section's text.
fn config(auth: &str, upstream: &str) -> Config {
    let text = format!(
        "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9\"\n{upstream}\n[auth]\n{auth}\n\
         [auth.resource_metadata]\nresource = \"https://mcp.example.com/mcp\"\n"
    );
    Config::parse(Path::new("test.toml"), &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// `[auth]` keys fetched from `uri` for issuer `https://idp.example.com`, with `more`.
fn from_uri(uri: &str, more: &str) -> Config {
    config(
        &format!("issuer = \"https://idp.example.com\"\njwks_uri = \"{uri}\"\n{more}"),
        "",
    )
}

fn jwks_config(c: &Config) -> JwksConfig {
    JwksConfig {
        auth: c.auth.clone().unwrap(),
        tls: c.upstream.tls.clients.as_ref().map(|t| t.http1.clone()),
    }
}

fn counter() -> IntCounterVec {
    IntCounterVec::new(Opts::new("refreshes", "test"), &["result"]).unwrap()
}

/// A store for `c` that counts into `refreshes`, as the router's refresh loop sets it up.
fn store_for(c: &Config, refreshes: &IntCounterVec) -> IssuerKeys {
    let store = IssuerKeys::new(c.auth.as_ref());
    store.verify_with(jwks_config(c).tls);
    store.count_into(refreshes.clone());
    store
}

fn counted(refreshes: &IntCounterVec) -> (u64, u64) {
    let n = |r: &str| refreshes.with_label_values(&[r]).get();
    (n("ok"), n("error"))
}

fn kids(set: &KeySet) -> Vec<String> {
    set.iter().filter_map(|k| k.kid().map(str::to_string)).collect()
}

fn loaded(max_age: Option<u64>) -> FetchOutcome {
    FetchOutcome::Loaded {
        max_age: max_age.map(Duration::from_secs),
    }
}

#[tokio::test]
async fn the_first_fetch_is_at_once_then_max_age_within_the_bounds_or_else_the_max() {
    let a = Signer::p256(Some("a"));
    // (Cache-Control, jwks_refresh_min, jwks_refresh_max, the wait between fetches)
    let cases = [
        (Some("max-age=1"), 1, 30, 1.0),
        (Some("public, max-age=30"), 1, 2, 2.0),
        (None, 1, 2, 2.0),
        (Some("no-store"), 1, 30, 1.0),
    ];
    let runs = cases.map(|(cache_control, min, max, wait)| {
        let body = keys_of(&[&a]);
        async move {
            let issuer = Issuer::start().await;
            issuer.answer("/jwks", Answer::Json { body, cache_control });
            let more = format!("jwks_refresh_min = \"{min}s\"\njwks_refresh_max = \"{max}s\"\n");
            let c = from_uri(&issuer.url("/jwks"), &more);
            let store = Arc::new(IssuerKeys::new(c.auth.as_ref()));
            let jc = jwks_config(&c);
            let started = Instant::now();
            let task = tokio::spawn({
                let store = store.clone();
                async move { keep_fresh(&store, move || Some(jc.clone()), counter()).await }
            });
            issuer.wait_hits("/jwks", 3, Duration::from_secs(20)).await;
            task.abort();
            assert!(store.current().is_some());
            let t = issuer.times("/jwks");
            let first = t[0] - started;
            let gaps = [(t[1] - t[0]).as_secs_f64(), (t[2] - t[1]).as_secs_f64()];
            (cache_control, first, gaps, wait)
        }
    });
    for (cache_control, first, gaps, wait) in futures_util::future::join_all(runs).await {
        assert!(
            first < Duration::from_millis(500),
            "{cache_control:?}: first fetch after {first:?}"
        );
        for gap in gaps {
            assert!(
                gap >= wait - 0.02 && gap < wait + 1.0,
                "{cache_control:?}: fetched again after {gap:.3}s, not {wait}s"
            );
        }
    }
}

#[tokio::test]
async fn a_failed_or_unusable_fetch_keeps_the_last_good_set() {
    let (a, b) = (Signer::p256(Some("a")), Signer::ed25519([3; 32], Some("b")));
    let issuer = Issuer::start().await;
    let c = from_uri(&issuer.url("/jwks"), "");
    let refreshes = counter();
    let store = store_for(&c, &refreshes);
    let auth = c.auth.as_ref().unwrap();
    assert!(store.current().is_none() && store.age().is_none());
    let good = Answer::Json {
        body: keys_of(&[&a]),
        cache_control: Some("max-age=120"),
    };
    issuer.answer("/jwks", good.clone());
    assert_eq!(store.refresh(auth).await, loaded(Some(120)));
    let kept = store.current().unwrap();
    assert_eq!(kids(&kept), ["a"]);
    assert!(store.age().unwrap() < Duration::from_secs(5));
    let failures = [
        Answer::Status(500),
        Answer::Status(404),
        Answer::Redirect(issuer.url("/elsewhere")),
        json("<html>not a key set</html>"),
        json(r#"{"keys":[]}"#),
        // Only a key it cannot use (symmetric).
        json(r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"h"}]}"#),
    ];
    let n = failures.len() as u64;
    for failure in failures {
        issuer.answer("/jwks", failure);
        assert_eq!(store.refresh(auth).await, FetchOutcome::Failed);
        assert!(Arc::ptr_eq(&store.current().unwrap(), &kept));
    }
    assert_eq!(issuer.hits("/elsewhere"), 0, "a redirect is not followed");
    assert_eq!(counted(&refreshes), (1, n));
    // The same document again: the same set (a request retrying with it would gain nothing).
    issuer.answer("/jwks", good);
    assert_eq!(store.refresh(auth).await, loaded(Some(120)));
    assert!(Arc::ptr_eq(&store.current().unwrap(), &kept));
    issuer.answer("/jwks", json(keys_of(&[&a, &b])));
    assert_eq!(store.refresh(auth).await, loaded(None));
    assert_eq!(kids(&store.current().unwrap()), ["a", "b"]);
    assert_eq!(counted(&refreshes), (3, n));
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_whether_or_not_its_length_is_declared() {
    let a = Signer::p256(Some("a"));
    let issuer = Issuer::start().await;
    let c = from_uri(&issuer.url("/jwks"), "");
    let refreshes = counter();
    let auth = c.auth.as_ref().unwrap();
    for chunked in [false, true] {
        let store = store_for(&c, &refreshes);
        let padded = |len| Answer::Padded {
            body: keys_of(&[&a]),
            len,
            chunked,
        };
        issuer.answer("/jwks", padded(MAX_JWKS_BYTES + 1));
        assert_eq!(store.refresh(auth).await, FetchOutcome::Failed, "chunked: {chunked}");
        assert!(store.current().is_none());
        issuer.answer("/jwks", padded(MAX_JWKS_BYTES));
        assert_eq!(store.refresh(auth).await, loaded(None), "chunked: {chunked}");
    }
    assert_eq!(counted(&refreshes), (2, 2));
}

#[tokio::test]
async fn a_hanging_issuer_costs_a_fetch_and_a_waiting_request_at_most_the_timeout() {
    let a = Signer::p256(Some("a"));
    let issuer = Issuer::start().await;
    let c = from_uri(
        &issuer.url("/jwks"),
        "jwks_timeout = \"500ms\"\njwks_kid_refetch = \"1ms\"\n",
    );
    let refreshes = counter();
    let store = store_for(&c, &refreshes);
    let auth = c.auth.as_ref().unwrap();
    issuer.answer("/jwks", json(keys_of(&[&a])));
    assert_eq!(store.refresh(auth).await, loaded(None));
    let seen = store.current().unwrap();
    issuer.answer("/jwks", Answer::Hang);
    let within = |took: Duration| took >= Duration::from_millis(480) && took < Duration::from_secs(2);
    let started = Instant::now();
    assert_eq!(store.refresh(auth).await, FetchOutcome::Failed);
    assert!(within(started.elapsed()), "{:?}", started.elapsed());
    let started = Instant::now();
    assert!(store.refetch(auth, &seen).await.is_none());
    assert!(within(started.elapsed()), "{:?}", started.elapsed());
    assert!(Arc::ptr_eq(&store.current().unwrap(), &seen));
    // Discovery is bounded the same way.
    let d = config(
        &format!("issuer = \"{}\"\njwks_timeout = \"500ms\"\n", issuer.url("/hangs")),
        "",
    );
    issuer.answer("/.well-known/oauth-authorization-server/hangs", Answer::Hang);
    let discovering = store_for(&d, &refreshes);
    let started = Instant::now();
    assert_eq!(
        discovering.refresh(d.auth.as_ref().unwrap()).await,
        FetchOutcome::Failed
    );
    assert!(within(started.elapsed()), "{:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_kid_fetches_once_for_many_requests_then_waits_out_the_debounce() {
    let (a, b) = (Signer::p256(Some("a")), Signer::ed25519([5; 32], Some("b")));
    let issuer = Issuer::start().await;
    let c = from_uri(&issuer.url("/jwks"), "jwks_kid_refetch = \"1s\"\n");
    let refreshes = counter();
    let store = Arc::new(store_for(&c, &refreshes));
    let auth = c.auth.as_ref().unwrap();
    issuer.answer("/jwks", json(keys_of(&[&a])));
    assert_eq!(store.refresh(auth).await, loaded(None));
    let before = store.current().unwrap();

    // The issuer rotates to `b`; a token of `b` does not verify until the keys are fetched again.
    issuer.answer("/jwks", json(keys_of(&[&b])));
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let token = b.bearer(&json!({
        "iss": "https://idp.example.com", "aud": "https://mcp.example.com/mcp", "sub": "u",
        "exp": now + 300, "iat": now,
    }));
    let policy = AuthPolicy {
        issuer: "https://idp.example.com".into(),
        audiences: vec!["https://mcp.example.com/mcp".into()],
        algorithms: AlgorithmSet::ALL,
        leeway: Duration::from_secs(30),
    };
    assert!(policy.verify(&token, &before, SystemTime::now()).is_err());

    // 50 requests at once, while the fetch is slow enough for all of them to wait on it.
    issuer.delay(Duration::from_millis(200));
    let started = Instant::now();
    let waits = (0..50).map(|_| {
        let (store, auth, before) = (store.clone(), auth.clone(), before.clone());
        tokio::spawn(async move { store.refetch(&auth, &before).await })
    });
    let got: Vec<_> = futures_util::future::join_all(waits).await;
    issuer.delay(Duration::ZERO);
    assert_eq!(issuer.hits("/jwks"), 2, "one fetch for 50 requests");
    let after = store.current().unwrap();
    for g in got {
        assert!(Arc::ptr_eq(&g.unwrap().expect("the new set"), &after));
    }
    assert_eq!(kids(&after), ["b"]);
    assert!(policy.verify(&token, &after, SystemTime::now()).is_ok());
    // A request that still holds the old set gets the new one without a fetch.
    assert!(Arc::ptr_eq(&store.refetch(auth, &before).await.unwrap(), &after));

    // Another unknown kid within `jwks_kid_refetch`: no fetch.
    assert!(store.refetch(auth, &after).await.is_none());
    assert_eq!(issuer.hits("/jwks"), 2);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the debounce window was spent already"
    );
    // After it: one fetch; the same document, so nothing new to retry with.
    tokio::time::sleep_until((started + Duration::from_millis(1050)).into()).await;
    assert!(store.refetch(auth, &after).await.is_none());
    assert_eq!(issuer.hits("/jwks"), 3);
    assert_eq!(counted(&refreshes), (3, 0));
}

/// An issuer at `path` of the test's server, with its metadata at `metadata_path` naming
/// `named_issuer` and the keys at `/keys`.
fn serve_metadata(issuer: &Issuer, metadata_path: &str, named_issuer: &str, keys: &str) {
    let doc = json!({
        "issuer": named_issuer,
        "jwks_uri": issuer.url("/keys"),
        "token_endpoint": issuer.url("/token"),
    });
    issuer.answer(metadata_path, json(doc.to_string()));
    issuer.answer("/keys", json(keys));
}

fn discovered(issuer: &str) -> Config {
    config(&format!("issuer = \"{issuer}\"\n"), "")
}

#[tokio::test]
async fn discovery_reads_rfc8414_metadata_and_remembers_the_jwks_uri() {
    let a = Signer::p256(Some("a"));
    let issuer = Issuer::start().await;
    let id = issuer.url("/tenant");
    let rfc8414 = "/.well-known/oauth-authorization-server/tenant";
    serve_metadata(&issuer, rfc8414, &id, &keys_of(&[&a]));
    let c = discovered(&id);
    let refreshes = counter();
    let store = store_for(&c, &refreshes);
    let auth = c.auth.as_ref().unwrap();
    assert_eq!(store.refresh(auth).await, loaded(None));
    assert_eq!(store.refresh(auth).await, loaded(None));
    assert_eq!((issuer.hits(rfc8414), issuer.hits("/keys")), (1, 2));
    assert_eq!(issuer.hits("/tenant/.well-known/openid-configuration"), 0);
    // The keys moved: the metadata is read again on the next fetch.
    issuer.answer("/keys", Answer::Status(404));
    assert_eq!(store.refresh(auth).await, FetchOutcome::Failed);
    serve_metadata(&issuer, rfc8414, &id, &keys_of(&[&a]));
    assert_eq!(store.refresh(auth).await, loaded(None));
    assert_eq!((issuer.hits(rfc8414), issuer.hits("/keys")), (2, 4));
    assert_eq!(kids(&store.current().unwrap()), ["a"]);
}

#[tokio::test]
async fn discovery_falls_back_to_openid_configuration_with_and_without_a_path() {
    let a = Signer::p256(Some("a"));
    for (path, rfc8414, oidc) in [
        (
            "",
            "/.well-known/oauth-authorization-server",
            "/.well-known/openid-configuration",
        ),
        (
            "/realms/x",
            "/.well-known/oauth-authorization-server/realms/x",
            "/realms/x/.well-known/openid-configuration",
        ),
    ] {
        let issuer = Issuer::start().await;
        let id = issuer.url(path);
        serve_metadata(&issuer, oidc, &id, &keys_of(&[&a]));
        let c = discovered(&id);
        let store = store_for(&c, &counter());
        assert_eq!(store.refresh(c.auth.as_ref().unwrap()).await, loaded(None), "{id}");
        assert_eq!(
            (issuer.hits(rfc8414), issuer.hits(oidc), issuer.hits("/keys")),
            (1, 1, 1),
            "{id}"
        );
    }
}

#[tokio::test]
async fn discovery_refuses_metadata_of_another_issuer_or_with_keys_over_plain_http() {
    let a = Signer::p256(Some("a"));
    let issuer = Issuer::start().await;
    let id = issuer.url("/tenant");
    let rfc8414 = "/.well-known/oauth-authorization-server/tenant";
    let oidc = "/tenant/.well-known/openid-configuration";
    let c = discovered(&id);
    let refreshes = counter();
    let store = store_for(&c, &refreshes);
    let auth = c.auth.as_ref().unwrap();
    for named in [issuer.url("/other"), format!("{id}/"), issuer.url("")] {
        serve_metadata(&issuer, rfc8414, &named, &keys_of(&[&a]));
        // Would the fallback be tried, it would find the right issuer here.
        serve_metadata(&issuer, oidc, &id, &keys_of(&[&a]));
        assert_eq!(store.refresh(auth).await, FetchOutcome::Failed, "{named}");
    }
    let doc = json!({"issuer": id, "jwks_uri": "http://keys.example.com/jwks"});
    issuer.answer(rfc8414, json(doc.to_string()));
    assert_eq!(store.refresh(auth).await, FetchOutcome::Failed);
    assert_eq!((issuer.hits(oidc), issuer.hits("/keys")), (0, 0));
    assert!(store.current().is_none());
    assert_eq!(counted(&refreshes), (0, 4));
}

#[tokio::test]
async fn https_is_verified_with_the_upstream_roots() {
    use tls_backend::{tls_front, write, Ca};
    let a = Signer::p256(Some("a"));
    let issuer = Issuer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("issuer CA");
    let front = tls_front(issuer.addr, &ca.server(&["localhost"]), None).await;
    let base = format!("https://localhost:{}", front.addr.port());
    issuer.answer("/jwks", json(keys_of(&[&a])));
    let upstream = |ca: &Ca, file: &str| {
        let path = write(dir.path(), file, &ca.pem());
        format!("[upstream]\ntls_ca = \"{}\"\n", path.display())
    };
    let trusted = upstream(&ca, "ca.pem");
    let by_uri = format!("issuer = \"https://idp.example.com\"\njwks_uri = \"{base}/jwks\"\n");
    let c = config(&by_uri, &trusted);
    let refreshes = counter();
    let store = store_for(&c, &refreshes);
    assert_eq!(store.refresh(c.auth.as_ref().unwrap()).await, loaded(None));
    assert_eq!(front.handshakes(), 1);

    // Discovered over https too.
    issuer.answer("/keys", json(keys_of(&[&a])));
    issuer.answer(
        "/.well-known/oauth-authorization-server/idp",
        json(json!({"issuer": format!("{base}/idp"), "jwks_uri": format!("{base}/keys")}).to_string()),
    );
    let d = config(&format!("issuer = \"{base}/idp\"\n"), &trusted);
    let discovering = store_for(&d, &refreshes);
    assert_eq!(discovering.refresh(d.auth.as_ref().unwrap()).await, loaded(None));
    assert_eq!(issuer.hits("/keys"), 1);

    // Another CA's roots, or none: refused, and nothing loaded.
    let other = config(&by_uri, &upstream(&Ca::new("another CA"), "other.pem"));
    let untrusting = store_for(&other, &refreshes);
    assert_eq!(
        untrusting.refresh(other.auth.as_ref().unwrap()).await,
        FetchOutcome::Failed
    );
    untrusting.verify_with(None);
    assert_eq!(
        untrusting.refresh(other.auth.as_ref().unwrap()).await,
        FetchOutcome::Failed
    );
    assert!(untrusting.current().is_none());
    assert_eq!(issuer.hits("/jwks"), 1);
    assert_eq!(counted(&refreshes), (2, 2));
}

#[tokio::test]
async fn another_issuer_or_source_drops_the_set_and_a_file_is_read_at_each_apply() {
    let (a, b) = (Signer::p256(Some("a")), Signer::ed25519([9; 32], Some("b")));
    let issuer = Issuer::start().await;
    issuer.answer("/jwks", json(keys_of(&[&a])));
    issuer.answer("/other", json(keys_of(&[&a])));
    let c = from_uri(&issuer.url("/jwks"), "");
    let store = store_for(&c, &counter());
    let auth = c.auth.clone().unwrap();
    assert_eq!(store.refresh(&auth).await, loaded(None));
    let set = store.current().unwrap();
    // The same issuer and source (other keys changed): kept.
    let same = from_uri(&issuer.url("/jwks"), "leeway = \"5s\"\n");
    store.apply(same.auth.as_ref().unwrap()).unwrap();
    assert!(Arc::ptr_eq(&store.current().unwrap(), &set));
    let another_issuer = config(
        &format!(
            "issuer = \"https://other.example.com\"\njwks_uri = \"{}\"\n",
            issuer.url("/jwks")
        ),
        "",
    );
    store.apply(another_issuer.auth.as_ref().unwrap()).unwrap();
    assert!(store.current().is_none() && store.age().is_none());
    store.apply(&auth).unwrap();
    assert_eq!(store.refresh(&auth).await, loaded(None));
    let another_source = from_uri(&issuer.url("/other"), "");
    store.apply(another_source.auth.as_ref().unwrap()).unwrap();
    assert!(store.current().is_none());

    // A fetch under way for the old source does not put its keys in.
    store.apply(&auth).unwrap();
    issuer.delay(Duration::from_millis(300));
    let hits = issuer.hits("/jwks");
    let (outcome, ()) = tokio::join!(store.refresh(&auth), async {
        issuer.wait_hits("/jwks", hits + 1, Duration::from_secs(5)).await;
        store.apply(another_issuer.auth.as_ref().unwrap()).unwrap();
    });
    assert_eq!(outcome, FetchOutcome::Failed);
    assert!(store.current().is_none());
    issuer.delay(Duration::ZERO);

    // A jwks_file: read at each apply, the last good set kept when it holds no usable key; never fetched.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    let from_file = |keys: &str| {
        std::fs::write(&file, keys).unwrap();
        let text = format!(
            "[[backend]]\nname = \"a\"\nurl = \"http://127.0.0.1:9\"\n[auth]\nissuer = \"https://idp.example.com\"\n\
             jwks_file = \"{}\"\n[auth.resource_metadata]\nresource = \"https://mcp.example.com/mcp\"\n",
            file.display()
        );
        Config::parse(Path::new("test.toml"), &text).unwrap().auth.unwrap()
    };
    let filed = IssuerKeys::new(Some(&from_file(&keys_of(&[&a]))));
    assert_eq!(kids(&filed.current().unwrap()), ["a"]);
    filed.apply(&from_file(&keys_of(&[&b]))).unwrap();
    let from_b = filed.current().unwrap();
    assert_eq!(kids(&from_b), ["b"]);
    let unusable = from_file(r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#);
    assert!(filed.apply(&unusable).is_err());
    assert!(Arc::ptr_eq(&filed.current().unwrap(), &from_b));
    assert!(filed.refetch(&unusable, &from_b).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_keeps_the_keys_fresh_once_a_reload_turns_auth_on_and_stops_at_shutdown() {
    let a = Signer::p256(Some("a"));
    let issuer = Issuer::start().await;
    issuer.answer("/jwks", json(keys_of(&[&a])));
    let fleet = crate::support::Fleet::start(1, "").await;
    let ok = "mrtr_jwks_refreshes_total{result=\"ok\"}";
    let auth = format!(
        "[auth]\nissuer = \"https://idp.example.com\"\njwks_uri = \"{}\"\njwks_refresh_min = \"1s\"\n\
         jwks_refresh_max = \"1s\"\n[auth.resource_metadata]\nresource = \"https://mcp.example.com/mcp\"\n",
        issuer.url("/jwks")
    );
    std::fs::write(&fleet.config_path, crate::support::render_config(&auth, &fleet.specs())).unwrap();
    fleet.control.reload().unwrap();
    issuer.wait_hits("/jwks", 3, Duration::from_secs(10)).await;
    // Counted once each is done: the third may still be under way.
    let counted = crate::support::metric(&fleet.metrics().await, ok).unwrap();
    assert!(counted >= 2.0, "{counted}");
    fleet.shutdown().await;
    // The loop fetched every second; stopped, it makes none (one already under way may land).
    let stopped_at = issuer.hits("/jwks");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        issuer.hits("/jwks") <= stopped_at + 1,
        "{} after {stopped_at}",
        issuer.hits("/jwks")
    );
}
