//! Stateright models built from `sut`'s own state machines.
//!
//! Not built yet (issue "Model checking (`models`)"). This crate will hold thin stateright
//! actors wrapping the segment allocator, the Snowflake worker, the one-time token store and the
//! TCC lottery participants and coordinator, with `always`/`sometimes`/`eventually` properties.
//!
//! It exports no functionality yet.
