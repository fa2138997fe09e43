//! Sets `cfg(has_redis)` when `redis-server` is on PATH and `cfg(has_postgres)` when PostgreSQL's
//! binaries are on this machine, so that the real-system tests needing them are reported as
//! ignored where they cannot run, never as passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_redis)");
    println!("cargo::rustc-check-cfg=cfg(has_postgres)");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    if cluster::redis_server_bin().is_some() {
        println!("cargo::rustc-cfg=has_redis");
    }
    if cluster::postgres_bin_dir().is_some() {
        println!("cargo::rustc-cfg=has_postgres");
    }
}
