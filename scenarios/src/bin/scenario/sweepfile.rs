//! The JSON a simulated sweep writes (`scenario NAME --json FILE`) and `scenario merge` reads
//! back: the figures a reader looks at, and what a merge needs to rebuild one sweep from many
//! shards (the build, the resolved scenario and its hash, the seed range and shard, each seed's
//! outcome with its counters and edge states).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sim::run::{SeedOutcome, Sweep};
use sim::scenario::Scenario;

/// The version of [`SweepFile`]; a merge refuses a file of another one.
pub(crate) const FORMAT: u32 = 2;

/// The most seeds a sweep file's range (or a merge's) may span.
pub(crate) const SEEDS_MAX: u64 = 100_000_000;

/// Where a sweep's fault and edge coverage is judged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CoverageMode {
    /// On this sweep: a fault kind that never took effect or an owned edge state never reached
    /// fails it.
    #[default]
    Sweep,
    /// On the union of the shards, by `scenario merge`: this shard records its coverage, and its
    /// exit code reflects violations (and nondeterminism) only.
    Union,
}

/// The build a sweep ran on: shards of different builds cannot be merged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Build {
    /// The commit it was built from (`-dirty-HASH` with uncommitted changes; `unknown` outside
    /// a git checkout).
    pub(crate) commit: String,
    /// The bench's version.
    pub(crate) version: String,
    /// The cargo profile (`release`, `sweep+pgo`, …; [`crate::output::build_profile`]).
    pub(crate) profile: String,
}

impl Build {
    /// This binary's build.
    pub(crate) fn this() -> Self {
        Self {
            commit: env!("SCENARIO_BUILD_COMMIT").to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            profile: crate::output::build_profile().to_owned(),
        }
    }
}

impl std::fmt::Display for Build {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {} build)",
            self.commit, self.version, self.profile
        )
    }
}

/// The seeds a sweep was asked for: `count` seeds from `first_seed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SeedRange {
    pub(crate) first_seed: u64,
    pub(crate) count: u64,
}

impl SeedRange {
    /// One past the last seed.
    pub(crate) fn end(self) -> u64 {
        self.first_seed.saturating_add(self.count)
    }
}

/// Shard `number` of `count`, counted from 1 (`--shard 1/4` … `4/4`): the seeds `s` of the range
/// with `s % count == number - 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Shard {
    pub(crate) number: u64,
    pub(crate) count: u64,
}

/// The seeds of `range` that `shard` runs, in order.
pub(crate) fn shard_seeds(range: SeedRange, shard: Option<Shard>) -> Vec<u64> {
    (range.first_seed..range.end())
        .filter(|s| shard.is_none_or(|sh| s % sh.count == sh.number - 1))
        .collect()
}

/// A violation, with the command that replays its seed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JsonViolation {
    pub(crate) seed: u64,
    pub(crate) invariant: String,
    pub(crate) detail: String,
    pub(crate) event: Option<u64>,
    pub(crate) replay: String,
    /// The crash point whose run broke the invariant (`NODE:SITE:LABEL#N`), when a crash
    /// point's run did rather than the seed's own; `event` is then that run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) crash_point: Option<String>,
}

/// Crash points over the sweep (`--crash-points`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct JsonCrashPoints {
    /// Points tried per seed at most.
    pub(crate) budget: u32,
    /// Runs with a crash.
    pub(crate) runs: u64,
    /// Distinct points (node role, site, step) found, tried and failed.
    pub(crate) found: Vec<String>,
    pub(crate) tried: Vec<String>,
    pub(crate) failed: Vec<String>,
    /// Planned crashes their run never reached (`NODE:SITE:LABEL#N` of seed).
    pub(crate) unreached: Vec<(u64, String)>,
}

/// A seed whose two runs gave different histories (`--check-determinism`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Nondeterministic {
    pub(crate) seed: u64,
    pub(crate) first_hash: u64,
    pub(crate) second_hash: u64,
}

