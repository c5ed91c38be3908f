//! The keys of `[quotas]` and `[[quotas.tool]]`, declared: each one's name and meaning, and
//! for a key without a default what leaving it out means and an example, as the reference and
//! the example config print them. Reading and checking them is the section's (`super`).

use crate::config::reader::{key, Key};

// `[quotas]`, in the order the section reads them.
pub(super) const CALLER: Key = key(
    "caller",
    "Who a caller is: `principal` (the verified issuer and subject; needs `[auth]`), `header:NAME` \
     (that request header's value, as a trusted gateway sets it), or `ip` (the client IP: the peer, \
     or the `X-Forwarded-For` hop a `trusted_proxies` peer added; IPv6 by /64); a request without \
     a principal or the header is counted by IP.",
)
.unset("`principal` when `[auth]` is on, else `ip`")
.example("header:X-Api-Key");

pub(super) const TRUSTED_PROXIES: Key = key(
    "trusted_proxies",
    "Peers whose `X-Forwarded-For` is believed: the client IP is the right-most hop that is not \
     one of them; from any other peer the header is ignored. They are also the only peers whose \
     `caller = \"header:NAME\"` header is believed, and that caller needs them (`[\"0.0.0.0/0\", \"::/0\"]` \
     believes every peer).",
);

pub(super) const RATE: Key = key(
    "rate",
    "New calls a caller may start, `N/s` or `N/m` (GCRA); follow-ups of an admitted call are \
     never refused by it; past it, 429 `rate_limited`.",
)
.unset("no rate quota")
.example("20/s");

pub(super) const BURST: Key = key(
    "burst",
    "New calls a caller may start at once, beside the steady `rate`.",
)
.unset("the rate's N")
.example("40");

pub(super) const MAX_IN_FLIGHT: Key = key(
    "max_in_flight",
    "Requests a caller may have in flight at once, follow-ups and SSE streams included (until the \
     answer ends); past it, 429 `too_many_in_flight`.",
)
.unset("no in-flight quota")
.example("32");

pub(super) const MAX_OPEN_CALLS: Key = key(
    "max_open_calls",
    "Multi-round calls a caller may hold open (pinned) at once, so that no caller takes the pin \
     table; a new call past it is refused 429 `too_many_open_calls` before it reaches a backend.",
)
.unset("no open-calls quota (only `routing.max_pins`)")
.example("100");

pub(super) const MAX_BODY_BYTES_PER_CONNECTION: Key = key(
    "max_body_bytes_per_connection",
    "Request-body bytes one client connection may have buffered at once (HTTP/2 streams together), \
     between `server.max_body_bytes` and `server.max_body_buffer_bytes`.",
)
.unset("a connection may take all of `server.max_body_buffer_bytes`")
.example("8388608");

pub(super) const MAX_BODY_BYTES_PER_CALLER: Key = key(
    "max_body_bytes_per_caller",
    "Request-body bytes one caller may have buffered at once, all its connections together, \
     between `server.max_body_bytes` and `server.max_body_buffer_bytes`; past it, 503 \
     `router_overloaded`.",
)
.unset("a caller may take all of `server.max_body_buffer_bytes`")
.example("33554432");

pub(super) const MAX_TRACKED_CALLERS: Key = key(
    "max_tracked_callers",
    "Callers each quota keeps state for (idle ones are forgotten); past it, new callers share one \
     overflow entry with one caller's limits.",
);

pub(super) const STORE: Key = key(
    "store",
    "Where rate state lives: `local` (each replica counts alone), or \
     `redis://[user:password@]host[:port][/db]`, shared by every replica that names it (the rates \
     only; in-flight and open calls are always local).",
);

pub(super) const STORE_TIMEOUT: Key = key(
    "store_timeout",
    "A store round trip that takes longer fails, and `store_failure` decides.",
);

pub(super) const STORE_FAILURE: Key = key(
    "store_failure",
    "When the store fails or is slow: `open` admits the request, `closed` answers 503 \
     `quota_store_unavailable`.",
);

// One `[[quotas.tool]]`.
pub(super) const TOOL_NAME: Key =
    key("name", "The tool's name, as a `tools/call` request's body gives it.").example("search");

pub(super) const TOOL_RATE: Key = key(
    "rate",
    "New calls of this tool a caller may start, `N/s` or `N/m`; past it, 429 `rate_limited`.",
)
.unset("no rate quota for this tool")
.example("2/s");

pub(super) const TOOL_BURST: Key = key("burst", "Calls of this tool a caller may start at once.")
    .unset("the rate's N")
    .example("4");

pub(super) const TOOL_MAX_IN_FLIGHT: Key = key(
    "max_in_flight",
    "Calls of this tool in flight at once, all callers together, so a slow tool cannot take every \
     connection of its backends; past it, 429 `too_many_in_flight`.",
)
.unset("no in-flight quota for this tool")
.example("16");
