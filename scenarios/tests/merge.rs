//! `scenario merge`: a sweep split into shards (`--shard I/N --coverage union --json FILE`) and
//! merged is the unsplit sweep (seeds, violations, fault and edge coverage), judged on the
//! union; shards of different builds or scenarios, seeds run twice, missing seeds and files
//! that are not a shard's are refused with exit 2, naming the file and what is wrong.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn scenario() -> Command {
    Command::new(env!("CARGO_BIN_EXE_scenario"))
}

/// Runs `scenario ARGS`; the output, with stdout and stderr for assertion messages.
fn run(args: &[&str]) -> (Output, String) {
    let out = scenario().args(args).output().expect("run scenario");
    let text = format!(
        "$ scenario {}\n--- stdout\n{}\n--- stderr\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("valid json")
}

fn write_json(path: &Path, doc: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(doc).expect("json")).expect("write");
}

/// Segment IDs under message loss, owning an edge state its workload reaches: short seeds, one
/// fault kind, one owned edge state.
fn shardable(dir: &Path) -> PathBuf {
    let file = dir.join("shardable.toml");
    std::fs::write(
        &file,
        "name = \"shardable\"\ndescription = \"segment IDs under message loss\"\n\
         [run]\nsafety_ms = 300\nliveness_ms = 1000\n\
         [workload]\nrate_per_s = 100\n[workload.mix]\nsegment = 1\nsnowflake = 0\nsemantic = 0\n\
         jwt = 0\nonce = 0\ndraw = 0\n\
         [faults]\nkinds = [\"loss\"]\nswarm = false\nevery_ms = [50, 100]\n\
         [edges]\nexpect = [\"segment.empty_while_granting\"]\n",
    )
    .expect("write");
    file
}

/// Runs shard `i` of `n` (counted from 0 here; the command line counts from 1) of seeds
/// 0..`seeds` of `name` with `--coverage union`; its JSON and
/// exit code.
fn shard(dir: &Path, name: &str, seeds: u64, i: u64, n: u64, extra: &[&str]) -> (PathBuf, i32) {
    let json = dir.join(format!("shard-{i}-of-{n}.json"));
    let seeds = seeds.to_string();
    let shard = format!("{}/{n}", i + 1);
    let mut args = vec![
        name,
        "--seeds",
        &seeds,
        "--shard",
        &shard,
        "--jobs",
        "2",
        "--coverage",
        "union",
        "--json",
        path_str(&json),
    ];
    args.extend_from_slice(extra);
    let (out, text) = run(&args);
    let code = out.status.code().expect("exit code");
    assert!(code == 0 || code == 1, "{text}");
    (json, code)
}

/// Runs `scenario merge FILES ARGS`.
fn merge(files: &[&Path], args: &[&str]) -> (Output, String) {
    let mut all = vec!["merge"];
    all.extend(files.iter().map(|f| path_str(f)));
    all.extend_from_slice(args);
    run(&all)
}

