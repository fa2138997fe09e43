//! `scenario search`: looks for a failing fault schedule with proptest and shrinks it.
//!
//! A case is a scripted fault schedule (`[[schedule]]` entries over the scenario's nodes and
//! fault kinds) plus two workload parameters (the run's seed and its operation rate); running a
//! case is one deterministic [`sim::run::run_seed`]. proptest's [`TestRunner`] generates cases
//! and, on the first violation, shrinks: the schedule is a `proptest::collection::vec`, so
//! dropping an event is a shrink step, and each event's parameters shrink towards simpler values
//! (earlier, shorter, smaller jumps, fewer nodes, no tearing). A shrink step counts as failing
//! only if it violates **the same invariant** as the first failure, so shrinking cannot wander
//! off to a different bug.
//!
//! The result is a scenario file that replays the failure exactly (the scenario with its
//! schedule, seed and rate, `[run] expect` naming the invariant). Every failure found is kept
//! as a regression file (by default under `scenarios/regressions/`); a later search of the
//! same scenario and flaw replays those first and stops at the first that still fails.

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::time::Instant;

use proptest::collection::vec;
use proptest::sample::{select, subsequence};
use proptest::strategy::{BoxedStrategy, Strategy, Union};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use sim::faults::{self, Param, Targets, Value};
use sim::run::{SeedOutcome, node_names};
use sim::scenario::{FaultKind, Scenario, ScheduledFault};
use sut::flaw::Flaw;

/// One case: a schedule and the workload parameters it runs with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Case {
    /// The scripted faults (in generation order; the nemesis plays them by time).
    pub schedule: Vec<ScheduledFault>,
    /// The run's seed (message delays, client choices, ...).
    pub seed: u64,
    /// Operations per simulated second.
    pub rate_per_s: u32,
}

/// How to search.
#[derive(Clone, Debug)]
pub struct SearchOptions {
    /// New cases to generate before giving up.
    pub cases: u32,
    /// Seed of the search itself (which cases proptest generates): the same seed, the same
    /// search.
    pub seed: u64,
    /// Most fault events in a generated schedule.
    pub events_max: usize,
    /// Most shrink steps (each one run) after the first failure.
    pub shrink_iters_max: u32,
    /// Largest run seed a case may use (seeds shrink towards 0).
    pub run_seeds: u64,
    /// Where regression files live; `None`: neither read nor written.
    pub regressions: Option<PathBuf>,
    /// Skip replaying the regression files first (they are still written).
    pub fresh: bool,
    /// Look for a violation of this invariant only (others count as passing); `None`: the
    /// first invariant violated decides.
    pub invariant: Option<String>,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            cases: 64,
            seed: 0,
            events_max: 10,
            shrink_iters_max: 96,
            run_seeds: 1_000,
            regressions: Some(PathBuf::from("scenarios/regressions")),
            fresh: false,
            invariant: None,
        }
    }
}

/// Where the search is, for a progress bar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// A regression file is being replayed.
    Regression(PathBuf),
    /// A new case ran (`n` of at most `total`).
    Case {
        /// Cases run so far.
        n: u32,
        /// The limit.
        total: u32,
    },
    /// The first failure was found.
    Failed {
        /// Its invariant.
        invariant: String,
        /// Its schedule's event count.
        events: usize,
    },
    /// A shrink step ran.
    Shrink {
        /// Steps so far.
        step: u32,
        /// Events in the smallest failing schedule so far.
        events: usize,
    },
}

/// A failure, shrunk.
#[derive(Clone, Debug)]
pub struct Found {
    /// The scenario that replays it: schedule, seed, rate, flaw and expected invariant set.
    pub scenario: Scenario,
    /// The invariant violated.
    pub invariant: String,
    /// The violation's detail (as the replay prints it).
    pub detail: String,
    /// Events in the first failing schedule.
    pub events_before: usize,
    /// Events in the shrunk schedule.
    pub events_after: usize,
    /// New cases run before the first failure (counting it).
    pub cases_run: u32,
    /// Shrink steps run.
    pub shrink_steps: u32,
    /// The regression file that still failed, when the failure came from one (no search ran).
    pub from_regression: Option<PathBuf>,
    /// Wall time of the whole search, seconds.
    pub wall_seconds: f64,
}

/// What a search ended with.
#[derive(Clone, Debug)]
pub enum SearchOutcome {
    /// Every case held every invariant.
    Nothing {
        /// Cases run.
        cases_run: u32,
        /// Wall time, seconds.
        wall_seconds: f64,
    },
    /// A violation, shrunk.
    Found(Box<Found>),
}

