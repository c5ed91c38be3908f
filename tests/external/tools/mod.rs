//! The servers the external tests start beside the router: the test authorization server
//! (`oidc-provider` under node) and Redis; the browser that looks at the status page; and the
//! MCP Python SDK's scripts of tests/interop/ ([`sdk_script`]).

pub mod browser;
pub mod idp;
pub mod redis_server;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::process::Child;

/// A command that runs `script`, a file of tests/interop/, with the interop venv's python
/// (`MRTR_INTEROP_PYTHON`, else .venv-interop), forked from an interpreter that has imported the
/// SDK already (tests/interop/warm.py): each run is spared a second of CPU. Its output is
/// unbuffered, as with `python -u`; killing it kills the script.
pub fn sdk_script(script: &str) -> std::process::Command {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let py = std::env::var_os("MRTR_INTEROP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".venv-interop/bin/python"));
    assert!(
        py.exists(),
        "{} is missing: run `bash tests/interop/setup_venv.sh` (the README's test command does) to install the MCP SDK",
        py.display()
    );
    let mut command = std::process::Command::new(py);
    command
        .arg("-S")
        .arg(repo.join("tests/interop/warm.py"))
        .arg(repo.join("tests/interop").join(script));
    command
}

/// What `child` writes to stderr (piped), gathered as it comes: a failing test shows it.
pub fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().expect("stderr piped");
    let collected = stderr.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = err.read(&mut buf).await {
            collected.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    stderr
}
