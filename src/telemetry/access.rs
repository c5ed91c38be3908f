//! The access log line (docs/src/observability.md): one per request, as JSON (`[log] format = "json"`) or as
//! `key=value` text. What goes in is chosen to be safe to keep: no header values but the
//! protocol version, no query string, no token, `requestState` or session id; every value is
//! cut to a bound when it is taken from the request ([`cut`]), so no request can make a long line.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use crate::config::LogFormat;

/// Longest value kept of each field that comes from the client (bytes, before escaping).
pub const MAX_PATH: usize = 256;
pub const MAX_MCP_METHOD: usize = 64;
pub const MAX_MCP_NAME: usize = 128;
/// The verified subject and client id (`[auth]`): issuers keep them short.
pub const MAX_SUBJECT: usize = 128;

/// One request's line.
pub struct AccessLine<'a> {
    pub ts: SystemTime,
    /// The client's IP (the TCP peer, or the PROXY header's source).
    pub client: &'a str,
    /// The client IP `[quotas]` counted, when a trusted proxy's `X-Forwarded-For` named
    /// another than `client`.
    pub client_ip: Option<&'a str>,
    pub http_method: &'a str,
    /// The request path, without its query (which may hold credentials).
    pub path: &'a str,
    pub mcp_method: Option<&'a str>,
    /// `params.name`: the tool (or prompt) called.
    pub mcp_name: Option<&'a str>,
    pub status: u16,
    pub backend: Option<&'a str>,
    /// `token`, `pin`, `ring` or `keyless`.
    pub route: Option<&'a str>,
    /// The pin the request used and any its answer created, e.g. `request_state used`.
    pub pin: Option<&'a str>,
    pub duration: Duration,
    pub bytes_out: u64,
    /// The `Mcp-Router-Error` reason when the router answered itself.
    pub error: Option<&'a str>,
    pub trace_id: Option<&'a str>,
    /// The verified caller (`[auth]`): the token's subject and client id.
    pub subject: Option<&'a str>,
    pub client_id: Option<&'a str>,
    /// The caller `[quotas]` counted the request against: an address, or a key's digest.
    pub caller: Option<&'a str>,
    /// The quota that refused the request and its scope, e.g. `rate/caller`.
    pub quota: Option<&'a str>,
}

impl AccessLine<'_> {
    /// The line, `\n` included.
    pub fn render(&self, format: LogFormat) -> Vec<u8> {
        let mut out = String::with_capacity(320);
        let ts = humantime::format_rfc3339_millis(self.ts).to_string();
        let ms = format!("{:.3}", self.duration.as_secs_f64() * 1000.0);
        let fields: [(&str, Value); 19] = [
            ("ts", Value::Str(Some(&ts))),
            ("client", Value::Str(Some(self.client))),
            ("client_ip", Value::Str(self.client_ip)),
            ("http_method", Value::Str(Some(self.http_method))),
            ("path", Value::Str(Some(self.path))),
            ("mcp_method", Value::Str(self.mcp_method)),
            ("mcp_name", Value::Str(self.mcp_name)),
            ("status", Value::Num(self.status as u64)),
            ("backend", Value::Str(self.backend)),
            ("route", Value::Str(self.route)),
            ("pin", Value::Str(self.pin)),
            ("duration_ms", Value::Raw(&ms)),
            ("bytes_out", Value::Num(self.bytes_out)),
            ("error", Value::Str(self.error)),
            ("trace_id", Value::Str(self.trace_id)),
            ("subject", Value::Str(self.subject)),
            ("client_id", Value::Str(self.client_id)),
            ("caller", Value::Str(self.caller)),
            ("quota", Value::Str(self.quota)),
        ];
        match format {
            LogFormat::Json => {
                out.push('{');
                let mut first = true;
                for (key, value) in &fields {
                    if value.is_absent() {
                        continue;
                    }
                    if !std::mem::take(&mut first) {
                        out.push(',');
                    }
                    let _ = write!(out, "\"{key}\":");
                    match value {
                        Value::Str(Some(s)) => json_string(&mut out, s),
                        Value::Num(n) => {
                            let _ = write!(out, "{n}");
                        }
                        Value::Raw(r) => out.push_str(r),
                        Value::Str(None) => {}
                    }
                }
                out.push('}');
            }
            LogFormat::Text => {
                // `<ts> access key=value ...`, a value quoted (JSON-escaped) when it needs it.
                out.push_str(&ts);
                out.push_str(" access");
                for (key, value) in fields.iter().skip(1) {
                    if value.is_absent() {
                        continue;
                    }
                    let _ = write!(out, " {key}=");
                    match value {
                        Value::Str(Some(s)) if is_bare(s) => out.push_str(s),
                        Value::Str(Some(s)) => json_string(&mut out, s),
                        Value::Num(n) => {
                            let _ = write!(out, "{n}");
                        }
                        Value::Raw(r) => out.push_str(r),
                        Value::Str(None) => {}
                    }
                }
            }
        }
        out.push('\n');
        out.into_bytes()
    }
}

enum Value<'a> {
    Str(Option<&'a str>),
    Num(u64),
    /// Already a number's text.
    Raw(&'a str),
}

impl Value<'_> {
    fn is_absent(&self) -> bool {
        matches!(self, Value::Str(None))
    }
}

/// Whether a text value can stand unquoted: printable ASCII, no space, quote, `=` or backslash.
fn is_bare(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'=' | b'\\'))
}

/// `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// At most `max` bytes of `s` (cut at a character boundary, `…` marking the cut).
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(mcp_name: Option<&'a str>, error: Option<&'a str>) -> AccessLine<'a> {
        AccessLine {
            ts: SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_123),
            client: "127.0.0.1",
            client_ip: None,
            http_method: "POST",
            path: "/mcp",
            mcp_method: Some("tools/call"),
            mcp_name,
            status: 200,
            backend: Some("worker-1"),
            route: Some("pin"),
            pin: Some("request_state used, request_state created"),
            duration: Duration::from_micros(1500),
            bytes_out: 87,
            error,
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736"),
            subject: None,
            client_id: None,
            caller: None,
            quota: None,
        }
    }

    #[test]
    fn json_lines_parse_and_absent_fields_are_left_out() {
        let text = line(Some("say \"hi\"\n\u{1}"), None).render(LogFormat::Json);
        assert_eq!(text.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(v["ts"], "2027-01-15T08:00:00.123Z");
        assert_eq!(v["mcp_name"], "say \"hi\"\n\u{1}");
        assert_eq!(v["status"], 200);
        assert_eq!(v["duration_ms"], 1.5);
        assert_eq!(v["bytes_out"], 87);
        assert!(v.get("error").is_none(), "{v}");
        assert_eq!(v.as_object().unwrap().len(), 13);
    }

    #[test]
    fn text_lines_quote_what_needs_it() {
        let text = String::from_utf8(line(Some("a b"), Some("no_backend")).render(LogFormat::Text)).unwrap();
        assert_eq!(
            text,
            "2027-01-15T08:00:00.123Z access client=127.0.0.1 http_method=POST path=/mcp mcp_method=tools/call \
             mcp_name=\"a b\" status=200 backend=worker-1 route=pin pin=\"request_state used, request_state created\" \
             duration_ms=1.500 bytes_out=87 error=no_backend trace_id=4bf92f3577b34da6a3ce929d0e0e4736\n"
        );
    }

    #[test]
    fn values_are_cut_at_a_character_boundary() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("aé", 2), "a…", "é is two bytes");
        assert!(cut(&"x".repeat(1_000_000), MAX_PATH).len() <= MAX_PATH + 3);
    }
}