/// Why a search could not run.
#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    /// The scenario has no fault kind to schedule and no flaw to find.
    #[error("scenario `{0}` has no fault kinds ([faults] kinds) to build schedules from")]
    NoKinds(String),
    /// proptest gave up (a strategy or runner problem, not a finding).
    #[error("the search aborted: {0}")]
    Aborted(String),
    /// A regression file could not be read or written.
    #[error("{0}")]
    Io(String),
}

/// Every node of the scenario's topology (for network faults) and the server nodes node faults
/// may hit (`[faults] targets` when set).
fn targets_of(scenario: &Scenario) -> Targets {
    let all = node_names(scenario);
    let targets = &scenario.faults.targets;
    let servers: Vec<String> = all
        .iter()
        .filter(|n| !n.starts_with("client"))
        .filter(|n| targets.is_empty() || targets.contains(n))
        .cloned()
        .collect();
    Targets { all, servers }
}

/// The proptest strategy of one parameter: the same range the random nemesis draws from
/// (`sim::faults`), shrinking towards its simplest value.
fn param_strategy(param: &Param) -> BoxedStrategy<Value> {
    match param.clone() {
        Param::Node(of) => select(of).prop_map(Value::Node).boxed(),
        Param::Nodes { of, min, max } => subsequence(of, min..=max).prop_map(Value::Nodes).boxed(),
        Param::Flag => proptest::bool::ANY.prop_map(Value::Flag).boxed(),
        Param::Int { lo, hi } => (lo..=hi).prop_map(Value::Int).boxed(),
        Param::LogMagnitude { max } => (0..=1_000i64)
            .prop_map(move |x| Value::Int(faults::log_magnitude(max, x)))
            .boxed(),
    }
}

/// The strategy of one event of `kind` (None: the topology gives it no target): a time in the
/// safety phase and every parameter of the kind's space.
fn event_strategy(
    scenario: &Scenario,
    kind: FaultKind,
    targets: &Targets,
) -> Option<BoxedStrategy<ScheduledFault>> {
    let space = faults::space(kind, &scenario.faults, targets)?;
    let params: Vec<BoxedStrategy<Value>> = space
        .params
        .iter()
        .map(|(_, p)| param_strategy(p))
        .collect();
    let at = 0..scenario.run.safety_ms.max(1);
    Some(
        (at, params)
            .prop_map(move |(at_ms, values)| space.event(at_ms, &values))
            .boxed(),
    )
}

/// The strategy of a case for `scenario`: a schedule of up to `events_max` events of the
/// scenario's fault kinds over its topology, a run seed below `run_seeds`, and a rate between
/// half the scenario's and the scenario's. Shrinking drops events first (the schedule is the
/// tuple's first element), then simplifies the seed and the rate.
///
/// # Errors
/// The scenario has no fault kind its topology can target.
pub fn strategy(
    scenario: &Scenario,
    events_max: usize,
    run_seeds: u64,
) -> Result<BoxedStrategy<Case>, SearchError> {
    let targets = targets_of(scenario);
    let kinds: Vec<BoxedStrategy<ScheduledFault>> = scenario
        .faults
        .kinds
        .iter()
        .filter_map(|kind| event_strategy(scenario, *kind, &targets))
        .collect();
    if kinds.is_empty() {
        return Err(SearchError::NoKinds(scenario.name.clone()));
    }
    let rate = scenario.workload.rate_per_s.max(1);
    Ok((
        vec(Union::new(kinds), 0..=events_max),
        0..run_seeds.max(1),
        (rate / 2).max(1)..=rate,
    )
        .prop_map(|(schedule, seed, rate_per_s)| Case {
            schedule,
            seed,
            rate_per_s,
        })
        .boxed())
}

/// `scenario` with the case's schedule (sorted by time), seed and rate: the scenario that
/// replays the case.
#[must_use]
pub fn scripted(scenario: &Scenario, case: &Case) -> Scenario {
    let mut s = scenario.clone();
    let mut schedule = case.schedule.clone();
    schedule.sort_by_key(|e| e.at_ms);
    s.schedule = Some(schedule);
    s.run.seed = Some(case.seed);
    s.run.seeds = 1;
    s.workload.rate_per_s = case.rate_per_s;
    s
}

/// Runs a scripted scenario once (its `[run] seed`, else 0), with the crash point it strikes
/// (`[run] crash_at`), if any.
#[must_use]
pub fn run_scripted(scenario: &Scenario) -> SeedOutcome {
    sim::run::run_seed_as_set(scenario, scenario.run.seed.unwrap_or(0), false)
}

