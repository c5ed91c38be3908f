"""Unit tests of bench/check_budgets.py: the budget file, the figures read from
bench/callgrind.sh's output and bench/run.py's results, the verdict and the exit status. Nothing
is measured here (the figures are given as files).

    python3 -m unittest discover -s bench/tests
"""

import json
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH))

import check_budgets  # noqa: E402

BUDGETS = """
[instructions.header]
load = "header"
budget = 40_500
guards = ["hyper 0004 client-queue-vecdeque"]

[instructions.h2c]
load = "h2c"
budget = 57_000
guards = ["h2 0003 frames-with-header-blocks-boxed", "h2 0004 request-head-filled-in-place"]

[memory.streams]
row = "mrtr-streams"
budget = 5.2
guards = ["hyper 0002 client-queue-boxed-envelopes"]
"""

# What bench/callgrind.sh prints (one run per load), with its other lines.
CALLGRIND = """mrtr       header h1   requests   24692   instructions/request   40053
callgrind files: /tmp/x (callgrind_annotate --inclusive=yes /tmp/x/<peer>.<pid>.1)
haproxy    header h1   requests   30000   instructions/request   33000
mrtr       h2c    h1   requests   17665   instructions/request   56319
"""


def results(streams_kib, status="ok"):
    return {"rows": [
        {"peer": "mrtr-streams", "status": status, "memory": {"kib_per_conn": streams_kib}},
        {"peer": "mrtr-header", "status": "ok", "memory": None},
    ]}


class Budgets(unittest.TestCase):
    def test_the_checked_in_budgets_parse_and_name_what_they_guard(self):
        b = check_budgets.load_budgets((BENCH / "budgets.toml").read_text())
        self.assertEqual({e["load"] for e in b["instructions"].values()}, {"header", "body", "h2c"})
        self.assertEqual({e["row"] for e in b["memory"].values()}, {"mrtr-streams", "mrtr-idle-conns"})
        for kind in b.values():
            for entry in kind.values():
                for g in entry["guards"]:
                    self.assertRegex(g, r"^(hyper|h2) \d{4} [a-z0-9-]+")

    def test_every_patch_a_budget_guards_is_in_the_series(self):
        b = check_budgets.load_budgets((BENCH / "budgets.toml").read_text())
        for kind in b.values():
            for entry in kind.values():
                for g in entry["guards"]:
                    crate, number, slug = g.split()[:3]
                    patch = BENCH.parent / "vendor" / "patches" / crate / f"{number}-{slug}.patch"
                    self.assertTrue(patch.is_file(), f"{g}: no {patch}")

    def test_entries_get_their_defaults(self):
        b = check_budgets.load_budgets(BUDGETS)
        self.assertEqual(b["instructions"]["header"]["upstream"], "h1")
        self.assertEqual(b["memory"]["streams"]["guards"], ["hyper 0002 client-queue-boxed-envelopes"])

    def test_bad_files_are_refused(self):
        for text in (
            "not toml [",
            "[speed.header]\nload = 'header'\nbudget = 1",
            "[instructions.header]\nbudget = 1",
            "[instructions.header]\nload = 'tls'\nbudget = 1",
            "[instructions.header]\nload = 'header'\nbudget = 0",
            "[instructions.header]\nload = 'header'\nbudget = true",
            "[memory.streams]\nrow = 'mrtr-streams'\nbudget = 5\nguards = 'hyper 0002'",
            "",
        ):
            with self.subTest(text=text), self.assertRaises(check_budgets.BudgetError):
                check_budgets.load_budgets(text)


class Figures(unittest.TestCase):
    def test_callgrind_lines_of_the_router_only(self):
        self.assertEqual(check_budgets.parse_callgrind(CALLGRIND),
                         {("header", "h1"): 40053, ("h2c", "h1"): 56319})

    def test_the_median_of_a_loads_runs(self):
        runs = "\n".join(f"mrtr       body   h1   requests   20000   instructions/request   {ir}"
                         for ir in (39100, 38900, 39000, 41000))
        self.assertEqual(check_budgets.parse_callgrind(runs + "\n" + CALLGRIND)[("body", "h1")], 39000)
        self.assertEqual(check_budgets.parse_callgrind(runs)[("body", "h1")], 39000)

    def test_memory_rows_that_passed_only(self):
        self.assertEqual(check_budgets.parse_results(results(4.81)), {"mrtr-streams": 4.81})
        self.assertEqual(check_budgets.parse_results(results(4.81, status="FAILED")), {})


class Verdict(unittest.TestCase):
    def setUp(self):
        self.budgets = check_budgets.load_budgets(BUDGETS)
        self.ir = check_budgets.parse_callgrind(CALLGRIND)

    def test_within_budget(self):
        lines, over = check_budgets.check(self.budgets, self.ir, {"mrtr-streams": 4.81})
        self.assertEqual(over, [])
        self.assertEqual(len(lines), 3)
        self.assertTrue(all(line.startswith("ok") for line in lines), lines)

    def test_a_figure_at_its_budget_passes_one_over_fails_naming_what_it_guards(self):
        lines, over = check_budgets.check(self.budgets, self.ir, {"mrtr-streams": 5.2})
        self.assertEqual(over, [])
        lines, over = check_budgets.check(self.budgets, {**self.ir, ("h2c", "h1"): 57_001},
                                          {"mrtr-streams": 6.0})
        self.assertEqual(over, ["instructions.h2c", "memory.streams"])
        text = "\n".join(lines)
        self.assertIn("OVER instructions.h2c: 57001", text)
        self.assertIn("guards: h2 0004 request-head-filled-in-place", text)
        self.assertIn("guards: hyper 0002 client-queue-boxed-envelopes", text)
        self.assertNotIn("hyper 0004", text)

    def test_a_figure_not_measured_is_an_error(self):
        with self.assertRaises(check_budgets.BudgetError):
            check_budgets.check(self.budgets, {("header", "h1"): 40000}, {"mrtr-streams": 4.8})


class Main(unittest.TestCase):
    def files(self, budgets, callgrind, memory):
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        root = Path(d.name)
        (root / "budgets.toml").write_text(budgets)
        (root / "cg.txt").write_text(callgrind)
        (root / "results.json").write_text(json.dumps(memory))
        return ["--budgets", str(root / "budgets.toml"), "--callgrind", str(root / "cg.txt"),
                "--results", str(root / "results.json")]

    def run_main(self, args):
        out, err = StringIO(), StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = check_budgets.main(args)
        return code, out.getvalue(), err.getvalue()

    def test_exit_status(self):
        code, out, _ = self.run_main(self.files(BUDGETS, CALLGRIND, results(4.81)))
        self.assertEqual(code, 0, out)
        code, out, err = self.run_main(self.files(BUDGETS, CALLGRIND, results(5.5)))
        self.assertEqual(code, 1)
        self.assertIn("over budget: memory.streams", err)
        code, _, err = self.run_main(self.files(BUDGETS, CALLGRIND, {"rows": []}))
        self.assertEqual(code, 2)
        self.assertIn("no figure measured", err)
        code, _, _ = self.run_main(self.files("[instructions.x]\n", CALLGRIND, results(4.81)))
        self.assertEqual(code, 2)

    def test_only_one_kind(self):
        args = self.files(BUDGETS, CALLGRIND, {"rows": []}) + ["--only", "instructions"]
        code, out, _ = self.run_main(args)
        self.assertEqual(code, 0, out)
        self.assertNotIn("memory", out.replace("every figure", ""))


if __name__ == "__main__":
    unittest.main()
