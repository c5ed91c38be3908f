#!/usr/bin/env bash
# Whole-proxy benchmark: mrtr-router side by side with HAProxy and nginx, in one run on loopback.
#
#   bench/run.sh                      # full run (~10 min: 16 rows x 3 rounds), table + bench/results/latest.json
#   BENCH_SMOKE=1 bench/run.sh        # 1 s per row, 1 round, no warm-up, 8 connections: proves it still runs
#   BENCH_SMOKE=1 BENCH_ROUTER_BIN=target/debug/mrtr-router bench/run.sh   # the same with a debug router
#
# Layout of a run (every address is 127.0.0.1):
#   - one backend nginx (1 worker, pinned to the load cores with wrk) listens on 19001-19003 and
#     answers POST /mcp with a fixed small JSON-RPC result, with {"pending":true} when the
#     request says `X-Bench-Phase: pending` (bench/mix.lua), or with a one-event
#     text/event-stream answer for `X-Bench-Phase: sse` (bench/sse.lua), and logs `$connection`;
#   - each proxy in turn, pinned to ONE core (`taskset -c 1`), in front of the three backends;
#   - wrk (1 thread, 64 connections, Lua script bench/mcp.lua or bench/mix.lua) on the load core.
# The rows run round after round (BENCH_ROUNDS, default 3), interleaved: round 1 runs every row
# once, round 2 every row again, ...; the table shows each row's median over the rounds.
# See bench/README.md for the rows, the columns, how each number is measured, and the env vars.
# Exit status: 0 only if every selected row ran in every round with no error, no non-2xx and no
# misrouted call.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$BENCH_DIR/.." && pwd)

# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------
SMOKE=${BENCH_SMOKE:-0}
if [[ $SMOKE == 1 ]]; then
  DURATION=1
  WARMUP=0
  CONNS=8
  ROUNDS=${BENCH_ROUNDS:-1}
  RESULTS=${BENCH_RESULTS:-$BENCH_DIR/results/smoke.json}
else
  DURATION=${BENCH_DURATION:-8}
  WARMUP=${BENCH_WARMUP:-3}
  CONNS=${BENCH_CONNECTIONS:-64}
  ROUNDS=${BENCH_ROUNDS:-3}
  RESULTS=${BENCH_RESULTS:-$BENCH_DIR/results/latest.json}
fi
# SSE probe next to the mix rows: connections, and pause in ms between requests on each.
SSE_PROBE=${BENCH_SSE_PROBE:-1}
SSE_CONNS=${BENCH_SSE_CONNECTIONS:-2}
SSE_PAUSE_MS=${BENCH_SSE_PAUSE_MS:-5}
PENDING_PCT=${BENCH_PENDING_PCT:-20}
# The -paced mix rows: pause in ms between an answer and the next request on each connection,
# so that every proxy gets the same offered load, below what saturates its core.
MIX_PAUSE_MS=${BENCH_MIX_PAUSE_MS:-8}
LOAD_CPUS=${BENCH_LOAD_CPUS:-0}
PROXY_CPUS=${BENCH_PROXY_CPUS:-1}
PROXY_CPUS_2W=${BENCH_PROXY_CPUS_2W:-$PROXY_CPUS}
# A router binary named explicitly is used as it is: no `cargo build --release`.
SKIP_BUILD=${BENCH_SKIP_BUILD:-0}
if [[ -n ${BENCH_ROUTER_BIN:-} ]]; then
  ROUTER_BIN=$BENCH_ROUTER_BIN
  SKIP_BUILD=1
  # A relative path is taken from the current directory, else from the repository root.
  if [[ $ROUTER_BIN != /* ]]; then
    if [[ -e $ROUTER_BIN ]]; then ROUTER_BIN=$PWD/$ROUTER_BIN; else ROUTER_BIN=$REPO_DIR/$ROUTER_BIN; fi
  fi
else
  ROUTER_BIN=$REPO_DIR/target/release/mrtr-router
fi
# The hyper-floor row's binary: the example built next to the router binary (cargo puts
# examples in <profile dir>/examples; `cargo test --all-targets` builds the debug one).
FLOOR_BIN=${BENCH_FLOOR_BIN:-$(dirname "$ROUTER_BIN")/examples/hyper_floor}
READY_TIMEOUT=${BENCH_READY_TIMEOUT:-20}
# nginx keeps idle upstream connections in ONE cache per worker shared by all servers of the
# upstream; with `keepalive 64` and 64 clients spread over 3 backends the cache fills with idle
# connections to the "wrong" backends and nginx opens (and closes) ~1000 connections/s. One slot
# per client connection per backend means it opens none during the run.
NGINX_KEEPALIVE=${BENCH_NGINX_KEEPALIVE:-$((CONNS * 3))}
BASELINE=haproxy-header

ALL_PEERS=(direct mrtr-header mrtr-body mrtr-mix mrtr-mix-paced mrtr-mix-paced-awake mrtr-header-2w
           haproxy-header haproxy-body haproxy-header-fwd haproxy-body-fwd
           haproxy-mix haproxy-mix-paced haproxy-mix-paced-awake nginx-header hyper-floor)
read -r -a PEERS <<<"${BENCH_PEERS:-${ALL_PEERS[*]}}"

declare -A DESC=(
  [direct]="wrk straight to one backend (ceiling of wrk + backend)"
  [mrtr-header]="mrtr-router, 1 worker thread, key in Mcp-Routing-Id header (+ messageId)"
  [mrtr-body]="mrtr-router, 1 worker thread, key only in body messageId"
  [mrtr-mix]="mrtr-router, 1 worker thread, ${PENDING_PCT}% two-round calls (pending, then confirm), body-keyed"
  [mrtr-mix-paced]="mrtr-router, the mrtr-mix load paced: ${MIX_PAUSE_MS} ms pause per connection between answer and request"
  [mrtr-mix-paced-awake]="mrtr-router, the paced mix with both cores held out of halt (a SCHED_IDLE busy loop on each)"
  [mrtr-header-2w]="mrtr-router, MRTR_WORKER_THREADS=2, header-keyed"
  [haproxy-header]="HAProxy: balance hdr(Mcp-Routing-Id), hash-type consistent"
  [haproxy-body]="HAProxy: http-buffer-request + json_query('\$.messageId'), balance hash var(txn.rk)"
  [haproxy-header-fwd]="HAProxy header-keyed config, adding the X-Forwarded-For/-Proto/-Host headers the router adds"
  [haproxy-body-fwd]="HAProxy body-keyed config, adding the X-Forwarded-For/-Proto/-Host headers the router adds"
  [haproxy-mix]="HAProxy body-keyed config, same two-round mix as mrtr-mix"
  [haproxy-mix-paced]="HAProxy body-keyed config, the paced mix of mrtr-mix-paced"
  [haproxy-mix-paced-awake]="HAProxy body-keyed config, the paced mix with both cores held out of halt"
  [nginx-header]="nginx: hash \$http_mcp_routing_id consistent, upstream keepalive $NGINX_KEEPALIVE"
  [hyper-floor]="examples/hyper_floor.rs, 1 thread: hyper and tokio forwarding by a hash of Mcp-Routing-Id, no router logic (the floor under any hyper proxy)"
)

BACKEND_PORTS=(19001 19002 19003)
ROUTER_PORT=18080
ROUTER_ADMIN_PORT=18090
HAPROXY_PORT=18081
NGINX_PORT=18082
FLOOR_PORT=18083
HOST=127.0.0.1

die() { echo "bench: error: $*" >&2; exit 2; }
log() { echo "bench: $*" >&2; }

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_uint "$DURATION" && ((DURATION > 0)) || die "BENCH_DURATION must be a positive integer (seconds)"
is_uint "$WARMUP" || die "BENCH_WARMUP must be an integer (seconds)"
is_uint "$CONNS" && ((CONNS > 0)) || die "BENCH_CONNECTIONS must be a positive integer"
is_uint "$ROUNDS" && ((ROUNDS > 0)) || die "BENCH_ROUNDS must be a positive integer"
[[ $SSE_PROBE == 0 || $SSE_PROBE == 1 ]] || die "BENCH_SSE_PROBE must be 0 or 1"
is_uint "$SSE_CONNS" && ((SSE_CONNS > 0)) || die "BENCH_SSE_CONNECTIONS must be a positive integer"
is_uint "$SSE_PAUSE_MS" || die "BENCH_SSE_PAUSE_MS must be an integer (ms)"
is_uint "$MIX_PAUSE_MS" && ((MIX_PAUSE_MS > 0)) || die "BENCH_MIX_PAUSE_MS must be a positive integer (ms)"
is_uint "$PENDING_PCT" && ((PENDING_PCT <= 100)) || die "BENCH_PENDING_PCT must be 0..100"
is_uint "$READY_TIMEOUT" && ((READY_TIMEOUT > 0)) || die "BENCH_READY_TIMEOUT must be a positive integer"
is_uint "$NGINX_KEEPALIVE" && ((NGINX_KEEPALIVE > 0)) || die "BENCH_NGINX_KEEPALIVE must be a positive integer"
for p in "${PEERS[@]}"; do
  [[ -n ${DESC[$p]+x} ]] || die "unknown peer '$p' in BENCH_PEERS (known: ${ALL_PEERS[*]})"
done
((${#PEERS[@]} > 0)) || die "BENCH_PEERS selects no peer"

# ---------------------------------------------------------------------------------------------
# Tools: install the Debian packages that are missing (we are root on Debian), else refuse.
# ---------------------------------------------------------------------------------------------
ensure_tools() {
  local -A pkg_of=([wrk]=wrk [haproxy]=haproxy [nginx]=nginx [curl]=curl [ss]=iproute2
                   [taskset]=util-linux [chrt]=util-linux [getconf]=libc-bin [timeout]=coreutils [pgrep]=procps)
  local missing=() cmd
  for cmd in "${!pkg_of[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || command -v "/usr/sbin/$cmd" >/dev/null 2>&1 \
      || missing+=("${pkg_of[$cmd]}")
  done
  ((${#missing[@]} == 0)) && return 0
  [[ ${BENCH_NO_INSTALL:-0} == 1 ]] && die "missing packages: ${missing[*]} (BENCH_NO_INSTALL=1)"
  [[ $(id -u) == 0 ]] || die "missing packages: ${missing[*]}; run as root or install them"
  command -v apt-get >/dev/null || die "missing packages: ${missing[*]} and no apt-get"
  log "installing ${missing[*]} ..."
  # Keep apt from starting the distribution's nginx/haproxy services (policy-rc.d exit 101).
  local policy=/usr/sbin/policy-rc.d added_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added_policy=1
  fi
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2 || rc=$?
  ((added_policy)) && rm -f "$policy"
  ((rc == 0)) || die "apt-get install ${missing[*]} failed"
}
ensure_tools
export PATH="$PATH:/usr/sbin:/sbin"
CLK_TCK=$(getconf CLK_TCK)

NPROC=$(nproc)
ALL_CPUS="0-$((NPROC - 1))"
check_cpus() {  # every cpu named in a taskset list must exist
  local list=$1 part a b
  [[ $list =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] || die "bad cpu list '$list'"
  IFS=, read -r -a parts <<<"$list"
  for part in "${parts[@]}"; do
    a=${part%-*} b=${part#*-}
    ((a < NPROC && b < NPROC)) || die "cpu list '$list' names a cpu this machine lacks (nproc=$NPROC)"
  done
}
if ((NPROC < 2)) && [[ -z ${BENCH_LOAD_CPUS:-} && -z ${BENCH_PROXY_CPUS:-} ]]; then
  log "warning: only $NPROC cpu; wrk, backends and proxy all share cpu 0 (numbers are not comparable)"
  LOAD_CPUS=0 PROXY_CPUS=0 PROXY_CPUS_2W=0
fi
check_cpus "$LOAD_CPUS"; check_cpus "$PROXY_CPUS"; check_cpus "$PROXY_CPUS_2W"

expand_cpus() {  # "0-2,5" -> "0 1 2 5"
  local out=() part a b i
  IFS=, read -r -a parts <<<"$1"
  for part in "${parts[@]}"; do
    a=${part%-*} b=${part#*-}
    for ((i = a; i <= b; i++)); do out+=("$i"); done
  done
  echo "${out[*]}"
}

# ---------------------------------------------------------------------------------------------
# Processes: every process started here is recorded and stopped on exit (trap).
# ---------------------------------------------------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/mrtr-bench.XXXXXX")
STARTED=()

alive() {  # running and not a zombie
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st:0:1} != Z ]]
}

stop_pid() {  # TERM, wait up to 5 s, then KILL the process and any children it left
  local pid=$1 kids i
  kids=$(pgrep -P "$pid" 2>/dev/null || true)
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  for k in $kids; do
    for ((i = 0; i < 20; i++)); do alive "$k" || break; sleep 0.1; done
    if alive "$k"; then kill -KILL "$k" 2>/dev/null || true; fi
  done
  wait "$pid" 2>/dev/null || true
  local keep=() p
  for p in ${STARTED[@]+"${STARTED[@]}"}; do [[ $p == "$pid" ]] || keep+=("$p"); done
  STARTED=(${keep[@]+"${keep[@]}"})
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  local p
  for p in ${STARTED[@]+"${STARTED[@]}"}; do stop_pid "$p"; done
  if [[ ${BENCH_KEEP_TMP:-0} == 1 ]]; then log "kept work dir $TMP"; else rm -rf "$TMP"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

port_busy() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

wait_port_free() {  # after stopping a peer, its port must be free again before the next one
  local i
  for ((i = 0; i < 50; i++)); do port_busy "$1" || return 0; sleep 0.1; done
  return 1
}

# ---------------------------------------------------------------------------------------------
# Measurement helpers
# ---------------------------------------------------------------------------------------------
proc_ticks() {  # utime+stime (all threads) of a process and its direct children, in clock ticks
  local total=0 p st f
  for p in "$1" $(pgrep -P "$1" 2>/dev/null || true); do
    st=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    st=${st##*) }
    read -r -a f <<<"$st"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}

proc_sleeps() {  # voluntary context switches (all threads) of a process and its direct children
  local total=0 p n
  for p in "$1" $(pgrep -P "$1" 2>/dev/null || true); do
    n=$(cat /proc/"$p"/task/*/status 2>/dev/null | awk '/^voluntary_ctxt_switches:/ { s += $2 } END { print s + 0 }')
    total=$((total + n))
  done
  echo "$total"
}

