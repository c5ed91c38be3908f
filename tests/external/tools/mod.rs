//! The servers the external tests start beside the router: the test authorization server
//! (`oidc-provider` under node) and Redis; and the browser that looks at the status page.

pub mod browser;
pub mod idp;
pub mod redis_server;

use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::process::Child;

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
