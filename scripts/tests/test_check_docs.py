"""Unit tests of scripts/check_docs.py, on small repositories written here: each kind of problem
is found (and named), and what is fine passes.

    python3 -m unittest discover -s scripts/tests
"""

import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(SCRIPTS))

import check_docs  # noqa: E402

# Built here, so that this file does not hold the words the check refuses.
BRIEF = "DESIGN" + ".md"
SECTION = "DESIGN" + " §3"
WORK_SESSION = "Session" + " 12"

SUMMARY = """\
# Summary

[Introduction](introduction.md)

- [Routing](routing.md)
- [Design](design/dependencies.md)
"""


class Repo:
    """A repository in a temporary folder, with a book whose every chapter is listed."""

    def __init__(self, files=None):
        self.dir = tempfile.TemporaryDirectory()
        self.root = Path(self.dir.name)
        base = {
            "docs/src/SUMMARY.md": SUMMARY,
            "docs/src/introduction.md": "# Introduction\n\nSee [routing](routing.md#the-order).\n",
            "docs/src/routing.md": "# Routing\n\n## The order\n",
            "docs/src/design/dependencies.md": "# Dependencies\n\nBack to [the start](../introduction.md).\n",
            "README.md": "# Front\n\nRead [the book](docs/src/introduction.md).\n",
        }
        base.update(files or {})
        for name, text in base.items():
            if text is None:
                continue
            path = self.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text), encoding="utf-8")

    def problems(self, docs_only=False):
        return check_docs.Checker(self.root).run(docs_only=docs_only)

    def close(self):
        self.dir.cleanup()


