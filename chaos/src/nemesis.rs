//! The chaos nemesis of `cluster_chaos` (docs/real.md): every fault kind against the real
//! processes of a [`Deployment`] started with its chaos hooks, while the load runs.
//!
//! One fault at a time, `every` apart, each held `down_for` and then healed; the kinds take turns
//! in an order drawn from the seed, and so do their targets; a kind whose fault had no effect
//! comes again at the end of the round:
//!
//! - `kill`: SIGKILL of a role process, restarted on its database `down_for` later;
//! - `pause`: SIGSTOP of a role process, SIGCONT `down_for` later;
//! - `clock`: a role process's wall clock (libfaketime) stepped back or forward by seconds,
//!   stepped home `down_for` later (a second step, the other way);
//! - `clock_strobe`: a role process's wall clock flipping between home and seconds away, every
//!   100–400 ms, for `down_for`;
//! - `clock_skew`: every role process's clock set seconds apart from the others (each its own
//!   offset, back or forward), all home `down_for` later;
//! - `partition`: one link (a process→PostgreSQL, the coordinator→a participant or the token
//!   service, the clients→a process) refused, black-holed, or cut one way by its fault proxy;
//! - `link_slow`: one link delayed (latency with jitter) or throttled (a bandwidth limit);
//! - `link_break`: one link's connections reset mid-stream or left half-open (the server sees
//!   the client leave, the client does not);
//! - `power_loss`: PostgreSQL SIGKILLed, every write it had not synced dropped, restarted
//!   through crash recovery `down_for` later;
//! - `db_kill`: PostgreSQL SIGKILLed and restarted on its files.
//!
//! Every fault's observable effect is checked while it holds (the fault-coverage rule): the
//! killed port refuses connections, the paused process does not answer, the process reports the
//! stepped clock on `/health` (a strobe both ways, a skew on at least two processes), the proxy
//! refused, held, delayed, reset or half-opened something, the power loss dropped unsynced bytes. A kind none of whose faults took effect fails the run (`chaos.took_effect`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::{Deployment, Direction, LinkFault, ProcessError, RoleProcess};
use reports::model::{FaultWindow, InvariantResult, Judgement};

/// How long a probe waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(400);
/// A clock step is seen when the process's clock is within this of the step.
const CLOCK_SEEN_WITHIN_MS: i64 = 2_000;

/// A kind of fault the chaos nemesis applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChaosFault {
    /// SIGKILL of a role process and a restart.
    Kill,
    /// SIGSTOP, then SIGCONT.
    Pause,
    /// A wall-clock step of one process, then back.
    Clock,
    /// One process's wall clock flipping between two offsets.
    ClockStrobe,
    /// Every process's wall clock at an offset of its own.
    ClockSkew,
    /// A link refused, black-holed or cut one way.
    Partition,
    /// A link delayed or throttled.
    LinkSlow,
    /// A link's connections reset mid-stream or left half-open.
    LinkBreak,
    /// PostgreSQL loses what it did not sync.
    PowerLoss,
    /// PostgreSQL SIGKILLed and restarted.
    DbKill,
}

impl ChaosFault {
    /// Every kind, in the order they are named in files.
    pub const ALL: [Self; 10] = [
        Self::Kill,
        Self::Pause,
        Self::Clock,
        Self::ClockStrobe,
        Self::ClockSkew,
        Self::Partition,
        Self::LinkSlow,
        Self::LinkBreak,
        Self::PowerLoss,
        Self::DbKill,
    ];

