//! Test your own service, black box (docs/own-service.md): nothing here needs this project's
//! routes or code in the service under test, only its HTTP contract (or its wire protocol, for
//! Redis and PostgreSQL).
//!
//! - [`ids`]: `scenario ids`, an ID service of any API (by template, Leaf, Tinyid, Redis `INCR`,
//!   a PostgreSQL sequence) at one or more URLs, under the nemesis, judged by `sut::check`;
//! - [`tcc`]: `scenario tcc`, a TCC participant against a hostile coordinator;
//! - [`tokens`]: `scenario tokens`, a one-time-token service against hostile clients;
//! - [`db`]: the user's own database under faults (`--db-cmd`), for any of them;
//! - [`slow`]: the slow-clients check any of them can run (`--slow-clients N`);
//! - [`real`]: real systems nobody here wrote as ID sources under faults (`scenarios/real/`);
//! - [`history`]: the Jepsen-shaped operation histories every tester records;
//! - [`overlap`]: how many requests a run ever had in flight at once, from its history, and
//!   whether its pass is inconclusive for races;
//! - [`ramp`]: `scenario ids`'s concurrency ramp, when no client count is given.

pub mod bodies;
pub mod db;
pub mod held;
pub mod history;
pub mod ids;
pub mod overlap;
pub mod probe;
pub mod ramp;
pub mod real;
pub mod slow;
pub mod tcc;
pub mod tokens;
