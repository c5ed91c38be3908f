#!/usr/bin/env bash
# Builds mrtr-router with profile-guided optimisation (LLVM PGO) and then post-link layout
# (BOLT), trained on examples/train (an MCP traffic mix, not the bench's loads), and leaves the
# binary at target/optimized/mrtr-router, whose path is the last line printed.
# docs/src/benchmarks.md ("Profile-guided and post-link optimised build") has what it gains.
#
#   scripts/build-optimized.sh                      # 20 s per training phase
#   scripts/build-optimized.sh --seconds 40         # longer training
#   scripts/build-optimized.sh --no-http2 --out target/optimized-no-h2   # training without HTTP/2
#
# Steps (each in its own target directory under the output, so `cargo build --release`'s
# target/release is left alone and stays the development build):
#   1. the training driver (examples/train, debug build: it is not what is measured);
#   2. the router built with -Cprofile-generate, trained; llvm-profdata merges the profiles;
#   3. the router built with -Cprofile-use and linked with --emit-relocs (BOLT needs them);
#   4. llvm-bolt -instrument on it, trained again; merge-fdata merges those profiles;
#   5. llvm-bolt with the profile: blocks and functions laid out hot first, cold parts split off;
#   6. a smoke check: the training mix (every answer checked) against the final binary.
#
# It calls rustc, llvm-profdata and llvm-bolt itself rather than through cargo-pgo: the same
# steps, with Debian's versioned LLVM 22 tools (llvm-profdata-22, llvm-bolt-22, merge-fdata-22:
# rustc 1.95 is LLVM 22, and the profile format must match), nothing more to build, and every
# flag in view. Needs: the Rust toolchain, and apt-get (as root) when those tools are missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

SECONDS_PER_PHASE=20
TRAIN_ARGS=()
TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
OUT=$TARGET_DIR/optimized
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) SECONDS_PER_PHASE=$2; shift 2 ;;
    --no-http2) TRAIN_ARGS+=(--no-http2); shift ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    *) echo >&2 "usage: $0 [--seconds N] [--no-http2] [--out DIR]"; exit 2 ;;
  esac
done

step() { printf '\n==> %s\n' "$*" >&2; }
die() { echo >&2 "build-optimized: $*"; exit 1; }
size_of() { du -ch "$@" | tail -n1 | cut -f1; }

# ---- tools ------------------------------------------------------------------------------------
LLVM_BIN=/usr/lib/llvm-22/bin
if [ ! -x $LLVM_BIN/llvm-profdata ] || [ ! -x $LLVM_BIN/llvm-bolt ] || [ ! -x $LLVM_BIN/merge-fdata ]; then
  step "installing llvm-22 and bolt-22 (Debian packages)"
  [ "$(id -u)" = 0 ] || die "llvm-22 and bolt-22 are missing: apt-get install llvm-22 bolt-22 (as root)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends llvm-22 bolt-22 >/dev/null
fi
RUSTC_LLVM=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
[ "$RUSTC_LLVM" = 22 ] || die "rustc is built on LLVM $RUSTC_LLVM, these tools are LLVM 22: the profile formats would not match"
HOST=$(rustc -vV | sed -n 's/^host: //p')

rm -rf "$OUT/profiles"
mkdir -p "$OUT/profiles/pgo" "$OUT/profiles/bolt"

# ---- 1. the training driver -------------------------------------------------------------------
step "1/6 the training driver: cargo build --example train"
CARGO_TARGET_DIR=$TARGET_DIR cargo build --locked --quiet --example train
TRAIN=$TARGET_DIR/debug/examples/train
train() { "$TRAIN" --router "$1" --seconds "$SECONDS_PER_PHASE" "${TRAIN_ARGS[@]}"; }

# --target: RUSTFLAGS then reach only the router's own code and its dependencies, not build
# scripts and proc macros (which run on the build machine and would write profiles of their own).
build_router() { # target dir, RUSTFLAGS
  CARGO_TARGET_DIR=$1 RUSTFLAGS=$2 cargo build --release --locked --quiet --bin mrtr-router --target "$HOST"
  echo "$1/$HOST/release/mrtr-router"
}

