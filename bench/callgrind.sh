#!/usr/bin/env bash
# User-space instructions per proxied request, counted by valgrind's callgrind: a number that,
# unlike CPU time on a shared VM, comes out the same run after run (±1%). It leaves out the
# kernel (two thirds of every proxy's cost here, see docs/src/benchmarks.md).
#
#   bench/callgrind.sh                 # mrtr-router (header-keyed), HAProxy and hyper-floor, side by side
#   BENCH_CG_PEERS=mrtr bench/callgrind.sh
#   BENCH_CG_PEERS="mrtr haproxy nginx floor" bench/callgrind.sh   # nginx as the proxy too
#   BENCH_CG_LOAD=body BENCH_CG_PEERS=mrtr bench/callgrind.sh       # body-keyed (key only in messageId)
#   BENCH_CG_LOAD=h2c BENCH_CG_PEERS="mrtr haproxy" bench/callgrind.sh   # HTTP/2 clients: h2load, 8
#     connections x 16 streams, prior knowledge, as bench/run.py's *-h2c rows (one key per run)
#   BENCH_CG_PEERS="floor floor-scan" bench/callgrind.sh   # hyper-floor, and the floor that also
#     reads each body whole and runs the router's envelope scan on it (examples/hyper_floor_scan.rs);
#     with BENCH_CG_LOAD=h2c, floor is the HTTP/2 listener's floor (examples/hyper_floor_h2c.rs)
#   BENCH_CG_UPSTREAM=tls BENCH_CG_PEERS="mrtr haproxy nginx" bench/callgrind.sh   # HTTPS to the backends
#     (as bench/run.py's *-upstream-tls rows: a test CA made here, the certificate for bench.test,
#     verified); BENCH_CG_UPSTREAM=h2c: HTTP/2 with prior knowledge (mrtr and haproxy only)
#   BENCH_CG_AUTH=ES256 BENCH_CG_PEERS=mrtr bench/callgrind.sh   # [auth] on: every request carries an
#     access token (RS256, ES256 or EdDSA) the router verifies, from examples/bench_token.rs (build
#     it: `cargo build --release --example bench_token`); BENCH_CG_AUTH=garbage sends text that is
#     no token, BENCH_CG_AUTH=forged an ES256 token with a wrong signature (the dearest refusal:
#     every claim checks out, so the signature is verified); the router answers both 401
#   BENCH_CG_CACHE=1 bench/callgrind.sh   # also simulates the caches and branch predictor (slower):
#     I1/D1 misses, mispredicts and hot code KiB per request (bench/cg_cache.py, docs/src/benchmarks.md)
#   BENCH_CG_TOOLS=same BENCH_CG_ROUTER_EXTRA=$'[catalog]\nenabled = true' BENCH_CG_PEERS=mrtr bench/callgrind.sh
#     # the backends list the called tool to the catalog's asks (`drift`: the first one with another
#     # inputSchema, so each call's arguments are checked): a call of a known tool, routed by it
#   BENCH_CG_ROUTER_EXTRA=$'[log]\naccess = true' BENCH_CG_PEERS=mrtr bench/callgrind.sh   # config appended
#     to the router's (the backends' nginx also takes OTLP exports at /v1/traces, so
#     BENCH_CG_ROUTER_EXTRA=$'[tracing]\notlp_endpoint = "http://127.0.0.1:<BASE+1>"' measures tracing on)
#
# Starts three nginx backends (the bench's fixed JSON-RPC answer), runs each proxy under
# callgrind, warms it up with wrk for 2 s, zeroes the counters, drives it for 8 s
# (1 thread, 16 connections, bench/mcp.lua header-keyed), dumps the counters and divides by the
# requests wrk completed. Leaves the callgrind files in $BENCH_CG_DIR for callgrind_annotate.
# Needs valgrind, wrk, nginx, haproxy (Debian packages) and a release build of the router and of
# the examples/hyper_floor*.rs floors (`cargo build --release --bins --example hyper_floor
# --example hyper_floor_h2c --example hyper_floor_scan`).
set -euo pipefail

