//! `cluster_pg`: the load against a real deployment (docs/deployment.md). The bench starts
//! PostgreSQL (fsync on), N ID servers on one database, a token service, and the lottery's
//! coordinator, wallet and inventory as separate processes ([`chaos::Deployment`]); spreads
//! ID requests over the ID servers as a round-robin load balancer would; draws through the
//! coordinator, which reaches the participants over HTTP; and SIGKILLs the named processes
//! mid-run, restarting each on its database at the same address.
//!
//! Verified afterwards, across every process: no segment or Snowflake ID handed out twice, each
//! user's IDs from each server going up, every process's ledger checks (conservation on the
//! wallet, no over-issue on the inventory, no duplicate confirmation on the coordinator), every
//! draw a client saw confirmed still collected by the wallet, and every draw settled once
//! recovery and compensation have run.

use std::time::{Duration, Instant, SystemTime};

use chaos::{Deployment, DeploymentSpec, RoleProcess};
use reports::model::{FaultWindow, InvariantResult, Judgement, LoadReport};
use sut::lottery::{DrawEvent, Ledger, Registry, invariants};

use crate::{Bases, LoadError, LoadOptions, USERS_MAX};
use chaos::nemesis::Supervisor;

/// The tag step of the run (IDs per segment).
pub const CLUSTER_STEP: u64 = 2_000;
/// Longest wait for the ledgers to settle after the load.
pub const SETTLE_WAIT_MS: u64 = 30_000;
/// Most ID servers of one deployment.
pub const ID_SERVERS_MAX: usize = 16;

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterOptions {
    /// The load (its `host` must be `None`: the deployment is the bench's own).
    pub load: LoadOptions,
    /// ID servers on the shared database.
    pub id_servers: usize,
    /// Processes to SIGKILL and restart mid-run (`id-2`, `wallet`, …), evenly spaced.
    pub kill: Vec<String>,
    /// PostgreSQL, or SQLite files.
    pub backend: chaos::Backend,
    /// Every fault kind against the processes while the load runs (`cluster_chaos`; needs
    /// PostgreSQL, libfaketime and FUSE).
    pub chaos: Option<chaos::nemesis::ChaosOptions>,
    /// More arguments for every server process (`--weakness W`: a weakness planted in the
    /// deployment, TEST ONLY).
    pub server_args: Vec<String>,
}

/// Parses a process name of a deployment (`id-N`, `token`, `coordinator`, `wallet`,
/// `inventory`).
///
/// # Errors
/// An unknown name, or an ID server beyond `id_servers`.
pub fn parse_process(name: &str, id_servers: usize) -> Result<RoleProcess, String> {
    let known = match name {
        "token" => Some(RoleProcess::Token),
        "coordinator" => Some(RoleProcess::Coordinator),
        "wallet" => Some(RoleProcess::Wallet),
        "inventory" => Some(RoleProcess::Inventory),
        _ => name
            .strip_prefix("id-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| (1..=id_servers).contains(n))
            .map(|n| RoleProcess::Id(n - 1)),
    };
    known.ok_or_else(|| {
        format!(
            "`{name}` is not a process of this deployment (id-1..id-{id_servers}, token, \
             coordinator, wallet, inventory)"
        )
    })
}

/// Runs the deployment scenario; see the module doc.
///
/// # Errors
/// Bad options, no PostgreSQL or no server binary, a start or restart that fails, a failed
/// setup request, goose failing.
pub fn cluster_run(opts: ClusterOptions) -> Result<LoadReport, LoadError> {
    if opts.id_servers == 0 || opts.id_servers > ID_SERVERS_MAX {
        return Err(LoadError::BadOption {
            field: "id_servers",
            reason: format!("{} not in 1..={ID_SERVERS_MAX}", opts.id_servers),
        });
    }
    let kills = opts
        .kill
        .iter()
        .map(|n| parse_process(n, opts.id_servers))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|reason| LoadError::BadOption {
            field: "kill",
            reason,
        })?;
    if opts.load.host.is_some() {
        return Err(LoadError::BadOption {
            field: "host",
            reason: "a deployment run starts its own processes: no --host".into(),
        });
    }
    // Ctrl-C must not leave PostgreSQL and the servers running.
    chaos::clean_up_on_interrupt().map_err(|e| LoadError::Server(e.to_string()))?;
    let mut load = opts.load.clone();
    load.users = load.users.min(USERS_MAX);
    crate::check_options(&load)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if opts.chaos.as_ref().is_some_and(|c| c.faults.is_empty()) {
        return Err(LoadError::BadOption {
            field: "chaos.faults",
            reason: "name at least one fault kind".into(),
        });
    }
    rt.block_on(run(
        load,
        (opts.id_servers, opts.server_args),
        kills,
        opts.backend,
        opts.chaos,
    ))
}

