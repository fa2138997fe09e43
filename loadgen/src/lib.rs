//! goose load generation against the real `sut-server`.
//!
//! Not built yet (issue "Load generation (`loadgen`) with goose"). This crate will hold the
//! workloads (segment, Snowflake, tokens, one-time tokens, lottery, mixed), the constant-rate
//! open-model scheduler with coordinated-omission correction, per-endpoint microsecond
//! HdrHistograms, `/proc` sampling of the server, post-run verification, and the kill -9 scenario.
//!
//! It exports no functionality yet.
