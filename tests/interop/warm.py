"""Runs a script of this folder in a Python that has the MCP SDK imported already.

    python -S warm.py SCRIPT [ARGS...]      as `python -u SCRIPT ARGS...` would, but forked

The external tests start some seventy SDK servers and clients, and each import of the SDK
(pydantic models built, starlette, uvicorn, httpx2) costs about a second of CPU: most of what
those tests spend. So one process per venv imports the SDK once and forks a child for each
run, the way multiprocessing's forkserver does; the child runs SCRIPT as `__main__` with this
process's stdin, stdout, stderr (passed over a Unix socket), environment, directory and
arguments, and this process exits with the child's status.

- This process (the launcher) needs only the standard library: `-S` keeps its start at a few
  milliseconds. The forking process is started by the first launcher that finds none, and
  stops by itself after IDLE_SECONDS without a run.
- The child lives exactly as long as the launcher: it watches the socket they share, and kills
  itself when the launcher is gone (a test's `kill()` is SIGKILL, which nothing can catch).
  SIGTERM, SIGINT and SIGHUP sent to the launcher are passed on to the child.
- Output is unbuffered (`-u`): the tests read READY lines as they come.
"""

import os
import signal
import socket
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# What the scripts here import that costs (a child imports the rest itself).
PRELOAD = (
    "anyio",
    "httpx2",
    "jwt",
    "mcp",
    "mcp.client.auth",
    "mcp.client.auth.extensions.client_credentials",
    "mcp.client.extension",
    "mcp.client.streamable_http",
    "mcp.server.auth.middleware.auth_context",
    "mcp.server.auth.provider",
    "mcp.server.auth.routes",
    "mcp.server.auth.settings",
    "mcp.server.context",
    "mcp.server.extension",
    "mcp.server.mcpserver",
    "mcp.server.request_state",
    "mcp.shared.auth",
    "mcp.shared.exceptions",
    "mcp_types",
    "pydantic",
    "starlette.types",
    "uvicorn",
)
IDLE_SECONDS = 30
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


VENV = os.path.dirname(os.path.dirname(sys.executable))


def socket_path():
    """One forking process per venv and per copy of this file (a changed preload list or venv
    gets a new one). The socket sits in the temporary directory (a socket's path is short), and
    goes when the process stops; the lock and the log stay in the venv."""
    import hashlib

    venv_cfg = os.path.join(VENV, "pyvenv.cfg")
    stamps = [sys.executable, HERE]
    for f in (venv_cfg, os.path.abspath(__file__)):
        try:
            stamps.append(str(os.stat(f).st_mtime_ns))
        except OSError:
            stamps.append("-")
    key = hashlib.sha256("\0".join(stamps).encode()).hexdigest()[:16]
    return os.path.join(os.environ.get("TMPDIR", "/tmp"), f"mrtr-warm-{os.getuid()}-{key}.sock")


def die(message):
    os.write(2, f"warm.py: {message}\n".encode())
    os._exit(1)


# ---- the launcher ------------------------------------------------------------------------------


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        raise
    return s


def connect_or_start(path):
    try:
        return connect(path)
    except OSError:
        pass
    import fcntl
    import subprocess

    # One launcher starts the forking process; the others wait on the lock, then connect.
    with open(os.path.join(VENV, "mrtr-warm.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return connect(path)
        except OSError:
            pass
        log_path = os.path.join(VENV, "mrtr-warm.log")
        with open(log_path, "ab") as log:
            server = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--serve", path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        # It says "ready" once it listens, or closes its stdout by dying.
        said = server.stdout.readline()
        server.stdout.close()
        if said != b"ready\n":
            die(f"the forking process did not start (exit {server.wait()}; its log: {log_path})")
        return connect(path)


def launch(script, args):
    path = socket_path()
    request = repr({"script": script, "args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    # A forking process that stops for idleness just as this one connects drops the connection
    # unanswered: nothing was forked yet, so asking again is safe.
    for _ in range(3):
        s = connect_or_start(path)
        try:
            socket.send_fds(s, [struct.pack("!I", len(request)) + request], [0, 1, 2])
            started = s.recv(64)
        except OSError:
            started = b""
        if started.startswith(b"started\n"):
            break
        s.close()
    else:
        die("the forking process dropped the run three times")

    def forward(signum, _frame):
        try:
            s.sendall(struct.pack("!B", signum))
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    said = started[len(b"started\n") :]
    while True:
        try:
            chunk = s.recv(64)
        except InterruptedError:
            continue
        if not chunk:
            break
        said += chunk
    if said.startswith(b"exit "):
        os._exit(int(said.split()[1]))
    die(f"{os.path.basename(script)} ended without an exit status (killed by a signal)")


# ---- the forking process -----------------------------------------------------------------------


def receive(conn):
    """The request and the three descriptors that come with it."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None, []
    size = struct.unpack("!I", data[:4])[0]
    data = data[4:]
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            break
        data += more
    import ast

    return ast.literal_eval(data.decode()), fds


def serve(path):
    import gc
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    # Objects that exist now are never collected: a child's collections then leave the pages
    # it shares with this process unwritten.
    gc.freeze()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    listener.settimeout(IDLE_SECONDS)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped as they end
    os.write(1, b"ready\n")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.close(devnull)
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            # New launchers now start another; one already queued is dropped, and asks again.
            os.unlink(path)
            return
        conn.settimeout(10)
        try:
            request, fds = receive(conn)
        except (OSError, ValueError, SyntaxError):
            request, fds = None, []
        if request is None:
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            run_child(conn, request, fds)  # raises SystemExit: the child never comes back here
        conn.close()
        for fd in fds:
            os.close(fd)


def run_child(conn, request, fds):
    import atexit
    import io
    import runpy
    import threading

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace")
    conn.settimeout(None)

    def watch():
        while True:
            try:
                said = conn.recv(16)
            except OSError:
                said = b""
            if not said:
                os.kill(os.getpid(), signal.SIGKILL)
            for signum in said:
                os.kill(os.getpid(), signum)

    status = [1]

    def report():
        try:
            conn.sendall(f"exit {status[0]}\n".encode())
        except OSError:
            pass

    # Registered before the script's own: atexit runs them last first, so this one goes after
    # every handler of the script, just before the interpreter ends.
    atexit.register(report)
    conn.sendall(b"started\n")
    threading.Thread(target=watch, daemon=True).start()
    script = request["script"]
    sys.argv = [script] + request["args"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
        status[0] = 0
    except SystemExit as e:
        if e.code is None:
            status[0] = 0
        elif isinstance(e.code, int):
            status[0] = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            status[0] = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        status[0] = 1
    raise SystemExit(status[0])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 2 and not sys.argv[1].startswith("-"):
        launch(os.path.abspath(sys.argv[1]), sys.argv[2:])
    else:
        die("usage: python -S warm.py SCRIPT [ARGS...]")
