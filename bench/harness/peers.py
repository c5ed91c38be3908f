"""The processes of a run: the backends (nginx for JSON-RPC answers, clients/sse_backend.py for
held streams) and each row's proxy, configured from the templates in bench/peers/, started on
its own core, checked ready (and, for TLS rows, that it speaks TLS 1.3), and stopped.

The backend nginx answers on three ports per upstream protocol (rows.UPSTREAMS): HTTP/1.1 in
clear text, HTTPS with a certificate for `bench.test` from a test CA made at run time, and h2c.

A proxy that cannot start is the row's failure (PeerError), not the run's; a backend that cannot
start ends the run (SettingError: the bench cannot measure anything without it).
"""

import http.client
import os
import re
import socket
import ssl
import string
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import rows
from .procs import LineReader
from .settings import SettingError

HOST = "127.0.0.1"


class Ports:
    """Every port of a run: bench/run.sh's, plus `offset` (BENCH_PORT_OFFSET) for a machine
    where something else holds them. All stay below the ephemeral range (32768)."""

    def __init__(self, offset=0):
        o = offset
        self.backend = (19001 + o, 19002 + o, 19003 + o)   # nginx: JSON-RPC answers, $connection log
        self.backend_tls = (19021 + o, 19022 + o, 19023 + o)  # the same nginx over HTTPS (bench.test)
        self.backend_h2c = (19031 + o, 19032 + o, 19033 + o)  # the same nginx over h2c only
        self.upstream = {rows.UP_H1: self.backend, rows.UP_TLS: self.backend_tls, rows.UP_H2C: self.backend_h2c}
        self.sse = (19011 + o, 19012 + o, 19013 + o)       # clients/sse_backend.py: held streams
        self.router, self.router_admin = 18080 + o, 18090 + o
        self.haproxy, self.nginx, self.floor = 18081 + o, 18082 + o, 18083 + o
        self.proxy = {rows.ROUTER: self.router, rows.HAPROXY: self.haproxy, rows.NGINX: self.nginx,
                      rows.FLOOR: self.floor}

    def all(self):
        return self.backend + self.backend_tls + self.backend_h2c + self.sse + (self.router, self.router_admin, self.haproxy, self.nginx, self.floor)


# The name in the backends' certificate, and the only one: a proxy must be told to check it (it
# reaches them by IP), and one that checked 127.0.0.1 instead would fail the handshake.
# The issuer of the access tokens of the [auth] rows (never contacted: the keys are in a file).
BENCH_ISSUER = "https://idp.bench.test"
BACKEND_TLS_NAME = "bench.test"

# Seconds between two readiness (or free-port) checks: each is a refused connect or one short
# request, so a proxy that is up (or gone) is seen within 10 ms of it, not 50-100 ms later.
POLL = 0.01

READY_BODY = '{"jsonrpc":"2.0","id":0,"messageId":"bench-ready","method":"tools/call","params":{"name":"x"}}'


class PeerError(Exception):
    """The row's proxy did not start or is not ready: that row fails."""


class _Template(string.Template):
    delimiter = "@"  # nginx uses $, HAProxy % and $


@dataclass
class Peer:
    """A started proxy (proc None: the direct row) and where to reach it."""
    row: rows.Row
    proc: object
    port: int
    url: str
    log: Path = None
    admin_port: int = None
    tls: dict = field(default_factory=dict)  # version, cipher, alpn seen by the readiness check


