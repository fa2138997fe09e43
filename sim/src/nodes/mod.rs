//! Thin drivers: each node feeds messages and timeouts into `sut`'s state machines and carries
//! out what they ask (sends, store calls, log writes). No protocol logic lives here.

pub mod client;
pub mod db;
pub mod id;
pub mod tcc;
pub mod token;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::rand::Rng;

use crate::buggify::CrashSite;
use crate::crashpoints::{Label, Labeled};
use crate::disk::Wal;
use crate::nemesis::{durable_step, hold_sync};
use crate::world::{Disks, World};

/// Whether the state machines' own invariants are checked after every step: in debug builds,
/// or when the scenario asks (`[run] self_checks`).
pub(crate) fn self_checks(world: &World) -> bool {
    cfg!(debug_assertions) || world.with(|w| w.spec.scenario.run.self_checks)
}

/// Group commit: waits one simulated fsync, then makes everything appended so far durable
/// (unless a concurrent commit already did). A crash during the wait loses the pending records
/// — and the caller never answers, which is what makes that loss safe.
pub async fn commit<R: Clone + Labeled>(
    world: &World,
    wal: impl Fn(&mut Disks) -> &mut Wal<R>,
    pos: u64,
) {
    let label = pending_label(world, &wal);
    durable_step(world, CrashSite::BeforeSync, label).await;
    let fsync_us = madsim::rand::thread_rng().gen_range(300..1_500);
    madsim::time::sleep(Duration::from_micros(fsync_us)).await;
    hold_sync(world).await;
    {
        let mut w = world.lock();
        let log = wal(&mut w.disks);
        if log.durable_len() < pos {
            log.sync();
        }
    }
    durable_step(world, CrashSite::AfterSync, label).await;
}

/// Crash points: the label of the oldest record an fsync of `wal` would make durable now
/// (`None` when the run has no probe, or nothing is pending).
fn pending_label<R: Labeled>(
    world: &World,
    wal: &impl Fn(&mut Disks) -> &mut Wal<R>,
) -> Option<Label> {
    world.with(|w| {
        w.probe.as_ref()?;
        wal(&mut w.disks).first_pending().map(Labeled::label)
    })
}

/// What runs once a request's log record is durable (typically: record the acknowledgement
/// and send the answer).
type Waiter = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct GroupState {
    waiters: Vec<Waiter>,
    syncing: bool,
}

/// The label of what a log's next fsync would make durable (crash points).
type PendingLabel = dyn Fn(&World) -> Option<Label> + Send + Sync;

/// Group commit for one node's log, the way a database does it: the first request that needs
/// durability starts a (simulated) fsync; every request that arrives while it runs joins it;
/// when it completes, everything appended so far is durable and all of them are answered at
/// once. One fsync timer per batch instead of a task and a timer per request, and the same
/// guarantees as [`commit`]: nothing is answered before its record is synced, and a crash
/// during the fsync (the node's tasks are dropped) loses the pending records and every answer.
#[derive(Clone)]
pub struct GroupCommit {
    world: World,
    sync: Arc<dyn Fn(&mut Disks) + Send + Sync>,
    label: Arc<PendingLabel>,
    state: Arc<Mutex<GroupState>>,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// A group commit for the log `wal` finds on the disks.
    pub fn new<R: Clone + Labeled + 'static>(
        world: World,
        wal: impl Fn(&mut Disks) -> &mut Wal<R> + Send + Sync + 'static,
    ) -> Self {
        let wal = Arc::new(wal);
        let sync = {
            let wal = Arc::clone(&wal);
            move |disks: &mut Disks| {
                wal(disks).sync();
            }
        };
        Self {
            world,
            sync: Arc::new(sync),
            label: Arc::new(move |world: &World| pending_label(world, &*wal)),
            state: Arc::default(),
        }
    }

    /// Runs `then` once everything appended to the log so far is durable.
    pub fn then(&self, then: impl FnOnce() + Send + 'static) {
        let start = {
            let mut st = self.state.lock().expect("group commit");
            st.waiters.push(Box::new(then));
            !std::mem::replace(&mut st.syncing, true)
        };
        if start {
            madsim::task::spawn(self.clone().fsync());
        }
    }

    async fn fsync(self) {
        let label = (self.label)(&self.world);
        durable_step(&self.world, CrashSite::BeforeSync, label).await;
        let fsync_us = madsim::rand::thread_rng().gen_range(300..1_500);
        madsim::time::sleep(Duration::from_micros(fsync_us)).await;
        hold_sync(&self.world).await;
        (self.sync)(&mut self.world.lock().disks);
        durable_step(&self.world, CrashSite::AfterSync, label).await;
        let waiters = {
            let mut st = self.state.lock().expect("group commit");
            st.syncing = false;
            std::mem::take(&mut st.waiters)
        };
        for then in waiters {
            then();
        }
    }
}
