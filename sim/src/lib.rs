//! Deterministic simulation of the reference implementation on madsim.
//!
//! Not built yet (issue "Deterministic simulation (`sim`) on madsim"). This crate will hold, in
//! the order data flows through them: the simulated cluster (ID-service, database, token,
//! coordinator, participant and client nodes driving `sut`'s state machines), per-node clocks
//! (offset + drift + jumps on top of madsim's single clock), a crash-faithful simulated disk
//! (pending until synced), the nemesis (partitions, swizzle, loss, kill/restart, pause, clock
//! faults), the workload and its history, and the invariant checkers over that history.
//!
//! Nothing here pretends to simulate anything yet: it exports no functionality.
