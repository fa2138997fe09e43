//! `sut` stays the pure core: no async runtime, no HTTP, no database, no command line, no
//! OpenAPI and no OS randomness in its normal (non-dev) dependency tree. The server, the SQLite
//! stores and everything that does I/O live in `sut-server`.
//!
//! The check asks `cargo tree` (the cargo running this test, from the workspace root) for
//! `sut`'s normal dependencies and refuses any package whose name is on the lists below (whole
//! names: `tokio v1.2.3` is refused, `tokio-foo v1.2.3` is not this rule's business).

use std::path::Path;
use std::process::Command;

/// Packages that must not be anywhere in `sut`'s normal dependency tree.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "axum",
    "hyper",
    "tower",
    "rusqlite",
    "utoipa",
    "reqwest",
    "clap",
    "serde_path_to_error",
];

/// Packages that must not be in the tree once `jsonwebtoken` is pruned from it: OS randomness.
/// `sut` draws none of its own (nonces are arguments), but jsonwebtoken's pure-Rust crypto
/// backend (`rust_crypto`, the allowed way to build it) turns on the `getrandom` feature of its
/// RSA and elliptic-curve crates, which `sut` never calls (HS256 needs no randomness). So
/// `getrandom` may come in through `jsonwebtoken` only, never as a direct dependency or through
/// anything else.
const FORBIDDEN_OUTSIDE_JWT: &[&str] = &["getrandom"];

/// The lines of a `cargo tree --prefix none` output whose package name is one of `names`.
///
/// A line is `NAME vVERSION`, optionally followed by `(path)`, `(proc-macro)` or `(*)`.
fn forbidden_lines<'a>(tree: &'a str, names: &[&str]) -> Vec<&'a str> {
    tree.lines()
        .filter(|line| {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some(name), Some(version)) => version.starts_with('v') && names.contains(&name),
                _ => false,
            }
        })
        .collect()
}

/// `cargo tree -p sut -e normal --prefix none` plus `extra`, from the workspace root.
fn cargo_tree(extra: &[&str]) -> String {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sut/ sits in the workspace root");
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["tree", "-p", "sut", "-e", "normal", "--prefix", "none"])
        .args(extra)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo tree prints UTF-8")
}

#[test]
fn sut_has_no_io_runtime_http_database_or_openapi_dependency() {
    let tree = cargo_tree(&[]);
    assert!(
        tree.lines().any(|l| l.starts_with("sut v")),
        "not the tree of sut:\n{tree}"
    );
    let found = forbidden_lines(&tree, FORBIDDEN);
    assert!(
        found.is_empty(),
        "sut must stay pure; these belong in sut-server: {found:?}"
    );
}

#[test]
fn os_randomness_comes_in_only_through_jsonwebtoken() {
    let tree = cargo_tree(&["--prune", "jsonwebtoken"]);
    let found = forbidden_lines(&tree, FORBIDDEN_OUTSIDE_JWT);
    assert!(
        found.is_empty(),
        "sut draws no randomness of its own; these came in besides jsonwebtoken: {found:?}"
    );
    let found = forbidden_lines(&tree, FORBIDDEN);
    assert!(found.is_empty(), "{found:?}");
}

/// The matcher fires on a forbidden package (so the checks above can fail), in any of the line
/// forms `cargo tree` prints, and only on whole names.
#[test]
fn the_matcher_finds_whole_package_names_only() {
    let sample = "sut v0.1.0 (/work/sut)\n\
                  serde v1.0.0\n\
                  tokio v1.0.0\n\
                  tokio-util v0.7.0\n\
                  mytokio v1.0.0\n\
                  tokio v1.0.0 (*)\n\
                  getrandom v0.4.3 (*)\n\
                  tokio\n";
    assert_eq!(
        forbidden_lines(sample, FORBIDDEN),
        ["tokio v1.0.0", "tokio v1.0.0 (*)"]
    );
    assert_eq!(
        forbidden_lines(sample, FORBIDDEN_OUTSIDE_JWT),
        ["getrandom v0.4.3 (*)"]
    );
    assert!(forbidden_lines("sut v0.1.0 (/work/sut)\nserde v1.0.0\n", FORBIDDEN).is_empty());
}
