//! The official MCP Python SDK's OAuth client stepping up its scopes through two router replicas
//! (docs/src/authorization.md, "Scopes and step-up" and "Handles bound to their principal";
//! docs/src/tokens.md): the replicas share `[tokens]` and `[auth]` and serve one public URL,
//! and the client's transport sends every other request to the second one, as an L4 balancer
//! in front of them would. A 403 `insufficient_scope` makes the SDK fetch a token with the
//! union of scopes and send the same request again: a `tasks/get` whose sealed task id names
//! its worker, a round of a multi-round call whose sealed `requestState` does, a call in a
//! legacy session whose sealed session id does, each reaching the instance that holds it,
//! because the new token is the same principal's. Another principal presenting the same handle
//! is refused before any backend sees it.
//!
//! The test authorization server (tests/idp/server.mjs) issues the tokens; the SDK servers are
//! tests/interop/server.py. The test script installs both; without them these tests fail.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::auth::start_knowing_its_url;
use crate::support::*;
use crate::tools::idp::sdk::*;
use crate::tools::idp::*;
use bytes::Bytes;
use http::Method;
use serde_json::{json, Value};

/// The client whose run steps up, and the second principal.
const CLIENT: (&str, &str) = ("stepup-svc", "stepup-secret");
const OTHER: (&str, &str) = ("other-svc", "other-secret");
const TOKEN_KEYS: &str = "[tokens]\nkeys = [\"auth-stepup-key-0123456789abcdef0123456\"]\n";

/// The `[auth]` both replicas share: the issuer's keys found from its metadata (no `jwks_uri`,
/// no `jwks_file`); every request needs `mcp:tools`; polling a task needs `tasks:read`, a
/// transfer `payments:write`, reading the balance `accounts:read`.
fn auth_config(issuer: &str, public: &str) -> String {
    format!(
        "{TOKEN_KEYS}[auth]\nissuer = \"{issuer}\"\nrequired_scopes = [\"mcp:tools\"]\n\
         [auth.resource_metadata]\nresource = \"{public}\"\n\
         [[auth.method]]\nname = \"tasks/get\"\nscopes = [\"tasks:read\"]\n\
         [[auth.tool]]\nname = \"confirm_transfer\"\nscopes = [\"payments:write\"]\n\
         [[auth.tool]]\nname = \"balance\"\nscopes = [\"accounts:read\"]\n"
    )
}

/// The authorization server, two SDK servers, and two router replicas in front of both.
struct Setup {
    idp: Idp,
    servers: Vec<SdkMcpServer>,
    /// Replica A, whose URL is the public one, and replica B.
    replicas: [Fleet; 2],
    public: String,
}

impl Setup {
    async fn start() -> Setup {
        let scopes = ["mcp:tools", "tasks:read", "payments:write", "accounts:read"];
        let options = IdpOptions {
            scopes: Some(scopes.iter().map(|s| s.to_string()).collect()),
            ..IdpOptions::default()
        };
        let (idp, s0, s1) = tokio::join!(
            Idp::start(
                options
                    .client(CLIENT.0, CLIENT.1, Alg::Es256)
                    .client(OTHER.0, OTHER.1, Alg::Rs256)
            ),
            SdkMcpServer::start("sdk-0"),
            SdkMcpServer::start("sdk-1"),
        );
        let servers = vec![s0, s1];
        let specs: Vec<BackendSpec> = servers
            .iter()
            .map(|s| BackendSpec {
                name: s.name.clone(),
                url: s.origin.clone(),
                weight: 1,
            })
            .collect();
        let issuer = idp.issuer().to_string();
        let mut public = String::new();
        let a = start_knowing_its_url(Vec::new(), &specs, |origin| {
            public = format!("{origin}/mcp");
            auth_config(&issuer, &public)
        })
        .await;
        let b = start_knowing_its_url(Vec::new(), &specs, |_| auth_config(&issuer, &public)).await;
        idp.add_resource(&public).await;
        for replica in [&a, &b] {
            keys_loaded(replica).await;
        }
        Setup {
            idp,
            servers,
            replicas: [a, b],
            public,
        }
    }

