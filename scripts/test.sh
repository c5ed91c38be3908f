#!/usr/bin/env bash
# Runs every check and test of mrtr-router on a fresh machine: formatting, clippy, the book
# (built with a pinned mdbook, its links checked), the tools of the external tests (the Python
# MCP SDK venv, the test authorization server, promtool, kubectl, redis-server, headless
# Chromium with playwright-core), then all tests
# (unit tests, tests/it/, tests/external/), then a smoke run of the whole-proxy bench
# (bench/run.sh) with the debug router. Every cargo command builds with the same features
# (`external-tests` on), so the library is compiled once.
# Fails loudly on anything missing; nothing is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# rustc's incremental cache stays on (cargo's default for this profile): it costs a fresh clone
# about a gigabyte under target/ and little time, and makes the run after a one-line change in
# src/ compile in a third of the time (docs/src/design/testing.md, "What the test build costs").

# Each step says how long the run has taken so far: where the time goes, run after run.
step() { printf '\n==> [%ds] %s\n' "$SECONDS" "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

# The external tests' venvs and node packages are downloads, not compiling: fetched in the
# background while clippy keeps both cores busy. Their steps below run the same scripts again,
# which then find everything in place (or, when a download failed here, try again and fail
# loudly there).
mkdir -p target
AHEAD_LOG=target/setup-ahead.log
(bash tests/interop/setup_venv.sh && bash tests/idp/setup.sh && bash tests/browser/setup.sh &&
  bash tests/deploy/setup_venv.sh) >"$AHEAD_LOG" 2>&1 &
AHEAD=$!

FEATURES=(--features external-tests)
step "cargo clippy --all-targets ${FEATURES[*]} -- -D warnings (the external tests' venvs and node packages downloading beside it, log in $AHEAD_LOG)"
cargo clippy --all-targets "${FEATURES[@]}" -- -D warnings

# ---- docs: the book (docs/), its links and words (scripts/check_docs.py) ----------------------
step "docs: mdbook 0.5.4 (docs/setup_mdbook.sh: a pinned wheel under .tools/), scripts/check_docs.py's unit tests, mdbook build docs, the link check"
if ! MDBOOK="$(bash docs/setup_mdbook.sh | tail -n1)" || [ ! -x "$MDBOOK" ]; then
  echo >&2 "==> FAILED: bash docs/setup_mdbook.sh (see its output above)"
  exit 1
fi
if ! python3 -m unittest discover -s scripts/tests; then
  echo >&2 "==> FAILED: the unit tests of scripts/check_docs.py (scripts/tests)"
  exit 1
fi
if ! "$MDBOOK" build docs; then
  echo >&2 "==> FAILED: mdbook build docs"
  exit 1
fi
# The whole repository: the book's links and anchors, and no word pointing outside it.
if ! python3 scripts/check_docs.py --built docs/book; then
  echo >&2 "==> FAILED: scripts/check_docs.py (a broken link or anchor, a chapter SUMMARY.md does not list, or a reference outside the repository; listed above)"
  exit 1
fi
# ---- end of the docs block ---------------------------------------------------------------------

ahead_status=0
wait "$AHEAD" || ahead_status=$?
[ "$ahead_status" -eq 0 ] || echo "the downloads beside clippy failed (exit $ahead_status; $AHEAD_LOG); each is tried again below"

step "Python venv with the official MCP SDK (tests/interop/requirements.txt)"
MRTR_INTEROP_PYTHON="$(bash tests/interop/setup_venv.sh | tail -n1)"
export MRTR_INTEROP_PYTHON

# ---- the test authorization server (tests/external/idp.rs, tests/external/tools/idp.rs) ---------
step "Test authorization server: oidc-provider under node (tests/idp/package-lock.json, npm ci into tests/idp/node_modules)"
if ! MRTR_IDP_DIR="$(bash tests/idp/setup.sh | tail -n1)" || [ ! -d "$MRTR_IDP_DIR/node_modules/oidc-provider" ]; then
  echo >&2 "==> FAILED: bash tests/idp/setup.sh (see its output above)"
  exit 1
fi
export MRTR_IDP_DIR
# ---- end of the test authorization server block -----------------------------------------------

# ---- the browser for the status page's tests (tests/external/status_page.rs, tests/external/tools/browser.rs) ----
step "Headless Chromium (Debian's chromium package) and playwright-core (tests/browser/package-lock.json, npm ci into tests/browser/node_modules)"
if [ ! -x /usr/bin/chromium ]; then
  echo "chromium missing: apt-get install chromium"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; then
    echo >&2 "==> FAILED: apt-get install chromium (tests/external/status_page.rs needs /usr/bin/chromium)"
    exit 1
  fi
fi
if ! MRTR_BROWSER_DIR="$(bash tests/browser/setup.sh | tail -n1)" || [ ! -d "$MRTR_BROWSER_DIR/node_modules/playwright-core" ]; then
  echo >&2 "==> FAILED: bash tests/browser/setup.sh (see its output above)"
  exit 1
fi
export MRTR_BROWSER_DIR
# ---- end of the browser block --------------------------------------------------------------------

# ---- deploy/ checks (tests/external/deploy.rs): their tools and venv ---------------------------
step "Tools for the deploy checks (tests/external/deploy.rs): promtool, kubectl, systemd-analyze; Python venv with kubernetes-validate (tests/deploy/requirements.txt)"
if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool missing: apt-get install prometheus (Debian's package ships it)"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; then
    echo >&2 "==> FAILED: apt-get install prometheus (for promtool)"
    exit 1
  fi
fi
for t in promtool kubectl systemd-analyze; do
  if ! command -v "$t" >/dev/null 2>&1; then
    echo >&2 "==> FAILED: $t not found on PATH (tests/external/deploy.rs needs it)"
    exit 1
  fi
done
MRTR_DEPLOY_PYTHON="$(bash tests/deploy/setup_venv.sh | tail -n1)"
export MRTR_DEPLOY_PYTHON
# ---- end of the deploy/ checks block ----------------------------------------------------------

# ---- the shared quota store's Redis (tests/external/quotas_redis.rs, tests/external/tools/) ------
step "redis-server for the shared quota store's tests (Debian's package; each test starts its own on loopback)"
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server missing: apt-get install redis-server"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }; then
    echo >&2 "==> FAILED: apt-get install redis-server (tests/external/quotas_redis.rs needs it)"
    exit 1
  fi
fi
redis-server --version
# ---- end of the Redis block ---------------------------------------------------------------------

step "cargo test --all-targets ${FEATURES[*]} --no-run (every test binary built at once)"
cargo test --all-targets "${FEATURES[@]}" --no-run
# One binary after the other: side by side on two cores, the timing-bound tests of either (a
# sampled gauge, memory given back within a bound) ran late often enough to fail a run. The
# external tests are busy (Python and node processes: 160 s of CPU time in 85 s) and run four at
# once; tests/it/ mostly waits and runs eight at once (.cargo/config.toml).
step "cargo test (unit tests, tests/it/, the examples and benches as tests)"
cargo test "${FEATURES[@]}" --lib --bins --examples --benches --test it
step "cargo test --test external (four at once)"
RUST_TEST_THREADS=4 cargo test "${FEATURES[@]}" --test external

# ---- vendor/ (see vendor/README.md) and the bench (bench/README.md) ---------------------------
step "vendor/: hyper and h2 are exactly their crates.io releases plus vendor/patches/ (vendor/update.sh --check)"
# GNU patch applies the series (Debian's package, if the machine lacks it).
command -v patch >/dev/null 2>&1 ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends patch >/dev/null; } ||
  { echo >&2 "==> FAILED: apt-get install patch (vendor/update.sh applies the series with it)"; exit 1; }
vendor/update.sh --check

step "bench harness: its unit tests, and the binaries of its smoke run"
python3 -m unittest discover -s bench/tests
# cargo test built the router already; the hyper-floor rows need examples/hyper_floor*.rs as plain
# binaries (cargo test builds examples as test harnesses under another name), the [auth] rows
# examples/bench_token.rs.
cargo build "${FEATURES[@]}" --bins --example hyper_floor --example hyper_floor_h2c --example hyper_floor_scan --example bench_token
# The smoke run gets a copy of the router: the stock build beside it puts its own binary at
# target/debug/mrtr-router. The harness finds the floors and bench_token in examples/ beside it.
SMOKE_DIR=target/smoke
rm -rf "$SMOKE_DIR" && mkdir -p "$SMOKE_DIR"
cp target/debug/mrtr-router "$SMOKE_DIR/mrtr-router"
ln -s ../debug/examples "$SMOKE_DIR/examples"

step "side by side: a smoke run of every bench row with the debug router (bench/run.py --smoke, output in $SMOKE_DIR/smoke.log, printed below when done), and the router against stock hyper and h2 (scripts/test-stock.sh)"
echo "bench/run.py --smoke --router-bin $SMOKE_DIR/mrtr-router"
echo "(every row once, 0.3 s of load each, 200 streams instead of 10,000: about 30 s; fails only on errors, misroutes, non-SSE answers or a proxy that does not start; not a performance check)"
python3 bench/run.py --smoke --router-bin "$SMOKE_DIR/mrtr-router" >"$SMOKE_DIR/smoke.log" 2>&1 &
SMOKE=$!
# The stock build compiles into target/ (sharing what does not depend on hyper) and runs the
# tests that exercise what vendor/'s patches touch, without them.
stock_status=0
scripts/test-stock.sh || stock_status=$?
smoke_status=0
wait "$SMOKE" || smoke_status=$?
echo "==> [${SECONDS}s] bench smoke run ended; its output:"
cat "$SMOKE_DIR/smoke.log"
if [ "$stock_status" -ne 0 ]; then
  echo >&2 "==> FAILED: scripts/test-stock.sh (the router against stock hyper and h2; output above)"
  exit 1
fi
if [ "$smoke_status" -ne 0 ]; then
  echo >&2 "==> FAILED: bench smoke run (bench/run.py exited $smoke_status; see the status column and the bench: lines above)"
  exit 1
fi
echo "==> [${SECONDS}s] passed: the stock build's tests and the bench smoke run (results in bench/results/smoke.json)"