#[test]
fn four_shards_merged_are_the_unsplit_sweep() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = shardable(dir.path());
    let name = path_str(&file);
    let full = dir.path().join("full.json");
    let (out, text) = run(&[
        name,
        "--seeds",
        "16",
        "--jobs",
        "2",
        "--json",
        path_str(&full),
    ]);
    assert_eq!(out.status.code(), Some(0), "{text}");

    let shards: Vec<PathBuf> = (0..4)
        .map(|i| {
            let (json, code) = shard(dir.path(), name, 16, i, 4, &[]);
            assert_eq!(code, 0, "shard {i}");
            json
        })
        .collect();
    // A shard with `--coverage union` records its coverage and does not judge it.
    let first = read_json(&shards[0]);
    assert_eq!(first["coverage"], "union");
    assert_eq!(first["coverage_judged"], false);
    assert_eq!(first["shard"], serde_json::json!({"number": 1, "count": 4}));
    assert_eq!(
        first["range"],
        serde_json::json!({"first_seed": 0, "count": 16})
    );
    assert_eq!(first["seeds"], serde_json::json!([0, 4, 8, 12]));
    assert!(first["build"]["commit"].is_string(), "{first}");
    assert!(first["scenario_hash"].is_string(), "{first}");

    let merged = dir.path().join("merged.json");
    let report = dir.path().join("report");
    let junit = dir.path().join("merged-junit.xml");
    let refs: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();
    let (out, text) = merge(
        &refs,
        &[
            "--json",
            path_str(&merged),
            "--report",
            path_str(&report),
            "--junit",
            path_str(&junit),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("seed range      0..16 (16 seeds; 0 ran in no shard)"),
        "{text}"
    );
    assert!(text.contains("segment.empty_while_granting"), "{text}");

    let (full_doc, merged_doc) = (read_json(&full), read_json(&merged));
    for key in [
        "seeds",
        "seeds_run",
        "violations",
        "events",
        "ids_lost",
        "fault_effects",
        "vacuous_faults",
        "coverage_judged",
        "edges",
        "edge_seeds",
        "edges_owned_unreached",
        "edges_never_reached",
        "scenario_hash",
        "build",
        "range",
    ] {
        assert_eq!(
            full_doc[key], merged_doc[key],
            "{key} differs between the unsplit sweep and the merge"
        );
    }
    assert_eq!(merged_doc["coverage_judged"], true);
    assert!(merged_doc["edges"]["segment.empty_while_granting"].as_u64() > Some(0));
    let hashes = |doc: &Value| -> Vec<Value> {
        doc["outcomes"]
            .as_array()
            .expect("outcomes")
            .iter()
            .map(|o| o["trace_hash"].clone())
            .collect()
    };
    assert_eq!(
        hashes(&full_doc),
        hashes(&merged_doc),
        "every seed's history is the same"
    );

    let html = std::fs::read_to_string(report.join("index.html")).expect("index.html");
    assert!(
        html.contains("shardable") && html.contains("<svg"),
        "report"
    );
    assert!(html.contains("merged from 4 shards"), "report title");
    let summary = read_json(&report.join("summary.json"));
    assert_eq!(summary["results"][0]["seeds_run"], 16);
    assert!(report.join("junit.xml").is_file());
    let xml = std::fs::read_to_string(&junit).expect("junit");
    assert!(
        xml.contains("<testsuite") && xml.contains("edges.reached"),
        "{xml}"
    );

    // A merge's JSON is a sweep file of its own: it merges again, with the same verdict.
    let (out, text) = merge(&[&merged], &[]);
    assert_eq!(out.status.code(), Some(0), "{text}");
}

