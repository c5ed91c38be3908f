#!/bin/sh
# The bench harness is bench/run.py (Python 3.11, standard library); this keeps the old command
# lines working: BENCH_SMOKE=1 BENCH_ROUTER_BIN=target/debug/mrtr-router bench/run.sh
exec python3 "$(dirname "$0")/run.py" "$@"
