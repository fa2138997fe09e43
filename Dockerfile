# The bench as a container image: the release `scenario` and `sut-server`, and the packages the
# process scenarios need (PostgreSQL, Redis, MariaDB, libfaketime, FUSE, nftables and iproute2).
# It runs the shards of a large sweep as a Kubernetes Indexed Job (docs/guide.md, "Running the
# bench in CI"):
#
#   docker build -t idbench .
#   docker run --rm idbench scenario chaos --seeds 16
#
# Not built or run in this repository's CI (it has no image registry and no docker engine).
# Never set RUSTFLAGS here: it would replace the `--cfg madsim` of .cargo/config.toml, and the
# simulator could not run.

# The builder is Debian bookworm, as the runtime: the binaries link its glibc.
FROM rust:1.95-bookworm AS builder
# llvm-profdata of the LLVM rustc 1.95 uses (22), for the PGO build of `scenario`.
RUN apt-get update \
    && apt-get install -y --no-install-recommends llvm-22 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The whole checkout, .git included: the build records its commit (scenarios/build.rs), which
# `scenario merge` compares across shards.
COPY . .
# `scenario`: the `sweep` profile (Cargo.toml: the release build optimised as one unit) further
# optimised with a profile of the simulator's own runs (scripts/pgo-sweep.sh: two builds and a
# training sweep), ≈ 2× the seeds per core-second of the build before issue 41
# (docs/simulation.md, "Seeds per core-second"); slower to build, which an image built once for
# many shards can afford. `sut-server`: the `sweep` profile.
RUN scripts/pgo-sweep.sh \
    && cargo build --profile sweep --bin sut-server -p sut-server

FROM debian:bookworm-slim
# procps: `kill`, with which a load run stops the server it started.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        postgresql redis-server mariadb-server faketime fuse3 nftables iproute2 procps \
        ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# `sut-server` beside `scenario`: where the load and process scenarios look for it.
COPY --from=builder /src/target/pgo/scenario /src/target/sweep/sut-server /usr/local/bin/
WORKDIR /work
CMD ["scenario", "list"]
