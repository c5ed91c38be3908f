#!/usr/bin/env bash
# Runs the tests that start the router as a program against another build of it, such as the
# profile-guided one (scripts/build-optimized.sh): every module of tests/it/ that runs the binary
# through the harness's bin() or spawn_router(), or MRTR_TEST_ROUTER_BIN, found by those names,
# so a new one is included by itself. The other tests run the library in-process and test the
# same code either way.
#
#   scripts/test-binary.sh target/optimized/mrtr-router
#
# tests/external/deploy.rs is left out: it checks the deploy files with kubectl, promtool and a
# venv that scripts/test.sh sets up, and runs the binary only for `check`. Exits non-zero when a
# test fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN=${1:?usage: scripts/test-binary.sh PATH-TO-mrtr-router}
[ -x "$BIN" ] || { echo >&2 "test-binary: $BIN is not an executable"; exit 2; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")

# The tests are this checkout's: a binary built from another commit (the checkout moved on
# while it was built) would be judged by tests that are not its own.
built=$("$BIN" --version | sed -n 's/.*(\([0-9a-f]*\)).*/\1/p')
head=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
if [ "$built" != "$head" ]; then
  echo >&2 "test-binary: $BIN was built from ${built:-an unknown commit}, the checkout is at $head: rebuild it (or check out $built)"
  exit 2
fi

args=()
for f in $(grep -lE 'MRTR_TEST_ROUTER_BIN|[^_a-z]bin\(\)|spawn_router\(' tests/it/*.rs | sort); do
  args+=("$(basename "$f" .rs)::")
done
[ ${#args[@]} -gt 0 ] || { echo >&2 "test-binary: no test starts the binary?"; exit 2; }
echo "test-binary: ${args[*]} against $BIN ($("$BIN" --version))"
MRTR_TEST_ROUTER_BIN=$BIN cargo test --test it -- "${args[@]}"
