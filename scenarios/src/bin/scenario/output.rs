//! What a sweep prints and writes: the summary, fault and edge coverage, counters, operations, invariants, and the report folder.

use sim::run::Sweep;
use sim::scenario::Scenario;

use crate::shell_word;
use crate::sweepfile::{CoverageMode, Nondeterministic};

/// Writes the HTML report, `summary.json` and `junit.xml`, with the run's metadata added.
pub(crate) fn write_reports(
    dir: &std::path::Path,
    summary: &reports::model::Summary,
) -> Result<(), String> {
    let mut summary = summary.clone();
    for (key, value) in run_metadata() {
        summary.meta.entry(key).or_insert(value);
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    reports::write::write_report(dir, &summary).map_err(|e| e.to_string())?;
    reports::write::write_junit(&dir.join("junit.xml"), &summary).map_err(|e| e.to_string())
}

/// What a report needs to be compared with another: when, which code, on what machine, how.
pub(crate) fn run_metadata() -> std::collections::BTreeMap<String, String> {
    // The commit the binary was built from (`scenarios/build.rs`), not the current directory's:
    // a report made outside the checkout names it as well as one made inside.
    let commit = build_commit();
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let command = std::env::args()
        .map(|w| shell_word(&w))
        .collect::<Vec<_>>()
        .join(" ");
    [
        (
            "date (UTC)",
            chrono::Utc::now().format("%Y-%m-%d %H:%M:%S").to_string(),
        ),
        ("commit", commit),
        ("host", host),
        ("cores", cores.to_string()),
        ("command", command),
        (
            "bench version",
            format!("{} ({} build)", env!("CARGO_PKG_VERSION"), build_profile()),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The commit this binary was built from, shortened to 12 hex digits (with "uncommitted
/// changes" when the checkout had some), or "unknown (not built in a git checkout)".
pub(crate) fn build_commit() -> String {
    let full = env!("SCENARIO_BUILD_COMMIT");
    if full == "unknown" {
        return "unknown (not built in a git checkout)".to_owned();
    }
    let (hash, dirty) = full
        .split_once("-dirty-")
        .map_or((full, false), |(hash, _)| (hash, true));
    let short: String = hash.chars().take(12).collect();
    if dirty {
        format!("{short} (with uncommitted changes)")
    } else {
        short
    }
}

/// The cargo profile this binary was built with (`debug`, `release`, `sweep`, with `+pgo` for
/// a PGO build; `scenarios/build.rs`): figures from a debug build are not comparable with
/// release ones.
pub(crate) const fn build_profile() -> &'static str {
    env!("SCENARIO_BUILD_PROFILE")
}

/// What a sweep prints: figures, operations, counters, invariants, fault and edge coverage
/// (judged here, or recorded for `scenario merge` with `--coverage union`), then every
/// nondeterministic seed and the first violations with the line that replays each (`replay`).
pub(crate) fn print_summary(
    scenario: &Scenario,
    sweep: &Sweep,
    replay: &dyn Fn(u64) -> String,
    nondeterministic: &[Nondeterministic],
    coverage: CoverageMode,
) {
    let sim_s: f64 = sweep.seeds.iter().map(|s| s.sim_ms as f64 / 1_000.0).sum();
    let events: u64 = sweep.seeds.iter().map(|s| s.events).sum();
    let seed_wall: f64 = sweep.seeds.iter().map(|s| s.wall_seconds).sum();
    println!("scenario        {}", scenario.name);
    println!("seeds run       {}", sweep.seeds.len());
    println!("simulated       {sim_s:.1} s ({events} history events)");
    println!(
        "wall            {:.2} s (time compression {:.0}x per thread)",
        sweep.wall_seconds,
        sim_s / seed_wall.max(1e-9)
    );
    let lost: u64 = sweep.seeds.iter().map(|s| s.ids_lost).sum();
    println!("segment IDs lost to faults (never issued, within the bound): {lost}");
    print_operations(sweep);
    print_counters(&sweep.coverage);
    print_invariants(sweep);
    match coverage {
        CoverageMode::Sweep => {
            print_fault_coverage(scenario, sweep);
            print_edges(scenario, sweep);
        }
        CoverageMode::Union => print_deferred_coverage(scenario, sweep),
    }
    for n in nondeterministic {
        println!(
            "NOT DETERMINISTIC: seed {} gave history hashes {:016x} and {:016x}",
            n.seed, n.first_hash, n.second_hash
        );
    }
    let violations = sweep.violations().count();
    for (shown, (seed, v)) in sweep.violations().enumerate() {
        if shown == 5 {
            println!(
                "... and {} more violation(s) (every one in --json FILE and --report DIR)",
                violations - shown
            );
            break;
        }
        println!("VIOLATION seed {seed}: {}: {}", v.invariant, v.detail);
        if let Some(event) = v.event {
            println!("  first offending event: #{event}");
        }
        if let Some(knobs) = sweep
            .seeds
            .iter()
            .find(|s| s.seed == seed)
            .map(|s| &s.buggify)
            && !knobs.is_empty()
        {
            println!("  BUGGIFY: {}", knobs.join("; "));
        }
        println!("  replay: {}", replay(seed));
    }
    print_crash_points(sweep, replay);
}

/// Crash points: how many were found and tried, what the tries found (each failing point with
/// the line that replays it), and what no seed could try.
fn print_crash_points(sweep: &Sweep, replay: &dyn Fn(u64) -> String) {
    let Some(points) = sweep.crash_points() else {
        return;
    };
    for (seed, struck) in &points.struck {
        match struck.crashed_at_ms {
            Some(ms) => println!(
                "seed {seed}: crash point {} struck at {ms} ms (the run above is the seed's with \
                 that crash)",
                struck.plan.spec()
            ),
            None => println!(
                "seed {seed}: crash point {} NOT REACHED: the run never arrived there (another \
                 seed, flaw or scenario than the one that found it?); nothing was crashed",
                struck.plan.spec()
            ),
        }
    }
    if !points.struck.is_empty() {
        return;
    }
    println!(
        "crash points: {} distinct found ({} over the seeds), {} distinct tried in {} run(s) with a crash, {} failed",
        points.found.len(),
        points.found_in_seeds,
        points.tried.len(),
        points.runs,
        points.failed.len()
    );
    let untried: Vec<String> = points
        .found
        .difference(&points.tried)
        .map(ToString::to_string)
        .collect();
    if !untried.is_empty() {
        println!(
            "  never tried (over the budget in every seed that found them; more seeds or a larger --crash-points tries them): {}",
            untried.join(", ")
        );
    }
    for (seed, plan) in &points.unreached {
        println!(
            "  seed {seed}: crash point {} not reached in its run (its node went down first):              nothing was tried there",
            plan.spec()
        );
    }
    let violations = sweep.crash_violations().count();
    for (shown, (seed, tried, v)) in sweep.crash_violations().enumerate() {
        if shown == 5 {
            println!(
                "... and {} more at crash points (every one in --json FILE and --report DIR)",
                violations - shown
            );
            break;
        }
        let at = tried
            .crashed_at_ms
            .map_or_else(String::new, |ms| format!(" (at {ms} ms)"));
        println!(
            "VIOLATION seed {seed}, crash point {}{at}: {}: {}",
            tried.key, v.invariant, v.detail
        );
        if let Some(event) = v.event {
            println!("  first offending event: #{event} (of that run's history)");
        }
        println!(
            "  replay: {}",
            scenarios::report::crash_replay(&replay(seed), &tried.plan)
        );
    }
}

/// A shard run with `--coverage union`: what its seeds did not reach, said without a verdict
/// (`scenario merge` judges coverage on the union of the shards).
fn print_deferred_coverage(scenario: &Scenario, sweep: &Sweep) {
    let missed: Vec<&str> = scenario
        .fault_kinds()
        .into_iter()
        .filter(|kind| !sim::run::took_effect(*kind, &sweep.coverage))
        .map(|kind| kind.name())
        .collect();
    let unreached = sim::run::unreached_edges(
        scenario,
        &sweep.edges,
        sim::run::RARE_EDGE_SEEDS_MIN.max(sweep.seeds.len()),
    );
    let list = |names: &[&str]| {
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    println!(
        "coverage: left to `scenario merge` (--coverage union), judged on the union of the shards"
    );
    println!(
        "  fault kinds that took no effect in this shard: {}",
        list(&missed)
    );
    let unreached: Vec<&str> = unreached.iter().map(String::as_str).collect();
    println!(
        "  owned edge states this shard did not reach: {}",
        list(&unreached)
    );
}

/// Fault coverage: judged over a sweep of at least `COVERAGE_SEEDS_MIN` seeds (a kind that never
/// took effect fails it); for fewer seeds (a replay), said per seed as a warning.
pub(crate) fn print_fault_coverage(scenario: &Scenario, sweep: &Sweep) {
    if sweep.coverage_judged() {
        for kind in &sweep.vacuous_faults {
            println!(
                "FAULT NEVER TOOK EFFECT: {} (counters {:?} stayed 0): the sweep proves nothing about it",
                kind.name(),
                kind.effect_counters()
            );
        }
        return;
    }
    for seed in &sweep.seeds {
        let missed: Vec<&str> = scenario
            .fault_kinds()
            .into_iter()
            .filter(|kind| !sim::run::took_effect(*kind, &seed.coverage))
            .map(|kind| kind.name())
            .collect();
        if !missed.is_empty() {
            println!(
                "warning: seed {}: fault kinds that did not occur: {} (coverage is judged over \
                 sweeps of {} seeds or more, not over a replay)",
                seed.seed,
                missed.join(", "),
                sim::run::COVERAGE_SEEDS_MIN
            );
        }
    }
}

/// The edge states: how often each owned one was reached, and which declared ones no seed
/// reached. An owned edge state never reached fails a sweep large enough to judge it.
pub(crate) fn print_edges(scenario: &Scenario, sweep: &Sweep) {
    let rows = scenarios::report::edge_rows(scenario, sweep);
    println!("edge states owned by this scenario (times reached, seeds that reached it):");
    for row in &rows {
        let Some(from) = row.owned_from_seeds else {
            continue;
        };
        let judged = if sweep.seeds.len() as u64 >= from {
            String::new()
        } else {
            format!("  (judged over {from} seeds or more)")
        };
        println!(
            "  {:<40} {:>10} {:>6} of {}{judged}",
            row.name,
            row.reached,
            row.seeds_reached,
            sweep.seeds.len()
        );
    }
    let never = rows
        .iter()
        .filter(|r| r.owned_from_seeds.is_none() && r.reached == 0)
        .count();
    let others = rows
        .iter()
        .filter(|r| r.owned_from_seeds.is_none() && r.reached > 0)
        .count();
    println!(
        "  (not owned by this scenario, not judged: {others} other edge states reached, {never} \
         not; the JSON and the report list them)"
    );
    if sweep.edges_failed() {
        if scenario.run.flaw.is_some() {
            println!(
                "  owned edge states not reached in this flawed run (not judged: a flaw is on): {}",
                sweep.unreached_edges.join(", ")
            );
        } else {
            println!(
                "EDGE STATE NEVER REACHED: {}: the sweep proves nothing about it",
                sweep.unreached_edges.join(", ")
            );
        }
    }
}

/// The sweep's counters in three groups: the faults the nemesis injected, what they did (the
/// counters fault coverage is judged on), and how the system responded (plus the traffic).
pub(crate) fn print_counters(coverage: &std::collections::BTreeMap<String, u64>) {
    let groups = [
        ("injected", "faults injected:"),
        ("effect", "fault effects (what the faults did):"),
        ("response", "the system's responses and traffic:"),
    ];
    for (group, title) in groups {
        println!("{title}");
        for (key, value) in coverage
            .iter()
            .filter(|(k, _)| scenarios::report::counter_group(k) == group)
        {
            println!("  {key:<40} {value}");
        }
    }
}

/// Per operation kind, over all seeds: ok / failed (with the top reasons) / no answer.
pub(crate) fn print_operations(sweep: &Sweep) {
    println!(
        "operations (ok / failed: refused, with the reason / no answer: timed out, outcome unknown):"
    );
    for row in scenarios::report::operations(sweep) {
        println!(
            "  {:<40} {} / {} / {}",
            row.kind, row.ok, row.failed, row.no_answer
        );
        for (reason, n) in row.reasons.iter().take(3) {
            println!("      {n:>8} × {reason}");
        }
        if row.reasons.len() > 3 {
            println!("      ... and {} other reasons", row.reasons.len() - 3);
        }
    }
}

/// Per invariant: held, or in how many seeds it was violated.
pub(crate) fn print_invariants(sweep: &Sweep) {
    println!("invariants:");
    for name in sim::checkers::INVARIANTS {
        let bad: Vec<u64> = sweep
            .seeds
            .iter()
            .filter(|s| s.results.iter().any(|(n, v)| n == name && v.is_some()))
            .map(|s| s.seed)
            .collect();
        let at_points = sweep
            .crash_violations()
            .filter(|(_, _, v)| v.invariant == name)
            .count();
        let verdict = match (bad.len(), at_points) {
            (0, 0) => "held".to_owned(),
            (seeds, 0) => format!("VIOLATED in {seeds} seed(s)"),
            (0, points) => format!("VIOLATED at {points} crash point(s)"),
            (seeds, points) => {
                format!("VIOLATED in {seeds} seed(s) and at {points} crash point(s)")
            }
        };
        println!("  {name:<40} {verdict}");
    }
}
