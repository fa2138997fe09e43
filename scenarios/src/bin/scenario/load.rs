//! `scenario NAME` of a load scenario: goose against a real `sut-server` (or a deployment), with its progress, report and verdict.

use std::io::IsTerminal;
use std::process::ExitCode;

use crate::output::{run_metadata, write_reports};
use crate::simulate::write_atomic;
use crate::{RunArgs, USAGE};

/// A load run's size: the scenario's, overridden by the command line.
pub(crate) struct LoadPlan {
    pub(crate) users: u64,
    pub(crate) rate: Option<f64>,
    pub(crate) duration_s: u64,
}

pub(crate) fn load(name: &str, args: &RunArgs) -> ExitCode {
    let scenario = match scenarios::load_scenario(name) {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!("scenario: `{name}` is not a load scenario");
            return ExitCode::from(USAGE);
        }
        Err(err) => {
            eprintln!("scenario: {err}");
            return ExitCode::from(USAGE);
        }
    };
    if (args.contention || args.weakness.is_some()) && scenario.load.cluster.is_none() {
        eprintln!(
            "scenario {name}: --contention and --weakness apply to deployment runs \
             (cluster_pg, cluster_mariadb, a file with [load.cluster])"
        );
        return ExitCode::from(USAGE);
    }
    if args.contention {
        return contention(name, &scenario.load, args);
    }
    let flaw = args.flaw;
    let spec = &scenario.load;
    let plan = LoadPlan {
        duration_s: args
            .duration
            .map_or(spec.duration_s, |d| d.round().max(1.0) as u64),
        users: args.users.unwrap_or(spec.users),
        rate: match args.rate {
            Some(r) => (r != 0.0).then_some(r),
            None => spec.rate,
        },
    };
    let name = scenario.name.as_str();
    eprintln!(
        "scenario {name}: {} users, {} s measured, rate {}{}",
        plan.users,
        plan.duration_s,
        plan.rate.map_or("closed loop".into(), |r| format!("{r}/s")),
        flaw.map(|f| format!(", FLAW {f} switched on in the server"))
            .unwrap_or_default()
    );
    let clock = load_clock(plan.duration_s + spec.warmup_s);
    let result = run_load(name, spec, args, &plan);
    if let Some(bar) = clock {
        bar.finish_and_clear();
    }
    let mut report = match result {
        Ok(r) => r,
        Err(code) => return code,
    };
    report.scenario = name.to_owned();
    let slos = spec.thresholds.check(&report);
    report.verification.extend(slos);
    print_load_report(&report, flaw);
    let passed = report.passed();
    if let Some(path) = &args.json {
        let text = serde_json::to_value(&report)
            .map(|mut doc| {
                doc["meta"] = serde_json::json!(run_metadata());
                doc
            })
            .and_then(|doc| serde_json::to_string_pretty(&doc))
            .map_err(std::io::Error::other);
        if let Err(err) = text.and_then(|t| write_atomic(path, &t)) {
            eprintln!("scenario: cannot write {}: {err}", path.display());
            return ExitCode::from(USAGE);
        }
    }
    if let Some(dir) = &args.report {
        let mut summary = reports::model::Summary::new(format!("load: {name}"));
        summary.meta.insert(
            "flaw".into(),
            flaw.map_or_else(|| "none".to_owned(), |f| f.name().to_owned()),
        );
        let summary = summary.with(report);
        if let Err(err) = write_reports(dir, &summary) {
            eprintln!("scenario: cannot write the report: {err}");
            return ExitCode::from(USAGE);
        }
        eprintln!("report written to {}", dir.join("index.html").display());
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// On a terminal, a bar of the load run's planned seconds (warm-up included) that fills as they
/// pass; `None` elsewhere. The load itself is measured by the run, not by this clock.
pub(crate) fn load_clock(seconds: u64) -> Option<indicatif::ProgressBar> {
    std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(seconds.max(1));
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} s of load  {elapsed_precise}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let ticker = bar.clone();
        std::thread::spawn(move || {
            while !ticker.is_finished() && ticker.position() < ticker.length().unwrap_or(0) {
                std::thread::sleep(std::time::Duration::from_secs(1));
                ticker.inc(1);
            }
        });
        bar
    })
}