def port_busy(port):
    """Something listens on the port (a bind fails even with SO_REUSEADDR)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((HOST, port))
        return False
    except OSError:
        return True
    finally:
        s.close()


def wait_port_free(port, timeout=5.0):
    deadline = time.monotonic() + timeout
    while port_busy(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL)
    return True


def tls_client_context(alpn=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn:
        ctx.set_alpn_protocols(alpn)
    return ctx


def post(url, timeout=1.0, headers=None, body=READY_BODY, verify=None):
    """One POST; (status, headers, body, tls info). verify=(ca file, name): the server's
    certificate is checked against that CA for that name (sent as SNI). Raises
    OSError/HTTPException."""
    m = re.match(r"(https?)://([^:/]+):(\d+)(/.*)?$", url)
    scheme, host, port, path = m.group(1), m.group(2), int(m.group(3)), m.group(4) or "/"
    if scheme == "https":
        ctx = tls_client_context()
        if verify:
            ctx = ssl.create_default_context(cafile=str(verify[0]))
            conn = _NamedHTTPSConnection(host, port, timeout=timeout, context=ctx, server_name=verify[1])
        else:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "Mcp-Routing-Id": "bench-ready"}
        h.update(headers or {})
        conn.request("POST", path, body=body, headers=h)
        resp = conn.getresponse()
        data = resp.read()
        tls = {}
        if scheme == "https" and conn.sock is not None:
            tls = {"version": conn.sock.version(), "cipher": conn.sock.cipher()[0]}
        return resp.status, dict(resp.getheaders()), data, tls
    finally:
        conn.close()


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address, the certificate checked for another name (as the proxies reach the
    backends: by IP, checking bench.test)."""

    def __init__(self, host, port, server_name, **kw):
        super().__init__(host, port, **kw)
        self.server_name = server_name

    def connect(self):
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.server_name)


