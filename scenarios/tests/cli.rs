//! The `scenario` command as a user meets it: listing, exit codes, errors that name the file
//! and line, and the JSON a sweep writes.

use std::process::Command;

fn scenario() -> Command {
    Command::new(env!("CARGO_BIN_EXE_scenario"))
}

#[test]
fn list_names_every_scenario() {
    let out = scenario().arg("list").output().expect("run scenario list");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "clock_skew",
        "partition",
        "swizzle",
        "crash_restart",
        "pause",
        "segment_race",
        "chaos",
        "load_mixed",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing from:\n{text}"
        );
    }
}

#[test]
fn unknown_scenarios_and_bad_files_exit_2_with_a_clear_error() {
    let out = scenario().arg("no_such_scenario").output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown scenario `no_such_scenario`"));

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "name = \"bad\"\ndescription = \"d\"\n[workload]\nrate = 5\n",
    )
    .expect("write");
    let out = scenario().arg(&path).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.toml:4:1") && err.contains("unknown field `rate`"),
        "{err}"
    );
}

#[test]
fn a_short_sweep_exits_0_and_writes_the_json_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tiny.toml");
    std::fs::write(
        &file,
        "name = \"tiny\"\ndescription = \"one short seed\"\n[run]\nsafety_ms = 800\nliveness_ms = 2000\n\
         [workload]\nrate_per_s = 300\n[faults]\nkinds = [\"loss\"]\nswarm = false\ninterval_ms = [50, 100]\n",
    )
    .expect("write");
    let json = dir.path().join("out.json");
    let out = scenario()
        .arg(&file)
        .args(["--seeds", "1", "--json"])
        .arg(&json)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("valid json");
    for field in [
        "scenario",
        "seeds_run",
        "violations",
        "sim_seconds",
        "wall_seconds",
        "events",
        "fault_effects",
    ] {
        assert!(doc.get(field).is_some(), "missing {field} in {doc}");
    }
    assert_eq!(doc["seeds_run"], 1);
    assert!(
        doc["fault_effects"]["net.dropped_by_loss"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{doc}"
    );
}

#[test]
fn flaws_lists_the_catalog_and_runs_one_flaw_to_a_violation() {
    let out = scenario().args(["flaws", "--list"]).output().expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 13, "{text}");
    assert!(text.contains("twitter/snowflake issue #6"), "{text}");

    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("flaws.json");
    let out = scenario()
        .args([
            "flaws",
            "--only",
            "stock_two_step",
            "--sweeps",
            "1",
            "--seeds-max",
            "4",
            "--no-models",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let rows: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("valid json");
    let row = &rows[0];
    for field in [
        "flaw",
        "source",
        "scenario",
        "caught",
        "seeds_to_failure",
        "model_depth",
    ] {
        assert!(row.get(field).is_some(), "missing {field} in {row}");
    }
    assert_eq!(row["flaw"], "stock_two_step");
    assert_eq!(row["caught"], true);
    assert_eq!(row["caught_by"], "sim:lottery.no_over_issue");

    // A flaw name that does not exist is bad usage.
    let out = scenario()
        .args(["clock_skew", "--flaw", "meteor"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tcc_no_fence"));
}

#[test]
fn load_scenario_files_are_listed_and_bad_ones_exit_2_naming_file_line_and_field() {
    let out = scenario().arg("list").output().expect("run scenario list");
    let text = String::from_utf8_lossy(&out.stdout);
    for name in ["load_id", "load_mixed", "load_lottery", "crash_under_load"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing from:\n{text}"));
        assert!(!line.contains("(broken"), "{line}");
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("badload.toml");
    std::fs::write(
        &path,
        "name = \"badload\"\ndescription = \"d\"\n[load]\nusers = 4\nrate = -3\n[load.mix]\nid = 1\n",
    )
    .expect("write");
    let out = scenario().arg(&path).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("badload.toml:5:1") && err.contains("field `rate`"),
        "{err}"
    );

    // an unknown flaw is refused before any server is started
    let out = scenario()
        .args(["load_id", "--flaw", "meteor_strike"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown flaw `meteor_strike`") && err.contains("stock_two_step"),
        "{err}"
    );
}

/// A panic is a bench failure, not a verdict: exit code 3 with the command and a replay line,
/// from the main thread and from any other thread (a checker or sweep thread's panic used to
/// surface as exit code 101).
#[test]
fn a_panic_anywhere_exits_3_with_the_command_and_a_replay_line() {
    for place in ["main", "thread"] {
        let out = scenario()
            .args(["list"])
            .env("SCENARIO_TEST_PANIC", place)
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{place}: {err}");
        assert!(err.contains("BENCH FAILURE"), "{place}: {err}");
        assert!(
            err.contains("command: ") && err.contains(" list"),
            "{place}: {err}"
        );
        assert!(err.contains("replay:  "), "{place}: {err}");
        assert!(
            err.contains(&format!("SCENARIO_TEST_PANIC={place}")),
            "{place}: {err}"
        );
    }
}

/// The regression of the blind-write flaw: the covering model reports the duplicate as a
/// violation with a counterexample (exit 1), never a panic.
#[test]
fn a_flawed_model_exits_1_with_a_counterexample() {
    let out = scenario()
        .args(["model", "segment", "--flaw", "segment_no_version_check"])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("ids.unique") && text.contains("counterexample ("),
        "{text}"
    );
}
