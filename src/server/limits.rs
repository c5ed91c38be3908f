//! The process's share of file descriptors: the open-file limit raised as far as it goes at
//! start, and the client connections it can afford, so that a flood of clients never starves
//! the upstream connections, the health checks or the admin listener.

/// The open-file limit after raising the soft limit to the hard one: `(soft, hard)`.
pub fn raise_open_file_limit() -> std::io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: a valid rlimit, within the hard limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// The open-file soft limit now.
pub fn open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit for the call to fill in.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => lim.rlim_cur,
        _ => u64::MAX,
    }
}

/// How many client connections the router takes at once: the configured `max_connections`,
/// but never more than half of what the open-file limit leaves after a reserve (a quarter of
/// the limit, at most 256) for the admin listener, health checks and files: each client
/// connection may need an upstream connection too.
pub fn connection_cap(configured: usize, open_file_limit: u64) -> usize {
    let reserve = (open_file_limit / 4).min(256);
    let afford = open_file_limit.saturating_sub(reserve) / 2;
    configured.min(usize::try_from(afford).unwrap_or(usize::MAX)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_upstream_and_admin_sockets() {
        assert_eq!(connection_cap(10_000, 1 << 20), 10_000);
        assert_eq!(connection_cap(10_000, 20_000), 9_872);
        assert_eq!(connection_cap(10_000, 1024), 384);
        assert_eq!(connection_cap(10_000, 200), 75);
        assert_eq!(connection_cap(50, 200), 50);
        assert_eq!(connection_cap(10, 0), 1);
    }
}