REPO_DIR=$(cd "$(dirname "$0")/.." && pwd)
BENCH_DIR=$REPO_DIR/bench
ROUTER_BIN=${BENCH_ROUTER_BIN:-$REPO_DIR/target/release/mrtr-router}
FLOOR_BIN=${BENCH_FLOOR_BIN:-$(dirname "$ROUTER_BIN")/examples/hyper_floor}
PEERS=${BENCH_CG_PEERS:-mrtr haproxy floor}
LOAD=${BENCH_CG_LOAD:-header}   # bench/mcp.lua's argument (header or body), or h2c (h2load)
UPSTREAM=${BENCH_CG_UPSTREAM:-h1}  # what the proxies speak to the backends: h1, tls or h2c
OUT=${BENCH_CG_DIR:-$(mktemp -d /tmp/mrtr-callgrind.XXXXXX)}
# Ports of their own (BENCH_CG_PORT_BASE, default 27100), so a bench run elsewhere on the machine
# cannot answer in the measured proxy's place.
BASE=${BENCH_CG_PORT_BASE:-27100}
PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)))
PROXY_PORT=$((BASE + 80))
ADMIN_PORT=$((BASE + 90))

die() { echo "callgrind: error: $*" >&2; exit 2; }

CG_ARGS=(--tool=callgrind)
case ${BENCH_CG_CACHE:-0} in
  0) ;;
  1) CG_ARGS+=(--cache-sim=yes --branch-sim=yes --dump-instr=yes) ;;
  *) die "BENCH_CG_CACHE is 0 or 1, not '$BENCH_CG_CACHE'" ;;
esac

for tool in valgrind callgrind_control wrk nginx haproxy curl; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found (apt-get install valgrind wrk nginx haproxy curl)"
done
[[ -x $ROUTER_BIN ]] || die "no router binary at $ROUTER_BIN (cargo build --release)"
mkdir -p "$OUT/tmp"

# The backends' listen flag, and each proxy's lines for the upstream protocol.
BACKEND_LISTEN="" BACKEND_TLS="" ROUTER_SCHEME=http ROUTER_UPSTREAM="" ROUTER_BACKEND_EXTRA=""
HAPROXY_SERVER_OPTS="" NGINX_SCHEME=http NGINX_UPSTREAM_TLS=""
HAPROXY_BIND_OPTS=""
case $LOAD in
  header | body) ;;
  h2c)
    command -v h2load >/dev/null 2>&1 || die "h2load not found (apt-get install nghttp2-client)"
    HAPROXY_BIND_OPTS=" proto h2"
    # The ~300-byte tools/call of bench/mcp.lua, its key in Mcp-Routing-Id and messageId.
    printf '{"jsonrpc":"2.0","id":1,"messageId":"cg-h2c-1","method":"tools/call","params":{"name":"search-documents","arguments":{"query":"quarterly revenue by region","limit":20,"filters":{"department":"finance","year":2026,"status":["final","approved"]},"format":"table","include_archived":false,"locale":"en-US"}}}' \
      >"$OUT/h2c-body.json" ;;
  *) die "BENCH_CG_LOAD: header, body or h2c (not '$LOAD')" ;;
esac
case $UPSTREAM in
  h1) ;;
  tls)
    command -v openssl >/dev/null 2>&1 || die "openssl not found (apt-get install openssl)"
    EC=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2)
    openssl req -x509 "${EC[@]}" -keyout "$OUT/ca.key" -out "$OUT/ca.pem" -subj "/CN=callgrind test CA" \
      >/dev/null 2>&1 || die "openssl: test CA"
    openssl req -x509 "${EC[@]}" -keyout "$OUT/backend.key" -out "$OUT/backend.pem" -subj "/CN=bench.test" \
      -CA "$OUT/ca.pem" -CAkey "$OUT/ca.key" -addext "subjectAltName=DNS:bench.test" \
      -addext "basicConstraints=critical,CA:FALSE" -addext "extendedKeyUsage=serverAuth" \
      >/dev/null 2>&1 || die "openssl: backend certificate"
    BACKEND_LISTEN=" ssl"
    BACKEND_TLS="ssl_certificate $OUT/backend.pem; ssl_certificate_key $OUT/backend.key; ssl_protocols TLSv1.2 TLSv1.3;"
    ROUTER_SCHEME=https
    ROUTER_UPSTREAM=$(printf '[upstream]\ntls_ca = "%s"' "$OUT/ca.pem")
    ROUTER_BACKEND_EXTRA='tls_server_name = "bench.test"'
    HAPROXY_SERVER_OPTS=" ssl verify required ca-file $OUT/ca.pem sni str(bench.test) verifyhost bench.test alpn http/1.1"
    NGINX_SCHEME=https
    NGINX_UPSTREAM_TLS="proxy_ssl_verify on; proxy_ssl_trusted_certificate $OUT/ca.pem; proxy_ssl_name bench.test;
      proxy_ssl_server_name on; proxy_ssl_session_reuse on; proxy_ssl_protocols TLSv1.2 TLSv1.3;" ;;
  h2c)
    BACKEND_LISTEN=" http2"
    ROUTER_UPSTREAM=$(printf '[upstream]\nhttp2 = true')
    HAPROXY_SERVER_OPTS=" proto h2" ;;
  *) die "BENCH_CG_UPSTREAM must be h1, tls or h2c, not '$UPSTREAM'" ;;