#[test]
fn a_violation_in_one_shard_is_listed_with_its_replay_line_and_the_merge_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let flaw = ["--flaw", "segment_no_version_check"];
    let results: Vec<(PathBuf, i32)> = (0..2)
        .map(|i| shard(dir.path(), "segment_race", 10, i, 2, &flaw))
        .collect();
    assert!(
        results.iter().any(|(_, code)| *code == 1),
        "the flaw is caught in some shard"
    );
    let violating: Vec<u64> = results
        .iter()
        .flat_map(|(json, _)| {
            read_json(json)["violations"]
                .as_array()
                .expect("violations")
                .iter()
                .map(|v| v["seed"].as_u64().expect("seed"))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!violating.is_empty());

    let report = dir.path().join("report");
    let junit = dir.path().join("junit.xml");
    let refs: Vec<&Path> = results.iter().map(|(p, _)| p.as_path()).collect();
    let (out, text) = merge(
        &refs,
        &["--report", path_str(&report), "--junit", path_str(&junit)],
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    let seed = violating[0];
    let replay = format!(
        "cargo run --release --bin scenario -- segment_race --seed {seed} --seeds 1 --flaw \
         segment_no_version_check"
    );
    assert!(text.contains(&format!("VIOLATION seed {seed}:")), "{text}");
    assert!(text.contains(&format!("  replay: {replay}")), "{text}");
    let html = std::fs::read_to_string(report.join("index.html")).expect("index.html");
    assert!(html.contains(&replay), "the report lists the replay line");
    let summary = read_json(&report.join("summary.json"));
    let listed = summary["results"][0]["violations"]
        .as_array()
        .expect("violations")
        .len();
    assert_eq!(listed, violating.len(), "every violation is listed");
    let xml = std::fs::read_to_string(&junit).expect("junit");
    assert!(xml.contains(&format!("replay: {replay}")), "{xml}");
    assert!(xml.contains("<failure"), "{xml}");
}

/// Removes every trace of the loss fault's effect and of the owned edge state from a shard's
/// outcomes: the shard then saw neither, though the other shards did.
fn without_loss_and_edge(doc: &mut Value) {
    for outcome in doc["outcomes"].as_array_mut().expect("outcomes") {
        let coverage = outcome["coverage"].as_object_mut().expect("coverage");
        coverage.retain(|k, _| k != "net.dropped_by_loss");
        let edges = outcome["edges"].as_object_mut().expect("edges");
        edges.retain(|k, _| k != "segment.empty_while_granting");
    }
}

#[test]
fn coverage_is_judged_on_the_union_where_one_shard_alone_fails_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = shardable(dir.path());
    let name = path_str(&file);
    let (a, code_a) = shard(dir.path(), name, 16, 0, 2, &[]);
    let (b, code_b) = shard(dir.path(), name, 16, 1, 2, &[]);
    assert_eq!((code_a, code_b), (0, 0));
    // Shard 0 (8 seeds, enough to judge) made to have seen neither the fault nor the edge.
    let mut doc = read_json(&a);
    without_loss_and_edge(&mut doc);
    write_json(&a, &doc);

    let (out, text) = merge(&[&a], &["--allow-missing"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "alone, shard 0 fails coverage: {text}"
    );
    assert!(text.contains("FAULT NEVER TOOK EFFECT: loss"), "{text}");
    assert!(
        text.contains("EDGE STATE NEVER REACHED: segment.empty_while_granting"),
        "{text}"
    );
    assert!(text.contains("SEEDS NOT RUN   1..=15 step 2"), "{text}");

    let (out, text) = merge(&[&a, &b], &[]);
    assert_eq!(out.status.code(), Some(0), "the union covers both: {text}");
    assert!(!text.contains("NEVER"), "{text}");
}

#[test]
fn a_union_shard_exits_0_where_the_same_shard_judged_alone_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let quiet = dir.path().join("quiet.toml");
    // A fault that never fires: judged alone, 8 seeds fail coverage; with --coverage union the
    // shard leaves the verdict to the merge (which fails it: no shard saw it take effect).
    std::fs::write(
        &quiet,
        "name = \"quiet\"\ndescription = \"a fault kind that never fires\"\n[run]\nsafety_ms = 300\n\
         liveness_ms = 1000\n[workload]\nrate_per_s = 100\n[faults]\nkinds = [\"loss\"]\n\
         swarm = false\nevery_ms = 100000\n",
    )
    .expect("write");
    let name = path_str(&quiet);
    let (out, text) = run(&[name, "--seeds", "16", "--shard", "1/2"]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let (a, code_a) = shard(dir.path(), name, 16, 0, 2, &[]);
    let (b, code_b) = shard(dir.path(), name, 16, 1, 2, &[]);
    assert_eq!(
        (code_a, code_b),
        (0, 0),
        "a union shard's exit code is its violations'"
    );
    let (out, text) = merge(&[&a, &b], &[]);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("FAULT NEVER TOOK EFFECT: loss"), "{text}");
    // Without --json, --coverage union would lose what it defers.
    let (out, text) = run(&[name, "--seeds", "8", "--coverage", "union"]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("give --json FILE"), "{text}");
}

