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
        "redis_incr_rdb",
        "redis_incr_everysec",
        "redis_incr_always",
        "postgres_sequence",
        "postgres_sequence_kill",
        "postgres_sequence_pause",
        "redis_incr_partition",
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
         [workload]\nrate_per_s = 300\n[faults]\nkinds = [\"loss\"]\nswarm = false\nevery_ms = [50, 100]\n",
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
    for key in [
        "date (UTC)",
        "commit",
        "host",
        "cores",
        "command",
        "bench version",
    ] {
        assert!(
            doc["meta"][key].is_string(),
            "run metadata lacks {key}: {doc}"
        );
    }
    assert!(
        doc["fault_effects"]["net.dropped_by_loss"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "{doc}"
    );
}

/// A scenario file whose only fault kind can never fire (its interval outlasts the run).
fn scenario_with_a_fault_that_never_fires(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("quiet.toml");
    std::fs::write(
        &file,
        "name = \"quiet\"\ndescription = \"a fault kind that never fires\"\n[run]\nsafety_ms = 300\nliveness_ms = 1000\n\
         [workload]\nrate_per_s = 100\n[faults]\nkinds = [\"loss\"]\nswarm = false\nevery_ms = 100000\n",
    )
    .expect("write");
    file
}

#[test]
fn a_replayed_seed_warns_about_faults_that_did_not_occur_and_exits_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = scenario_with_a_fault_that_never_fires(dir.path());
    let out = scenario()
        .arg(&file)
        .args(["--seed", "7", "--seeds", "1"])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("warning: seed 7: fault kinds that did not occur: loss"),
        "{stdout}"
    );
    assert!(!stdout.contains("FAULT NEVER TOOK EFFECT"), "{stdout}");
}

#[test]
fn a_sweep_in_which_a_fault_kind_never_took_effect_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = scenario_with_a_fault_that_never_fires(dir.path());
    let json = dir.path().join("out.json");
    let out = scenario()
        .arg(&file)
        .args(["--seeds", "8", "--json"])
        .arg(&json)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAULT NEVER TOOK EFFECT: loss"), "{stdout}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("valid json");
    assert_eq!(doc["coverage_judged"], true, "{doc}");
    assert_eq!(doc["vacuous_faults"][0], "loss", "{doc}");
}

#[test]
fn no_arguments_print_the_usage_and_exit_2() {
    let out = scenario().output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Usage: scenario"), "{stderr}");
    assert!(
        stderr.contains("--seeds"),
        "the options are listed: {stderr}"
    );
}