    /// Its name in the fault vocabulary, as scenario files and reports say it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        self.kind().name()
    }

    /// Its kind in the fault vocabulary ([`sut::fault::FaultKind`]).
    #[must_use]
    pub const fn kind(self) -> sut::fault::FaultKind {
        use sut::fault::FaultKind as K;
        match self {
            Self::Kill => K::Kill,
            Self::Pause => K::Pause,
            Self::Clock => K::ClockBump,
            Self::ClockStrobe => K::ClockStrobe,
            Self::ClockSkew => K::ClockSkew,
            Self::Partition => K::Partition,
            Self::LinkSlow => K::LinkSlow,
            Self::LinkBreak => K::LinkBreak,
            Self::PowerLoss => K::PowerLoss,
            Self::DbKill => K::DbKill,
        }
    }

    /// The kind named `name`.
    ///
    /// # Errors
    /// An unknown name, or a fault the deployment's chaos does not inject (saying where it is).
    pub fn parse(name: &str) -> Result<Self, String> {
        sut::fault::parse_into(name, sut::fault::Runner::Deployment, &Self::ALL, Self::kind)
    }
}

/// What the nemesis does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChaosOptions {
    /// Draws the order of the kinds, the targets and the clock steps.
    pub seed: u64,
    /// The kinds, each applied in turn (at least one).
    pub faults: Vec<ChaosFault>,
    /// From the end of one fault to the start of the next.
    pub every: Duration,
    /// How long each fault holds.
    pub down_for: Duration,
}

/// One fault as applied.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// Its kind.
    pub kind: ChaosFault,
    /// The process or link it hit (`id-2`, `coordinator→wallet`, `postgres`).
    pub target: String,
    /// What it did and what was seen (`clock −12 s, seen −12.0 s`).
    pub what: String,
    /// Seconds since the run started.
    pub start_s: f64,
    /// Seconds since the run started, once healed.
    pub end_s: f64,
    /// Whether its observable effect was seen.
    pub took_effect: bool,
}

impl Applied {
    /// The report's fault window, on the target's timeline.
    #[must_use]
    pub fn window(&self) -> FaultWindow {
        FaultWindow {
            start_s: self.start_s,
            end_s: self.end_s,
            label: format!(
                "{}: {} ({})",
                self.target,
                self.what,
                if self.took_effect {
                    "took effect"
                } else {
                    "no effect seen"
                }
            ),
            process: Some(self.target.clone()),
            kind: Some(self.kind.name().into()),
        }
    }
}

/// A process the supervisor found down (it exited on its own: a fail-stop) and restarted.
#[derive(Clone, Debug, PartialEq)]
pub struct Revived {
    /// Which.
    pub process: String,
    /// Seconds since the run started.
    pub at_s: f64,
    /// Whether the restart succeeded (else it is tried again on the next round).
    pub restarted: bool,
}

impl Revived {
    /// The report's mark on the process's timeline.
    #[must_use]
    pub fn window(&self) -> FaultWindow {
        FaultWindow {
            start_s: self.at_s,
            end_s: self.at_s + 0.05,
            label: format!(
                "{}: {}",
                self.process,
                if self.restarted {
                    "down (exited on its own), restarted by the supervisor"
                } else {
                    "down (exited on its own), restarts failing, tried every 100 ms"
                }
            ),
            process: Some(self.process.clone()),
            kind: Some("supervisor restart".into()),
        }
    }
}

/// The deployment's supervisor (what systemd's `Restart=always` does): restarts every process
/// that is down, every [`SUPERVISE_EVERY`], and remembers each restart.
#[derive(Debug)]
pub struct Supervisor {
    started: Instant,
    /// Every process found down, in order.
    pub revived: Vec<Revived>,
    /// Processes whose restarts fail so far.
    failing: std::collections::BTreeSet<String>,
}

/// How often the supervisor looks.
pub const SUPERVISE_EVERY: Duration = Duration::from_millis(100);

