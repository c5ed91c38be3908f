#!/usr/bin/env bash
# Runs every check and test of mrtr-router on a fresh machine: formatting, clippy, the Python
# MCP SDK venv for the interop tests (created once under .venv-interop/, reused), then all tests.
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

step "cargo test"
cargo test --all-targets