fn start_error(e: &chaos::ProcessError) -> LoadError {
    LoadError::Server(format!("deployment: {e}"))
}

/// The nemesis thread: the planned kills, then the chaos nemesis (if any) until `until`, its
/// supervisor restarting whatever went down on its own meanwhile.
fn nemesis(
    deployment: Deployment,
    plan: Vec<(Instant, RoleProcess)>,
    chaos: Option<(chaos::nemesis::ChaosOptions, Instant, Instant)>,
    started: Instant,
) -> (Deployment, Supervisor, Result<Nemesis, LoadError>) {
    let mut supervisor = Supervisor::new(started);
    let (mut deployment, kills) = kill_and_restart(deployment, plan, started);
    let mut windows = match kills {
        Ok(w) => w,
        Err(e) => return (deployment, supervisor, Err(e)),
    };
    let Some((opts, first, until)) = chaos else {
        return (deployment, supervisor, Ok((windows, Vec::new())));
    };
    let applied =
        chaos::nemesis::run_nemesis(&mut deployment, &mut supervisor, &opts, first, until);
    match applied {
        Ok(applied) => {
            windows.extend(applied.iter().map(chaos::nemesis::Applied::window));
            (deployment, supervisor, Ok((windows, applied)))
        }
        Err(e) => (deployment, supervisor, Err(start_error(&e))),
    }
}

/// Waits for the lottery to settle (when the mix draws), then runs every check.
async fn judge(
    prep: &crate::Prepared,
    shared: &crate::Shared,
    bases: &Bases,
) -> Result<Vec<InvariantResult>, LoadError> {
    let (_, need_lottery) = shared.mix.needs();
    let settled = if need_lottery {
        Some(wait_settled(&prep.admin, bases).await?)
    } else {
        None
    };
    let mut verification = crate::verification(prep, shared).await?;
    if let Some(merged) = settled {
        verification.extend(deployment_checks(&merged));
    }
    Ok(verification)
}

/// The fault windows of a run, and the chaos faults as applied.
type Nemesis = (Vec<FaultWindow>, Vec<chaos::nemesis::Applied>);

/// The kills: at each instant, SIGKILLs one process and restarts it.
fn kill_and_restart(
    mut deployment: Deployment,
    plan: Vec<(Instant, RoleProcess)>,
    started: Instant,
) -> (Deployment, Result<Vec<FaultWindow>, LoadError>) {
    let mut windows = Vec::new();
    for (at, which) in plan {
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        let start_s = started.elapsed().as_secs_f64();
        let Some(service) = deployment.service(which) else {
            continue;
        };
        let result = service.kill9().and_then(|()| service.restart());
        if let Err(e) = result {
            return (deployment, Err(start_error(&e)));
        }
        windows.push(FaultWindow {
            start_s,
            end_s: started.elapsed().as_secs_f64(),
            label: format!("{}: kill -9 and restart", which.name()),
            process: Some(which.name()),
            kind: Some("kill".into()),
        });
    }
    (deployment, Ok(windows))
}

/// Every lottery process's state, merged.
struct Merged {
    /// The whole ledger.
    ledger: Ledger,
    /// The coordinator's outcome events.
    events: Vec<DrawEvent>,
    /// Whether older events were dropped.
    dropped: bool,
    /// The union of the processes' activity registries (an error: two disagree on a price).
    registry: Result<Registry, String>,
}

