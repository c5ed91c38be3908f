"""The run's settings: command-line flags, else the BENCH_* environment variables bench/run.sh
read (so every old command line still works), else the defaults; smoke mode changes the
defaults, not what was set explicitly. Anything malformed is a SettingError: exit status 2
before anything starts.
"""

import argparse
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import measure, rows


class SettingError(Exception):
    """A bad setting, a missing tool or a busy port: the run cannot start (exit 2)."""


@dataclass
class Settings:
    bench_dir: Path
    repo_dir: Path
    smoke: bool
    rows: list
    rounds: int
    duration: float  # seconds: a whole number (int) or a decimal one (smoke: 0.3)
    warmup: int
    connections: int
    results: Path
    sse_probe: bool
    sse_connections: int
    sse_pause_ms: int
    pending_pct: int
    mix_pause_ms: int
    load_cpus: str
    proxy_cpus: str
    proxy_cpus_2w: str
    skip_build: bool
    router_bin: Path
    floor_bin: Path
    ready_timeout: int
    nginx_keepalive: int
    keep_tmp: bool
    no_install: bool
    streams: int
    direct_streams: int
    event_rate: int
    idle_conns: int
    open_concurrency: int
    h2_connections: int
    h2_streams: int
    tls_clients: int
    port_offset: int
    nproc: int = field(default_factory=os.cpu_count)
    check_router: bool = False  # run scripts/test-binary.sh on the router binary first
    notes: list = field(default_factory=list)
    explicit: set = field(default_factory=set)  # the int settings given by a flag or variable

    def proxy_cpus_for(self, row):
        """The cpu list the proxy of `row` runs on: the load's own for a one-core row, the
        2-worker list for a 2-worker row, the proxy's otherwise."""
        if row.one_core:
            return self.load_cpus
        return self.proxy_cpus_2w if row.workers > 1 else self.proxy_cpus

    def as_json(self):
        return {
            "smoke": self.smoke, "rounds": self.rounds, "duration_s": self.duration,
            "warmup_s": self.warmup, "connections": self.connections, "wrk_threads": 1,
            "pending_pct": self.pending_pct, "sse_probe": self.sse_probe,
            "sse_connections": self.sse_connections, "sse_pause_ms": self.sse_pause_ms,
            "mix_pause_ms": self.mix_pause_ms, "load_cpus": self.load_cpus,
            "proxy_cpus": self.proxy_cpus, "proxy_cpus_2w": self.proxy_cpus_2w,
            "clk_tck": measure.CLK_TCK, "nproc": self.nproc,
            "nginx_keepalive": self.nginx_keepalive, "router_bin": str(self.router_bin),
            "floor_bin": str(self.floor_bin), "streams": self.streams,
            "direct_streams": self.direct_streams, "event_rate_per_s": self.event_rate,
            "idle_conns": self.idle_conns, "open_concurrency": self.open_concurrency,
            "h2_connections": self.h2_connections, "h2_streams_per_connection": self.h2_streams,
            "tls_clients": self.tls_clients, "port_offset": self.port_offset, "notes": self.notes,
        }


# (flag, env var, smoke default, full default, help); all whole numbers but `duration`, which
# takes decimal seconds too (SECONDS).
SECONDS = {"duration"}
_INTS = [
    ("rounds", "BENCH_ROUNDS", 1, 3, "rounds; each row's median over them is shown"),
    ("duration", "BENCH_DURATION", 0.3, 8, "measured seconds per row and round (decimals allowed: 0.3)"),
    ("warmup", "BENCH_WARMUP", 0, 3, "warm-up seconds per row and round (0: none)"),
    ("connections", "BENCH_CONNECTIONS", 8, 64, "wrk connections"),
    ("sse-connections", "BENCH_SSE_CONNECTIONS", 2, 2, "connections of each SSE probe (mix rows)"),
    ("sse-pause-ms", "BENCH_SSE_PAUSE_MS", 5, 5, "SSE probe: pause after each answer"),
    ("pending-pct", "BENCH_PENDING_PCT", 20, 20, "share of two-round calls in the mix rows"),
    ("mix-pause-ms", "BENCH_MIX_PAUSE_MS", 8, 8, "-paced rows: mean pause per connection"),
    ("ready-timeout", "BENCH_READY_TIMEOUT", 20, 20, "seconds for a proxy to become ready"),
    ("streams", "BENCH_STREAMS", 200, 10000, "streams rows: SSE streams held through the proxy"),
    ("direct-streams", "BENCH_DIRECT_STREAMS", 20, 100, "streams rows: streams straight to the backend (latency baseline)"),
    ("event-rate", "BENCH_EVENT_RATE", 200, 1000, "streams rows: events per second, proxied and direct together"),
    ("idle-conns", "BENCH_IDLE_CONNS", 200, 10000, "idle rows: keep-alive connections held"),
    ("open-concurrency", "BENCH_OPEN_CONCURRENCY", 64, 256, "streams/idle rows: connections being opened at once"),
    ("h2-connections", "BENCH_H2_CONNECTIONS", 4, 8, "h2 rows: h2load connections"),
    ("h2-streams", "BENCH_H2_STREAMS", 8, 16, "h2 rows: concurrent streams per connection"),
    ("tls-clients", "BENCH_TLS_CLIENTS", 2, 8, "handshake rows: client threads"),
    ("port-offset", "BENCH_PORT_OFFSET", 0, 0, "added to every port (19001-19033, 18080-18090)"),
]