cpu_sample() {  # "total idle" jiffies summed over a cpu list, from /proc/stat
  local cpus
  cpus=$(expand_cpus "$1")
  awk -v list="$cpus" 'BEGIN { n = split(list, c, " "); for (i = 1; i <= n; i++) want["cpu" c[i]] = 1 }
    ($1 in want) { for (i = 2; i <= 9; i++) tot += $i; idle += $5 + $6 }
    END { printf "%d %d\n", tot, idle }' /proc/stat
}

busy_pct() {  # busy_pct "tot0 idle0" "tot1 idle1" [ticks not to count as busy]
  awk -v a="$1" -v b="$2" -v skip="${3:-0}" 'BEGIN { split(a, x, " "); split(b, y, " "); dt = y[1] - x[1];
    if (dt <= 0) { print "null"; exit } u = dt - (y[2] - x[2]) - skip; if (u < 0) u = 0; printf "%.1f\n", 100 * u / dt }'
}

# The -awake rows hold each benchmarked cpu out of halt with one busy loop per cpu under
# SCHED_IDLE, which runs only when nothing else on that cpu wants to (a woken proxy, backend or
# wrk preempts it at once). On this VM (Firecracker, no cpuidle driver) an idle vCPU halts, and
# its wake-up by the next packet goes through the host scheduler: milliseconds at times, for
# every peer alike (BENCHMARKS.md). The loops' own CPU time is left out of core%, of the load
# core's share and of other processes' share.
AWAKE_LOAD=() AWAKE_PROXY=()
spin_on() {  # spin_on <cpu>: an idle-class busy loop on that cpu; $! is its pid
  chrt --idle 0 taskset -c "$1" bash -c 'while :; do :; done' &
  STARTED+=("$!")
}
start_awake() {  # start_awake: one loop on each load cpu and each proxy cpu
  local cpu
  for cpu in $(expand_cpus "$LOAD_CPUS"); do spin_on "$cpu"; AWAKE_LOAD+=("$!"); done
  for cpu in $(expand_cpus "$PROXY_CPUS_ROW"); do spin_on "$cpu"; AWAKE_PROXY+=("$!"); done
}
stop_awake() {
  local p
  for p in ${AWAKE_LOAD[@]+"${AWAKE_LOAD[@]}"} ${AWAKE_PROXY[@]+"${AWAKE_PROXY[@]}"}; do stop_pid "$p"; done
  AWAKE_LOAD=() AWAKE_PROXY=()
}
pids_ticks() {  # pids_ticks <pid...>: their utime+stime summed, in clock ticks (none: 0)
  local total=0 p
  for p in "$@"; do total=$((total + $(proc_ticks "$p"))); done
  echo "$total"
}

