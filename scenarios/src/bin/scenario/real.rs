//! `scenario FILE` of `scenarios/real/`: a real system nobody here wrote, under its nemesis.

use std::process::ExitCode;

use crate::named::{RunKind, foreign_flags, refuse_flags};
use crate::output::write_reports;
use crate::{RunArgs, USAGE};

/// `scenario NAME` for a real-system scenario (`scenarios/real/`): starts the system, runs the
/// clients under the nemesis, judges the history. Exit 0 when every check held, 1 when one was
/// violated, 2 on bad usage or when the system cannot be started.
pub(crate) fn real(name: &str, args: &RunArgs) -> ExitCode {
    if let Some(flags) = foreign_flags(args, RunKind::Real) {
        return refuse_flags(name, "a real-system run", &flags);
    }
    let mut scenario = match scenarios::realfile::load(name) {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!("scenario: `{name}` is not a real-system scenario");
            return ExitCode::from(USAGE);
        }
        Err(e) => {
            eprintln!("scenario: {e}");
            return ExitCode::from(USAGE);
        }
    };
    if let Some(s) = args.duration {
        if !(s.is_finite() && s >= 1.0) {
            eprintln!("scenario: --duration must be at least 1 second, not {s}");
            return ExitCode::from(USAGE);
        }
        scenario.options.duration = std::time::Duration::from_secs_f64(s);
    }
    let o = &scenario.options;
    let (system, fault) = (o.system.describe(), o.fault.describe());
    println!(
        "real {}: {system}, {} clients for {:.1} s, {fault} every {} ms for {} ms",
        scenario.name,
        o.clients,
        o.duration.as_secs_f64(),
        o.every.as_millis(),
        o.down_for.as_millis()
    );
    let run = match blackbox::real::ids_under_kills(o) {
        Ok(run) => run,
        Err(e) => {
            eprintln!("scenario: {}: {e}", scenario.name);
            return ExitCode::from(USAGE);
        }
    };
    let c = run.history.completions();
    println!(
        "  requests: {} ok, {} failed (certainly not run), {} unknown outcome (info)",
        c.ok, c.fail, c.info
    );
    let healed = match o.fault {
        blackbox::real::Fault::Kill => "a restart on the same files",
        blackbox::real::Fault::Pause => "SIGCONT",
        blackbox::real::Fault::Partition => "the link healed",
        blackbox::real::Fault::PowerLoss => "a restart on what was synced",
    };
    println!("  faults: {} (each followed by {healed})", run.faults);
    if let Some(l) = &run.lost_writes {
        println!("{}", scenarios::ids::lost_writes_line(l));
    }
    if let Some(p) = &run.proxy {
        println!(
            "  proxy: {} connections, {} bytes up, {} down, {} bytes held by the partitions",
            p.connections, p.bytes_up, p.bytes_down, p.held_bytes
        );
    }
    let checks = [&run.unique, &run.took_effect];
    for check in checks {
        println!("{}", scenarios::ids::check_line(check));
    }
    let violated: Vec<&str> = checks
        .iter()
        .filter(|c| c.verdict == reports::model::Judgement::Violated)
        .map(|c| c.name.as_str())
        .collect();
    if let Some(path) = &args.history_edn {
        if let Err(e) = std::fs::write(path, run.history.to_edn()) {
            eprintln!("scenario: cannot write {}: {e}", path.display());
            return ExitCode::from(USAGE);
        }
        println!(
            "  history: {} ({} records, EDN)",
            path.display(),
            run.history.ops.len()
        );
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "scenario": scenario.name,
            "requests": {"ok": c.ok, "fail": c.fail, "info": c.info},
            "faults": run.faults,
            "invariants": [&run.unique, &run.took_effect],
            "passed": violated.is_empty(),
        });
        if let Err(e) = std::fs::write(path, format!("{doc:#}\n")) {
            eprintln!("scenario: cannot write {}: {e}", path.display());
            return ExitCode::from(USAGE);
        }
    }
    if let Some(dir) = &args.report {
        let summary = reports::model::Summary::new(format!("scenario {}", scenario.name))
            .with(run.load_report(&scenario.name, o));
        if let Err(e) = write_reports(dir, &summary) {
            eprintln!("scenario: cannot write the report: {e}");
            return ExitCode::from(USAGE);
        }
        println!("  report: {}", dir.join("index.html").display());
    }
    if !violated.is_empty() {
        println!("FAIL: {}: {} violated", scenario.name, violated.join(", "));
        ExitCode::from(1)
    } else {
        println!("PASS: {}", scenario.name);
        ExitCode::SUCCESS
    }
}
