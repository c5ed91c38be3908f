#!/usr/bin/env bash
# Create (or reuse) the interop virtualenv at <repo>/.venv-interop with tests/interop/requirements.txt
# (scripts/pinned_venv.sh: reinstalled when the file changes).
# Progress goes to stderr; the LAST line on stdout is the venv's python path, e.g.
#   PY="$(bash tests/interop/setup_venv.sh | tail -n1)"
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/.venv-interop"
# shellcheck source=../../scripts/pinned_venv.sh
source "$root/scripts/pinned_venv.sh"

python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' || {
    echo "tests/interop/setup_venv.sh: ERROR: python3 is $(python3 -V 2>&1); mcp==2.3.0 needs Python >= 3.10" >&2
    exit 1
}
sdk_imports() { "$venv/bin/python" -c 'import mcp, mcp_types, httpx2, anyio, pydantic, uvicorn'; }
pinned_venv tests/interop/setup_venv.sh "$venv" "$here/requirements.txt" sdk_imports
echo "$venv/bin/python"