/// Every lottery process's state, merged.
async fn merged_state(admin: &crate::Admin, bases: &Bases) -> Result<Merged, LoadError> {
    let mut parts = Vec::new();
    let mut registries = Vec::new();
    let mut events = Vec::new();
    let mut dropped = false;
    for (process, base) in &bases.ledgers {
        let (status, v) = admin.send_to(base, "GET", "/lottery/state", None).await?;
        let bad = |reason: String| LoadError::Setup {
            what: format!("GET {process} /lottery/state"),
            reason,
        };
        if status != 200 {
            return Err(bad(format!("status {status}: {v}")));
        }
        let state: LotteryStateBody =
            serde_json::from_value(v).map_err(|e| bad(format!("body: {e}")))?;
        parts.push(state.ledger);
        registries.push(state.activities);
        events.extend(state.events);
        dropped |= state.events_dropped;
    }
    let ledger = Ledger::merge(&parts).map_err(|e| LoadError::Setup {
        what: "merge the processes' ledgers".into(),
        reason: e.to_string(),
    })?;
    Ok(Merged {
        ledger,
        events,
        dropped,
        registry: Registry::merge(&registries).map_err(|e| e.to_string()),
    })
}

/// `GET /lottery/state` (`sut_server::lottery::LotteryState`).
#[derive(serde::Deserialize)]
struct LotteryStateBody {
    ledger: Ledger,
    events: Vec<DrawEvent>,
    events_dropped: bool,
    #[serde(default)]
    activities: Registry,
}