metrics_delta() {  # metrics_delta <before> <after>: JSON of router counter deltas (Prometheus text)
  awk '
    function key(line) { return substr(line, 1, length(line) - length($NF) - 1) }
    /^#/ || NF < 2 { next }
    FNR == NR { before[key($0)] = $NF; next }
    { k = key($0); d = $NF - ((k in before) ? before[k] : 0) }
    k ~ /^mrtr_route_decisions_total\{/ { src = k; sub(/.*source="/, "", src); sub(/".*/, "", src); dec[src] += d; seen = 1 }
    k ~ /^mrtr_pins_created_total/ { pins += d; seen = 1 }
    k ~ /^mrtr_upstream_errors_total/ { uerr += d; seen = 1 }
    k ~ /^mrtr_router_errors_total/ { rerr += d; seen = 1 }
    END {
      if (!seen) { print "null"; exit }
      out = ""; for (s in dec) out = out (out == "" ? "" : ",") sprintf("\"%s\":%d", s, dec[s])
      printf "{\"route_decisions\":{%s},\"pins_created\":%d,\"upstream_errors\":%d,\"router_errors\":%d}\n", out, pins, uerr, rerr
    }' "$1" "$2"
}

BACKEND_DIR=$TMP/backend
BACKEND_LOG=$BACKEND_DIR/access.log
BACKEND_PID=

probe_conn() {  # ask the backend nginx for a fresh connection's serial number; tag marks the log
  curl -s --max-time 3 "http://$HOST:${BACKEND_PORTS[0]}/probe?tag=$1"
}

wait_log_tag() {  # the access log is buffered (flush=250ms): wait until a probe line is on disk
  local i
  for ((i = 0; i < 60; i++)); do
    grep -q "tag=$1\$" "$BACKEND_LOG" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# ---------------------------------------------------------------------------------------------
# Backends: one nginx, one worker, three ports.
# ---------------------------------------------------------------------------------------------
nginx_common() {  # $1 = prefix dir
  local user_line=""
  [[ $(id -u) == 0 ]] && user_line="user root;"
  cat <<EOF
$user_line
worker_processes 1;
daemon off;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 8192; }
EOF
}

nginx_http_common() {  # $1 = prefix dir
  cat <<EOF
  access_log off;
  server_tokens off;
  client_body_temp_path $1/tmp/body;
  proxy_temp_path $1/tmp/proxy;
  fastcgi_temp_path $1/tmp/fastcgi;
  uwsgi_temp_path $1/tmp/uwsgi;
  scgi_temp_path $1/tmp/scgi;
  keepalive_requests 100000000;
  keepalive_timeout 600s;
EOF
}

start_backends() {
  mkdir -p "$BACKEND_DIR/tmp"
  {
    nginx_common "$BACKEND_DIR"
    echo "http {"
    nginx_http_common "$BACKEND_DIR"
    cat <<EOF
  default_type application/json;
  log_format bench '\$connection \$server_port \$request_uri';
  # JSON-RPC id of the answer: the request's, when bench/mix.lua sends it in X-Bench-Rpc-Id.
  map \$http_x_bench_rpc_id \$bench_rpc_id { "~^[0-9]{1,18}\$" \$http_x_bench_rpc_id; default 1; }
  server {
    listen $HOST:${BACKEND_PORTS[0]};
    listen $HOST:${BACKEND_PORTS[1]};
    listen $HOST:${BACKEND_PORTS[2]};
    access_log $BACKEND_LOG bench buffer=256k flush=250ms;
    location = /mcp {
      if (\$http_x_bench_phase = "sse") { rewrite ^ /mcp-sse last; }
      add_header X-Bench-Backend \$server_port always;
      add_header X-Bench-Phase \$http_x_bench_phase always;
      add_header X-Bench-Message-Id \$http_x_bench_message_id always;
      if (\$http_x_bench_phase = "pending") {
        return 200 '{"jsonrpc":"2.0","id":\$bench_rpc_id,"messageId":"\$http_x_bench_message_id","result":{"pending":true}}';
      }
      return 200 '{"jsonrpc":"2.0","id":\$bench_rpc_id,"result":{"content":[{"type":"text","text":"ok"}]}}';
    }
    # bench/sse.lua: one MCP answer as a server-sent event.
    location = /mcp-sse {
      internal;
      default_type text/event-stream;
      add_header X-Bench-Backend \$server_port always;
      add_header Cache-Control no-cache always;
      return 200 'event: message\\ndata: {"jsonrpc":"2.0","id":\$bench_rpc_id,"result":{"content":[{"type":"text","text":"ok"}]}}\\n\\n';
    }
    location = /probe { return 200 '\$connection'; }
    location / { return 404; }
  }
}
EOF
  } >"$BACKEND_DIR/nginx.conf"
  nginx -t -q -p "$BACKEND_DIR" -e "$BACKEND_DIR/error.log" -c "$BACKEND_DIR/nginx.conf" \
    >"$BACKEND_DIR/check.log" 2>&1 || { cat "$BACKEND_DIR/check.log" >&2; die "backend nginx config invalid"; }
  taskset -c "$LOAD_CPUS" nginx -p "$BACKEND_DIR" -e "$BACKEND_DIR/error.log" \
    -c "$BACKEND_DIR/nginx.conf" >"$BACKEND_DIR/stdout.log" 2>&1 &
  BACKEND_PID=$!
  STARTED+=("$BACKEND_PID")
  local i port ok
  for ((i = 0; i < 100; i++)); do
    ok=1
    for port in "${BACKEND_PORTS[@]}"; do
      [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 1 -X POST \
        -H 'Content-Type: application/json' --data '{}' "http://$HOST:$port/mcp") == 200 ]] || ok=0
    done
    ((ok)) && return 0
    alive "$BACKEND_PID" || break
    sleep 0.1
  done
  cat "$BACKEND_DIR/error.log" "$BACKEND_DIR/stdout.log" >&2 2>/dev/null || true
  die "backend nginx did not come up on ports ${BACKEND_PORTS[*]}"
}

# ---------------------------------------------------------------------------------------------
# Peers: each start_* starts one proxy pinned to its core, sets PEER_PID/PEER_URL/PEER_PORT,
# and returns non-zero with PEER_ERR set when it cannot.
# ---------------------------------------------------------------------------------------------
PEER_PID= PEER_URL= PEER_PORT= PEER_ERR= PEER_LOG=

wait_post_ok() {  # a POST through the proxy answers 200 (bounded)
  local url=$1 pid=$2 i code=000
  for ((i = 0; i < 10 * READY_TIMEOUT; i++)); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 -X POST \
      -H 'Content-Type: application/json' -H 'Mcp-Routing-Id: bench-ready' \
      --data '{"jsonrpc":"2.0","id":0,"messageId":"bench-ready","method":"tools/call","params":{"name":"x"}}' \
      "$url" || true)
    [[ $code == 200 ]] && return 0
    if ! alive "$pid"; then
      local rc=0
      wait "$pid" 2>/dev/null || rc=$?
      PEER_ERR="process exited (status $rc) during start-up"
      [[ -s $PEER_LOG ]] && PEER_ERR+=": $(grep -v NOTICE "$PEER_LOG" | tail -n 2 | tr '\n' ' ' | cut -c1-300)"
      return 1
    fi
    sleep 0.1
  done
  PEER_ERR="POST $url did not answer 200 within ${READY_TIMEOUT}s (last status $code)"
  return 1
}

launch() {  # launch <cpus> <log> <cmd...>; sets PEER_PID
  local cpus=$1 logf=$2
  shift 2
  taskset -c "$cpus" "$@" >"$logf" 2>&1 &
  PEER_PID=$!
  STARTED+=("$PEER_PID")
}

start_haproxy() {  # $1 = header|body, $2 = 1: add the X-Forwarded-* headers the router adds
  local dir=$TMP/haproxy-$1-${2:-0} mode=$1 fwd=${2:-0}
  mkdir -p "$dir"
  PEER_PORT=$HAPROXY_PORT
  PEER_URL="http://$HOST:$HAPROXY_PORT/mcp"
  PEER_LOG=$dir/haproxy.log
  {
    cat <<EOF
global
  nbthread 1
  maxconn 4096

defaults
  mode http
  timeout connect 5s
  timeout client 600s
  timeout server 600s
  timeout http-keep-alive 600s
  http-reuse always

frontend fe
  bind $HOST:$HAPROXY_PORT
EOF
    if ((fwd)); then
      echo "  option forwardfor"
      echo "  http-request set-header X-Forwarded-Proto http"
      echo "  http-request set-header X-Forwarded-Host %[req.hdr(host)]"
    fi
    cat <<EOF
  default_backend mcp

backend mcp
  hash-type consistent
EOF
    if [[ $mode == header ]]; then
      echo "  balance hdr(Mcp-Routing-Id)"
    else
      echo "  option http-buffer-request"
      echo "  http-request set-var(txn.rk) req.body,json_query('\$.messageId')"
      echo "  balance hash var(txn.rk)"
    fi
    local i
    for i in 0 1 2; do echo "  server b$((i + 1)) $HOST:${BACKEND_PORTS[$i]}"; done
  } >"$dir/haproxy.cfg"
  if ! haproxy -q -c -f "$dir/haproxy.cfg" >"$dir/check.log" 2>&1; then
    PEER_ERR="haproxy config check failed: $(tr '\n' ' ' <"$dir/check.log" | cut -c1-300)"
    return 1
  fi
  launch "$PROXY_CPUS" "$PEER_LOG" haproxy -db -f "$dir/haproxy.cfg"
  wait_post_ok "$PEER_URL" "$PEER_PID"
}

