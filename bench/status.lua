-- wrk script: valid handoff.status posts, fresh ids, increasing seq per handoff.
--   wrk -t T -c C -d D -s bench/status.lua URL -- HANDOFFS TOKEN TAG T SEQ0
-- HANDOFFS has one "case key<TAB>handoff id" a line.  Thread t takes every
-- T-th handoff, so no two threads post about one handoff; within a thread
-- the handoffs go round in turn, each round with the next seq (from SEQ0 + 1), so a
-- handoff's next status is sent only after (#handoffs / T) other requests.
-- Every status is "negotiating" (allowed after requested and after itself,
-- and without "needs" it mails nobody).

local next_tid = 1
function setup(thread)
  thread:set("tid", next_tid)
  next_tid = next_tid + 1
end

local mine = {}
local sent = 0
local tag = "s"
local seq0 = 0

function init(args)
  local file, token, nthreads = args[1], args[2], tonumber(args[4])
  tag = args[3]
  seq0 = tonumber(args[5]) or 0
  local i = 0
  for line in io.lines(file) do
    if (i % nthreads) == (tid - 1) then
      local key, hid = line:match("^([^\t]+)\t([^\t]+)$")
      mine[#mine + 1] = { key, hid }
    end
    i = i + 1
  end
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. token
end

function request()
  local idx = sent % #mine + 1
  local seq = seq0 + math.floor(sent / #mine) + 1
  sent = sent + 1
  local h = mine[idx]
  local body = string.format(
    '{"mas_modes_version":"0.1","type":"handoff.status","id":"%s-%d-%d",'
      .. '"case":{"address":"%s","key":"%s"},"handoff_id":"%s","seq":%d,"status":"negotiating"}',
    tag, tid, sent, h[1], h[1], h[2], seq)
  return wrk.format(nil, nil, nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"non2xx":%d,"connect":%d,"read":%d,'
      .. '"write":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