/// The first violated invariant of a run (checker order) and its detail.
#[must_use]
pub fn first_violation(outcome: &SeedOutcome) -> Option<(String, String)> {
    outcome
        .violations()
        .next()
        .map(|v| (v.invariant.clone(), v.detail.clone()))
}

/// The violation of `invariant` in a run, if that invariant failed.
#[must_use]
pub fn violation_of(outcome: &SeedOutcome, invariant: &str) -> Option<String> {
    outcome
        .violations()
        .find(|v| v.invariant == invariant)
        .map(|v| v.detail.clone())
}

/// The regression files in `dir` for this scenario and flaw (by their contents: name and
/// `[run] flaw`), in file-name order. Unreadable or malformed files are errors: a regression
/// that silently stops running is no regression.
///
/// # Errors
/// A file in `dir` cannot be read or parsed.
pub fn regressions(
    dir: &Path,
    name: &str,
    flaw: Option<Flaw>,
) -> Result<Vec<(PathBuf, Scenario)>, SearchError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    let mut found = Vec::new();
    for path in paths {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(&path).map_err(|e| SearchError::Io(format!("{shown}: {e}")))?;
        let scenario =
            Scenario::parse(&shown, &text).map_err(|e| SearchError::Io(e.to_string()))?;
        if scenario.name == name && scenario.run.flaw == flaw && scenario.schedule.is_some() {
            found.push((path, scenario));
        }
    }
    Ok(found)
}

/// The file name a failure is kept under: scenario, flaw (or `correct`), invariant.
#[must_use]
pub fn regression_name(name: &str, flaw: Option<Flaw>, invariant: &str) -> String {
    let flaw = flaw.map_or("correct", Flaw::name);
    format!("{name}-{flaw}-{}.toml", invariant.replace('.', "_"))
}

/// The schedule as a human-readable timeline, one event per line (`(no fault)` when empty).
#[must_use]
pub fn timeline(scenario: &Scenario) -> Vec<String> {
    let crash =
        scenario.run.crash_at.as_ref().map(|spec| {
            format!("crash point {spec}: the node crashed at that step, then restarted")
        });
    let faults = match scenario.schedule.as_deref() {
        Some([]) if crash.is_some() => Vec::new(),
        other => scheduled(scenario, other),
    };
    crash.into_iter().chain(faults).collect()
}

/// The scheduled faults' lines (`timeline` without the crash point).
fn scheduled(scenario: &Scenario, schedule: Option<&[ScheduledFault]>) -> Vec<String> {
    match schedule {
        None => vec!["(random faults: no schedule)".to_owned()],
        Some([]) => vec![match scenario.run.flaw {
            Some(flaw) => format!(
                "(no fault at all: flaw `{flaw}` breaks the run by itself, under the workload \
                 alone; it needs no fault)"
            ),
            None => "(no fault at all: the workload alone breaks the run)".to_owned(),
        }],
        Some(events) => events.iter().map(ScheduledFault::describe).collect(),
    }
}

/// The scenario file of a finding: a comment header (how it was found, the violation, the
/// timeline), then the whole scenario, defaults included, so it replays exactly even if the
/// defaults change later.
///
/// # Errors
/// The scenario cannot be serialized (a bug).
pub fn replay_text(found: &Found, command: &str) -> Result<String, SearchError> {
    let body =
        toml::to_string(&found.scenario).map_err(|e| SearchError::Io(format!("toml: {e}")))?;
    let mut text = String::new();
    text.push_str(&format!("# Written by `{command}`.\n"));
    let detail = found.detail.replace('\n', " ");
    let violation = if detail.starts_with(&found.invariant) {
        detail
    } else {
        format!("{}: {detail}", found.invariant)
    };
    text.push_str(&format!("# Violates {violation}\n"));
    text.push_str(&format!(
        "# Shrunk from {} to {} fault event(s) in {} step(s); run seed {}, {} operations/s.\n",
        found.events_before,
        found.events_after,
        found.shrink_steps,
        found.scenario.run.seed.unwrap_or(0),
        found.scenario.workload.rate_per_s
    ));
    text.push_str("# Replay: scenario replay THIS_FILE (or: scenario THIS_FILE)\n# Timeline:\n");
    for line in timeline(&found.scenario) {
        text.push_str(&format!("#   {line}\n"));
    }
    text.push('\n');
    text.push_str(&body);
    Ok(text)
}