start_nginx_proxy() {
  local dir=$TMP/nginx-proxy
  mkdir -p "$dir/tmp"
  PEER_PORT=$NGINX_PORT
  PEER_URL="http://$HOST:$NGINX_PORT/mcp"
  PEER_LOG=$dir/error.log
  {
    nginx_common "$dir"
    echo "http {"
    nginx_http_common "$dir"
    cat <<EOF
  upstream mcp {
    hash \$http_mcp_routing_id consistent;
    server $HOST:${BACKEND_PORTS[0]};
    server $HOST:${BACKEND_PORTS[1]};
    server $HOST:${BACKEND_PORTS[2]};
    keepalive $NGINX_KEEPALIVE;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
  }
  server {
    listen $HOST:$NGINX_PORT;
    location / {
      proxy_pass http://mcp;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
EOF
  } >"$dir/nginx.conf"
  if ! nginx -t -q -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf" >"$dir/check.log" 2>&1; then
    PEER_ERR="nginx config check failed: $(tr '\n' ' ' <"$dir/check.log" | cut -c1-300)"
    return 1
  fi
  launch "$PROXY_CPUS" "$dir/stdout.log" nginx -p "$dir" -e "$dir/error.log" -c "$dir/nginx.conf"
  wait_post_ok "$PEER_URL" "$PEER_PID"
}

BUILD_ERR=
start_floor() {
  PEER_PORT=$FLOOR_PORT
  PEER_URL="http://$HOST:$FLOOR_PORT/mcp"
  PEER_LOG=$TMP/hyper-floor.log
  if [[ -n $BUILD_ERR ]]; then PEER_ERR=$BUILD_ERR; return 1; fi
  if [[ ! -x $FLOOR_BIN ]]; then
    PEER_ERR="$FLOOR_BIN not found (cargo build --release --example hyper_floor, or set BENCH_FLOOR_BIN)"
    return 1
  fi
  launch "$PROXY_CPUS" "$PEER_LOG" "$FLOOR_BIN" "$HOST:$FLOOR_PORT" \
    "$HOST:${BACKEND_PORTS[0]},$HOST:${BACKEND_PORTS[1]},$HOST:${BACKEND_PORTS[2]}"
  wait_post_ok "$PEER_URL" "$PEER_PID"
}

start_router() {  # $1 = worker threads, $2 = cpus
  local threads=$1 cpus=$2 dir=$TMP/router-$1w
  mkdir -p "$dir"
  PEER_PORT=$ROUTER_PORT
  PEER_URL="http://$HOST:$ROUTER_PORT/mcp"
  PEER_LOG=$dir/router.log
  if [[ -n $BUILD_ERR ]]; then PEER_ERR=$BUILD_ERR; return 1; fi
  if [[ ! -x $ROUTER_BIN ]]; then
    PEER_ERR="router binary $ROUTER_BIN not found (cargo build --release, or set BENCH_ROUTER_BIN)"
    return 1
  fi
  port_busy "$ROUTER_ADMIN_PORT" && { PEER_ERR="admin port $ROUTER_ADMIN_PORT is in use"; return 1; }
  cat >"$dir/config.toml" <<EOF
[server]
listen = "$HOST:$ROUTER_PORT"

[admin]
listen = "$HOST:$ROUTER_ADMIN_PORT"

[[backend]]
name = "b1"
url = "http://$HOST:${BACKEND_PORTS[0]}"

[[backend]]
name = "b2"
url = "http://$HOST:${BACKEND_PORTS[1]}"

[[backend]]
name = "b3"
url = "http://$HOST:${BACKEND_PORTS[2]}"
EOF
  PEER_PID=
  MRTR_WORKER_THREADS=$threads RUST_LOG=${RUST_LOG:-warn} \
    launch "$cpus" "$PEER_LOG" "$ROUTER_BIN" --config "$dir/config.toml"
  local i code=000
  for ((i = 0; i < 10 * READY_TIMEOUT; i++)); do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 \
      "http://$HOST:$ROUTER_ADMIN_PORT/readyz" || true)
    [[ $code == 200 ]] && break
    if ! alive "$PEER_PID"; then
      local rc=0
      wait "$PEER_PID" 2>/dev/null || rc=$?
      PEER_ERR="mrtr-router exited (status $rc) during start-up, before /readyz answered 200"
      [[ -s $PEER_LOG ]] && PEER_ERR+=": $(tail -n 3 "$PEER_LOG" | tr '\n' ' ' | cut -c1-300)"
      return 1
    fi
    sleep 0.1
  done
  if [[ $code != 200 ]]; then
    PEER_ERR="GET http://$HOST:$ROUTER_ADMIN_PORT/readyz did not answer 200 within ${READY_TIMEOUT}s (last $code)"
    return 1
  fi
  wait_post_ok "$PEER_URL" "$PEER_PID"
}

# ---------------------------------------------------------------------------------------------
# One row in one round. Every R_* array is keyed by "<peer>#<round>".
# ---------------------------------------------------------------------------------------------
declare -A R_STATUS R_ERR R_REQ R_DUR R_RPS R_P50 R_P99 R_MAX R_ERRS R_ERRJSON R_CPU R_CORE \
  R_BCPU R_BSLEEP R_LCORE R_NEWC R_ACC R_SHARE R_PEND R_CONF R_MIS R_METRICS R_THREADS R_OTHER \
  R_SSE_PX_REQ R_SSE_PX_P50 R_SSE_PX_P99 R_SSE_PX_MAX R_SSE_DI_REQ R_SSE_DI_P50 R_SSE_DI_P99 \
  R_SSE_DI_MAX R_SSE_ADD50 R_SSE_ADD99

DIRECT_URL="http://$HOST:${BACKEND_PORTS[0]}/mcp"
# The direct SSE probe's own query string keeps its requests out of the backend counts (new-up).
SSE_DIRECT_URL="$DIRECT_URL?sse-direct"

row_fail() {  # row_fail <peer#round> <message>
  R_STATUS[$1]=failed
  R_ERR[$1]=$2
  log "${1%#*} [round ${1##*#}/$ROUNDS]: FAILED: $2"
}

start_wrk() {  # start_wrk <out> <duration> <connections> <script> <url> <args...>; sets WRK_PID
  local out=$1 dur=$2 conns=$3 script=$4 url=$5
  shift 5
  # In the background so that a signal to this script interrupts `wait` and the trap stops wrk.
  timeout --foreground --kill-after=5 $((dur + 30)) taskset -c "$LOAD_CPUS" \
    wrk -t1 -c"$conns" -d"${dur}s" --timeout 5s --latency -s "$script" "$url" -- "$@" \
    >"$out" 2>&1 &
  WRK_PID=$!
  STARTED+=("$WRK_PID")
}

wait_wrk() {  # wait_wrk <pid>: returns wrk's exit status
  local wpid=$1 rc=0
  wait "$wpid" || rc=$?
  local keep=() p
  for p in "${STARTED[@]}"; do [[ $p == "$wpid" ]] || keep+=("$p"); done
  STARTED=(${keep[@]+"${keep[@]}"})
  return "$rc"
}

run_wrk() {  # run_wrk <out> <duration> <script> <url> <args...>: the main load, CONNS connections
  local out=$1 dur=$2 script=$3 url=$4
  shift 4
  start_wrk "$out" "$dur" "$CONNS" "$script" "$url" "$@"
  wait_wrk "$WRK_PID"
}

parse_result() {  # parse_result <wrk output> <assoc array name>: the BENCH_RESULT line's key=value
  local -n kv_out=$2
  local line kv
  line=$(grep -m1 '^BENCH_RESULT ' "$1" 2>/dev/null || true)
  [[ -n $line ]] || return 1
  for kv in ${line#BENCH_RESULT }; do kv_out[${kv%%=*}]=${kv#*=}; done
}

proc_threads() {  # threads of a process and of its direct children
  local total=0 p n
  for p in "$1" $(pgrep -P "$1" 2>/dev/null || true); do
    n=$(awk '/^Threads:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
    total=$((total + ${n:-0}))
  done
  echo "$total"
}

children_ticks() {  # children_ticks <file written by `times` in this shell>: CPU of reaped children, in ticks
  awk -v hz="$CLK_TCK" 'function sec(t,  m) { m = t; sub(/m.*/, "", m); sub(/^[0-9]+m/, "", t); sub(/s$/, "", t); return m * 60 + t }
    NR == 2 { printf "%d\n", (sec($1) + sec($2)) * hz }' "$1"
}

other_busy_pct() {  # other_busy_pct "tot0 idle0" "tot1 idle1" <our ticks>: machine share used by other processes
  awk -v a="$1" -v b="$2" -v ours="$3" 'BEGIN { split(a, x, " "); split(b, y, " "); dt = y[1] - x[1];
    if (dt <= 0) { print "null"; exit } o = (dt - (y[2] - x[2])) - ours; if (o < 0) o = 0; printf "%.1f\n", 100 * o / dt }'
}

us_to_ms() { awk -v x="$1" 'BEGIN { printf "%.3f", x / 1000 }'; }

measure() {  # measure <peer> <round> <url> <script> <wrk args...>; PEER_PID is the proxy (empty: direct)
  local peer=$1 round=$2 url=$3 script=$4
  shift 4
  local k="$peer#$round" dir=$TMP/rows/$peer/r$round
  mkdir -p "$dir"
  local sse=0
  ((SSE_PROBE)) && [[ $peer == *-mix* ]] && sse=1

  if ((WARMUP > 0)); then
    run_wrk "$dir/warmup.out" "$WARMUP" "$script" "$url" "$@" \
      || { row_fail "$k" "warm-up wrk failed: $(tail -n 3 "$dir/warmup.out" | tr '\n' ' ')"; return 1; }
  fi

  local t0=$peer-$round-start-$RANDOM t1=$peer-$round-end-$RANDOM c0 c1 log_off
  : >"$BACKEND_LOG"   # nginx appends (O_APPEND): keeps the log small over many rounds
  log_off=$(stat -c %s "$BACKEND_LOG" 2>/dev/null || echo 0)
  c0=$(probe_conn "$t0") && is_uint "$c0" || { row_fail "$k" "backend probe failed"; return 1; }

  local pt0=0 pt1=0 bt0 bt1 bs0 bs1 cs0 cs1 ls0 ls1 metrics=0
  if [[ $peer == mrtr-* ]]; then  # router counters, when its /metrics answers (optional)
    curl -sf --max-time 2 "http://$HOST:$ROUTER_ADMIN_PORT/metrics" >"$dir/metrics.before" 2>/dev/null \
      && metrics=1
  fi
  [[ -n $PEER_PID ]] && pt0=$(proc_ticks "$PEER_PID")
  bt0=$(proc_ticks "$BACKEND_PID")
  bs0=$(proc_sleeps "$BACKEND_PID")
  cs0=$(cpu_sample "$PROXY_CPUS_ROW")
  ls0=$(cpu_sample "$LOAD_CPUS")
  local awp0 awl0 awp1 awl1
  awp0=$(pids_ticks ${AWAKE_PROXY[@]+"${AWAKE_PROXY[@]}"})
  awl0=$(pids_ticks ${AWAKE_LOAD[@]+"${AWAKE_LOAD[@]}"})
  # Other processes' share of the machine: all busy time minus the proxy's, the backend's and
  # wrk's (wrk runs under `timeout`, a child of this shell: `times` has it once reaped).
  local as0 as1
  as0=$(cpu_sample "$ALL_CPUS")
  times >"$dir/times.before"
  local wrk_rc=0 sse_px_pid= sse_di_pid= sse_px_rc=0 sse_di_rc=0
  if ((sse)); then  # paced SSE probes through the proxy and straight to a backend, next to the load
    start_wrk "$dir/sse-proxy.out" "$DURATION" "$SSE_CONNS" "$BENCH_DIR/sse.lua" "$url" "$SSE_PAUSE_MS"
    sse_px_pid=$WRK_PID
    start_wrk "$dir/sse-direct.out" "$DURATION" "$SSE_CONNS" "$BENCH_DIR/sse.lua" "$SSE_DIRECT_URL" "$SSE_PAUSE_MS"
    sse_di_pid=$WRK_PID
  fi
  run_wrk "$dir/wrk.out" "$DURATION" "$script" "$url" "$@" || wrk_rc=$?
  if ((sse)); then
    wait_wrk "$sse_px_pid" || sse_px_rc=$?
    wait_wrk "$sse_di_pid" || sse_di_rc=$?
  fi
  times >"$dir/times.after"
  as1=$(cpu_sample "$ALL_CPUS")
  [[ -n $PEER_PID ]] && { pt1=$(proc_ticks "$PEER_PID"); R_THREADS[$k]=$(proc_threads "$PEER_PID"); }
  bt1=$(proc_ticks "$BACKEND_PID")
  bs1=$(proc_sleeps "$BACKEND_PID")
  cs1=$(cpu_sample "$PROXY_CPUS_ROW")
  ls1=$(cpu_sample "$LOAD_CPUS")
  awp1=$(pids_ticks ${AWAKE_PROXY[@]+"${AWAKE_PROXY[@]}"})
  awl1=$(pids_ticks ${AWAKE_LOAD[@]+"${AWAKE_LOAD[@]}"})

  R_METRICS[$k]=null
  if ((metrics)) && curl -sf --max-time 2 "http://$HOST:$ROUTER_ADMIN_PORT/metrics" \
    >"$dir/metrics.after" 2>/dev/null; then
    R_METRICS[$k]=$(metrics_delta "$dir/metrics.before" "$dir/metrics.after")
  fi
  c1=$(probe_conn "$t1") && is_uint "$c1" || { row_fail "$k" "backend probe failed"; return 1; }
  wait_log_tag "$t1" || { row_fail "$k" "backend access log not flushed"; return 1; }

  if ((wrk_rc != 0)); then
    row_fail "$k" "wrk exited $wrk_rc: $(tail -n 3 "$dir/wrk.out" | tr '\n' ' ' | cut -c1-300)"
    return 1
  fi
  local -A v=()
  parse_result "$dir/wrk.out" v || { row_fail "$k" "no BENCH_RESULT line from wrk"; return 1; }

  # SSE probes: their errors are the row's errors; their requests through the proxy count in
  # the proxy's CPU per request, all of them in the backend's.
  local sse_px_req=0 sse_di_req=0 sse_err=0 sse_msg=
  if ((sse)); then
    local -A sp=() sd=()
    if ((sse_px_rc != 0)) || ! parse_result "$dir/sse-proxy.out" sp; then
      row_fail "$k" "SSE probe through the proxy failed (wrk exit $sse_px_rc): $(tail -n 3 "$dir/sse-proxy.out" | tr '\n' ' ' | cut -c1-300)"
      return 1
    fi
    if ((sse_di_rc != 0)) || ! parse_result "$dir/sse-direct.out" sd; then
      row_fail "$k" "SSE probe to the backend failed (wrk exit $sse_di_rc): $(tail -n 3 "$dir/sse-direct.out" | tr '\n' ' ' | cut -c1-300)"
      return 1
    fi
    sse_px_req=${sp[requests]} sse_di_req=${sd[requests]}
    local e_px=$((sp[connect] + sp[read] + sp[write] + sp[status] + sp[timeout] + sp[bad]))
    local e_di=$((sd[connect] + sd[read] + sd[write] + sd[status] + sd[timeout] + sd[bad]))
    sse_err=$((e_px + e_di))
    ((sse_err > 0)) && sse_msg="SSE probe: $e_px errors through the proxy, $e_di direct (connect/read/write/non-2xx/timeout/not-an-event: ${sp[connect]}/${sp[read]}/${sp[write]}/${sp[status]}/${sp[timeout]}/${sp[bad]} and ${sd[connect]}/${sd[read]}/${sd[write]}/${sd[status]}/${sd[timeout]}/${sd[bad]})"
    ((sse_px_req > 0 && sse_di_req > 0)) || sse_msg="SSE probe completed no request (through the proxy $sse_px_req, direct $sse_di_req)"
    R_SSE_PX_REQ[$k]=$sse_px_req R_SSE_DI_REQ[$k]=$sse_di_req
    R_SSE_PX_P50[$k]=$(us_to_ms "${sp[p50_us]}") R_SSE_PX_P99[$k]=$(us_to_ms "${sp[p99_us]}")
    R_SSE_PX_MAX[$k]=$(us_to_ms "${sp[max_us]}")
    R_SSE_DI_P50[$k]=$(us_to_ms "${sd[p50_us]}") R_SSE_DI_P99[$k]=$(us_to_ms "${sd[p99_us]}")
    R_SSE_DI_MAX[$k]=$(us_to_ms "${sd[max_us]}")
    R_SSE_ADD50[$k]=$(us_to_ms $((sp[p50_us] - sd[p50_us])))
    R_SSE_ADD99[$k]=$(us_to_ms $((sp[p99_us] - sd[p99_us])))
  fi

  local req=${v[requests]} dur_us=${v[duration_us]}
  R_REQ[$k]=$req
  R_DUR[$k]=$(awk -v d="$dur_us" 'BEGIN { printf "%.3f", d / 1e6 }')
  R_RPS[$k]=$(awk -v r="$req" -v d="$dur_us" 'BEGIN { printf "%.0f", (d > 0) ? r / (d / 1e6) : 0 }')
  R_P50[$k]=$(us_to_ms "${v[p50_us]}")
  R_P99[$k]=$(us_to_ms "${v[p99_us]}")
  R_MAX[$k]=$(us_to_ms "${v[max_us]}")
  local nerr=$((v[connect] + v[read] + v[write] + v[status] + v[timeout] + v[misrouted] + sse_err))
  R_ERRS[$k]=$nerr
  R_ERRJSON[$k]="{\"connect\":${v[connect]},\"read\":${v[read]},\"write\":${v[write]},\"status\":${v[status]},\"timeout\":${v[timeout]},\"misrouted\":${v[misrouted]},\"sse_probe\":$sse_err}"
  R_PEND[$k]=${v[pending]}
  R_CONF[$k]=${v[confirmed]}
  R_MIS[$k]=${v[misrouted]}
  local preq=$((req + sse_px_req)) breq=$((req + sse_px_req + sse_di_req))
  if [[ -n $PEER_PID ]] && ((preq > 0)); then
    R_CPU[$k]=$(awk -v t=$((pt1 - pt0)) -v hz="$CLK_TCK" -v r="$preq" \
      'BEGIN { printf "%.2f", t * 1e6 / hz / r }')
    R_CORE[$k]=$(busy_pct "$cs0" "$cs1" $((awp1 - awp0)))
  else
    R_CPU[$k]=null
    R_CORE[$k]=null
  fi
  R_BCPU[$k]=$( ((breq > 0)) && awk -v t=$((bt1 - bt0)) -v hz="$CLK_TCK" -v r="$breq" \
    'BEGIN { printf "%.2f", t * 1e6 / hz / r }' || echo null)
  # How often the backend went to sleep (and had to be woken): per 1000 requests.
  R_BSLEEP[$k]=$( ((breq > 0)) && awk -v n=$((bs1 - bs0)) -v r="$breq" 'BEGIN { printf "%.0f", n * 1000 / r }' || echo null)
  R_LCORE[$k]=$(busy_pct "$ls0" "$ls1" $((awl1 - awl0)))
  local wt=$(($(children_ticks "$dir/times.after") - $(children_ticks "$dir/times.before")))
  R_OTHER[$k]=$(other_busy_pct "$as0" "$as1" $((pt1 - pt0 + bt1 - bt0 + wt + awp1 - awp0 + awl1 - awl0)))
  if awk -v b="${R_OTHER[$k]}" 'BEGIN { exit !(b != "null" && b > 10) }'; then
    log "$peer [round $round/$ROUNDS]: WARNING: other processes used ${R_OTHER[$k]}% of the machine during the run: this round's numbers are noisy"
  fi

  # Upstream connections: backend nginx numbers every accepted connection ($connection, one
  # worker => strictly increasing). c0/c1 are probe connections made just before/after the run.
  # new conns = distinct $connection in (c0, c1) that carried a request; accepts = c1 - c0 - 1.
  # The direct SSE probe's requests (/mcp?sse-direct) do not count.
  local stats
  stats=$(tail -c +"$((log_off + 1))" "$BACKEND_LOG" | awk -v t0="/probe?tag=$t0" -v t1="/probe?tag=$t1" \
    -v c0="$c0" -v c1="$c1" -v p1="${BACKEND_PORTS[0]}" -v p2="${BACKEND_PORTS[1]}" -v p3="${BACKEND_PORTS[2]}" '
    $3 == t0 { on = 1; next }
    $3 == t1 { on = 0; exit }
    on && $3 !~ /^\/probe/ && $3 != "/mcp?sse-direct" { n[$2]++; if ($1 > c0 && $1 < c1 && !($1 in seen)) { seen[$1] = 1; newc++ } }
    END { printf "%d {\"%s\":%d,\"%s\":%d,\"%s\":%d}\n", newc, p1, n[p1], p2, n[p2], p3, n[p3] }')
  R_NEWC[$k]=${stats%% *}
  R_SHARE[$k]=${stats#* }
  R_ACC[$k]=$((c1 - c0 - 1))

  if ((req == 0)); then
    row_fail "$k" "no request completed"
    return 1
  fi
  if ((nerr > 0)) || [[ -n $sse_msg ]]; then
    local m="$((nerr - sse_err)) errors (connect ${v[connect]}, read ${v[read]}, write ${v[write]}, non-2xx ${v[status]}, timeout ${v[timeout]}, misrouted ${v[misrouted]})"
    ((nerr - sse_err == 0)) && m=
    [[ -n $sse_msg ]] && m+="${m:+; }$sse_msg"
    row_fail "$k" "$m"
    return 1
  fi
  R_STATUS[$k]=ok
  log "$peer [round $round/$ROUNDS]: ${R_RPS[$k]} req/s, p50 ${R_P50[$k]} ms, p99 ${R_P99[$k]} ms, cpu ${R_CPU[$k]} us/req, new upstream conns ${R_NEWC[$k]}"
  ((sse)) && log "$peer [round $round/$ROUNDS]: SSE probe p99 ${R_SSE_PX_P99[$k]} ms through the proxy, ${R_SSE_DI_P99[$k]} ms direct: +${R_SSE_ADD99[$k]} ms"
  [[ ${R_METRICS[$k]:-null} != null ]] && log "$peer [round $round/$ROUNDS]: router counters during the run: ${R_METRICS[$k]}"
  return 0
}

run_peer() {  # run_peer <peer> <round>; always returns 0, the outcome is in R_STATUS
  local peer=$1 round=$2 started=0
  local k="$peer#$round"
  PEER_PID= PEER_URL= PEER_PORT= PEER_ERR= PEER_LOG=
  PROXY_CPUS_ROW=$PROXY_CPUS
  log "$peer [round $round/$ROUNDS]: ${DESC[$peer]}"
  case $peer in
    direct) PEER_URL=$DIRECT_URL ;;
    mrtr-header | mrtr-body | mrtr-mix | mrtr-mix-paced*) start_router 1 "$PROXY_CPUS" && started=1 ;;
    mrtr-header-2w) PROXY_CPUS_ROW=$PROXY_CPUS_2W; start_router 2 "$PROXY_CPUS_2W" && started=1 ;;
    haproxy-header) start_haproxy header && started=1 ;;
    haproxy-header-fwd) start_haproxy header 1 && started=1 ;;
    haproxy-body-fwd) start_haproxy body 1 && started=1 ;;
    haproxy-body | haproxy-mix | haproxy-mix-paced*) start_haproxy body && started=1 ;;
    nginx-header) start_nginx_proxy && started=1 ;;
    hyper-floor) start_floor && started=1 ;;
  esac
  if [[ $peer != direct ]] && ((!started)); then
    row_fail "$k" "${PEER_ERR:-could not start}"
    [[ -n $PEER_LOG && -s $PEER_LOG ]] && { log "last lines of $PEER_LOG:"; tail -n 5 "$PEER_LOG" >&2; }
  else
    case $peer in
      direct | mrtr-header | mrtr-header-2w | haproxy-header | haproxy-header-fwd | nginx-header | hyper-floor)
        measure "$peer" "$round" "$PEER_URL" "$BENCH_DIR/mcp.lua" header || true ;;
      mrtr-body | haproxy-body | haproxy-body-fwd)
        measure "$peer" "$round" "$PEER_URL" "$BENCH_DIR/mcp.lua" body || true ;;
      mrtr-mix | haproxy-mix)
        measure "$peer" "$round" "$PEER_URL" "$BENCH_DIR/mix.lua" body "$PENDING_PCT" || true ;;
      mrtr-mix-paced | haproxy-mix-paced)
        measure "$peer" "$round" "$PEER_URL" "$BENCH_DIR/mix.lua" body "$PENDING_PCT" "$MIX_PAUSE_MS" || true ;;
      *-mix-paced-awake)
        start_awake
        measure "$peer" "$round" "$PEER_URL" "$BENCH_DIR/mix.lua" body "$PENDING_PCT" "$MIX_PAUSE_MS" || true
        stop_awake ;;
    esac
    if [[ -n $PEER_PID ]] && ! alive "$PEER_PID"; then
      [[ ${R_STATUS[$k]:-} == ok ]] && row_fail "$k" "proxy process died during the run"
    fi
  fi
  if [[ -n $PEER_PID ]]; then
    stop_pid "$PEER_PID"
    wait_port_free "$PEER_PORT" || die "port $PEER_PORT still busy after stopping $peer"
    [[ $peer == mrtr-* ]] && { wait_port_free "$ROUTER_ADMIN_PORT" || die "port $ROUTER_ADMIN_PORT still busy"; }
  fi
  return 0
}

# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
for port in "${BACKEND_PORTS[@]}" "$ROUTER_PORT" "$ROUTER_ADMIN_PORT" "$HAPROXY_PORT" "$NGINX_PORT" "$FLOOR_PORT"; do
  port_busy "$port" && die "port $port on $HOST is already in use; stop whatever listens there"
done

want_router=0
for p in "${PEERS[@]}"; do [[ $p == mrtr-* || $p == hyper-floor ]] && want_router=1; done
if ((want_router)) && [[ $SKIP_BUILD != 1 ]]; then
  if ! command -v cargo >/dev/null 2>&1; then
    BUILD_ERR="cargo not found; cannot build the router (set BENCH_SKIP_BUILD=1 and BENCH_ROUTER_BIN)"
  else
    log "cargo build --release --bins --example hyper_floor ..."
    if ! (cd "$REPO_DIR" && cargo build --release --bins --example hyper_floor) >"$TMP/build.log" 2>&1; then
      tail -n 20 "$TMP/build.log" >&2
      BUILD_ERR="cargo build --release failed"
    fi
  fi
  [[ -n $BUILD_ERR ]] && log "router rows will fail: $BUILD_ERR"
fi
# What was measured: the binary's time stamp and hash, and the commit when the run started (a
# binary built from a dirty tree or an older commit is not that commit).
REPO_COMMIT=$(git -C "$REPO_DIR" rev-parse --short HEAD 2>/dev/null || echo none)
REPO_DIRTY=$( [[ -n $(git -C "$REPO_DIR" status --porcelain -- src Cargo.toml Cargo.lock 2>/dev/null) ]] && echo true || echo false)
ROUTER_BIN_MTIME=null ROUTER_BIN_SHA=null
if ((want_router)) && [[ -f $ROUTER_BIN ]]; then
  ROUTER_BIN_MTIME="\"$(date -u -r "$ROUTER_BIN" +%Y-%m-%dT%H:%M:%SZ)\""
  ROUTER_BIN_SHA="\"$(sha256sum "$ROUTER_BIN" | cut -c1-16)\""
