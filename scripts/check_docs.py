#!/usr/bin/env python3
"""Checks the project's documentation; standard library only.

    python3 scripts/check_docs.py               # the whole repository
    python3 scripts/check_docs.py --docs-only   # the word check on the project's own docs only
    python3 scripts/check_docs.py --built docs/book   # and the built book's heading ids

Fails (exit 1, one line per problem) on:

- a relative link, in the book (docs/src/**/*.md) or a top-level guide (README.md,
  ARCHITECTURE.md, CHANGELOG.md, deploy/README.md, vendor/README.md, bench/README.md), to a file
  that does not exist, to a place outside the repository, or to an anchor that its target has no
  heading for (heading ids as mdBook and GitHub make them: lowercase, spaces to '-', punctuation
  other than '-' and '_' dropped, '-1', '-2'... after a repeated one);
- a chapter under docs/src that docs/src/SUMMARY.md does not list, and an entry of SUMMARY.md
  without a file;
- with --built, a chapter whose headings mdBook gave other ids than the ones computed here (so
  the anchor check cannot drift from the mdBook that builds the book);
- text that points outside the repository or at how the work was organised (the brief the
  project was built from, its sections, work sessions, issue numbers), in every text file of the
  repository but vendor/ and what git ignores (target/, the venvs, the built book); with
  --docs-only, in the book and the top-level guides the project writes (not vendor/ or bench/).
"""

import argparse
import os
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

# The guides whose links are checked, besides every chapter of the book.
GUIDES = [
    "README.md",
    "ARCHITECTURE.md",
    "CHANGELOG.md",
    "deploy/README.md",
    "vendor/README.md",
    "bench/README.md",
]
# The guides the word check covers with --docs-only: those the book's authors write.
OWN_GUIDES = ["README.md", "ARCHITECTURE.md", "CHANGELOG.md", "deploy/README.md"]
BOOK_SRC = "docs/src"
SUMMARY = "docs/src/SUMMARY.md"

# Written so that this file does not match them itself.
FORBIDDEN = [
    (re.compile(r"\.\./shared"), "a path outside the repository"),
    (re.compile(r"shared[/]"), "the brief's folder outside the repository"),
    (re.compile(r"DESIGN[.]md"), "the brief the project was built from"),
    (re.compile(r"DESIGN\s*§"), "a section of the brief the project was built from"),
    (re.compile(r"[Ss]ession\s[0-9]"), "a work session"),
    (re.compile(r"\b[Ii]ssue\s#[0-9]"), "an issue number of the work plan"),
]
# Directories the repository-wide word check never enters, whatever git says.
SKIPPED_DIRS = {".git", "target", "vendor", ".tools", "node_modules", "__pycache__"}

FENCE = re.compile(r"^ {0,3}(```+|~~~+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*(?:#+[ \t]*)?$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
BUILT_HEADING = re.compile(r'<h[1-6] id="([^"]*)"')
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text):
    """The lines of a Markdown text outside fenced code blocks, as (number, line)."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            continue
        if fence is not None:
            if line.lstrip().startswith(fence):
                fence = None
            continue
        yield number, line


def heading_id(text):
    """The id mdBook and GitHub give a heading with this text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(text):
    """Every heading id of a Markdown text; a repeated id gets -1, -2, ... after it."""
    seen = {}
    out = set()
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = heading_id(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text):
    """Every link target of a Markdown text outside code, as (line number, target)."""
    for number, line in prose_lines(text):
        m = REFERENCE_DEF.match(line)
        if m:
            yield number, m.group(1)
            continue
        line = CODE_SPAN.sub("", line)
        for m in INLINE_LINK.finditer(line):
            yield number, m.group(1)