esac

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# The lines both nginx configs (backends, proxy) start their events and http blocks with.
NGINX_HTTP_START="events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $OUT/tmp; proxy_temp_path $OUT/tmp; fastcgi_temp_path $OUT/tmp;
  uwsgi_temp_path $OUT/tmp; scgi_temp_path $OUT/tmp;
  keepalive_requests 100000000;
  keepalive_timeout 600s;"

# The backends' answer: the same to every request, unless BENCH_CG_TOOLS says they list tools.
# With it, the catalog's asks (the 2026-07-28 way: `server/discover`, then `tools/list`, ids 1
# and 2) get a list of the tool bench/mcp.lua calls (`search-documents`);
# `drift`: the first backend defines it with another inputSchema, so every call of it is checked.
ANSWER='{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"ok"}]}}'
SCHEMA='{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer"}},"required":["query"]}'
OTHER='{"type":"object","properties":{"query":{"type":"integer"}},"required":["query"]}'
DISCOVER='{"jsonrpc":"2.0","id":1,"result":{"supportedVersions":["2026-07-28"],"capabilities":{"tools":{}}}}'
tools_answer() { printf '{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"search-documents","description":"bench","inputSchema":%s}]}}' "$1"; }
case ${BENCH_CG_TOOLS:-} in
  "") ANSWER_MAP="default '$ANSWER';" ;;
  same) ANSWER_MAP="default '$ANSWER'; ~^server/discover: '$DISCOVER'; ~^tools/list: '$(tools_answer "$SCHEMA")';" ;;
  drift) ANSWER_MAP="default '$ANSWER'; ~^server/discover: '$DISCOVER'; ~^tools/list:${PORTS[0]}\$ '$(tools_answer "$OTHER")'; ~^tools/list: '$(tools_answer "$SCHEMA")';" ;;
  *) die "BENCH_CG_TOOLS: same or drift (not '$BENCH_CG_TOOLS')" ;;
esac

cat >"$OUT/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $OUT/nginx.pid;
error_log $OUT/nginx-error.log warn;
${NGINX_HTTP_START}
  default_type application/json;
  map "\$http_mcp_method:\$server_port" \$answer { $ANSWER_MAP }
  server {
    listen 127.0.0.1:${PORTS[0]}$BACKEND_LISTEN; listen 127.0.0.1:${PORTS[1]}$BACKEND_LISTEN;
    listen 127.0.0.1:${PORTS[2]}$BACKEND_LISTEN;
    $BACKEND_TLS
    location = /mcp { return 200 \$answer; }
    location = /v1/traces { client_max_body_size 64m; return 200 ''; }
  }
}
EOF
nginx -c "$OUT/nginx.conf" >/dev/null 2>&1 &
PIDS+=($!)

cat >"$OUT/router.toml" <<EOF
[server]
listen = "127.0.0.1:$PROXY_PORT"
[admin]
listen = "127.0.0.1:$ADMIN_PORT"
$ROUTER_UPSTREAM
EOF
for i in 0 1 2; do
  printf '[[backend]]\nname = "b%d"\nurl = "%s://127.0.0.1:%d"\n%s\n' "$i" "$ROUTER_SCHEME" "${PORTS[$i]}" \
    "$ROUTER_BACKEND_EXTRA" >>"$OUT/router.toml"
