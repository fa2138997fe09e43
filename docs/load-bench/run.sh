#!/usr/bin/env bash
# Compare load with oha (constant rate, latency-corrected) and wrk (closed loop, max
# throughput) on GET /id/{tag} of one release sut-server. See docs/load.md.
# usage: docs/load-bench/run.sh [RATES...]   (needs target/release/{sut-server,examples/load})
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=target/release/sut-server
LG=target/release/examples/load
PORT=18090
URL=http://127.0.0.1:$PORT
OUT=${OUT:-/tmp/load-bench}
mkdir -p "$OUT"
DIR=$(mktemp -d)
"$BIN" --db "$DIR/ids.db" --listen 127.0.0.1:$PORT > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER; wait $SERVER; rm -rf "$DIR"' EXIT
sleep 1
curl -s -XPOST "$URL/admin/tags" -H 'content-type: application/json' -d '{"tag":"bench","step":100000}'; echo
RATES=${*:-2000 5000 10000}
for R in $RATES; do
  echo "== rate $R"
  oha -z 10s -q "$R" --latency-correction -c 64 --no-tui --output-format json "$URL/id/bench" > "$OUT/oha-$R.json"
  "$LG" id-single 64 "$R" 10 2 "$URL" > "$OUT/load-$R.json"
done
echo "== closed loop"
wrk -t1 -c64 -d10s --latency "$URL/id/bench" > "$OUT/wrk-c64.txt"
"$LG" id-single 64 closed 10 2 "$URL" > "$OUT/load-closed.json"
python3 - "$OUT" $RATES <<'PY'
import json, sys
out, rates = sys.argv[1], sys.argv[2:]
def lg(path):
    e = json.load(open(path))["endpoints"][0]
    c, u = e["corrected"], e["uncorrected"]
    return e["throughput_rps"], c["p50_us"]/1e3, c["p99_us"]/1e3, c["p999_us"]/1e3, u["p50_us"]/1e3, u["p99_us"]/1e3, e["errors"]
for r in rates:
    o = json.load(open(f"{out}/oha-{r}.json"))
    s, p = o["summary"], o["latencyPercentiles"]
    print(f"rate {r}: oha {s['requestsPerSec']:.0f} req/s P50 {p['p50']*1e3:.2f} P99 {p['p99']*1e3:.2f} P99.9 {p['p99.9']*1e3:.2f} ms")
    t, c50, c99, c999, u50, u99, err = lg(f"{out}/load-{r}.json")
    print(f"rate {r}: load {t:.0f} req/s corrected P50 {c50:.2f} P99 {c99:.2f} P99.9 {c999:.2f} ms; uncorrected P50 {u50:.2f} P99 {u99:.2f} ms; errors {err}")
t, c50, c99, c999, u50, u99, err = lg(f"{out}/load-closed.json")
print(f"closed: load {t:.0f} req/s P50 {u50:.2f} P99 {u99:.2f} ms errors {err}")
print(open(f"{out}/wrk-c64.txt").read())
PY
