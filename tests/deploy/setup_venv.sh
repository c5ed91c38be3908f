#!/usr/bin/env bash
# Create (or reuse) the deploy-check virtualenv at <repo>/.venv-deploy with
# tests/deploy/requirements.txt (kubernetes-validate and its dependencies, from PyPI;
# scripts/pinned_venv.sh: reinstalled when the file changes).
# Progress goes to stderr; the LAST line on stdout is the venv's python path, e.g.
#   PY="$(bash tests/deploy/setup_venv.sh | tail -n1)"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.venv-deploy"
# shellcheck source=../../scripts/pinned_venv.sh
source "$root/scripts/pinned_venv.sh"

validator_imports() {
    "$venv/bin/python" -c 'import kubernetes_validate, jsonschema, yaml, cloudcoil.models.cert_manager.v1, cloudcoil.models.prometheus_operator.v1'
}
pinned_venv tests/deploy/setup_venv.sh "$venv" "$here/requirements.txt" validator_imports
echo "$venv/bin/python"