done
# Extra router config (e.g. [log] access = true, or [tracing]), from BENCH_CG_ROUTER_EXTRA.
printf '%s\n' "${BENCH_CG_ROUTER_EXTRA:-}" >>"$OUT/router.toml"
# [auth] on, and the token every request carries (bench/mcp.lua and curl read it).
AUTH_HEADER=()
case ${BENCH_CG_AUTH:-} in
  "") ;;
  RS256 | ES256 | EdDSA | garbage | forged)
    MINT=$(dirname "$ROUTER_BIN")/examples/bench_token
    [[ -x $MINT ]] || die "no $MINT (cargo build --release --example bench_token)"
    alg=$BENCH_CG_AUTH; [[ $alg == garbage || $alg == forged ]] && alg=ES256
    token=$("$MINT" "$alg" "http://127.0.0.1:$PROXY_PORT/mcp" "$OUT/jwks.json") || die "bench_token"
    case $BENCH_CG_AUTH in
      garbage) token="Zm9vYmFyYmF6cXV4.not-a-token" ;;
      forged) token="${token%??????}AAAAAA" ;;
    esac
    export BENCH_AUTHORIZATION="Bearer $token"
    AUTH_HEADER=(-H "Authorization: $BENCH_AUTHORIZATION")
    printf '[auth]\nissuer = "https://idp.bench.test"\njwks_file = "%s"\n[auth.resource_metadata]\nresource = "http://127.0.0.1:%d/mcp"\n' \
      "$OUT/jwks.json" "$PROXY_PORT" >>"$OUT/router.toml" ;;
  *) die "BENCH_CG_AUTH: RS256, ES256, EdDSA, garbage or forged (not '$BENCH_CG_AUTH')" ;;
esac

cat >"$OUT/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend fe
  bind 127.0.0.1:$PROXY_PORT$HAPROXY_BIND_OPTS
  default_backend be
backend be
  balance hdr(Mcp-Routing-Id)
  hash-type consistent
  server b0 127.0.0.1:${PORTS[0]}$HAPROXY_SERVER_OPTS
  server b1 127.0.0.1:${PORTS[1]}$HAPROXY_SERVER_OPTS
  server b2 127.0.0.1:${PORTS[2]}$HAPROXY_SERVER_OPTS
EOF

# nginx as the proxy, as in bench/run.sh's nginx-header row; one process (no master) so that
# callgrind sees the worker.
mkdir -p "$OUT/nginx-proxy"
cat >"$OUT/nginx-proxy.conf" <<EOF
worker_processes 1;
master_process off;
daemon off;
pid $OUT/nginx-proxy.pid;
error_log $OUT/nginx-proxy-error.log warn;
${NGINX_HTTP_START}
  upstream mcp {
    hash \$http_mcp_routing_id consistent;
    server 127.0.0.1:${PORTS[0]}; server 127.0.0.1:${PORTS[1]}; server 127.0.0.1:${PORTS[2]};
    keepalive 48;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
  }
  server {
    listen 127.0.0.1:$PROXY_PORT;
    location / {
      proxy_pass $NGINX_SCHEME://mcp;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      $NGINX_UPSTREAM_TLS
    }
  }
}
EOF

ready() {  # ready: the proxy answers a request (bounded: 30 s under valgrind)
  local proto=()
  [[ $LOAD != h2c ]] || proto=(--http2-prior-knowledge)
  for _ in $(seq 1 150); do
    local ok=(-f); [[ ${BENCH_CG_AUTH:-} == garbage || ${BENCH_CG_AUTH:-} == forged ]] && ok=()  # 401: up all the same
    curl -s "${ok[@]}" "${proto[@]}" "${AUTH_HEADER[@]}" -o /dev/null -X POST -H 'Content-Type: application/json' \
      --data '{"jsonrpc":"2.0","id":1,"method":"ping"}' "http://127.0.0.1:$PROXY_PORT/mcp" && return 0
    sleep 0.2
  done
  return 1
}

