//! `crash_under_load`: a `sut-server` child is SIGKILLed (`Child::kill`, SIGKILL on Unix)
//! several times during a load of segment IDs, Snowflake IDs and lottery draws, and restarted on
//! the same database files and the same port each time (docs/architecture.md, "The invariants,
//! and where each is checked"; the server's durability argument is in docs/server.md,
//! "Durability and group commit").
//!
//! Verified afterwards: no duplicate ID across all incarnations (segment and Snowflake), no fund
//! loss (the recovered ledger's conservation and sums), every draw settled after recovery (the
//! coordinator's recovery finishes or cancels the open ones; `lottery.settled` is polled until
//! it holds or [`SETTLE_WAIT_MS`] passes), every draw a client saw confirmed still collected,
//! and the segment IDs lost per crash within [`lost_ids_bound_per_crash`]. Kill-to-listening
//! spans are the report's `fault_windows`.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use reports::model::{FaultWindow, LoadReport, ResourceSample};
use serde_json::Value;

use crate::target::{Sampler, ServerProcess};
use crate::{LoadError, LoadOptions, USERS_MAX, verify};

/// The tag step of the crash run (IDs per segment).
pub const CRASH_STEP: u64 = 2_000;
/// The server's dynamic-step cap in the crash run (`sut-server --step-max`): Leaf's doubling
/// still runs (2,000 → 4,000 → 8,000), and the lost-ID bound stays meaningful. Without a cap a
/// release-speed run doubles the step towards 1,000,000 and loses far more per crash.
pub const CRASH_STEP_MAX: u64 = 8_000;
/// Longest wait for the recovered ledger to settle.
pub const SETTLE_WAIT_MS: u64 = 15_000;
/// Most kills of one run.
pub const KILLS_MAX: u32 = 100;

/// The IDs a crash may lose: the dead incarnation's current segment, its prefetched next one,
/// and one more grant the store may have committed while its answer died with the process
/// (each at most `step` IDs, the allocators' step cap; none is re-granted to the new
/// incarnation before its lease expires), plus
/// those issued to requests whose answers the kill cut off (at most one batch of 10 per user).
/// Measured here (step 2000, 4 users): 2,425 to 4,094 IDs per crash, i.e. above the first two
/// segments alone at times, hence the third.
#[must_use]
pub fn lost_ids_bound_per_crash(step: u64, users: u64) -> u64 {
    3 * step + 10 * users
}

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct CrashOptions {
    pub users: u64,
    /// Total operations per second (constant rate), `None` for closed loop.
    pub rate: Option<f64>,
    /// Length of the load, in seconds.
    pub duration_s: u64,
    /// SIGKILLs, evenly spaced over the load (1..=[`KILLS_MAX`]).
    pub kills: u32,
    pub hlog_dir: Option<PathBuf>,
    /// Operation weights; `None`: the `crash` workload's (5 id, 1 batch, 2 Snowflake, 2 draws).
    pub mix: Option<crate::Mix>,
    /// Start (and restart) the server with this documented flaw switched on.
    pub flaw: Option<crate::Flaw>,
}

/// Runs the crash scenario; see the module doc.
///
/// # Errors
/// Bad options, no server binary, a restart that fails, a failed setup request, goose failing.
pub fn crash_under_load(opts: CrashOptions) -> Result<LoadReport, LoadError> {
    if opts.kills == 0 || opts.kills > KILLS_MAX {
        return Err(LoadError::BadOption {
            field: "kills",
            reason: format!("{} not in 1..={KILLS_MAX}", opts.kills),
        });
    }
    let load = LoadOptions {
        workload: "crash".to_owned(),
        users: opts.users.min(USERS_MAX),
        rate: opts.rate,
        duration_s: opts.duration_s,
        warmup_s: 0,
        host: None,
        hlog_dir: opts.hlog_dir.clone(),
        mix: opts.mix,
        flaw: opts.flaw,
        admin_token: None,
    };
    crate::check_options(&load)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_crash(load, opts.kills))
}

struct KillerOutcome {
    server: ServerProcess,
    windows: Vec<FaultWindow>,
    samples: Vec<ResourceSample>,
}

/// How the server is started, and started again after a kill: the binary, its database and
/// its extra arguments.
struct Launcher {
    bin: PathBuf,
    db: PathBuf,
    extra: Vec<String>,
}