#[test]
fn shards_of_different_scenarios_or_builds_and_seeds_run_twice_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = shardable(dir.path());
    let name = path_str(&file);
    let (a, _) = shard(dir.path(), name, 8, 0, 2, &[]);
    let (b, _) = shard(dir.path(), name, 8, 1, 2, &[]);

    // Another scenario: the same file run with another --duration.
    let other = dir.path().join("other.json");
    let (out, text) = run(&[
        name,
        "--seeds",
        "8",
        "--shard",
        "2/2",
        "--duration",
        "0.2",
        "--coverage",
        "union",
        "--json",
        path_str(&other),
    ]);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let (out, text) = merge(&[&a, &other], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("ran different scenarios"), "{text}");
    assert!(text.contains("other.json"), "names the file: {text}");

    // Another build: the commit edited in one shard.
    let mut doc = read_json(&b);
    doc["build"]["commit"] = Value::from("0123456789abcdef0123456789abcdef01234567");
    let edited = dir.path().join("edited-commit.json");
    write_json(&edited, &doc);
    let (out, text) = merge(&[&a, &edited], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("ran on different builds"), "{text}");
    assert!(text.contains("0123456789abcdef"), "{text}");

    // The same file twice, and two ranges that overlap.
    let (out, text) = merge(&[&a, &a], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("both ran seed(s) 0..=6 step 2"), "{text}");
    let low = dir.path().join("low.json");
    let high = dir.path().join("high.json");
    for (json, first) in [(&low, "0"), (&high, "2")] {
        let (out, text) = run(&[
            name,
            "--seed",
            first,
            "--seeds",
            "4",
            "--coverage",
            "union",
            "--json",
            path_str(json),
        ]);
        assert_eq!(out.status.code(), Some(0), "{text}");
    }
    let (out, text) = merge(&[&low, &high], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("both ran seed(s) 2..=3"), "{text}");

    // A scenario edited in the file without its hash.
    let mut doc = read_json(&b);
    doc["scenario_toml"] = Value::from(
        doc["scenario_toml"]
            .as_str()
            .expect("toml")
            .replace("safety_ms = 300", "safety_ms = 301"),
    );
    write_json(&edited, &doc);
    let (out, text) = merge(&[&a, &edited], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("is not the hash of its scenario_toml"),
        "{text}"
    );
}

#[test]
fn missing_seeds_are_named_and_exit_2_unless_allowed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = shardable(dir.path());
    let name = path_str(&file);
    let shards: Vec<PathBuf> = [0, 1, 3]
        .into_iter()
        .map(|i| shard(dir.path(), name, 16, i, 4, &[]).0)
        .collect();
    let refs: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();
    let (out, text) = merge(&refs, &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(
            "4 of the 16 seeds of 0..16 ran in no shard: 2..=14 step 4 (no file of shard 3/4)"
        ),
        "{text}"
    );
    assert!(text.contains("--allow-missing"), "{text}");
    let merged = dir.path().join("merged.json");
    let (out, text) = merge(&refs, &["--allow-missing", "--json", path_str(&merged)]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "judged on the 12 seeds that ran: {text}"
    );
    assert!(text.contains("SEEDS NOT RUN   2..=14 step 4"), "{text}");
    let doc = read_json(&merged);
    assert_eq!(doc["seeds_run"], 12);
    assert_eq!(doc["seeds_missing"], serde_json::json!([2, 6, 10, 14]));
}

#[test]
fn files_that_are_not_a_shards_json_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = shardable(dir.path());
    let name = path_str(&file);
    let (a, _) = shard(dir.path(), name, 8, 0, 2, &[]);

    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{ not json").expect("write");
    let (out, text) = merge(&[&a, &garbage], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("garbage.json is not JSON"), "{text}");

    let summary = dir.path().join("summary.json");
    std::fs::write(
        &summary,
        r#"{"schema_version": 1, "title": "x", "results": []}"#,
    )
    .expect("write");
    let (out, text) = merge(&[&summary], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("summary.json is not the JSON of a simulated sweep"),
        "{text}"
    );

    let absent = dir.path().join("absent.json");
    let (out, text) = merge(&[&absent], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("cannot read") && text.contains("absent.json"),
        "{text}"
    );

    // A shard cut short: one outcome dropped.
    let mut doc = read_json(&a);
    doc["outcomes"].as_array_mut().expect("outcomes").pop();
    let cut = dir.path().join("cut.json");
    write_json(&cut, &doc);
    let (out, text) = merge(&[&cut], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("cut.json: its `seeds`"), "{text}");

    // A field missing.
    let mut doc = read_json(&a);
    doc.as_object_mut().expect("object").remove("range");
    write_json(&cut, &doc);
    let (out, text) = merge(&[&cut], &[]);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("cut.json") && text.contains("missing field `range`"),
        "{text}"
    );

    let (out, text) = run(&["merge"]);
    assert_eq!(out.status.code(), Some(2), "{text}");
}