impl Supervisor {
    /// A supervisor whose times count from `started`.
    #[must_use]
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            revived: Vec::new(),
            failing: std::collections::BTreeSet::new(),
        }
    }

    /// One round: restarts what is down. A process whose restart keeps failing (its database
    /// still unreachable) is reported once, then again when it runs.
    pub fn round(&mut self, deployment: &mut Deployment) {
        for (which, restarted) in deployment.revive() {
            let process = which.name();
            let first_failure = !restarted && self.failing.insert(process.clone());
            if !(restarted || first_failure) {
                continue;
            }
            if restarted {
                self.failing.remove(&process);
            }
            let revived = Revived {
                process,
                at_s: self.started.elapsed().as_secs_f64(),
                restarted,
            };
            eprintln!(
                "chaos: {:>7.1} s  supervisor {}",
                revived.at_s,
                revived.window().label
            );
            self.revived.push(revived);
        }
    }

    /// Rounds until `until`.
    pub fn until(&mut self, deployment: &mut Deployment, until: Instant) {
        loop {
            self.round(deployment);
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(SUPERVISE_EVERY));
        }
    }

    /// Rounds on a thread of its own until [`Watch::stop`] hands the deployment back.
    #[must_use]
    pub fn watch(mut self, mut deployment: Deployment) -> Watch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                self.round(&mut deployment);
                std::thread::sleep(SUPERVISE_EVERY);
            }
            (deployment, self)
        });
        Watch { stop, thread }
    }
}

/// A [`Supervisor`] watching a deployment on its own thread.
#[derive(Debug)]
pub struct Watch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(Deployment, Supervisor)>,
}

impl Watch {
    /// Stops watching; the deployment and the supervisor's record.
    ///
    /// # Errors
    /// The supervisor's thread panicked.
    pub fn stop(self) -> Result<(Deployment, Supervisor), String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "the supervisor's thread panicked".to_owned())
    }
}

/// splitmix64: a small, seedable, well-mixed generator (the schedule only; nothing secret).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "a choice among nothing");
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }

    fn shuffled<T: Clone>(&mut self, items: &[T]) -> Vec<T> {
        let mut v = items.to_vec();
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
        v
    }
}

/// Runs the nemesis from `first` until `until` (no fault starts later than `until - down_for`).
/// Times in the returned faults count from `started`.
///
/// # Errors
/// A fault or its healing could not be applied (a restart that failed, a signal refused).
pub fn run_nemesis(
    deployment: &mut Deployment,
    supervisor: &mut Supervisor,
    opts: &ChaosOptions,
    first: Instant,
    until: Instant,
) -> Result<Vec<Applied>, ProcessError> {
    let started = supervisor.started;
    assert!(!opts.faults.is_empty(), "a nemesis with no fault kind");
    let mut rng = Rng(opts.seed);
    let mut applied = Vec::new();
    let mut next_at = first;
    let mut round: Vec<ChaosFault> = Vec::new();
    let mut again = std::collections::BTreeSet::new();
    while next_at + opts.down_for <= until {
        supervisor.until(deployment, next_at);
        if round.is_empty() {
            round = rng.shuffled(&opts.faults);
            again.clear();
        }
        let kind = round.remove(0);
        let start_s = started.elapsed().as_secs_f64();
        let (target, what, took_effect) =
            apply(deployment, supervisor, kind, opts.down_for, &mut rng)?;
        let fault = Applied {
            kind,
            target,
            what,
            start_s,
            end_s: started.elapsed().as_secs_f64(),
            took_effect,
        };
        eprintln!(
            "chaos: {:>7.1} s  {:<10} {}",
            fault.start_s,
            kind.name(),
            fault.window().label
        );
        // A kind whose fault had no effect to see (a link idle for the whole hold, a process
        // that could not answer its probe) comes again once at the end of this round, so that
        // every kind gets a second chance to take effect without taking the others' turns; the
        // attempt stays in the record.
        if !took_effect && again.insert(kind) {
            round.push(kind);
        }
        applied.push(fault);
        next_at = Instant::now() + opts.every;
    }
    Ok(applied)
}

