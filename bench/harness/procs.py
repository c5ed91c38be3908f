"""Processes the harness starts: every one is recorded, pinned where asked, and stopped by its
own process id on exit, on failure and on a signal; none outlives the harness.

Each child also gets PR_SET_PDEATHSIG (SIGTERM when the harness dies, even by SIGKILL), so a
harness that is killed outright still leaves no proxy or backend behind. `taskset` and `chrt`
exec the real program, so the recorded pid is the proxy's own.
"""

import ctypes
import os
import select
import signal
import subprocess
import sys
import time

from . import measure

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent():
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


class Procs:
    """The registry. `spawn` starts and records; `stop` ends one (its whole tree); `stop_all`
    ends what is left, newest first."""

    def __init__(self):
        self.live = []

    def spawn(self, argv, *, cpus=None, idle=False, log=None, env=None, stdin=None,
              stdout=None, cwd=None):
        """Starts argv, on the cpu list `cpus` (taskset) and under SCHED_IDLE when `idle`.
        stderr goes to the file `log` (none: discarded), and stdout too unless `stdout` is given
        (subprocess.PIPE for the clients that talk to the harness)."""
        cmd = list(argv)
        if cpus is not None:
            cmd = ["taskset", "-c", str(cpus)] + cmd
        if idle:
            cmd = ["chrt", "--idle", "0"] + cmd
        logf = open(log, "ab") if log else subprocess.DEVNULL
        try:
            p = subprocess.Popen(cmd, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                                 stdout=stdout if stdout is not None else logf, stderr=logf,
                                 env=env, cwd=cwd, preexec_fn=_die_with_parent)
        finally:
            if log:
                logf.close()
        self.live.append(p)
        return p

    def forget(self, p):
        if p in self.live:
            self.live.remove(p)

    def stop(self, p, grace=5.0):
        """SIGTERM, up to `grace` s to exit, then SIGKILL; then SIGKILL for any descendant it
        left (an nginx worker whose master was killed)."""
        if p is None:
            return
        kids = measure.tree_pids(p.pid)[1:] if p.poll() is None else []
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(20)  # a process closing 10,000 sockets on a busy machine takes a while
                except subprocess.TimeoutExpired:
                    print(f"bench: warning: pid {p.pid} still there 20 s after SIGKILL", file=sys.stderr)
        for k in kids:
            deadline = time.monotonic() + 2.0
            while measure.alive(k) and time.monotonic() < deadline:
                time.sleep(0.01)
            if measure.alive(k):
                try:
                    os.kill(k, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for f in (p.stdin, p.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self.forget(p)

    def stop_all(self):
        for p in reversed(list(self.live)):
            self.stop(p, grace=3.0)


class LineReader:
    """Lines from a child's stdout pipe, each within a timeout. Reads the fd itself: a Python
    buffered reader can hold a line that select() then does not see."""

    def __init__(self, pipe):
        self.fd = pipe.fileno()
        self.buf = b""

    def readline(self, timeout):
        """The next line without its newline; None on timeout, "" at EOF."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return ""
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace").rstrip("\r")
