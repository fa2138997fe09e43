//! Thin drivers: each node feeds messages and timeouts into `sut`'s state machines and carries
//! out what they ask (sends, store calls, log writes). No protocol logic lives here.

pub mod client;
pub mod db;
pub mod id;
pub mod tcc;
pub mod token;

use std::time::Duration;

use madsim::rand::Rng;

use crate::disk::Wal;
use crate::net::{Ctx, Inbox};
use crate::world::{Disks, World};

/// Group commit: waits one simulated fsync, then makes everything appended so far durable
/// (unless a concurrent commit already did). A crash during the wait loses the pending records
/// — and the caller never answers, which is what makes that loss safe.
pub async fn commit<R: Clone>(world: &World, wal: impl Fn(&mut Disks) -> &mut Wal<R>, pos: u64) {
    let fsync_us = madsim::rand::thread_rng().gen_range(300..1_500);
    madsim::time::sleep(Duration::from_micros(fsync_us)).await;
    let mut w = world.lock();
    let log = wal(&mut w.disks);
    if log.durable_len() < pos {
        log.sync();
    }
}

/// Sleeps `ms` simulated milliseconds.
pub async fn sleep_ms(ms: u64) {
    madsim::time::sleep(Duration::from_millis(ms)).await;
}

/// The role of a node, from its name.
pub async fn main(ctx: Ctx, inbox: Inbox) {
    let incarnation = ctx.world.with(|w| {
        let n = w.incarnations.entry(ctx.name.clone()).or_insert(0);
        *n += 1;
        *n
    });
    ctx.record(|_| crate::history::EventKind::Boot { incarnation });
    let name = ctx.name.clone();
    if name == "db" {
        db::run(ctx, inbox).await;
    } else if name.starts_with("id") {
        id::run(ctx, inbox).await;
    } else if name == "token" {
        token::run(ctx, inbox).await;
    } else if name == "coord" {
        tcc::run_coordinator(ctx, inbox).await;
    } else if name == "wallet" || name == "inventory" {
        tcc::run_participant(ctx, inbox).await;
    } else if name.starts_with("client") {
        client::run(ctx, inbox).await;
    }
}
