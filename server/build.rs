//! Sets `cfg(has_postgres)` when PostgreSQL's binaries are on this machine, so that the
//! PostgreSQL tests are reported as ignored ("PostgreSQL not installed") where they cannot run,
//! never as passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_postgres)");
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    if cluster::postgres_bin_dir().is_some() {
        println!("cargo::rustc-cfg=has_postgres");
    }
}
