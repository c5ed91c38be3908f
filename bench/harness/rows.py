"""The rows, as data: which peer, under which load, in which variant. Everything else (the
peer's config, the load tool, what is measured) follows from these fields, so a new row is one
line here. bench/README.md explains every row; the names of the rows bench/run.sh had are kept
as they were, so figures of earlier runs (docs/src/benchmarks.md, git history) compare.
"""

from dataclasses import dataclass

# peers
DIRECT, ROUTER, HAPROXY, NGINX, FLOOR = "direct", "router", "haproxy", "nginx", "floor"
# loads: what drives the row, and so which measuring flow runs it (bench/harness/runner.py)
MCP = "mcp"              # wrk + mcp.lua: short tools/call, a fresh key per request
MIX = "mix"              # wrk + mix.lua: 20% two-round calls, misroutes checked (+ SSE probe)
BIG = "big"              # wrk + big.lua: big body-keyed calls, messageId last, misroutes checked
H2 = "h2"                # h2load: HTTP/2 clients (h2c, or TLS with ALPN h2)
HANDSHAKE = "handshake"  # clients/tls_load.py: a new TLS connection per request
STREAMS = "streams"      # clients/sse_load.py: held SSE streams, memory per stream, event latency
IDLE = "idle"            # clients/sse_load.py: idle keep-alive connections, memory per connection
# upstream: what the proxy speaks to the backend nginx (bench/README.md, "TLS and HTTP/2 to the
# backends"); each has its own three backend ports (peers.Ports)
UP_H1 = "h1"             # HTTP/1.1 in clear text, kept alive: every row but the upstream ones
UP_TLS = "tls"           # HTTPS (HTTP/1.1 over TLS), the certificate checked for bench.test
UP_H2C = "h2c"           # HTTP/2 with prior knowledge, in clear text
UPSTREAMS = (UP_H1, UP_TLS, UP_H2C)

KIB = 1024


@dataclass(frozen=True)
class Row:
    name: str
    peer: str
    load: str
    desc: str
    key: str = "header"          # header: Mcp-Routing-Id (+ messageId); body: messageId only
    tls: bool = False            # the proxy's listener speaks TLS 1.3 (ECDSA P-256 certificate)
    h2: bool = False             # clients speak HTTP/2: h2c, or ALPN h2 when tls
    upstream: str = UP_H1        # proxy -> backend protocol: UP_H1, UP_TLS or UP_H2C
    workers: int = 1             # the router's MRTR_WORKER_THREADS
    fwd: bool = False            # HAProxy adds the X-Forwarded-* headers the router adds
    paced: bool = False          # mix rows: a pause per connection between answer and request
    awake: bool = False          # cores held out of halt by SCHED_IDLE busy loops
    body_bytes: int = 0          # big rows: exact size of each tools/call body
    bufsize: int = 0             # HAProxy tune.bufsize (0: HAProxy's default, 16 KiB)
    resume: bool = False         # handshake rows: offer the previous session (TLS resumption)
    expect_miss: bool = False    # a known correctness gap, shown; its misroutes do not fail the run
    baseline: str = "haproxy-header"  # the row the rps/hap and cpu/hap columns divide by
    plain: str = ""              # upstream rows: the same peer's plain-HTTP/1.1 row (the cost over it)
    one_core: bool = False       # the proxy on the load's cpu: no wake-up crosses vCPUs
    scan: bool = False           # floor rows: every body read whole and scanned (hyper_floor_scan)
    auth: str = ""               # [auth] on: each request carries an access token of this alg


def _r(*a, **k):
    return Row(*a, **k)


