//! Store-generic test drivers, shared with `sut-server`: `sut`'s own tests run them over the
//! memory stores, `sut-server`'s tests over its SQLite stores, so that neither copy can drift.
//!
//! Compiled for `sut`'s tests and with the `testkit` feature (off by default; `sut-server`
//! turns it on for its tests only). Pure like the rest of `sut`: no I/O, no clock, no
//! randomness beyond a seed.

pub mod lottery;
pub mod token;
