//! The `scenario` command's library half: the catalog of named scenarios (simulation TOML files
//! under `scenarios/scenarios/`, load TOML files under `scenarios/load/`, compiled into the
//! binary so it runs from any directory), and loading a scenario by name or from a file.

pub mod contention;
pub mod flaws;
pub mod ids;
pub mod loadfile;
pub mod overload;
pub mod power;
pub mod process_flaws;
pub mod realfile;
pub mod report;
pub mod search;
pub mod tcc;
pub mod tokens;

use sim::scenario::{Scenario, ScenarioError};

/// The named scenario files, in the order `scenario list` prints them.
pub const NAMED: &[(&str, &str)] = &[
    ("clock_skew", include_str!("../scenarios/clock_skew.toml")),
    ("partition", include_str!("../scenarios/partition.toml")),
    ("swizzle", include_str!("../scenarios/swizzle.toml")),
    (
        "crash_restart",
        include_str!("../scenarios/crash_restart.toml"),
    ),
    ("pause", include_str!("../scenarios/pause.toml")),
    (
        "segment_race",
        include_str!("../scenarios/segment_race.toml"),
    ),
    (
        "snowflake_rollback",
        include_str!("../scenarios/snowflake_rollback.toml"),
    ),
    (
        "token_replay",
        include_str!("../scenarios/token_replay.toml"),
    ),
    ("tcc_storm", include_str!("../scenarios/tcc_storm.toml")),
    ("chaos", include_str!("../scenarios/chaos.toml")),
    ("id_fleet", include_str!("../scenarios/id_fleet.toml")),
    ("epoch_end", include_str!("../scenarios/epoch_end.toml")),
];

/// The named load scenarios (files under `scenarios/load/`, see [`loadfile`]): name and
/// description, in the order `scenario list` prints them (a broken file says so in its
/// description). They run against the real `sut-server` (built with `cargo build --release -p
/// sut-server --bin sut-server`).
#[must_use]
pub fn load_list() -> Vec<(String, String)> {
    loadfile::NAMED
        .iter()
        .map(|(name, text)| {
            let description = loadfile::LoadScenario::parse(&load_file_name(name), text)
                .map(|s| s.description)
                .unwrap_or_else(|e| format!("(broken: {e})"));
            ((*name).to_owned(), description)
        })
        .collect()
}

fn load_file_name(name: &str) -> String {
    format!("scenarios/load/{name}.toml")
}

/// Whether `name` is a load scenario: a named one, or a file with a top-level `[load]` table.
#[must_use]
pub fn is_load_scenario(name: &str) -> bool {
    loadfile::NAMED.iter().any(|(n, _)| *n == name)
        || std::fs::read_to_string(name).is_ok_and(|t| loadfile::is_load_text(&t))
}

/// Loads a load scenario by name or from a file; `Ok(None)` when `name` is neither a named
/// load scenario nor a file holding one.
///
/// # Errors
/// The file cannot be read, or is malformed (file:line:column and field).
pub fn load_scenario(name: &str) -> Result<Option<loadfile::LoadScenario>, LoadError> {
    if let Some((file, text)) = loadfile::NAMED.iter().find(|(n, _)| *n == name) {
        return Ok(Some(loadfile::LoadScenario::parse(
            &load_file_name(file),
            text,
        )?));
    }
    match read_file_of_kind(name, loadfile::is_load_text)? {
        Some(text) => Ok(Some(loadfile::LoadScenario::parse(name, &text)?)),
        None => Ok(None),
    }
}

/// The text of the file `name` when it is a scenario file of the kind `is_kind` recognises;
/// `Ok(None)` when there is no such file or it is of another kind.
///
/// # Errors
/// The file exists and cannot be read.
pub(crate) fn read_file_of_kind(
    name: &str,
    is_kind: fn(&str) -> bool,
) -> Result<Option<String>, LoadError> {
    let path = std::path::Path::new(name);
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: name.to_owned(),
        source,
    })?;
    Ok(is_kind(&text).then_some(text))
}

