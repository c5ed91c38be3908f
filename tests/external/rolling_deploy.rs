//! A rolling deploy of official-Python-SDK MCP servers behind the router while SDK clients list
//! and call tools (docs/src/catalog.md, docs/src/fleet.md). Three instances of version 1
//! (tests/interop/versioned_server.py) are replaced one by one with version 2, which adds a tool
//! (`summarize`) and widens one's schema (`lookup` takes a string id too). Each replacement adds
//! a v2 to the config, waits until `GET /backends` shows it serving, removes a v1 (it drains),
//! waits until nothing is in flight to it, and kills it. Meanwhile clients
//! (tests/interop/rolling_client.py) list the tools, then call one with arguments built from the
//! list they just got. With `[catalog]` on, no call may reach an instance that lacks its tool or
//! rejects its arguments; the control, with the catalog off, must show both (so the test can
//! fail). A third deploy runs servers that speak only the 2025 session protocol, which the
//! catalog must learn through `initialize`d sessions.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

use crate::support::*;
use crate::tools::idp::ReadyChild;
use crate::tools::{collect_stderr, sdk_script};

/// Concurrent client processes: enough that calls interleave, few enough for two cores.
const CLIENTS: usize = 3;

/// `tools/call`s the router passes in each mixed state of a stateless deploy (old and new
/// instances serving side by side) before the deploy moves on. Why this many: a keyless request
/// goes to the less busy of two random backends, about a fair draw among nearly idle ones, so in
/// a state of a old and b new instances a list comes from a new one with probability b/(a+b)
/// and the call after it reaches an old one with probability a/(a+b). A client calls `summarize`
/// (the third of v2's three callable tools, sorted) on every third iteration whose list came
/// from v2, and `lookup` with a string id on another third: without the catalog each such
/// iteration fails its way with probability ab/(a+b)^2, at least 3/16 (at a, b = 3, 1 or 1, 3).
/// Five mixed states of 80 calls make about 130 of each, so the chance that the control sees
/// no "unknown tool", or no "schema rejected", is below (13/16)^130, about 2e-12 (runs counted
/// 17 to 33 of each).
const STATELESS_HOLD: u64 = 80;

/// The same for the session deploy, which asserts what the catalog learned, not the counts:
/// a few calls in each state are enough to keep sessions opening and closing through it.
const SESSION_HOLD: u64 = 15;

/// The states of the deploy in which old and new instances serve together: (3 old, 1 new),
/// (2, 1), (2, 2), (1, 2) and (1, 3).
const MIXED_STATES: u64 = 5;

/// Any one wait of the deploy (each polls a real signal); generous for a loaded machine.
const WAIT: Duration = Duration::from_secs(30);

/// A tool list, as `/catalog` names a backend's tools (sorted).
const V1_TOOLS: [&str; 3] = ["delete_item", "lookup", "search"];
const V2_TOOLS: [&str; 4] = ["delete_item", "lookup", "search", "summarize"];

/// Which protocol the servers serve and the clients speak.
#[derive(Clone, Copy, PartialEq)]
enum Protocol {
    /// Servers serve both; clients speak 2026-07-28, each list and call a request of its own.
    Stateless,
    /// Servers serve only 2025 sessions; clients list in one session and call in a fresh one.
    Session,
}

impl Protocol {
    fn client_mode(self) -> &'static str {
        match self {
            Protocol::Stateless => "stateless",
            Protocol::Session => "session",
        }
    }
}

/// One versioned_server.py process, killed on drop.
struct Instance {
    spec: BackendSpec,
    _process: ReadyChild,
}

async fn start_instance(version: u8, index: usize, protocol: Protocol) -> Instance {
    let name = format!("v{version}-{index}");
    let mut command = Command::from(sdk_script("versioned_server.py"));
    command.args(["--version", &version.to_string(), "--port", "0", "--name", &name]);
    if protocol == Protocol::Session {
        command.arg("--session-only");
    }
    let (process, ready) = ReadyChild::start("versioned_server.py", command, |line| {
        line.strip_prefix("READY ").map(|p| json!(p.trim()))
    })
    .await;
    let spec = BackendSpec {
        url: format!("http://127.0.0.1:{}", ready.as_str().unwrap()),
        name,
        weight: 1,
    };
    Instance {
        spec,
        _process: process,
    }
}

