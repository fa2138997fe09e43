//! Sets `cfg(has_faketime)` when the multithreaded libfaketime is installed and `cfg(has_fuse)`
//! when `/dev/fuse` exists, so that the `scenario ids` tests whose faults need them are reported
//! as ignored where they cannot run, never as passed.

include!("../cluster/src/faketime_paths.rs");

fn main() {
    println!("cargo::rustc-check-cfg=cfg(has_faketime)");
    println!("cargo::rustc-check-cfg=cfg(has_fuse)");
    println!("cargo::rerun-if-changed=/usr/lib/x86_64-linux-gnu/faketime");
    println!("cargo::rerun-if-changed=/dev/fuse");
    if LIBFAKETIME_PATHS
        .iter()
        .any(|p| std::path::Path::new(p).is_file())
    {
        println!("cargo::rustc-cfg=has_faketime");
    }
    if std::path::Path::new("/dev/fuse").exists() {
        println!("cargo::rustc-cfg=has_fuse");
    }
}
