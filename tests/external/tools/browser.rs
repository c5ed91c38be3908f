//! Headless Chromium (Debian's `chromium` package, `/usr/bin/chromium`) driven by
//! tests/browser/driver.mjs through playwright-core (pinned by tests/browser/package-lock.json),
//! run by node as a child process: one JSON command per line in, one JSON answer per line out.
//!
//! `MRTR_BROWSER_DIR` (exported by scripts/test.sh from `bash tests/browser/setup.sh`) names
//! tests/browser with its node_modules installed; without it these tests fail, they never skip.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long the browser may take to start, and one command to answer.
const DEADLINE: Duration = Duration::from_secs(60);

/// A running browser. [`Browser::close`] ends it and waits for the browser to exit; dropped
/// otherwise (a failed test), the driver is killed. Either way its profile folder is removed.
pub struct Browser {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub async fn start() -> Browser {
        let dir = std::env::var_os("MRTR_BROWSER_DIR").map(PathBuf::from).expect(
            "MRTR_BROWSER_DIR is not set: run `export MRTR_BROWSER_DIR=\"$(bash tests/browser/setup.sh | tail -n1)\"` \
             (needs node, npm and Debian's chromium) before `cargo test --features external-tests`",
        );
        assert!(
            dir.join("node_modules/playwright-core").is_dir(),
            "{} has no node_modules/playwright-core: run bash tests/browser/setup.sh",
            dir.display()
        );
        let profile = tempfile::Builder::new()
            .prefix("mrtr-status-page-")
            .tempdir()
            .expect("a profile folder for the browser");
        let mut child = Command::new("node")
            .arg("driver.mjs")
            .arg(profile.path())
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start node tests/browser/driver.mjs");
        let stdin = child.stdin.take().unwrap();
        let stderr = super::collect_stderr(&mut child);
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut browser = Browser {
            child,
            stdin,
            stdout,
            stderr,
            _profile: profile,
        };
        let ready = browser.line().await;
        assert_eq!(ready["ready"], true, "{ready}");
        browser
    }

    async fn line(&mut self) -> Value {
        match tokio::time::timeout(DEADLINE, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}")),
            other => panic!(
                "the browser driver said nothing ({other:?}); its stderr:\n{}",
                self.stderr.lock().unwrap()
            ),
        }
    }

    /// Sends one command and returns its answer's `ok` value; fails on the driver's error.
    pub async fn call(&mut self, command: Value) -> Value {
        let mut line = command.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to the driver");
        let answer = self.line().await;
        match answer.get("ok") {
            Some(ok) => ok.clone(),
            None => panic!(
                "{command} failed in the browser: {}",
                answer["error"].as_str().unwrap_or("?")
            ),
        }
    }

    pub async fn goto(&mut self, url: &str) -> Value {
        self.call(json!({"op": "goto", "url": url})).await
    }

    /// Waits for `more` updates of the page (one a second).
    pub async fn wait_updates(&mut self, more: u32) {
        self.call(json!({"op": "wait_updates", "more": more})).await;
    }

    /// What the page shows now.
    pub async fn read(&mut self) -> Value {
        self.call(json!({"op": "read"})).await
    }

    /// Closes the driver's stdin, so it closes the browser and exits, and waits for that: a browser
    /// killed instead may still write to its profile folder after the folder is removed.
    pub async fn close(self) {
        let Browser { mut child, stdin, .. } = self;
        drop(stdin);
        match tokio::time::timeout(DEADLINE, child.wait()).await {
            Ok(status) => assert!(status.expect("wait for the driver").success()),
            Err(_) => panic!("the browser driver did not exit within {DEADLINE:?} of its stdin closing"),
        }
    }
}