/// Three instances of each version, started together so that their imports overlap (a deploy
/// would start each v2 just before adding it; the router sees only the config either way).
async fn start_instances(protocol: Protocol) -> (Vec<Instance>, Vec<Instance>) {
    let start = |version| futures_util::future::join_all((0..3).map(move |i| start_instance(version, i, protocol)));
    tokio::join!(start(1), start(2))
}

/// rolling_client.py processes; each stops when its stdin closes.
struct Clients(Vec<(Child, Arc<Mutex<String>>)>);

impl Clients {
    fn start(url: &str, protocol: Protocol) -> Clients {
        let clients = (0..CLIENTS)
            .map(|_| {
                let mut child = Command::from(sdk_script("rolling_client.py"))
                    .arg(url)
                    .args(["--mode", protocol.client_mode(), "--max-seconds", "120"])
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .expect("start rolling_client.py");
                let stderr = collect_stderr(&mut child);
                (child, stderr)
            })
            .collect();
        Clients(clients)
    }

    /// Closes every client's stdin and returns their summaries.
    async fn stop(mut self) -> Vec<Value> {
        // All at once: each ends the iteration under way, prints its summary and exits.
        for (child, _) in &mut self.0 {
            drop(child.stdin.take());
        }
        let mut summaries = Vec::new();
        for (child, stderr) in &mut self.0 {
            let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let summary = tokio::time::timeout(WAIT, async {
                let mut last = None;
                while let Ok(Some(line)) = lines.next_line().await {
                    last = serde_json::from_str::<Value>(&line).ok().or(last);
                }
                last
            })
            .await;
            let status = tokio::time::timeout(WAIT, child.wait()).await;
            match (summary, status) {
                (Ok(Some(summary)), Ok(Ok(status))) if status.success() => summaries.push(summary),
                (summary, status) => panic!("rolling_client.py: {summary:?} {status:?}\n{}", stderr.lock().unwrap()),
            }
        }
        summaries
    }
}

/// What the clients saw, summed over them.
struct Counts {
    iterations: u64,
    list_failures: u64,
    ok: u64,
    unknown_tool: u64,
    schema_rejected: u64,
    other: u64,
}

impl Counts {
    fn of(summaries: &[Value]) -> Counts {
        let sum = |path: &[&str]| -> u64 {
            summaries
                .iter()
                .map(|s| path.iter().fold(s, |v, key| &v[*key]).as_u64().unwrap())
                .sum()
        };
        Counts {
            iterations: sum(&["iterations"]),
            list_failures: sum(&["list_failures"]),
            ok: sum(&["calls", "ok"]),
            unknown_tool: sum(&["calls", "unknown_tool"]),
            schema_rejected: sum(&["calls", "schema_rejected"]),
            other: sum(&["calls", "other"]),
        }
    }
}

/// A deploy's outcome: the clients' counts and summaries, how many calls the router passed
/// while old and new instances served together, and when each step of the deploy was taken.
struct Outcome {
    counts: Counts,
    mixed_calls: u64,
    summaries: Vec<Value>,
    steps: Timeline,
    /// The router's catalog, routing and upstream error series at the end.
    metrics: Vec<String>,
}

