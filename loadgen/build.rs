//! Sets `cfg(has_redis)` when `redis-server` is on PATH, so that the Redis tests are reported as
//! ignored ("redis-server not installed") where they cannot run, never as passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_redis)");
    println!("cargo::rerun-if-env-changed=PATH");
    let found = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("redis-server").is_file())
    });
    if found {
        println!("cargo::rustc-cfg=has_redis");
    }
}