class CheckDocsTest(unittest.TestCase):
    def repo(self, files=None):
        r = Repo(files)
        self.addCleanup(r.close)
        return r

    def assertOneProblem(self, problems, *words):
        self.assertEqual(len(problems), 1, problems)
        for w in words:
            self.assertIn(w, problems[0])

    def test_a_clean_repository_passes(self):
        self.assertEqual(self.repo().problems(), [])

    def test_heading_ids_follow_mdbook_and_github(self):
        self.assertEqual(check_docs.heading_id("When handles disagree"), "when-handles-disagree")
        self.assertEqual(check_docs.heading_id("`mrtr_pins` (gauge)"), "mrtr_pins-gauge")
        self.assertEqual(check_docs.heading_id("TLS and HTTP/2 to backends"), "tls-and-http2-to-backends")
        self.assertEqual(check_docs.heading_id("Pins — created, expired"), "pins--created-expired")
        self.assertEqual(check_docs.heading_id("[The book](x.md) again"), "the-book-again")
        text = "# A\n\n## Notes\n\n```\n# not a heading\n```\n\n## Notes\n\n### Notes #\n"
        self.assertEqual(check_docs.anchors(text), {"a", "notes", "notes-1", "notes-2"})

    def test_a_link_to_a_missing_file_is_named(self):
        problems = self.repo({"README.md": "See [it](docs/src/nowhere.md).\n"}).problems()
        self.assertOneProblem(problems, "README.md:1", "docs/src/nowhere.md", "no such file")

    def test_a_link_to_a_missing_anchor_is_named(self):
        problems = self.repo({"docs/src/introduction.md": "[r](routing.md#the-orders)\n"}).problems()
        self.assertOneProblem(problems, "docs/src/introduction.md:1", "the-orders", "no heading")

    def test_an_anchor_in_the_same_file(self):
        ok = self.repo({"ARCHITECTURE.md": "# Code map\n\nSee [below](#invariants).\n\n## Invariants\n"})
        self.assertEqual(ok.problems(), [])
        bad = self.repo({"ARCHITECTURE.md": "# Code map\n\nSee [below](#invariant).\n\n## Invariants\n"})
        self.assertOneProblem(bad.problems(), "ARCHITECTURE.md:3", "#invariant")

    def test_a_link_outside_the_repository_is_refused(self):
        problems = self.repo({"README.md": "[brief](../elsewhere/notes.md)\n"}).problems()
        self.assertOneProblem(problems, "outside the repository")
        problems = self.repo({"README.md": "[brief](/etc/passwd)\n"}).problems()
        self.assertOneProblem(problems, "absolute path")

    def test_urls_code_and_reference_links(self):
        text = """\
            [web](https://example.org/x#y) and [mail](mailto:a@b.c) are not checked,
            nor `[code](missing.md)`, nor:

            ```toml
            [table](missing.md)
            ```

            A [reference][r] is.

            [r]: docs/src/missing.md
            """
        problems = self.repo({"README.md": text}).problems()
        self.assertOneProblem(problems, "README.md:10", "docs/src/missing.md")

    def test_a_chapter_summary_does_not_list_and_an_entry_without_a_file(self):
        problems = self.repo({"docs/src/orphan.md": "# Orphan\n"}).problems()
        self.assertOneProblem(problems, "docs/src/orphan.md", "does not list")
        problems = self.repo({"docs/src/routing.md": None}).problems()
        # The SUMMARY entry, and the introduction's link to it.
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(any("SUMMARY.md:5" in p and "no such chapter" in p for p in problems), problems)
        problems = self.repo({"docs/src/SUMMARY.md": SUMMARY + "- [Draft]()\n"}).problems()
        self.assertOneProblem(problems, "SUMMARY.md:7", "draft")

    def test_words_that_point_outside_the_repository(self):
        for words in [BRIEF, SECTION, WORK_SESSION, "see ../" + "shared" + "/x", "issue" + " #22"]:
            problems = self.repo({"docs/src/routing.md": f"# Routing\n\n## The order\n\nAs {words} says.\n"}).problems()
            self.assertOneProblem(problems, "docs/src/routing.md:5")
        # "sessions 24 h" and a session id are no work sessions.
        fine = "# Routing\n\n## The order\n\nLegacy sessions 24 h; session ids; `session_ttl`.\n"
        self.assertEqual(self.repo({"docs/src/routing.md": fine}).problems(), [])

    def test_the_whole_repository_or_only_the_docs(self):
        repo = self.repo({"src/lib.rs": f"//! See {SECTION}.\n", "vendor/x/README.md": f"{WORK_SESSION}\n"})
        self.assertEqual(repo.problems(docs_only=True), [])
        self.assertOneProblem(repo.problems(), "src/lib.rs:1")
        # What git ignores is not read.
        subprocess.run(["git", "init", "-q", str(repo.root)], check=True)
        (repo.root / ".gitignore").write_text("/target\n")
        (repo.root / "target").mkdir()
        (repo.root / "target/notes.md").write_text(f"{SECTION}\n")
        self.assertOneProblem(repo.problems(), "src/lib.rs:1")

    def test_the_built_books_heading_ids(self):
        repo = self.repo()
        built = repo.root / "docs/book"
        pages = {
            "introduction.html": '<h1 id="introduction">',
            "routing.html": '<h1 id="routing">x</h1><h2 id="the-order">',
            "design/dependencies.html": '<h1 id="dependencies">',
        }
        for name, html in pages.items():
            (built / name).parent.mkdir(parents=True, exist_ok=True)
            (built / name).write_text(html)
        self.assertEqual(repo.problems(), [])
        self.assertEqual(check_docs.Checker(repo.root).run(built=built), [])
        (built / "routing.html").write_text('<h1 id="routing">x</h1><h2 id="the_order">')
        problems = check_docs.Checker(repo.root).run(built=built)
        self.assertOneProblem(problems, "docs/src/routing.md", "the_order", "the-order")
        (built / "routing.html").unlink()
        self.assertOneProblem(check_docs.Checker(repo.root).run(built=built), "not built")

    def test_the_command_fails_loudly(self):
        repo = self.repo({"README.md": "[x](missing.md)\n"})
        run = subprocess.run(
            [sys.executable, str(SCRIPTS / "check_docs.py"), "--root", str(repo.root)],
            capture_output=True,
            text=True,
        )
        self.assertEqual(run.returncode, 1, run)
        self.assertIn("README.md:1", run.stdout)
        clean = self.repo()
        run = subprocess.run(
            [sys.executable, str(SCRIPTS / "check_docs.py"), "--root", str(clean.root)],
            capture_output=True,
            text=True,
        )
        self.assertEqual(run.returncode, 0, run)


if __name__ == "__main__":
    unittest.main()
