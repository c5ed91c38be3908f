-- wrk script for bench/run.sh: paced SSE latency probe, run next to the mix rows.
--
-- Each request is a small `tools/call` with `X-Bench-Phase: sse`; the bench backend answers it
-- with `Content-Type: text/event-stream` and one event:
--   event: message
--   data: {"jsonrpc":"2.0","id":<X-Bench-Rpc-Id>,"result":{"content":[{"type":"text","text":"ok"}]}}
-- Every connection waits `interval` ms between an answer and its next request (wrk's delay();
-- the wait is not part of the latency wrk records), so the probe adds little load. bench/run.sh
-- runs it twice at once, through the proxy and straight to a backend, and reports the
-- difference of the two latency distributions as the latency the proxy adds to an SSE answer.
--
--   wrk -t1 -c2 -d8s --latency -s bench/sse.lua http://127.0.0.1:18080/mcp -- 5
--
-- Argument (after `--`): the pause between requests on one connection, in ms (default 5).
-- An answer that is not `text/event-stream` with a `data: {...}` event counts as `bad`
-- (bench/run.sh treats it as an error). done() prints the usual BENCH_RESULT line plus bad=N.

local threads = {}

function setup(thread)
   threads[#threads + 1] = thread
   thread:set("thread_no", #threads)
end

local BODY = '{"jsonrpc":"2.0","id":%d,"messageId":"%s","method":"tools/call",'
   .. '"params":{"name":"watch-progress","arguments":{"job":"bench"}}}'

function init(args)
   interval = tonumber(args[1] or "5")
   if interval == nil or interval < 0 then
      error("sse.lua: the pause must be a number of ms >= 0")
   end
   math.randomseed(os.time() * 1009 + 7919 * (thread_no or 1) + 31)
   seq = 0
   bad = 0
   hdrs = {
      ["Content-Type"] = "application/json",
      ["Accept"] = "application/json, text/event-stream",
      ["X-Bench-Phase"] = "sse",
   }
end

function delay()
   return interval
end

function request()
   seq = seq + 1
   local key = string.format("s-%08x%08x", math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
   hdrs["X-Bench-Rpc-Id"] = seq
   hdrs["X-Bench-Message-Id"] = key
   return wrk.format("POST", nil, hdrs, string.format(BODY, seq, key))
end

function response(status, headers, body)
   if status ~= 200 then return end           -- counted by wrk itself when > 399
   local ct = headers["content-type"] or headers["Content-Type"] or ""
   if ct:sub(1, 17):lower() ~= "text/event-stream" or not body:find("\ndata: {", 1, true) then
      bad = bad + 1
   end
end

function done(summary, latency, requests)
   local b = 0
   for _, t in ipairs(threads) do b = b + (t:get("bad") or 0) end
   local e = summary.errors
   io.write(string.format(
      "BENCH_RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d max_us=%d connect=%d read=%d"
         .. " write=%d status=%d timeout=%d misrouted=0 pending=0 confirmed=0 bad=%d\n",
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
      latency.max, e.connect, e.read, e.write, e.status, e.timeout, b))
end