/// Applies one fault, holds it, heals it; returns the target, what was done and seen, and
/// whether the effect was seen.
fn apply(
    deployment: &mut Deployment,
    supervisor: &mut Supervisor,
    kind: ChaosFault,
    down_for: Duration,
    rng: &mut Rng,
) -> Result<(String, String, bool), ProcessError> {
    let processes: Vec<RoleProcess> = deployment.services().map(|(w, _)| w).collect();
    let process = processes[rng.below(processes.len())];
    let began = Instant::now();
    match kind {
        ChaosFault::Kill => {
            let service = deployment.service(process).ok_or_else(|| gone(process))?;
            let port = service.port();
            service.kill9()?;
            let refused = refuses(port);
            std::thread::sleep(down_for.saturating_sub(began.elapsed()));
            // A restart that fails (its database unreachable) is the supervisor's to retry.
            let restarted = service.restart().is_ok();
            let what = if restarted {
                "kill -9, restart"
            } else {
                "kill -9, restart failed (left to the supervisor)"
            };
            Ok((process.name(), what.into(), refused))
        }
        ChaosFault::Pause => {
            let service = deployment.service(process).ok_or_else(|| gone(process))?;
            let port = service.port();
            service.pause()?;
            let silent = health(port).is_none();
            std::thread::sleep(down_for.saturating_sub(began.elapsed()));
            service.resume()?;
            Ok((process.name(), "SIGSTOP, SIGCONT".into(), silent))
        }
        ChaosFault::Clock => clock_step(deployment, supervisor, process, rng, began + down_for),
        ChaosFault::ClockStrobe => {
            clock_strobe(deployment, supervisor, process, rng, began + down_for)
        }
        ChaosFault::ClockSkew => clock_skew(deployment, supervisor, rng, began + down_for),
        ChaosFault::Partition | ChaosFault::LinkSlow | ChaosFault::LinkBreak => {
            link_fault(deployment, supervisor, kind, rng, began + down_for)
        }
        ChaosFault::PowerLoss | ChaosFault::DbKill => {
            database(deployment, supervisor, kind, began + down_for)
        }
    }
}

fn gone(process: RoleProcess) -> ProcessError {
    ProcessError::Command {
        what: format!("fault on {}", process.name()),
        detail: "not a process of this deployment".into(),
    }
}

/// Steps one process's clock back 5–30 s or forward 5–60 s, checks `/health` reports it, holds,
/// steps it home.
fn clock_step(
    deployment: &mut Deployment,
    supervisor: &mut Supervisor,
    process: RoleProcess,
    rng: &mut Rng,
    heal_at: Instant,
) -> Result<(String, String, bool), ProcessError> {
    let back = rng.below(2) == 0;
    let secs = 5 + i64::try_from(rng.below(if back { 26 } else { 56 })).unwrap_or(0);
    let step_ms = if back { -secs * 1000 } else { secs * 1000 };
    let port = port_of(deployment, process)?;
    clock_of(deployment, process)?.set_offset_ms(step_ms)?;
    // The process reads the control file on every clock call (FAKETIME_NO_CACHE).
    let seen_ms = seen_offset_ms(port);
    supervisor.until(deployment, heal_at);
    clock_of(deployment, process)?.set_offset_ms(0)?;
    let took = seen_ms.is_some_and(|s| near(s, step_ms));
    Ok((
        process.name(),
        format!("clock {:+} s, {}, then home", step_ms / 1000, seen(seen_ms)),
        took,
    ))
}

