//! `scenario merge FILE…`: the JSON files of a sweep's shards merged into one sweep, judged as
//! one (violations, fault coverage and edge coverage on the union), with one summary, report,
//! JUnit file and JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sim::run::{SeedOutcome, Sweep};
use sim::scenario::Scenario;

use crate::USAGE;
use crate::output::{print_summary, run_metadata, write_reports};
use crate::simulate::{replay_command, verdict};
use crate::sweepfile::{
    Build, CoverageMode, Nondeterministic, RunInfo, SEEDS_MAX, SeedRange, SweepFile, describe_seeds,
};

#[derive(Debug, clap::Args)]
pub(crate) struct MergeArgs {
    /// The shards' JSON files (`scenario NAME --shard I/N --coverage union --json FILE`).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write the merged self-contained HTML report, `summary.json` and `junit.xml` into this
    /// folder.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Write the merged sweep as JSON to this file (the format of a shard's: it can be merged
    /// again).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the merged JUnit XML to this file.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Judge the seeds that ran even when some seeds of the range ran in no shard (they are
    /// named either way); without it, missing seeds exit 2.
    #[arg(long)]
    allow_missing: bool,
}

/// Shards of one build and one scenario, each seed run once.
struct Shards {
    files: Vec<(PathBuf, SweepFile)>,
    scenario: Scenario,
    /// From the lowest first seed to the highest last one.
    range: SeedRange,
    /// Seeds of `range` no shard ran.
    missing: Vec<u64>,
}

pub(crate) fn merge(args: &MergeArgs) -> ExitCode {
    let shards = match read_shards(&args.files) {
        Ok(shards) => shards,
        Err(err) => {
            eprintln!("scenario merge: {err}");
            return ExitCode::from(USAGE);
        }
    };
    if !shards.missing.is_empty() {
        eprintln!("scenario merge: {}", missing_message(&shards));
        if !args.allow_missing {
            eprintln!(
                "scenario merge: no verdict on an incomplete range: give every shard's file, or \
                 --allow-missing to judge the seeds that ran"
            );
            return ExitCode::from(USAGE);
        }
    }
    warn_about_builds(&shards);
    judge(args, shards)
}

/// Reads every file and checks that they are shards of one sweep.
fn read_shards(paths: &[PathBuf]) -> Result<Shards, String> {
    let files = paths
        .iter()
        .map(|path| SweepFile::read(path).map(|file| (path.clone(), file)))
        .collect::<Result<Vec<_>, _>>()?;
    let (first_path, first) = files.first().ok_or("no file given")?;
    for (path, file) in &files[1..] {
        if file.build != first.build {
            return Err(format!(
                "{} and {} ran on different builds ({} and {}): merge the shards of one build",
                first_path.display(),
                path.display(),
                first.build,
                file.build
            ));
        }
        if file.scenario_hash != first.scenario_hash {
            return Err(format!(
                "{} and {} ran different scenarios ({} with hash {}, {} with hash {}): the \
                 scenario's file or the run's flags (--flaw, --duration, --no-buggify) differ",
                first_path.display(),
                path.display(),
                first.scenario,
                first.scenario_hash,
                file.scenario,
                file.scenario_hash
            ));
        }
    }
    run_once(&files)?;
    let scenario = first.scenario()?;
    let first_seed = files
        .iter()
        .map(|(_, f)| f.range.first_seed)
        .min()
        .unwrap_or(0);
    let end = files.iter().map(|(_, f)| f.range.end()).max().unwrap_or(0);
    let range = SeedRange {
        first_seed,
        count: end - first_seed,
    };
    if range.count > SEEDS_MAX {
        return Err(format!(
            "the files span seeds {first_seed}..{end}, more than the {SEEDS_MAX} seeds a merge \
             takes"
        ));
    }
    let ran: std::collections::BTreeSet<u64> = files
        .iter()
        .flat_map(|(_, f)| f.seeds.iter().copied())
        .collect();
    let missing = (range.first_seed..range.end())
        .filter(|s| !ran.contains(s))
        .collect();
    Ok(Shards {
        files,
        scenario,
        range,
        missing,
    })
}