class Checker:
    def __init__(self, root):
        self.root = Path(root).resolve()
        self.problems = []
        self._anchors = {}

    def problem(self, path, number, message):
        rel = path.relative_to(self.root) if path.is_absolute() else path
        self.problems.append(f"{rel}:{number}: {message}")

    def anchors_of(self, path):
        if path not in self._anchors:
            self._anchors[path] = anchors(path.read_text(encoding="utf-8"))
        return self._anchors[path]

    def doc_files(self):
        """The book's chapters and the guides that exist."""
        book = sorted((self.root / BOOK_SRC).rglob("*.md")) if (self.root / BOOK_SRC).is_dir() else []
        guides = [self.root / g for g in GUIDES if (self.root / g).is_file()]
        # SUMMARY.md's links are its entries, checked by check_summary.
        return guides + [p for p in book if p != self.root / SUMMARY]

    def check_links(self, path):
        text = path.read_text(encoding="utf-8")
        for number, target in links(text):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            file_part = urllib.parse.unquote(file_part)
            if file_part.startswith("/"):
                self.problem(path, number, f"link {target!r}: an absolute path (write it relative to this file)")
                continue
            dest = (path.parent / file_part).resolve() if file_part else path
            if dest != self.root and self.root not in dest.parents:
                self.problem(path, number, f"link {target!r} points outside the repository")
                continue
            if not dest.exists():
                self.problem(path, number, f"link {target!r}: no such file {dest.relative_to(self.root)}")
                continue
            if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in self.anchors_of(dest):
                self.problem(
                    path,
                    number,
                    f"link {target!r}: {dest.relative_to(self.root)} has no heading with the id {anchor!r}",
                )

    def check_summary(self):
        src = self.root / BOOK_SRC
        summary = self.root / SUMMARY
        if not summary.is_file():
            self.problem(summary, 0, "the book has no SUMMARY.md")
            return
        listed = set()
        for number, target in links(summary.read_text(encoding="utf-8")):
            if not target:
                self.problem(summary, number, "an entry without a file (a draft chapter)")
                continue
            if SCHEME.match(target):
                continue
            dest = (src / urllib.parse.unquote(target.partition("#")[0])).resolve()
            if not dest.is_file():
                self.problem(summary, number, f"entry {target!r}: no such chapter")
            listed.add(dest)
        for chapter in sorted(src.rglob("*.md")):
            if chapter.resolve() != summary.resolve() and chapter.resolve() not in listed:
                self.problem(chapter, 0, f"a chapter {SUMMARY} does not list")

    def word_files(self, docs_only):
        if docs_only:
            book = sorted((self.root / BOOK_SRC).rglob("*.md")) if (self.root / BOOK_SRC).is_dir() else []
            return [self.root / g for g in OWN_GUIDES if (self.root / g).is_file()] + book
        return [p for p in repository_files(self.root) if not p.is_relative_to(self.root / "vendor")]

    def check_words(self, path):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            return  # not text
        if "\0" in text:
            return
        for number, line in enumerate(text.splitlines(), 1):
            for pattern, what in FORBIDDEN:
                m = pattern.search(line)
                if m:
                    self.problem(path, number, f"{m.group(0)!r} refers to {what}: cite the project's own docs")
                    break

    def check_built(self, built):
        """Compares the heading ids of every built chapter with the ones computed here."""
        built = Path(built).resolve()
        src = self.root / BOOK_SRC
        for chapter in sorted(src.rglob("*.md")):
            if chapter == self.root / SUMMARY:
                continue
            page = built / chapter.relative_to(src).with_suffix(".html")
            if not page.is_file():
                self.problem(chapter, 0, f"not built: no {page}")
                continue
            made = set(BUILT_HEADING.findall(page.read_text(encoding="utf-8")))
            computed = self.anchors_of(chapter)
            if made != computed:
                self.problem(
                    chapter,
                    0,
                    f"mdBook's heading ids differ from the computed ones: only mdBook's {sorted(made - computed)}, "
                    f"only computed {sorted(computed - made)}",
                )

    def run(self, docs_only=False, built=None):
        for path in self.doc_files():
            self.check_links(path)
        self.check_summary()
        if built is not None:
            self.check_built(built)
        for path in self.word_files(docs_only):
            self.check_words(path)
        return self.problems


def repository_files(root):
    """Every file git does not ignore (tracked or not yet), outside the skipped folders."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            check=True,
            capture_output=True,
        ).stdout
        names = [n for n in out.decode("utf-8", "replace").split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith(".venv")]
            names += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames]
    files = []
    for name in sorted(set(names)):
        parts = Path(name).parts
        if any(p in SKIPPED_DIRS or p.startswith(".venv") for p in parts):
            continue
        path = root / name
        if path.is_file():
            files.append(path)
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--docs-only",
        action="store_true",
        help="check the words only in the book and the project's own guides, not the whole repository",
    )
    parser.add_argument("--built", help="the built book (docs/book): check mdBook's heading ids too")
    parser.add_argument("--root", default=Path(__file__).resolve().parent.parent, help="the repository")
    args = parser.parse_args(argv)
    problems = Checker(args.root).run(docs_only=args.docs_only, built=args.built)
    for p in problems:
        print(p)
    if problems:
        print(f"check_docs: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    scope = "the docs" if args.docs_only else "the repository"
    print(f"check_docs: links, SUMMARY.md and {scope} are clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