/// Flips one process's clock between home and 5–20 s away (back or forward) every 100–400 ms
/// until `heal_at`, probing `/health` after each flip; took effect when both positions were
/// seen.
fn clock_strobe(
    deployment: &mut Deployment,
    supervisor: &mut Supervisor,
    process: RoleProcess,
    rng: &mut Rng,
    heal_at: Instant,
) -> Result<(String, String, bool), ProcessError> {
    let secs = 5 + i64::try_from(rng.below(16)).unwrap_or(0);
    let away_ms = if rng.below(2) == 0 { -secs } else { secs } * 1000;
    let period = Duration::from_millis(100 + rng.below(301) as u64);
    let port = port_of(deployment, process)?;
    let (mut flips, mut seen_away, mut seen_home) = (0_u32, false, false);
    let mut strobe = || -> Result<(), ProcessError> {
        while Instant::now() < heal_at {
            let away = flips % 2 == 0;
            let offset_ms = if away { away_ms } else { 0 };
            clock_of(deployment, process)?.set_offset_ms(offset_ms)?;
            flips += 1;
            if seen_offset_ms(port).is_some_and(|s| near(s, offset_ms)) {
                seen_away |= away;
                seen_home |= !away;
            }
            supervisor.until(deployment, (Instant::now() + period).min(heal_at));
        }
        Ok(())
    };
    let strobed = strobe();
    // Home on every path, also after a failed rewrite.
    let home = clocks_home(deployment, &[process]);
    strobed.and(home)?;
    let what = format!(
        "clock strobe 0 ↔ {:+} s every {} ms, {flips} flips, seen {}",
        away_ms / 1000,
        period.as_millis(),
        match (seen_away, seen_home) {
            (true, true) => "both ways",
            (true, false) => "away only",
            (false, true) => "home only",
            (false, false) => "neither",
        }
    );
    Ok((process.name(), what, seen_away && seen_home))
}

/// Sets every process's clock to an offset of its own, 3–10 s back or forward, checks each on
/// `/health`, holds, steps them all home; took effect when at least two processes showed their
/// offsets.
fn clock_skew(
    deployment: &mut Deployment,
    supervisor: &mut Supervisor,
    rng: &mut Rng,
    heal_at: Instant,
) -> Result<(String, String, bool), ProcessError> {
    let processes: Vec<RoleProcess> = deployment.services().map(|(w, _)| w).collect();
    let mut shown = Vec::new();
    let mut confirmed = 0_usize;
    let mut skew = || -> Result<(), ProcessError> {
        for &process in &processes {
            let secs = 3 + i64::try_from(rng.below(8)).unwrap_or(0);
            let offset_ms = if rng.below(2) == 0 { -secs } else { secs } * 1000;
            let port = port_of(deployment, process)?;
            clock_of(deployment, process)?.set_offset_ms(offset_ms)?;
            let seen_ms = seen_offset_ms(port);
            confirmed += usize::from(seen_ms.is_some_and(|s| near(s, offset_ms)));
            shown.push(format!("{} {:+} s", process.name(), offset_ms / 1000));
        }
        supervisor.until(deployment, heal_at);
        Ok(())
    };
    let skewed = skew();
    // Every clock home on every path, also when one step failed half-way.
    let home = clocks_home(deployment, &processes);
    skewed.and(home)?;
    let what = format!(
        "clocks skewed ({}), {confirmed} of {} seen, then home",
        shown.join(", "),
        processes.len()
    );
    Ok(("every process".into(), what, confirmed >= 2))
}

/// Steps every clock of `processes` home, each even when an earlier one failed; the first
/// failure.
fn clocks_home(deployment: &mut Deployment, processes: &[RoleProcess]) -> Result<(), ProcessError> {
    let mut first = Ok(());
    for &process in processes {
        let home = clock_of(deployment, process).and_then(|c| c.set_offset_ms(0));
        if first.is_ok() {
            first = home;
        }
    }
    first
}

fn port_of(deployment: &mut Deployment, process: RoleProcess) -> Result<u16, ProcessError> {
    Ok(deployment
        .service(process)
        .ok_or_else(|| gone(process))?
        .port())
}

fn clock_of(
    deployment: &mut Deployment,
    process: RoleProcess,
) -> Result<&mut crate::FakeClock, ProcessError> {
    deployment
        .clock(process)
        .ok_or_else(|| ProcessError::Command {
            what: format!("clock fault on {}", process.name()),
            detail: "the deployment was started without its chaos hooks".into(),
        })
}

