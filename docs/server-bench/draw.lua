-- wrk script: POST /lottery/draw with a fresh user per request (one draw per user and
-- activity is the rule), so every draw is a full Try/Confirm-or-Cancel transaction.
-- Thread k draws users k*10,000,000 + 1, 2, ...; accounts must be open (see run.sh).
local threads = 0
function setup(thread)
  thread:set("base", threads * 10000000)
  threads = threads + 1
end

function init(args)
  counter = base or 0
end

function request()
  counter = counter + 1
  local body = string.format('{"user":%d,"activity":1,"price_minor":100}', counter)
  return wrk.format("POST", "/lottery/draw", {["Content-Type"] = "application/json"}, body)
end