/// A sweep as its JSON file holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct SweepFile {
    /// [`FORMAT`].
    pub(crate) format: u32,
    /// The scenario's name.
    pub(crate) scenario: String,
    /// The build that ran it.
    pub(crate) build: Build,
    /// A hash of `scenario_toml` ([`scenario_hash`]).
    pub(crate) scenario_hash: String,
    /// The scenario as it ran: its file with the run's flags applied (`--flaw`, `--duration`,
    /// `--no-buggify`), as TOML.
    pub(crate) scenario_toml: String,
    /// The name or file given on the command line (what the replay lines run).
    pub(crate) scenario_given: Option<String>,
    /// `--duration`, if given.
    pub(crate) duration_s: Option<f64>,
    /// The seeds asked for.
    pub(crate) range: SeedRange,
    /// `--shard I/N`, if given.
    pub(crate) shard: Option<Shard>,
    /// Where coverage is judged.
    pub(crate) coverage: CoverageMode,
    /// The seeds run.
    pub(crate) seeds_run: usize,
    pub(crate) seeds: Vec<u64>,
    /// Seeds of the range that no shard ran (a merge with `--allow-missing`); empty for a sweep.
    #[serde(default)]
    pub(crate) seeds_missing: Vec<u64>,
    pub(crate) violations: Vec<JsonViolation>,
    pub(crate) sim_seconds: f64,
    pub(crate) wall_seconds: f64,
    pub(crate) events: u64,
    pub(crate) fault_effects: BTreeMap<String, u64>,
    pub(crate) vacuous_faults: Vec<String>,
    /// Whether this sweep judged fault coverage (large enough, and not `--coverage union`).
    pub(crate) coverage_judged: bool,
    pub(crate) edges: BTreeMap<String, u64>,
    pub(crate) edge_seeds: BTreeMap<String, u64>,
    pub(crate) edges_owned_unreached: Vec<String>,
    pub(crate) edges_never_reached: Vec<String>,
    pub(crate) nondeterministic_seeds: Vec<u64>,
    pub(crate) nondeterministic: Vec<Nondeterministic>,
    pub(crate) ids_lost: u64,
    /// Crash points, when the sweep tried them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) crash_points: Option<JsonCrashPoints>,
    pub(crate) meta: BTreeMap<String, String>,
    /// Every seed's outcome, in seed order. The timeline (`faults`, `clock_samples`, `ops`) is
    /// kept for the first seed and the failing ones only: the seeds a report can show.
    pub(crate) outcomes: Vec<SeedOutcome>,
}

/// How a sweep was asked for: what its file records beside the outcomes.
#[derive(Clone, Debug)]
pub(crate) struct RunInfo {
    pub(crate) given: Option<String>,
    pub(crate) duration_s: Option<f64>,
    pub(crate) range: SeedRange,
    pub(crate) shard: Option<Shard>,
    pub(crate) coverage: CoverageMode,
    pub(crate) seeds_missing: Vec<u64>,
    pub(crate) meta: BTreeMap<String, String>,
}

/// `scenario` as TOML: the resolved definition a sweep records and hashes.
pub(crate) fn scenario_toml(scenario: &Scenario) -> Result<String, String> {
    toml::to_string(scenario)
        .map_err(|e| format!("cannot write scenario {} as TOML: {e}", scenario.name))
}

