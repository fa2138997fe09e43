//! The drivers (`sut-server`, the simulator, the models, the load, black-box and process
//! crates) move bytes, time and storage; `sut` decides. This test reads the drivers' sources and
//! fails when one names a variant of an enum that only `sut` may decide on: such a `match` in a
//! driver is a protocol decision made a second time, which the simulator then no longer proves
//! of the server (or the other way round). What a driver needs has an API in `sut` that answers
//! with an instruction to carry out:
//!
//! - the coordinator role: `lottery::CoordinatorNode` (the drive loop, timeouts, branch
//!   placement by `lottery::Host`, each waiting client's `ClientAnswer`, polls' `DrawStatus`);
//! - a request for a Snowflake or semantic ID: `snowflake::leased::LeasedIds`, answering
//!   `IdAnswer` (issue, wait until, drive the lease's calls, unavailable with a retry time).
//!
//! Encoding to and from the wire stays the drivers' (matching a `ClientAnswer` or an `IdAnswer`
//! to an HTTP status is fine): the enums listed here are the machines' internal steps and
//! refusals, not the instructions. Test code (`tests/`, `tests.rs`, `#[cfg(test)]` modules) may
//! name anything.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Enums whose variants no driver may name, and where their decisions live instead.
const DECIDED_IN_SUT: &[(&str, &str)] = &[
    (
        "DrawStage",
        "the coordinator's stage: use CoordinatorNode, DrawStage::verdict / awaited_phase, \
         DrawStatus, ClientAnswer",
    ),
    (
        "SequencerError",
        "a sequencer's refusal: what a request does about it is LeasedIds' IdAnswer",
    ),
    (
        "NextId",
        "a Snowflake worker's step: a request asks LeasedIds::next_snowflake",
    ),
    (
        "LeasedStep",
        "a semantic generator's step: a request asks LeasedIds::next_semantic",
    ),
    (
        "SemanticWait",
        "why a semantic ID waits: whether a request waits or is refused is LeasedIds'",
    ),
];

/// Driver files allowed to name one of them, and why.
const ALLOWED: &[(&str, &str, &str)] = &[(
    "models/src/snowflake.rs",
    "NextId",
    "the snowflake model is the worker's own model: it drives the worker directly, with no \
     request in between, and records what it issued",
)];

/// The driver crates' source folders, from the workspace root.
const DRIVERS: &[&str] = &[
    "server/src",
    "sim/src",
    "models/src",
    "load/src",
    "blackbox/src",
    "chaos/src",
    "compat/src",
    "scenarios/src",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The files `text` (the source of `path`) declares as `#[cfg(test)] mod name;`.
fn test_module_files(path: &Path, text: &str) -> Vec<PathBuf> {
    let dir = if path
        .file_name()
        .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs")
    {
        path.parent().unwrap().to_path_buf()
    } else {
        path.with_extension("")
    };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| {
            let rest = w[1].strip_prefix("pub(crate) ").unwrap_or(w[1]);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.to_owned())
        })
        .flat_map(|name| {
            [
                dir.join(format!("{name}.rs")),
                dir.join(name).join("mod.rs"),
            ]
        })
        .collect()
}

/// Whether `path` is test code as a whole.
fn is_test_file(path: &Path, test_modules: &BTreeSet<PathBuf>) -> bool {
    test_modules.contains(path)
        || path.file_name().is_some_and(|n| n == "tests.rs")
        || path.components().any(|c| c.as_os_str() == "tests")
}

/// `path:line: text` for every code line of `text` naming a variant of `name` (`Name::`),
/// before the file's first `#[cfg(test)]` (test modules come last).
fn namings(path: &Path, text: &str, name: &str) -> Vec<String> {
    let needle = format!("{name}::");
    text.lines()
        .enumerate()
        .take_while(|(_, line)| line.trim() != "#[cfg(test)]")
        .filter(|(_, line)| {
            let code = line.split("//").next().unwrap_or("");
            code.match_indices(&needle).any(|(at, _)| {
                // A whole name: `DrawStage::`, not `MyDrawStage::`.
                !code[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
        .map(|(i, line)| format!("{}:{}: {}", path.display(), i + 1, line.trim()))
        .collect()
}

#[test]
fn no_driver_names_a_state_only_sut_decides_on() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in DRIVERS {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} driver files", files.len());
    let texts: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).expect("a readable source file");
            (f, text)
        })
        .collect();
    let test_modules: BTreeSet<PathBuf> = texts
        .iter()
        .flat_map(|(f, text)| test_module_files(f, text))
        .collect();
    let mut found = Vec::new();
    for (file, text) in &texts {
        if is_test_file(file, &test_modules) {
            continue;
        }
        let relative = file.strip_prefix(&root).unwrap_or(file);
        for (name, instead) in DECIDED_IN_SUT {
            let allowed = ALLOWED
                .iter()
                .any(|(f, n, _)| *n == *name && relative == Path::new(f));
            if allowed {
                continue;
            }
            for hit in namings(relative, text, name) {
                found.push(format!("{hit}\n    ({name} is {instead})"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "drivers decide on sut's internal states:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_allowance_is_still_needed() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (file, name, why) in ALLOWED {
        let text = std::fs::read_to_string(root.join(file)).expect(file);
        assert!(
            !namings(Path::new(file), &text, name).is_empty(),
            "{file} no longer names {name}: drop its allowance ({why})"
        );
    }
}

#[test]
fn the_reader_finds_a_match_on_a_stage_and_skips_comments_longer_names_and_tests() {
    let text = "match stage {\n    DrawStage::Trying => 1,\n    // DrawStage::Parked in a comment\n    MyDrawStage::X => 2,\n}\n#[cfg(test)]\nmod tests {\n    DrawStage::Parked\n}";
    let hits = namings(Path::new("x.rs"), text, "DrawStage");
    assert_eq!(hits, vec!["x.rs:2: DrawStage::Trying => 1,".to_owned()]);
}

#[test]
fn test_modules_declared_in_a_file_are_test_code() {
    let text = "mod store;\n#[cfg(test)]\nmod conformance;\n#[cfg(test)]\npub(crate) mod driver;\n";
    let files = test_module_files(Path::new("server/src/pg/lottery.rs"), text);
    assert!(files.contains(&PathBuf::from("server/src/pg/lottery/conformance.rs")));
    assert!(files.contains(&PathBuf::from("server/src/pg/lottery/driver.rs")));
    assert!(!files.iter().any(|f| f.ends_with("store.rs")));
}