fi
((want_router)) && log "router binary: $ROUTER_BIN (modified ${ROUTER_BIN_MTIME//\"/}; repo at $REPO_COMMIT, src dirty: $REPO_DIRTY)"

# Numbers are only comparable on an otherwise idle machine: measure how busy it is first.
s0=$(cpu_sample "$ALL_CPUS"); sleep 1; s1=$(cpu_sample "$ALL_CPUS")
IDLE_CHECK=$(busy_pct "$s0" "$s1")
if awk -v b="$IDLE_CHECK" 'BEGIN { exit !(b != "null" && b > 10) }'; then
  log "WARNING: the machine was ${IDLE_CHECK}% busy before the run (other processes): req/s and latency will be noisy"
fi
log "$ROUNDS round(s) of ${#PEERS[@]} row(s): duration ${DURATION}s, warm-up ${WARMUP}s, $CONNS connections, wrk+backends on cpu $LOAD_CPUS, proxy on cpu $PROXY_CPUS"
start_backends
for ((round = 1; round <= ROUNDS; round++)); do
  ((ROUNDS > 1)) && log "=== round $round of $ROUNDS ==="
  for p in "${PEERS[@]}"; do run_peer "$p" "$round"; done
done

# ---------------------------------------------------------------------------------------------
# Report: per row, the median over the rounds (min-max for CPU); the JSON keeps every round.
# ---------------------------------------------------------------------------------------------
ratio() {  # ratio <a> <b>
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "null" || b == "null" || a == "" || b == "" || b + 0 == 0) print "null"; else printf "%.2f\n", a / b }'
}
nz() { [[ -n ${1:-} ]] && echo "$1" || echo null; }
show() { [[ ${1:-null} == null ]] && echo "-" || echo "$1"; }
json_str() { printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr -d '\000-\037')"; }

