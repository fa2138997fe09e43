#!/usr/bin/env bash
# Measures sut-server with clients nobody here wrote (wrk from Debian, oha from crates.io):
#   1. GET /id/{tag} throughput against GET /noop on the same server (closed loop, wrk);
#   2. P99 of GET /id/{tag} at half the measured /id throughput (constant rate, oha with
#      latency correction, i.e. no coordinated omission);
#   3. durable lottery draws per second (wrk + draw.lua, every 2xx fsync'd before it is sent).
# Usage: docs/server-bench/run.sh [path/to/sut-server]   (build with cargo build --release)
# Needs: wrk (apt-get install wrk), oha (cargo install oha), curl. Traffic goes to 127.0.0.1 only.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${1:-target/release/sut-server}
PORT=${PORT:-18080}
SECS=${SECS:-10}
CONNS=${CONNS:-64}
DIR=$(mktemp -d)
"$BIN" --db "$DIR/ids.db" --listen "127.0.0.1:$PORT" >"$DIR/out.log" 2>"$DIR/err.log" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do grep -q listening "$DIR/out.log" 2>/dev/null && break; sleep 0.1; done
head -1 "$DIR/out.log"
URL=http://127.0.0.1:$PORT
curl -sf -XPOST "$URL/admin/tags" -d '{"tag":"bench","step":100000}' >/dev/null

rps() { awk '/^Requests\/sec:/ {print $2}'; }

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
wrk -t1 -c"$CONNS" -d3s "$URL/id/bench" >/dev/null   # warm-up
noop_all=(); id_all=()
for round in 1 2 3; do
  n=$(wrk -t1 -c"$CONNS" -d"${SECS}s" "$URL/noop" | rps)
  i=$(wrk -t1 -c"$CONNS" -d"${SECS}s" "$URL/id/bench" | rps)
  echo "round $round: /noop $n req/s, /id/bench $i req/s, ratio $(echo "scale=3; $i / $n" | bc)"
  noop_all+=("$n"); id_all+=("$i")
done
sum() { local s=0; for x in "$@"; do s=$(echo "$s + $x" | bc); done; echo "$s"; }
NOOP=$(sum "${noop_all[@]}"); ID=$(sum "${id_all[@]}")
echo "== /id vs /noop over 3 rounds: $(echo "scale=3; $ID / $NOOP" | bc)x (mean /id $(echo "$ID / 3" | bc) req/s, mean /noop $(echo "$NOOP / 3" | bc) req/s)"

HALF=$(echo "$ID / 6" | bc)
echo "== P99 of /id/bench at a constant $HALF req/s (half the mean /id throughput), oha --latency-correction"
oha -z "${SECS}s" -q "$HALF" --latency-correction -c "$CONNS" --no-tui "$URL/id/bench" \
  | grep -E "Success rate|Requests/sec|Slowest|Average|50.00%|90.00%|99.00%|99.90%|\[[0-9]+\]"

echo "== durable lottery draws (one new user per draw, 10% win, group commit)"
curl -sf -XPOST "$URL/admin/accounts" -d '{"user":1,"count":1000000,"balance_minor":100000}' >/dev/null
curl -sf -XPOST "$URL/admin/stock" -d '{"activity":1,"units":10000000}' >/dev/null
wrk -t1 -c256 -d"${SECS}s" -s "$HERE/draw.lua" "$URL" | grep -E "Latency|Req/Sec|requests in|Non-2xx|Requests/sec"
curl -sf "$URL/ledger" | grep -o '"safe":[a-z]*'
curl -sf "$URL/metrics" | grep -E "^sut_group_commit|^sut_lottery_draws|^sut_overload"