/// How far the process's wall clock (its `/health`) is from the real one now, if it answers.
fn seen_offset_ms(port: u16) -> Option<i64> {
    health(port).map(|h| h.wall_clock_ms - real_now_ms())
}

const fn near(seen_ms: i64, offset_ms: i64) -> bool {
    (seen_ms - offset_ms).abs() <= CLOCK_SEEN_WITHIN_MS
}

fn seen(seen_ms: Option<i64>) -> String {
    seen_ms.map_or_else(
        || "not seen: no answer".to_owned(),
        |s| format!("seen {:+.1} s", s as f64 / 1000.0),
    )
}

/// The proxy fault a link kind applies, drawn from the seed, with its name.
fn draw_link_fault(kind: ChaosFault, rng: &mut Rng) -> (LinkFault, String) {
    let pick = rng.below(4);
    match kind {
        ChaosFault::Partition => match pick {
            0 => (LinkFault::Refuse, "refused".into()),
            1 => (LinkFault::Blackhole, "black-holed".into()),
            2 => (
                LinkFault::OneWay {
                    stall: Direction::Up,
                },
                "cut one way (requests held)".into(),
            ),
            _ => (
                LinkFault::OneWay {
                    stall: Direction::Down,
                },
                "cut one way (answers held)".into(),
            ),
        },
        ChaosFault::LinkSlow if pick < 2 => {
            let delay_ms = 20 + rng.below(181) as u64;
            let jitter_ms = delay_ms / 2;
            (
                LinkFault::Latency {
                    delay_ms,
                    jitter_ms,
                },
                format!("latency {delay_ms} ± {jitter_ms} ms"),
            )
        }
        ChaosFault::LinkSlow => {
            let bytes_per_s = 2_000 + 1_000 * rng.below(19) as u64;
            (
                LinkFault::Bandwidth { bytes_per_s },
                format!("bandwidth {} KB/s", bytes_per_s / 1000),
            )
        }
        ChaosFault::LinkBreak if pick < 2 => {
            let bytes = rng.below(2_049) as u64;
            (
                LinkFault::ResetAfter { bytes },
                format!("reset after {bytes} bytes per connection"),
            )
        }
        _ => (LinkFault::HalfOpen, "half-open".into()),
    }
}

/// What a link fault's effect moves: a partition refuses, resets or holds; a slow link delays
/// chunks; a break resets or half-opens connections.
fn touched(kind: ChaosFault, e: crate::ProxyEffects) -> u64 {
    match kind {
        ChaosFault::Partition => e.refusals + e.resets + e.held_bytes,
        ChaosFault::LinkSlow => e.delayed_chunks,
        _ => e.resets + e.half_opened,
    }
}

/// How long the nemesis watches the links' traffic before it picks one to fault.
const BUSY_WATCH: Duration = Duration::from_millis(250);

/// The links that carried bytes during [`BUSY_WATCH`] (every link when none did). A fault on a
/// link nothing uses has no effect to see: the nemesis, like a Jepsen nemesis choosing its
/// targets, cuts a link in use.
fn busy_links(deployment: &mut Deployment, supervisor: &mut Supervisor) -> Vec<usize> {
    let traffic = |d: &Deployment| -> Vec<u64> {
        d.links()
            .iter()
            .map(|(_, p)| {
                // Bytes that reached the other side: a connection accepted by the proxy whose
                // server refuses it (a process down) carries nothing a slow link could delay.
                let e = p.effects();
                e.bytes_up + e.bytes_down
            })
            .collect()
    };
    let before = traffic(deployment);
    supervisor.until(deployment, Instant::now() + BUSY_WATCH);
    let after = traffic(deployment);
    let busy: Vec<usize> = (0..after.len())
        .filter(|&i| before.get(i).is_some_and(|b| after[i] > *b))
        .collect();
    if busy.is_empty() {
        (0..after.len()).collect()
    } else {
        busy
    }
}

