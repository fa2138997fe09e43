//! The known-flaws catalog run (`scenario flaws`, and a row group of the gate).
//!
//! Each flaw of [`sut::flaw::Flaw`] is switched on in the simulation scenario that should catch
//! it, and swept seed by seed until the **generic** invariants report a violation; the seeds
//! that took is the figure (median over several disjoint sweeps). Where a model covers the flaw
//! (its catalog entry lists the flaw's name), the model is checked with the flaw on and its
//! counterexample length is reported too. Nothing here looks for a particular flaw: a flaw is
//! caught only when an invariant that every correct run must keep fails.

use std::collections::BTreeSet;

use reports::model::{FlawCatalogReport, FlawResult};
use sim::run::SeedOutcome;
use sim::scenario::Scenario;
use sut::flaw::Flaw;

/// Each flaw with the simulation scenario expected to catch it.
pub const CATALOG: [(Flaw, &str); 17] = [
    (Flaw::SegmentNoVersionCheck, "segment_race"),
    (Flaw::CounterNoPersist, "segment_race"),
    (Flaw::CounterEverysec, "crash_restart"),
    (Flaw::ReclaimNoDriftMargin, "partition"),
    (Flaw::SnowflakeSeqResetFirst, "snowflake_rollback"),
    (Flaw::SnowflakeNoPersistedTs, "snowflake_rollback"),
    (Flaw::MachineIdHashIp, "id_fleet"),
    (Flaw::SemanticSeqWrap, "id_fleet"),
    (Flaw::TccNoFence, "tcc_storm"),
    (Flaw::FenceCheckThenAct, "tcc_storm"),
    (Flaw::StockTwoStep, "tcc_storm"),
    (Flaw::OnceCheckThenDelete, "token_replay"),
    (Flaw::TimeFieldNarrow, "epoch_end"),
    (Flaw::ClientPrice, "tcc_storm"),
    (Flaw::CoordTryBeforeBegin, "tcc_storm"),
    (Flaw::StatusLostAfterCompensation, "tcc_storm"),
    (Flaw::SnowflakeRollbackBoundGap, "clock_skew"),
];

/// How hard to look.
#[derive(Clone, Debug)]
pub struct FlawOptions {
    /// Disjoint sweeps per flaw (the median of their seeds-to-failure is reported).
    pub sweeps: u64,
    /// Seeds per sweep before a flaw counts as not caught.
    pub seeds_max: u64,
    /// Threads running seeds.
    pub jobs: usize,
    /// Also check the models that cover a flaw.
    pub models: bool,
    /// Only these flaws (all when empty).
    pub only: Vec<Flaw>,
}

impl Default for FlawOptions {
    fn default() -> Self {
        Self {
            sweeps: 3,
            seeds_max: 100,
            jobs: 2,
            models: true,
            only: Vec::new(),
        }
    }
}

/// First seed of sweep `k`: far apart, so the sweeps never share a seed.
const SWEEP_STRIDE: u64 = 1_000_000;

/// What one sweep found: seeds run until the first violation, and that violation.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepFinding {
    /// Seeds run, counting the failing one.
    pub seeds_run: u64,
    /// The failing seed, invariant and detail, if any within the limit.
    pub first: Option<(u64, String, String)>,
}

/// Runs seeds `start..start + seeds_max` of `scenario` in batches of `jobs` until one fails.
#[must_use]
pub fn sweep_until_failure(
    scenario: &Scenario,
    start: u64,
    seeds_max: u64,
    jobs: usize,
) -> SweepFinding {
    let jobs = jobs.max(1) as u64;
    let mut next = start;
    let end = start + seeds_max;
    while next < end {
        let batch: Vec<u64> = (next..(next + jobs).min(end)).collect();
        next += batch.len() as u64;
        let sweep = sim::run::sweep(scenario, &batch, jobs as usize, &|_: &SeedOutcome| {});
        // Seeds in order: the lowest failing seed decides, whatever finished first; a seed's own
        // run before its crash points.
        let first = sweep.seeds.iter().find_map(|s| {
            s.violations()
                .next()
                .map(|v| (s.seed, v.invariant.clone(), v.detail.clone()))
                .or_else(|| {
                    s.crash_violations().next().map(|(t, v)| {
                        let detail = format!("at crash point {}: {}", t.plan.spec(), v.detail);
                        (s.seed, v.invariant.clone(), detail)
                    })
                })
        });
        if let Some((seed, invariant, detail)) = first {
            return SweepFinding {
                seeds_run: seed - start + 1,
                first: Some((seed, invariant, detail)),
            };
        }
    }
    SweepFinding {
        seeds_run: seeds_max,
        first: None,
    }
}

fn median(values: &mut [u64]) -> Option<f64> {
    values.sort_unstable();
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2] as f64),
        n => Some((values[n / 2 - 1] + values[n / 2]) as f64 / 2.0),
    }
}