/// FNV-1a, 64 bits, as 16 hex digits: a hash stable across builds and machines.
pub(crate) fn scenario_hash(toml: &str) -> String {
    let hash = toml.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

/// `outcome` as a file keeps it: no history, and its timeline only if `keep_timeline`.
fn stored(outcome: &SeedOutcome, keep_timeline: bool) -> SeedOutcome {
    let mut outcome = outcome.clone();
    outcome.history = None;
    if !keep_timeline {
        outcome.faults.clear();
        outcome.clock_samples.clear();
        outcome.ops.clear();
    }
    outcome
}

impl SweepFile {
    /// The file of `sweep`, a sweep of `scenario` asked for as `run` says.
    pub(crate) fn new(
        scenario: &Scenario,
        sweep: &Sweep,
        run: RunInfo,
        nondeterministic: &[Nondeterministic],
        replay: &dyn Fn(u64) -> String,
    ) -> Result<Self, String> {
        let toml = scenario_toml(scenario)?;
        let first = sweep.seeds.first().map(|s| s.seed);
        Ok(Self {
            format: FORMAT,
            scenario: scenario.name.clone(),
            build: Build::this(),
            scenario_hash: scenario_hash(&toml),
            scenario_toml: toml,
            scenario_given: run.given,
            duration_s: run.duration_s,
            range: run.range,
            shard: run.shard,
            coverage: run.coverage,
            seeds_run: sweep.seeds.len(),
            seeds: sweep.seeds.iter().map(|s| s.seed).collect(),
            seeds_missing: run.seeds_missing,
            violations: sweep
                .violations()
                .map(|(seed, v)| JsonViolation {
                    seed,
                    invariant: v.invariant.clone(),
                    detail: v.detail.clone(),
                    event: v.event,
                    replay: replay(seed),
                    crash_point: None,
                })
                .chain(
                    sweep
                        .crash_violations()
                        .map(|(seed, tried, v)| JsonViolation {
                            seed,
                            invariant: v.invariant.clone(),
                            detail: v.detail.clone(),
                            event: v.event,
                            replay: scenarios::report::crash_replay(&replay(seed), &tried.plan),
                            crash_point: Some(tried.plan.spec()),
                        }),
                )
                .collect(),
            sim_seconds: sweep.seeds.iter().map(|s| s.sim_ms as f64 / 1_000.0).sum(),
            wall_seconds: sweep.wall_seconds,
            events: sweep.seeds.iter().map(|s| s.events).sum(),
            fault_effects: sweep.coverage.clone(),
            vacuous_faults: sweep
                .vacuous_faults
                .iter()
                .map(|k| k.name().to_owned())
                .collect(),
            coverage_judged: sweep.coverage_judged() && run.coverage == CoverageMode::Sweep,
            edges: sweep.edges.clone(),
            edge_seeds: sweep.edge_seeds.clone(),
            edges_owned_unreached: sweep.unreached_edges.clone(),
            edges_never_reached: sut::edge_registry::all()
                .filter(|e| !sweep.edges.contains_key(e.name))
                .map(|e| e.name.to_owned())
                .collect(),
            nondeterministic_seeds: nondeterministic.iter().map(|n| n.seed).collect(),
            nondeterministic: nondeterministic.to_vec(),
            ids_lost: sweep.seeds.iter().map(|s| s.ids_lost).sum(),
            crash_points: sweep.crash_points().map(|c| JsonCrashPoints {
                budget: scenario.run.crash_points,
                runs: c.runs,
                found: c.found.iter().map(ToString::to_string).collect(),
                tried: c.tried.iter().map(ToString::to_string).collect(),
                failed: c.failed.iter().map(ToString::to_string).collect(),
                unreached: c
                    .unreached
                    .iter()
                    .map(|(seed, plan)| (*seed, plan.spec()))
                    .collect(),
            }),
            meta: run.meta,
            outcomes: sweep
                .seeds
                .iter()
                .map(|s| {
                    let failing =
                        s.violations().next().is_some() || s.crash_violations().next().is_some();
                    stored(s, Some(s.seed) == first || failing)
                })
                .collect(),
        })
    }

    /// Writes the file, whole or not at all: indented, but each seed's outcome on one line
    /// (about 4 KB a seed of `chaos`: a sweep of 100,000 seeds writes about 400 MB in all).
    pub(crate) fn write(mut self, path: &Path) -> std::io::Result<()> {
        let outcomes = std::mem::take(&mut self.outcomes);
        let head = serde_json::to_string_pretty(&self).map_err(std::io::Error::other)?;
        let empty = "\"outcomes\": []\n}";
        let Some(open) = head.strip_suffix(empty) else {
            return Err(std::io::Error::other(
                "`outcomes` is not the file's last field",
            ));
        };
        let mut text = String::with_capacity(head.len() + outcomes.len() * 4096);
        text.push_str(open);
        text.push_str("\"outcomes\": [");
        for (i, outcome) in outcomes.iter().enumerate() {
            text.push_str(if i == 0 { "\n    " } else { ",\n    " });
            text.push_str(&serde_json::to_string(outcome).map_err(std::io::Error::other)?);
        }
        text.push_str(if outcomes.is_empty() {
            "]\n}\n"
        } else {
            "\n  ]\n}\n"
        });
        crate::simulate::write_atomic(path, &text)
    }

    /// Reads a sweep's file and checks that it is whole: its scenario parses and matches its
    /// hash, its seeds are its outcomes' and those of its range and shard. The error names the
    /// file and what is wrong.
    pub(crate) fn read(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
        // The format first, so that another file (an older sweep's, a report's summary.json)
        // is named as such rather than by the first field it lacks.
        #[derive(Deserialize)]
        struct Probe {
            format: Option<u64>,
        }
        let not_a_sweep = |why: String| {
            format!(
                "{shown} is not the JSON of a simulated sweep of this bench ({why}; shards are \
                 written by `scenario NAME --json FILE`, by a build with `scenario merge`)"
            )
        };
        let probe: Probe = serde_json::from_str(&text).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => not_a_sweep(e.to_string()),
            _ => format!("{shown} is not JSON: {e}"),
        })?;
        match probe.format {
            None => return Err(not_a_sweep("it has no `format`".to_owned())),
            Some(f) if f != u64::from(FORMAT) => {
                return Err(format!(
                    "{shown} is a sweep file of format {f}; this build reads format {FORMAT}"
                ));
            }
            Some(_) => {}
        }
        let file: Self = serde_json::from_str(&text).map_err(|e| format!("{shown}: {e}"))?;
        file.check().map_err(|e| format!("{shown}: {e}"))?;
        Ok(file)
    }

    /// The scenario the file records, parsed (and so checked) as a scenario file is.
    pub(crate) fn scenario(&self) -> Result<Scenario, String> {
        Scenario::parse("scenario_toml", &self.scenario_toml).map_err(|e| e.to_string())
    }

    /// What [`Self::read`] checks once the file has parsed.
    fn check(&self) -> Result<(), String> {
        if scenario_hash(&self.scenario_toml) != self.scenario_hash {
            return Err(format!(
                "scenario_hash {} is not the hash of its scenario_toml ({}): the file was edited",
                self.scenario_hash,
                scenario_hash(&self.scenario_toml)
            ));
        }
        let scenario = self.scenario()?;
        if scenario.name != self.scenario {
            return Err(format!(
                "scenario `{}` but its scenario_toml is `{}`",
                self.scenario, scenario.name
            ));
        }
        if let Some(shard) = self.shard
            && !(1..=shard.count).contains(&shard.number)
        {
            return Err(format!(
                "shard {}/{}: need 1 <= I <= N",
                shard.number, shard.count
            ));
        }
        if self.range.count > SEEDS_MAX {
            return Err(format!(
                "a range of {} seeds, more than the {SEEDS_MAX} a sweep file may hold",
                self.range.count
            ));
        }
        let ran: Vec<u64> = self.outcomes.iter().map(|o| o.seed).collect();
        if ran != self.seeds || self.seeds.len() != self.seeds_run {
            return Err(
                "its `seeds`, `seeds_run` and `outcomes` disagree: the file was edited or cut"
                    .to_owned(),
            );
        }
        let asked: BTreeSet<u64> = shard_seeds(self.range, self.shard).into_iter().collect();
        let accounted: BTreeSet<u64> = self
            .seeds
            .iter()
            .chain(&self.seeds_missing)
            .copied()
            .collect();
        if accounted != asked || accounted.len() != self.seeds.len() + self.seeds_missing.len() {
            return Err(format!(
                "its seeds are not those of its range {}..{}{}: the file was edited or cut",
                self.range.first_seed,
                self.range.end(),
                self.shard
                    .map(|s| format!(" shard {}/{}", s.number, s.count))
                    .unwrap_or_default()
            ));
        }
        Ok(())
    }
}

