//! Scripted fault schedules and `scenario search`: a schedule replays deterministically and its
//! faults are counted; a search on a flawed build finds a violation, shrinks it, writes a file
//! that `scenario replay` reproduces, and tries that file first next time; a search on the
//! correct implementation finds nothing. Runs are shortened (debug builds are slow).

use std::path::Path;
use std::process::Command;

use scenarios::search::{run_scripted, violation_of};
use sim::scenario::{FaultKind, Scenario, ScheduledFault};

fn scenario_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_scenario"))
}

/// A named scenario with short phases, written to `dir` as a file (what the CLI tests search).
fn short(name: &str, safety_ms: u64, liveness_ms: u64, dir: &Path) -> (Scenario, String) {
    let mut s = scenarios::load(name).expect("named scenario");
    s.run.safety_ms = safety_ms;
    s.run.liveness_ms = liveness_ms;
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml::to_string(&s).expect("toml")).expect("write");
    (s, path.to_str().expect("utf-8 path").to_owned())
}

#[test]
fn a_scripted_schedule_replays_exactly_and_its_faults_are_counted() {
    let mut s = scenarios::load("token_replay").expect("named");
    s.run.safety_ms = 1_500;
    s.run.liveness_ms = 1_000;
    let mut bump = ScheduledFault::new(200, FaultKind::ClockBump);
    bump.node = Some("token".into());
    bump.delta_ms = Some(-5_000);
    let mut kill = ScheduledFault::new(300, FaultKind::Kill);
    kill.node = Some("token".into());
    kill.down_ms = Some(400);
    kill.tear = true;
    let mut partition = ScheduledFault::new(800, FaultKind::Partition);
    partition.nodes = vec!["token".into()];
    partition.down_ms = Some(300);
    let mut loss = ScheduledFault::new(1_100, FaultKind::Loss);
    loss.loss_pct = Some(20);
    loss.down_ms = Some(200);
    s.schedule = Some(vec![partition, bump, kill, loss]);
    // Through the file format, as a user would write it.
    let text = toml::to_string(&s).expect("toml");
    let s = Scenario::parse("scripted.toml", &text).expect("parses");

    let a = sim::run::run_seed(&s, 3, false);
    let b = sim::run::run_seed(&s, 3, false);
    assert_eq!(
        a.trace_hash, b.trace_hash,
        "the same schedule and seed replay exactly"
    );
    // Exactly the scripted faults, at their times, and nothing random.
    let spans: Vec<(&str, u64)> = a
        .faults
        .iter()
        .map(|f| (f.kind.as_str(), f.start_ms))
        .collect();
    assert_eq!(
        spans,
        vec![
            ("clock_bump", 200),
            ("kill", 300),
            ("partition", 800),
            ("loss", 1_100)
        ]
    );
    let count = |k: &str| a.coverage.get(k).copied().unwrap_or(0);
    assert_eq!(count("fault.kill"), 1);
    assert_eq!(count("crash.kills"), 1);
    assert_eq!(count("fault.partition"), 1);
    assert!(count("net.dropped_by_partition") > 0, "{:?}", a.coverage);
    assert!(count("net.dropped_by_loss") > 0, "{:?}", a.coverage);
    assert!(
        a.violations().next().is_none(),
        "the correct implementation holds"
    );
    // The sweep's vacuity check looks at the scripted kinds.
    assert_eq!(
        s.fault_kinds(),
        vec![
            FaultKind::Partition,
            FaultKind::Loss,
            FaultKind::Kill,
            FaultKind::ClockBump
        ]
    );
    // A different seed is a different run of the same schedule.
    assert_ne!(sim::run::run_seed(&s, 4, false).trace_hash, a.trace_hash);
    // An empty schedule injects nothing, even though [faults] kinds lists four kinds.
    let mut quiet = s.clone();
    quiet.schedule = Some(Vec::new());
    let q = sim::run::run_seed(&quiet, 3, false);
    assert!(q.faults.is_empty(), "{:?}", q.faults);
    assert!(q.enabled_faults.is_empty());
}

#[test]
fn search_finds_shrinks_writes_and_replays_a_flaw() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, file) = short("tcc_storm", 1_000, 2_000, dir.path());
    let regressions = dir.path().join("regressions");
    let out = dir.path().join("found.toml");
    let run = scenario_cmd()
        .args(["search", &file, "--flaw", "tcc_no_fence", "--cases", "8"])
        .args([
            "--events-max",
            "4",
            "--shrink-max",
            "4",
            "--keep",
            "--regressions",
        ])
        .arg(&regressions)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run search");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("timeline:"), "{stdout}");
    let violated = stdout
        .lines()
        .find_map(|l| l.strip_prefix("violated        "))
        .expect("a violated line");

    // The file replays the same violation: in-process, twice, identically ...
    let text = std::fs::read_to_string(&out).expect("the --out file");
    let found = Scenario::parse("found.toml", &text).expect("the written file parses");
    let invariant = found
        .run
        .expect
        .clone()
        .expect("the file names its invariant");
    assert!(violated.starts_with(&invariant), "{violated}");
    let events = found.schedule.as_ref().expect("a schedule").len();
    assert!(events <= 4, "{text}");
    let first = run_scripted(&found);
    let detail = violation_of(&first, &invariant).expect("the replay violates it again");
    assert!(violated.ends_with(&detail), "{violated}\n{detail}");
    assert_eq!(run_scripted(&found).trace_hash, first.trace_hash);

    // ... and through `scenario replay`, and `scenario FILE`.
    let replay = scenario_cmd()
        .arg("replay")
        .arg(&out)
        .output()
        .expect("run replay");
    let replay_out = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(replay.status.code(), Some(1), "{replay_out}");
    assert!(
        replay_out.contains(&format!("reproduced      {invariant}")),
        "{replay_out}"
    );
    let plain = scenario_cmd().arg(&out).output().expect("run file");
    assert_eq!(plain.status.code(), Some(1));

    // The failure was kept (`--keep`), and the next search tries it first.
    let kept: Vec<_> = std::fs::read_dir(&regressions)
        .expect("regressions folder")
        .collect();
    assert_eq!(kept.len(), 1);
    let again = scenario_cmd()
        .args(["search", &file, "--flaw", "tcc_no_fence", "--cases", "8"])
        .arg("--regressions")
        .arg(&regressions)
        .output()
        .expect("run search again");
    let again_out = String::from_utf8_lossy(&again.stdout);
    assert_eq!(again.status.code(), Some(1), "{again_out}");
    assert!(
        again_out.contains("replaying the regression file"),
        "{again_out}"
    );
}

