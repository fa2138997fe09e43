//! Stateright models built from `sut`'s own state machines (docs/architecture.md, "The rule";
//! stateright's `examples/2pc.rs` and `examples/paxos.rs` are the pattern).
//!
//! Each actor here is a thin driver: it feeds a delivered message or a fired timer into a `sut`
//! state machine, then turns that machine's outputs (`poll_*`) into stateright sends and timers.
//! No protocol logic lives in this crate; what it adds is the environment (a network that
//! reorders, duplicates and drops, crashes and restarts, clocks as nondeterministic inputs) and
//! *ghost* records of what clients observed, which the properties read.
//!
//! Modules, in the order the catalog lists them:
//!
//! - [`segment`]: segment allocators against one ID store: `ids.unique`, `ids.monotonic`.
//! - [`tokens`]: concurrent consumers of one one-time token: `tokens.single_use`.
//! - [`snowflake`]: one Snowflake worker with a jumping wall clock and restarts.
//! - [`lottery`]: the TCC lottery: coordinator (crash + recover), wallet and inventory with fences
//!   (two catalog entries: `lottery`, two draws of one user; `lottery_faults`, one draw under
//!   faults).
//! - [`runner`]: the shared harness: run a checker, report verdicts, render counterexamples.
//! - [`hashed`]: actor states that hash in O(1) (each state's hash computed once).
//!
//! The command line (`scenario model NAME`, `scenario explore NAME`) calls [`catalog`],
//! [`check`] and [`serve`].

mod edges;
pub mod hashed;
pub mod lottery;
pub mod runner;
pub mod segment;
pub mod snowflake;
pub mod tokens;

pub use runner::{Brief, Cast, ModelReport, PropertyKind, PropertyReport, PropertyVerdict};

use serde::Serialize;
pub use sut::flaw::Flaw;

/// A model the command line can run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ModelInfo {
    /// Its name (`scenario model NAME`).
    pub name: &'static str,
    /// One line on what it checks.
    pub description: &'static str,
    /// Flaws it can switch on (`ModelOptions::flaw`).
    pub flaws: &'static [Flaw],
    /// The edge states (`sut::edge` names) the model owns: each is reported as a `sometimes`
    /// property named `edge: NAME`, found when the search passed through it.
    pub edges: &'static [&'static str],
}

/// How to run a check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelOptions {
    /// Checker threads (at least 1).
    pub threads: usize,
    /// Stop exploring paths at this depth (`None`: exhaust the model's bounded state space).
    pub depth: Option<usize>,
    /// A documented flaw to switch on (see [`ModelInfo::flaws`]).
    pub flaw: Option<String>,
    /// Show the check's progress on stderr, once a second (for a terminal).
    pub progress: bool,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            threads: 2,
            depth: None,
            flaw: None,
            progress: false,
        }
    }
}

/// Why a check could not run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// No model has that name.
    #[error("unknown model `{name}` (known: {known})")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// The model has no such flaw.
    #[error("model `{model}` has no flaw `{flaw}` (known: {known})")]
    UnknownFlaw {
        /// The model.
        model: String,
        /// The flaw asked for.
        flaw: String,
        /// Its flaws, comma-separated.
        known: String,
    },
    /// Options out of range.
    #[error("invalid model options: {0}")]
    InvalidOptions(String),
    /// The Explorer could not listen.
    #[error("cannot serve the explorer on {addr}: {reason}")]
    Serve {
        /// The address.
        addr: String,
        /// Why.
        reason: String,
    },
}

const CATALOG: &[ModelInfo] = &[
    ModelInfo {
        name: segment::NAME,
        description: segment::DESCRIPTION,
        flaws: segment::FLAWS,
        edges: segment::EDGES,
    },
    ModelInfo {
        name: tokens::NAME,
        description: tokens::DESCRIPTION,
        flaws: tokens::FLAWS,
        edges: tokens::EDGES,
    },
    ModelInfo {
        name: snowflake::NAME,
        description: snowflake::DESCRIPTION,
        flaws: snowflake::FLAWS,
        edges: snowflake::EDGES,
    },
    ModelInfo {
        name: lottery::NAME,
        description: lottery::DESCRIPTION,
        flaws: lottery::FLAWS,
        edges: lottery::EDGES,
    },
    ModelInfo {
        name: lottery::NAME_FAULTS,
        description: lottery::DESCRIPTION_FAULTS,
        flaws: lottery::FLAWS_FAULTS,
        edges: lottery::EDGES_FAULTS,
    },
];

