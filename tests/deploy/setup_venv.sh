#!/usr/bin/env bash
# Create (or reuse) the deploy-check virtualenv at <repo>/.venv-deploy with
# tests/deploy/requirements.txt (kubernetes-validate and its dependencies, from PyPI).
# Idempotent: a stamp file holds the sha256 of requirements.txt; when it matches, nothing is installed.
# Progress goes to stderr; the LAST line on stdout is the venv's python path, e.g.
#   PY="$(bash tests/deploy/setup_venv.sh | tail -n1)"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.venv-deploy"
req="$here/requirements.txt"
stamp="$venv/.requirements.sha256"
py="$venv/bin/python"

die() {
    echo "tests/deploy/setup_venv.sh: ERROR: $*" >&2
    exit 1
}

command -v python3 >/dev/null 2>&1 || die "python3 not found on PATH (need Python >= 3.9 with the venv module)"
[ -f "$req" ] || die "missing $req"

want="$(python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$req")"

if [ -x "$py" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$py" -c 'import kubernetes_validate, jsonschema, yaml, cloudcoil.models.cert_manager.v1, cloudcoil.models.prometheus_operator.v1' 2>/dev/null; then
    echo "tests/deploy/setup_venv.sh: reusing $venv (requirements unchanged)" >&2
else
    rm -f "$stamp"
    if [ ! -x "$py" ]; then
        echo "tests/deploy/setup_venv.sh: creating $venv" >&2
        python3 -m venv "$venv" || die "'python3 -m venv $venv' failed (on Debian/Ubuntu: apt-get install python3-venv)"
    fi
    echo "tests/deploy/setup_venv.sh: installing $req" >&2
    "$py" -m pip install --disable-pip-version-check --no-input --timeout 60 -q -r "$req" >&2 \
        || die "pip install -r $req failed (see pip output above)"
    "$py" -c 'import kubernetes_validate, jsonschema, yaml, cloudcoil.models.cert_manager.v1, cloudcoil.models.prometheus_operator.v1' \
        || die "packages installed but 'import kubernetes_validate, jsonschema, yaml, cloudcoil.models.cert_manager.v1, cloudcoil.models.prometheus_operator.v1' fails in $venv"
    echo "$want" >"$stamp"
    echo "tests/deploy/setup_venv.sh: installed into $venv" >&2
fi

echo "$py"
