//! Tests of the lottery as a whole: coordinator behaviour and a deterministic lossy-network
//! driver with restarts, the invariant checkers, and the documented flaws. (Fence anomalies on
//! both stores, the memory-vs-SQLite conformance property and the driver over SQLite stores run
//! in `sut-server`, beside the SQLite store.)

mod checkers;
mod coordinator;
mod driver;
mod edges;
mod flaws;

pub(super) use crate::testkit::lottery::{draw, send};