/// Polls the merged state until `lottery.settled` holds or [`SETTLE_WAIT_MS`] passes; returns
/// the last state read.
async fn wait_settled(admin: &crate::Admin, bases: &Bases) -> Result<Merged, LoadError> {
    let deadline = Instant::now() + Duration::from_millis(SETTLE_WAIT_MS);
    loop {
        // A process whose database connection broke (PostgreSQL killed or cut off) answers
        // 503 until its store reconnects: asked again until the deadline.
        match merged_state(admin, bases).await {
            Ok(state) if invariants::settled(&state.ledger).is_ok() => return Ok(state),
            Ok(state) if Instant::now() >= deadline => return Ok(state),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Ok(_) | Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The checks that need every process: over the merged ledger, conservation, no over-issue,
/// settlement and every prize paid for at the operator's price; over the coordinator's events
/// and the participants' fences, agreement.
fn deployment_checks(merged: &Merged) -> Vec<InvariantResult> {
    let (ledger, events, dropped) = (&merged.ledger, &merged.events, merged.dropped);
    let result = |name: &str, r: Result<(), sut::lottery::LotteryViolation>, detail: String| {
        InvariantResult {
            name: format!("deployment: {name}"),
            verdict: if r.is_ok() {
                Judgement::Held
            } else {
                Judgement::Violated
            },
            seed: None,
            first_offending_event: r.err().map(|v| v.to_string()),
            detail: Some(detail),
        }
    };
    let sums = format!(
        "merged: {} accounts, minted {}, collected {}, {} fences",
        ledger.accounts.len(),
        ledger.minted_minor,
        ledger.collected_minor,
        ledger.fences.len()
    );
    let judged = format!(
        "{} outcome events{}",
        events.len(),
        if dropped { " (older ones dropped)" } else { "" }
    );
    vec![
        result(
            invariants::CONSERVATION,
            invariants::conservation(ledger),
            sums.clone(),
        ),
        result(
            invariants::NO_OVER_ISSUE,
            invariants::no_over_issue(ledger),
            sums.clone(),
        ),
        result(
            invariants::SETTLED,
            invariants::settled(ledger),
            sums.clone(),
        ),
        paid(ledger, &merged.registry, sums),
        result(
            invariants::AGREEMENT,
            invariants::agreement(events, &[ledger]),
            judged,
        ),
    ]
}

/// `lottery.paid` over the merged ledger and the processes' registries, which must agree.
fn paid(ledger: &Ledger, registry: &Result<Registry, String>, sums: String) -> InvariantResult {
    let violation = match registry {
        Err(e) => Some(format!(
            "{}: the processes disagree on an activity's terms: {e}",
            invariants::PAID
        )),
        Ok(registry) => invariants::paid(ledger, registry)
            .err()
            .map(|v| v.to_string()),
    };
    InvariantResult {
        name: format!("deployment: {}", invariants::PAID),
        verdict: if violation.is_none() {
            Judgement::Held
        } else {
            Judgement::Violated
        },
        seed: None,
        first_offending_event: violation,
        detail: Some(sums),
    }
}

fn bases(deployment: &Deployment) -> Bases {
    let url = |w| deployment.url(w);
    Bases {
        ids: url(RoleProcess::Id(0)),
        wallet: url(RoleProcess::Wallet),
        inventory: url(RoleProcess::Inventory),
        ledgers: [
            RoleProcess::Coordinator,
            RoleProcess::Wallet,
            RoleProcess::Inventory,
        ]
        .into_iter()
        .map(|w| (w.name(), url(w)))
        .collect(),
        registries: [
            RoleProcess::Coordinator,
            RoleProcess::Wallet,
            RoleProcess::Inventory,
            RoleProcess::Token,
        ]
        .into_iter()
        .map(url)
        .collect(),
    }
}

async fn run(
    opts: LoadOptions,
    (id_servers, server_args): (usize, Vec<String>),
    kills: Vec<RoleProcess>,
    backend: chaos::Backend,
    chaos: Option<chaos::nemesis::ChaosOptions>,
) -> Result<LoadReport, LoadError> {
    let started = Instant::now();
    let wall_start = SystemTime::now();
    let mut spec = DeploymentSpec::new(crate::target::find_server_binary()?);
    spec.id_servers = id_servers;
    spec.backend = backend;
    spec.extra_args = crate::flaw_args(opts.flaw);
    spec.extra_args.extend(server_args);
    spec.chaos = chaos.is_some();
    let deployment = tokio::task::spawn_blocking(move || Deployment::start(&spec))
        .await
        .map_err(|e| LoadError::Server(format!("deployment task: {e}")))?
        .map_err(|e| start_error(&e))?;
    let bases = bases(&deployment);
    let admin_token = Some(deployment.admin_token().to_owned());
    let prep = crate::prepare(&bases, &opts, CLUSTER_STEP, admin_token).await?;
    let urls = crate::workload::Urls::deployment(
        &deployment.client_id_urls(),
        &deployment.client_url(RoleProcess::Token),
        &deployment.client_url(RoleProcess::Coordinator),
        &prep.tag,
    )
    .map_err(|reason| LoadError::BadOption {
        field: "deployment",
        reason,
    })?;
    let shared = crate::shared_state_for(urls, &opts, &prep)?;

    let asked = kills.len();
    let plan: Vec<(Instant, RoleProcess)> = kills
        .into_iter()
        .enumerate()
        .map(|(i, which)| {
            let nth = u32::try_from(i + 1).unwrap_or(u32::MAX);
            let of = u32::try_from(asked + 1).unwrap_or(u32::MAX);
            (
                shared.measure_start + Duration::from_secs(opts.duration_s) * nth / of,
                which,
            )
        })
        .collect();
    let asked_chaos = chaos.as_ref().map(|c| c.faults.clone());
    let chaos = chaos.map(|c| {
        let measured = Duration::from_secs(opts.duration_s);
        let first = shared.measure_start + c.every.min(measured / 4);
        (c, first, shared.measure_start + measured)
    });
    let killer = std::thread::spawn(move || nemesis(deployment, plan, chaos, started));
    let attacked = crate::attack(&bases.ledgers[0].1, &opts, &shared).await;
    let (deployment, supervisor, windows) = tokio::task::spawn_blocking(move || killer.join())
        .await
        .map_err(|e| LoadError::Server(format!("killer task: {e}")))?
        .map_err(|_| LoadError::Server("killer thread panicked".to_owned()))?;
    // The supervisor keeps restarting whatever goes down on its own (a fail-stop after the
    // database went away) while the deployment settles and is judged; the watch is stopped on
    // every path, so the deployment is always torn down.
    let watch = supervisor.watch(deployment);
    let judged = judge(&prep, &shared, &bases).await;
    let (deployment, supervisor) = tokio::task::spawn_blocking(move || watch.stop())
        .await
        .map_err(|e| LoadError::Server(format!("supervisor task: {e}")))?
        .map_err(LoadError::Server)?;
    let (mut windows, applied) = windows?;
    attacked?;
    let mut verification = judged?;
    windows.extend(
        supervisor
            .revived
            .iter()
            .map(chaos::nemesis::Revived::window),
    );
    verification.push(crate::verify::kills_done(
        "cluster.kills_done",
        windows.len() - applied.len() - supervisor.revived.len(),
        asked,
    ));
    if let Some(kinds) = &asked_chaos {
        verification.push(chaos::nemesis::took_effect(kinds, &applied));
    }
    let processes: Vec<String> = deployment
        .services()
        .map(|(w, s)| format!("{} ({} start(s))", w.name(), s.starts()))
        .collect();
    tokio::task::spawn_blocking(move || drop(deployment))
        .await
        .map_err(|e| LoadError::Server(format!("teardown task: {e}")))?;
    let hlog_start = wall_start + shared.measure_start.duration_since(started);
    let database = match backend {
        chaos::Backend::Postgres => "PostgreSQL (fsync on)",
        chaos::Backend::MariaDb => "MariaDB (innodb_flush_log_at_trx_commit=1, sync_binlog=1)",
        chaos::Backend::Sqlite => "SQLite files (synchronous=FULL)",
    };
    let mut report = LoadReport {
        scenario: opts.workload.clone(),
        target: format!(
            "deployment on {database}: {}{}",
            processes.join(", "),
            opts.flaw
                .map(|f| format!("; flaw {f} switched on"))
                .unwrap_or_default()
        ),
        duration_s: opts.duration_s as f64,
        warmup_s: opts.warmup_s as f64,
        rate: opts.rate,
        users: opts.users,
        endpoints: crate::endpoints(&opts, &shared, hlog_start)?,
        server: Vec::new(),
        fault_windows: windows,
        verification,
        concurrency: None,
        ramp: None,
    };
    crate::on_measured_clock(&mut report, started, shared.measure_start);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sut::lottery::{ActivityId, ParticipationRow, Terms, UserId, Xid};

    fn merged(price_paid: u64, registry: Result<Registry, String>) -> Merged {
        let mut ledger = Ledger::default();
        ledger.participations.insert(
            (UserId(1), ActivityId(1)),
            ParticipationRow {
                xid: Xid(1),
                price_minor: price_paid,
                won: false,
                confirmed: true,
            },
        );
        ledger.collected_minor = price_paid;
        ledger.minted_minor = price_paid;
        Merged {
            ledger,
            events: Vec::new(),
            dropped: false,
            registry,
        }
    }

    fn paid_verdict(m: &Merged) -> Judgement {
        deployment_checks(m)
            .into_iter()
            .find(|c| c.name == "deployment: lottery.paid")
            .expect("judged")
            .verdict
    }

    #[test]
    fn the_deployment_judges_every_draw_against_the_operators_price() {
        let at_ten =
            Registry::from_entries([(ActivityId(1), Terms::always_open(10, 100))]).unwrap();
        assert_eq!(
            paid_verdict(&merged(10, Ok(at_ten.clone()))),
            Judgement::Held
        );
        assert_eq!(paid_verdict(&merged(0, Ok(at_ten))), Judgement::Violated);
        let disagree = Err("activity 1 is registered with other terms".to_owned());
        assert_eq!(paid_verdict(&merged(10, disagree)), Judgement::Violated);
    }
}
