//! Sets `cfg(has_postgres)` when PostgreSQL's binaries are on this machine and `cfg(has_faketime)`
//! when libfaketime is, so that the tests needing them are reported as ignored ("PostgreSQL not
//! installed", "libfaketime not installed") where they cannot run, never as passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_postgres)");
    println!("cargo::rustc-check-cfg=cfg(has_faketime)");
    println!("cargo::rerun-if-changed=/usr/lib/x86_64-linux-gnu/faketime");
    if cluster::libfaketime_path().is_some() {
        println!("cargo::rustc-cfg=has_faketime");
    }
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    if cluster::postgres_bin_dir().is_some() {
        println!("cargo::rustc-cfg=has_postgres");
    }
}
