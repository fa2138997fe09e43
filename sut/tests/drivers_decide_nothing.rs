//! The drivers (`sut-server`, the simulator, the models, the load and chaos crates) move bytes,
//! time and storage; `sut` decides. This test reads the drivers' sources and fails when one
//! names a variant of an enum that only `sut` may decide on: such a `match` in a driver is a
//! protocol decision made a second time, which the simulator then no longer proves of the
//! server (or the other way round). What a driver needs of such a state has a method in `sut`
//! (`DrawStage::verdict`, `DrawStage::awaited_phase`, `lottery::DrawStatus::in_flight` for what
//! a poll reports, `lottery::ClientAnswer::of` for what a client is told).
//!
//! Encoding to and from the wire stays the drivers' (matching a `ClientAnswer` to an HTTP status
//! is fine): the enums listed here are the internal states, not the answers.

use std::path::{Path, PathBuf};

/// Enums whose variants no driver may name, and where their decisions live instead.
const DECIDED_IN_SUT: &[(&str, &str)] = &[(
    "DrawStage",
    "the coordinator's stage: use DrawStage::verdict / awaited_phase, DrawStatus, ClientAnswer",
)];

/// The driver crates' source folders, from the workspace root.
const DRIVERS: &[&str] = &[
    "server/src",
    "sim/src",
    "models/src",
    "load/src",
    "cluster/src",
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

/// `path:line: text` for every code line of `text` naming a variant of `name` (`Name::`).
fn namings(path: &Path, text: &str, name: &str) -> Vec<String> {
    let needle = format!("{name}::");
    text.lines()
        .enumerate()
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
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for (name, instead) in DECIDED_IN_SUT {
            for hit in namings(file, &text, name) {
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
fn the_reader_finds_a_match_on_a_stage_and_skips_comments_and_longer_names() {
    let text = "match stage {\n    DrawStage::Trying => 1,\n    // DrawStage::Parked in a comment\n    MyDrawStage::X => 2,\n}";
    let hits = namings(Path::new("x.rs"), text, "DrawStage");
    assert_eq!(hits, vec!["x.rs:2: DrawStage::Trying => 1,".to_owned()]);
}
