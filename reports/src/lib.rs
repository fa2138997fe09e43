//! Reports: one serde result model for every result of the bench (simulations, model checks,
//! load runs, the known-flaws catalog), rendered as self-contained HTML with inline SVG charts,
//! written as JSON and JUnit XML, and compared against a committed baseline by the regression
//! gate.
//!
//! Data flows through the modules in this order:
//! - [`model`]: the plain-data result types ([`model::Summary`] holds any mix of results);
//! - [`charts`]: inline SVG charts (plotters' SVG backend, no fonts, no scripts);
//! - [`html`]: one self-contained HTML page per [`model::Summary`];
//! - [`write`]: atomic `index.html` + `summary.json`, and JUnit XML;
//! - [`gate`]: baseline file, comparison, plain-text table, baseline update.

pub mod atomic;
pub mod charts;
pub mod gate;
pub mod html;
pub mod model;
pub mod write;

pub use gate::{Baseline, GateOutcome, GateRow, GateStatus};
pub use model::{RunResult, SCHEMA_VERSION, Summary};
pub use write::{write_junit, write_report};