/// Results the gate runs besides the named simulations: the model checks, the known-flaws
/// catalog and a short load run.
#[must_use]
pub fn gate_extras(jobs: usize) -> Vec<reports::RunResult> {
    let mut results = Vec::new();
    for info in models::catalog() {
        eprintln!("gate: model {}", info.name);
        // One checker thread: a depth-bounded breadth-first search on several threads stops
        // at a racy frontier, and the gate pins the unique-state count exactly.
        let options = models::ModelOptions {
            threads: 1,
            ..models::ModelOptions::default()
        };
        match models::check(info.name, options) {
            Ok(report) => results.push(report::model(&report).into()),
            Err(err) => eprintln!("gate: model {} could not run: {err}", info.name),
        }
    }
    // The known-flaws catalog: every flaw must still be caught by the generic invariants. One
    // sweep from seed 0 (deterministic), simulations only (the models' counterexamples are
    // figures of `scenario flaws`, too slow to repeat here).
    eprintln!("gate: known flaws (one sweep of at most 50 seeds each)");
    let opts = flaws::FlawOptions {
        sweeps: 1,
        seeds_max: 50,
        jobs,
        models: false,
        only: Vec::new(),
    };
    match flaws::run_catalog(&opts, &|row| {
        eprintln!(
            "gate:   {:<28} {}",
            row.flaw,
            row.caught_by.as_deref().unwrap_or("NOT CAUGHT")
        );
    }) {
        Ok(catalog) => results.push(catalog.into()),
        Err(err) => eprintln!("gate: the flaw catalog could not run: {err}"),
    }
    // A short constant-rate load run against a fresh sut-server: its verification is gated
    // (latency ratios are reported, but on a shared machine they are too noisy to pin).
    eprintln!("gate: load run load_mixed (3 s at 300 operations/s)");
    let options = load::LoadOptions {
        workload: "mixed".into(),
        users: 4,
        rate: Some(300.0),
        duration_s: 3,
        warmup_s: 1,
        ..load::LoadOptions::default()
    };
    match load::run(options) {
        Ok(mut report) => {
            report.scenario = "load_mixed".into();
            // Tags are unique per run (`id:loadgen-<random>`); the gate pins names.
            for check in &mut report.verification {
                if let Some(open) = check.name.find("[id:") {
                    check.name = format!("{}[id]", &check.name[..open]);
                }
            }
            // The file's thresholds (service-level objectives) hold on the gate's short run too.
            if let Ok(Some(file)) = load_scenario("load_mixed") {
                let slos = file.load.thresholds.check(&report);
                report.verification.extend(slos);
            }
            results.push(report.into());
        }
        Err(err) => eprintln!("gate: load run could not run: {err}"),
    }
    results
}

/// Why a scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No scenario of that name, and no such file.
    #[error(
        "unknown scenario `{name}` (and no such file){hint}; `scenario list` shows the named ones",
        name = .0,
        hint = did_you_mean(.0).map(|n| format!(": did you mean `{n}`?")).unwrap_or_default()
    )]
    Unknown(String),
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is malformed.
    #[error(transparent)]
    Bad(#[from] ScenarioError),
    /// A real-system scenario file is malformed ([`realfile`]).
    #[error("{path}: {message}")]
    Real {
        /// The file.
        path: String,
        /// What is wrong, naming the field (and line and column when TOML says).
        message: String,
    },
}

/// What the final verdict line of a passing run adds in brackets (`PASS (…): scenario …`), set
/// by a run whose pass says less than a plain PASS would: a black-box run that never had two
/// requests of one key in flight at once is inconclusive for races.
pub static VERDICT_NOTE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Sets [`VERDICT_NOTE`].
pub fn note_verdict(note: String) {
    *VERDICT_NOTE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(note);
}

