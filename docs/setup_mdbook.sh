#!/usr/bin/env bash
# Create (or reuse) <repo>/.tools/mdbook-venv with docs/requirements.txt (mdBook, pinned by
# version and hash). Idempotent: a stamp file holds the sha256 of requirements.txt; when it
# matches and the binary answers with the pinned version, nothing is installed.
# Progress goes to stderr; the LAST line on stdout is the mdbook binary's path, e.g.
#   MDBOOK="$(bash docs/setup_mdbook.sh | tail -n1)"
# On a platform without a wheel: cargo install --locked mdbook --version 0.5.4 (a minute or two).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="$root/.tools/mdbook-venv"
req="$here/requirements.txt"
stamp="$venv/.requirements.sha256"
bin="$venv/bin/mdbook"
version="mdbook v0.5.4"

die() {
    echo "docs/setup_mdbook.sh: ERROR: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || die "python3 not found on PATH (need Python >= 3.9 with the venv module)"
[ -f "$req" ] || die "missing $req"
want="$(python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$req")"

if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ "$("$bin" --version 2>/dev/null)" = "$version" ]; then
    echo "docs/setup_mdbook.sh: reusing $bin" >&2
else
    rm -f "$stamp"
    if [ ! -x "$venv/bin/python" ]; then
        echo "docs/setup_mdbook.sh: creating $venv" >&2
        python3 -m venv "$venv" || die "'python3 -m venv $venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
    echo "docs/setup_mdbook.sh: installing $req" >&2
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-input --timeout 60 -q \
        --require-hashes --only-binary=:all: -r "$req" >&2 \
        || die "pip install -r $req failed (see pip output above; without a wheel for this platform: cargo install --locked mdbook --version 0.5.4)"
    got="$("$bin" --version 2>/dev/null || true)"
    [ "$got" = "$version" ] || die "installed, but $bin --version says '$got', not '$version'"
    echo "$want" >"$stamp"
    echo "docs/setup_mdbook.sh: installed $bin" >&2
fi

echo "$bin"
