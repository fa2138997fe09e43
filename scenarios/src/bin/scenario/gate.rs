//! `scenario gate`: every named scenario over a fixed seed range and every model, against the committed baseline.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::output::write_reports;
use crate::{USAGE, jobs_or_cores};

#[derive(Debug, clap::Args)]
pub(crate) struct GateArgs {
    /// The baseline file.
    #[arg(long, default_value = "scenarios/baseline.toml")]
    pub(crate) baseline: PathBuf,
    /// Write the observed results as the new baseline instead of comparing.
    #[arg(long)]
    pub(crate) update_baseline: bool,
    /// Where to write index.html, summary.json and junit.xml.
    #[arg(long, default_value = "target/gate-report")]
    pub(crate) report: PathBuf,
    /// Seeds per scenario (the fixed range 0..N). Sixteen, so that every fault effect the
    /// baseline expects occurs in more than one or two seeds (with eight, the torn writes of
    /// `crash_restart` and `tcc_storm` hung on single seeds; with six, `chaos`'s swarm never chose
    /// `latency`).
    #[arg(long, default_value_t = 16)]
    pub(crate) seeds: u64,
    /// Threads running seeds.
    #[arg(long)]
    pub(crate) jobs: Option<usize>,
}

pub(crate) fn gate(args: &GateArgs) -> ExitCode {
    use reports::gate::compare;
    let (baseline_path, update, report) = (&args.baseline, args.update_baseline, &args.report);
    let jobs = jobs_or_cores(args.jobs);
    let previous = match previous_baseline(baseline_path, update) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let mut summary = match gate_summary(args.seeds, jobs) {
        Ok(s) => s,
        Err(code) => return code,
    };
    if update {
        if let Err(err) = write_reports(report, &summary) {
            eprintln!("scenario gate: cannot write the report: {err}");
            return ExitCode::from(USAGE);
        }
        return update_baseline(baseline_path, &summary, previous.as_ref());
    }
    let outcome = compare(previous.as_ref().expect("checked above"), &summary);
    summary.gate = Some(outcome.clone());
    if let Err(err) = write_reports(report, &summary) {
        eprintln!("scenario gate: cannot write the report: {err}");
        return ExitCode::from(USAGE);
    }
    println!("{}", outcome.table());
    println!("report: {}", report.join("index.html").display());
    if outcome.passed {
        println!("gate: PASS");
        ExitCode::SUCCESS
    } else {
        println!("gate: FAIL");
        ExitCode::FAILURE
    }
}

/// The committed baseline, if there is one; none is an error unless it is being written.
pub(crate) fn previous_baseline(
    baseline_path: &std::path::Path,
    update: bool,
) -> Result<Option<reports::gate::Baseline>, ExitCode> {
    let previous = if baseline_path.exists() {
        match reports::gate::Baseline::load(baseline_path) {
            Ok(b) => Some(b),
            Err(err) => {
                eprintln!("scenario gate: {err}");
                return Err(ExitCode::from(USAGE));
            }
        }
    } else {
        None
    };
    if previous.is_none() && !update {
        eprintln!(
            "scenario gate: no baseline at {} (create it with --update-baseline)",
            baseline_path.display()
        );
        return Err(ExitCode::from(USAGE));
    }
    Ok(previous)
}

/// Every named scenario swept over seeds `0..seeds`, then the models and the flaws catalog.
pub(crate) fn gate_summary(seeds: u64, jobs: usize) -> Result<reports::model::Summary, ExitCode> {
    let mut summary = reports::model::Summary::new("regression gate");
    summary
        .meta
        .insert("seeds per scenario".into(), format!("0..{seeds}"));
    let seed_list: Vec<u64> = (0..seeds).collect();
    for (name, _) in scenarios::NAMED {
        let scenario = match scenarios::load(name) {
            Ok(s) => s,
            Err(err) => {
                eprintln!("scenario gate: {err}");
                return Err(ExitCode::from(USAGE));
            }
        };
        eprintln!("gate: simulation {name} over seeds 0..{seeds}");
        let sweep = sim::run::sweep(&scenario, &seed_list, jobs, &|_| {});
        summary
            .results
            .push(scenarios::report::simulation(&scenario, &sweep, None).into());
    }
    for result in scenarios::gate_extras(jobs) {
        summary.results.push(result);
    }
    Ok(summary)
}

/// `--update-baseline`: writes what this run observed as the new baseline.
pub(crate) fn update_baseline(
    baseline_path: &std::path::Path,
    summary: &reports::model::Summary,
    previous: Option<&reports::gate::Baseline>,
) -> ExitCode {
    // The baseline expects every simulation, flaw and verification to pass: say loudly
    // which did not, so a failure is not pinned unnoticed (the next gate flags it).
    for result in summary.results.iter().filter(|r| !r.passed()) {
        eprintln!(
            "scenario gate: WARNING: {} {} did not pass in this run; the baseline still expects it to",
            result.kind(),
            result.name()
        );
    }
    let mut baseline = reports::gate::Baseline::from_summary(summary, previous);
    // Latency ratios are reported, not gated: on a shared 2-core machine the P99 of a short
    // run swings by more than any useful tolerance. Throughput ratios of a constant-rate run
    // and error rates are stable, and verification must hold.
    for load in &mut baseline.load {
        for endpoint in load.endpoints.values_mut() {
            endpoint.p99_ratio = None;
        }
    }
    if let Err(err) = baseline.save(baseline_path) {
        eprintln!("scenario gate: {err}");
        return ExitCode::from(USAGE);
    }
    println!(
        "baseline written to {} ({} results)",
        baseline_path.display(),
        summary.results.len()
    );
    ExitCode::SUCCESS
}
