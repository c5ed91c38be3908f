#!/usr/bin/env bash
# Install (or reuse) the test authorization server's packages (oidc-provider, pinned by
# tests/idp/package-lock.json) into tests/idp/node_modules with `npm ci`.
# Idempotent: a stamp file holds the sha256 of package-lock.json; when it matches, nothing is installed.
# Progress goes to stderr; the LAST line on stdout is the directory to pass as MRTR_IDP_DIR, e.g.
#   MRTR_IDP_DIR="$(bash tests/idp/setup.sh | tail -n1)"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lock="$here/package-lock.json"
modules="$here/node_modules"
stamp="$modules/.package-lock.sha256"

die() {
    echo "setup.sh: ERROR: $*" >&2
    exit 1
}

command -v node >/dev/null 2>&1 || die "node not found on PATH (need Node.js >= 20.18: apt-get install nodejs)"
command -v npm >/dev/null 2>&1 || die "npm not found on PATH (apt-get install npm)"
# oidc-provider uses URL.parse (Node.js 20.18+) and crypto.hash (20.12+).
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 18) ? 0 : 1)' \
    || die "node is $(node --version); the test authorization server needs Node.js >= 20.18"
[ -f "$lock" ] || die "missing $lock"

want="$(node -e 'process.stdout.write(require("crypto").createHash("sha256").update(require("fs").readFileSync(process.argv[1])).digest("hex"))' "$lock")"
loads() { (cd "$here" && node --input-type=module -e 'await import("oidc-provider")') 2>/dev/null; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && loads; then
    echo "setup.sh: reusing $modules (package-lock.json unchanged)" >&2
else
    echo "setup.sh: npm ci in $here (oidc-provider, pinned by package-lock.json)" >&2
    (cd "$here" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error) >&2 \
        || die "npm ci in $here failed (see npm output above)"
    loads || die "npm ci succeeded but 'import(\"oidc-provider\")' fails in $here"
    echo "$want" >"$stamp"
    echo "setup.sh: installed into $modules" >&2
fi

echo "$here"
