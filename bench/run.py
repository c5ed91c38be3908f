#!/usr/bin/env python3
"""Whole-proxy benchmark: mrtr-router beside HAProxy and nginx, in one run, on loopback.

    bench/run.py                         # every row, 3 interleaved rounds; builds the router first
    bench/run.py --smoke --router-bin target/debug/mrtr-router   # every row once, short: the test step
    bench/run.py --rows 'mrtr-tls-* haproxy-tls-*'               # some rows (names or patterns)
    bench/run.py --list                  # the rows

Every flag has the BENCH_* variable bench/run.sh read (BENCH_SMOKE=1, BENCH_PEERS, ...), and
bench/run.sh runs this file, so old command lines work unchanged. bench/README.md explains the
rows, the columns and how each number is measured. Python 3.11, standard library only.

Exit status: 0 when every row passed in every round (an expected-miss row passes), 1 when a row
failed (the table is printed first), 2 for a bad setting, a missing tool or a busy port,
130 when interrupted. Every process it starts is stopped on the way out, whatever the way.
"""

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import measure, peers, report, rows, settings, tools  # noqa: E402
from harness.procs import Procs  # noqa: E402
from harness.runner import Runner  # noqa: E402
from harness.settings import SettingError  # noqa: E402

log = tools.log


class Ctx:
    """What every part of a run shares."""

    def __init__(self, s, procs, tmp):
        self.s, self.procs, self.tmp = s, procs, Path(tmp)
        self.peers = None


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def raise_fd_limit():
    """Soft RLIMIT_NOFILE up to the hard one (children inherit it): the streams rows hold two
    descriptors per stream in the proxy. Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def fit_counts(s, fd_limit):
    """A proxy holds 2 descriptors per stream (client and backend side), and HAProxy reserves 2
    per connection even for idle ones (maxsock), refusing to start past the limit. A count that
    cannot fit under the machine's descriptor limit, with room for listeners, logs, pooled
    upstream connections and the warm-up's, is lowered, with a note, when it is the default;
    one asked for is an error."""
    for attr, per, margin in (("streams", 2, 1000), ("idle_conns", 2, 1000)):
        room = (fd_limit - margin) // per
        want = getattr(s, attr)
        if want <= room:
            continue
        if attr in s.explicit:
            raise SettingError(f"{attr.replace('_', '-')}={want} needs {want * per + margin} file descriptors "
                               f"per proxy process; the hard limit (ulimit -Hn) is {fd_limit}")
        setattr(s, attr, room)
        note = (f"{attr.replace('_', '-')} lowered from {want} to {room}: the hard file-descriptor limit "
                f"is {fd_limit} (ulimit -Hn; raise it to run {want})")
        s.notes.append(note)
        log("WARNING: " + note)


def main(argv):
    t_start = time.monotonic()
    try:
        s, list_only = settings.load(argv)
    except SettingError as e:
        log(f"error: {e}")
        return 2
    if list_only:
        for r in rows.ROWS:
            print(f"{r.name:24} {r.peer:8} {r.load:9} {r.desc}")
        return 0

    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    procs = Procs()
    tmp = tempfile.mkdtemp(prefix="mrtr-bench.", dir=os.environ.get("TMPDIR", "/tmp"))
    ctx = Ctx(s, procs, tmp)
    try:
        return run(ctx, t_start)
    except SettingError as e:
        log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        procs.stop_all()
        if s.keep_tmp:
            log(f"kept work dir {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run(ctx, t_start):
    s = ctx.s
    for note in s.notes:
        log("warning: " + note)
    tools.ensure(s)
    fd_limit = raise_fd_limit()
    fit_counts(s, fd_limit)
    ctx.peers = peers.Peers(s, ctx.procs, ctx.tmp, fd_limit)
    for port in ctx.peers.ports.all():
        if peers.port_busy(port):
            raise SettingError(f"port {port} on {peers.HOST} is already in use; stop whatever listens "
                               "there, or move the bench's ports with BENCH_PORT_OFFSET")
    want_router = any(r.peer in (rows.ROUTER, rows.FLOOR) for r in s.rows)
    if want_router:
        ctx.peers.build_err = tools.build_release(s)
        if ctx.peers.build_err:
            log(f"router rows will fail: {ctx.peers.build_err}")
    if want_router and s.check_router and not ctx.peers.build_err:
        # A build made another way (the profile-guided one) is measured only once it passes
        # the tests that start the binary.
        log(f"checking {s.router_bin}: scripts/test-binary.sh")
        checked = subprocess.run([str(s.repo_dir / "scripts" / "test-binary.sh"), str(s.router_bin)])
        if checked.returncode != 0:
            log("error: the router binary failed scripts/test-binary.sh; nothing measured")
            return 1
    bin_mtime, bin_sha = tools.binary_info(s.router_bin) if want_router else (None, None)
    versions = tools.versions(s)
    if want_router:
        log(f"router binary: {s.router_bin} (modified {bin_mtime}; repo at {versions['repo_commit_at_start']}, "
            f"src dirty: {str(versions['repo_src_dirty_at_start']).lower()})")

    # Numbers are only comparable on an otherwise idle machine: measure how busy it is first.
    all_cpus = list(range(s.nproc))
    a = measure.cpu_sample(all_cpus)
    time.sleep(0.2 if s.smoke else 1.0)
    busy_before = measure.busy_pct(a, measure.cpu_sample(all_cpus))
    if busy_before is not None and busy_before > 10:
        log(f"WARNING: the machine was {busy_before}% busy before the run (other processes): "
            "req/s and latency will be noisy")
    log(f"{s.rounds} round(s) of {len(s.rows)} row(s): duration {s.duration}s, warm-up {s.warmup}s, "
        f"{s.connections} connections, load and backends on cpu {s.load_cpus}, proxy on cpu {s.proxy_cpus}")

    ctx.peers.start_backend()
    if any(r.load == rows.STREAMS for r in s.rows):
        ctx.peers.start_sse_backend()
    runner = Runner(ctx)
    results = {r.name: [] for r in s.rows}
    for rnd in range(1, s.rounds + 1):
        if s.rounds > 1:
            log(f"=== round {rnd} of {s.rounds} ===")
        for r in s.rows:
            results[r.name].append(runner.run(r, rnd))

    entries = [report.aggregate(r, results[r.name], s.rounds) for r in s.rows]
    report.add_ratios(entries)
    report.print_tables(s, entries, sys.stdout)
    ok = all(e["status"] in report.OK for e in entries)
    wall = round(time.monotonic() - t_start)
    extra = {"router_bin_modified": bin_mtime, "router_bin_sha256_16": bin_sha,
             "busy_pct_before_run": busy_before, "fd_limit": fd_limit, "wall_time_s": wall}
    report.write_json(s.results, s, entries, extra, versions, ok)
    print(f"results: {s.results} (wall time {wall}s)")
    sys.stdout.flush()
    if not ok:
        log("FAILED: at least one row failed in at least one round (see status column)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