ROWS = [
    # --- the rows of bench/run.sh, names and meaning unchanged --------------------------------
    _r("direct", DIRECT, MCP, "wrk straight to one backend (ceiling of wrk + backend)"),
    _r("mrtr-header", ROUTER, MCP, "mrtr-router, 1 worker thread, key in Mcp-Routing-Id header (+ messageId)"),
    _r("mrtr-body", ROUTER, MCP, "mrtr-router, 1 worker thread, key only in body messageId", key="body"),
    _r("mrtr-mix", ROUTER, MIX, "mrtr-router, 1 worker thread, two-round calls (pending, then confirm), body-keyed", key="body"),
    _r("mrtr-mix-paced", ROUTER, MIX, "mrtr-router, the mrtr-mix load paced: a pause per connection between answer and request", key="body", paced=True),
    _r("mrtr-mix-paced-awake", ROUTER, MIX, "mrtr-router, the paced mix with both cores held out of halt (a SCHED_IDLE busy loop on each)", key="body", paced=True, awake=True),
    _r("mrtr-header-2w", ROUTER, MCP, "mrtr-router, MRTR_WORKER_THREADS=2, header-keyed", workers=2),
    _r("haproxy-header", HAPROXY, MCP, "HAProxy: balance hdr(Mcp-Routing-Id), hash-type consistent"),
    _r("haproxy-body", HAPROXY, MCP, "HAProxy: http-buffer-request + json_query('$.messageId'), balance hash var(txn.rk)", key="body"),
    _r("haproxy-header-fwd", HAPROXY, MCP, "HAProxy header-keyed config, adding the X-Forwarded-For/-Proto/-Host headers the router adds", fwd=True),
    _r("haproxy-body-fwd", HAPROXY, MCP, "HAProxy body-keyed config, adding the X-Forwarded-For/-Proto/-Host headers the router adds", key="body", fwd=True),
    _r("haproxy-mix", HAPROXY, MIX, "HAProxy body-keyed config, same two-round mix as mrtr-mix", key="body"),
    _r("haproxy-mix-paced", HAPROXY, MIX, "HAProxy body-keyed config, the paced mix of mrtr-mix-paced", key="body", paced=True),
    _r("haproxy-mix-paced-awake", HAPROXY, MIX, "HAProxy body-keyed config, the paced mix with both cores held out of halt", key="body", paced=True, awake=True),
    _r("nginx-header", NGINX, MCP, "nginx: hash $http_mcp_routing_id consistent, upstream keepalive 3 x connections"),
    _r("hyper-floor", FLOOR, MCP, "examples/hyper_floor.rs, 1 thread: hyper and tokio forwarding by a hash of Mcp-Routing-Id, no router logic (the floor under any hyper proxy)"),
    _r("hyper-floor-scan", FLOOR, MCP, "examples/hyper_floor_scan.rs: hyper-floor that reads each body whole and runs the router's envelope scan on it (400 parse_error for a body not JSON, as the router)", scan=True),

    # --- TLS at the listener (TLS 1.3, ECDSA P-256) --------------------------------------------
    _r("mrtr-tls-header", ROUTER, MCP, "mrtr-router, HTTPS keep-alive (wrk), header-keyed", tls=True, baseline="haproxy-tls-header"),
    _r("haproxy-tls-header", HAPROXY, MCP, "HAProxy, HTTPS keep-alive (wrk), header-keyed", tls=True, baseline="haproxy-tls-header"),
    _r("nginx-tls-header", NGINX, MCP, "nginx, HTTPS keep-alive (wrk), header-keyed", tls=True, baseline="haproxy-tls-header"),
    _r("mrtr-tls-handshake", ROUTER, HANDSHAKE, "mrtr-router, a new TLS connection per request: full handshake", tls=True, baseline="haproxy-tls-handshake"),
    _r("haproxy-tls-handshake", HAPROXY, HANDSHAKE, "HAProxy, a new TLS connection per request: full handshake", tls=True, baseline="haproxy-tls-handshake"),
    _r("nginx-tls-handshake", NGINX, HANDSHAKE, "nginx, a new TLS connection per request: full handshake", tls=True, baseline="haproxy-tls-handshake"),
    _r("mrtr-tls-resume", ROUTER, HANDSHAKE, "mrtr-router, a new TLS connection per request, resuming the last session", tls=True, resume=True, baseline="haproxy-tls-resume"),
    _r("haproxy-tls-resume", HAPROXY, HANDSHAKE, "HAProxy, a new TLS connection per request, resuming the last session", tls=True, resume=True, baseline="haproxy-tls-resume"),
    _r("nginx-tls-resume", NGINX, HANDSHAKE, "nginx, a new TLS connection per request, resuming the last session", tls=True, resume=True, baseline="haproxy-tls-resume"),

    # --- HTTP/2 clients (h2load, connections x streams), header-keyed -------------------------
    _r("mrtr-h2c", ROUTER, H2, "mrtr-router, h2load over h2c (prior knowledge)", h2=True, baseline="haproxy-h2c"),
    _r("haproxy-h2c", HAPROXY, H2, "HAProxy, bind proto h2, h2load over h2c", h2=True, baseline="haproxy-h2c"),
    _r("nginx-h2c", NGINX, H2, "nginx, listen http2 (h2c only), h2load over h2c", h2=True, baseline="haproxy-h2c"),
    _r("hyper-floor-h2c", FLOOR, H2, "examples/hyper_floor_h2c.rs: hyper-floor with hyper's HTTP/2 server at the listener, h2load over h2c (the floor under any hyper HTTP/2 proxy)", h2=True, baseline="haproxy-h2c"),
    _r("mrtr-h2-tls", ROUTER, H2, "mrtr-router, h2load over TLS 1.3 (ALPN h2)", h2=True, tls=True, baseline="haproxy-h2-tls"),
    _r("haproxy-h2-tls", HAPROXY, H2, "HAProxy, ssl alpn h2,http/1.1, h2load over TLS 1.3", h2=True, tls=True, baseline="haproxy-h2-tls"),
    _r("nginx-h2-tls", NGINX, H2, "nginx, listen ssl http2, h2load over TLS 1.3", h2=True, tls=True, baseline="haproxy-h2-tls"),

    # --- big bodies, body-keyed, messageId the last member -------------------------------------
    _r("mrtr-body-64k", ROUTER, BIG, "mrtr-router, body-keyed 64 KiB tools/call, messageId last", key="body", body_bytes=64 * KIB, baseline="haproxy-body-64k"),
    _r("haproxy-body-64k", HAPROXY, BIG, "HAProxy body-keyed, tune.bufsize 128 KiB (sees the key), 64 KiB calls", key="body", body_bytes=64 * KIB, bufsize=128 * KIB, baseline="haproxy-body-64k"),
    _r("haproxy-body-64k-defbuf", HAPROXY, BIG, "HAProxy body-keyed, default 16 KiB buffer, 64 KiB calls: json_query misses the key (expected)", key="body", body_bytes=64 * KIB, expect_miss=True, baseline="haproxy-body-64k"),
    _r("mrtr-body-1m", ROUTER, BIG, "mrtr-router, body-keyed 1 MiB tools/call, messageId last (max_body_bytes 2 MiB)", key="body", body_bytes=1024 * KIB, baseline="haproxy-body-1m"),
    _r("haproxy-body-1m", HAPROXY, BIG, "HAProxy body-keyed, tune.bufsize 1 MiB + 64 KiB (sees the key), 1 MiB calls", key="body", body_bytes=1024 * KIB, bufsize=1088 * KIB, baseline="haproxy-body-1m"),

    # --- open streams at scale, and idle keep-alive connections -------------------------------
    _r("mrtr-streams", ROUTER, STREAMS, "mrtr-router, held SSE streams (BENCH_STREAMS) + events on random streams", awake=True, baseline="haproxy-streams"),
    _r("haproxy-streams", HAPROXY, STREAMS, "HAProxy header-keyed, held SSE streams + events on random streams", awake=True, baseline="haproxy-streams"),
    _r("nginx-streams", NGINX, STREAMS, "nginx (proxy_buffering off), held SSE streams + events on random streams", awake=True, baseline="haproxy-streams"),
    # The same three on ONE core (proxy, backend and client): an event crosses no vCPU, so what
    # the proxy adds is its own work, not this VM's cross-vCPU wake-ups (bench/README.md).
    _r("mrtr-streams-1core", ROUTER, STREAMS, "mrtr-router, held SSE streams + events, proxy on the load's core", awake=True, one_core=True, baseline="haproxy-streams-1core"),
    _r("haproxy-streams-1core", HAPROXY, STREAMS, "HAProxy header-keyed, held SSE streams + events, proxy on the load's core", awake=True, one_core=True, baseline="haproxy-streams-1core"),
    _r("nginx-streams-1core", NGINX, STREAMS, "nginx (proxy_buffering off), held SSE streams + events, proxy on the load's core", awake=True, one_core=True, baseline="haproxy-streams-1core"),
    _r("mrtr-idle-conns", ROUTER, IDLE, "mrtr-router, idle keep-alive client connections (BENCH_IDLE_CONNS) after one request each", baseline="haproxy-idle-conns"),
    _r("haproxy-idle-conns", HAPROXY, IDLE, "HAProxy, idle keep-alive client connections after one request each", baseline="haproxy-idle-conns"),
    _r("nginx-idle-conns", NGINX, IDLE, "nginx, idle keep-alive client connections after one request each", baseline="haproxy-idle-conns"),

    # --- TLS and HTTP/2 to the BACKENDS, the *-header load (wrk, mcp.lua header) --------------
    # Plain HTTP/1.1 client -> proxy -> backend nginx over HTTPS (test CA, certificate for
    # bench.test only, verified; kept alive, sessions resumed) or over h2c. nginx has no h2 row:
    # its proxy module speaks HTTP/1.0 and 1.1 upstream only (bench/README.md).
    _r("mrtr-upstream-tls", ROUTER, MCP, "mrtr-router, header-keyed, HTTPS to the backends ([upstream] tls_ca, tls_server_name bench.test)", upstream=UP_TLS, baseline="haproxy-upstream-tls", plain="mrtr-header"),
    _r("haproxy-upstream-tls", HAPROXY, MCP, "HAProxy header-keyed, server ... ssl verify required ca-file, sni/verifyhost bench.test, alpn http/1.1", upstream=UP_TLS, baseline="haproxy-upstream-tls", plain="haproxy-header"),
    _r("nginx-upstream-tls", NGINX, MCP, "nginx header-keyed, proxy_pass https://, proxy_ssl_verify on, proxy_ssl_name bench.test, proxy_ssl_session_reuse on", upstream=UP_TLS, baseline="haproxy-upstream-tls", plain="nginx-header"),
    _r("mrtr-upstream-h2", ROUTER, MCP, "mrtr-router, header-keyed, HTTP/2 to the backends over h2c ([upstream] http2 = true)", upstream=UP_H2C, baseline="haproxy-upstream-h2", plain="mrtr-header"),
    _r("haproxy-upstream-h2", HAPROXY, MCP, "HAProxy header-keyed, server ... proto h2 (h2c)", upstream=UP_H2C, baseline="haproxy-upstream-h2", plain="haproxy-header"),

    # --- [auth] on: the mrtr-header load, each request's access token verified (the same row
    # without [auth] is mrtr-header; bench/README.md, "Authorization") ---------------------------
    _r("mrtr-header-auth", ROUTER, MCP, "mrtr-router, header-keyed, [auth] on: every request's ES256 access token verified (examples/bench_token.rs)", auth="ES256"),
    _r("mrtr-header-auth-rs256", ROUTER, MCP, "mrtr-router, header-keyed, [auth] on with RS256 access tokens", auth="RS256"),
]

BY_NAME = {r.name: r for r in ROWS}
# Names a row was known by before, mapped to its name now. bench/run.sh's names are all kept
# as they were, so this is empty; a renamed row adds its old name here.
ALIASES: dict = {}


def select(spec):
    """Rows for a space- or comma-separated list of names and fnmatch patterns ('mrtr-*',
    'haproxy-tls-*'), in the order given (a pattern expands in table order), each once.
    Raises ValueError naming what matches nothing."""
    import fnmatch

    out, unknown = [], []
    for word in spec.replace(",", " ").split():
        word = ALIASES.get(word, word)
        names = [r.name for r in ROWS if fnmatch.fnmatchcase(r.name, word)]
        if not names:
            unknown.append(word)
        for n in names:
            if BY_NAME[n] not in out:
                out.append(BY_NAME[n])
    if unknown:
        raise ValueError(f"unknown row(s) {' '.join(unknown)} (see --list)")
    return out