def get(host, port, path, timeout=2.0):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class Peers:
    """Starts and stops the backends and the proxies of one run, in the work dir `tmp`."""

    def __init__(self, settings, procs, tmp, fd_limit):
        self.s = settings
        self.procs = procs
        self.tmp = Path(tmp)
        self.fd_limit = fd_limit
        self.ports = Ports(settings.port_offset)
        self.templates = settings.bench_dir / "peers"
        self.build_err = None
        self.backend = None        # the nginx backend process
        self.backend_dir = self.tmp / "backend"
        self.sse_backend = None    # clients/sse_backend.py
        self._cert = None
        self._backend_ca = None
        self.user_line = "user root;" if os.geteuid() == 0 else ""
        # How long a proxy may take to exit after SIGTERM before SIGKILL. The router waits for
        # its connections to end, and after the streams rows it sees that their clients closed
        # only at its connections' next periodic check: 1.4-2 s. A smoke run checks nothing of
        # a proxy's shutdown and cuts it short.
        self.stop_grace = 0.5 if settings.smoke else 5.0

    # --- templates and files -----------------------------------------------------------------
    def render(self, template, dest, **values):
        text = _Template((self.templates / template).read_text()).substitute(values)
        Path(dest).write_text(text)
        return Path(dest)

    def cert(self):
        """An ECDSA P-256 certificate for 127.0.0.1/localhost, made once per run with openssl:
        (cert.pem, key.pem, cert+key.pem for HAProxy)."""
        if self._cert is None:
            d = self.tmp / "tls"
            d.mkdir(exist_ok=True)
            cert, key, both = d / "cert.pem", d / "key.pem", d / "cert+key.pem"
            r = subprocess.run(
                ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                 "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                raise SettingError("openssl could not make the certificate: " + r.stdout.decode()[-300:])
            both.write_bytes(cert.read_bytes() + key.read_bytes())
            self._cert = (cert, key, both)
        return self._cert

    def bench_token(self, alg):
        """(the JWKS file, an access token) of `alg` for the router's resource, made by
        examples/bench_token.rs (next to the router binary), once per algorithm and run."""
        d = self.tmp / "auth"
        d.mkdir(exist_ok=True)
        jwks, token = d / f"jwks-{alg}.json", d / f"token-{alg}"
        if not token.exists():
            mint = self.s.router_bin.parent / "examples" / "bench_token"
            if not os.access(mint, os.X_OK):
                raise PeerError(f"{mint} not found (cargo build --release --example bench_token)")
            r = subprocess.run([str(mint), alg, f"http://{HOST}:{self.ports.router}/mcp", str(jwks)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                raise PeerError(f"bench_token: {r.stdout.strip()}")
            token.write_text(r.stdout.strip())
        return jwks, token.read_text()

    def authorization(self, row):
        """The `Authorization` header value every request of an [auth] row carries."""
        return f"Bearer {self.bench_token(row.auth)[1]}"

    def backend_ca(self):
        """A test CA and the backends' certificate for BACKEND_TLS_NAME signed by it (both ECDSA
        P-256, openssl, once per run): (ca.pem, cert.pem, key.pem). The proxies trust ca.pem
        only; the certificate has no IP address, so each proxy must check the name."""
        if self._backend_ca is None:
            d = self.tmp / "backend-tls"
            d.mkdir(exist_ok=True)
            ca, ca_key, cert, key = d / "ca.pem", d / "ca.key", d / "cert.pem", d / "key.pem"
            ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"]
            for cmd in (["openssl", "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca),
                         "-subj", "/CN=mrtr-router bench test CA"],
                        ["openssl", "req", "-x509", *ec, "-keyout", str(key), "-out", str(cert),
                         "-subj", f"/CN={BACKEND_TLS_NAME}", "-CA", str(ca), "-CAkey", str(ca_key),
                         "-addext", f"subjectAltName=DNS:{BACKEND_TLS_NAME}",
                         "-addext", "basicConstraints=critical,CA:FALSE",
                         "-addext", "keyUsage=critical,digitalSignature",
                         "-addext", "extendedKeyUsage=serverAuth"]):
                r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                if r.returncode != 0:
                    raise SettingError("openssl could not make the backends' test CA and certificate: "
                                       + r.stdout.decode()[-300:])
            self._backend_ca = (ca, cert, key)
        return self._backend_ca

    def ready_body(self):
        p = self.tmp / "ready-body.json"
        if not p.exists():
            p.write_text(READY_BODY)
        return p

    # --- backends ----------------------------------------------------------------------------
    def start_backend(self):
        """One nginx, one worker, on the load cpus, listening on the backend ports."""
        d = self.backend_dir
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        conf = self.backend_config(d)
        self._nginx_check(d, conf, fatal=True)
        self.backend = self.procs.spawn(["nginx", "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf)],
                                        cpus=self.s.load_cpus, log=d / "stdout.log")
        deadline = time.monotonic() + 10
        ca = self.backend_ca()[0]
        last = None
        while time.monotonic() < deadline:
            try:
                # Every port, in its own protocol: the TLS ones with the certificate checked as the
                # proxies will check it (ca.pem, the name bench.test); the h2c ones by h2load.
                if (all(post(f"http://{HOST}:{p}/mcp")[0] == 200 for p in self.ports.backend)
                        and all(post(f"https://{HOST}:{p}/mcp", verify=(ca, BACKEND_TLS_NAME))[0] == 200
                                for p in self.ports.backend_tls)):
                    for p in self.ports.backend_h2c:
                        ok, last = h2_ready(f"http://{HOST}:{p}/mcp", self.ready_body())
                        if not ok:
                            break
                    else:
                        return
            except (OSError, http.client.HTTPException, subprocess.TimeoutExpired) as e:
                last = repr(e)
            if self.backend.poll() is not None:
                break
            time.sleep(POLL)
        ports = self.ports.backend + self.ports.backend_tls + self.ports.backend_h2c
        raise SettingError(f"backend nginx did not come up on ports {ports} ({last}): "
                           + _tail(d / "error.log") + _tail(d / "stdout.log"))

    def backend_config(self, d):
        ca, cert, key = self.backend_ca()
        b, t, h = self.ports.backend, self.ports.backend_tls, self.ports.backend_h2c
        return self.render("nginx-backend.conf.in", d / "nginx.conf", user_line=self.user_line,
                           dir=d, host=HOST, port1=b[0], port2=b[1], port3=b[2],
                           tls_port1=t[0], tls_port2=t[1], tls_port3=t[2],
                           h2c_port1=h[0], h2c_port2=h[1], h2c_port3=h[2],
                           tls_cert=cert, tls_key=key, rlimit=self.fd_limit,
                           worker_connections=self.fd_limit, log_flush="10ms" if self.s.smoke else "100ms")

    def start_sse_backend(self):
        """clients/sse_backend.py on the load cpus, listening on the SSE ports."""
        d = self.tmp / "sse-backend"
        d.mkdir(exist_ok=True)
        script = self.s.bench_dir / "clients" / "sse_backend.py"
        self.sse_backend = self.procs.spawn(
            ["python3", str(script), "--host", HOST, "--ports", ",".join(map(str, self.ports.sse)),
             "--rate", str(self.s.event_rate)],
            cpus=self.s.load_cpus, log=d / "log", stdout=subprocess.PIPE)
        line = LineReader(self.sse_backend.stdout).readline(10.0)
        if line != "READY":
            raise SettingError(f"SSE backend did not start ({line!r}): " + _tail(d / "log"))

    def backend_pids(self):
        return [p.pid for p in (self.backend, self.sse_backend) if p is not None]

    # --- proxies -----------------------------------------------------------------------------
    def _backends_of(self, row):
        ports = self.ports.sse if row.load == rows.STREAMS else self.ports.upstream[row.upstream]
        return {f"backend{i + 1}": f"{HOST}:{p}" for i, p in enumerate(ports)}

    def _many_conns(self, row):
        return row.load in (rows.STREAMS, rows.IDLE)

    def start(self, row):
        """Starts the row's proxy and waits until it answers; a Peer, or PeerError."""
        if row.upstream not in rows.UPSTREAMS or (row.upstream == rows.UP_H2C and row.peer == rows.NGINX):
            raise PeerError(f"{row.peer} cannot speak upstream={row.upstream} (see rows.py)")
        if row.peer == rows.DIRECT:
            return Peer(row, None, self.ports.backend[0], f"http://{HOST}:{self.ports.backend[0]}/mcp")
        d = self.tmp / row.name
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        port = self.ports.proxy[row.peer]
        scheme = "https" if row.tls else "http"
        peer = Peer(row, None, port, f"{scheme}://{HOST}:{port}/mcp")
        cpus = self.s.proxy_cpus_for(row)
        if row.peer == rows.ROUTER:
            self._start_router(row, d, peer, cpus)
        elif row.peer == rows.HAPROXY:
            self._start_haproxy(row, d, peer, cpus)
        elif row.peer == rows.NGINX:
            self._start_nginx(row, d, peer, cpus)
        elif row.peer == rows.FLOOR:
            self._start_floor(row, d, peer, cpus)
        self._wait_ready(peer)
        return peer

    # --- configs: row -> file, nothing started (bench/tests renders and checks every row's) ---
    def config(self, row, d):
        """Writes the row's proxy config into d and returns its path (None: no config file)."""
        return {rows.ROUTER: self.router_config, rows.HAPROXY: self.haproxy_config,
                rows.NGINX: self.nginx_config}.get(row.peer, lambda row, d: None)(row, d)

    def router_config(self, row, d):
        extra = []
        if row.tls:
            cert, key, _ = self.cert()
            extra += [f'tls_cert = "{cert}"', f'tls_key = "{key}"']
        if row.body_bytes:
            # A 1 MiB body must fit under the limit with room to spare; the default is 1 MiB.
            extra.append(f"max_body_bytes = {max(2 * 1024 * 1024, 2 * row.body_bytes)}")
        scheme, upstream, backend_extra = "http", "", ""
        if row.upstream == rows.UP_TLS:
            scheme = "https"
            upstream = f'[upstream]\ntls_ca = "{self.backend_ca()[0]}"'
            backend_extra = f'tls_server_name = "{BACKEND_TLS_NAME}"'
        elif row.upstream == rows.UP_H2C:
            upstream = "[upstream]\nhttp2 = true"
        if row.auth:
            jwks, _ = self.bench_token(row.auth)
            upstream += (f'\n[auth]\nissuer = "{BENCH_ISSUER}"\njwks_file = "{jwks}"\n'
                         f'[auth.resource_metadata]\nresource = "http://{HOST}:{self.ports.router}/mcp"\n')
        return self.render("router.toml.in", d / "config.toml", listen=f"{HOST}:{self.ports.router}",
                           admin_listen=f"{HOST}:{self.ports.router_admin}", server_extra="\n".join(extra),
                           upstream=upstream, scheme=scheme, backend_extra=backend_extra,
                           **self._backends_of(row))

    def haproxy_config(self, row, d):
        bind = f"{HOST}:{self.ports.haproxy}"
        if row.tls:
            _, _, both = self.cert()
            bind += f" ssl crt {both} ssl-min-ver TLSv1.3 alpn h2,http/1.1"
        elif row.h2:
            bind += " proto h2"
        many = self._many_conns(row)
        # HAProxy wants 2 descriptors per connection (maxsock = 2 x maxconn + a few) and refuses
        # to start past the file-descriptor limit: the most it can take here.
        maxconn = (self.fd_limit - 100) // 2 if many else 4096
        global_extra = [f"  tune.bufsize {row.bufsize}"] if row.bufsize else []
        defaults_extra = [f"  maxconn {maxconn}"] if many else []
        if row.load == rows.STREAMS:
            # Events are sent as they come, not held for more data (HAProxy's MSG_MORE delays a
            # lone small chunk by up to 200 ms): the unbuffered streaming nginx gets from
            # proxy_buffering off.
            defaults_extra.append("  option http-no-delay")
        rules = ""
        if row.fwd:
            rules = ("  option forwardfor\n  http-request set-header X-Forwarded-Proto http\n"
                     "  http-request set-header X-Forwarded-Host %[req.hdr(host)]")
        if row.key == "header":
            balance = "  balance hdr(Mcp-Routing-Id)"
        else:
            balance = ("  option http-buffer-request\n"
                       "  http-request set-var(txn.rk) req.body,json_query('$.messageId')\n"
                       "  balance hash var(txn.rk)")
        server_opts = ""
        if row.upstream == rows.UP_TLS:
            # Verified (the test CA only, the name bench.test), HTTP/1.1 by ALPN; HAProxy resumes
            # its server-side TLS sessions by default (no-ssl-reuse turns it off).
            n = BACKEND_TLS_NAME
            server_opts = (f" ssl verify required ca-file {self.backend_ca()[0]} sni str({n}) verifyhost {n}"
                           " alpn http/1.1")
        elif row.upstream == rows.UP_H2C:
            server_opts = " proto h2"
        return self.render("haproxy.cfg.in", d / "haproxy.cfg", maxconn=maxconn,
                           global_extra="\n".join(global_extra), defaults_extra="\n".join(defaults_extra),
                           bind=bind, frontend_rules=rules, balance=balance, server_opts=server_opts,
                           **self._backends_of(row))

    def nginx_config(self, row, d):
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        listen = f"{HOST}:{self.ports.nginx}" + (" ssl" if row.tls else "") + (" http2" if row.h2 else "")
        tls = ""
        if row.tls:
            cert, key, _ = self.cert()
            tls = (f"    ssl_certificate {cert};\n    ssl_certificate_key {key};\n"
                   "    ssl_protocols TLSv1.3;")
        many = self._many_conns(row)
        # With many connections, worker_connections is twice the descriptor limit (nginx warns):
        # nginx starts closing connections once fewer than 1/16 of worker_connections are free,
        # which at worker_connections = the limit stopped 20,000 descriptors at 9,375 streams;
        # this way the descriptor limit is the only one.
        # One idle upstream slot per client request in flight per backend (bench/README.md):
        # for HTTP/2 that is every stream of every connection.
        keepalive = self.s.nginx_keepalive
        if row.h2 and "nginx_keepalive" not in self.s.explicit:
            keepalive = 3 * self.s.h2_connections * self.s.h2_streams
        if row.upstream == rows.UP_H2C:
            raise PeerError("nginx cannot proxy HTTP/2 to its backends (proxy_http_version: 1.0 or 1.1)")
        scheme, upstream_tls = "http", ""
        if row.upstream == rows.UP_TLS:
            # Verified (the test CA only, the name bench.test, sent as SNI), sessions resumed on
            # new connections. nginx 1.22's default proxy_ssl_protocols lack TLSv1.3 (1.23.4
            # added it): without this line it would speak TLS 1.2 to backends that offer 1.3.
            scheme = "https"
            upstream_tls = "\n".join([
                "      proxy_ssl_verify on;",
                f"      proxy_ssl_trusted_certificate {self.backend_ca()[0]};",
                f"      proxy_ssl_name {BACKEND_TLS_NAME};",
                "      proxy_ssl_server_name on;",
                "      proxy_ssl_session_reuse on;",
                "      proxy_ssl_protocols TLSv1.2 TLSv1.3;"])
        return self.render("nginx-proxy.conf.in", d / "nginx.conf", user_line=self.user_line, dir=d,
                           rlimit_line=f"worker_rlimit_nofile {self.fd_limit};" if many else "",
                           worker_connections=2 * self.fd_limit if many else 8192, listen=listen, tls=tls,
                           keepalive=keepalive, scheme=scheme, upstream_tls=upstream_tls,
                           **self._backends_of(row))

    def check_config(self, row, conf):
        """haproxy -c / nginx -t on a rendered config; PeerError with their complaint."""
        if row.peer == rows.HAPROXY:
            r = subprocess.run(["haproxy", "-c", "-f", str(conf)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if r.returncode != 0:
                alerts = [l for l in r.stdout.decode(errors="replace").splitlines() if "NOTICE" not in l]
                raise PeerError("haproxy config check failed: " + " ".join(" ".join(alerts).split())[:300])
        elif row.peer == rows.NGINX:
            self._nginx_check(conf.parent, conf)

    # --- starting ------------------------------------------------------------------------------
    def _start_router(self, row, d, peer, cpus):
        if self.build_err:
            raise PeerError(self.build_err)
        if not os.access(self.s.router_bin, os.X_OK):
            raise PeerError(f"router binary {self.s.router_bin} not found (cargo build --release, or set BENCH_ROUTER_BIN)")
        if port_busy(self.ports.router_admin):
            raise PeerError(f"admin port {self.ports.router_admin} is in use")
        conf = self.router_config(row, d)
        env = dict(os.environ, MRTR_WORKER_THREADS=str(row.workers), RUST_LOG=os.environ.get("RUST_LOG", "warn"))
        peer.log = d / "router.log"
        peer.admin_port = self.ports.router_admin
        peer.proc = self.procs.spawn([str(self.s.router_bin), "--config", str(conf)], cpus=cpus,
                                     log=peer.log, env=env)
        deadline = time.monotonic() + self.s.ready_timeout
        last = None
        while True:
            try:
                last = get(HOST, self.ports.router_admin, "/readyz", timeout=1.0)[0]
                if last == 200:
                    return
            except (OSError, http.client.HTTPException) as e:
                last = repr(e)
            if peer.proc.poll() is not None:
                raise PeerError(f"mrtr-router exited (status {peer.proc.returncode}) during start-up, "
                                f"before /readyz answered 200: {_tail(peer.log)}")
            if time.monotonic() > deadline:
                raise PeerError(f"GET /readyz on {self.ports.router_admin} did not answer 200 within "
                                f"{self.s.ready_timeout}s (last {last})")
            time.sleep(POLL)

    def _start_haproxy(self, row, d, peer, cpus):
        conf = self.haproxy_config(row, d)
        self.check_config(row, conf)
        peer.log = d / "haproxy.log"
        peer.proc = self.procs.spawn(["haproxy", "-db", "-f", str(conf)], cpus=cpus, log=peer.log)

    def _start_nginx(self, row, d, peer, cpus):
        conf = self.nginx_config(row, d)
        self.check_config(row, conf)
        peer.log = d / "error.log"
        peer.proc = self.procs.spawn(["nginx", "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf)],
                                     cpus=cpus, log=d / "stdout.log")

    def _nginx_check(self, d, conf, fatal=False):
        r = subprocess.run(["nginx", "-t", "-q", "-p", str(d), "-e", str(d / "error.log"), "-c", str(conf)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            msg = "nginx config check failed: " + " ".join(r.stdout.decode().split())[:300]
            raise SettingError(msg) if fatal else PeerError(msg)

    def _start_floor(self, row, d, peer, cpus):
        if self.build_err:
            raise PeerError(self.build_err)
        if not os.access(self.s.floor_bin, os.X_OK):
            raise PeerError(f"{self.s.floor_bin} not found (cargo build --example hyper_floor, or set BENCH_FLOOR_BIN)")
        # The HTTP/2 and scanning floors are binaries of their own, beside hyper_floor.
        binary = self.s.floor_bin
        if row.h2 or row.scan:
            binary = binary.with_name("hyper_floor_h2c" if row.h2 else "hyper_floor_scan")
            if not os.access(binary, os.X_OK):
                raise PeerError(f"{binary} not found (cargo build --example {binary.name})")
        peer.log = d / "hyper-floor.log"
        backends = ",".join(self._backends_of(row).values())
        peer.proc = self.procs.spawn([str(binary), f"{HOST}:{self.ports.floor}", backends],
                                     cpus=cpus, log=peer.log)

    def _wait_ready(self, peer):
        """Until a POST through the proxy answers 200 (bounded by ready_timeout). HTTP/2 rows ask
        with h2load itself (nginx's h2c port speaks nothing else); TLS rows also record the
        protocol version and cipher, and fail unless it is TLS 1.3 (and ALPN h2 for h2 rows)."""
        deadline = time.monotonic() + self.s.ready_timeout
        last = None
        while True:
            try:
                if peer.row.h2:
                    ok, last = h2_ready(peer.url, self.ready_body())
                else:
                    headers = {"Authorization": self.authorization(peer.row)} if peer.row.auth else None
                    status, _, _, tls = post(peer.url, headers=headers)
                    ok, last = status == 200, f"status {status}"
                    peer.tls = tls
                if ok:
                    break
            except (OSError, http.client.HTTPException) as e:
                last = repr(e)
            if peer.proc.poll() is not None:
                raise PeerError(f"process exited (status {peer.proc.returncode}) during start-up: {_tail(peer.log)}")
            if time.monotonic() > deadline:
                raise PeerError(f"POST {peer.url} did not answer 200 within {self.s.ready_timeout}s ({last})")
            time.sleep(POLL)
        if peer.row.tls:
            alpn = ["h2"] if peer.row.h2 else None
            peer.tls = tls_info(peer.port, alpn)
            if peer.tls.get("version") != "TLSv1.3":
                raise PeerError(f"the listener negotiated {peer.tls.get('version')}, not TLSv1.3")
            if peer.row.h2 and peer.tls.get("alpn") != "h2":
                raise PeerError(f"ALPN chose {peer.tls.get('alpn')!r}, not h2")

    def stop(self, peer):
        """Stops the proxy and waits until its ports are free for the next row."""
        if peer is None or peer.proc is None:
            return
        self.procs.stop(peer.proc, grace=self.stop_grace)
        for port in (peer.port, peer.admin_port):
            if port and not wait_port_free(port):
                raise SettingError(f"port {port} still busy after stopping {peer.row.name}")


def tls_info(port, alpn=None):
    """The TLS version, cipher and ALPN protocol a default OpenSSL client gets from the port."""
    ctx = tls_client_context(alpn)
    with socket.create_connection((HOST, port), timeout=2) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return {"version": s.version(), "cipher": s.cipher()[0], "alpn": s.selected_alpn_protocol()}


def h2_ready(url, body_file):
    """One request with h2load; (ok, detail)."""
    r = subprocess.run(["h2load", "-n", "1", "-c", "1", "-m", "1", "-H", "content-type: application/json",
                        "-H", "mcp-routing-id: bench-ready", "-d", str(body_file), url],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
    out = r.stdout.decode(errors="replace")
    m = re.search(r"status codes: (\d+) 2xx", out)
    return bool(m and m.group(1) == "1"), " ".join(out.split())[-200:]


def _tail(path, n=3):
    try:
        lines = [l for l in Path(path).read_text(errors="replace").splitlines() if "NOTICE" not in l]
        return " ".join(" | ".join(lines[-n:]).split())[:300]
    except OSError:
        return ""
