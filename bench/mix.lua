-- wrk script for bench/run.sh: two-round MCP traffic (the routing-id dialect,
-- docs/src/dialects.md).
--
-- A share of new calls (default 20%) is two-round: the first request carries
-- `X-Bench-Phase: pending`, and the bench backend answers it with
--   {"jsonrpc":"2.0","id":<same id>,"messageId":"<same messageId>","result":{"pending":true}}
-- Once that answer has arrived, the thread queues a `confirm` follow-up with the same messageId
-- (and, in header mode, the same Mcp-Routing-Id). Queued confirms go out before new calls.
-- Every backend answer names the backend (`X-Bench-Backend`) and echoes `X-Bench-Message-Id`
-- and `X-Bench-Phase`, so the script checks that each confirm reached the backend that answered
-- its pending round; any other backend counts as `misrouted` (bench/run.sh treats it as an error).
--
--   wrk -t1 -c64 -d10s --latency -s bench/mix.lua http://127.0.0.1:18080/mcp -- body 20
--
-- Arguments (after `--`): key mode `body` (default: messageId only) or `header`
-- (Mcp-Routing-Id + messageId), then the percentage of new calls that are two-round, then a
-- mean pause in ms between an answer and the next request on each connection (default 0: as
-- fast as the proxy answers; the `-paced` rows use it to hold the offered load below saturation).

local threads = {}

function setup(thread)
   threads[#threads + 1] = thread
   thread:set("thread_no", #threads)
end

local CALL = '{"jsonrpc":"2.0","id":%d,"messageId":"%s","method":"tools/call",'
   .. '"params":{"name":"transfer-funds","arguments":{"to":"123-456-789","amount":500000,'
   .. '"currency":"EUR","reference":"invoice 2026-0042 for consulting services rendered",'
   .. '"note":"quarterly settlement, second tranche, approved by the finance committee"}}}'
local CONFIRM = '{"jsonrpc":"2.0","id":%d,"messageId":"%s","method":"confirm",'
   .. '"params":{"approved":true}}'

function init(args)
   mode = args[1] or "body"
   if mode ~= "header" and mode ~= "body" then
      error("mix.lua: key mode must be 'header' or 'body', got '" .. tostring(mode) .. "'")
   end
   pending_pct = tonumber(args[2] or "20")
   if pending_pct == nil or pending_pct < 0 or pending_pct > 100 then
      error("mix.lua: pending percentage must be 0..100")
   end
   local pause = tonumber(args[3] or "0")
   if pause == nil or pause < 0 then
      error("mix.lua: the pause must be a number of ms >= 0")
   end
   if pause > 0 then
      -- wrk looks for delay() after init(): defined only when asked for, so the unpaced rows
      -- pay nothing for it. Uniform in [0, 2 * pause]: equal pauses would keep the connections
      -- in step, and the load would arrive in bursts of one request per connection.
      delay = function() return math.random() * 2 * pause end
   end
   math.randomseed(os.time() * 1009 + 7919 * (thread_no or 1))
   seq = 0
   -- FIFO of messageIds whose pending answer arrived and that still need their confirm.
   queue, qhead, qtail = {}, 1, 0
   owner = {}      -- messageId -> backend that answered its pending round
   pending, confirmed, misrouted = 0, 0, 0
   hdrs = {
      ["Content-Type"] = "application/json",
      ["Accept"] = "application/json, text/event-stream",
   }
end

local function new_key()
   return string.format("m-%08x%08x", math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
end

function request()
   seq = seq + 1
   local key, body, phase
   if qhead <= qtail then
      key = queue[qhead]
      queue[qhead] = nil
      qhead = qhead + 1
      phase = "confirm"
      body = string.format(CONFIRM, seq, key)
   else
      key = new_key()
      phase = (math.random() * 100 < pending_pct) and "pending" or "single"
      body = string.format(CALL, seq, key)
   end
   hdrs["X-Bench-Phase"] = phase
   hdrs["X-Bench-Rpc-Id"] = seq           -- the backend echoes it as the answer's JSON-RPC id
   hdrs["X-Bench-Message-Id"] = key
   if mode == "header" then
      hdrs["Mcp-Routing-Id"] = key
   end
   return wrk.format("POST", nil, hdrs, body)
end

-- wrk keeps header names as received: nginx sends them as configured, HAProxy and hyper send
-- them in lower case (HTTP header names are case-insensitive).
local function header(headers, canonical, lower)
   return headers[lower] or headers[canonical]
end

function response(status, headers, body)
   if status ~= 200 then return end           -- counted by wrk itself when > 399
   local phase = header(headers, "X-Bench-Phase", "x-bench-phase")
   local id = header(headers, "X-Bench-Message-Id", "x-bench-message-id")
   if phase == nil or id == nil then return end
   local backend = header(headers, "X-Bench-Backend", "x-bench-backend")
   if phase == "pending" then
      pending = pending + 1
      owner[id] = backend
      qtail = qtail + 1
      queue[qtail] = id
   elseif phase == "confirm" then
      confirmed = confirmed + 1
      if owner[id] ~= backend then
         misrouted = misrouted + 1
      end
      owner[id] = nil
   end
end

function done(summary, latency, requests)
   local mis, pen, con = 0, 0, 0
   for _, t in ipairs(threads) do
      mis = mis + (t:get("misrouted") or 0)
      pen = pen + (t:get("pending") or 0)
      con = con + (t:get("confirmed") or 0)
   end
   local e = summary.errors
   io.write(string.format(
      "BENCH_RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d max_us=%d connect=%d read=%d"
         .. " write=%d status=%d timeout=%d misrouted=%d pending=%d confirmed=%d\n",
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
      latency.max, e.connect, e.read, e.write, e.status, e.timeout, mis, pen, con))
end
