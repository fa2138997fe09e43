//! Deterministic simulation of the reference implementation on madsim.
//!
//! One seed decides everything in a run: the fault options (swarm testing), every fault, every
//! message delay and loss, every client choice. A run has a **safety phase** (faults on,
//! workload running) and a **liveness phase** (every fault healed), after which the checkers
//! read the history and the final state. The same seed replays the same run exactly; a hash of
//! the full history checks that.
//!
//! Modules, in the order data flows through them:
//!
//! - [`scenario`]: scenario files (TOML) and the per-seed run spec.
//! - [`clock`]: per-node wall and monotonic clocks on top of madsim's single clock.
//! - [`disk`]: a crash-faithful disk (pending until synced; a crash drops or tears).
//! - [`crashpoints`]: crash points, enumerated: every node's steps that matter found in a run,
//!   then a crash of the node right there.
//! - [`world`]: what outlives node incarnations: clocks, disks, the history, fault coverage.
//! - [`msg`]: the messages.
//! - [`chan`]: the nodes' queues: an unbounded channel that wakes as `futures`' does.
//! - [`wire`]: madsim's UDP path, step for step, at a fraction of its cost.
//! - [`net`]: the counting send path: send rounds, delivery into the nodes' inboxes.
//! - [`nodes`]: thin drivers running `sut`'s state machines: database, ID service, tokens,
//!   TCC coordinator and participants, clients.
//! - [`nemesis`]: the faults.
//! - [`buggify`]: per-seed knobs that push the protocols to their edges (shrunk timers and
//!   budgets, crashes at durable steps, stragglers).
//! - [`history`]: the events.
//! - [`checkers`]: the invariants of docs/architecture.md as observers over the history and
//!   final state.
//! - [`run`]: one seed, a sweep of seeds, the determinism check.
//! - [`bench`]: speed against a bare madsim ping-pong baseline.

pub mod bench;
pub mod buggify;
pub mod chan;
pub mod checkers;
pub mod clock;
pub mod crashpoints;
pub mod disk;
pub mod faults;
pub mod history;
pub mod msg;
pub mod nemesis;
pub mod net;
pub mod nodes;
pub mod run;
pub mod scenario;
pub mod wire;
pub mod world;
