//! tests/interop/warm.py, which every SDK script of these tests runs through
//! ([`crate::tools::sdk_script`]): a script forked from the warm interpreter gets what a plain
//! `python -u SCRIPT` would (arguments, environment, directory, stdin, stdout, its exit status),
//! and dies with the process the test started: a test's `kill()` must stop a server.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::tools::sdk_script;

const PROBE: &str = r#"
import os, sys
import mcp  # the SDK, imported already in the forking interpreter
print("pid", os.getpid())
print("seen", os.environ.get("WARM_PROBE"), "|".join(sys.argv[1:]), os.getcwd())
line = sys.stdin.readline().strip()
if line == "hold":
    sys.stdin.readline()  # until stdin closes: what the test's kill() must end
sys.exit(int(line) if line.isdigit() else 0)
"#;

/// Writes the probe script into `dir`; its absolute path stands for a file of tests/interop/.
fn probe(dir: &std::path::Path) -> String {
    let path = dir.join("probe.py");
    std::fs::write(&path, PROBE).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Whether the process `pid` (not a child of this one: the forking interpreter's) has ended
/// within `limit`, waited for on a pidfd rather than polled.
fn ends_within(pid: i32, limit: Duration) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return true; // already gone (ESRCH)
    }
    // SAFETY: `fd` was just opened and is owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut poll = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let ready = unsafe { libc::poll(&mut poll, 1, limit.as_millis() as i32) };
    ready == 1
}

#[tokio::test]
async fn a_forked_script_gets_what_python_would_and_dies_with_its_launcher() {
    let dir = tempfile::tempdir().unwrap();
    let script = probe(dir.path());

    // Arguments, environment, directory, stdin and stdout, and the exit status, passed through.
    let mut run = tokio::process::Command::from(sdk_script(&script));
    run.args(["a b", "c"])
        .env("WARM_PROBE", "here")
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    let mut child = run.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"7\n").await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the probe ends")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seen = format!("seen here a b|c {}", dir.path().canonicalize().unwrap().display());
    assert!(stdout.lines().any(|l| l == seen), "{stdout}");
    assert_eq!(out.status.code(), Some(7), "{stdout}");

    // Killed (SIGKILL, which the launcher cannot pass on), the launcher takes the script along.
    let mut run = tokio::process::Command::from(sdk_script(&script));
    run.stdin(Stdio::piped()).stdout(Stdio::piped()).kill_on_drop(true);
    let mut child = run.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hold\n").await.unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the probe starts")
        .unwrap()
        .unwrap();
    let pid: i32 = first.strip_prefix("pid ").expect("its pid first").parse().unwrap();
    assert_ne!(
        Some(pid as u32),
        child.id(),
        "the script runs in a forked process, not the launcher"
    );
    assert!(!ends_within(pid, Duration::ZERO), "the script holds until stdin closes");
    child.kill().await.unwrap();
    assert!(
        ends_within(pid, Duration::from_secs(5)),
        "the script {pid} outlived its launcher's SIGKILL"
    );
    drop(stdin);
}
