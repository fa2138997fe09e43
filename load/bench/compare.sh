#!/usr/bin/env bash
# Side-by-side cross-check of load against clients nobody here wrote, on GET /id/{tag} of
# one release sut-server (docs/load.md, "Figures"):
#   constant rate: oha -q RATE --latency-correction  vs  load id-single at RATE
#   closed loop:   wrk -t1 and oha (no -q)             vs  load id-single closed (tokio's
#                  default worker threads, and LOADGEN_CLIENT_THREADS=1)
# Every client runs under `nice` with 64 connections / users, 10 s (load: 2 s warm-up
# first, not measured), back to back against the same server, ROUNDS times alternating.
# Client and server CPU seconds per run are taken from /usr/bin/time and /proc/PID/stat.
# usage: load/bench/compare.sh [RATES...]
#   env: ROUNDS=2, OUT=/tmp/load-compare, LG_BASE=binary,
#        SOURCE_FIGURES=1 (default; 0 skips them): the runs matching the figures of the ID, token
#        and lottery design, §2.2 and §2.4 (docs/sources.md; docs/load.md, "The source design's
#        figures"). SEED002 is the older name of the same switch; SOURCE_FIGURES wins if both
#        are set.
# needs: cargo build --release -p sut-server --bin sut-server -p load --example load; oha; wrk
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=target/release/sut-server
LG=target/release/examples/load
PORT=${PORT:-18090}
URL=http://127.0.0.1:$PORT
OUT=${OUT:-/tmp/load-compare}
ROUNDS=${ROUNDS:-2}
CONNS=64
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.txt "$OUT"/*.cpu
DIR=$(mktemp -d)
"$BIN" --db "$DIR/ids.db" --listen 127.0.0.1:$PORT > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER; wait $SERVER; rm -rf "$DIR"' EXIT
sleep 1
curl -s -XPOST "$URL/admin/tags" -H 'content-type: application/json' -d '{"tag":"bench","step":100000}' > /dev/null
server_ticks() { awk '{ print $14 + $15 }' "/proc/$SERVER/stat"; }
# run LABEL CMD...: client CPU (user+sys s) via /usr/bin/time, server CPU ticks around it
run() {
  local label=$1; shift
  local before; before=$(server_ticks)
  /usr/bin/time -f "%U %S %e" -o "$OUT/$label.time" nice "$@" > "$OUT/$label.out" 2> "$OUT/$label.err" || true
  echo "$(cat "$OUT/$label.time") $(( $(server_ticks) - before ))" > "$OUT/$label.cpu"
}
RATES=${*:-2000 5000 10000}
for ROUND in $(seq 1 "$ROUNDS"); do
  for R in $RATES; do
    echo "== round $ROUND rate $R ($(cut -d' ' -f1-3 /proc/loadavg))"
    run "oha-$R-$ROUND" oha -z 10s -q "$R" --latency-correction -c $CONNS --no-tui --output-format json "$URL/id/bench"
    run "lg-$R-$ROUND" "$LG" id-single $CONNS "$R" 10 2 "$URL"
    # oha at the same rate without --latency-correction: its workers take a token from the
    # rate task and time the request from their own send, which is what load's uncorrected
    # histogram measures (the instruments compared like for like)
    run "ohau-$R-$ROUND" oha -z 10s -q "$R" -c $CONNS --no-tui --output-format json "$URL/id/bench"
  done
  echo "== round $ROUND closed loop ($(cut -d' ' -f1-3 /proc/loadavg))"
  run "wrk-$ROUND" wrk -t1 -c$CONNS -d10s --latency "$URL/id/bench"
  run "lgc-$ROUND" "$LG" id-single $CONNS closed 10 2 "$URL"
  # the same on one client worker thread instead of tokio's default (one per core)
  run "lgc1-$ROUND" env LOADGEN_CLIENT_THREADS=1 "$LG" id-single $CONNS closed 10 2 "$URL"
  # optional: an older load binary, for a before/after of a change (LG_BASE=path)
  if [ -n "${LG_BASE:-}" ]; then run "lgb-$ROUND" "$LG_BASE" id-single $CONNS closed 10 2 "$URL"; fi
  run "ohac-$ROUND" oha -z 10s -c $CONNS --no-tui --output-format json "$URL/id/bench"
done
# Runs matching the source design's tables (docs/load.md, "The source design's figures";
# docs/sources.md): its §2.2 (segment IDs, 16 concurrent threads: QPS, P99) and §2.4 (Snowflake
# IDs under wrk: P50/P99/P999, server CPU). SOURCE_FIGURES, or its older name SEED002.
if [ "${SOURCE_FIGURES:-${SEED002:-1}}" = 1 ]; then
  echo "== source-design runs ($(cut -d' ' -f1-3 /proc/loadavg))"
  run "s22-wrk" wrk -t1 -c16 -d10s --latency "$URL/id/bench"
  run "s22-lg" "$LG" id-single 16 closed 10 2 "$URL"
  run "s24-wrk" wrk -t1 -c$CONNS -d10s --latency "$URL/snowflake"
  run "s24-lg" "$LG" snowflake $CONNS closed 10 2 "$URL"
  run "s24-lgr" "$LG" snowflake $CONNS 10000 10 2 "$URL"
fi
python3 - "$OUT" "$ROUNDS" $RATES <<'PY'
import json, os, re, sys
out, rounds, rates = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def cpu(label):
    u, s, e, ticks = open(f"{out}/{label}.cpu").read().split()
    return float(u) + float(s), float(e), int(ticks) / 100.0
def lg(label):
    d = json.load(open(f"{out}/{label}.out"))
    e = d["endpoints"][0]
    g = d.get("diagnostics", {})
    sched = dict(g.get("from_schedule", {})).get(e["name"], {})
    late = g.get("send_lateness", {})
    # n: requests sent over the whole run (10 s measured + 2 s warm-up), for CPU per request
    return dict(rps=e["throughput_rps"], n=e["requests"] * 1.2, err=e["errors"],
                c50=e["corrected"]["p50_us"], c99=e["corrected"]["p99_us"], c999=e["corrected"]["p999_us"],
                u50=e["uncorrected"]["p50_us"], u99=e["uncorrected"]["p99_us"],
                s50=sched.get("p50_us", 0), s99=sched.get("p99_us", 0),
                l50=late.get("p50_us", 0), l99=late.get("p99_us", 0))
def oha(label):
    d = json.load(open(f"{out}/{label}.out"))
    s, p = d["summary"], d["latencyPercentiles"]
    n = sum(d.get("statusCodeDistribution", {}).values())
    return dict(rps=s["requestsPerSec"], n=n, c50=p["p50"]*1e6, c99=p["p99"]*1e6, c999=p["p99.9"]*1e6)
def wrk(label):
    t = open(f"{out}/{label}.out").read()
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    n = int(re.search(r"(\d+) requests in", t).group(1))
    def pct(q):
        m = re.search(rf"\s{q}%\s+([\d.]+)(us|ms|s)", t)
        v = float(m.group(1)); return v * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]
    return dict(rps=rps, n=n, c50=pct(50), c99=pct(99))
for r in range(1, rounds + 1):
    print(f"--- round {r}")
    for q in rates:
        o, l = oha(f"oha-{q}-{r}"), lg(f"lg-{q}-{r}")
        oc, lc = cpu(f"oha-{q}-{r}"), cpu(f"lg-{q}-{r}")
        print(f"rate {q}: oha {o['rps']:.0f}/s P50 {o['c50']:.0f} P99 {o['c99']:.0f} P99.9 {o['c999']:.0f} us | client cpu {oc[0]/max(o['n'],1)*1e6:.1f} us/req")
        print(f"rate {q}: load {l['rps']:.0f}/s corrected P50 {l['c50']} P99 {l['c99']} P99.9 {l['c999']} us; uncorrected P50 {l['u50']} P99 {l['u99']}; from schedule P50 {l['s50']} P99 {l['s99']}; client send lateness P50 {l['l50']} P99 {l['l99']}; errors {l['err']} | client cpu {lc[0]/max(l['n'],1)*1e6:.1f} us/req")
        print(f"rate {q}: ratio load corrected / oha: P50 {l['c50']/o['c50']:.2f} P99 {l['c99']/o['c99']:.2f}; from schedule / oha: P50 {l['s50']/o['c50']:.2f} P99 {l['s99']/o['c99']:.2f}")
        if os.path.exists(f"{out}/ohau-{q}-{r}.out"):
            u = oha(f"ohau-{q}-{r}")
            print(f"rate {q}: oha uncorrected {u['rps']:.0f}/s P50 {u['c50']:.0f} P99 {u['c99']:.0f} P99.9 {u['c999']:.0f} us; ratio load uncorrected / oha uncorrected: P50 {l['u50']/u['c50']:.2f} P99 {l['u99']/u['c99']:.2f}")
    w, lc_, oc_, l2 = wrk(f"wrk-{r}"), lg(f"lgc-{r}"), oha(f"ohac-{r}"), lg(f"lgc1-{r}")
    for name, d, label in (("wrk -t1", w, f"wrk-{r}"), ("load", lc_, f"lgc-{r}"), ("load 1 worker", l2, f"lgc1-{r}"), ("oha", oc_, f"ohac-{r}")):
        c, e, srv = cpu(label)
        print(f"closed {name}: {d['rps']:.0f} req/s P50 {d['c50']:.0f} P99 {d['c99']:.0f} us | client cpu {c:.1f} s = {c/max(d['n'],1)*1e6:.1f} us/req, server cpu {srv:.1f} s = {srv/max(d['n'],1)*1e6:.1f} us/req")
    if os.path.exists(f"{out}/lgb-{r}.cpu"):
        b = lg(f"lgb-{r}"); c, e, srv = cpu(f"lgb-{r}")
        print(f"closed load LG_BASE: {b['rps']:.0f} req/s P50 {b['c50']:.0f} P99 {b['c99']:.0f} us | client cpu {c:.1f} s = {c/max(b['n'],1)*1e6:.1f} us/req; / wrk {b['rps']/w['rps']:.2f}")
    print(f"closed: load / wrk throughput {lc_['rps']/w['rps']:.2f} (1 worker {l2['rps']/w['rps']:.2f}), oha / wrk {oc_['rps']/w['rps']:.2f}")
if os.path.exists(f"{out}/s24-lgr.cpu"):
    print("--- runs matching the source design's figures (server CPU % = server CPU s / client wall s, incl. load's set-up and warm-up)")
    for label, kind in (("s22-wrk", wrk), ("s22-lg", lg), ("s24-wrk", wrk), ("s24-lg", lg), ("s24-lgr", lg)):
        d = kind(label); c, e, srv = cpu(label)
        extra = f" P99.9 {d['c999']}" if "c999" in d else ""
        print(f"{label}: {d['rps']:.0f} req/s P50 {d['c50']:.0f} P99 {d['c99']:.0f}{extra} us | server cpu {srv:.1f} s over {e:.1f} s = {100*srv/max(e,1e-9):.0f}% of one core | client cpu {c/max(d['n'],1)*1e6:.1f} us/req")
PY