impl Outcome {
    /// Everything a failed assertion should show: the counts, the deploy's steps and each
    /// client's summary (its refusals carry the same unix-ms clock as the steps).
    fn report(&self) -> String {
        let c = &self.counts;
        let mut text = format!(
            "{} iterations, {} list failures; calls: {} ok, {} unknown tool, {} schema rejected, {} other; ",
            c.iterations, c.list_failures, c.ok, c.unknown_tool, c.schema_rejected, c.other
        );
        text.push_str(&format!(
            "{} calls while old and new served\nsteps (unix ms):\n",
            self.mixed_calls
        ));
        for (at, step) in &self.steps {
            text.push_str(&format!("  {at} {step}\n"));
        }
        for summary in &self.summaries {
            text.push_str(&format!("client: {summary}\n"));
        }
        text.push_str(&self.metrics.join("\n"));
        text
    }
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A JSON document of the router's admin listener (`/backends`, `/catalog`) with its status.
/// (tests/it/catalog.rs has the same helper; support/ is compiled into both test binaries,
/// and one used by a single binary would be dead code in the other.)
async fn admin_json(client: &HttpClient, admin: std::net::SocketAddr, path: &str) -> (StatusCode, Value) {
    let a = send(client, Method::GET, &format!("http://{admin}{path}"), &[], Bytes::new()).await;
    (a.status, serde_json::from_slice(&a.body).unwrap_or(Value::Null))
}

/// `tools/call`s the router has passed so far.
async fn tool_calls(fleet: &Fleet) -> u64 {
    metric_sum(
        &fleet.metrics().await,
        "mrtr_requests_total",
        &["method=\"tools/call\""],
    ) as u64
}

/// Polls `probe` (every 50 ms) until it gives a value; fails after [`WAIT`] with `what` and the
/// last thing `probe` looked at.
async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Value>>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match probe().await {
            Ok(found) => return found,
            Err(seen) if tokio::time::Instant::now() >= deadline => {
                panic!("timed out after {WAIT:?} waiting for: {what}; last seen: {seen:#}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until the router has passed `calls` more `tools/call`s: the clients ran in this state.
async fn hold(fleet: &Fleet, calls: u64) {
    let until = tool_calls(fleet).await + calls;
    wait_for(&format!("{calls} more tools/call"), || async {
        let now = tool_calls(fleet).await;
        if now >= until {
            Ok(())
        } else {
            Err(json!(now))
        }
    })
    .await
}

/// `name`'s entry in `GET /backends`, if the router knows it.
async fn backend(fleet: &Fleet, name: &str) -> Option<Value> {
    let (status, doc) = admin_json(&fleet.client, fleet.admin, "/backends").await;
    assert_eq!(status, StatusCode::OK, "{doc}");
    doc["backends"].as_array()?.iter().find(|b| b["name"] == name).cloned()
}

/// Waits until `/backends` shows `name` serving: healthy, not draining, on the ring.
async fn wait_serving(fleet: &Fleet, name: &str) {
    wait_for(&format!("{name} serving"), || async {
        match backend(fleet, name).await {
            Some(b) if b["healthy"] == true && b["draining"] == false && b["on_ring"] == true => Ok(()),
            other => Err(json!(other)),
        }
    })
    .await
}

/// Waits until `/backends` shows `name` drained: nothing in flight and no pin, or forgotten.
async fn wait_drained(fleet: &Fleet, name: &str) {
    wait_for(&format!("{name} drained"), || async {
        match backend(fleet, name).await {
            None => Ok(()),
            Some(b) if b["draining"] == true && b["inflight"] == 0 && b["pins"] == 0 => Ok(()),
            Some(b) => Err(b),
        }
    })
    .await
}

/// Waits until `/catalog` shows each of `names` learned, its last ask answered, with `tools`.
async fn wait_learned(fleet: &Fleet, names: &[&str], tools: &[&str]) {
    wait_for(&format!("the catalog to learn {names:?} serving {tools:?}"), || async {
        let (_, doc) = admin_json(&fleet.client, fleet.admin, "/catalog").await;
        let learned = |name: &&str| {
            doc["backends"].as_array().is_some_and(|bs| {
                bs.iter().any(|b| {
                    let listed: Vec<&str> = b["tools"].as_array().map_or(Vec::new(), |ts| {
                        let mut names: Vec<&str> = ts.iter().filter_map(|t| t["name"].as_str()).collect();
                        names.sort_unstable();
                        names
                    });
                    b["name"] == *name
                        && !b["learned_unix_ms"].is_null()
                        && b["last_error"].is_null()
                        && listed == tools
                })
            })
        };
        if names.iter().all(learned) {
            Ok(())
        } else {
            Err(doc)
        }
    })
    .await
}

/// Waits until `/catalog` shows the drift a half-done deploy makes: `lookup` and `search` each
/// in two definitions (v2 widened one's schema and annotated the other).
async fn wait_drifted(fleet: &Fleet) {
    wait_for("the catalog to show lookup and search in two definitions", || async {
        let (_, doc) = admin_json(&fleet.client, fleet.admin, "/catalog").await;
        let definitions = |name: &str| {
            doc["tools"].as_array().and_then(|ts| {
                ts.iter()
                    .find(|t| t["name"] == name)
                    .and_then(|t| t["definitions"].as_array().map(Vec::len))
            })
        };
        if definitions("lookup") == Some(2) && definitions("search") == Some(2) {
            Ok(())
        } else {
            Err(doc)
        }
    })
    .await
}

/// A session-only instance refuses the 2026-07-28 protocol: the catalog can learn it only
/// through a 2025 session.
async fn assert_refuses_the_modern_protocol(fleet: &Fleet, instance: &BackendSpec) {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}});
    let headers = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "server/discover"),
        ("accept", "application/json, text/event-stream"),
        ("content-type", "application/json"),
    ];
    let url = format!("{}/mcp", instance.url);
    let a = send(
        &fleet.client,
        Method::POST,
        &url,
        &headers,
        Bytes::from(discover.to_string()),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{a:?}");
}

