"""The programs the harness drives: installing the Debian packages that are missing (as
bench/run.sh did: root, apt-get, services kept from starting), building the router, and
recording every version and the binary that was measured.
"""

import hashlib
import os
import platform
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

from .settings import SettingError

# command -> Debian package. python3 runs the harness already.
PACKAGES = {
    "wrk": "wrk", "haproxy": "haproxy", "nginx": "nginx", "h2load": "nghttp2-client",
    "openssl": "openssl", "taskset": "util-linux", "chrt": "util-linux",
}


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def ensure(settings):
    """Installs what is missing, or raises SettingError (exit 2)."""
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = sorted({pkg for cmd, pkg in PACKAGES.items() if shutil.which(cmd) is None})
    if not missing:
        return
    if settings.no_install:
        raise SettingError(f"missing packages: {' '.join(missing)} (BENCH_NO_INSTALL=1)")
    if os.geteuid() != 0:
        raise SettingError(f"missing packages: {' '.join(missing)}; run as root or install them")
    if shutil.which("apt-get") is None:
        raise SettingError(f"missing packages: {' '.join(missing)} and no apt-get")
    log(f"installing {' '.join(missing)} ...")
    # Keep apt from starting the distribution's nginx/haproxy services (policy-rc.d exit 101).
    policy = Path("/usr/sbin/policy-rc.d")
    added = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        added = True
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        ok = subprocess.run(["apt-get", "update", "-qq"], stdout=sys.stderr, env=env).returncode == 0
        ok = ok and subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
            stdout=sys.stderr, env=env).returncode == 0
    finally:
        if added:
            policy.unlink()
    if not ok:
        raise SettingError(f"apt-get install {' '.join(missing)} failed")


def build_release(settings):
    """cargo build --release of the router and the hyper floors, unless told not to; returns an
    error message (the router rows then fail) or None. One release build at a time on a shared
    machine: under flock when flock exists."""
    if settings.skip_build:
        return None
    if shutil.which("cargo") is None:
        return "cargo not found; cannot build the router (set BENCH_SKIP_BUILD=1 and BENCH_ROUTER_BIN)"
    cmd = ["cargo", "build", "--release", "--bins", "--example", "hyper_floor", "--example", "hyper_floor_h2c",
           "--example", "hyper_floor_scan"]
    if shutil.which("flock"):
        cmd = ["flock", "/tmp/mrtr-release.lock"] + cmd
    log(" ".join(cmd) + " ...")
    r = subprocess.run(cmd, cwd=settings.repo_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.stderr.write("\n".join(r.stdout.decode(errors="replace").splitlines()[-20:]) + "\n")
        return "cargo build --release failed"
    return None


def _first_line(cmd):
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10)
        return r.stdout.decode(errors="replace").splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return None


def _word(line, i):
    try:
        return line.split()[i]
    except (AttributeError, IndexError):
        return None


def versions(settings):
    git = ["git", "-C", str(settings.repo_dir)]
    commit = _first_line(git + ["rev-parse", "--short", "HEAD"]) or "none"
    dirty = subprocess.run(git + ["status", "--porcelain", "--", "src", "Cargo.toml", "Cargo.lock"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip() != b""
    nginx = _first_line(["nginx", "-v"])
    return {
        "wrk": _word(_first_line(["wrk", "-v"]), 1),
        "haproxy": _word(_first_line(["haproxy", "-v"]), 2),
        "nginx": nginx.rsplit("/", 1)[-1] if nginx else None,
        "h2load": _word(_first_line(["h2load", "--version"]), 1),
        "openssl": _word(_first_line(["openssl", "version"]), 1),
        "python": platform.python_version(),
        "python_ssl": ssl.OPENSSL_VERSION,
        "kernel": platform.release(),
        "repo_commit_at_start": commit,
        "repo_src_dirty_at_start": dirty,
    }


def binary_info(path):
    """The binary's modification time and the first 16 hex digits of its SHA-256."""
    p = Path(path)
    if not p.is_file():
        return None, None
    mtime = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(p.stat().st_mtime))
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return mtime, h.hexdigest()[:16]
