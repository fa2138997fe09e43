//! Sets `cfg(has_redis)` when `redis-server` is on PATH and `cfg(has_faketime)` when the
//! multithreaded libfaketime is installed, so that the tests needing them are reported as ignored
//! where they cannot run, never as passed.

include!("src/faketime_paths.rs");

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_redis)");
    println!("cargo::rustc-check-cfg=cfg(has_faketime)");
    println!("cargo::rustc-check-cfg=cfg(has_fuse)");
    println!("cargo::rustc-check-cfg=cfg(has_postgres)");
    println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    let postgres = std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|versions| {
        versions
            .filter_map(Result::ok)
            .any(|v| v.path().join("bin/initdb").is_file())
    });
    if postgres {
        println!("cargo::rustc-cfg=has_postgres");
    }
    if std::path::Path::new("/dev/fuse").exists() {
        println!("cargo::rustc-cfg=has_fuse");
    }
    println!("cargo::rerun-if-changed=/usr/lib/x86_64-linux-gnu/faketime");
    if LIBFAKETIME_PATHS
        .iter()
        .any(|p| std::path::Path::new(p).is_file())
    {
        println!("cargo::rustc-cfg=has_faketime");
    }
    println!("cargo::rerun-if-env-changed=PATH");
    let found = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("redis-server").is_file())
    });
    if found {
        println!("cargo::rustc-cfg=has_redis");
    }
}
