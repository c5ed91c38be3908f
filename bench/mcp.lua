-- wrk script for bench/run.sh: single-round MCP traffic.
--
-- Every request is a POST of a ~300-byte JSON-RPC `tools/call` with a fresh random client key,
-- so no two requests share a key and a router keeps no state between them.
--
--   wrk -t1 -c64 -d10s --latency -s bench/mcp.lua http://127.0.0.1:18080/mcp -- header
--
-- Argument (after `--`):
--   header  key in the `Mcp-Routing-Id` header AND in the body's `messageId` (default)
--   body    key only in the body's `messageId` (the proxy must read the body to route)
--
-- done() prints one machine-readable line that bench/run.sh parses:
--   BENCH_RESULT requests=N duration_us=N p50_us=N p99_us=N max_us=N connect=N read=N write=N
--                status=N timeout=N misrouted=0 pending=0 confirmed=0
-- (`status` is wrk's count of responses with HTTP status > 399.)

local threads = {}

function setup(thread)
   threads[#threads + 1] = thread
   thread:set("thread_no", #threads)
end

-- ~300 bytes once the id and the 18-character key are filled in.
local BODY = '{"jsonrpc":"2.0","id":%d,"messageId":"%s","method":"tools/call",'
   .. '"params":{"name":"search-documents","arguments":{"query":"quarterly revenue by region",'
   .. '"limit":20,"filters":{"department":"finance","year":2026,"status":["final","approved"]},'
   .. '"fields":["title","author","updated","summary"]}}}'

function init(args)
   mode = args[1] or "header"
   if mode ~= "header" and mode ~= "body" then
      error("mcp.lua: key mode must be 'header' or 'body', got '" .. tostring(mode) .. "'")
   end
   math.randomseed(os.time() * 1009 + 7919 * (thread_no or 1))
   seq = 0
   hdrs = {
      ["Content-Type"] = "application/json",
      ["Accept"] = "application/json, text/event-stream",
   }
   -- With [auth] on (bench/callgrind.sh's BENCH_CG_AUTH): the access token every request carries.
   local authorization = os.getenv("BENCH_AUTHORIZATION")
   if authorization then
      hdrs["Authorization"] = authorization
   end
end

local function new_key()
   return string.format("k-%08x%08x", math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
end

function request()
   seq = seq + 1
   local key = new_key()
   if mode == "header" then
      hdrs["Mcp-Routing-Id"] = key
   end
   return wrk.format("POST", nil, hdrs, string.format(BODY, seq, key))
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "BENCH_RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d max_us=%d connect=%d read=%d"
         .. " write=%d status=%d timeout=%d misrouted=0 pending=0 confirmed=0\n",
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
      latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
