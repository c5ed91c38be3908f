#!/usr/bin/env python3
"""Checks the router's figures against bench/budgets.toml: instructions per request
(bench/callgrind.sh) and memory per held SSE stream and per idle keep-alive connection
(bench/run.py's memory rows). Fails when a figure is over its budget, naming the vendored
patches whose saving that budget guards (vendor/README.md).

    bench/check_budgets.py                     run every measurement the budgets name, then check
    bench/check_budgets.py --only instructions (or memory)
    bench/check_budgets.py --callgrind OUT...   read bench/callgrind.sh's printed lines instead of
                                                running it (any number of runs per load: the median)
    bench/check_budgets.py --results JSON...    read bench/run.py's results instead of running it
    BENCH_ROUTER_BIN=/path/to/mrtr-router bench/check_budgets.py   another build (default
                                                target/release/mrtr-router)

The budgets are the release build's (`cargo build --release --bins`): a debug build is some 15
times dearer and fails them all. Each load runs three times under callgrind (`--runs`), its
median checked: one run moves by up to ~0.3% with how wrk's requests fall into the router's
wake-ups. Running everything takes about two and a half minutes (nine callgrind runs of ~12 s,
the two memory rows ~30 s). Exit status: 0 every figure
within its budget; 1 a figure over its budget (each is printed, with what it guards); 2 a
budget file that does not parse, a figure that was not measured, or a measurement that failed.

Standard library only (tomllib: Python 3.11); bench/tests/test_check_budgets.py checks it.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
LOADS = ("header", "body", "h2c")

# bench/callgrind.sh's result line for the router, e.g.
# "mrtr       header h1   requests   24692   instructions/request   40053"
CALLGRIND_LINE = re.compile(
    r"^mrtr\s+(?P<load>\S+)\s+(?P<upstream>\S+)\s+requests\s+(?P<requests>\d+)\s+"
    r"instructions/request\s+(?P<ir>\d+)\s*$"
)


class BudgetError(Exception):
    """A budget file or a measurement that cannot be used (exit status 2)."""


def load_budgets(text):
    """The budgets of a budgets.toml text: {"instructions": {name: entry}, "memory": {...}}.

    An instructions entry names its callgrind `load` (header, body, h2c) and may name its
    `upstream` (h1); a memory entry names its bench/run.py `row`. Every entry has a positive
    `budget` and a list of the patches it `guards` (may be empty)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BudgetError(f"budgets: not TOML: {e}") from None
    unknown = set(data) - {"instructions", "memory"}
    if unknown:
        raise BudgetError(f"budgets: unknown tables {sorted(unknown)} (instructions, memory)")
    out = {"instructions": {}, "memory": {}}
    for kind, key in (("instructions", "load"), ("memory", "row")):
        for name, entry in data.get(kind, {}).items():
            where = f"budgets: [{kind}.{name}]"
            if not isinstance(entry, dict):
                raise BudgetError(f"{where}: a table, not {entry!r}")
            if not isinstance(entry.get(key), str):
                raise BudgetError(f"{where}: no {key}")
            if kind == "instructions" and entry[key] not in LOADS:
                raise BudgetError(f"{where}: load {entry[key]!r} is not one of {', '.join(LOADS)}")
            budget = entry.get("budget")
            if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0:
                raise BudgetError(f"{where}: budget must be a positive number, not {budget!r}")
            guards = entry.get("guards", [])
            if not isinstance(guards, list) or not all(isinstance(g, str) for g in guards):
                raise BudgetError(f"{where}: guards must be a list of strings")
            entry = dict(entry, guards=guards)
            if kind == "instructions":
                entry.setdefault("upstream", "h1")
            out[kind][name] = entry
    if not out["instructions"] and not out["memory"]:
        raise BudgetError("budgets: no budget")
    return out