/// Writes `text` to `path` whole or not at all ([`reports::atomic::write_atomic`]), creating
/// its folder first.
///
/// # Errors
/// The folder cannot be created or the file written.
pub fn write_atomic(path: &Path, text: &str) -> Result<(), SearchError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| SearchError::Io(format!("{}: {e}", dir.display())))?;
    }
    reports::atomic::write_atomic(path, text.as_bytes()).map_err(|e| SearchError::Io(e.to_string()))
}

/// Writes `text` to `path`, or, if `path` exists, to the first of `STEM-2.EXT`, `STEM-3.EXT`, …
/// that does not: never over an existing file. The file appears whole (written to a temporary
/// file, then hard-linked into place, which fails rather than replace). Returns the path written.
///
/// # Errors
/// The folder cannot be created, the file written, or a thousand names are taken.
pub fn write_new(path: &Path, text: &str) -> Result<PathBuf, SearchError> {
    let io = |p: &Path, e: std::io::Error| SearchError::Io(format!("{}: {e}", p.display()));
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
    let result = (1..=1_000)
        .map(|n| match (n, &ext) {
            (1, _) => path.to_path_buf(),
            (n, Some(ext)) => path.with_file_name(format!("{stem}-{n}.{ext}")),
            (n, None) => path.with_file_name(format!("{stem}-{n}")),
        })
        .find_map(|candidate| match std::fs::hard_link(&tmp, &candidate) {
            Ok(()) => Some(Ok(candidate)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => None,
            Err(e) => Some(Err(io(&candidate, e))),
        })
        .unwrap_or_else(|| {
            Err(SearchError::Io(format!(
                "{}: a thousand files of that name exist already",
                path.display()
            )))
        });
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Most runs of the removal pass after proptest's shrinking.
pub const PRUNE_RUNS_MAX: u32 = 48;

/// A removal pass after proptest's shrinking: proptest tries dropping each event once, before
/// it simplifies the events' parameters, and never again; by the end two events may have become
/// redundant (two kills of one node at 0 ms: the second is skipped). Try dropping each event
/// again until none can go (bounded by [`PRUNE_RUNS_MAX`] runs); keep a drop only if the same
/// invariant still fails. Returns the smaller case and its violation's detail.
fn prune(
    scenario: &Scenario,
    mut best: Case,
    invariant: &str,
    mut detail: String,
    opts: &SearchOptions,
    step: &dyn Fn(usize),
) -> (Case, String) {
    let mut runs = 0;
    let budget = PRUNE_RUNS_MAX.min(opts.shrink_iters_max.max(1));
    loop {
        let mut dropped = false;
        let mut i = 0;
        while i < best.schedule.len() && runs < budget {
            let mut candidate = best.clone();
            candidate.schedule.remove(i);
            runs += 1;
            step(best.schedule.len());
            match violation_of(&run_scripted(&scripted(scenario, &candidate)), invariant) {
                Some(d) => {
                    best = candidate;
                    detail = d;
                    dropped = true;
                }
                None => i += 1,
            }
        }
        if !dropped || runs >= budget {
            return (best, detail);
        }
    }
}

fn rng_of(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    bytes[8..16].copy_from_slice(b"scenario");
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

/// The first regression file of this scenario and flaw that still fails (with its expected
/// invariant, and the invariant asked for if any), as a finding; `None` with `fresh` set.
fn replay_regressions(
    scenario: &Scenario,
    opts: &SearchOptions,
    progress: &dyn Fn(&Progress),
    started: Instant,
) -> Result<Option<Box<Found>>, SearchError> {
    let (Some(dir), false) = (&opts.regressions, opts.fresh) else {
        return Ok(None);
    };
    for (path, kept) in regressions(dir, &scenario.name, scenario.run.flaw)? {
        progress(&Progress::Regression(path.clone()));
        let outcome = run_scripted(&kept);
        let hit = match kept.run.expect.as_deref() {
            Some(invariant) => violation_of(&outcome, invariant).map(|d| (invariant.to_owned(), d)),
            None => first_violation(&outcome),
        };
        let hit = hit.filter(|(invariant, _)| {
            opts.invariant
                .as_ref()
                .is_none_or(|wanted| wanted == invariant)
        });
        if let Some((invariant, detail)) = hit {
            let events = kept.schedule.as_ref().map_or(0, Vec::len);
            return Ok(Some(Box::new(Found {
                scenario: kept,
                invariant,
                detail,
                events_before: events,
                events_after: events,
                cases_run: 0,
                shrink_steps: 0,
                from_regression: Some(path),
                wall_seconds: started.elapsed().as_secs_f64(),
            })));
        }
    }
    Ok(None)
}

/// The property proptest tests, and what it has seen: a case fails when it violates the
/// target invariant (the first one violated, or the one asked for); once one has, every
/// further case is a shrink step.
struct Judge<'a> {
    scenario: &'a Scenario,
    opts: &'a SearchOptions,
    progress: &'a dyn Fn(&Progress),
    /// The invariant of the first failure (or the one asked for): later cases fail only by
    /// violating it again.
    target: RefCell<Option<String>>,
    shrinking: Cell<bool>,
    cases_run: Cell<u32>,
    shrink_steps: Cell<u32>,
    events_before: Cell<usize>,
    events_min: Cell<usize>,
}

impl<'a> Judge<'a> {
    fn new(
        scenario: &'a Scenario,
        opts: &'a SearchOptions,
        progress: &'a dyn Fn(&Progress),
    ) -> Self {
        Self {
            scenario,
            opts,
            progress,
            target: RefCell::new(opts.invariant.clone()),
            shrinking: Cell::new(false),
            cases_run: Cell::new(0),
            shrink_steps: Cell::new(0),
            events_before: Cell::new(0),
            events_min: Cell::new(usize::MAX),
        }
    }

    /// Runs one case.
    fn judge(&self, case: &Case) -> Result<(), TestCaseError> {
        let events = case.schedule.len();
        let outcome = run_scripted(&scripted(self.scenario, case));
        let wanted = self.target.borrow().clone();
        if self.shrinking.get() {
            self.judge_shrink_step(&outcome, wanted, events)
        } else {
            self.judge_new_case(&outcome, wanted.as_deref(), events)
        }
    }

    /// A new case: the first to fail starts the shrinking and fixes the target invariant.
    fn judge_new_case(
        &self,
        outcome: &SeedOutcome,
        wanted: Option<&str>,
        events: usize,
    ) -> Result<(), TestCaseError> {
        self.cases_run.set(self.cases_run.get() + 1);
        (self.progress)(&Progress::Case {
            n: self.cases_run.get(),
            total: self.opts.cases,
        });
        let failure = match wanted {
            None => first_violation(outcome),
            Some(invariant) => violation_of(outcome, invariant).map(|d| (invariant.to_owned(), d)),
        };
        match failure {
            None => Ok(()),
            Some((invariant, detail)) => {
                self.shrinking.set(true);
                (self.progress)(&Progress::Failed {
                    invariant: invariant.clone(),
                    events,
                });
                self.events_before.set(events);
                self.events_min.set(events);
                *self.target.borrow_mut() = Some(invariant.clone());
                Err(TestCaseError::fail(format!("{invariant}: {detail}")))
            }
        }
    }

    /// A shrink step: fails only by violating the target invariant again.
    fn judge_shrink_step(
        &self,
        outcome: &SeedOutcome,
        wanted: Option<String>,
        events: usize,
    ) -> Result<(), TestCaseError> {
        let Some(invariant) = wanted else {
            return Err(TestCaseError::fail("shrinking without an invariant"));
        };
        self.shrink_steps.set(self.shrink_steps.get() + 1);
        let failed = violation_of(outcome, &invariant);
        if failed.is_some() {
            self.events_min.set(self.events_min.get().min(events));
        }
        (self.progress)(&Progress::Shrink {
            step: self.shrink_steps.get(),
            events: self.events_min.get(),
        });
        match failed {
            None => Ok(()),
            Some(detail) => Err(TestCaseError::fail(format!("{invariant}: {detail}"))),
        }
    }

    /// proptest's minimal case, run once more (the detail to report, and proof it replays),
    /// pruned, as the scenario that replays it.
    fn found(&self, minimal: Case, started: Instant) -> Result<SearchOutcome, SearchError> {
        let (scenario, progress) = (self.scenario, self.progress);
        let invariant = self
            .target
            .borrow()
            .clone()
            .ok_or_else(|| SearchError::Aborted("a failure without an invariant".into()))?;
        let detail = violation_of(&run_scripted(&scripted(scenario, &minimal)), &invariant)
            .ok_or_else(|| {
                SearchError::Aborted(format!(
                    "the shrunk schedule did not violate {invariant} again (not deterministic?)"
                ))
            })?;
        let (minimal, detail) = prune(
            scenario,
            minimal,
            &invariant,
            detail,
            self.opts,
            &|events| {
                self.shrink_steps.set(self.shrink_steps.get() + 1);
                progress(&Progress::Shrink {
                    step: self.shrink_steps.get(),
                    events,
                });
            },
        );
        let mut replay = scripted(scenario, &minimal);
        replay.run.expect = Some(invariant.clone());
        replay.description = format!(
            "{} [shrunk by `scenario search`: {} fault event(s) violate {invariant}]",
            scenario.description,
            minimal.schedule.len()
        );
        Ok(SearchOutcome::Found(Box::new(Found {
            scenario: replay,
            invariant,
            detail,
            events_before: self.events_before.get(),
            events_after: minimal.schedule.len(),
            cases_run: self.cases_run.get(),
            shrink_steps: self.shrink_steps.get(),
            from_regression: None,
            wall_seconds: started.elapsed().as_secs_f64(),
        })))
    }
}

/// Searches `scenario` (with its `[run] flaw`) for a failing schedule and shrinks it.
/// Regression files of the same scenario and flaw are replayed first (unless `fresh`); the
/// first that still fails with its expected invariant is the result, and no search runs.
///
/// # Errors
/// The scenario cannot be searched, proptest aborted, or a regression file is unreadable.
pub fn search(
    scenario: &Scenario,
    opts: &SearchOptions,
    progress: &dyn Fn(&Progress),
) -> Result<SearchOutcome, SearchError> {
    let started = Instant::now();
    if let Some(found) = replay_regressions(scenario, opts, progress, started)? {
        return Ok(SearchOutcome::Found(found));
    }
    let strategy = strategy(scenario, opts.events_max, opts.run_seeds)?;
    let config = Config {
        cases: opts.cases.max(1),
        max_shrink_iters: opts.shrink_iters_max,
        failure_persistence: None,
        result_cache: proptest::test_runner::basic_result_cache,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(config, rng_of(opts.seed));
    let judge = Judge::new(scenario, opts, progress);
    let result = runner.run(&strategy, |case: Case| judge.judge(&case));
    match result {
        Ok(()) => Ok(SearchOutcome::Nothing {
            cases_run: judge.cases_run.get(),
            wall_seconds: started.elapsed().as_secs_f64(),
        }),
        Err(TestError::Abort(why)) => Err(SearchError::Aborted(why.to_string())),
        Err(TestError::Fail(_, minimal)) => judge.found(minimal, started),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;

    #[test]
    fn generated_schedules_are_valid_scenarios_and_shrink_by_dropping_events() {
        let scenario = crate::load("chaos").unwrap();
        let strategy = strategy(&scenario, 6, 100).unwrap();
        let mut runner = TestRunner::new_with_rng(Config::default(), rng_of(7));
        let mut saw_events = false;
        for _ in 0..50 {
            let mut tree = strategy.new_tree(&mut runner).unwrap();
            let case = tree.current();
            saw_events |= !case.schedule.is_empty();
            // Every generated case is a scenario the parser accepts, once written out.
            let text = toml::to_string(&scripted(&scenario, &case)).unwrap();
            let again =
                Scenario::parse("case.toml", &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(again, scripted(&scenario, &case));
            // The first simplification of a non-empty schedule drops an event.
            if case.schedule.len() > 1 && tree.simplify() {
                assert_eq!(tree.current().schedule.len(), case.schedule.len() - 1);
            }
        }
        assert!(saw_events);
    }

    #[test]
    fn write_new_never_overwrites_a_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("case.toml");
        assert_eq!(write_new(&path, "one").expect("first"), path);
        let second = write_new(&path, "two").expect("second");
        assert_eq!(second, dir.path().join("sub").join("case-2.toml"));
        assert_eq!(
            write_new(&path, "three").expect("third"),
            dir.path().join("sub").join("case-3.toml")
        );
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "one");
        assert_eq!(std::fs::read_to_string(&second).expect("read"), "two");
        let names: Vec<_> = std::fs::read_dir(dir.path().join("sub"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            names.len(),
            3,
            "no temporary file is left behind: {names:?}"
        );
    }

    #[test]
    fn regression_files_are_named_after_scenario_flaw_and_invariant() {
        assert_eq!(
            regression_name(
                "token_replay",
                Some(Flaw::OnceCheckThenDelete),
                "tokens.single_use"
            ),
            "token_replay-once_check_then_delete-tokens_single_use.toml"
        );
        assert_eq!(
            regression_name("chaos", None, "ids.unique"),
            "chaos-correct-ids_unique.toml"
        );
    }
}
