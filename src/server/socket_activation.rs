//! Listening sockets passed by systemd (socket activation, `sd_listen_fds(3)`): a restart
//! of the router leaves them open in systemd, so new connections queue in the kernel instead
//! of being refused while the next process starts.

use std::os::fd::{FromRawFd, RawFd};

use tokio::net::TcpListener;

/// The first passed descriptor (`SD_LISTEN_FDS_START`).
const FIRST_FD: RawFd = 3;

/// The sockets passed in `LISTEN_FDS` with their names (from `LISTEN_FDNAMES`, else `proxy`
/// then `admin` by position); empty when none were passed to this process.
pub fn listeners() -> std::io::Result<Vec<(String, TcpListener)>> {
    let count = match std::env::var("LISTEN_FDS") {
        Ok(n) => n
            .parse::<RawFd>()
            .map_err(|_| std::io::Error::other(format!("LISTEN_FDS={n:?} is not a number")))?,
        Err(_) => return Ok(Vec::new()),
    };
    // Meant for another process (a parent that did not clear it): not ours to take.
    if let Ok(pid) = std::env::var("LISTEN_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return Ok(Vec::new());
        }
    }
    let names: Vec<String> = std::env::var("LISTEN_FDNAMES")
        .map(|n| n.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    let by_position = ["proxy", "admin"];
    (0..count)
        .map(|i| {
            let fd = FIRST_FD + i;
            let name = names
                .get(i as usize)
                .cloned()
                .unwrap_or_else(|| by_position.get(i as usize).unwrap_or(&"").to_string());
            // SAFETY: systemd (or whoever set LISTEN_FDS for this process) hands these
            // descriptors to it; nothing else in the process owns them.
            let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
            listener
                .local_addr()
                .map_err(|e| std::io::Error::other(format!("passed descriptor {fd} is not a TCP listener: {e}")))?;
            listener.set_nonblocking(true)?;
            // CLOEXEC: the descriptors stay ours, not any child's.
            // SAFETY: fcntl on a descriptor this process owns.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
            Ok((name, TcpListener::from_std(listener)?))
        })
        .collect()
}