/// Applies a link fault of `kind` to one link for `down_for`.
fn link_fault(
    deployment: &mut Deployment,
    supervisor: &mut Supervisor,
    kind: ChaosFault,
    rng: &mut Rng,
    heal_at: Instant,
) -> Result<(String, String, bool), ProcessError> {
    let links = deployment.links();
    if links.is_empty() {
        return Err(ProcessError::Command {
            what: kind.name().into(),
            detail: "the deployment was started without its chaos hooks".into(),
        });
    }
    let busy = busy_links(deployment, supervisor);
    let at = busy[rng.below(busy.len())];
    let (fault, how) = draw_link_fault(kind, rng);
    let links = deployment.links();
    let before = touched(kind, links[at].1.effects());
    links[at].1.set(fault);
    supervisor.until(deployment, heal_at);
    let (link, proxy) = &deployment.links()[at];
    proxy.set(LinkFault::None);
    let after = touched(kind, proxy.effects());
    Ok((link.name(), how, after > before))
}

/// A power loss or a kill -9 of the database server, restarted `down_for` later.
fn database(
    deployment: &mut Deployment,
    supervisor: &mut Supervisor,
    kind: ChaosFault,
    heal_at: Instant,
) -> Result<(String, String, bool), ProcessError> {
    let pg = deployment.database().ok_or_else(|| ProcessError::Command {
        what: kind.name().into(),
        detail: "the deployment has no database server".into(),
    })?;
    let name = pg.name();
    let port = pg.port();
    let (what, took) = if kind == ChaosFault::PowerLoss {
        let lost_before = pg.lost_writes().map_or(0, |l| l.lost_bytes);
        let after = pg.power_loss()?;
        let lost = after.lost_bytes - lost_before;
        (
            format!("power loss, {lost} unsynced bytes dropped, restart"),
            lost > 0 && refuses(port),
        )
    } else {
        pg.kill9()?;
        ("kill -9, restart".to_owned(), refuses(port))
    };
    supervisor.until(deployment, heal_at);
    if let Some(pg) = deployment.database() {
        pg.restart()?;
    }
    Ok((name.into(), what, took))
}

/// Whether a TCP connection to the port is refused now.
fn refuses(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).is_err()
}

/// What `/health` says, if it answers within [`PROBE_TIMEOUT`].
#[derive(Debug, serde::Deserialize)]
struct Health {
    wall_clock_ms: i64,
}

fn health(port: u16) -> Option<Health> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).ok()?;
    s.set_read_timeout(Some(PROBE_TIMEOUT)).ok()?;
    s.set_write_timeout(Some(PROBE_TIMEOUT)).ok()?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| serde_json::from_str(body).ok())
        .flatten()
}