/// Deploy steps and other events, at unix-ms times (the clients note their refusals likewise).
type Timeline = Vec<(u128, String)>;

/// Notes when `/catalog` first shows each backend learned (polled every 50 ms), so that the
/// report tells a call refused before the catalog knew a new instance from one refused after.
struct CatalogWatch {
    notes: Arc<Mutex<Timeline>>,
    watching: tokio::task::JoinHandle<()>,
}

impl CatalogWatch {
    fn start(fleet: &Fleet) -> CatalogWatch {
        let notes = Arc::new(Mutex::new(Vec::new()));
        let (client, admin, noted) = (fleet.client.clone(), fleet.admin, notes.clone());
        let watching = tokio::spawn(async move {
            let mut seen = std::collections::HashSet::new();
            loop {
                let (_, doc) = admin_json(&client, admin, "/catalog").await;
                for b in doc["backends"].as_array().into_iter().flatten() {
                    let name = b["name"].as_str().unwrap_or_default().to_string();
                    if !b["learned_unix_ms"].is_null() && seen.insert(name.clone()) {
                        noted
                            .lock()
                            .unwrap()
                            .push((unix_ms(), format!("{name} learned by the catalog")));
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        CatalogWatch { notes, watching }
    }

    /// Stops watching; what it noted.
    fn stop(self) -> Timeline {
        self.watching.abort();
        std::mem::take(&mut *self.notes.lock().unwrap())
    }
}

/// The router's config besides the backends.
fn config(catalog: bool) -> String {
    // A finished session's pin stays `replay_window` (a minute by default) and `/backends`
    // counts it: a second is enough here, so that a drained instance shows no pins soon.
    let routing = "[routing]\nreplay_window = \"1s\"\n";
    match catalog {
        true => format!("{routing}[catalog]\nenabled = true\ninterval = \"1s\"\n"),
        false => routing.to_string(),
    }
}

/// Starts three v1 instances behind a router (`[catalog]` on or off), starts the clients, and
/// replaces each v1 with a v2 in turn, `hold_calls` calls in each state (and while each old
/// instance drains); then stops the clients.
async fn rolling_deploy(protocol: Protocol, catalog: bool, hold_calls: u64) -> Outcome {
    let (old, new) = start_instances(protocol).await;
    let mut serving: Vec<BackendSpec> = old.iter().map(|i| i.spec.clone()).collect();
    let fleet = Fleet::start_backends(Vec::new(), &serving, &config(catalog)).await;
    if protocol == Protocol::Session {
        assert_refuses_the_modern_protocol(&fleet, &old[0].spec).await;
    }
    let watch = catalog.then(|| CatalogWatch::start(&fleet));
    if catalog {
        wait_learned(&fleet, &["v1-0", "v1-1", "v1-2"], &V1_TOOLS).await;
    }
    let clients = Clients::start(&fleet.url(), protocol);
    // The clients are under way once the router passes their calls.
    hold(&fleet, 2 * CLIENTS as u64).await;

    let mut steps = Vec::new();
    let (mixed_from, mut mixed_calls) = (tool_calls(&fleet).await, 0);
    for (step, (retired, added)) in old.into_iter().zip(&new).enumerate() {
        serving.push(added.spec.clone());
        steps.push((unix_ms(), format!("{} added", added.spec.name)));
        fleet.reconfigure(&serving);
        wait_serving(&fleet, &added.spec.name).await;
        steps.push((unix_ms(), format!("{} serving", added.spec.name)));
        hold(&fleet, hold_calls).await;
        if catalog && step == 0 {
            wait_drifted(&fleet).await;
        }
        serving.retain(|s| s.name != retired.spec.name);
        steps.push((unix_ms(), format!("{} removed", retired.spec.name)));
        fleet.reconfigure(&serving);
        if step + 1 == new.len() {
            // The last old instance is out: the new version serves alone from here.
            mixed_calls = tool_calls(&fleet).await - mixed_from;
        }
        // Calls go on while it drains, and only then is `/backends` trusted: the router counts
        // a request in flight once it connects, after routing it on the config it started
        // under, so right after the reload a request that started before may still be on its
        // way to the removed instance while `/backends` shows it idle (seen: killed 12 ms after
        // the reload, a call reset). Many calls later, no such request is left.
        hold(&fleet, hold_calls).await;
        wait_drained(&fleet, &retired.spec.name).await;
        let name = retired.spec.name.clone();
        drop(retired);
        steps.push((unix_ms(), format!("{name} drained and killed")));
    }
    // A little more with the old instances gone.
    hold(&fleet, hold_calls / 2).await;
    if catalog {
        wait_learned(&fleet, &["v2-0", "v2-1", "v2-2"], &V2_TOOLS).await;
    }
    let summaries = clients.stop().await;
    let metrics = fleet.metrics().await;
    let metrics = metrics
        .lines()
        .filter(|l| {
            [
                "mrtr_catalog_",
                "mrtr_tool_",
                "mrtr_route_decisions_total",
                "mrtr_upstream_errors_total",
                "mrtr_retries_total",
            ]
            .iter()
            .any(|p| l.starts_with(p))
        })
        .map(String::from)
        .collect();
    if let Some(watch) = watch {
        steps.extend(watch.stop());
        steps.sort();
    }
    Outcome {
        counts: Counts::of(&summaries),
        mixed_calls,
        summaries,
        steps,
        metrics,
    }
}

/// With the catalog on, a client that listed v2's tools and calls `summarize`, or `lookup` with
/// a string id, reaches a v2 instance: no call meets "Unknown tool" or a schema refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_behind_the_catalog_sends_no_call_where_its_tool_or_arguments_are_refused() {
    let run = rolling_deploy(Protocol::Stateless, true, STATELESS_HOLD).await;
    println!("catalog on, 2026-07-28: {}", run.report());
    let c = &run.counts;
    assert!(c.ok > 0, "{}", run.report());
    assert_eq!(
        (c.list_failures, c.other),
        (0, 0),
        "a drained deploy loses nothing: {}",
        run.report()
    );
    assert_eq!(
        (c.unknown_tool, c.schema_rejected),
        (0, 0),
        "no call reaches an instance without its tool or refusing its arguments: {}",
        run.report()
    );
}

/// The control: the same deploy with the catalog off calls old instances for new tools and
/// sends them arguments only the new schema accepts. Both must be seen, or the test above could
/// not fail; enough calls in the mixed states make seeing them certain (see [`STATELESS_HOLD`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_catalog_the_same_deploy_calls_old_instances_for_new_tools() {
    let run = rolling_deploy(Protocol::Stateless, false, STATELESS_HOLD).await;
    println!("catalog off, 2026-07-28: {}", run.report());
    assert!(run.mixed_calls >= MIXED_STATES * STATELESS_HOLD, "{}", run.report());
    let c = &run.counts;
    assert_eq!(
        (c.list_failures, c.other),
        (0, 0),
        "a drained deploy loses nothing: {}",
        run.report()
    );
    assert!(
        c.unknown_tool > 0,
        "no call of summarize reached a v1 instance: {}",
        run.report()
    );
    assert!(
        c.schema_rejected > 0,
        "no string-id lookup reached a v1 instance: {}",
        run.report()
    );
}

/// Servers that speak only the 2025 session protocol: the catalog learns each instance's
/// tools through an `initialize`d session, v1's at the start, the drift half-way and v2's at
/// the end (all checked inside the deploy). A call in a 2025 session goes to the session's
/// backend (docs/src/catalog.md), and a fresh session is opened before the tool is known, so
/// the clients' "unknown tool" and "schema rejected" counts are printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_learns_session_servers_through_a_rolling_deploy() {
    let run = rolling_deploy(Protocol::Session, true, SESSION_HOLD).await;
    println!("catalog on, 2025 sessions: {}", run.report());
    let c = &run.counts;
    assert!(c.ok > 0, "{}", run.report());
    assert_eq!(
        (c.list_failures, c.other),
        (0, 0),
        "a drained deploy loses nothing: {}",
        run.report()
    );
}
