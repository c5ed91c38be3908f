#!/usr/bin/env bash
# Install (or reuse) the browser driver's package (playwright-core, pinned by
# tests/browser/package-lock.json) into tests/browser/node_modules with `npm ci`, and check that
# Debian's chromium is at /usr/bin/chromium (playwright-core drives it; it downloads no browser).
# Idempotent: a stamp file holds the sha256 of package-lock.json; when it matches, nothing is installed.
# Progress goes to stderr; the LAST line on stdout is the directory to pass as MRTR_BROWSER_DIR, e.g.
#   MRTR_BROWSER_DIR="$(bash tests/browser/setup.sh | tail -n1)"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lock="$here/package-lock.json"
modules="$here/node_modules"
stamp="$modules/.package-lock.sha256"
chromium=/usr/bin/chromium

die() {
    echo "setup.sh: ERROR: $*" >&2
    exit 1
}

command -v node >/dev/null 2>&1 || die "node not found on PATH (need Node.js >= 20: apt-get install nodejs)"
command -v npm >/dev/null 2>&1 || die "npm not found on PATH (apt-get install npm)"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
    || die "node is $(node --version); playwright-core needs Node.js >= 20"
[ -x "$chromium" ] || die "$chromium not found (apt-get install chromium)"
"$chromium" --version >&2 || die "$chromium --version failed"
[ -f "$lock" ] || die "missing $lock"

want="$(node -e 'process.stdout.write(require("crypto").createHash("sha256").update(require("fs").readFileSync(process.argv[1])).digest("hex"))' "$lock")"
loads() { (cd "$here" && node --input-type=module -e 'await import("playwright-core")') 2>/dev/null; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && loads; then
    echo "setup.sh: reusing $modules (package-lock.json unchanged)" >&2
else
    echo "setup.sh: npm ci in $here (playwright-core, pinned by package-lock.json)" >&2
    (cd "$here" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) >&2 \
        || die "npm ci in $here failed (see npm output above)"
    loads || die "npm ci succeeded but 'import(\"playwright-core\")' fails in $here"
    echo "$want" >"$stamp"
    echo "setup.sh: installed into $modules" >&2
fi

echo "$here"