    /// oauth_client.py's arguments for `client`'s client-credentials run through both
    /// replicas, then `more`.
    fn client_args(&self, client: (&str, &str), more: &[&str]) -> Vec<String> {
        let b = format!("http://{}", self.replicas[1].router);
        let mut args: Vec<String> = [
            "client-credentials",
            "--client-id",
            client.0,
            "--client-secret",
            client.1,
            "--issuer",
            self.idp.issuer(),
            "--also",
            &b,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(more.iter().map(|s| s.to_string()));
        args
    }

    async fn run(&self, more: &[&str]) -> OAuthClientRun {
        let args = self.client_args(CLIENT, more);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = oauth_client(&self.public, &args).await;
        assert!(
            run.success,
            "{run:#?}\nsdk-0:\n{}\nsdk-1:\n{}\nidp:\n{}",
            self.servers[0].stderr(),
            self.servers[1].stderr(),
            self.idp.stderr()
        );
        run
    }

    /// Requests of JSON-RPC `method` each backend was sent, by both replicas together, in the
    /// order of `servers`.
    async fn sent_to_backends(&self, method: &str) -> Vec<f64> {
        let mut sums = vec![0.0; self.servers.len()];
        for replica in &self.replicas {
            let m = replica.metrics().await;
            for (sum, server) in sums.iter_mut().zip(&self.servers) {
                let backend = format!("backend=\"{}\"", server.name);
                let method = format!("method=\"{method}\"");
                *sum += metric_sum(&m, "mrtr_requests_total", &[&backend, &method]);
            }
        }
        sums
    }

    /// Every request each backend was sent, by both replicas together.
    async fn sent_in_all(&self) -> Vec<f64> {
        let mut sums = vec![0.0; self.servers.len()];
        for replica in &self.replicas {
            let m = replica.metrics().await;
            for (sum, server) in sums.iter_mut().zip(&self.servers) {
                let backend = format!("backend=\"{}\"", server.name);
                *sum += metric_sum(&m, "mrtr_requests_total", &[&backend]);
            }
        }
        sums
    }

    /// Requests each replica proxied to any backend.
    async fn proxied_by_each_replica(&self) -> Vec<f64> {
        let mut counts = Vec::new();
        for replica in &self.replicas {
            counts.push(metric_sum(&replica.metrics().await, "mrtr_requests_total", &[]));
        }
        counts
    }

    /// `reason`'s count in each replica's `mrtr_router_errors_total`.
    async fn router_errors(&self, reason: &str) -> Vec<f64> {
        let mut counts = Vec::new();
        for replica in &self.replicas {
            let m = replica.metrics().await;
            counts.push(metric_sum(
                &m,
                "mrtr_router_errors_total",
                &[&format!("reason=\"{reason}\"")],
            ));
        }
        counts
    }

    /// Which of `servers` is named `name`.
    fn index_of(&self, name: &str) -> usize {
        let found = self.servers.iter().position(|s| s.name == name);
        found.unwrap_or_else(|| panic!("{name:?} is not one of the SDK servers"))
    }

    /// A `tasks/get` of `task` with `token`, straight to `replica`.
    async fn tasks_get(&self, replica: &Fleet, token: &str, task: &str) -> Answer {
        let body = json!({"jsonrpc": "2.0", "id": 41, "method": "tasks/get", "params": {
            "taskId": task, "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "auth_stepup.rs", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}}});
        let bearer = format!("Bearer {token}");
        let headers = [
            ("authorization", bearer.as_str()),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tasks/get"),
            ("mcp-name", task),
            ("accept", "application/json, text/event-stream"),
        ];
        send(
            &replica.client,
            Method::POST,
            &format!("http://{}/mcp", replica.router),
            &headers,
            Bytes::from(body.to_string()),
        )
        .await
    }
}

/// Waits (bounded) until `replica` has fetched the issuer's keys once: until then it answers
/// 503 `auth_unavailable` (docs/src/authorization.md, "The issuer's keys").
async fn keys_loaded(replica: &Fleet) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = replica.metrics().await;
        if metric(&m, "mrtr_jwks_refreshes_total{result=\"ok\"}").unwrap_or(0.0) >= 1.0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no key set fetched within 10 s:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The JSON-RPC message of an answer sent as JSON or as one SSE event.
fn message_of(a: &Answer) -> Value {
    let sse = a
        .headers
        .get("content-type")
        .is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"));
    if !sse {
        return a.json();
    }
    let text = String::from_utf8_lossy(&a.body);
    let data = text.lines().find_map(|l| l.strip_prefix("data:"));
    let data = data.unwrap_or_else(|| panic!("no data line in {text:?}"));
    serde_json::from_str(data.trim()).unwrap()
}

/// The requests of `run` that match `pick`, in order.
fn requests_where(run: &OAuthClientRun, pick: impl Fn(&Value) -> bool) -> Vec<&Value> {
    run.requests().iter().filter(|r| pick(r)).collect()
}

/// `field` of each request, as a JSON array.
fn field(requests: &[&Value], field: &str) -> Value {
    requests.iter().map(|r| r[field].clone()).collect()
}

/// Which replicas ("url": A, "also": B) the requests went to.
fn replicas_of(requests: &[&Value]) -> BTreeSet<String> {
    requests.iter().map(|r| r["to"].as_str().unwrap().to_string()).collect()
}

fn scopes(words: &[&[&str]]) -> Vec<Vec<String>> {
    words
        .iter()
        .map(|w| {
            let mut w: Vec<String> = w.iter().map(|s| s.to_string()).collect();
            w.sort();
            w
        })
        .collect()
}

/// A task created on worker W with a `mcp:tools` token: its first poll is refused for want of
/// `tasks:read`, the SDK steps up and sends the same `tasks/get` again with the new token, and
/// every poll, on either replica, reaches W until the task completes. Then another client's
/// token with the same sealed task id is refused 403 `handle_principal_mismatch` on both
/// replicas, no backend seeing it, while a fresh token of the first client still reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_polled_after_a_step_up_stays_on_its_worker_across_replicas() {
    let s = Setup::start().await;
    let run = s.run(&["--tasks", "--call", r#"slow_task:{"seconds":0.5}"#]).await;
    let text = run.calls[0]["text"].as_str().unwrap();
    let (worker, rest) = text.split_once(':').unwrap_or_else(|| panic!("{run:#?}"));
    assert_eq!(rest, "slept 0.5", "{run:#?}");
    let w = s.index_of(worker);

    let task = &run.summary["tasks"][0];
    let sealed = task["task"].as_str().unwrap();
    assert!(
        sealed.starts_with("mrt2.") && sealed.contains(&format!(".{worker}-")),
        "the client holds the router's seal of {worker}'s task id: {sealed}"
    );
    let polls = task["polls"].as_array().unwrap();
    assert!(
        polls.iter().all(|p| p["served_by"] == worker),
        "every poll answered by {worker}: {run:#?}"
    );
    assert_eq!(polls.last().unwrap()["status"], "completed", "{run:#?}");

    // The wire: one 403, the same tasks/get sent again with the second token, every later poll
    // with it too, on both replicas.
    let gets = requests_where(&run, |r| r["mcp_method"] == "tasks/get");
    assert!(gets.iter().all(|r| r["mcp_name"] == sealed), "{gets:#?}");
    let after_the_first = |first: Value, then: Value| -> Value {
        std::iter::once(first)
            .chain(polls.iter().map(|_| then.clone()))
            .collect()
    };
    assert_eq!(
        field(&gets, "status"),
        after_the_first(json!(403), json!(200)),
        "{gets:#?}"
    );
    assert_eq!(field(&gets, "token"), after_the_first(json!(0), json!(1)), "{gets:#?}");
    let answered: Vec<&Value> = gets[1..].to_vec();
    assert_eq!(
        replicas_of(&answered),
        BTreeSet::from(["also".to_string(), "url".to_string()]),
        "polls through both replicas: {gets:#?}"
    );
    assert_eq!(
        (run.http("POST /mcp 401"), run.http("POST /mcp 403")),
        (1, 1),
        "{run:#?}"
    );
    assert_eq!(run.http("POST /token 200"), 2, "{run:#?}");
    assert_eq!(
        run.token_scopes(),
        scopes(&[&["mcp:tools"], &["mcp:tools", "tasks:read"]]),
        "the second token has the union: {run:#?}"
    );
    let replicas = replicas_of(&requests_where(&run, |r| r["status"] == 200));
    assert_eq!(replicas.len(), 2, "both replicas served requests: {run:#?}");
    // Each replica counted, as proxied, exactly the POSTs the client saw it answer 2xx (how
    // many polls the task took, and so how many each replica got, depends on timing).
    let proxied = s.proxied_by_each_replica().await;
    let answered_by = |to: &str| {
        let ok = |r: &Value| {
            r["to"] == to && r["method"] == "POST" && r["status"].as_u64().is_some_and(|s| (200..300).contains(&s))
        };
        requests_where(&run, ok).len() as f64
    };
    assert_eq!(proxied, [answered_by("url"), answered_by("also")], "{run:#?}");
    assert!(proxied.iter().all(|&n| n >= 1.0), "{proxied:?}");

    // What the backends saw: the call and every poll on W, nothing of the task elsewhere.
    let mut on_w = vec![0.0; s.servers.len()];
    on_w[w] = 1.0;
    assert_eq!(s.sent_to_backends("tools/call").await, on_w, "{run:#?}");
    on_w[w] = polls.len() as f64;
    assert_eq!(s.sent_to_backends("tasks/get").await, on_w, "{run:#?}");
    let scope_refusals: f64 = s.router_errors("insufficient_scope").await.iter().sum();
    assert_eq!(scope_refusals, 1.0);

    // Another principal with the sealed task id: refused by either replica before any backend.
    let before = s.sent_in_all().await;
    let other = s
        .idp
        .client_credentials_token(OTHER.0, "mcp:tools tasks:read", &s.public)
        .await;
    for replica in &s.replicas {
        let a = s.tasks_get(replica, &other, sealed).await;
        assert_eq!(
            (a.status.as_u16(), a.router_error()),
            (403, Some("handle_principal_mismatch")),
            "{a:?}"
        );
        let error = &a.json()["error"];
        assert_eq!(
            (&error["code"], &a.json()["id"]),
            (&(-32013).into(), &41.into()),
            "{a:?}"
        );
    }
    assert_eq!(
        s.sent_in_all().await,
        before,
        "no backend saw the other principal's requests"
    );
    assert_eq!(s.router_errors("handle_principal_mismatch").await, [1.0, 1.0]);

    // The first principal with a token it did not have during the run: still its task, on W.
    let fresh = s
        .idp
        .client_credentials_token(CLIENT.0, "mcp:tools tasks:read", &s.public)
        .await;
    let a = s.tasks_get(&s.replicas[1], &fresh, sealed).await;
    assert_eq!((a.status.as_u16(), a.router_error()), (200, None), "{a:?}");
    let got = message_of(&a);
    assert_eq!(
        (&got["result"]["status"], &got["result"]["servedBy"]),
        (&"completed".into(), &worker.into()),
        "{got}"
    );
}

/// A transfer needing `payments:write` and two rounds of input, through both replicas: the first
/// send is refused 403 and stepped up; round 1 answers input_required with a sealed
/// `requestState`; while answering it the client reads the balance, which needs
/// `accounts:read`, and steps up again; rounds 2 and 3 go with that third token, on both
/// replicas, to the worker that holds the call, which completes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_round_call_stays_on_its_worker_when_the_token_steps_up_between_rounds() {
    let s = Setup::start().await;
    let run = s
        .run(&[
            "--call",
            "whoami",
            "--call",
            r#"confirm_transfer:{"amount":7}"#,
            "--during-input",
            "balance",
        ])
        .await;
    let lines: Vec<&str> = run.calls.iter().map(|c| c["call"].as_str().unwrap()).collect();
    assert_eq!(
        lines,
        ["whoami", "balance", r#"confirm_transfer:{"amount":7}"#],
        "{run:#?}"
    );
    let (whoami, balance, transfer) = (
        run.calls[0]["text"].as_str().unwrap(),
        run.calls[1]["text"].as_str().unwrap(),
        run.calls[2]["text"].as_str().unwrap(),
    );
    let (worker, rest) = transfer.split_once(':').unwrap_or_else(|| panic!("{run:#?}"));
    assert_eq!(rest, "transferred 7 code=otp-7", "{run:#?}");
    let balance_worker = balance
        .strip_suffix(":balance 100")
        .unwrap_or_else(|| panic!("{run:#?}"));

    // The wire: the transfer's first send refused, round 1 with the second token, rounds 2 and
    // 3 (the router's sealed requestState echoed) with the third one, obtained between rounds 1
    // and 2.
    let transfers = requests_where(&run, |r| r["mcp_name"] == "confirm_transfer");
    assert_eq!(
        field(&transfers, "status"),
        json!([403, 200, 200, 200]),
        "{transfers:#?}"
    );
    assert_eq!(field(&transfers, "token"), json!([0, 1, 2, 2]), "{transfers:#?}");
    assert_eq!(
        field(&transfers, "request_state"),
        json!([null, null, "mrt2", "mrt2"]),
        "{transfers:#?}"
    );
    let balances = requests_where(&run, |r| r["mcp_name"] == "balance");
    assert_eq!(
        (field(&balances, "status"), field(&balances, "token")),
        (json!([403, 200]), json!([1, 2])),
        "{balances:#?}"
    );
    assert_ne!(
        transfers[1]["to"], transfers[2]["to"],
        "rounds 1 and 2 through different replicas: {transfers:#?}"
    );
    assert_eq!(replicas_of(&transfers[1..]).len(), 2, "{transfers:#?}");
    assert_eq!(
        (run.http("POST /mcp 401"), run.http("POST /mcp 403")),
        (1, 2),
        "{run:#?}"
    );
    assert_eq!(
        run.token_scopes(),
        scopes(&[
            &["mcp:tools"],
            &["mcp:tools", "payments:write"],
            &["mcp:tools", "payments:write", "accounts:read"],
        ]),
        "each step-up asked for the union: {run:#?}"
    );

    // What the backends saw: the transfer's three rounds on its worker; whoami and the balance
    // wherever they were answered.
    let mut want_calls = vec![0.0; s.servers.len()];
    want_calls[s.index_of(worker)] += 3.0;
    want_calls[s.index_of(whoami)] += 1.0;
    want_calls[s.index_of(balance_worker)] += 1.0;
    assert_eq!(s.sent_to_backends("tools/call").await, want_calls, "{run:#?}");
    assert_eq!(s.router_errors("insufficient_scope").await.iter().sum::<f64>(), 2.0);
}

/// A legacy session (initialize, `Mcp-Session-Id`) through both replicas: a call needing
/// `accounts:read` is refused 403 mid-session, the SDK steps up, and the session goes on with
/// the new token on the instance that holds it (its per-session counter goes on counting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_session_stays_on_its_worker_when_the_token_steps_up() {
    let s = Setup::start().await;
    let run = s
        .run(&[
            "--legacy", "--call", "counter", "--call", "balance", "--call", "counter",
        ])
        .await;
    let texts: Vec<&str> = run.calls.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let worker = texts[0].strip_suffix(":1").unwrap_or_else(|| panic!("{run:#?}"));
    assert_eq!(
        texts,
        [
            format!("{worker}:1"),
            format!("{worker}:balance 100"),
            format!("{worker}:2")
        ],
        "one session, one instance: {run:#?}"
    );

    // The wire: after initialize, every request names the router's sealed session id, through
    // both replicas; the balance is refused once, then sent again with the second token, which
    // the session's next call carries too.
    let in_session = requests_where(&run, |r| !r["session"].is_null());
    assert!(in_session.iter().all(|r| r["session"] == "mrt2"), "{in_session:#?}");
    assert_eq!(replicas_of(&in_session).len(), 2, "{in_session:#?}");
    let calls = requests_where(&run, |r| r["mcp_method"] == "tools/call");
    assert_eq!(
        (
            field(&calls, "mcp_name"),
            field(&calls, "status"),
            field(&calls, "token")
        ),
        (
            json!(["counter", "balance", "balance", "counter"]),
            json!([200, 403, 200, 200]),
            json!([0, 0, 1, 1])
        ),
        "{calls:#?}"
    );
    assert_eq!(
        run.token_scopes(),
        scopes(&[&["mcp:tools"], &["mcp:tools", "accounts:read"]]),
        "{run:#?}"
    );

    // Everything the session sent reached its instance, nothing the other one.
    let sent = s.sent_in_all().await;
    let w = s.index_of(worker);
    assert!(
        sent[w] >= 6.0 && sent.iter().enumerate().all(|(i, &n)| i == w || n == 0.0),
        "{sent:?}"
    );
}
