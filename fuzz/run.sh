#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (docs/hostile.md).
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]      (default 60 s, every target)
#
# Harness: libFuzzer through libfuzzer-sys, on the stable toolchain, with the coverage flags
# `cargo fuzz build --sanitizer none` would pass (fuzz/.cargo/config.toml; see docs/hostile.md
# for why not cargo-fuzz itself). Prints executions per target; exits 1 on a crash (the input
# is written to fuzz/artifacts/TARGET/; reproduce with
# `fuzz/target/x86_64-unknown-linux-gnu/release/TARGET FILE`).
set -euo pipefail
cd "$(dirname "$0")"

seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(scenario_toml jwt_verify server_request lottery_journal sim_wal)
fi
triple=x86_64-unknown-linux-gnu
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
# An explicit --target keeps the instrumentation off build scripts and proc macros.
nice cargo build --release --target "$triple" "${bins[@]}"

mkdir -p logs
failed=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    seeds=()
    [ -d "seeds/$t" ] && seeds=("seeds/$t")
    status=0
    nice "target/$triple/release/$t" "corpus/$t" "${seeds[@]}" \
        -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="artifacts/$t/" \
        >"logs/$t.log" 2>&1 || status=$?
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$' | tail -n1)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "logs/$t.log" | grep -o '[0-9]*$' | tail -n1)
    cov=$(grep -o 'cov: [0-9]*' "logs/$t.log" | tail -n1)
    if [ "$status" -eq 0 ]; then
        echo "$t: ${execs:-?} executions in ${seconds} s (${rate:-?}/s, ${cov:-cov ?}), no crash"
    else
        echo "$t: CRASH after ${execs:-?} executions (exit $status); see fuzz/logs/$t.log, fuzz/artifacts/$t/"
        grep -m3 -E 'panicked|ERROR|Test unit written' "logs/$t.log" || true
        failed=1
    fi
done
exit "$failed"
