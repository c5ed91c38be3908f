//! The Python SDK's OAuth pieces as child processes: tests/interop/oauth_resource_server.py (an
//! SDK resource server trusting an [`Idp`]), runs of tests/interop/oauth_client.py (the SDK's
//! OAuth client providers), and tests/interop/server.py (the SDK MCP servers the router fronts).

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::Command;

use super::{Idp, ReadyChild};
use crate::tools::sdk_script;

/// tests/interop/oauth_resource_server.py: an MCP server of the Python SDK that trusts tokens of
/// `idp` for its own URL; killed on drop.
pub struct SdkResourceServer {
    process: ReadyChild,
    /// Its MCP endpoint, which is also its resource identifier (the tokens' aud).
    pub url: String,
}

impl SdkResourceServer {
    /// `tool_scopes` are `TOOL=SCOPE` (a tool that needs one scope more than `mcp:tools`). The
    /// server's URL is added to `idp`'s resources.
    pub async fn start(idp: &Idp, tool_scopes: &[&str]) -> SdkResourceServer {
        let mut command = Command::from(sdk_script("oauth_resource_server.py"));
        command.args(["--port", "0", "--issuer", idp.issuer()]);
        for t in tool_scopes {
            command.args(["--tool-scope", t]);
        }
        let (process, ready) = ReadyChild::start("oauth_resource_server.py", command, |line| {
            line.strip_prefix("READY ").map(|p| json!(p.trim()))
        })
        .await;
        let url = format!("http://127.0.0.1:{}/mcp", ready.as_str().unwrap());
        idp.add_resource(&url).await;
        SdkResourceServer { process, url }
    }

    pub fn stderr(&self) -> String {
        self.process.stderr()
    }
}

/// tests/interop/server.py: one SDK MCP server instance named `name` (its answers say so), with
/// the SDK's per-process requestState key; killed on drop.
pub struct SdkMcpServer {
    process: ReadyChild,
    pub name: String,
    /// Its origin, `http://127.0.0.1:<port>` (the MCP endpoint is `/mcp` under it).
    pub origin: String,
}

impl SdkMcpServer {
    pub async fn start(name: &str) -> SdkMcpServer {
        let mut command = Command::from(sdk_script("server.py"));
        command.args(["--port", "0", "--name", name]);
        let (process, ready) = ReadyChild::start("server.py", command, |line| {
            line.strip_prefix("READY ").map(|p| json!(p.trim()))
        })
        .await;
        SdkMcpServer {
            process,
            name: name.to_string(),
            origin: format!("http://127.0.0.1:{}", ready.as_str().unwrap()),
        }
    }

    pub fn stderr(&self) -> String {
        self.process.stderr()
    }
}

/// What one tests/interop/oauth_client.py run printed.
#[derive(Debug)]
pub struct OAuthClientRun {
    pub success: bool,
    /// One line per --call: {"call", "ok", "text" | "error"}.
    pub calls: Vec<Value>,
    /// The last line: {"mode", "ok", "failed", "authorizations", "tokens", "http", ...}.
    pub summary: Value,
}

impl OAuthClientRun {
    /// How many exchanges of `key` ("METHOD path status") the run made.
    pub fn http(&self, key: &str) -> u64 {
        self.summary["http"][key].as_u64().unwrap_or(0)
    }

    /// Every request to the MCP origin(s), in order: {"to", "method", "mcp_method", "mcp_name",
    /// "status", "token" (index into the summary's "tokens"), "request_state", "session" (each
    /// up to its first ".", or null)}.
    pub fn requests(&self) -> &[Value] {
        self.summary["requests"].as_array().map_or(&[], Vec::as_slice)
    }

    /// The scopes of each access token the run obtained, in order, each sorted.
    pub fn token_scopes(&self) -> Vec<Vec<String>> {
        let tokens = self.summary["tokens"].as_array().map_or(&[][..], Vec::as_slice);
        tokens
            .iter()
            .map(|t| {
                let mut s: Vec<String> = t["scope"]
                    .as_str()
                    .unwrap_or_default()
                    .split(' ')
                    .map(String::from)
                    .collect();
                s.sort();
                s
            })
            .collect()
    }
}

/// Runs tests/interop/oauth_client.py against `url` with `args` (its mode first); bounded.
pub async fn oauth_client(url: &str, args: &[&str]) -> OAuthClientRun {
    let mut cmd = Command::from(sdk_script("oauth_client.py"));
    cmd.arg(url).args(args).args(["--timeout", "60"]);
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("oauth_client.py finished within 90 s")
        .expect("run oauth_client.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut lines: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let summary = match lines.pop() {
        Some(s) if s.get("mode").is_some() => s,
        _ => panic!("no summary from oauth_client.py {args:?}:\n{stdout}\n{stderr}"),
    };
    OAuthClientRun {
        success: out.status.success(),
        calls: lines,
        summary,
    }
}