/// The named scenario (simulated, load or real) closest to `name`, when one is close enough to
/// be a typo of it: at most two edits apart (or a third of its length, for long names).
#[must_use]
pub fn did_you_mean(name: &str) -> Option<&'static str> {
    let names = NAMED
        .iter()
        .chain(loadfile::NAMED)
        .chain(realfile::NAMED)
        .map(|(n, _)| *n);
    names
        .map(|n| (edit_distance(name, n), n))
        .filter(|(d, n)| *d > 0 && *d <= 2.max(n.len() / 3))
        .min()
        .map(|(_, n)| n)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Loads a named scenario, or a scenario file when `name` is a path (ends in `.toml` or names
/// an existing file).
pub fn load(name: &str) -> Result<Scenario, LoadError> {
    if let Some((file, text)) = NAMED.iter().find(|(n, _)| *n == name) {
        return Ok(Scenario::parse(
            &format!("scenarios/scenarios/{file}.toml"),
            text,
        )?);
    }
    let path = std::path::Path::new(name);
    if name.ends_with(".toml") || path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
            path: name.to_owned(),
            source,
        })?;
        return Ok(Scenario::parse(name, &text)?);
    }
    Err(LoadError::Unknown(name.to_owned()))
}

/// Per edge state, the named scenarios that own it (`[edges] expect` or `rare`).
#[must_use]
pub fn edge_owners() -> std::collections::BTreeMap<&'static str, Vec<&'static str>> {
    let mut owners = std::collections::BTreeMap::<&'static str, Vec<&'static str>>::new();
    for (name, _) in NAMED {
        let Ok(scenario) = load(name) else { continue };
        let owned = scenario.edges.owned().unwrap_or_default();
        let rare = scenario.edges.owned_rare().unwrap_or_default();
        for edge in owned.into_iter().chain(rare) {
            owners.entry(edge.name).or_default().push(name);
        }
    }
    owners
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_typo_of_a_scenario_name_is_answered_with_the_name() {
        assert_eq!(super::did_you_mean("clock_skwe"), Some("clock_skew"));
        assert_eq!(super::did_you_mean("tccstorm"), Some("tcc_storm"));
        assert_eq!(super::did_you_mean("clock_skew"), None, "not a typo");
        assert_eq!(super::did_you_mean("completely_different"), None);
        let err = super::load("clock_skwe").expect_err("unknown").to_string();
        assert!(err.contains("did you mean `clock_skew`?"), "{err}");
    }

    use super::*;

    #[test]
    fn every_named_scenario_parses_and_is_named_after_its_file() {
        for (name, _) in NAMED {
            let scenario = load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&scenario.name, name);
            assert!(!scenario.description.is_empty());
        }
    }

    #[test]
    fn load_scenarios_by_name_and_file() {
        let list = load_list();
        assert_eq!(list.len(), loadfile::NAMED.len());
        assert!(
            list.iter().all(|(_, d)| !d.starts_with("(broken")),
            "{list:?}"
        );
        assert!(is_load_scenario("load_mixed"));
        assert!(!is_load_scenario("clock_skew"));
        let named = load_scenario("crash_under_load").unwrap().unwrap();
        assert_eq!(named.load.kills, 3);
        assert!(load_scenario("clock_skew").unwrap().is_none());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mine.toml");
        std::fs::write(
            &path,
            "name = \"mine\"\ndescription = \"d\"\n[load]\nusers = 0\n[load.mix]\nid = 1\n",
        )
        .unwrap();
        let path = path.to_str().unwrap();
        assert!(is_load_scenario(path));
        let err = load_scenario(path).unwrap_err().to_string();
        assert!(err.contains("mine.toml:4:1: field `users`"), "{err}");
    }

    #[test]
    fn unknown_names_and_bad_files_are_errors() {
        assert!(matches!(
            load("no_such_scenario"),
            Err(LoadError::Unknown(_))
        ));
        assert!(matches!(
            load("/nonexistent/x.toml"),
            Err(LoadError::Io { .. })
        ));
    }
}
