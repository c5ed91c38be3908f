//! Header hygiene and the upstream request: hop-by-hop headers out (both ways), `Host` and the
//! `X-Forwarded-*` set in, `Content-Length` kept exact.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Version};
use http_body_util::{Either, Full};

use crate::dialect::{NAME_HEADER, SESSION_HEADER};
use crate::upstream::{Backend, ClientBody, UpstreamBody};

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1; `Upgrade` is not proxied).
const HOP_BY_HOP_COUNT: usize = 9;
static HOP_BY_HOP: [HeaderName; HOP_BY_HOP_COUNT] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Which of [`HOP_BY_HOP`] a message carries and what its `Content-Length` says, found in one
/// pass over its headers; `each` sees every other header on the way. A pass over a handful of
/// names is cheaper than the hashed lookup of even one name (~280 instructions for
/// `Content-Length`), so the answer's observation reads the headers it wants in the same pass.
pub(super) fn scan_head(headers: &HeaderMap, mut each: impl FnMut(&HeaderName, &HeaderValue)) -> HeadScan {
    let mut scan = HeadScan {
        hop_by_hop: [false; HOP_BY_HOP_COUNT],
        length: ContentLength::UNKNOWN,
    };
    let mut lengths = 0u32;
    for (name, value) in headers {
        if let Some(i) = hop_by_hop_index(name) {
            scan.hop_by_hop[i] = true;
        } else if *name == header::CONTENT_LENGTH {
            lengths += 1;
            scan.length = ContentLength(decimal(value.as_bytes()).filter(|_| lengths == 1));
        } else {
            each(name, value);
        }
    }
    scan
}

/// What [`scan_head`] found in a message's headers.
pub(super) struct HeadScan {
    hop_by_hop: [bool; HOP_BY_HOP_COUNT],
    /// What `Content-Length` says, for [`set_content_length`].
    pub length: ContentLength,
}

/// A message's `Content-Length`: `Some(n)` when it has one such header and it is `n` in
/// plain decimal; `None` when it has none, several, or one that is not.
#[derive(Clone, Copy)]
pub(super) struct ContentLength(Option<u64>);

impl ContentLength {
    /// Not known: [`set_content_length`] sets it.
    pub const UNKNOWN: ContentLength = ContentLength(None);
}

/// What [`strip_found`] left: what `Content-Length` says now, and the headers `Connection`
/// named, removed with it (usually none). A value read in the [`scan_head`] pass under one
/// of those names is gone from the message.
pub(super) struct Stripped {
    pub length: ContentLength,
    pub named: Vec<HeaderName>,
}

/// Removes the hop-by-hop headers `scan` found, and those their `Connection` lists.
pub(super) fn strip_found(headers: &mut HeaderMap, scan: HeadScan) -> Stripped {
    let HeadScan {
        hop_by_hop: mut present,
        mut length,
    } = scan;
    let mut named = Vec::new();
    if !present.contains(&true) {
        return Stripped { length, named };
    }
    // Headers named in `Connection` are hop-by-hop too. Usually it says only `keep-alive` or
    // `close`, which names none. One lookup takes `Connection` out with all its values.
    if std::mem::take(&mut present[0]) {
        if let header::Entry::Occupied(e) = headers.entry(header::CONNECTION) {
            // Collecting from the values as they are drained cost ~400 instructions even when
            // there was nothing to collect; the plain case is checked first.
            if !e.iter().all(|v| is_plain_connection_value(v.as_bytes())) {
                named = e.iter().flat_map(names_in_connection_value).collect();
            }
            e.remove();
            for name in &named {
                headers.remove(name);
            }
            if named.contains(&header::CONTENT_LENGTH) {
                length = ContentLength::UNKNOWN;
            }
        }
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, p)| *p) {
        headers.remove(name);
    }
    Stripped { length, named }
}

/// Sets `Content-Length` to `len` unless it says so already (`said`, from [`scan_head`]): the
/// usual case, a body passed on unchanged, then costs nothing.
pub(super) fn set_content_length(headers: &mut HeaderMap, said: ContentLength, len: usize) {
    if said.0 != Some(len as u64) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
}

/// The header names a `Connection` value lists (besides `keep-alive` and `close`).
fn names_in_connection_value(v: &HeaderValue) -> Vec<HeaderName> {
    v.to_str()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|n| !is_plain_connection_value(n.as_bytes()))
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect()
}

/// `keep-alive` and `close`: the `Connection` values that name no header.
fn is_plain_connection_value(v: &[u8]) -> bool {
    v.eq_ignore_ascii_case(b"keep-alive") || v.eq_ignore_ascii_case(b"close")
}