def parser():
    ap = argparse.ArgumentParser(
        prog="bench/run.py",
        description="Whole-proxy benchmark: mrtr-router beside HAProxy and nginx, on loopback. "
        "Every flag has a BENCH_* environment variable (bench/README.md); a flag wins.",
    )
    ap.add_argument("--smoke", action="store_true", default=None,
                    help="1 round, 0.3 s of load per row, no warm-up, small counts: proves every row works (BENCH_SMOKE=1)")
    ap.add_argument("--rows", help="rows to run: names or patterns like 'mrtr-*', space or comma separated (BENCH_PEERS)")
    ap.add_argument("--list", action="store_true", help="print the rows and exit")
    ap.add_argument("--router-bin", help="router binary, used as it is, no build (BENCH_ROUTER_BIN)")
    ap.add_argument("--floor-bin", help="hyper-floor binary (BENCH_FLOOR_BIN)")
    ap.add_argument("--check-router", action="store_true", default=None,
                    help="before measuring, run the tests that start the router binary against it "
                         "(scripts/test-binary.sh; BENCH_CHECK_ROUTER=1)")
    ap.add_argument("--skip-build", action="store_true", default=None, help="no cargo build --release (BENCH_SKIP_BUILD=1)")
    ap.add_argument("--results", help="JSON output (BENCH_RESULTS)")
    ap.add_argument("--keep-tmp", action="store_true", default=None, help="keep the work dir (BENCH_KEEP_TMP=1)")
    ap.add_argument("--no-install", action="store_true", default=None, help="never apt-get (BENCH_NO_INSTALL=1)")
    ap.add_argument("--no-sse-probe", action="store_true", default=None, help="no SSE probe in the mix rows (BENCH_SSE_PROBE=0)")
    ap.add_argument("--load-cpus", help="cpus of the load and the backends (BENCH_LOAD_CPUS, default 0)")
    ap.add_argument("--proxy-cpus", help="cpus of the proxy (BENCH_PROXY_CPUS, default 1)")
    ap.add_argument("--proxy-cpus-2w", help="cpus of mrtr-header-2w (BENCH_PROXY_CPUS_2W)")
    ap.add_argument("--nginx-keepalive", type=int, help="nginx upstream keepalive (BENCH_NGINX_KEEPALIVE, default 3 x connections)")
    for flag, env, smoke, full, text in _INTS:
        kind = seconds if flag.replace("-", "_") in SECONDS else int
        ap.add_argument("--" + flag, type=kind, help=f"{text} ({env}; default {full}, smoke {smoke})")
    return ap


