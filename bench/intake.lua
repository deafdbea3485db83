-- wrk script: every request is a new, pre-signed delivery read from a lines file.
--   wrk -t1 -c64 -d10s -s bench/intake.lua http://127.0.0.1:PORT -- LINES_FILE TEMPLATE_FILE THREADS
-- LINES_FILE: "<event id> <body token> <timestamp> <signature>" per line (bench/deliveries.py).
-- TEMPLATE_FILE: kind (stripe|clerk), path, body prefix, body suffix, one per line.
-- Thread i of n sends lines i, i+n, i+2n...; a thread that runs out starts over (counted as wraps).

local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local kind, path, prefix, suffix
local ids, tokens, stamps, sigs = {}, {}, {}, {}
local n, idx = 0, 0
wraps = 0

function init(args)
  local template = io.open(args[2], "r")
  kind = template:read("*l")
  path = template:read("*l")
  prefix = template:read("*l")
  suffix = template:read("*l")
  template:close()
  local nthreads = tonumber(args[3] or "1")
  local i = 0
  for line in io.lines(args[1]) do
    if i % nthreads == tid then
      local a, b, c, d = line:match("^(%S+) (%S+) (%S+) (%S+)$")
      n = n + 1
      ids[n], tokens[n], stamps[n], sigs[n] = a, b, c, d
    end
    i = i + 1
  end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  idx = idx + 1
  if idx > n then
    idx = 1
    wraps = wraps + 1
  end
  local headers = { ["Content-Type"] = "application/json" }
  if kind == "stripe" then
    headers["Stripe-Signature"] = "t=" .. stamps[idx] .. ",v1=" .. sigs[idx]
  else
    headers["svix-id"] = ids[idx]
    headers["svix-timestamp"] = stamps[idx]
    headers["svix-signature"] = "v1," .. sigs[idx]
  end
  return wrk.format("POST", path, headers, prefix .. tokens[idx] .. suffix)
end

function done(summary, latency, requests)
  local total_wraps = 0
  for _, thread in ipairs(threads) do
    total_wraps = total_wraps + (thread:get("wraps") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"errors_connect":%d,"errors_read":%d,"errors_write":%d,' ..
    '"errors_status":%d,"errors_timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f,' ..
    '"wraps":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean,
    total_wraps))
end