impl Launcher {
    /// `bin` with its database and JWT key in `dir`, configured for the crash run's load.
    fn new(
        bin: PathBuf,
        dir: &std::path::Path,
        flaw: Option<crate::Flaw>,
    ) -> Result<Self, LoadError> {
        let mut extra = crate::flaw_args(flaw);
        extra.extend(["--step-max".to_owned(), CRASH_STEP_MAX.to_string()]);
        // A closed loop draws for each of the workload's 2,000 users as often as the server
        // answers (0.8 a second here, on 2 cores), which a faster machine takes past the
        // per-user quotas (2 one-time tokens a second): the run is about crashes, so its server
        // is configured for its load rather than measured refusing it.
        for flag in QUOTA_FLAGS {
            extra.extend([flag.to_owned(), CRASH_QUOTA_PER_USER.to_string()]);
        }
        // The JWT key outlives a kill, as a deployment's does: a server that drew a new key at
        // each start refused every user's token after the first kill (91% of the draws'
        // one-time token requests answered 401, and the run passed on the draws made before).
        let jwt_secret = dir.join("jwt-secret");
        std::fs::write(&jwt_secret, crate::target::random_hex())?;
        extra.extend([
            "--jwt-secret-file".to_owned(),
            jwt_secret.display().to_string(),
        ]);
        Ok(Self {
            bin,
            db: dir.join("ids.db"),
            extra,
        })
    }

    fn start(&self, listen: &str) -> Result<ServerProcess, LoadError> {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        ServerProcess::start(&self.bin, &self.db, listen, &extra)
    }

