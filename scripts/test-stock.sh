#!/usr/bin/env bash
# Builds the router against stock hyper and h2 from crates.io, without vendor/'s patches, and
# runs the tests that exercise what the patches touch (vendor/README.md, "Dropping the
# patches"). Proves that dropping the patches is the edit it says and nothing more.
#
#   scripts/test-stock.sh                the build and the tests below
#   scripts/test-stock.sh --update-lock  remake vendor/stock/Cargo.lock from Cargo.lock (after a
#                                        dependency changed, or vendor/ moved to a new release)
#
# The checked-in Cargo.toml is not touched: target/stock-src/ is the repository seen through
# symlinks, with a Cargo.toml made from the real one less `[patch.crates-io]` and with
# `patched-http` out of the default features (the edit "Dropping the patches" describes), and
# vendor/stock/Cargo.lock (hyper and h2 at the vendored versions, from crates.io), so `--locked`
# holds. It builds into the patched build's target directory (debug): every dependency that
# does not depend on hyper is shared, and only hyper, h2, what depends on them and the router
# are compiled again.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STOCK="$ROOT/target/stock-src"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
# rustc's incremental cache stays on, as in scripts/test.sh: a run after a one-line change in
# src/ recompiles the router's crates incrementally.

die() {
  echo >&2 "==> FAILED: $*"
  exit 1
}

# The tests run against stock hyper, each binary whole but for the tests named in SKIP.
# - hostile, streaming, connections, upstream_h2, pool, hyper_queue, tls, shutdown: HTTP/1 and
#   HTTP/2 framing, streams, held and parked connections, the client pool and its queue, TLS,
#   the shutdown: what the router asks of hyper and h2.
# - hyper_heads, h2_fields, h2_requests: the patches' behaviour tests, which say the patches
#   change nothing a peer sees: they must pass on stock too.
# - held_memory: its figures are the patched build's; on stock it asserts stock's own bound
#   (`cfg(feature = "patched-http")` inside) and skips what only the patches do (below).
TESTS=(hostile streaming connections upstream_h2 pool hyper_queue tls shutdown hyper_heads h2_fields h2_requests held_memory)
# Tests of what only the patched hyper does, not run here (each passes on the patched build, and
# each but the race below fails on stock):
SKIP=(
  # parking (vendor/patches/hyper/0005, `is_idle`): stock parks nothing
  a_waiting_connection_is_parked_and_what_its_client_sends_next_is_served
  a_parked_connection_is_let_go_when_its_client_leaves_or_after_the_header_read_timeout
  part_of_a_head_sent_to_a_parked_connection_gets_the_408
  a_parked_connection_holds_little_more_than_its_socket
  a_tls_keep_alive_connection_that_waited_is_served_again
  at_shutdown_a_parked_connection_is_closed_at_once_and_a_request_sent_on_one_is_served
  # the request already in an idle connection's socket at the shutdown (`is_idle` too): stock
  # passes it only when the router read the request before the shutdown came, a race
  at_shutdown_a_request_just_sent_on_an_idle_connection_is_served
  # buffers and header map given back by a quiet connection (0001, 0003)
  idle_keep_alive_connections_give_their_buffers_back_and_serve_again
  idle_connections_give_back_the_header_map_of_their_last_answer
  held_streams_give_their_buffers_back_and_go_on
)

