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

/// Ways to hold state outside a machine: no file of `sut` may write one (the design's "no
/// global state": every machine's state, its arrivals at edge states included, is its own).
const GLOBAL_STATE: &[&str] = &[
    "thread_local!",
    "static mut ",
    "lazy_static!",
    "OnceLock<",
    "Lazy<",
];

/// `path:line: text` for the code lines of `text` that declare global state.
fn global_state(path: &Path, text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            GLOBAL_STATE.iter().any(|g| code.contains(g))
                || (code.trim_start().starts_with("static ")
                    || code.contains(" static ") && code.contains(": "))
                    && (code.contains("Atomic") || code.contains("Mutex") || code.contains("Cell"))
        })
        .map(|(i, line)| format!("{}:{}: {}", path.display(), i + 1, line.trim()))
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source folder").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn sut_holds_no_global_state() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 40, "found only {} files", files.len());
    let found: Vec<String> = files
        .iter()
        .flat_map(|f| global_state(f, &std::fs::read_to_string(f).expect("readable")))
        .collect();
    assert!(
        found.is_empty(),
        "global state in sut:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_global_state_reader_finds_a_thread_local_and_a_static_atomic() {
    let text = "thread_local! {\n// thread_local! in a comment\nstatic N: AtomicU64 = AtomicU64::new(0);\nconst OK: u8 = 1;\n";
    let found = global_state(Path::new("x.rs"), text);
    assert_eq!(
        found,
        [
            "x.rs:1: thread_local! {",
            "x.rs:3: static N: AtomicU64 = AtomicU64::new(0);"
        ]
    );
}
