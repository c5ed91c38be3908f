-- wrk script for the harness's big-body rows (bench/harness/rows.py: *-body-64k, *-body-1m).
--
-- Every call is a body-keyed `tools/call` of exactly <size> bytes whose `messageId` is the LAST
-- member of the JSON object, after a large `arguments.content` string: a proxy that routes on
-- messageId has to read (and scan) the whole body to find the key. HAProxy's
-- `json_query('$.messageId')` sees only what fits in its buffer (`tune.bufsize`, 16 KiB by
-- default), so with the default buffer it misses the key.
--
--   wrk -t1 -c64 -d8s --latency -s bench/big.lua http://127.0.0.1:18080/mcp -- 65536
--
-- Misroutes are measured the way mix.lua does: each new key is sent twice. The first answer
-- names its backend (`X-Bench-Backend`, echoed `X-Bench-Message-Id` and `X-Bench-Phase` from the
-- bench backend); the key is then queued for a `repeat` with the same body, and a repeat answered
-- by another backend counts as `misrouted`. A proxy that hashes the key always sends both to the
-- same backend; one that cannot see the key falls back to another rule (HAProxy: round robin)
-- and splits them. Argument (after `--`): the body size in bytes (default 65536, at least 512).
-- done() prints the usual BENCH_RESULT line; `pending` is the number of first sends, `confirmed`
-- the number of repeats checked.

local threads = {}

function setup(thread)
   threads[#threads + 1] = thread
   thread:set("thread_no", #threads)
end

-- The body up to the padding, and after it; the key (18 characters, "b-" + 16 hex digits) and
-- the id (10 digits) are the only parts that change, and their lengths are fixed.
local HEAD = '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"upload-document",'
   .. '"arguments":{"title":"quarterly report","content":"'
local TAIL = '"}},"messageId":"%s"}'
local KEY_LEN = 18

function init(args)
   size = tonumber(args[1] or "65536")
   if size == nil or size < 512 then
      error("big.lua: the body size must be a number of bytes >= 512")
   end
   local fixed = #string.format(HEAD, 1000000000) + #string.format(TAIL, string.rep("k", KEY_LEN))
   -- Filler that looks like document text; one string built once, shared by every request.
   local filler = string.rep("lorem ipsum dolor sit amet ", math.ceil((size - fixed) / 27) + 1)
   pad = filler:sub(1, size - fixed)
   math.randomseed(os.time() * 1009 + 7919 * (thread_no or 1) + 17)
   seq = 0
   queue, qhead, qtail = {}, 1, 0
   owner = {}
   pending, confirmed, misrouted = 0, 0, 0
   hdrs = {
      ["Content-Type"] = "application/json",
      ["Accept"] = "application/json, text/event-stream",
   }
end

local function new_key()
   return string.format("b-%08x%08x", math.random(0, 0x7fffffff), math.random(0, 0x7fffffff))
end

function request()
   seq = seq + 1
   local key, phase
   if qhead <= qtail then
      key = queue[qhead]
      queue[qhead] = nil
      qhead = qhead + 1
      phase = "repeat"
   else
      key = new_key()
      phase = "first"
   end
   hdrs["X-Bench-Phase"] = phase
   hdrs["X-Bench-Message-Id"] = key
   -- ids of 10 digits (no leading zero: JSON has none), so every body has the same length
   local body = string.format(HEAD, 1000000000 + seq % 1000000000) .. pad .. string.format(TAIL, key)
   return wrk.format("POST", nil, hdrs, body)
end

local function header(headers, canonical, lower)
   return headers[lower] or headers[canonical]
end

function response(status, headers, body)
   if status ~= 200 then return end           -- counted by wrk itself when > 399
   local phase = header(headers, "X-Bench-Phase", "x-bench-phase")
   local id = header(headers, "X-Bench-Message-Id", "x-bench-message-id")
   if phase == nil or id == nil then return end
   local backend = header(headers, "X-Bench-Backend", "x-bench-backend")
   if phase == "first" then
      pending = pending + 1
      owner[id] = backend
      qtail = qtail + 1
      queue[qtail] = id
   elseif phase == "repeat" then
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