/// Refuses seeds run by two files (the same file twice, overlapping ranges or shards).
fn run_once(files: &[(PathBuf, SweepFile)]) -> Result<(), String> {
    let mut owner: BTreeMap<u64, usize> = BTreeMap::new();
    for (index, (_, file)) in files.iter().enumerate() {
        let mut twice: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for seed in &file.seeds {
            if let Some(other) = owner.insert(*seed, index) {
                twice.entry(other).or_default().push(*seed);
            }
        }
        if let Some((other, seeds)) = twice.into_iter().next() {
            return Err(format!(
                "{} and {} both ran seed(s) {} ({} seed(s)): overlapping ranges or shards, or a \
                 file given twice",
                files[other].0.display(),
                files[index].0.display(),
                describe_seeds(&seeds, 8),
                seeds.len()
            ));
        }
    }
    Ok(())
}

/// Which seeds of the range no shard ran, and, when every file is a shard of the same range
/// and shard count, which shards are missing.
fn missing_message(shards: &Shards) -> String {
    let mut text = format!(
        "{} of the {} seeds of {}..{} ran in no shard: {}",
        shards.missing.len(),
        shards.range.count,
        shards.range.first_seed,
        shards.range.end(),
        describe_seeds(&shards.missing, 8)
    );
    let (_, first) = &shards.files[0];
    let one_layout = shards.files.iter().all(|(_, f)| {
        f.range == first.range && f.shard.map(|s| s.count) == first.shard.map(|s| s.count)
    });
    if let (true, Some(layout)) = (one_layout, first.shard) {
        let given: Vec<u64> = shards
            .files
            .iter()
            .filter_map(|(_, f)| f.shard.map(|s| s.number))
            .collect();
        let absent: Vec<String> = (1..=layout.count)
            .filter(|i| !given.contains(i))
            .map(|i| format!("{i}/{}", layout.count))
            .collect();
        if !absent.is_empty() {
            text.push_str(&format!(" (no file of shard {})", absent.join(", ")));
        }
    }
    text
}

/// Says when the builds cannot be told apart, or the merge runs on another build.
fn warn_about_builds(shards: &Shards) {
    let build = &shards.files[0].1.build;
    if build.commit == "unknown" {
        eprintln!(
            "scenario merge: warning: the shards' build was not made in a git checkout, so \
             shards of different builds cannot be told apart"
        );
    }
    let this = Build::this();
    if *build != this {
        eprintln!(
            "scenario merge: warning: the shards ran on build {build}, this merge runs on {this}: \
             coverage is judged by this build's rules, and the report shows the timeline the \
             shards recorded (without the first offending event)"
        );
    }
}

/// The merged sweep printed, judged and written (the shards' outcomes moved into it).
fn judge(args: &MergeArgs, mut shards: Shards) -> ExitCode {
    let outcomes: Vec<SeedOutcome> = shards
        .files
        .iter_mut()
        .flat_map(|(_, f)| std::mem::take(&mut f.outcomes))
        .collect();
    let shards = &shards;
    let scenario = &shards.scenario;
    let (_, first) = &shards.files[0];
    let wall_seconds = shards.files.iter().map(|(_, f)| f.wall_seconds).sum();
    let sweep = sim::run::sweep_of(scenario, outcomes, wall_seconds);
    let nondeterministic: Vec<Nondeterministic> = shards
        .files
        .iter()
        .flat_map(|(_, f)| f.nondeterministic.iter().copied())
        .collect();
    let given = first.scenario_given.as_deref();
    let replay = |seed| replay_command(scenario, seed, given, first.duration_s);
    print_shards(shards);
    print_summary(
        scenario,
        &sweep,
        &replay,
        &nondeterministic,
        CoverageMode::Sweep,
    );
    let meta = merge_metadata(shards);
    if let Err(err) = write_outputs(args, shards, &sweep, &nondeterministic, &replay, &meta) {
        eprintln!("scenario merge: {err}");
        return ExitCode::from(USAGE);
    }
    verdict(&sweep, &nondeterministic, CoverageMode::Sweep)
}