def _env_bool(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    if v not in ("0", "1"):
        raise SettingError(f"{name} must be 0 or 1, not {v!r}")
    return v == "1"


def _env_int(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    if not re.fullmatch(r"[0-9]+", v):
        raise SettingError(f"{name} must be a non-negative integer, not {v!r}")
    return int(v)


def seconds(text):
    """A number of seconds, whole ("8") or decimal ("0.3"): an int when whole, so a whole
    duration is passed on (wrk -d8s, h2load -D 8) exactly as before."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        raise ValueError(text)
    v = float(text)
    return int(v) if v.is_integer() else v


def _env_seconds(name):
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return seconds(v)
    except ValueError:
        raise SettingError(f"{name} must be a non-negative number of seconds (8, 0.5), not {v!r}") from None


def _check_cpus(spec, name, nproc):
    if not re.fullmatch(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*", spec):
        raise SettingError(f"bad cpu list {spec!r} in {name}")
    for c in measure.expand_cpus(spec):
        if c >= nproc:
            raise SettingError(f"{name}={spec} names a cpu this machine lacks (nproc={nproc})")


def load(argv):
    """Settings from argv and the environment; (settings, list_only)."""
    a = parser().parse_args(argv)
    bench_dir = Path(__file__).resolve().parent.parent
    repo_dir = bench_dir.parent

    def pick(flag_val, env, default):
        return flag_val if flag_val is not None else (env if env is not None else default)

    smoke = bool(pick(a.smoke, _env_bool("BENCH_SMOKE"), False))
    ints, explicit = {}, set()
    for flag, env, smoke_default, full_default, _ in _INTS:
        attr = flag.replace("-", "_")
        env_val = _env_seconds(env) if attr in SECONDS else _env_int(env)
        ints[attr] = pick(getattr(a, attr), env_val, smoke_default if smoke else full_default)
        if getattr(a, attr) is not None or env_val is not None:
            explicit.add(attr)
        # In smoke mode these are fixed, as bench/run.sh did: a short run whatever the env says.
        if smoke and env in ("BENCH_DURATION", "BENCH_WARMUP", "BENCH_CONNECTIONS") and getattr(a, attr) is None:
            ints[attr] = smoke_default
    for attr in ("rounds", "duration", "connections", "sse_connections", "mix_pause_ms",
                 "ready_timeout", "streams", "event_rate", "idle_conns", "open_concurrency",
                 "h2_connections", "h2_streams", "tls_clients"):
        if ints[attr] <= 0:
            raise SettingError(f"{attr.replace('_', '-')} must be a positive integer")
    if ints["port_offset"] > 13000:
        raise SettingError("port-offset must be at most 13000 (ports stay below 32768)")
    if ints["pending_pct"] > 100:
        raise SettingError("pending-pct must be 0..100")

    sse_probe = False if a.no_sse_probe else pick(None, _env_bool("BENCH_SSE_PROBE"), True)
    nproc = os.cpu_count() or 1
    load_cpus = pick(a.load_cpus, os.environ.get("BENCH_LOAD_CPUS") or None, "0")
    proxy_cpus = pick(a.proxy_cpus, os.environ.get("BENCH_PROXY_CPUS") or None, "1")
    notes = []
    if nproc < 2 and a.load_cpus is None and a.proxy_cpus is None and not os.environ.get("BENCH_LOAD_CPUS") \
            and not os.environ.get("BENCH_PROXY_CPUS"):
        notes.append(f"only {nproc} cpu: load, backends and proxy all share cpu 0 (numbers are not comparable)")
        load_cpus = proxy_cpus = "0"
    proxy_cpus_2w = pick(a.proxy_cpus_2w, os.environ.get("BENCH_PROXY_CPUS_2W") or None, proxy_cpus)
    for spec, name in ((load_cpus, "BENCH_LOAD_CPUS"), (proxy_cpus, "BENCH_PROXY_CPUS"),
                       (proxy_cpus_2w, "BENCH_PROXY_CPUS_2W")):
        _check_cpus(spec, name, nproc)

    router_arg = pick(a.router_bin, os.environ.get("BENCH_ROUTER_BIN") or None, None)
    skip_build = bool(pick(a.skip_build, _env_bool("BENCH_SKIP_BUILD"), False))
    if router_arg:
        skip_build = True  # a binary named explicitly is used as it is
        p = Path(router_arg)
        if not p.is_absolute():
            p = (Path.cwd() / p) if p.exists() else (repo_dir / p)
        router_bin = p
    else:
        router_bin = repo_dir / "target" / "release" / "mrtr-router"
    floor_arg = pick(a.floor_bin, os.environ.get("BENCH_FLOOR_BIN") or None, None)
    floor_bin = Path(floor_arg).resolve() if floor_arg else router_bin.parent / "examples" / "hyper_floor"

    keepalive = pick(a.nginx_keepalive, _env_int("BENCH_NGINX_KEEPALIVE"), ints["connections"] * 3)
    if a.nginx_keepalive is not None or _env_int("BENCH_NGINX_KEEPALIVE") is not None:
        explicit.add("nginx_keepalive")
    if keepalive <= 0:
        raise SettingError("nginx-keepalive must be a positive integer")

    spec = pick(a.rows, os.environ.get("BENCH_ROWS") or os.environ.get("BENCH_PEERS") or None, None)
    try:
        selected = rows.select(spec) if spec is not None else list(rows.ROWS)
    except ValueError as e:
        raise SettingError(str(e)) from None
    if not selected:
        raise SettingError("the row selection is empty")

    default_results = bench_dir / "results" / ("smoke.json" if smoke else "latest.json")
    results = Path(pick(a.results, os.environ.get("BENCH_RESULTS") or None, default_results))

    s = Settings(
        bench_dir=bench_dir, repo_dir=repo_dir, smoke=smoke, rows=selected,
        results=results.resolve(), sse_probe=sse_probe, load_cpus=load_cpus,
        proxy_cpus=proxy_cpus, proxy_cpus_2w=proxy_cpus_2w, skip_build=skip_build,
        router_bin=router_bin, floor_bin=floor_bin, nginx_keepalive=keepalive,
        keep_tmp=bool(pick(a.keep_tmp, _env_bool("BENCH_KEEP_TMP"), False)),
        no_install=bool(pick(a.no_install, _env_bool("BENCH_NO_INSTALL"), False)),
        nproc=nproc, notes=notes, explicit=explicit,
        check_router=bool(pick(a.check_router, _env_bool("BENCH_CHECK_ROUTER"), False)), **ints,
    )
    return s, a.list