# ---- 2. PGO: instrument, train, merge -----------------------------------------------------------
step "2/6 instrumented build (-Cprofile-generate), then training"
GEN=$(build_router "$OUT/build-instrumented" "-Cprofile-generate=$OUT/profiles/pgo")
LLVM_PROFILE_FILE="$OUT/profiles/pgo/mrtr-%p-%m.profraw" train "$GEN"
ls "$OUT"/profiles/pgo/*.profraw >/dev/null 2>&1 || die "training wrote no .profraw"
$LLVM_BIN/llvm-profdata merge -o "$OUT/profiles/merged.profdata" "$OUT"/profiles/pgo/*.profraw
echo "PGO profile: $(ls "$OUT"/profiles/pgo/*.profraw | wc -l) raw files, $(size_of "$OUT"/profiles/pgo/*.profraw); merged $(size_of "$OUT/profiles/merged.profdata")"

# ---- 3. PGO build, with relocations for BOLT ------------------------------------------------------
step "3/6 build with the profile (-Cprofile-use), linked with --emit-relocs"
PGO=$(build_router "$OUT/build-pgo" "-Cprofile-use=$OUT/profiles/merged.profdata -Clink-arg=-Wl,--emit-relocs")
cp "$PGO" "$OUT/mrtr-router-pgo"

# ---- 4. BOLT: instrument, train, merge ----------------------------------------------------------
step "4/6 llvm-bolt -instrument, then training"
$LLVM_BIN/llvm-bolt "$OUT/mrtr-router-pgo" -o "$OUT/mrtr-router-bolt-instrumented" -instrument \
  -instrumentation-file="$OUT/profiles/bolt/mrtr.fdata" -instrumentation-file-append-pid \
  >"$OUT/bolt-instrument.log" 2>&1 || { cat "$OUT/bolt-instrument.log" >&2; die "llvm-bolt -instrument failed"; }
train "$OUT/mrtr-router-bolt-instrumented"
ls "$OUT"/profiles/bolt/mrtr.fdata.* >/dev/null 2>&1 || die "training wrote no BOLT profile"
$LLVM_BIN/merge-fdata "$OUT"/profiles/bolt/mrtr.fdata.* >"$OUT/profiles/merged.fdata"
echo "BOLT profile: $(ls "$OUT"/profiles/bolt/mrtr.fdata.* | wc -l) files, $(size_of "$OUT"/profiles/bolt/mrtr.fdata.*); merged $(size_of "$OUT/profiles/merged.fdata")"

# ---- 5. BOLT: optimise ----------------------------------------------------------------------------
step "5/6 llvm-bolt with the profile"
$LLVM_BIN/llvm-bolt "$OUT/mrtr-router-pgo" -o "$OUT/mrtr-router.new" -data="$OUT/profiles/merged.fdata" \
  -reorder-blocks=ext-tsp -reorder-functions=cdsort -split-functions -split-all-cold -split-eh \
  -icf=1 -use-gnu-stack -hot-text -dyno-stats \
  >"$OUT/bolt-optimize.log" 2>&1 || { cat "$OUT/bolt-optimize.log" >&2; die "llvm-bolt failed"; }
grep -E "BOLT-INFO: (basic block reordering|splitting separates|[0-9]+ out of [0-9]+ functions in the binary .* have non-empty execution profile)" "$OUT/bolt-optimize.log" >&2 || true
grep -A8 '^BOLT-INFO: program-wide dynostats' "$OUT/bolt-optimize.log" >&2 || true
mv "$OUT/mrtr-router.new" "$OUT/mrtr-router"

# Sizes from llvm-readelf and llvm-nm, in shell arithmetic (no gawk in slim images).
text_kib() { # the .text section of a binary, KiB
  local size
  size=$($LLVM_BIN/llvm-readelf -S -W "$1" | sed -n 's/.* \.text  *PROGBITS  *[0-9a-f]*  *[0-9a-f]*  *\([0-9a-f]*\) .*/\1/p')
  echo $((16#$size / 1024))
}
symbol() { $LLVM_BIN/llvm-nm "$1" | sed -n "s/^\([0-9a-f]*\) . $2\$/\1/p"; }
hot_start=$(symbol "$OUT/mrtr-router" __hot_start)
hot_end=$(symbol "$OUT/mrtr-router" __hot_end)
hot=$(( (16#${hot_end:-0} - 16#${hot_start:-0}) / 1024 ))
echo "text: PGO build $(text_kib "$OUT/mrtr-router-pgo") KiB; after BOLT $(text_kib "$OUT/mrtr-router") KiB, of which hot (__hot_start..__hot_end) $hot KiB"

# ---- 6. smoke check -------------------------------------------------------------------------------
step "6/6 smoke check: the training mix against the final binary, every answer checked"
"$TRAIN" --router "$OUT/mrtr-router" --seconds 3 "${TRAIN_ARGS[@]}" >&2
"$OUT/mrtr-router" --version >&2
echo "$OUT/mrtr-router"