/// The shards merged: each file with its shard and seeds, the build, the range.
fn print_shards(shards: &Shards) {
    println!("merged          {} shard file(s):", shards.files.len());
    for (path, file) in &shards.files {
        let shard = file
            .shard
            .map(|s| format!("shard {}/{} of ", s.number, s.count))
            .unwrap_or_default();
        println!(
            "  {}  {shard}{}..{}: {} seed(s) run",
            path.display(),
            file.range.first_seed,
            file.range.end(),
            file.seeds.len()
        );
    }
    println!("build           {}", shards.files[0].1.build);
    println!(
        "seed range      {}..{} ({} seeds; {} ran in no shard)",
        shards.range.first_seed,
        shards.range.end(),
        shards.range.count,
        shards.missing.len()
    );
    if !shards.missing.is_empty() {
        println!(
            "SEEDS NOT RUN   {} (judged without them: --allow-missing)",
            describe_seeds(&shards.missing, 8)
        );
    }
}

/// What the merged report and JSON record beside the usual metadata: the shards' build and
/// files, the seeds no shard ran.
fn merge_metadata(shards: &Shards) -> BTreeMap<String, String> {
    let build = &shards.files[0].1.build;
    let mut meta = BTreeMap::new();
    meta.insert("commit".to_owned(), build.commit.clone());
    meta.insert("shards' build".to_owned(), build.to_string());
    meta.insert(
        "shards".to_owned(),
        shards
            .files
            .iter()
            .map(|(p, _)| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" "),
    );
    if !shards.missing.is_empty() {
        meta.insert(
            "seeds no shard ran".to_owned(),
            describe_seeds(&shards.missing, 8),
        );
    }
    meta
}

/// The report folder, the JUnit file and the JSON, as asked.
fn write_outputs(
    args: &MergeArgs,
    shards: &Shards,
    sweep: &Sweep,
    nondeterministic: &[Nondeterministic],
    replay: &dyn Fn(u64) -> String,
    meta: &BTreeMap<String, String>,
) -> Result<(), String> {
    let scenario = &shards.scenario;
    let (_, first) = &shards.files[0];
    if args.report.is_some() || args.junit.is_some() {
        let shown = if first.build == Build::this() {
            scenarios::report::shown_seed(scenario, sweep)
        } else {
            let failing = sweep.seeds.iter().find(|s| s.violations().next().is_some());
            failing.or(sweep.seeds.first()).cloned()
        };
        let report = scenarios::report::simulation_showing(scenario, sweep, shown, replay);
        let mut summary = reports::model::Summary::new(format!(
            "simulation: {} (merged from {} shards)",
            scenario.name,
            shards.files.len()
        ))
        .with(report);
        summary.meta.extend(meta.clone());
        if let Some(dir) = &args.report {
            write_reports(dir, &summary).map_err(|e| format!("cannot write the report: {e}"))?;
            eprintln!("report written to {}", dir.join("index.html").display());
        }
        if let Some(path) = &args.junit {
            write_junit(path, &summary)?;
        }
    }
    if let Some(path) = &args.json {
        let mut all_meta = run_metadata();
        all_meta.extend(meta.clone());
        let run = RunInfo {
            given: first.scenario_given.clone(),
            duration_s: first.duration_s,
            range: shards.range,
            shard: None,
            coverage: CoverageMode::Sweep,
            seeds_missing: shards.missing.clone(),
            meta: all_meta,
        };
        let mut file = SweepFile::new(scenario, sweep, run, nondeterministic, replay)?;
        file.build = first.build.clone();
        file.write(path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The JUnit XML of `summary` at `path`.
fn write_junit(path: &Path, summary: &reports::model::Summary) -> Result<(), String> {
    reports::write::write_junit(path, summary)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