fn real_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `chaos.took_effect`: every kind asked for took effect at least once.
#[must_use]
pub fn took_effect(asked: &[ChaosFault], applied: &[Applied]) -> InvariantResult {
    let per_kind: Vec<(ChaosFault, usize, usize)> = asked
        .iter()
        .map(|&k| {
            let of = applied.iter().filter(|a| a.kind == k);
            (k, of.clone().filter(|a| a.took_effect).count(), of.count())
        })
        .collect();
    let missing: Vec<&str> = per_kind
        .iter()
        .filter(|(_, effective, _)| *effective == 0)
        .map(|(k, _, _)| k.name())
        .collect();
    let detail = per_kind
        .iter()
        .map(|(k, effective, of)| format!("{} {effective}/{of}", k.name()))
        .collect::<Vec<_>>()
        .join(", ");
    InvariantResult {
        name: "chaos.took_effect".into(),
        verdict: if missing.is_empty() {
            Judgement::Held
        } else {
            Judgement::Violated
        },
        seed: None,
        first_offending_event: (!missing.is_empty())
            .then(|| format!("never took effect: {}", missing.join(", "))),
        detail: Some(format!("faults that took effect / applied: {detail}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(kind: ChaosFault, took_effect: bool) -> Applied {
        Applied {
            kind,
            target: "id-1".into(),
            what: "x".into(),
            start_s: 0.0,
            end_s: 1.0,
            took_effect,
        }
    }

    #[test]
    fn a_kind_that_never_took_effect_fails_coverage() {
        let asked = [ChaosFault::Kill, ChaosFault::Clock];
        let both = [
            applied(ChaosFault::Kill, true),
            applied(ChaosFault::Clock, false),
            applied(ChaosFault::Clock, true),
        ];
        assert_eq!(took_effect(&asked, &both).verdict, Judgement::Held);
        let clock_never = [
            applied(ChaosFault::Kill, true),
            applied(ChaosFault::Clock, false),
        ];
        let r = took_effect(&asked, &clock_never);
        assert_eq!(r.verdict, Judgement::Violated);
        assert!(r.first_offending_event.unwrap().contains("clock"));
        let never_applied = [applied(ChaosFault::Kill, true)];
        assert_eq!(
            took_effect(&asked, &never_applied).verdict,
            Judgement::Violated
        );
    }

    #[test]
    fn fault_names_round_trip_and_unknown_ones_are_named() {
        for f in ChaosFault::ALL {
            assert_eq!(ChaosFault::parse(f.name()), Ok(f));
        }
        let e = ChaosFault::parse("meteor").unwrap_err();
        assert!(e.contains("meteor") && e.contains("power_loss"), "{e}");
    }

    #[test]
    fn each_link_kind_draws_every_proxy_fault_of_its_own_and_no_other() {
        let mut rng = Rng(11);
        let mut seen = std::collections::BTreeSet::new();
        for kind in [
            ChaosFault::Partition,
            ChaosFault::LinkSlow,
            ChaosFault::LinkBreak,
        ] {
            for _ in 0..200 {
                let (fault, _) = draw_link_fault(kind, &mut rng);
                assert_eq!(
                    fault.kind(),
                    Some(kind.kind()),
                    "{fault:?} drawn for {}",
                    kind.name()
                );
                seen.insert(
                    format!("{fault:?}")
                        .split([' ', '{'])
                        .next()
                        .unwrap()
                        .to_owned(),
                );
            }
        }
        // refuse, black hole, one-way, latency, bandwidth, reset, half-open.
        assert_eq!(seen.len(), 7, "{seen:?}");
    }

    #[test]
    fn a_link_fault_counts_only_its_own_effect() {
        let slow = crate::ProxyEffects {
            delayed_chunks: 3,
            ..Default::default()
        };
        let broken = crate::ProxyEffects {
            half_opened: 1,
            ..Default::default()
        };
        let held = crate::ProxyEffects {
            held_bytes: 10,
            ..Default::default()
        };
        assert_eq!(touched(ChaosFault::LinkSlow, slow), 3);
        assert_eq!(touched(ChaosFault::LinkBreak, slow), 0);
        assert_eq!(touched(ChaosFault::Partition, slow), 0);
        assert_eq!(touched(ChaosFault::LinkBreak, broken), 1);
        assert_eq!(touched(ChaosFault::LinkSlow, held), 0);
        assert_eq!(touched(ChaosFault::Partition, held), 10);
    }

    #[test]
    fn the_schedule_is_a_function_of_the_seed() {
        let draw = |seed| {
            let mut r = Rng(seed);
            (0..8).map(|_| r.below(6)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let mut r = Rng(3);
        let mut s = r.shuffled(&ChaosFault::ALL);
        s.sort();
        assert_eq!(s, ChaosFault::ALL.to_vec(), "a shuffle keeps every kind");
    }
}