/// `seeds` (sorted) said compactly: runs of evenly spaced seeds as `A..=B` or
/// `A..=B step D`, at most `groups_max` groups, then how many more.
pub(crate) fn describe_seeds(seeds: &[u64], groups_max: usize) -> String {
    let mut groups: Vec<String> = Vec::new();
    let mut i = 0;
    while i < seeds.len() {
        let start = seeds[i];
        let mut end = i;
        if let Some(next) = seeds.get(i + 1) {
            let step = next - start;
            end = i + 1;
            while seeds.get(end + 1).is_some_and(|s| s - seeds[end] == step) {
                end += 1;
            }
            // Two seeds alone are clearer listed than as a progression.
            if end == i + 1 && step != 1 {
                end = i;
            }
        }
        groups.push(match (end - i, seeds[end] - start) {
            (0, _) => start.to_string(),
            (n, span) if span == n as u64 => format!("{start}..={}", seeds[end]),
            (n, span) => format!("{start}..={} step {}", seeds[end], span / n as u64),
        });
        i = end + 1;
    }
    let total = groups.len();
    if total > groups_max {
        groups.truncate(groups_max);
        groups.push(format!("… ({} more groups)", total - groups_max));
    }
    groups.join(", ")
}

#[cfg(test)]
mod tests {
    use super::describe_seeds;

    #[test]
    fn seeds_are_described_as_runs_and_progressions() {
        assert_eq!(describe_seeds(&[], 10), "");
        assert_eq!(describe_seeds(&[7], 10), "7");
        assert_eq!(describe_seeds(&[3, 4, 5, 6, 9], 10), "3..=6, 9");
        assert_eq!(describe_seeds(&[1, 5, 9, 13], 10), "1..=13 step 4");
        assert_eq!(describe_seeds(&[2, 9, 40], 10), "2, 9, 40");
        assert_eq!(
            describe_seeds(&[0, 1, 10, 20, 21], 1),
            "0..=1, … (2 more groups)"
        );
    }
}
