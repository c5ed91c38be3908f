#!/usr/bin/env python3
"""Per-request cache figures from a callgrind file, for `BENCH_CG_CACHE=1 bench/callgrind.sh`.

    cg_cache.py <callgrind.out> <requests>

The file must come from `valgrind --tool=callgrind --cache-sim=yes --branch-sim=yes
--dump-instr=yes` (what callgrind.sh runs with BENCH_CG_CACHE=1). Prints one line: instruction
fetches that missed the simulated L1 instruction cache (I1), data accesses that missed L1 (D1),
mispredicted branches (conditional + indirect), all per request, and the hot code: the bytes of
the 64-byte code lines that run at least half an instruction per request on average (the code
on the path of every request; start-up and rare paths fall below). When the hot code is larger
than the L1 instruction cache (32 KiB here), nearly every hot line is fetched again from L2 on
every request, so I1 misses track the hot code, not the instruction count.

Standard library only; bench/tests/test_cg_cache.py checks the parsing.
"""

import collections
import sys

LINE = 64


def _position(field, last):
    """One compressed callgrind position: absolute, `+n`/`-n` relative, or `*` (the same)."""
    if field == "*":
        return last
    if field[0] in "+-":
        step = int(field[1:], 0)
        return last + step if field[0] == "+" else last - step
    return int(field, 0)


def read(path):
    """(events per name over the whole file, cost of the first event per 64-byte code line)."""
    totals = {}
    lines = collections.Counter()
    positions = ["line"]
    names = []
    last = [0, 0]
    after_call = False
    with open(path) as f:
        for raw in f:
            if raw.startswith("positions:"):
                positions = raw.split()[1:]
                last = [0] * len(positions)
            elif raw.startswith("events:"):
                names = raw.split()[1:]
            elif raw.startswith(("totals:", "summary:")) and not totals:
                totals = dict(zip(names, (int(x) for x in raw.split()[1:])))
            elif raw.startswith("calls="):
                # The next cost line is the call's inclusive cost at the call site.
                after_call = True
            elif raw[:1].isdigit() or raw[:1] in "+-*":
                fields = raw.split()
                last = [_position(fields[i], last[i]) for i in range(len(positions))]
                if after_call:
                    after_call = False
                    continue
                costs = fields[len(positions):]
                if "instr" in positions and costs:
                    lines[last[positions.index("instr")] // LINE] += int(costs[0])
    return totals, lines


def figures(path, requests):
    """The per-request figures `main` prints, as a dict."""
    totals, lines = read(path)
    if not lines:
        raise ValueError(f"{path}: no instruction addresses (run callgrind with --dump-instr=yes)")
    need = [e for e in ("I1mr", "D1mr", "D1mw", "Bcm", "Bim") if e not in totals]
    if need:
        raise ValueError(f"{path}: no {', '.join(need)} (run callgrind with --cache-sim=yes --branch-sim=yes)")
    hot = sum(1 for cost in lines.values() if cost / requests >= 0.5)
    return {
        "i1_misses": totals["I1mr"] / requests,
        "d1_misses": (totals["D1mr"] + totals["D1mw"]) / requests,
        "mispredicts": (totals["Bcm"] + totals["Bim"]) / requests,
        "hot_code_kib": hot * LINE / 1024,
    }


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        f = figures(argv[1], float(argv[2]))
    except (OSError, ValueError) as e:
        print(f"cg_cache.py: {e}", file=sys.stderr)
        return 1
    print(
        f"I1 misses/request {f['i1_misses']:7.0f}   D1 misses/request {f['d1_misses']:5.0f}   "
        f"mispredicts/request {f['mispredicts']:5.0f}   hot code {f['hot_code_kib']:6.1f} KiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