vals() {  # vals <array name> <peer>: the peer's value in each round, one a line (missing: none)
  local -n vals_a=$1
  local r k
  for ((r = 1; r <= ROUNDS; r++)); do
    k="$2#$r"
    [[ -n ${vals_a[$k]:-} ]] && echo "${vals_a[$k]}"
  done
  return 0
}

agg() {  # agg <median|min|max|sum> <printf format> <values...>: over the numeric values, else null
  local what=$1 fmt=$2
  shift 2
  printf '%s\n' "$@" | awk -v w="$what" -v f="$fmt" '
    $1 ~ /^-?[0-9]+(\.[0-9]+)?$/ { v[++n] = $1 + 0 }
    END {
      if (!n) { print "null"; exit }
      for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j > 0 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
      if (w == "min") r = v[1]
      else if (w == "max") r = v[n]
      else if (w == "sum") { r = 0; for (i = 1; i <= n; i++) r += v[i] }
      else r = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
      printf f "\n", r
    }'
}

declare -A A_STATUS A_ERR A_RPS A_P50 A_P99 A_MAX A_ERRS A_CPU A_CPUMIN A_CPUMAX A_CORE A_BCPU A_BSLEEP \
  A_LCORE A_NEWC A_THREADS A_OKR A_SSE A_OTHER