def parse_callgrind(text):
    """{(load, upstream): instructions per request} from bench/callgrind.sh's output: the
    median of a load's runs when the text has several (the lower middle one of an even count)."""
    runs = {}
    for line in text.splitlines():
        m = CALLGRIND_LINE.match(line.strip())
        if m:
            runs.setdefault((m["load"], m["upstream"]), []).append(int(m["ir"]))
    return {key: sorted(v)[(len(v) - 1) // 2] for key, v in runs.items()}


def parse_results(data):
    """{row: KiB per connection} from bench/run.py's results JSON (its memory rows)."""
    figures = {}
    for row in data.get("rows", []):
        memory = row.get("memory") or {}
        if row.get("status") == "ok" and memory.get("kib_per_conn") is not None:
            figures[row["peer"]] = float(memory["kib_per_conn"])
    return figures


def check(budgets, instructions, memory):
    """(lines to print, names over budget). Raises BudgetError for a figure not measured."""
    lines, over = [], []
    for kind, figures, unit in (("instructions", instructions, "instructions/request"),
                                ("memory", memory, "KiB/connection")):
        for name, entry in budgets[kind].items():
            key = (entry["load"], entry["upstream"]) if kind == "instructions" else entry["row"]
            if key not in figures:
                raise BudgetError(f"{kind}.{name}: no figure measured for {key}")
            got, budget = figures[key], entry["budget"]
            ok = got <= budget
            lines.append(f"{'ok  ' if ok else 'OVER'} {kind}.{name}: {got:g} {unit}, budget {budget:g}"
                         f" ({100.0 * (got - budget) / budget:+.1f}%)")
            if not ok:
                over.append(f"{kind}.{name}")
                for g in entry["guards"]:
                    lines.append(f"       guards: {g}")
    return lines, over


def router_bin():
    return os.environ.get("BENCH_ROUTER_BIN") or str(REPO / "target" / "release" / "mrtr-router")


def run_callgrind(loads, runs):
    """Runs bench/callgrind.sh for the router `runs` times under each load; its printed lines."""
    text = []
    for load in [load for load in sorted(loads) for _ in range(runs)]:
        env = dict(os.environ, BENCH_CG_PEERS="mrtr", BENCH_CG_LOAD=load, BENCH_ROUTER_BIN=router_bin())
        p = subprocess.run([str(BENCH / "callgrind.sh")], env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise BudgetError(f"bench/callgrind.sh ({load}) failed: {p.stderr.strip()[-2000:]}")
        print(p.stdout.strip().splitlines()[0] if p.stdout.strip() else "", flush=True)
        text.append(p.stdout)
    return "\n".join(text)


def run_memory_rows(rows):
    """Runs bench/run.py's memory rows once; its results JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        cmd = [sys.executable, str(BENCH / "run.py"), "--rows", ",".join(sorted(rows)), "--rounds", "1",
               "--skip-build", "--router-bin", router_bin(), "--results", str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if not out.exists():
            raise BudgetError(f"bench/run.py failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
        return json.loads(out.read_text())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default=str(BENCH / "budgets.toml"))
    ap.add_argument("--only", choices=("instructions", "memory"))
    ap.add_argument("--callgrind", nargs="+", metavar="OUT", help="bench/callgrind.sh output files")
    ap.add_argument("--results", nargs="+", metavar="JSON", help="bench/run.py results files")
    ap.add_argument("--runs", type=int, default=3,
                    help="callgrind runs per load, the median checked (default 3; a run's spread is ~0.3%%)")
    args = ap.parse_args(argv)
    try:
        budgets = load_budgets(Path(args.budgets).read_text())
        if args.only:
            budgets = {k: (v if k == args.only else {}) for k, v in budgets.items()}
        instructions, memory = {}, {}
        if budgets["instructions"]:
            if args.callgrind:
                text = "\n".join(Path(f).read_text() for f in args.callgrind)
            else:
                text = run_callgrind({e["load"] for e in budgets["instructions"].values()}, max(1, args.runs))
            instructions = parse_callgrind(text)
        if budgets["memory"]:
            if args.results:
                for f in args.results:
                    memory.update(parse_results(json.loads(Path(f).read_text())))
            else:
                memory = parse_results(run_memory_rows({e["row"] for e in budgets["memory"].values()}))
        lines, over = check(budgets, instructions, memory)
    except (BudgetError, OSError, json.JSONDecodeError) as e:
        print(f"check_budgets: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if over:
        print(f"check_budgets: over budget: {', '.join(over)} (bench/budgets.toml; vendor/README.md)", file=sys.stderr)
        return 1
    print("check_budgets: every figure within its budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