/// Runs the catalog. `progress` gets each finished row.
///
/// # Errors
/// A named scenario that does not load (a broken build, not a flaw).
pub fn run_catalog(
    opts: &FlawOptions,
    progress: &dyn Fn(&FlawResult),
) -> Result<FlawCatalogReport, String> {
    let mut rows = Vec::new();
    let wanted: BTreeSet<Flaw> = opts.only.iter().copied().collect();
    for (flaw, scenario_name) in CATALOG {
        if !wanted.is_empty() && !wanted.contains(&flaw) {
            continue;
        }
        let mut scenario = crate::load(scenario_name).map_err(|e| e.to_string())?;
        scenario.run.flaw = Some(flaw);
        let mut found = Vec::new();
        let mut first = None;
        let mut sweeps = Vec::new();
        for k in 0..opts.sweeps.max(1) {
            let finding =
                sweep_until_failure(&scenario, k * SWEEP_STRIDE, opts.seeds_max, opts.jobs);
            sweeps.push(finding.first.as_ref().map(|_| finding.seeds_run));
            if finding.first.is_some() {
                found.push(finding.seeds_run);
            }
            if first.is_none() {
                first = finding.first;
            }
        }
        // Caught only if every sweep caught it: a flaw found by luck once is not covered.
        let caught = found.len() == sweeps.len();
        let mut row = FlawResult {
            flaw: flaw.name().to_owned(),
            caught_by: None,
            source: Some(flaw.source().to_owned()),
            scenario: Some(scenario_name.to_owned()),
            seeds_to_failure: median(&mut found),
            sweeps,
            ..FlawResult::default()
        };
        if let Some((seed, invariant, detail)) = first {
            row.seed = Some(seed);
            row.detail = Some(detail);
            if caught {
                row.caught_by = Some(format!("sim:{invariant}"));
            }
        }
        if opts.models {
            check_model(flaw, &mut row);
        }
        progress(&row);
        rows.push(row);
    }
    Ok(FlawCatalogReport {
        catalog: "known-flaws".to_owned(),
        flaws: rows,
    })
}

/// The model covering `flaw`, if any: its counterexample length and first violated property.
fn check_model(flaw: Flaw, row: &mut FlawResult) {
    let Some(info) = models::catalog().iter().find(|m| m.flaws.contains(&flaw)) else {
        return;
    };
    row.model = Some(info.name.to_owned());
    let options = models::ModelOptions {
        threads: 1,
        depth: None,
        flaw: Some(flaw.name().to_owned()),
        progress: false,
    };
    let report = match models::check(info.name, options) {
        Ok(report) => report,
        Err(err) => {
            note(row, format!("model {}: could not run: {err}", info.name));
            return;
        }
    };
    let counterexample = report.properties.iter().find(|p| {
        matches!(p.verdict, models::PropertyVerdict::Violated) && p.counterexample.is_some()
    });
    if let Some(p) = counterexample {
        let steps = p.counterexample.clone().unwrap_or_default();
        row.model_depth = Some(steps.len());
        row.counterexample = steps;
        if row.caught_by.is_none() {
            row.caught_by = Some(format!("model:{}", p.name));
        }
    } else {
        note(row, format!("model {}: no counterexample", info.name));
    }
}

fn note(row: &mut FlawResult, text: String) {
    row.detail = Some(match row.detail.take() {
        Some(detail) => format!("{detail}; {text}"),
        None => text,
    });
}

/// The flaws whose covering model was checked but gave no counterexample (it could not run, or
/// every property held): `scenario flaws` fails on them, as on a flaw not caught.
#[must_use]
pub fn models_without_counterexample(catalog: &FlawCatalogReport) -> Vec<&FlawResult> {
    catalog
        .flaws
        .iter()
        .filter(|r| r.model.is_some() && r.counterexample.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flaw_has_a_catching_scenario_that_exists() {
        let listed: BTreeSet<Flaw> = CATALOG.iter().map(|(f, _)| *f).collect();
        assert_eq!(listed, Flaw::ALL.into_iter().collect());
        for (_, scenario) in CATALOG {
            assert!(crate::load(scenario).is_ok(), "{scenario}");
        }
    }

    #[test]
    fn a_covering_model_without_a_counterexample_is_reported() {
        let mut covered = FlawResult {
            flaw: "tcc_no_fence".into(),
            caught_by: Some("sim:lottery.no_hanging".into()),
            seed: Some(3),
            detail: None,
            source: None,
            scenario: Some("tcc_storm".into()),
            seeds_to_failure: Some(1.0),
            sweeps: vec![Some(1)],
            model: Some("lottery_faults".into()),
            model_depth: Some(9),
            counterexample: vec!["coordinator -> wallet: Try".into()],
        };
        let catalog = |rows: Vec<FlawResult>| FlawCatalogReport {
            catalog: "known-flaws".into(),
            flaws: rows,
        };
        let uncovered = FlawResult {
            model: None,
            model_depth: None,
            counterexample: Vec::new(),
            ..covered.clone()
        };
        assert!(
            models_without_counterexample(&catalog(vec![covered.clone(), uncovered])).is_empty()
        );
        covered.counterexample.clear();
        note(
            &mut covered,
            "model lottery_faults: no counterexample".into(),
        );
        let report = catalog(vec![covered]);
        let silent = models_without_counterexample(&report);
        assert_eq!(silent.len(), 1);
        assert_eq!(
            silent[0].detail.as_deref(),
            Some("model lottery_faults: no counterexample")
        );
    }

    #[test]
    fn median_of_sweeps() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [5, 1, 9]), Some(5.0));
        assert_eq!(median(&mut [4, 1]), Some(2.5));
    }

    #[test]
    fn a_flaw_is_found_and_the_correct_code_is_not_flagged() {
        let mut scenario = crate::load("token_replay").unwrap();
        scenario.run.safety_ms = 1_500;
        scenario.run.liveness_ms = 1_000;
        let clean = sweep_until_failure(&scenario, 0, 2, 2);
        assert_eq!(clean.first, None, "the correct implementation holds");
        scenario.run.flaw = Some(Flaw::OnceCheckThenDelete);
        let flawed = sweep_until_failure(&scenario, 0, 6, 2);
        let (_, invariant, _) = flawed.first.expect("the flaw is caught");
        assert_eq!(invariant, "tokens.single_use");
    }
}