for p in "${PEERS[@]}"; do
  okr=0 errs=()
  for ((r = 1; r <= ROUNDS; r++)); do
    k="$p#$r"
    if [[ ${R_STATUS[$k]:-failed} == ok ]]; then
      okr=$((okr + 1))
    else
      errs+=("round $r: ${R_ERR[$k]:-did not run}")
    fi
  done
  A_OKR[$p]=$okr
  if ((okr == ROUNDS)); then A_STATUS[$p]=ok; A_ERR[$p]=; else
    A_STATUS[$p]=failed
    A_ERR[$p]=${errs[0]}
    ((${#errs[@]} > 1)) && A_ERR[$p]+=" (and $((${#errs[@]} - 1)) more failed round(s))"
  fi
  A_RPS[$p]=$(agg median %.0f $(vals R_RPS "$p"))
  A_P50[$p]=$(agg median %.3f $(vals R_P50 "$p"))
  A_P99[$p]=$(agg median %.3f $(vals R_P99 "$p"))
  A_MAX[$p]=$(agg max %.3f $(vals R_MAX "$p"))
  A_ERRS[$p]=$(agg sum %d $(vals R_ERRS "$p"))
  A_CPU[$p]=$(agg median %.2f $(vals R_CPU "$p"))
  A_CPUMIN[$p]=$(agg min %.2f $(vals R_CPU "$p"))
  A_CPUMAX[$p]=$(agg max %.2f $(vals R_CPU "$p"))
  A_CORE[$p]=$(agg median %.1f $(vals R_CORE "$p"))
  A_BCPU[$p]=$(agg median %.2f $(vals R_BCPU "$p"))
  A_BSLEEP[$p]=$(agg median %d $(vals R_BSLEEP "$p"))
  A_LCORE[$p]=$(agg median %.1f $(vals R_LCORE "$p"))
  A_NEWC[$p]=$(agg max %d $(vals R_NEWC "$p"))
  A_THREADS[$p]=$(agg max %d $(vals R_THREADS "$p"))
  A_OTHER[$p]=$(agg max %.1f $(vals R_OTHER "$p"))
  A_SSE[$p]=null
  if [[ -n $(vals R_SSE_ADD99 "$p") ]]; then
    A_SSE[$p]="{\"via_proxy_p50_ms\":$(agg median %.3f $(vals R_SSE_PX_P50 "$p")),\"via_proxy_p99_ms\":$(agg median %.3f $(vals R_SSE_PX_P99 "$p")),\
\"direct_p50_ms\":$(agg median %.3f $(vals R_SSE_DI_P50 "$p")),\"direct_p99_ms\":$(agg median %.3f $(vals R_SSE_DI_P99 "$p")),\
\"added_p50_ms\":$(agg median %.3f $(vals R_SSE_ADD50 "$p")),\"added_p99_ms\":$(agg median %.3f $(vals R_SSE_ADD99 "$p")),\
\"added_p99_ms_min\":$(agg min %.3f $(vals R_SSE_ADD99 "$p")),\"added_p99_ms_max\":$(agg max %.3f $(vals R_SSE_ADD99 "$p"))}"
  fi
done

base_ok=0
[[ ${A_STATUS[$BASELINE]:-} == ok ]] && base_ok=1
overall=0
fmt='%-23s %9s %8s %8s %7s %9s %13s %6s %6s %8s %8s %8s  %s\n'
printf "\n$fmt" peer 'req/s' 'p50 ms' 'p99 ms' errors 'CPU us/r' 'CPU min-max' 'core%' 'new-up' \
  'be-sleep' 'rps/hap' 'cpu/hap' status
rows_json=()
for p in "${PEERS[@]}"; do
  st=${A_STATUS[$p]}
  [[ $st == ok ]] || overall=1
  rr=null cr=null
  if ((base_ok)) && [[ ${A_RPS[$p]} != null ]]; then
    rr=$(ratio "${A_RPS[$p]}" "${A_RPS[$BASELINE]}")
    cr=$(ratio "${A_CPU[$p]}" "${A_CPU[$BASELINE]}")
  fi
  range=-
  [[ ${A_CPUMIN[$p]} != null ]] && range="${A_CPUMIN[$p]}-${A_CPUMAX[$p]}"
  printf "$fmt" "$p" \
    "$(show "${A_RPS[$p]}")" "$(show "${A_P50[$p]}")" "$(show "${A_P99[$p]}")" \
    "$(show "${A_ERRS[$p]}")" "$(show "${A_CPU[$p]}")" "$range" "$(show "${A_CORE[$p]}")" \
    "$(show "${A_NEWC[$p]}")" "$(show "${A_BSLEEP[$p]}")" "$(show "$rr")" "$(show "$cr")" \
    "$st${A_ERR[$p]:+: ${A_ERR[$p]}}"

  rounds_json=()
  for ((r = 1; r <= ROUNDS; r++)); do
    k="$p#$r"
    sse_json=null
    if [[ -n ${R_SSE_ADD99[$k]:-} ]]; then
      sse_json="{\"via_proxy\":{\"requests\":${R_SSE_PX_REQ[$k]},\"p50_ms\":${R_SSE_PX_P50[$k]},\"p99_ms\":${R_SSE_PX_P99[$k]},\"max_ms\":${R_SSE_PX_MAX[$k]}},\
\"direct\":{\"requests\":${R_SSE_DI_REQ[$k]},\"p50_ms\":${R_SSE_DI_P50[$k]},\"p99_ms\":${R_SSE_DI_P99[$k]},\"max_ms\":${R_SSE_DI_MAX[$k]}},\
\"added_p50_ms\":${R_SSE_ADD50[$k]},\"added_p99_ms\":${R_SSE_ADD99[$k]}}"
    fi
    err_json=null
    [[ -n ${R_ERR[$k]:-} ]] && err_json=$(json_str "${R_ERR[$k]}")
    rounds_json+=("{\"round\":$r,\"status\":\"${R_STATUS[$k]:-failed}\",\"error\":$err_json,\
\"requests\":$(nz "${R_REQ[$k]:-}"),\"duration_s\":$(nz "${R_DUR[$k]:-}"),\"rps\":$(nz "${R_RPS[$k]:-}"),\
\"p50_ms\":$(nz "${R_P50[$k]:-}"),\"p99_ms\":$(nz "${R_P99[$k]:-}"),\"max_ms\":$(nz "${R_MAX[$k]:-}"),\
\"errors_total\":$(nz "${R_ERRS[$k]:-}"),\"errors\":$(nz "${R_ERRJSON[$k]:-}"),\
\"proxy_cpu_us_per_req\":$(nz "${R_CPU[$k]:-}"),\"proxy_core_busy_pct\":$(nz "${R_CORE[$k]:-}"),\
\"backend_cpu_us_per_req\":$(nz "${R_BCPU[$k]:-}"),\"backend_sleeps_per_1k_req\":$(nz "${R_BSLEEP[$k]:-}"),\"load_core_busy_pct\":$(nz "${R_LCORE[$k]:-}"),\
\"other_processes_busy_pct\":$(nz "${R_OTHER[$k]:-}"),\
\"new_upstream_conns\":$(nz "${R_NEWC[$k]:-}"),\"backend_accepts\":$(nz "${R_ACC[$k]:-}"),\
\"backend_requests\":$(nz "${R_SHARE[$k]:-}"),\"pending_calls\":$(nz "${R_PEND[$k]:-}"),\
\"confirmed_calls\":$(nz "${R_CONF[$k]:-}"),\"proxy_threads\":$(nz "${R_THREADS[$k]:-}"),\
\"router_metrics\":$(nz "${R_METRICS[$k]:-}"),\"sse_probe\":$sse_json}")
  done
  err_json=null
  [[ -n ${A_ERR[$p]} ]] && err_json=$(json_str "${A_ERR[$p]}")
  rounds_joined=$(IFS=,; echo "${rounds_json[*]}")
  rows_json+=("    {\"peer\":\"$p\",\"description\":$(json_str "${DESC[$p]}"),\"status\":\"$st\",\"error\":$err_json,\
\"rounds_ok\":${A_OKR[$p]},\"rps\":${A_RPS[$p]},\"p50_ms\":${A_P50[$p]},\"p99_ms\":${A_P99[$p]},\"max_ms\":${A_MAX[$p]},\
\"errors_total\":${A_ERRS[$p]},\"proxy_cpu_us_per_req\":${A_CPU[$p]},\
\"proxy_cpu_us_per_req_min\":${A_CPUMIN[$p]},\"proxy_cpu_us_per_req_max\":${A_CPUMAX[$p]},\
\"proxy_core_busy_pct\":${A_CORE[$p]},\"backend_cpu_us_per_req\":${A_BCPU[$p]},\"backend_sleeps_per_1k_req\":${A_BSLEEP[$p]},\
\"load_core_busy_pct\":${A_LCORE[$p]},\"other_processes_busy_pct_max\":${A_OTHER[$p]},\"new_upstream_conns\":${A_NEWC[$p]},\"proxy_threads\":${A_THREADS[$p]},\
\"rps_vs_baseline\":$rr,\"cpu_vs_baseline\":$cr,\"sse_probe\":${A_SSE[$p]},\
\"rounds\":[$rounds_joined]}")
done
echo
echo "Each number is the median over $ROUNDS round(s); the rounds ran interleaved (every row once per round)."
echo "req/s, p50/p99: wrk (1 thread, $CONNS conns, ${DURATION}s after ${WARMUP}s warm-up). CPU us/r: proxy utime+stime per request; CPU min-max over the rounds."
echo "core%: busy share of the proxy's core. new-up: upstream connections opened during the run that carried requests (max over rounds)."
echo "be-sleep: times the backend nginx went to sleep per 1000 requests (each one a wake-up the proxy paid for in its send): fewer means the proxy sends in bursts."
echo "errors: sum over the rounds. rps/hap, cpu/hap: ratio of the medians to $BASELINE. direct has no proxy: its new-up are wrk's own connections."

noisy=()
for p in "${PEERS[@]}"; do
  for ((r = 1; r <= ROUNDS; r++)); do
    k="$p#$r"
    awk -v b="${R_OTHER[$k]:-null}" 'BEGIN { exit !(b != "null" && b > 10) }' && noisy+=("$p round $r: ${R_OTHER[$k]}%")
  done
done
if ((${#noisy[@]} > 0)); then
  echo "WARNING: other processes used more than 10% of the machine during: $(IFS=,; echo "${noisy[*]}" | sed 's/,/, /g')"
fi

sse_rows=()
for p in "${PEERS[@]}"; do [[ ${A_SSE[$p]} != null ]] && sse_rows+=("$p"); done
if ((${#sse_rows[@]} > 0)); then
  sfmt='%-23s %10s %10s %11s %11s %10s %10s %15s\n'
  echo
  echo "SSE answer latency, ms (bench/sse.lua: $SSE_CONNS conns, ${SSE_PAUSE_MS} ms pause between requests, run next to the mix load; medians over rounds)"
  printf "$sfmt" peer 'proxy p50' 'proxy p99' 'direct p50' 'direct p99' 'added p50' 'added p99' 'added p99 range'
  get() { local x=${sse#*\"$1\":}; echo "${x%%[,\}]*}"; }  # one number from the $sse object
  for p in "${sse_rows[@]}"; do
    sse=${A_SSE[$p]}
    printf "$sfmt" "$p" "$(get via_proxy_p50_ms)" "$(get via_proxy_p99_ms)" "$(get direct_p50_ms)" \
      "$(get direct_p99_ms)" "$(get added_p50_ms)" "$(get added_p99_ms)" \
      "$(get added_p99_ms_min) to $(get added_p99_ms_max)"
  done
  echo "added = (through the proxy) - (straight to a backend), per round, for the same percentile: the proxy's share of an SSE answer's latency."
  for p in "${sse_rows[@]}"; do
    [[ $p == *-awake ]] || continue
    echo "-awake rows: both cores held out of halt by an idle-class busy loop, so a packet never waits for a halted vCPU to be woken by the host (bench/README.md)."
    break
  done
fi

mkdir -p "$(dirname "$RESULTS")"
{
  echo "{"
  echo "  \"generated_at\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
  echo "  \"ok\": $( ((overall == 0)) && echo true || echo false),"
  echo "  \"baseline\": \"$BASELINE\","
  echo "  \"aggregation\": \"per row: median over rounds of rps, p50_ms, p99_ms, proxy_cpu_us_per_req, proxy_core_busy_pct, backend_cpu_us_per_req, load_core_busy_pct and the SSE numbers; max_ms, new_upstream_conns and proxy_threads are the max, errors_total the sum; every round's raw numbers are in rounds[]\","
  echo "  \"settings\": {\"smoke\": $( [[ $SMOKE == 1 ]] && echo true || echo false), \"rounds\": $ROUNDS, \"duration_s\": $DURATION, \"warmup_s\": $WARMUP, \"connections\": $CONNS, \"wrk_threads\": 1, \"pending_pct\": $PENDING_PCT, \"sse_probe\": $( ((SSE_PROBE)) && echo true || echo false), \"sse_connections\": $SSE_CONNS, \"sse_pause_ms\": $SSE_PAUSE_MS, \"load_cpus\": \"$LOAD_CPUS\", \"proxy_cpus\": \"$PROXY_CPUS\", \"proxy_cpus_2w\": \"$PROXY_CPUS_2W\", \"clk_tck\": $CLK_TCK, \"nproc\": $NPROC, \"nginx_keepalive\": $NGINX_KEEPALIVE, \"router_bin\": $(json_str "$ROUTER_BIN"), \"router_bin_modified\": $ROUTER_BIN_MTIME, \"router_bin_sha256_16\": $ROUTER_BIN_SHA, \"busy_pct_before_run\": $IDLE_CHECK, \"wall_time_s\": $SECONDS},"
  echo "  \"versions\": {\"wrk\": \"$(wrk -v 2>&1 | head -n1 | awk '{print $2}')\", \"haproxy\": \"$(haproxy -v 2>&1 | head -n1 | awk '{print $3}')\", \"nginx\": \"$(nginx -v 2>&1 | sed 's|.*/||')\", \"kernel\": \"$(uname -r)\", \"repo_commit_at_start\": \"$REPO_COMMIT\", \"repo_src_dirty_at_start\": $REPO_DIRTY},"
  echo "  \"rows\": ["
  n=${#rows_json[@]}
  for ((i = 0; i < n; i++)); do
    if ((i + 1 < n)); then echo "${rows_json[$i]},"; else echo "${rows_json[$i]}"; fi
  done
  echo "  ]"
  echo "}"
} >"$RESULTS"
echo "results: $RESULTS (wall time ${SECONDS}s)"
if ((overall != 0)); then
  echo "bench: FAILED: at least one row failed in at least one round (see status column)" >&2
  exit 1
fi
