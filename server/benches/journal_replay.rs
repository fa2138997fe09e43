//! How long a restarted lottery process takes to rebuild its state from the journal, with and
//! without checkpoints, side by side in one run (`cargo bench -p sut-server --bench
//! journal_replay -- DRAWS`, default 1,000,000 draws).
//!
//! Each draw is written as the writer writes it: `Begin`, the wallet's and the participation
//! log's Tries, the verdict, both Confirms, `Finished` (seven records; losing draws, each of its
//! own user), committed in batches of 512 draws (group commit). One journal never checkpoints
//! (the server before checkpoints); the other checkpoints every
//! `sut_server::lottery::CHECKPOINT_EVERY_RECORDS` records. Then each is opened as a restart
//! opens it, and the replay timed. The figure is the ratio, and each replay's records.

use std::time::Instant;

use sut::lottery::{
    ActivityId, BranchOp, DrawArgs, Flaws, LogEntry, LotteryStore, Participant, Phase, UserId,
    Verdict, Xid,
};
use sut_server::lottery::{CHECKPOINT_EVERY_RECORDS, DurableLottery, JournaledStore};

const PRICE_MINOR: u64 = 10;
const BATCH_DRAWS: u64 = 512;

/// Writes `draws` draws into a fresh journal at `path`, checkpointing every `every` records;
/// returns the seconds it took and the checkpoints written.
fn write(path: &std::path::Path, draws: u64, every: u64) -> (f64, u64) {
    let started = Instant::now();
    let mut s = JournaledStore::open(path)
        .expect("open the journal")
        .with_checkpoint_every(every);
    s.open_accounts(1, draws, PRICE_MINOR)
        .expect("open the accounts");
    s.add_stock(ActivityId(1), 1).expect("add stock");
    s.commit().expect("commit the setup");
    for xid in 1..=draws {
        let d = DrawArgs {
            xid: Xid(xid),
            user: UserId(xid),
            activity: ActivityId(1),
            price_minor: PRICE_MINOR,
            won: false,
        };
        s.log_append(&LogEntry::Begin(d)).expect("begin");
        for phase in [Phase::Try, Phase::Confirm] {
            for branch in [Participant::Wallet, Participant::Participation] {
                let op = BranchOp {
                    branch,
                    phase,
                    draw: d,
                };
                let outcome = s.execute(&op, Flaws::NONE).expect("execute");
                assert!(outcome.is_ok(), "draw {xid}: {outcome:?}");
            }
            if phase == Phase::Try {
                s.log_append(&LogEntry::Decided {
                    xid: d.xid,
                    verdict: Verdict::Confirm,
                })
                .expect("decide");
            }
        }
        s.log_append(&LogEntry::Finished { xid: d.xid })
            .expect("finish");
        if xid % BATCH_DRAWS == 0 {
            s.commit().expect("commit");
        }
    }
    s.commit().expect("commit");
    (started.elapsed().as_secs_f64(), s.checkpoints())
}

/// Opens the journal at `path` as a restart does; the seconds it took and the records replayed.
fn replay(path: &std::path::Path) -> (f64, u64) {
    let started = Instant::now();
    let s = JournaledStore::open(path).expect("replay");
    (started.elapsed().as_secs_f64(), s.replayed())
}

fn main() {
    // `cargo bench` passes `--bench`; the first number among the arguments is the draws.
    let draws: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "journal_replay: {draws} draws (7 records each), batches of {BATCH_DRAWS}, checkpoint \
         every {CHECKPOINT_EVERY_RECORDS} records"
    );
    let mut replays = Vec::new();
    for (name, every) in [
        ("no checkpoint", u64::MAX),
        ("checkpoints", CHECKPOINT_EVERY_RECORDS),
    ] {
        let path = dir
            .path()
            .join(format!("{}.lottery", name.replace(' ', "-")));
        let (write_s, checkpoints) = write(&path, draws, every);
        let (replay_s, records) = replay(&path);
        let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
        println!(
            "  {name:<14} written in {write_s:.1} s ({checkpoints} checkpoints), file {:.0} MB; \
             restart replayed {records} records in {replay_s:.2} s",
            bytes as f64 / 1e6
        );
        replays.push(replay_s);
    }
    println!(
        "  replay with checkpoints / without: {:.3}",
        replays[1] / replays[0]
    );
}
