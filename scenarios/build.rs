//! Sets `cfg(has_faketime)`, `cfg(has_fuse)`, `cfg(has_postgres)`, `cfg(has_mariadb)` and
//! `cfg(has_nft)` when this machine has them, so that the `scenario` tests whose faults need
//! them are reported as ignored where they cannot run, never as passed.
//!
//! Also sets `SCENARIO_BUILD_COMMIT`, the commit this build was made from (what a sweep's JSON
//! records, so that `scenario merge` refuses shards of different builds): the full hash, with
//! `-dirty-` and a hash of the uncommitted changes when the checkout had some, or `unknown`
//! outside a git checkout.
//!
//! And `SCENARIO_BUILD_PROFILE`, the cargo profile it was built with (`debug`, `release`,
//! `sweep`, …), with `+pgo` when its code was optimised with a profile of its own runs
//! (`scripts/pgo-sweep.sh`) and `+pgo-instrumented` when it records one: what the summary's
//! header and a sweep's JSON say of the build.

use std::process::Command;

fn main() {
    use hostprobe::Have;
    hostprobe::emit_cfgs(&[
        Have::Faketime,
        Have::Fuse,
        Have::Postgres,
        Have::MariaDb,
        Have::Nft,
    ]);
    emit_commit();
    emit_profile();
}

/// Sets `SCENARIO_BUILD_PROFILE`: the profile's folder under the target directory (the folder
/// above `build/` in `OUT_DIR`: `debug` for the `dev` and `test` profiles, the profile's name
/// otherwise), and whether the flags cargo compiles with make a PGO build.
fn emit_profile() {
    let out_dir = std::env::var("OUT_DIR").unwrap_or_default();
    let parts: Vec<&str> = out_dir.split(std::path::MAIN_SEPARATOR).collect();
    let profile = parts
        .windows(2)
        .rev()
        .find(|pair| pair[1] == "build")
        .map_or("unknown", |pair| pair[0]);
    // Cargo hands the build script the flags it compiles the package with, separated by 0x1f.
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    let pgo = if flags.contains("profile-use") {
        "+pgo"
    } else if flags.contains("profile-generate") {
        "+pgo-instrumented"
    } else {
        ""
    };
    println!("cargo::rustc-env=SCENARIO_BUILD_PROFILE={profile}{pgo}");
    println!("cargo::rerun-if-env-changed=CARGO_ENCODED_RUSTFLAGS");
}

/// `git ARGS` in the package's folder: its trimmed output, if git ran and succeeded.
fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// FNV-1a, 64 bits: a stable hash of the uncommitted changes.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Sets `SCENARIO_BUILD_COMMIT` and asks to be rerun when the commit or the sources change.
fn emit_commit() {
    let commit =
        git(&["rev-parse", "HEAD"]).map(|head| match git(&["diff", "HEAD", "--no-ext-diff"]) {
            Some(diff) if !diff.is_empty() => {
                format!("{head}-dirty-{:08x}", fnv1a(diff.as_bytes()) as u32)
            }
            _ => head,
        });
    println!(
        "cargo::rustc-env=SCENARIO_BUILD_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    // A commit, a checkout or a staged change moves these; an edit of a source moves the
    // sources the binary is built from (the workspace's crates, not their tests).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo::rerun-if-changed={dir}/HEAD");
        println!("cargo::rerun-if-changed={dir}/index");
    }
    if let Some(common) = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"]) {
        println!("cargo::rerun-if-changed={common}/packed-refs");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo::rerun-if-changed={common}/{branch}");
        }
    }
    for sources in [
        "src",
        "scenarios",
        "load",
        "real",
        "../Cargo.lock",
        "../sut/src",
        "../sim/src",
        "../models/src",
        "../load/src",
        "../blackbox/src",
        "../chaos/src",
        "../reports/src",
        "../server/src",
    ] {
        println!("cargo::rerun-if-changed={sources}");
    }
}