    /// Starts the server on `addr` again, trying 20 times 100 ms apart.
    fn restart(&self, addr: &str) -> Result<ServerProcess, LoadError> {
        let mut last_err = None;
        for _ in 0..20 {
            match self.start(addr) {
                Ok(s) => return Ok(s),
                Err(e) => {
                    last_err = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Err(last_err.unwrap_or_else(|| LoadError::Server("restart failed".to_owned())))
    }
}

/// The kill instants: `kills` evenly spaced over the measured `duration_s`.
fn kill_times(measure_start: Instant, duration_s: u64, kills: u32) -> Vec<Instant> {
    (1..=u64::from(kills))
        .map(|i| {
            measure_start
                + Duration::from_secs(duration_s) * u32::try_from(i).unwrap_or(u32::MAX)
                    / (kills + 1)
        })
        .collect()
}

/// The killer thread: at each instant, SIGKILLs the server and restarts it, sampling its
/// resources between kills.
fn kill_and_restart(
    mut server: ServerProcess,
    kill_at: Vec<Instant>,
    started: Instant,
    launcher: &Launcher,
) -> Result<KillerOutcome, LoadError> {
    let mut windows = Vec::new();
    let mut samples = Vec::new();
    let mut sampler = Sampler::start(server.pid(), started);
    for (n, at) in kill_at.into_iter().enumerate() {
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        samples.extend(sampler.finish());
        let start_s = started.elapsed().as_secs_f64();
        server.kill();
        let addr = server.addr.clone();
        server = launcher.restart(&addr)?;
        windows.push(FaultWindow {
            start_s,
            end_s: started.elapsed().as_secs_f64(),
            label: format!("kill -9 {} and restart", n + 1),
            process: None,
            kind: Some("kill".into()),
        });
        sampler = Sampler::start(server.pid(), started);
    }
    samples.extend(sampler.finish());
    Ok(KillerOutcome {
        server,
        windows,
        samples,
    })
}

/// Recovery: polls the ledger until the restarted coordinator has settled the draws that were
/// open at the kills, or [`SETTLE_WAIT_MS`] passes.
async fn wait_settled(admin: &crate::Admin) -> Result<(), LoadError> {
    let deadline = Instant::now() + Duration::from_millis(SETTLE_WAIT_MS);
    loop {
        let (status, v) = admin.send("GET", "/ledger", None).await?;
        let settled = status == 200
            && v.get("checks").and_then(Value::as_array).is_some_and(|cs| {
                cs.iter().all(|c| {
                    c.get("name").and_then(Value::as_str) != Some("lottery.settled")
                        || c.get("ok").and_then(Value::as_bool) == Some(true)
                })
            });
        if settled || Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The per-user quotas of the server under `crash_under_load` (draws and one-time tokens a
/// second, and their bursts).
const CRASH_QUOTA_PER_USER: u32 = 1_000;

/// `sut-server`'s flags for them.
const QUOTA_FLAGS: [&str; 4] = [
    "--draw-rate-per-user",
    "--draw-burst",
    "--once-rate-per-user",
    "--once-burst",
];

async fn run_crash(opts: LoadOptions, kills: u32) -> Result<LoadReport, LoadError> {
    let started = Instant::now();
    let wall_start = SystemTime::now();
    let bin = crate::target::find_server_binary()?;
    let dir = tempfile::tempdir()?;
    let launcher = Launcher::new(bin, dir.path(), opts.flaw)?;
    let server = launcher.start("127.0.0.1:0")?;
    let base = server.base_url.clone();
    let admin_token = Some(crate::target::bench_admin_token().to_owned());
    let prep = crate::prepare(&crate::Bases::single(&base), &opts, CRASH_STEP, admin_token).await?;
    let shared = crate::shared_state(&base, &opts, &prep)?;

    let kill_at = kill_times(shared.measure_start, opts.duration_s, kills);
    let killer = std::thread::spawn(move || kill_and_restart(server, kill_at, started, &launcher));
    let attacked = crate::attack(&base, &opts, &shared).await;
    let outcome = tokio::task::spawn_blocking(move || killer.join())
        .await
        .map_err(|e| LoadError::Server(format!("killer task: {e}")))?
        .map_err(|_| LoadError::Server("killer thread panicked".to_owned()))??;
    attacked?;
    let KillerOutcome {
        mut server,
        windows,
        samples,
    } = outcome;

    wait_settled(&prep.admin).await?;
    let mut verification = crate::verification(&prep, &shared).await?;
    let ids = crate::workload_lock(&shared.segment_ids).clone();
    verification.push(verify::lost_ids_bounded(
        &ids,
        u64::from(kills),
        lost_ids_bound_per_crash(CRASH_STEP_MAX, opts.users),
    ));
    verification.push(verify::kills_done(
        "crash.kills_done",
        windows.len(),
        kills as usize,
    ));
    server.stop();
    let hlog_start = wall_start + shared.measure_start.duration_since(started);
    let mut report = LoadReport {
        scenario: "crash_under_load".to_owned(),
        target: format!(
            "sut-server child at {base} (per-user quotas {CRASH_QUOTA_PER_USER}/s), SIGKILLed \
             {kills} times{}",
            opts.flaw
                .map(|f| format!(", flaw {f} switched on"))
                .unwrap_or_default()
        ),
        duration_s: opts.duration_s as f64,
        warmup_s: 0.0,
        rate: opts.rate,
        users: opts.users,
        endpoints: crate::endpoints(&opts, &shared, hlog_start)?,
        server: samples,
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

    /// `POST path` with `body` as `bearer`: the status and the answer.
    async fn post(base: &str, path: &str, bearer: &str, body: serde_json::Value) -> (u16, String) {
        let answer = reqwest::Client::new()
            .post(format!("{base}{path}"))
            .bearer_auth(bearer)
            .json(&body)
            .send()
            .await
            .unwrap();
        (answer.status().as_u16(), answer.text().await.unwrap())
    }

    #[test]
    fn a_users_token_outlives_a_kill_of_the_server() {
        crate::target::ensure_server_binary();
        let bin = crate::target::find_server_binary().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let launcher = Launcher::new(bin, dir.path(), None).unwrap();
        let mut server = launcher.start("127.0.0.1:0").unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let admin = crate::target::bench_admin_token();
        let (status, issued) = rt.block_on(post(
            &server.base_url,
            "/tokens",
            admin,
            serde_json::json!({"user": 7}),
        ));
        assert_eq!(status, 200, "{issued}");
        let v: serde_json::Value = serde_json::from_str(&issued).unwrap();
        let token = v["token"].as_str().unwrap().to_owned();
        server.kill();
        let addr = server.addr.clone();
        let mut server = launcher.restart(&addr).unwrap();
        let (status, verified) = rt.block_on(post(
            &server.base_url,
            "/tokens/verify",
            admin,
            serde_json::json!({ "token": token }),
        ));
        assert_eq!(
            status, 200,
            "the restarted server refused the token: {verified}"
        );
        server.stop();
    }
}