#[test]
fn search_on_the_correct_implementation_finds_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, file) = short("token_replay", 1_500, 1_000, dir.path());
    let run = scenario_cmd()
        .args(["search", &file, "--cases", "3", "--events-max", "4"])
        .arg("--regressions")
        .arg(dir.path().join("regressions"))
        .output()
        .expect("run search");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("no violation in 3 case(s)"), "{stdout}");
    assert!(!dir.path().join("regressions").exists());
}

#[test]
fn search_usage_errors_exit_2() {
    let run = scenario_cmd().arg("search").output().expect("run");
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("name a scenario, or a flaw"));
    let run = scenario_cmd()
        .args(["search", "no_such_scenario"])
        .output()
        .expect("run");
    assert_eq!(run.status.code(), Some(2));
    let run = scenario_cmd()
        .args(["search", "tcc_storm", "--flaw", "no_such_flaw"])
        .output()
        .expect("run");
    assert_eq!(run.status.code(), Some(2));
}

#[test]
fn committed_regression_files_parse_and_name_what_they_expect() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let entries = std::fs::read_dir(&dir).expect("scenarios/regressions is committed");
    let mut seen = 0;
    for entry in entries {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|x| x != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let s =
            Scenario::parse(&path.display().to_string(), &text).unwrap_or_else(|e| panic!("{e}"));
        assert!(s.schedule.is_some(), "{}: no schedule", path.display());
        assert!(s.run.expect.is_some(), "{}: no expect", path.display());
        assert!(s.run.seed.is_some(), "{}: no seed", path.display());
        assert_eq!(
            path.file_name().and_then(|n| n.to_str()),
            Some(
                scenarios::search::regression_name(
                    &s.name,
                    s.run.flaw,
                    s.run.expect.as_deref().unwrap_or("")
                )
                .as_str()
            )
        );
        seen += 1;
    }
    assert!(
        seen >= 13,
        "one regression per known flaw at least, found {seen}"
    );
}

/// Two committed regressions replayed (debug builds are slow: a flaw that needs no fault, and
/// one whose minimal schedule is a single latency spike): each still violates what it expects.
#[test]
fn committed_regressions_still_fail_as_they_expect() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    for file in [
        "token_replay-once_check_then_delete-tokens_single_use.toml",
        "tcc_storm-tcc_no_fence-lottery_no_hanging.toml",
    ] {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).expect("committed regression");
        let s = Scenario::parse(file, &text).expect("parses");
        let invariant = s.run.expect.clone().expect("expect");
        let outcome = run_scripted(&s);
        assert!(
            violation_of(&outcome, &invariant).is_some(),
            "{file} no longer violates {invariant}"
        );
    }
}

#[test]
fn a_failing_crash_point_is_searched_around_written_and_replayed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, file) = short("tcc_storm", 1_500, 4_000, dir.path());
    let out = dir.path().join("found.toml");
    let found = scenario_cmd()
        .args([
            "search",
            &file,
            "--flaw",
            "coord_try_before_begin",
            "--crash-at",
            "coord:send:tcc.try.wallet#1",
            "--cases",
            "8",
            "--fresh",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("search");
    let text = String::from_utf8_lossy(&found.stdout).into_owned();
    assert_eq!(found.status.code(), Some(1), "{text}");
    assert!(
        text.contains("crash point coord:send:tcc.try.wallet#1"),
        "{text}"
    );
    let written = std::fs::read_to_string(&out).expect("the file");
    assert!(
        written.contains("crash_at = \"coord:send:tcc.try.wallet#1\""),
        "{written}"
    );
    let replay = scenario_cmd()
        .arg("replay")
        .arg(&out)
        .output()
        .expect("replay");
    let stderr = String::from_utf8_lossy(&replay.stderr);
    assert_eq!(replay.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("REPRODUCED"), "{stderr}");
    // Without the crash point the same file passes: the point is what breaks it.
    let without = written.replace("crash_at = \"coord:send:tcc.try.wallet#1\"\n", "");
    let plain = dir.path().join("plain.toml");
    std::fs::write(&plain, without).expect("write");
    let replay = scenario_cmd()
        .arg("replay")
        .arg(&plain)
        .output()
        .expect("replay");
    assert_eq!(
        replay.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&replay.stdout)
    );
}
