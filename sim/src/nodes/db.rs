//! The database node: the ID store ([`MemoryIdStore`]) behind a write-ahead log on the
//! simulated disk. A mutating call is applied, logged, made durable (group commit), and only
//! then answered. Recovery replays the durable log. The store's lease clock is this node's
//! monotonic clock.

use std::sync::{Arc, Mutex};

use madsim::task::spawn;
use sut::flaw::Flaw;
use sut::id_store::{IdStore, MemoryIdStore, StoreCall};
use sut::journal::Record;

use super::{GroupCommit, commit};
use crate::clock::sleep_ms;
use crate::net::{Ctx, Inbox, Msg};
use crate::world::DbRec;

fn mutates(call: &StoreCall) -> bool {
    !matches!(call, StoreCall::Read { .. })
}

/// The store as the durable log leaves it (torn records discarded and counted).
fn recover(ctx: &Ctx) -> MemoryIdStore {
    let (records, torn) = ctx.world.with(|w| w.disks.db.recover());
    ctx.world.count("crash.torn_records_discarded", torn);
    sut::journal::replay(MemoryIdStore::new(), &records)
}

impl Record for DbRec {
    type State = MemoryIdStore;

    fn replay_onto(&self, store: &mut MemoryIdStore) {
        // A refused record changes nothing, now as when it was first applied.
        match self {
            Self::CreateTag(tag, spec) => {
                let _ = store.create_tag(tag, spec);
            }
            Self::Call(call) => {
                let _ = call.execute(store);
            }
            Self::Reclaim(now_ms) => {
                let _ = store.reclaim_expired(*now_ms);
            }
        }
    }
}

/// The reclaim sweeper: zombie segments' unclaimed tails go back to the pool.
async fn sweep_forever(ctx: Ctx, store: Arc<Mutex<MemoryIdStore>>) {
    loop {
        sleep_ms(250).await;
        let now_ms = ctx.now().mono_ms;
        let pos = {
            let mut s = store.lock().expect("db store");
            // A refused sweep changes nothing (all or nothing, as SQLite's transaction);
            // only a flaw that gave a range out twice leads to one. It is counted, and
            // the checkers judge the duplicates it stems from.
            let swept = s.reclaim_expired(now_ms);
            ctx.world.take_edges(&mut *s);
            let reclaimed = match swept {
                Ok(reclaimed) => reclaimed,
                Err(_) => {
                    ctx.world.count("segment.reclaims_refused", 1);
                    continue;
                }
            };
            if reclaimed.is_empty() {
                continue;
            }
            let ids: u64 = reclaimed.iter().map(|r| r.tail.len()).sum();
            ctx.world
                .count("segment.reclaimed_leases", reclaimed.len() as u64);
            ctx.world.count("segment.reclaimed_ids", ids);
            ctx.world
                .with(|w| w.disks.db.append(DbRec::Reclaim(now_ms)))
        };
        commit(&ctx.world, |d| &mut d.db, pos).await;
    }
}

/// FLAW `counter_everysec`: syncs the log once a second.
async fn sync_every_second(ctx: Ctx) {
    loop {
        sleep_ms(1_000).await;
        let lost = ctx.world.with(|w| {
            let unsynced = w.disks.db.pending_len() as u64;
            w.disks.db.sync();
            unsynced
        });
        ctx.world.count("db.everysec_synced_records", lost);
    }
}

/// Runs the database node.
pub async fn run(ctx: Ctx, mut inbox: Inbox) {
    let store = Arc::new(Mutex::new(recover(&ctx)));
    spawn(sweep_forever(ctx.clone(), Arc::clone(&store)));

    // FLAW `counter_everysec`: acknowledge at once and sync the log once a second (Redis
    // `appendfsync everysec`); a crash loses up to a second of acknowledged grants.
    let everysec = ctx.world.with(|w| w.spec.scenario.run.flaw) == Some(Flaw::CounterEverysec);
    if everysec {
        spawn(sync_every_second(ctx.clone()));
    }

    // Each call is handled as it arrives (the store is one lock, as in a real database);
    // mutations are answered through the group commit.
    let group = GroupCommit::new(ctx.world.clone(), |d| &mut d.db);
    // The store's own invariants after every call, with self-checks on, in correct runs (a flaw
    // may break the store's promises on purpose: the checkers judge those runs).
    let check_store =
        super::self_checks(&ctx.world) && ctx.world.with(|w| w.spec.scenario.run.flaw).is_none();
    while let Some((msg, from)) = inbox.recv().await {
        let Msg::Store { req, mut call } = msg else {
            continue;
        };
        call.set_store_now(ctx.now().mono_ms);
        let (reply, logged) = {
            let mut s = store.lock().expect("db store");
            let reply = call.execute(&mut *s);
            ctx.world.take_edges(&mut *s);
            if check_store && let Err(violation) = s.check_invariants() {
                panic!("id store invariant after {call:?}: {violation}");
            }
            let logged = mutates(&call);
            if logged {
                ctx.world
                    .with(|w| w.disks.db.append(DbRec::Call(call.clone())));
            }
            (reply, logged)
        };
        let answer = Msg::StoreReply { req, reply };
        if logged && !everysec {
            let ctx = ctx.clone();
            group.then(move || ctx.send(&from, answer));
        } else {
            ctx.send(&from, answer);
        }
    }
}
