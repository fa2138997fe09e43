#!/usr/bin/env bash
# The reference for the model checker's speed: stateright's own Single Decree Paxos example,
# built from the stateright crate this workspace depends on (cargo's registry copy; nothing of
# it is committed here), on the same allocator as the `scenario` binary (mimalloc), so that
# states/s compare like for like with `scenario model NAME --threads 2`.
#
#   bash models/bench/paxos_reference.sh [CLIENTS]     # default 3 clients: ~1.2 M unique states
#
# The example's own `check-bfs` runs on every core (2 here) and prints stateright's report
# (states, unique states, seconds). The build goes to target/paxos-reference/ and is reused.
set -euo pipefail
cd "$(dirname "$0")/../.."
clients="${1:-3}"

manifest=$(cargo metadata --format-version 1 --locked 2>/dev/null |
  python3 -c 'import json,sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "stateright":
        print(p["manifest_path"]); break')
if [[ -z "$manifest" ]]; then
  echo "paxos_reference: stateright is not among the workspace's packages" >&2
  exit 2
fi
src=$(dirname "$manifest")
work=target/paxos-reference
copy="$work/$(basename "$src")"
if [[ ! -f "$copy/.prepared" ]]; then
  rm -rf "$copy"
  mkdir -p "$work"
  cp -r "$src" "$copy"
  chmod -R u+w "$copy"
  # Outside this workspace, with mimalloc as its allocator (as `scenario`).
  cat >>"$copy/Cargo.toml" <<'TOML'

[workspace]

[dev-dependencies.mimalloc]
version = "0.1"
default-features = false
TOML
  printf '\n#[global_allocator]\nstatic GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;\n' \
    >>"$copy/examples/paxos.rs"
  touch "$copy/.prepared"
fi
echo "stateright's paxos example from $src, $clients clients, mimalloc, release" >&2
cargo --config 'build.rustflags=["--cap-lints=allow"]' build --quiet --release \
  --manifest-path "$copy/Cargo.toml" --target-dir "$work/target" --example paxos
start=$(date +%s.%N)
done_line=$("$work/target/release/examples/paxos" check-bfs "$clients" | grep '^Done\.')
end=$(date +%s.%N)
echo "$done_line"
python3 - "$done_line" "$start" "$end" <<'PY'
import re, sys
line, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
states = int(re.search(r"states=(\d+)", line).group(1))
unique = int(re.search(r"unique=(\d+)", line).group(1))
wall = end - start
print(f"paxos reference: {states} states ({unique} unique), {wall:.2f} s wall, {states / wall:,.0f} states/s")
PY