/// Every model, in a fixed order.
#[must_use]
pub fn catalog() -> &'static [ModelInfo] {
    CATALOG
}

fn info(name: &str) -> Result<&'static ModelInfo, ModelError> {
    CATALOG
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| ModelError::UnknownModel {
            name: name.to_owned(),
            known: CATALOG
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

fn checked_flaw(info: &ModelInfo, flaw: Option<&str>) -> Result<Option<Flaw>, ModelError> {
    let Some(flaw) = flaw else { return Ok(None) };
    info.flaws
        .iter()
        .copied()
        .find(|f| f.name() == flaw)
        .map(Some)
        .ok_or_else(|| ModelError::UnknownFlaw {
            model: info.name.to_owned(),
            flaw: flaw.to_owned(),
            known: if info.flaws.is_empty() {
                "none".to_owned()
            } else {
                info.flaws
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        })
}

/// Checks the named model and reports every property's verdict, its owned edge states among
/// them.
pub fn check(name: &str, opts: ModelOptions) -> Result<ModelReport, ModelError> {
    let info = info(name)?;
    let mut report = check_properties(info, opts)?;
    runner::add_edge_properties(&mut report, info.edges);
    Ok(report)
}

fn check_properties(info: &ModelInfo, opts: ModelOptions) -> Result<ModelReport, ModelError> {
    let name = info.name;
    let flaw = checked_flaw(info, opts.flaw.as_deref())?;
    match info.name {
        segment::NAME => {
            let opts = ModelOptions {
                depth: opts.depth.or(Some(segment::DEPTH_DEFAULT)),
                ..opts
            };
            runner::run(
                segment::model(&segment::SegmentSetup::with_flaw(flaw))?,
                name,
                &opts,
            )
        }
        tokens::NAME => runner::run(
            tokens::model(&tokens::TokenSetup::with_flaw(flaw))?,
            name,
            &opts,
        ),
        snowflake::NAME => {
            let opts = ModelOptions {
                depth: opts.depth.or(Some(snowflake::DEPTH_DEFAULT)),
                ..opts
            };
            runner::run(
                snowflake::model(&snowflake::SnowflakeSetup::with_flaw(flaw)),
                name,
                &opts,
            )
        }
        lottery::NAME | lottery::NAME_FAULTS => lottery::check(flaw, name, &opts),
        other => unreachable!("catalog entry `{other}` has no model"),
    }
}

/// Serves stateright's Explorer web UI for the named model on `addr` (e.g. `127.0.0.1:3000`).
/// Blocks while serving.
pub fn serve(name: &str, addr: &str) -> Result<(), ModelError> {
    serve_with_flaw(name, addr, None)
}

/// As [`serve`], with a documented flaw switched on (to walk a counterexample by hand).
pub fn serve_with_flaw(name: &str, addr: &str, flaw: Option<&str>) -> Result<(), ModelError> {
    let info = info(name)?;
    let flaw = checked_flaw(info, flaw)?;
    match info.name {
        segment::NAME => runner::serve(
            segment::model(&segment::SegmentSetup::with_flaw(flaw))?,
            addr,
        ),
        tokens::NAME => runner::serve(tokens::model(&tokens::TokenSetup::with_flaw(flaw))?, addr),
        snowflake::NAME => runner::serve(
            snowflake::model(&snowflake::SnowflakeSetup::with_flaw(flaw)),
            addr,
        ),
        lottery::NAME | lottery::NAME_FAULTS => lottery::serve(info.name, flaw, addr),
        other => unreachable!("catalog entry `{other}` has no model"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_and_flaws_are_typed_errors() {
        let err = check("nope", ModelOptions::default()).unwrap_err();
        assert!(matches!(err, ModelError::UnknownModel { .. }), "{err}");
        let err = check(
            tokens::NAME,
            ModelOptions {
                flaw: Some("nope".into()),
                ..ModelOptions::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::UnknownFlaw { .. }), "{err}");
        let err = check(
            tokens::NAME,
            ModelOptions {
                threads: 0,
                ..ModelOptions::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, ModelError::InvalidOptions(_)), "{err}");
    }

    #[test]
    fn catalog_names_are_unique() {
        let mut names: Vec<_> = catalog().iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), catalog().len());
    }
}
