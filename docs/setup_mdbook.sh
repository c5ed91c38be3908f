#!/usr/bin/env bash
# Create (or reuse) <repo>/.tools/mdbook-venv with docs/requirements.txt: mdBook, pinned by
# version and hash (scripts/pinned_venv.sh: reinstalled when the file changes).
# Progress goes to stderr; the LAST line on stdout is the mdbook binary's path, e.g.
#   MDBOOK="$(bash docs/setup_mdbook.sh | tail -n1)"
# On a platform without a wheel: cargo install --locked mdbook --version 0.5.4 (a minute or two).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="$root/.tools/mdbook-venv"
# shellcheck source=../scripts/pinned_venv.sh
source "$root/scripts/pinned_venv.sh"

pinned_version() { [ "$("$venv/bin/mdbook" --version)" = "mdbook v0.5.4" ]; }
pinned_venv docs/setup_mdbook.sh "$venv" "$here/requirements.txt" pinned_version --require-hashes --only-binary=:all:
echo "$venv/bin/mdbook"
