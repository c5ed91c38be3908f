"""Unit tests of bench/cg_cache.py, the per-request cache figures of `BENCH_CG_CACHE=1
bench/callgrind.sh`, on a small callgrind file written here in callgrind's own compressed format
(relative and repeated positions, name compression, a call's inclusive cost that must not count
as the caller's own code).

    python3 -m unittest discover -s bench/tests
"""

import sys
import tempfile
import unittest
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

import cg_cache  # noqa: E402

# Ten requests. Code line 0x1000 (64 bytes) runs 30 instructions, line 0x1040 runs 10, line
# 0x2000 (the callee) runs 4: 0.4 a request, under the hot threshold. The call line's 999 is the
# callee's inclusive cost, seen at the caller's address 0x1044: it must not count for 0x1040.
SAMPLE = """version: 1
creator: callgrind-3.19.0
positions: instr line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim
summary: 44 0 0 25 7 3 0 0 0 0 4 0 1

ob=(1) /bin/proxy
fl=(1) src/proxy.rs
fn=(1) handle
0x1000 10 20 0 0 10
+8 * 10 0 0 5
+56 11 10 0 0 5 4 1 0 0 0 0 3
cfn=(2) callee
calls=2 0x2000 50
+4 * 999 0 0 999
fn=(2)
0x2000 50 4 0 0 5 3 2 0 0 0 0 1 0 1

totals: 44 0 0 25 7 3 0 0 0 0 4 0 1
"""


class CgCache(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".cg", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(Path(f.name).unlink)
        return f.name

    def test_lines_take_each_cost_at_its_address_and_skip_call_costs(self):
        totals, lines = cg_cache.read(self.write(SAMPLE))
        self.assertEqual(dict(lines), {0x1000 // 64: 30, 0x1040 // 64: 10, 0x2000 // 64: 4})
        self.assertEqual(totals["I1mr"], 25)
        self.assertEqual(totals["Bim"], 1)

    def test_per_request_figures(self):
        f = cg_cache.figures(self.write(SAMPLE), 10)
        self.assertAlmostEqual(f["i1_misses"], 2.5)
        self.assertAlmostEqual(f["d1_misses"], 1.0)
        self.assertAlmostEqual(f["mispredicts"], 0.5)
        # Two lines run at least half an instruction per request; the callee's does not.
        self.assertAlmostEqual(f["hot_code_kib"], 2 * 64 / 1024)

    def test_a_file_without_the_simulations_is_refused(self):
        plain = SAMPLE.replace("events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim", "events: Ir")
        with self.assertRaisesRegex(ValueError, "cache-sim"):
            cg_cache.figures(self.write(plain), 10)
        no_instr = "positions: line\nevents: Ir I1mr D1mr D1mw Bcm Bim\nfn=(1) f\n10 5 1 1 1 1 1\n"
        with self.assertRaisesRegex(ValueError, "dump-instr"):
            cg_cache.figures(self.write(no_instr), 10)


if __name__ == "__main__":
    unittest.main()