#[test]
fn flags_that_do_not_apply_to_the_run_are_refused_with_exit_2() {
    let out = scenario()
        .args(["clock_skew", "--rate", "100", "--users", "3"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`clock_skew` is a simulation; --rate, --users do not apply"),
        "{stderr}"
    );
    let out = scenario()
        .args(["load_id", "--seeds", "3"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`load_id` is a load run; --seeds does not apply"),
        "{stderr}"
    );
}

#[test]
fn a_host_without_a_scheme_is_refused_with_exit_2() {
    let out = scenario()
        .args(["load_id", "--host", "127.0.0.1:9", "--duration", "1"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "--host `127.0.0.1:9` has no scheme: give a base URL such as http://127.0.0.1:9"
        ),
        "{stderr}"
    );
}

#[test]
fn every_check_ends_with_a_one_line_verdict() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = scenario_with_a_fault_that_never_fires(dir.path());
    let pass = scenario()
        .arg(&file)
        .args(["--seeds", "1"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&pass.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("PASS: scenario ") && last.contains("--seeds 1") && last.ends_with(" s)"),
        "{stderr}"
    );
    let fail = scenario()
        .arg(&file)
        .args(["--seeds", "8"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&fail.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("FAIL (a finding: see above): scenario "),
        "{stderr}"
    );
    let list = scenario().arg("list").output().expect("run");
    assert!(
        !String::from_utf8_lossy(&list.stderr).contains("PASS"),
        "a list is not a check"
    );
}

#[test]
fn flaws_lists_the_catalog_and_runs_one_flaw_to_a_violation() {
    let out = scenario().args(["flaws", "--list"]).output().expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let (catalog, upstream) = text.split_once("\n\n").expect("two sections");
    assert_eq!(
        catalog.lines().count(),
        sut::flaw::Flaw::ALL.len(),
        "{text}"
    );
    assert!(catalog.contains("twitter/snowflake issue #6"), "{text}");
    assert!(upstream.starts_with("process mode"), "{text}");
    assert_eq!(upstream.matches("https://github.com/").count(), 5, "{text}");

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
    // The check stopped at that violation: what it did not decide is not reported as holding.
    assert!(
        text.contains("not checked (stopped at the first violation)"),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.trim_end().ends_with(" holds")),
        "no property is said to hold after an early stop: {text}"
    );
}

/// A scenario of segment IDs alone that claims to reach a lottery edge state (and a rare
/// segment one, judged only over 200 seeds).
fn scenario_owning_an_edge_it_cannot_reach(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("unreachable.toml");
    std::fs::write(
        &file,
        "name = \"unreachable\"\ndescription = \"owns an edge state its workload never reaches\"\n\
         [run]\nsafety_ms = 300\nliveness_ms = 1000\n\
         [workload]\nrate_per_s = 100\n[workload.mix]\nsegment = 1\nsnowflake = 0\nsemantic = 0\n\
         jwt = 0\nonce = 0\ndraw = 0\n\
         [edges]\nexpect = [\"participant.empty_rollback\"]\nrare = [\"segment.cas_retries_spent\"]\n",
    )
    .expect("write");
    file
}

#[test]
fn a_sweep_that_never_reaches_an_owned_edge_state_exits_1_and_a_replay_does_not_judge_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = scenario_owning_an_edge_it_cannot_reach(dir.path());
    let json = dir.path().join("out.json");
    let out = scenario()
        .arg(&file)
        .args(["--seeds", "8", "--json"])
        .arg(&json)
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("EDGE STATE NEVER REACHED: participant.empty_rollback"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(judged over 200 seeds or more)"),
        "the rare one is shown, not judged: {stdout}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("valid json");
    assert_eq!(
        doc["edges_owned_unreached"],
        serde_json::json!(["participant.empty_rollback"]),
        "{doc}"
    );
    assert!(
        doc["edges"]["segment.empty_while_granting"].as_u64() > Some(0),
        "the segment workload's own edge states are counted: {doc}"
    );
    let replay = scenario()
        .arg(&file)
        .args(["--seed", "3", "--seeds", "1"])
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(0), "{stdout}");
}

#[test]
fn an_unknown_edge_state_in_a_scenario_file_is_a_usage_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("typo.toml");
    std::fs::write(
        &file,
        "name = \"typo\"\ndescription = \"d\"\n[edges]\nexpect = [\"participant.empty_rolback\"]\n",
    )
    .expect("write");
    let out = scenario().arg(&file).output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`participant.empty_rolback` is neither an edge state nor a machine"),
        "{stderr}"
    );
}

#[test]
fn every_declared_edge_state_is_owned_by_a_named_scenario_or_a_model() {
    let out = scenario()
        .arg("edges")
        .output()
        .expect("run scenario edges");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("participant.empty_rollback"), "{text}");
    assert!(
        !text.contains("owned by no scenario or model"),
        "an edge state nothing is there to reach proves nothing:\n{text}"
    );
}

#[test]
fn a_closed_stdout_ends_a_listing_quietly_rather_than_as_a_bench_failure() {
    // `scenario list | head -1`: the reader goes away; here before the first line is written.
    let mut child = scenario()
        .arg("list")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("BENCH FAILURE"), "{stderr}");
}

#[test]
fn a_real_system_run_refuses_flags_that_do_not_apply_and_bad_files_name_the_field() {
    // Both are refused before any system is started (no Redis needed).
    let out = scenario()
        .args(["redis_incr_rdb", "--seeds", "3"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a real-system run"), "{stderr}");
    assert!(stderr.contains("--seeds"), "{stderr}");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("real.toml");
    std::fs::write(
        &path,
        "name = \"r\"\ndescription = \"d\"\n[cluster]\nsystem = \"redis_incr\"\n\
         persistence = \"rdb\"\n[clients]\ncount = 2\nduration_s = 1\n\
         [nemesis]\nfault = \"kill\"\nevery_ms = 100\ndown_ms = 10\n",
    )
    .expect("write");
    let out = scenario().arg(&path).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("real.toml"), "{stderr}");
    assert!(stderr.contains("cluster.snapshot_after_s"), "{stderr}");
}
