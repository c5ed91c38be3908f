//! `[log]`: the format of the router's own log lines and of the access log, and whether the
//! access log is written (one line per request, on stdout; see `crate::telemetry::access`).

use super::reader::{key, Section};
use super::{defaults, ConfigError};

#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// `text` (the default) or `json`: one JSON object per line, for the router's own logs
    /// (stderr; read at start) and the access log (stdout; follows a reload).
    pub format: LogFormat,
    /// One line per request on stdout. Follows a reload.
    pub access: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

pub(super) fn log(mut s: Section) -> Result<LogConfig, ConfigError> {
    let format = key(
        "format",
        "`text`, or `json` (one object per line), for the router's own logs (stderr; read at start only) \
         and the access log (stdout).",
    );
    let access = key("access", "`true`: one access-log line per request on stdout.");
    let log = LogConfig {
        format: s.choice(
            format,
            defaults::LOG_FORMAT,
            &[("text", LogFormat::Text), ("json", LogFormat::Json)],
        )?,
        access: s.bool(access, defaults::LOG_ACCESS)?,
    };
    s.finish(true)?;
    Ok(log)
}
