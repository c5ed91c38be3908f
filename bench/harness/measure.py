"""What the harness reads from the kernel: the CPU time, resident memory, threads and sleeps of a
process tree (/proc/<pid>/stat, status, task/*), how busy a set of cpus was (/proc/stat), and the
CPU of the harness's own reaped children (getrusage). One place, so every row is measured the
same way.

A process tree is the process and all its descendants (nginx's master and its worker). Its CPU
time is utime + stime of each process; /proc/<pid>/stat sums them over all of a process's
threads, so a multi-threaded proxy is covered. It includes the kernel's network work charged to
the process: on loopback, about half of every proxy's cost.
"""

import math
import os
import resource

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid):
    """(ppid, state, utime + stime in ticks) of one process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    rest = raw[raw.rindex(b")") + 2:].split()
    # fields after the command: state(3) ppid(4) ... utime(14) stime(15), 1-based in proc(5)
    return int(rest[1]), rest[0].decode(), int(rest[11]) + int(rest[12])


def alive(pid):
    """Running and not a zombie."""
    st = _stat(pid)
    return st is not None and st[1] != "Z"


def tree_pids(root):
    """root and its descendants, root first (one scan of /proc)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is not None:
            children.setdefault(st[0], []).append(int(name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def tree_ticks(root):
    """utime + stime, all threads, of the tree, in clock ticks."""
    total = 0
    for p in tree_pids(root):
        st = _stat(p)
        if st is not None:
            total += st[2]
    return total


def pids_ticks(pids):
    return sum(tree_ticks(p) for p in pids)


def _status(pid, *keys):
    vals = dict.fromkeys(keys, 0)
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in vals:
                    vals[k] = int(v.split()[0])
    except OSError:
        pass
    return vals


def tree_rss_bytes(root):
    """Resident memory of the tree: VmRSS (anonymous + file + shmem) of each process, summed.
    The rows use its change, so pages the processes share count once in the baseline and once
    in the measurement."""
    return sum(_status(p, "VmRSS")["VmRSS"] for p in tree_pids(root)) * 1024


def tree_threads(root):
    return sum(_status(p, "Threads")["Threads"] for p in tree_pids(root))


def tree_sleeps(root):
    """Voluntary context switches, all threads of the tree: how often it went to sleep."""
    total = 0
    for p in tree_pids(root):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tids:
            total += _status(f"{p}/task/{t}", "voluntary_ctxt_switches")["voluntary_ctxt_switches"]
    return total


def expand_cpus(spec):
    """'0-2,5' -> [0, 1, 2, 5]"""
    out = []
    for part in str(spec).split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def cpu_sample(cpus):
    """(total, idle) jiffies summed over the cpu list, from /proc/stat (idle includes iowait)."""
    want = {f"cpu{c}" for c in cpus}
    tot = idle = 0
    with open("/proc/stat") as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] in want:
                v = [int(x) for x in parts[1:9]]
                tot += sum(v)
                idle += v[3] + v[4]
    return tot, idle


def busy_pct(s0, s1, skip_ticks=0):
    """Busy share of the cpus between two samples, leaving out skip_ticks (the -awake loops)."""
    dt = s1[0] - s0[0]
    if dt <= 0:
        return None
    busy = dt - (s1[1] - s0[1]) - skip_ticks
    return round(100.0 * max(busy, 0) / dt, 1)


def children_ticks():
    """CPU time of this process's reaped children (wrk, h2load, the clients once waited for)
    and of this process itself, in clock ticks."""
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    s = resource.getrusage(resource.RUSAGE_SELF)
    return int((c.ru_utime + c.ru_stime + s.ru_utime + s.ru_stime) * CLK_TCK)


def listen_drops():
    """SYNs the kernel dropped machine-wide because a listen queue was full (TcpExt
    ListenDrops, which includes ListenOverflows): when connects time out, this says whether a
    listener stopped accepting."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:]))
            return int(row.get("ListenDrops", 0))
    return None


def percentile(values, p):
    """Nearest-rank percentile of a list of numbers (None when empty)."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, math.ceil(p * len(v) / 100.0) - 1))
    return v[k]


def median(values):
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
