#!/usr/bin/env bash
# Create (or reuse) the interop virtualenv at <repo>/.venv-interop with tests/interop/requirements.txt.
# Idempotent: a stamp file holds the sha256 of requirements.txt; when it matches, nothing is installed.
# Progress goes to stderr; the LAST line on stdout is the venv's python path, e.g.
#   PY="$(bash tests/interop/setup_venv.sh | tail -n1)"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.venv-interop"
req="$here/requirements.txt"
stamp="$venv/.requirements.sha256"
py="$venv/bin/python"

die() {
    echo "setup_venv.sh: ERROR: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || die "python3 not found on PATH (need Python >= 3.10 with the venv module)"
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
    || die "python3 is $(python3 -V 2>&1); mcp==2.3.0 needs Python >= 3.10"
[ -f "$req" ] || die "missing $req"

want="$(python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$req")"

if [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$py" -c 'import mcp, httpx2' 2>/dev/null; then
    echo "setup_venv.sh: reusing $venv (requirements unchanged)" >&2
else
    rm -f "$stamp"
    if [ ! -x "$py" ]; then
        echo "setup_venv.sh: creating $venv" >&2
        python3 -m venv "$venv" || die "'python3 -m venv $venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
    echo "setup_venv.sh: installing $req" >&2
    "$py" -m pip install --disable-pip-version-check --no-input --timeout 60 -q -r "$req" >&2 \
        || die "pip install -r $req failed (see pip output above)"
    "$py" -c 'import mcp, mcp_types, httpx2, anyio, pydantic, uvicorn' \
        || die "packages installed but 'import mcp, httpx2, ...' fails in $venv"
    echo "$want" >"$stamp"
    echo "setup_venv.sh: installed into $venv" >&2
fi

echo "$py"