load() {  # load <seconds>: the client load on the proxy, its report on stdout
  case $LOAD in
    h2c) timeout $(($1 + 30)) h2load -t1 -c8 -m16 -D "$1" -H 'content-type: application/json' \
           -H 'accept: application/json, text/event-stream' -H 'mcp-routing-id: cg-h2c-1' "${AUTH_HEADER[@]}" \
           -d "$OUT/h2c-body.json" "http://127.0.0.1:$PROXY_PORT/mcp" ;;
    *) wrk -t1 -c16 -d"$1"s -s "$BENCH_DIR/mcp.lua" "http://127.0.0.1:$PROXY_PORT/mcp" -- "$LOAD" ;;
  esac
}

measure() {  # measure <name> <command...>
  local name=$1; shift
  valgrind "${CG_ARGS[@]}" --callgrind-out-file="$OUT/$name.%p" "$@" >"$OUT/$name.log" 2>&1 &
  local vp=$!
  PIDS+=("$vp")
  ready || die "$name did not answer under valgrind (see $OUT/$name.log)"
  load 2 >/dev/null
  callgrind_control -z "$vp" >/dev/null 2>&1
  load 8 >"$OUT/$name.load"
  callgrind_control -d "$vp" >/dev/null 2>&1
  kill "$vp"; wait "$vp" 2>/dev/null || true
  local req ir
  case $LOAD in
    h2c) # Only answered 2xx requests count; any other answer fails the run.
      grep -q ' 0 failed, 0 errored, 0 timeout' "$OUT/$name.load" || die "$name: h2load saw failures (see $OUT/$name.load)"
      req=$(grep -oP 'status codes: \K[0-9]+(?= 2xx)' "$OUT/$name.load") ;;
    *) req=$(grep -oP 'requests=\K[0-9]+' "$OUT/$name.load") ;;
  esac
  # This run's dump only: valgrind keeps the pid, and $OUT may hold older runs' files.
  ir=$(grep -h '^summary:\|^totals:' "$OUT/$name.$vp.1" | tail -1 | awk '{print $2}')
  [[ -n $req && $req -gt 0 && -n $ir ]] || die "$name: no measurement (see $OUT)"
  printf '%-10s %-6s %-4s requests %7d   instructions/request %7d\n' "$name" "$LOAD" "$UPSTREAM" "$req" $((ir / req))
  if [[ ${#CG_ARGS[@]} -gt 1 ]]; then
    printf '%-10s ' "$name"
    python3 "$BENCH_DIR/cg_cache.py" "$OUT/$name.$vp.1" "$req" || die "$name: bench/cg_cache.py failed"
  fi
}

for peer in $PEERS; do
  case $peer in
    mrtr) MRTR_WORKER_THREADS=1 measure mrtr "$ROUTER_BIN" --config "$OUT/router.toml" ;;
    haproxy) measure haproxy haproxy -f "$OUT/haproxy.cfg" -db ;;
    nginx)
      [[ $UPSTREAM != h2c ]] || die "nginx cannot proxy HTTP/2 to its backends (BENCH_CG_UPSTREAM=h2c)"
      measure nginx nginx -p "$OUT/nginx-proxy" -c "$OUT/nginx-proxy.conf" ;;
    floor | floor-scan)
      [[ $UPSTREAM == h1 ]] || die "hyper-floor speaks HTTP/1.1 in clear text only (BENCH_CG_UPSTREAM=$UPSTREAM)"
      # floor-scan: each body read whole and scanned (examples/hyper_floor_scan.rs); under h2c
      # load the floor's listener speaks HTTP/2 (examples/hyper_floor_h2c.rs).
      bin=$FLOOR_BIN
      [[ $peer != floor-scan ]] || bin=$(dirname "$FLOOR_BIN")/hyper_floor_scan
      if [[ $LOAD == h2c ]]; then
        [[ $peer == floor ]] || die "floor-scan has no HTTP/2 listener (BENCH_CG_LOAD=h2c: floor only)"
        bin=$(dirname "$FLOOR_BIN")/hyper_floor_h2c
      fi
      [[ -x $bin ]] || die "no $bin (cargo build --release --example hyper_floor --example $(basename "$bin"))"
      measure "$peer" "$bin" "127.0.0.1:$PROXY_PORT" \
        "127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]}" ;;
    *) die "unknown peer '$peer' (mrtr, haproxy, nginx, floor, floor-scan)" ;;
  esac
done
echo "callgrind files: $OUT (callgrind_annotate --inclusive=yes $OUT/<peer>.<pid>.1)"
