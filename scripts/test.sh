#!/usr/bin/env bash
# Runs every check and test of mrtr-router on a fresh machine: formatting, clippy, the Python
# MCP SDK venv for the interop tests (created once under .venv-interop/, reused), then all tests,
# then a smoke run of the whole-proxy bench (bench/run.sh) with the debug router.
# Fails loudly on anything missing; nothing is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "Python venv with the official MCP SDK (tests/interop/requirements.txt)"
MRTR_INTEROP_PYTHON="$(bash tests/interop/setup_venv.sh | tail -n1)"
export MRTR_INTEROP_PYTHON

# ---- the test authorization server (tests/idp.rs, tests/support/idp.rs) ------------------------
step "Test authorization server: oidc-provider under node (tests/idp/package-lock.json, npm ci into tests/idp/node_modules)"
if ! MRTR_IDP_DIR="$(bash tests/idp/setup.sh | tail -n1)" || [ ! -d "$MRTR_IDP_DIR/node_modules/oidc-provider" ]; then
  echo >&2 "==> FAILED: bash tests/idp/setup.sh (see its output above)"
  exit 1
fi
export MRTR_IDP_DIR
# ---- end of the test authorization server block -----------------------------------------------

# ---- deploy/ checks (tests/deploy.rs): their tools and venv -----------------------------------
step "Tools for the deploy checks (tests/deploy.rs): promtool, kubectl, systemd-analyze; Python venv with kubernetes-validate (tests/deploy/requirements.txt)"
if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool missing: apt-get install prometheus (Debian's package ships it)"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; then
    echo >&2 "==> FAILED: apt-get install prometheus (for promtool)"
    exit 1
  fi
fi
for t in promtool kubectl systemd-analyze; do
  if ! command -v "$t" >/dev/null 2>&1; then
    echo >&2 "==> FAILED: $t not found on PATH (tests/deploy.rs needs it)"
    exit 1
  fi
done
MRTR_DEPLOY_PYTHON="$(bash tests/deploy/setup_venv.sh | tail -n1)"
export MRTR_DEPLOY_PYTHON
# ---- end of the deploy/ checks block ----------------------------------------------------------

step "cargo test"
cargo test --all-targets

# --- bench (owned by bench/, see bench/README.md) ---------------------------------------------
step "bench harness: its unit tests, then a smoke run of every row with the debug router (bench/run.py --smoke): proves each row starts, routes and has no errors; not a performance check"
python3 -m unittest discover -s bench/tests
# cargo test built the router already; the hyper-floor rows need examples/hyper_floor*.rs as plain
# binaries (cargo test builds examples as test harnesses under another name).
cargo build --bins --example hyper_floor --example hyper_floor_h2c --example hyper_floor_scan
echo "bench/run.py --smoke --router-bin target/debug/mrtr-router"
echo "(every row once, 1 s each, 200 streams instead of 10,000: about 60 s; fails only on errors, misroutes, non-SSE answers or a proxy that does not start)"
if ! python3 bench/run.py --smoke --router-bin target/debug/mrtr-router; then
  echo >&2
  echo "==> FAILED: bench smoke run (bench/run.py exited non-zero; see the status column and the bench: lines above)" >&2
  exit 1
fi
echo "==> bench smoke run passed (results in bench/results/smoke.json)"