/// Runs the load: a crash run (which starts and kills its own server) when the scenario has
/// kills, else a load against `--host` or a fresh server.
pub(crate) fn run_load(
    name: &str,
    spec: &scenarios::loadfile::LoadSpec,
    args: &RunArgs,
    plan: &LoadPlan,
) -> Result<reports::model::LoadReport, ExitCode> {
    if let Some(host) = &args.host
        && !(host.starts_with("http://") || host.starts_with("https://"))
    {
        eprintln!(
            "scenario {name}: --host `{host}` has no scheme: give a base URL such as http://{host}"
        );
        return Err(ExitCode::from(USAGE));
    }
    let chaos = spec.cluster.as_ref().and_then(|c| c.chaos.as_ref());
    if args.seed.is_some() && chaos.is_none() {
        eprintln!("scenario {name}: --seed applies to simulations and chaos runs only");
        return Err(ExitCode::from(USAGE));
    }
    let result = if let Some(cluster) = &spec.cluster {
        if args.host.is_some() {
            eprintln!("scenario {name}: a deployment run starts its own processes: no --host");
            return Err(ExitCode::from(USAGE));
        }
        let chaos = match chaos.map(|c| c.options(args.seed)).transpose() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("scenario {name}: {e}");
                return Err(ExitCode::from(USAGE));
            }
        };
        load::cluster_run(load::ClusterOptions {
            load: load::LoadOptions {
                workload: name.to_owned(),
                users: plan.users,
                rate: plan.rate,
                duration_s: plan.duration_s,
                warmup_s: spec.warmup_s,
                host: None,
                hlog_dir: args.report.clone(),
                mix: Some(spec.mix),
                flaw: args.flaw,
                admin_token: None,
            },
            id_servers: cluster.id_servers,
            kill: cluster.kill.clone(),
            backend: cluster.database.backend(),
            chaos,
            server_args: weakness_args(args),
        })
    } else if spec.kills > 0 {
        if args.host.is_some() {
            eprintln!("scenario {name}: a crash run starts and kills its own server: no --host");
            return Err(ExitCode::from(USAGE));
        }
        load::crash_under_load(load::CrashOptions {
            users: plan.users,
            rate: plan.rate,
            duration_s: plan.duration_s,
            kills: spec.kills,
            hlog_dir: args.report.clone(),
            mix: Some(spec.mix),
            flaw: args.flaw,
        })
    } else {
        load::run(load::LoadOptions {
            workload: name.to_owned(),
            users: plan.users,
            rate: plan.rate,
            duration_s: plan.duration_s,
            warmup_s: spec.warmup_s,
            host: args.host.clone(),
            hlog_dir: args.report.clone(),
            mix: Some(spec.mix),
            flaw: args.flaw,
            admin_token: None,
        })
    };
    result.map_err(|err| {
        eprintln!("scenario {name}: {err}");
        ExitCode::from(USAGE)
    })
}

/// `--weakness W` for every server process, if asked.
fn weakness_args(args: &RunArgs) -> Vec<String> {
    args.weakness
        .iter()
        .flat_map(|w| ["--weakness".to_owned(), w.clone()])
        .collect()
}

/// `scenario NAME --contention` of a deployment scenario: its ID servers on its database in
/// contention mode (`scenarios::contention`), judged as `scenario ids` judges a run.
fn contention(name: &str, spec: &scenarios::loadfile::LoadSpec, args: &RunArgs) -> ExitCode {
    let Some(cluster) = &spec.cluster else {
        return ExitCode::from(USAGE);
    };
    if cluster.chaos.is_some() || args.rate.is_some() || args.host.is_some() || args.seed.is_some()
    {
        eprintln!(
            "scenario {name}: --contention runs the ID servers alone, with no fault and in a \
             closed loop: not with a chaos deployment, --rate, --host or --seed"
        );
        return ExitCode::from(USAGE);
    }
    let server_bin = match load::target::find_server_binary() {
        Ok(bin) => bin,
        Err(err) => {
            eprintln!("scenario {name}: {err}");
            return ExitCode::from(USAGE);
        }
    };
    let opts = scenarios::contention::ContentionOptions {
        id_servers: cluster.id_servers,
        clients: args
            .users
            .unwrap_or(scenarios::contention::CONTENTION_CLIENTS),
        duration: std::time::Duration::from_secs_f64(args.duration.unwrap_or(5.0).max(1.0)),
        server_flags: weakness_args(args).join(" "),
        ..scenarios::contention::ContentionOptions::new(cluster.database.backend())
    };
    println!("{name} --contention: {}", opts.describe());
    let run = match scenarios::contention::run(&opts, &server_bin) {
        Ok(run) => run,
        Err(err) => {
            eprintln!("scenario {name}: {err}");
            return ExitCode::from(USAGE);
        }
    };
    println!("single IDs:");
    scenarios::ids::print_run(&run.singles);
    if let Some(batches) = &run.batches {
        println!("{}", batches.line());
    }
    for check in &run.checks {
        println!("{}", scenarios::ids::check_line(check));
    }
    if let Some(dir) = &args.report {
        let mut report = run.singles.load_report(&contention_blackbox(&opts));
        report.verification.extend(run.checks.iter().cloned());
        let summary = reports::model::Summary::new(format!("{name} --contention")).with(report);
        if let Err(err) = write_reports(dir, &summary) {
            eprintln!("scenario: cannot write the report: {err}");
            return ExitCode::from(USAGE);
        }
    }
    if run.passed() {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        println!("FAIL");
        ExitCode::FAILURE
    }
}

/// What a contention run's report says it ran.
fn contention_blackbox(
    opts: &scenarios::contention::ContentionOptions,
) -> blackbox::ids::BlackBoxOptions {
    scenarios::contention::blackbox_options(vec![opts.describe()], opts.clients, opts.duration)
}

/// The load report on stdout: per endpoint its corrected latencies, throughput and errors,
/// then the verification, then the flaw if one was on.
pub(crate) fn print_load_report(
    report: &reports::model::LoadReport,
    flaw: Option<sut::flaw::Flaw>,
) {
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>8}",
        "endpoint", "requests", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us", "rps", "errors"
    );
    for e in &report.endpoints {
        let c = &e.corrected;
        let tail = |us: u64, nines: u32| {
            if e.requests >= reports::model::tail_samples_min(nines) {
                us.to_string()
            } else {
                "-".to_owned()
            }
        };
        println!(
            "{:<24} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12.0} {:>8}",
            e.name,
            e.requests,
            c.p50_us,
            c.p90_us,
            tail(c.p99_us, 2),
            tail(c.p999_us, 3),
            c.max_us,
            e.throughput_rps,
            e.error_count()
        );
    }
    println!("verification:");
    for v in &report.verification {
        println!(
            "  {:<40} {}{}",
            v.name,
            v.verdict.label(),
            v.detail
                .as_deref()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        );
    }
    if let Some(f) = flaw {
        println!("flaw: {f} ({})", f.description());
    }
}
