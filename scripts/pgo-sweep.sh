#!/usr/bin/env bash
# Build target/pgo/scenario: the `sweep` profile's `scenario` optimised with a profile of the
# simulator's own runs (profile-guided optimisation, PGO). The same code and the same runs as
# every other build: a seed's history is byte for byte the one `--release` writes. Use it for
# large sweeps (docs/simulation.md, "Seeds per core-second").
#
#   scripts/pgo-sweep.sh            # ≈ 20 min on 2 cores: two builds and a training sweep
#   target/pgo/scenario chaos --seeds 10000
#
# Needs `llvm-profdata` of the LLVM major version rustc uses (`rustc -vV`, "LLVM version"):
# on Debian bookworm `apt-get install llvm-22` for Rust 1.95; or set LLVM_PROFDATA.
#
# The instrumenting and optimising flags are passed with `cargo --config build.rustflags=[…]`,
# which cargo *adds* to the `--cfg madsim` of .cargo/config.toml. Never pass them in RUSTFLAGS:
# that would replace `--cfg madsim`, and the simulator could not run.
#
# The training sweep runs every simulated scenario (scenarios/scenarios/*.toml) on seeds
# 1000–1007, none of which the figures in docs/simulation.md are measured on.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
work=$root/target/pgo
train_seed_first=1000
train_seed_count=8

die() {
    echo "pgo-sweep: $*" >&2
    exit 2
}

llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
triple=$(rustc -vV | sed -n 's/^host: //p')
[[ -n $llvm_major && -n $triple ]] || die "could not read rustc's LLVM version and host from 'rustc -vV'"

profdata=${LLVM_PROFDATA:-}
if [[ -z $profdata ]]; then
    profdata=$(command -v "llvm-profdata-$llvm_major" || command -v llvm-profdata || true)
fi
[[ -n $profdata && -x $profdata ]] ||
    die "llvm-profdata not found: install LLVM $llvm_major (Debian: apt-get install llvm-$llvm_major) or set LLVM_PROFDATA"
profdata_version=$("$profdata" --version 2>&1 || true)
profdata_major=$(sed -n 's/.*LLVM version \([0-9]*\).*/\1/p' <<<"$profdata_version" | head -n 1)
[[ $profdata_major == "$llvm_major" ]] ||
    die "$profdata: LLVM ${profdata_major:-version unknown}; rustc uses LLVM $llvm_major (the profile formats differ)"

profiles=$work/profiles
merged=$work/merged.profdata
rm -rf "$profiles" "$merged"
mkdir -p "$profiles"

# `panic = "abort"`: `scenario` never unwinds anyway (its panic hook reports the panic, with the
# seed and its replay line, and ends the process with exit code 3 before any unwinding), so the
# unwinding paths are dead code; without them the build is 4–6 % faster. Only this build: the
# `sweep` profile also builds `sut-server`, which keeps serving when one request panics.
build() { # target-dir, rustflag
    cargo build --profile sweep --bin scenario --target "$triple" --target-dir "$work/$1" \
        --config 'profile.sweep.panic="abort"' --config "build.rustflags=[\"$2\"]"
}

echo "pgo-sweep: 1/3 the instrumented build" >&2
build gen "-Cprofile-generate=$profiles"
instrumented=$work/gen/$triple/sweep/scenario

echo "pgo-sweep: 2/3 the training sweep (seeds $train_seed_first.. of every simulated scenario)" >&2
for file in scenarios/scenarios/*.toml; do
    name=$(basename "$file" .toml)
    # A violation (exit 1) is a verdict, and its run a profile like any other; bad usage (2)
    # or a bench failure (3) stops the build.
    status=0
    "$instrumented" "$name" --seed "$train_seed_first" --seeds "$train_seed_count" --jobs 1 \
        >/dev/null || status=$?
    ((status <= 1)) || die "training run of $name exited $status"
done
"$profdata" merge -o "$merged" "$profiles"/*.profraw

echo "pgo-sweep: 3/3 the optimised build" >&2
build use "-Cprofile-use=$merged"
cp "$work/use/$triple/sweep/scenario" "$work/scenario"
echo "pgo-sweep: built $work/scenario" >&2