/// Which of [`HOP_BY_HOP`] `name` is. Most names are rejected by their length alone.
fn hop_by_hop_index(name: &HeaderName) -> Option<usize> {
    let name = name.as_str();
    // Indices into HOP_BY_HOP by name length: most names are rejected by their length alone,
    // the rest compared with the one or two of their length.
    let candidates: &[usize] = match name.len() {
        2 => &[5],
        7 => &[6, 8],
        10 => &[0, 1],
        16 => &[2],
        17 => &[7],
        18 => &[3],
        19 => &[4],
        _ => return None,
    };
    candidates.iter().copied().find(|&i| HOP_BY_HOP[i].as_str() == name)
}

/// `value` as a plain decimal number: digits only, no sign, no leading zeros but for 0 itself.
fn decimal(value: &[u8]) -> Option<u64> {
    if value.is_empty() || (value[0] == b'0' && value.len() > 1) {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The backend's own handles, where the client sent wrapped ones: they go back in their headers.
pub(super) struct Originals<'a> {
    /// `Mcp-Session-Id`.
    pub session: Option<&'a str>,
    /// The task id, in `Mcp-Name` (the body's `params.taskId` is restored with the body).
    pub task: Option<&'a str>,
}

/// `Mcp-Name` for `value`: as it is when it is safe ASCII, else `=?base64?…?=` (SEP-2243).
fn name_header(value: &str) -> HeaderValue {
    let safe = value.bytes().all(|b| (0x20..0x7f).contains(&b)) && !value.starts_with("=?");
    match safe.then(|| HeaderValue::from_str(value).ok()).flatten() {
        Some(v) => v,
        None => {
            use base64::Engine;
            let encoded = base64::engine::general_purpose::STANDARD.encode(value);
            HeaderValue::from_str(&format!("=?base64?{encoded}?=")).expect("base64 is a valid header value")
        }
    }
}

/// The request for `backend`, made of the client's (its head changed in place rather than
/// copied into a new one): its headers less hop-by-hop ones, then what the router owns set:
/// `Host`, the `X-Forwarded-*`, the backend's own handles and, with `[auth]`, the identity
/// headers. Set after the hop-by-hop removal, so a client's `Connection` can never name one away.
/// Inlined into its one caller: the request (280 bytes) is built where the driver keeps it.
#[inline(always)]
pub(super) fn build_upstream_request(
    mut parts: http::request::Parts,
    body: Either<Bytes, ClientBody>,
    backend: &Backend,
    peer: &HeaderValue,
    tls: bool,
    originals: Originals,
    identity: Option<super::gate::Identity>,
) -> Result<Request<UpstreamBody>, http::Error> {
    let target = backend.target_for(parts.uri.path_and_query())?;
    let headers = &mut parts.headers;
    let scan = scan_head(headers, |_, _| {});
    let length = strip_found(headers, scan).length;
    if let Some(identity) = identity {
        identity.write(headers);
    }
    if let Some(session) = originals.session {
        headers.insert(SESSION_HEADER, HeaderValue::from_str(session)?);
    }
    if let Some(task) = originals.task.filter(|_| headers.contains_key(NAME_HEADER)) {
        headers.insert(NAME_HEADER, name_header(task));
    }
    let host = headers.insert(header::HOST, backend.host().clone()).or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    if let Some(host) = host {
        headers.insert(X_FORWARDED_HOST, host);
    }
    // One lookup: the entry both reads a client's list and replaces it.
    match headers.entry(X_FORWARDED_FOR) {
        header::Entry::Occupied(mut e) => {
            let joined = e.get().to_str().ok().and_then(|prev| {
                HeaderValue::from_str(&format!("{prev}, {}", peer.to_str().unwrap_or("unknown"))).ok()
            });
            e.insert(joined.unwrap_or_else(|| peer.clone()));
        }
        header::Entry::Vacant(e) => {
            e.insert(peer.clone());
        }
    }
    headers.insert(
        X_FORWARDED_PROTO,
        HeaderValue::from_static(if tls { "https" } else { "http" }),
    );
    let body = match body {
        Either::Left(bytes) => {
            if !bytes.is_empty() || parts.method == Method::POST {
                set_content_length(headers, length, bytes.len());
            }
            Either::Left(Full::new(bytes))
        }
        Either::Right(incoming) => Either::Right(incoming),
    };
    parts.uri = http::Uri::from(target);
    parts.version = Version::HTTP_11;
    // What the listener's hyper noted about the client's request is not the backend's.
    parts.extensions.clear();
    Ok(Request::from_parts(parts, body))
}

/// Whether a header value (e.g. a content type) begins with `prefix`, in any case.
pub(super) fn starts_with_ignore_case(value: &[u8], prefix: &[u8]) -> bool {
    value.len() >= prefix.len() && value[..prefix.len()].eq_ignore_ascii_case(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip_hop_by_hop(headers: &mut HeaderMap) {
        let scan = scan_head(headers, |_, _| {});
        strip_found(headers, scan);
    }

    fn set_content_length(headers: &mut HeaderMap, len: usize) {
        let said = scan_head(headers, |_, _| {}).length;
        super::set_content_length(headers, said, len);
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_stripped_and_only_those() {
        let mut h = HeaderMap::new();
        for name in &HOP_BY_HOP {
            h.append(name.clone(), HeaderValue::from_static("v"));
        }
        h.append(header::CONNECTION, HeaderValue::from_static("Keep-Alive, X-A,x-b"));
        h.append(header::CONNECTION, HeaderValue::from_static("close"));
        for n in [
            "x-a",
            "x-b",
            "x-c",
            "content-type",
            "mcp-session-id",
            "te-x",
            "upgrades",
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static("v"));
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "mcp-session-id", "te-x", "upgrades", "x-c"]);

        // Only `keep-alive`: the common answer from nginx.
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.keys().collect::<Vec<_>>(), [header::CONTENT_LENGTH]);
    }

    #[test]
    fn decimal_lengths_are_compared_exactly() {
        for n in [0usize, 7, 10, 99, 100, 1_048_576, usize::MAX] {
            assert_eq!(decimal(n.to_string().as_bytes()), Some(n as u64), "{n}");
            assert_eq!(decimal(format!("0{n}").as_bytes()), None, "0{n}");
            assert_eq!(decimal(format!("{n} ").as_bytes()), None, "{n} with a space");
            assert_eq!(decimal(format!("+{n}").as_bytes()), None, "+{n}");
        }
        assert_eq!(decimal(b""), None);
        assert_eq!(decimal(b"12"), Some(12));
        assert_eq!(decimal(b"99999999999999999999999"), None, "beyond u64");
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_by_hop_index(name), Some(i), "{name}");
        }
    }

    #[test]
    fn the_scan_reads_content_length_once_and_forgets_it_when_connection_names_it() {
        let said = |h: &HeaderMap| scan_head(h, |_, _| {}).length.0;
        let mut h = HeaderMap::new();
        assert_eq!(said(&h), None);
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("42"));
        assert_eq!(said(&h), Some(42));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("42"));
        assert_eq!(said(&h), None, "two headers say nothing for sure");
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("042"));
        assert_eq!(said(&h), None);

        // `Connection: content-length` makes it hop-by-hop: stripped, so unknown, so set again.
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.insert(header::CONNECTION, HeaderValue::from_static("content-length"));
        let scan = scan_head(&h, |_, _| {});
        let stripped = strip_found(&mut h, scan);
        assert_eq!(stripped.named, [header::CONTENT_LENGTH]);
        let length = stripped.length;
        assert!(h.get(header::CONTENT_LENGTH).is_none());
        super::set_content_length(&mut h, length, 5);
        assert_eq!(h.get_all(header::CONTENT_LENGTH).iter().collect::<Vec<_>>(), ["5"]);
    }

    #[test]
    fn the_scan_shows_every_other_header_and_no_hop_by_hop_one() {
        let mut h = HeaderMap::new();
        h.append(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.append(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("1"));
        h.append(SESSION_HEADER, HeaderValue::from_static("s-1"));
        let mut seen = Vec::new();
        scan_head(&h, |n, v| seen.push(format!("{n}: {}", v.to_str().unwrap())));
        assert_eq!(
            seen,
            [
                "content-type: text/event-stream",
                "content-type: application/json",
                "mcp-session-id: s-1"
            ]
        );
    }

    #[test]
    fn content_length_is_set_unless_it_already_says_the_length() {
        let lengths = |h: &HeaderMap| h.get_all(header::CONTENT_LENGTH).iter().cloned().collect::<Vec<_>>();
        let mut h = HeaderMap::new();
        set_content_length(&mut h, 12);
        assert_eq!(lengths(&h), ["12"]);
        set_content_length(&mut h, 12);
        assert_eq!(lengths(&h), ["12"]);
        set_content_length(&mut h, 7);
        assert_eq!(lengths(&h), ["7"]);
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("7"));
        set_content_length(&mut h, 7);
        assert_eq!(lengths(&h), ["7"], "duplicates collapse to one");
    }
}