stock_manifest() {
  rm -rf "$STOCK"
  mkdir -p "$STOCK"
  local entry name
  for entry in "$ROOT"/* "$ROOT"/.[!.]*; do
    name="$(basename "$entry")"
    case "$name" in
      Cargo.toml | Cargo.lock | target | .git | vendor | fuzz) ;;
      *) ln -s "$entry" "$STOCK/$name" ;;
    esac
  done
  awk '
    /^\[patch\.crates-io\]/ { skip = 1; patch++; next }
    /^\[/ { skip = 0 }
    skip { next }
    /^default = \["patched-http"\]$/ { print "default = []"; fixed++; next }
    { print }
    END { if (patch != 1 || fixed != 1) exit 1 }
  ' "$ROOT/Cargo.toml" >"$STOCK/Cargo.toml" ||
    die "Cargo.toml: expected one [patch.crates-io] section and one 'default = [\"patched-http\"]' line"
  printf '\n# Its own workspace: not a member of the repository'"'"'s.\n[workspace]\n' >>"$STOCK/Cargo.toml"
}

vendored_version() {
  awk '/^\[package\]/{p=1; next} /^\[/{p=0} p && /^version = /{gsub(/"/, "", $3); print $3; exit}' \
    "$ROOT/vendor/$1/Cargo.toml"
}

stock_manifest

if [[ ${1:-} == --update-lock ]]; then
  cp "$ROOT/Cargo.lock" "$STOCK/Cargo.lock"
  # hyper and h2 move from the path to crates.io (resolved again, all else kept as locked), then
  # pinned to the vendored releases.
  cargo metadata --quiet --format-version 1 --manifest-path "$STOCK/Cargo.toml" >/dev/null
  cargo update --quiet --manifest-path "$STOCK/Cargo.toml" -p hyper --precise "$(vendored_version hyper)"
  cargo update --quiet --manifest-path "$STOCK/Cargo.toml" -p h2 --precise "$(vendored_version h2)"
  mkdir -p "$ROOT/vendor/stock"
  cp "$STOCK/Cargo.lock" "$ROOT/vendor/stock/Cargo.lock"
  echo "vendor/stock/Cargo.lock remade; against Cargo.lock:"
  diff "$ROOT/Cargo.lock" "$ROOT/vendor/stock/Cargo.lock" || true
  exit 0
fi
[[ $# -eq 0 ]] || die "usage: scripts/test-stock.sh [--update-lock]"

cp "$ROOT/vendor/stock/Cargo.lock" "$STOCK/Cargo.lock"
for crate in hyper h2; do
  version="$(vendored_version "$crate")"
  grep -A2 "^name = \"$crate\"$" "$STOCK/Cargo.lock" | grep -q "^version = \"$version\"$" ||
    die "vendor/stock/Cargo.lock has no $crate $version (vendor/$crate's): scripts/test-stock.sh --update-lock"
done

test_args=()
for t in "${TESTS[@]}"; do test_args+=("$t::"); done
skip_args=()
for s in "${SKIP[@]}"; do skip_args+=(--skip "$s"); done
echo "stock hyper $(vendored_version hyper), h2 $(vendored_version h2) from crates.io; tests: ${TESTS[*]}"
echo "not run (what only the patches do): ${SKIP[*]}"
# The stock build puts its router binary where the patched build's is (target/debug/mrtr-router,
# which the tests run): the patched one is put back afterwards, pass or fail.
BIN="$CARGO_TARGET_DIR/debug/mrtr-router"
if [[ -f $BIN ]]; then
  ln -f "$BIN" "$STOCK/mrtr-router.patched"
  trap 'ln -f "$STOCK/mrtr-router.patched" "$BIN"' EXIT
fi
LOG="$STOCK/test.log"
# The modules of tests/it/ that exercise hyper and h2, by their names (libtest's filters).
if ! cargo test --locked --manifest-path "$STOCK/Cargo.toml" --test it -- "${test_args[@]}" "${skip_args[@]}" 2>&1 | tee "$LOG"; then
  echo >&2 "(if --locked failed: Cargo.lock changed; scripts/test-stock.sh --update-lock, then commit vendor/stock/Cargo.lock)"
  die "the router against stock hyper and h2"
fi
# The patched build's clippy does not see the stock side of the `patched-http` cfgs.
if grep -q '^warning: `mrtr-router`' "$LOG"; then
  die "the stock build has warnings (above): code left unused with patched-http off?"
fi
