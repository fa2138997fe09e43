//! The durable lottery: one writer thread owns the TCC [`Coordinator`], the three participants
//! and the store, and makes every answer durable by GROUP COMMIT before it is sent.
//!
//! ## Why a journal, and why group commit is safe
//!
//! A draw is about nine store operations (log `Begin`, two or three Tries, log `Decided`, two or
//! three Confirms/Cancels, log `Finished`). With [`SqliteLotteryStore`] each is its own
//! `synchronous=FULL` transaction, i.e. one `fsync` of the WAL each (~0.25 ms on this machine):
//! a few hundred draws per second, whatever the CPU. Its connection is private and fixed at
//! `FULL`, so the writer cannot lower it. The default store here, [`JournaledStore`], is
//! therefore a *command journal* in front of the in-memory store (`sut`'s
//! [`sut::lottery::journal::Journaled`], the same journal the simulator's participant disks
//! keep, over the memory store that runs the same `rules::decide` as the SQLite store): every
//! store operation is applied in memory and its record queued; the batch's records are written
//! to the table `server_lottery_journal` on the writer's own connection at the group commit. On
//! start the journal is replayed in order ([`sut::lottery::journal::replay`]); the operations are deterministic functions of the state, so
//! the replay rebuilds exactly the state that was on disk, and [`Coordinator::recover`] then
//! finishes or cancels the draws the log shows open, exactly as after a crash with the SQLite
//! store.
//!
//! The writer drains up to [`BATCH_MAX`] pending commands from its bounded channel, runs them
//! (and everything the coordinator asks for as a consequence), writes all their journal records
//! in ONE SQLite transaction, then commits that transaction with `synchronous=FULL` (in WAL mode,
//! one `fsync` of the WAL file, which covers every frame appended before it), and only then
//! answers the batch. So:
//!
//! - a 2xx answer is sent only after the `fsync` that covers every journal record of its draw
//!   and every record before it (WAL recovery keeps a prefix of commits: frames are checksummed
//!   in a chain and recovery stops at the first bad one);
//! - a crash before the `fsync` loses the whole batch, and nobody was told anything about it:
//!   its draws simply never happened (the client sees a dropped connection and retries with
//!   a new draw; the xid allocator never reuses an xid);
//! - the coordinator's rule "log the verdict before Confirm/Cancel" still holds on disk: both
//!   are in the same journal in order, and a journal prefix never holds a Confirm without the
//!   verdict before it;
//! - if the commit itself fails, memory is ahead of disk: the writer answers the batch 503 and
//!   refuses all later commands (fail-stop; a restart replays what is on disk). Reads are also
//!   answered after the commit, so nobody observes undurable state.
//!
//! The cost of one `fsync` is shared by the whole batch; with 256 concurrent clients, batches
//! of dozens of draws make ~10k durable draws per second possible on two cores.
//!
//! `--lottery-store sqlite` runs the lottery on [`SqliteLotteryStore`] instead (each operation `FULL`,
//! the commit step is a no-op), for comparison.
//!
//! Checkpoints: every [`CHECKPOINT_EVERY_RECORDS`] records the writer appends a checkpoint (the
//! whole ledger, [`JournalOp::Checkpoint`]) and deletes the records before it, in one durable
//! write ([`JournalFile::checkpoint`]); a restart replays the checkpoint and at most that many
//! records. The checkpoint holds the whole state, so writing one costs time in proportion to the
//! ledger (fence rows and participations are kept for good, as Seata keeps its fence log until
//! an operator's cleanup); the commit that writes it waits for it.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use axum::http::StatusCode;
use rusqlite::{Connection, params};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::clock::RealClock;
use super::error::ApiError;
use super::metrics::Metrics;
use sut::lottery::invariants;
use sut::lottery::journal::{self, JournalOp, Journaled};
use sut::lottery::{
    ActivityId, BranchOp, BranchOutcome, BranchView, CancelReason, ClientAnswer, CoordLog,
    CoordinatorConfig, CoordinatorError, CoordinatorIo, CoordinatorNode, DrawArgs, DrawEvent,
    DrawOutcome, DrawStatus, Flaws, Handled, Host, Ledger, LogEntry, LotteryStore, Participant,
    ParticipantConfig, ParticipantMsg, ParticipantReply, Refusal, Registry, StoreError, UserId,
    Verdict, Written, Xid,
};

use crate::activities::Activities;
use crate::db::Db;
use crate::pg::PgLotteryStore;
use crate::remote::{Outbox, RemoteParticipants, ReplySink};
use crate::sqlite::SqliteLotteryStore;
use sut::gate::handle::HandleKey;

/// Most commands answered by one group commit.
pub const BATCH_MAX: usize = 512;
/// Commands waiting for the writer; a full queue answers 503.
pub const QUEUE_MAX: usize = 4096;
/// Participant replies kept for the order-based checkers.
pub const HISTORY_MAX: usize = 100_000;
/// Most accounts opened by one request.
pub const ACCOUNTS_PER_REQUEST_MAX: u64 = 1_000_000;

/// Final outcomes remembered for `GET /lottery/draws/{xid}` (the oldest xids are forgotten).
pub const OUTCOMES_KEPT_MAX: usize = 100_000;

/// How the writer runs the lottery.
#[derive(Clone, Debug, Default)]
pub struct LotteryOptions {
    /// The coordinator's timing, limits and compensation schedule.
    pub coordinator: CoordinatorConfig,
    /// The participants' configuration (documented flaws).
    pub participants: ParticipantConfig,
    /// Messages between the coordinator and the participants to lose (tests only).
    pub faults: ParticipantFaults,
    /// Participants in other processes (role `coordinator`); `None`: every participant runs
    /// in this writer.
    pub remote: Option<RemoteParticipants>,
    /// This process holds only part of the lottery (a role of a deployment): the checks that
    /// need every part (`lottery.settled`, `lottery.agreement`) are left out of its `/ledger`
    /// and judged over every process's `GET /lottery/state` instead.
    pub partial: bool,
    /// Fail-stop by exiting the process after a failed commit (see
    /// [`crate::ServerConfig::exit_on_store_failure`]).
    pub exit_on_store_failure: bool,
    /// The operator's activities (the participants' terms rule, `lottery.paid`); `None`: an
    /// empty registry in memory (every Try refused as unregistered).
    pub activities: Option<Arc<Activities>>,
    /// How draws are named to clients (the coordinator's; derived from the JWT key). `None`: a
    /// fixed key (processes that answer no client about draws, and tests).
    pub handles: Option<HandleKey>,
}

/// The exit code of a process whose lottery commit failed (`EX_TEMPFAIL`): what it held in
/// memory may not match its log, and only a restart on the log is sure to.
pub const EXIT_STORE_FAILED: i32 = 75;

/// `GET /lottery/state`: this process's part of the lottery, raw, for a verifier that reads
/// every process of a deployment and merges the parts ([`Ledger::merge`]).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LotteryState {
    /// The ledger (accounts, stock, participations, fences, the coordinator log).
    #[schema(value_type = Object)]
    pub ledger: Ledger,
    /// The coordinator's outcome events since start, oldest first (the last [`HISTORY_MAX`]).
    #[schema(value_type = Vec<Object>)]
    pub events: Vec<DrawEvent>,
    /// Whether older events were dropped (then `lottery.agreement` judges only these).
    pub events_dropped: bool,
    /// This process's activity registry (the deployment's verifier judges `lottery.paid` on
    /// their union).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub activities: sut::lottery::Registry,
}

#[cfg(feature = "test-hooks")]
pub use crate::test_hooks::LoseMessages;
pub use crate::test_hooks::ParticipantFaults;

/// Where a draw is, as `GET /lottery/draws/{draw}` tells it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DrawStatusBody {
    /// The draw's handle (16 hex digits; its xid is never shown to clients).
    pub draw: String,
    /// Whose draw it is (the route shows it only to them or to the operator).
    #[serde(skip)]
    pub user: u64,
    /// `in_progress` (not answered yet), `pending` (its verdict is being redelivered by
    /// compensation), `dead_lettered` (compensation gave up: an operator must act),
    /// `confirmed` or `cancelled`.
    pub status: &'static str,
    /// The verdict the coordinator logged, once decided (`confirm` or `cancel`).
    pub verdict: Option<&'static str>,
    /// The final outcome in full, once there is one.
    #[schema(value_type = Object)]
    pub detail: Option<DrawOutcome>,
}

/// A dead-lettered draw (`GET /admin/dead-letters`, the operator's).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DeadLetterBody {
    /// The draw's xid (what `POST /admin/dead-letters/{xid}/retry` takes).
    pub xid: u64,
    /// Its handle, as its owner knows it.
    pub draw: String,
    /// The user.
    pub user: u64,
    /// The activity.
    pub activity: u64,
    /// The ticket price.
    pub price_minor: u64,
    /// Whether the draw won.
    pub won: bool,
    /// The verdict still to deliver (`confirm` or `cancel`).
    pub verdict: &'static str,
}

const fn verdict_name(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Confirm => "confirm",
        Verdict::Cancel => "cancel",
    }
}

/// A lottery store the writer can commit.
pub trait DurableLottery: LotteryStore + Send + 'static {
    /// Makes everything done since the last call durable.
    ///
    /// # Errors
    /// The commit failed: what was done since the last call may be lost.
    fn commit(&mut self) -> Result<(), StoreError>;

    /// Opens `count` accounts from `first` with `balance_minor` each; returns how many were
    /// opened and how many existed already.
    ///
    /// # Errors
    /// The first error other than "exists".
    fn open_accounts(
        &mut self,
        first: u64,
        count: u64,
        balance_minor: u64,
    ) -> Result<(u64, u64), StoreError> {
        journal::open_range(self, first, count, balance_minor)
    }

    /// Runs `f` on the current ledger.
    ///
    /// # Errors
    /// Backend failures.
    fn with_ledger<R>(&mut self, f: impl FnOnce(&Ledger) -> R) -> Result<R, StoreError> {
        Ok(f(&self.snapshot()?))
    }
}

impl DurableLottery for SqliteLotteryStore {
    fn commit(&mut self) -> Result<(), StoreError> {
        // Every operation was its own synchronous=FULL transaction already.
        Ok(())
    }
}

fn backend(e: &rusqlite::Error) -> StoreError {
    StoreError::Backend {
        message: e.to_string(),
    }
}

/// Where a journaled store's records are kept: read once at start, appended at each group
/// commit (one durable write for the whole batch).
pub trait JournalFile: std::fmt::Debug + Send + 'static {
    /// Every record, oldest first.
    ///
    /// # Errors
    /// Backend failures, or a record that does not parse.
    fn read_all(&mut self) -> Result<Vec<JournalOp>, StoreError>;

    /// Appends `records` durably, all or none.
    ///
    /// # Errors
    /// Backend failures: then none of them may be on disk.
    fn append(&mut self, records: &[JournalOp]) -> Result<(), StoreError>;

    /// Appends `checkpoint` (a [`JournalOp::Checkpoint`] of the state after every record on
    /// disk) and deletes every record before it, in one durable write.
    ///
    /// # Errors
    /// Backend failures: then the journal is as it was.
    fn checkpoint(&mut self, checkpoint: &JournalOp) -> Result<(), StoreError>;
}

impl JournalFile for Box<dyn JournalFile> {
    fn read_all(&mut self) -> Result<Vec<JournalOp>, StoreError> {
        (**self).read_all()
    }

    fn append(&mut self, records: &[JournalOp]) -> Result<(), StoreError> {
        (**self).append(records)
    }

    fn checkpoint(&mut self, checkpoint: &JournalOp) -> Result<(), StoreError> {
        (**self).checkpoint(checkpoint)
    }
}

/// Journal records between two checkpoints, by default (a restart replays one checkpoint and at
/// most this many records; about 110,000 draws).
pub const CHECKPOINT_EVERY_RECORDS: u64 = 1_000_000;

/// Decodes journal records (their position, from 1, names a corrupt one).
///
/// # Errors
/// A record that does not parse.
pub fn decode_records(texts: &[String]) -> Result<Vec<JournalOp>, StoreError> {
    texts
        .iter()
        .enumerate()
        .map(|(i, text)| {
            serde_json::from_str(text).map_err(|e| StoreError::Backend {
                message: format!("corrupt journal record {} (from 1): {e}", i + 1),
            })
        })
        .collect()
}

/// Encodes journal records.
///
/// # Errors
/// A record that does not encode (never, for these types).
pub fn encode_records(records: &[JournalOp]) -> Result<Vec<String>, StoreError> {
    records
        .iter()
        .map(|r| {
            serde_json::to_string(r).map_err(|e| StoreError::Backend {
                message: format!("journal encoding: {e}"),
            })
        })
        .collect()
}

/// The journal in an SQLite file: the table `server_lottery_journal`, WAL with
/// `synchronous=FULL`, so a commit is one fsync of the WAL.
#[derive(Debug)]
pub struct SqliteJournal {
    conn: Connection,
}

impl SqliteJournal {
    /// Opens (creating if needed) the journal at `path`.
    ///
    /// # Errors
    /// Backend failures.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn =
            crate::db::open_private(path).map_err(|message| StoreError::Backend { message })?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(|e| backend(&e))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Backend {
                message: format!("journal_mode is {mode}, not wal"),
            });
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| backend(&e))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS server_lottery_journal (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                op  TEXT NOT NULL
            );",
        )
        .map_err(|e| backend(&e))?;
        Ok(Self { conn })
    }
}

impl JournalFile for SqliteJournal {
    fn read_all(&mut self) -> Result<Vec<JournalOp>, StoreError> {
        let texts: Vec<String> = {
            let mut stmt = self
                .conn
                .prepare("SELECT op FROM server_lottery_journal ORDER BY seq")
                .map_err(|e| backend(&e))?;
            stmt.query_map([], |r| r.get(0))
                .map_err(|e| backend(&e))?
                .collect::<Result<_, _>>()
                .map_err(|e| backend(&e))?
        };
        decode_records(&texts)
    }

    /// One transaction; `synchronous=FULL` makes its COMMIT fsync the WAL.
    fn append(&mut self, records: &[JournalOp]) -> Result<(), StoreError> {
        let texts = encode_records(records)?;
        let tx = self.conn.transaction().map_err(|e| backend(&e))?;
        {
            let mut stmt = tx
                .prepare_cached("INSERT INTO server_lottery_journal (op) VALUES (?1)")
                .map_err(|e| backend(&e))?;
            for text in &texts {
                stmt.execute(params![text]).map_err(|e| backend(&e))?;
            }
        }
        tx.commit().map_err(|e| backend(&e))
    }

    /// One transaction: the checkpoint, then the records before it deleted.
    fn checkpoint(&mut self, checkpoint: &JournalOp) -> Result<(), StoreError> {
        let text = encode_records(std::slice::from_ref(checkpoint))?.remove(0);
        let tx = self.conn.transaction().map_err(|e| backend(&e))?;
        tx.execute(
            "INSERT INTO server_lottery_journal (op) VALUES (?1)",
            params![text],
        )
        .map_err(|e| backend(&e))?;
        let at = tx.last_insert_rowid();
        tx.execute(
            "DELETE FROM server_lottery_journal WHERE seq < ?1",
            params![at],
        )
        .map_err(|e| backend(&e))?;
        tx.commit().map_err(|e| backend(&e))
    }
}

/// The in-memory store behind a write-ahead command journal (see the module doc): `sut`'s
/// [`Journaled`] store, whose records a commit appends to its [`JournalFile`] in one durable
/// write (an SQLite file by default, or PostgreSQL: `crate::pg::PgJournal`).
#[derive(Debug)]
pub struct JournaledStore<J: JournalFile = SqliteJournal> {
    journal: Journaled,
    file: J,
    replayed: u64,
    /// Records written since the last checkpoint (or since start).
    since_checkpoint: u64,
    /// Records between two checkpoints.
    checkpoint_every: u64,
    /// Checkpoints written since start.
    checkpoints: u64,
}

impl JournaledStore {
    /// Opens (creating if needed) the SQLite journal at `path` and replays it.
    ///
    /// # Errors
    /// Backend failures, or a journal record that does not parse.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::with_file(SqliteJournal::open(path)?)
    }
}

impl<J: JournalFile> JournaledStore<J> {
    /// Replays `file` into memory.
    ///
    /// # Errors
    /// Backend failures, or a journal record that does not parse.
    pub fn with_file(mut file: J) -> Result<Self, StoreError> {
        let records = file.read_all()?;
        let (mem, _) = journal::replay(&records);
        Ok(Self {
            journal: Journaled::new(mem),
            file,
            replayed: records.len() as u64,
            since_checkpoint: records.len() as u64,
            checkpoint_every: CHECKPOINT_EVERY_RECORDS,
            checkpoints: 0,
        })
    }

    /// A checkpoint every `records` journal records (at least 1).
    #[must_use]
    pub fn with_checkpoint_every(mut self, records: u64) -> Self {
        self.checkpoint_every = records.max(1);
        self
    }

    /// Journal records replayed at start.
    #[must_use]
    pub fn replayed(&self) -> u64 {
        self.replayed
    }

    /// Checkpoints written since start.
    #[must_use]
    pub fn checkpoints(&self) -> u64 {
        self.checkpoints
    }
}

impl<J: JournalFile> LotteryStore for JournaledStore<J> {
    fn open_account(&mut self, user: UserId, balance_minor: u64) -> Result<(), StoreError> {
        self.journal.open_account(user, balance_minor)
    }

    fn add_stock(&mut self, activity: ActivityId, units: u64) -> Result<(), StoreError> {
        self.journal.add_stock(activity, units)
    }

    fn execute(&mut self, op: &BranchOp, flaws: Flaws) -> Result<BranchOutcome, StoreError> {
        self.journal.execute(op, flaws)
    }

    fn read_branch(&mut self, op: &BranchOp) -> Result<BranchView, StoreError> {
        self.journal.read_branch(op)
    }

    fn execute_checked(
        &mut self,
        op: &BranchOp,
        checked: &BranchView,
        flaws: Flaws,
    ) -> Result<BranchOutcome, StoreError> {
        self.journal.execute_checked(op, checked, flaws)
    }

    fn log_append(&mut self, entry: &LogEntry) -> Result<(), StoreError> {
        self.journal.log_append(entry)
    }

    fn log_load(&mut self) -> Result<CoordLog, StoreError> {
        self.journal.log_load()
    }

    fn snapshot(&mut self) -> Result<Ledger, StoreError> {
        self.journal.snapshot()
    }
}

impl<J: JournalFile> DurableLottery for JournaledStore<J> {
    /// Writes the batch's records in one transaction (one fsync). On failure the records are
    /// lost and memory is ahead of disk: the writer stops answering (fail-stop), and a restart
    /// replays what is on disk.
    fn commit(&mut self) -> Result<(), StoreError> {
        let records = self.journal.take_records();
        if records.is_empty() {
            return Ok(());
        }
        self.file.append(&records)?;
        self.since_checkpoint += records.len() as u64;
        if self.since_checkpoint >= self.checkpoint_every {
            // Everything is on disk: the state now is the state after the last record. A
            // failed checkpoint loses nothing (the records stay); the next commit tries again.
            match self.file.checkpoint(&self.journal.checkpoint()) {
                Ok(()) => {
                    self.since_checkpoint = 0;
                    self.checkpoints += 1;
                }
                Err(e) => eprintln!("lottery journal: checkpoint failed, kept the records: {e}"),
            }
        }
        Ok(())
    }

    fn open_accounts(
        &mut self,
        first: u64,
        count: u64,
        balance_minor: u64,
    ) -> Result<(u64, u64), StoreError> {
        self.journal.open_accounts(first, count, balance_minor)
    }

    fn with_ledger<R>(&mut self, f: impl FnOnce(&Ledger) -> R) -> Result<R, StoreError> {
        Ok(f(self.journal.memory().ledger()))
    }
}

/// One activity's stock in the ledger report.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct StockView {
    /// The activity.
    pub activity: u64,
    /// Units ever added.
    pub total: u64,
    /// Free.
    pub available: u64,
    /// Reserved by open Tries.
    pub reserved: u64,
    /// Handed out.
    pub issued: u64,
}

/// One invariant's verdict.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Check {
    /// The invariant's name (`lottery.conservation`, ...).
    pub name: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// The violation, if any.
    pub violation: Option<String>,
}

/// `GET /ledger`: a summary of the ledger and the invariant checks.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct LedgerReport {
    /// Accounts open.
    pub accounts: u64,
    /// Money created by opening accounts.
    pub minted_minor: u64,
    /// Money the house collected (confirmed draws).
    pub collected_minor: u64,
    /// Spendable money over all accounts.
    pub balances_minor: u128,
    /// Money frozen by open Tries.
    pub frozen_minor: u128,
    /// Prize stock per activity.
    pub stock: Vec<StockView>,
    /// Participation records.
    pub participations: u64,
    /// Fence rows.
    pub fences: u64,
    /// Open coordinator-log records.
    pub open_draws: u64,
    /// Participant replies the order-based checks saw (the last [`HISTORY_MAX`] since start).
    pub history_len: u64,
    /// Journal records replayed at start.
    pub replayed: u64,
    /// Every check.
    pub checks: Vec<Check>,
    /// True when every safety check holds.
    pub safe: bool,
}

fn check(name: &'static str, r: Result<(), sut::lottery::LotteryViolation>) -> Check {
    Check {
        name,
        ok: r.is_ok(),
        violation: r.err().map(|v| v.to_string()),
    }
}

/// The ledger report. `whole`: the whole lottery runs in this process, so the checks that
/// need every part (`lottery.settled`, `lottery.agreement`) are judged here; a process of a
/// deployment leaves them to the verifier that merges every process's state.
fn report(
    ledger: &Ledger,
    registry: &sut::lottery::Registry,
    history: &VecDeque<ParticipantReply>,
    events: &VecDeque<DrawEvent>,
    replayed: u64,
    whole: bool,
) -> LedgerReport {
    let history: Vec<ParticipantReply> = history.iter().cloned().collect();
    let events: Vec<DrawEvent> = events.iter().cloned().collect();
    let mut checks = vec![
        check(invariants::CONSERVATION, invariants::conservation(ledger)),
        check(invariants::NO_OVER_ISSUE, invariants::no_over_issue(ledger)),
        check(invariants::NO_HANGING, invariants::no_hanging(&history)),
        check(
            invariants::NO_DUPLICATE_PARTICIPATION,
            invariants::no_duplicate_participation(&history),
        ),
        check(
            "lottery.no_duplicate_confirmed_draws",
            invariants::no_duplicate_confirmed_draws(&events),
        ),
    ];
    if whole {
        // The prizes (inventory) and who paid for them (participations) are in one ledger only
        // when the whole lottery runs here.
        checks.push(check(invariants::PAID, invariants::paid(ledger, registry)));
        checks.push(check(invariants::SETTLED, invariants::settled(ledger)));
        checks.push(check(
            invariants::AGREEMENT,
            invariants::agreement(&events, &[ledger]),
        ));
    }
    let safe = checks
        .iter()
        .filter(|c| c.name != invariants::SETTLED)
        .all(|c| c.ok);
    LedgerReport {
        accounts: ledger.accounts.len() as u64,
        minted_minor: ledger.minted_minor,
        collected_minor: ledger.collected_minor,
        balances_minor: ledger
            .accounts
            .values()
            .map(|a| u128::from(a.balance_minor))
            .sum(),
        frozen_minor: ledger
            .accounts
            .values()
            .map(|a| u128::from(a.frozen_minor))
            .sum(),
        stock: ledger
            .stock
            .iter()
            .map(|(a, s)| StockView {
                activity: a.0,
                total: s.total,
                available: s.available,
                reserved: s.reserved,
                issued: s.issued,
            })
            .collect(),
        participations: ledger.participations.len() as u64,
        fences: ledger.fences.len() as u64,
        open_draws: ledger.coord_log.records.len() as u64,
        history_len: history.len() as u64,
        replayed,
        checks,
        safe,
    }
}

/// A draw's answer.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct DrawAnswer {
    /// The draw's handle (16 hex digits): what `GET /lottery/draws/{draw}` takes. It names this
    /// draw only: the handles of other draws cannot be derived from it.
    pub draw: String,
    /// Whether the draw was a winning one.
    pub won: bool,
    /// `confirmed`, or `pending` (answered 202: the verdict is logged and compensation is
    /// redelivering it; `GET /lottery/draws/{draw}` follows it to the end). Cancelled draws are
    /// answered with an error.
    pub outcome: &'static str,
    /// The coordinator's outcome in full.
    #[schema(value_type = Object)]
    pub detail: DrawOutcome,
}

type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// What the writer is asked to do.
#[derive(Debug)]
enum Command {
    Draw(DrawArgs, Reply<DrawAnswer>),
    OpenAccounts {
        first: u64,
        count: u64,
        balance_minor: u64,
        reply: Reply<(u64, u64)>,
    },
    AddStock {
        activity: u64,
        units: u64,
        reply: Reply<()>,
    },
    Ledger(Reply<LedgerReport>),
    Status(Xid, Reply<Option<DrawStatusBody>>),
    DeadLetters(Reply<Vec<DeadLetterBody>>),
    /// An operator's retry of a dead letter (`POST /admin/dead-letters/{xid}/retry`).
    RetryDeadLetter(Xid, Reply<DrawStatusBody>),
    /// Coordinator messages for branches this process hosts (`POST /tcc/branch`, `POST
    /// /tcc/branches`), answered in order.
    Branch(
        Vec<(Participant, ParticipantMsg)>,
        Reply<Vec<ParticipantReply>>,
    ),
    /// A remote participant's reply to this process's coordinator.
    Reply(Participant, ParticipantReply),
    State(Reply<LotteryState>),
    Stop,
}

/// An answer held until the batch is durable.
enum Held {
    Draw(Reply<DrawAnswer>, Result<DrawAnswer, ApiError>),
    Opened(Reply<(u64, u64)>, Result<(u64, u64), ApiError>),
    Stocked(Reply<()>, Result<(), ApiError>),
    Ledger(Reply<LedgerReport>, Result<LedgerReport, ApiError>),
    Status(Reply<Option<DrawStatusBody>>, Option<DrawStatusBody>),
    DeadLetters(Reply<Vec<DeadLetterBody>>, Vec<DeadLetterBody>),
    Retried(Reply<DrawStatusBody>, Result<DrawStatusBody, ApiError>),
    Branch(Reply<Vec<ParticipantReply>>, Vec<ParticipantReply>),
    State(Reply<LotteryState>, Result<LotteryState, ApiError>),
}

impl Held {
    fn send(self) {
        // A dropped receiver is a client that went away: nothing to do.
        match self {
            Self::Draw(tx, r) => drop(tx.send(r)),
            Self::Opened(tx, r) => drop(tx.send(r)),
            Self::Stocked(tx, r) => drop(tx.send(r)),
            Self::Ledger(tx, r) => drop(tx.send(r)),
            Self::Status(tx, r) => drop(tx.send(Ok(r))),
            Self::DeadLetters(tx, r) => drop(tx.send(Ok(r))),
            Self::Retried(tx, r) => drop(tx.send(r)),
            Self::Branch(tx, r) => drop(tx.send(Ok(r))),
            Self::State(tx, r) => drop(tx.send(r)),
        }
    }

    fn fail(self, e: &ApiError) {
        match self {
            Self::Draw(tx, _) => drop(tx.send(Err(e.clone()))),
            Self::Opened(tx, _) => drop(tx.send(Err(e.clone()))),
            Self::Stocked(tx, _) => drop(tx.send(Err(e.clone()))),
            Self::Ledger(tx, _) => drop(tx.send(Err(e.clone()))),
            Self::Status(tx, _) => drop(tx.send(Err(e.clone()))),
            Self::DeadLetters(tx, _) => drop(tx.send(Err(e.clone()))),
            Self::Retried(tx, _) => drop(tx.send(Err(e.clone()))),
            Self::Branch(tx, _) => drop(tx.send(Err(e.clone()))),
            Self::State(tx, _) => drop(tx.send(Err(e.clone()))),
        }
    }
}

fn store_error(e: &StoreError) -> ApiError {
    match e {
        StoreError::AccountExists { user } => ApiError::field(
            StatusCode::CONFLICT,
            "user",
            format!("user {} already has an account", user.0),
        ),
        StoreError::AmountTooLarge { .. } => ApiError::bad("balance_minor", e.to_string()),
        StoreError::StockTooLarge { .. } => ApiError::bad("units", e.to_string()),
        StoreError::Log(_) | StoreError::Backend { .. } => {
            ApiError::unavailable(format!("lottery store: {e}"), 1)
        }
    }
}

fn refusal_field(r: &Refusal) -> Option<&'static str> {
    match r {
        Refusal::UnknownAccount { .. }
        | Refusal::InsufficientBalance { .. }
        | Refusal::AlreadyParticipated { .. } => Some("user"),
        Refusal::UnknownActivity { .. } | Refusal::OutOfStock { .. } => Some("activity"),
        Refusal::AmountTooLarge { .. } => Some("price_minor"),
        _ => None,
    }
}

fn answer_body(
    event: &DrawEvent,
    answer: ClientAnswer<'_>,
    handles: &HandleKey,
) -> Result<DrawAnswer, ApiError> {
    let ok = |outcome| {
        Ok(DrawAnswer {
            draw: handles.seal(event.draw.xid).to_string(),
            won: event.draw.won,
            outcome,
            detail: event.outcome.clone(),
        })
    };
    match answer {
        ClientAnswer::Confirmed { .. } => ok(DrawStatus::Confirmed.name()),
        ClientAnswer::Pending => ok(DrawStatus::Pending.name()),
        ClientAnswer::DeadLettered => ok(DrawStatus::DeadLettered.name()),
        ClientAnswer::Cancelled(reason) => Err(match reason {
            CancelReason::TryRefused { refusal, .. } => ApiError {
                status: StatusCode::CONFLICT,
                error: format!("draw cancelled: {refusal}"),
                field: refusal_field(refusal).map(str::to_owned),
                retry_after_s: None,
            },
            CancelReason::TryTimedOut { branch } => {
                ApiError::unavailable(format!("draw cancelled: {branch:?} timed out"), 1)
            }
            CancelReason::Recovered => ApiError::unavailable("draw cancelled by recovery", 1),
        }),
    }
}

/// Runs `msg` on participant `to` of this process, over `store`.
fn participate<S: LotteryStore>(
    store: &mut S,
    participants: &ParticipantConfig,
    registry: &Registry,
    to: Participant,
    msg: &ParticipantMsg,
) -> ParticipantReply {
    match to.handle(store, participants, registry, msg) {
        Handled::Reply(r) => r,
        Handled::Resume(resume) => to.handle_resume(store, participants, &resume),
    }
}

/// Keeps `reply` for the order-based checks of `GET /ledger` (the last [`HISTORY_MAX`]).
fn remember(history: &mut VecDeque<ParticipantReply>, reply: &ParticipantReply) {
    if history.len() >= HISTORY_MAX {
        history.pop_front();
    }
    history.push_back(reply.clone());
}

/// How the writer's coordinator node moves its bytes and storage: log entries into the
/// journaled store (durable at the batch's group commit, which comes before any answer leaves),
/// messages to the participants of this process (answered at once) or into the outbox for
/// those of other processes (sent after the commit), outcomes into the event history, the
/// metrics and the waiting client's reply.
struct WriterIo<'a, S> {
    store: &'a mut S,
    participants: &'a ParticipantConfig,
    registry: &'a Registry,
    faults: &'a mut ParticipantFaults,
    outbox: Option<&'a mut Outbox>,
    history: &'a mut VecDeque<ParticipantReply>,
    events: &'a mut VecDeque<DrawEvent>,
    events_dropped: &'a mut bool,
    held: &'a mut Vec<Held>,
    handles: &'a HandleKey,
    metrics: &'a Metrics,
}

impl<S: DurableLottery> CoordinatorIo<Reply<DrawAnswer>> for WriterIo<'_, S> {
    fn write_log(&mut self, entry: &LogEntry) -> Written {
        // Acknowledged at once: no answer and no remote message leaves before the batch's
        // commit makes it durable.
        match self.store.log_append(entry) {
            Ok(()) => Written::Durable,
            Err(_) => Written::Refused,
        }
    }

    fn send(
        &mut self,
        host: Host,
        branch: Participant,
        msg: ParticipantMsg,
    ) -> Option<ParticipantReply> {
        if self.faults.lose(branch, msg.phase) {
            return None;
        }
        if let Some(outbox) = self.outbox.as_mut() {
            outbox.push(host, branch, msg);
            return None;
        }
        let reply = participate(self.store, self.participants, self.registry, branch, &msg);
        remember(self.history, &reply);
        Some(reply)
    }

    fn outcome(
        &mut self,
        event: &DrawEvent,
        answer: ClientAnswer<'_>,
        client: Option<Reply<DrawAnswer>>,
    ) {
        if self.events.len() >= HISTORY_MAX {
            self.events.pop_front();
            *self.events_dropped = true;
        }
        self.events.push_back(event.clone());
        let counter = match answer {
            ClientAnswer::Pending => Some(&self.metrics.lottery_draws_parked),
            ClientAnswer::DeadLettered => Some(&self.metrics.lottery_draws_dead_lettered),
            ClientAnswer::Confirmed { .. } | ClientAnswer::Cancelled(_) => None,
        };
        if let Some(counter) = counter {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(reply) = client {
            self.held
                .push(Held::Draw(reply, answer_body(event, answer, self.handles)));
        }
    }
}

/// The writer's state.
struct Writer<S> {
    store: S,
    /// The coordinator role, its clients waiting for their first answer, and what status polls
    /// are answered from (final outcomes of the last [`OUTCOMES_KEPT_MAX`]).
    node: CoordinatorNode<Reply<DrawAnswer>>,
    participants: ParticipantConfig,
    faults: ParticipantFaults,
    clock: RealClock,
    /// How draws are named to clients.
    handles: HandleKey,
    history: VecDeque<ParticipantReply>,
    events: VecDeque<DrawEvent>,
    held: Vec<Held>,
    replayed: u64,
    metrics: Arc<Metrics>,
    failed: Option<ApiError>,
    exit_on_store_failure: bool,
    /// Messages for participants in other processes, sent after the next commit.
    outbox: Option<Outbox>,
    /// Only part of the lottery runs here (see [`LotteryOptions::partial`]).
    partial: bool,
    /// Whether `events` lost its oldest entries.
    events_dropped: bool,
    /// Where their replies go (this writer's queue).
    sink: ReplySink,
    /// The operator's activities.
    activities: Arc<Activities>,
}

impl<S: DurableLottery> Writer<S> {
    fn command(&mut self, cmd: Command) {
        let now = self.clock.now();
        match cmd {
            Command::Draw(args, reply) => self.start_draw(args, reply, now),
            Command::OpenAccounts {
                first,
                count,
                balance_minor,
                reply,
            } => {
                let r = self
                    .store
                    .open_accounts(first, count, balance_minor)
                    .map_err(|e| store_error(&e));
                self.held.push(Held::Opened(reply, r));
            }
            Command::AddStock {
                activity,
                units,
                reply,
            } => {
                let r = self
                    .store
                    .add_stock(ActivityId(activity), units)
                    .map_err(|e| store_error(&e));
                self.held.push(Held::Stocked(reply, r));
            }
            Command::Ledger(reply) => {
                let replayed = self.replayed;
                let whole = !self.partial;
                let (history, events) = (&self.history, &self.events);
                let registry = self.activities.snapshot();
                let r = self
                    .store
                    .with_ledger(|l| report(l, &registry, history, events, replayed, whole))
                    .map_err(|e| store_error(&e));
                self.held.push(Held::Ledger(reply, r));
            }
            Command::Status(xid, reply) => {
                let status = self.status(xid);
                self.held.push(Held::Status(reply, status));
            }
            Command::DeadLetters(reply) => {
                let letters = self.dead_letters();
                self.held.push(Held::DeadLetters(reply, letters));
            }
            Command::RetryDeadLetter(xid, reply) => {
                let r = self.retry_dead_letter(xid, now);
                self.held.push(Held::Retried(reply, r));
            }
            Command::Branch(msgs, reply) => {
                let answers = msgs
                    .iter()
                    .map(|(to, msg)| self.participate(*to, msg))
                    .collect();
                self.held.push(Held::Branch(reply, answers));
            }
            Command::Reply(from, reply) => self.on_reply(from, reply, now),
            Command::State(reply) => {
                let events: Vec<DrawEvent> = self.events.iter().cloned().collect();
                let events_dropped = self.events_dropped;
                let activities = (*self.activities.snapshot()).clone();
                let r = self
                    .store
                    .snapshot()
                    .map(|ledger| LotteryState {
                        ledger,
                        events,
                        events_dropped,
                        activities,
                    })
                    .map_err(|e| store_error(&e));
                self.held.push(Held::State(reply, r));
            }
            Command::Stop => {}
        }
    }

    /// Starts a draw; its reply waits for the outcome, or carries why it cannot start.
    fn start_draw(&mut self, args: DrawArgs, reply: Reply<DrawAnswer>, now: sut::clock::Now) {
        match self.node.start_draw(args, Some(reply), now) {
            Ok(()) => {}
            Err((reply, e)) => {
                let err = match e {
                    CoordinatorError::AmountTooLarge { .. } => {
                        ApiError::bad("price_minor", e.to_string())
                    }
                    CoordinatorError::DuplicateXid { .. } => {
                        ApiError::field(StatusCode::CONFLICT, "xid", e.to_string())
                    }
                    _ => ApiError::unavailable(e.to_string(), 1),
                };
                if let Some(reply) = reply {
                    drop(reply.send(Err(err)));
                }
            }
        }
    }

    /// The dead-lettered draws, as the admin endpoint shows them.
    fn dead_letters(&self) -> Vec<DeadLetterBody> {
        self.node
            .coordinator()
            .dead_letters()
            .map(|(d, verdict)| DeadLetterBody {
                xid: d.xid.0,
                draw: self.handles.seal(d.xid).to_string(),
                user: d.user.0,
                activity: d.activity.0,
                price_minor: d.price_minor,
                won: d.won,
                verdict: verdict_name(verdict),
            })
            .collect()
    }

    /// An operator's retry of dead letter `xid`: parked again with a fresh retry budget, its
    /// first round due now; answers its status (`pending`).
    fn retry_dead_letter(
        &mut self,
        xid: Xid,
        now: sut::clock::Now,
    ) -> Result<DrawStatusBody, ApiError> {
        self.node
            .handle_retry_dead_letter(xid, now)
            .map_err(|e| ApiError::field(StatusCode::CONFLICT, "xid", e.to_string()))?;
        self.metrics
            .lottery_dead_letters_retried
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(self
            .status(xid)
            .expect("a retried dead letter is in flight"))
    }

    /// Where draw `xid` is: in flight (its stage), else its remembered final outcome.
    fn status(&self, xid: Xid) -> Option<DrawStatusBody> {
        let polled = self.node.status(xid)?;
        Some(DrawStatusBody {
            draw: self.handles.seal(xid).to_string(),
            user: polled.user.0,
            status: polled.status.name(),
            verdict: polled.verdict.map(verdict_name),
            detail: polled.outcome.cloned(),
        })
    }

    /// Runs everything the coordinator asks for until it asks for nothing (its timeouts first,
    /// when due).
    fn pump(&mut self) {
        let now = self.clock.now();
        self.node.handle_due(now);
        let registry = self.activities.snapshot();
        let mut io = WriterIo {
            store: &mut self.store,
            participants: &self.participants,
            registry: &registry,
            faults: &mut self.faults,
            outbox: self.outbox.as_mut(),
            history: &mut self.history,
            events: &mut self.events,
            events_dropped: &mut self.events_dropped,
            held: &mut self.held,
            handles: &self.handles,
            metrics: &self.metrics,
        };
        self.node.drive(&mut io, now);
        let dead = self.node.coordinator().dead_letters().count() as u64;
        self.metrics
            .lottery_dead_letters
            .store(dead, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs one message on a participant of this process.
    fn participate(&mut self, to: Participant, msg: &ParticipantMsg) -> ParticipantReply {
        let registry = self.activities.snapshot();
        participate(&mut self.store, &self.participants, &registry, to, msg)
    }

    /// Gives a participant's reply to the coordinator (and to the order-based checks).
    fn on_reply(&mut self, from: Participant, reply: ParticipantReply, now: sut::clock::Now) {
        remember(&mut self.history, &reply);
        self.node.handle_reply(from, &reply, now);
    }

    /// Sends what waited for the commit that just succeeded.
    fn flush_outbox(&mut self) {
        if self.failed.is_none()
            && let Some(outbox) = self.outbox.as_mut()
        {
            outbox.flush(&self.sink);
        }
    }

    /// Makes the batch durable, then answers it.
    fn commit(&mut self) {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            // Nothing to answer; still make recovery or timeout work durable.
            if let Err(e) = self.store.commit() {
                self.failed = Some(ApiError::unavailable(format!("lottery commit: {e}"), 5));
            }
            return;
        }
        match self.store.commit() {
            Ok(()) => {
                self.metrics
                    .group_commits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.metrics
                    .group_commit_ops
                    .fetch_add(held.len() as u64, std::sync::atomic::Ordering::Relaxed);
                for h in held {
                    h.send();
                }
            }
            Err(e) => {
                let err = ApiError::unavailable(format!("lottery commit failed: {e}"), 5);
                for h in held {
                    h.fail(&err);
                }
                self.failed = Some(err);
            }
        }
    }

    fn run(mut self, rx: &mpsc::Receiver<Command>) {
        loop {
            let wait_ms = self
                .node
                .poll_timeout()
                .map(|due| due.saturating_sub(self.clock.now().mono_ms));
            let first = match wait_ms {
                Some(ms) => match rx.recv_timeout(Duration::from_millis(ms.max(1))) {
                    Ok(cmd) => Some(cmd),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(cmd) => Some(cmd),
                    Err(_) => return,
                },
            };
            let mut batch: Vec<Command> = first.into_iter().collect();
            while batch.len() < BATCH_MAX {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(_) => break,
                }
            }
            let stop = batch.iter().any(|c| matches!(c, Command::Stop));
            if let Some(err) = &self.failed
                && self.exit_on_store_failure
            {
                // Fail-stop: what waited was answered 503 by the failed commit; memory may be
                // ahead of the log, so no later request may be judged on it.
                eprintln!(
                    "lottery: {}; exiting for a restart on the log (fail-stop)",
                    err.error
                );
                std::process::exit(EXIT_STORE_FAILED);
            }
            if let Some(err) = &self.failed {
                for cmd in batch {
                    refuse(cmd, err);
                }
                if stop {
                    return;
                }
                continue;
            }
            for cmd in batch {
                self.command(cmd);
            }
            self.pump();
            self.commit();
            self.flush_outbox();
            if stop {
                return;
            }
        }
    }
}

fn refuse(cmd: Command, err: &ApiError) {
    match cmd {
        Command::Draw(_, tx) => drop(tx.send(Err(err.clone()))),
        Command::OpenAccounts { reply, .. } => drop(reply.send(Err(err.clone()))),
        Command::AddStock { reply, .. } => drop(reply.send(Err(err.clone()))),
        Command::Ledger(tx) => drop(tx.send(Err(err.clone()))),
        Command::Status(_, tx) => drop(tx.send(Err(err.clone()))),
        Command::DeadLetters(tx) => drop(tx.send(Err(err.clone()))),
        Command::RetryDeadLetter(_, tx) => drop(tx.send(Err(err.clone()))),
        Command::Branch(_, tx) => drop(tx.send(Err(err.clone()))),
        Command::State(tx) => drop(tx.send(Err(err.clone()))),
        Command::Reply(..) | Command::Stop => {}
    }
}

/// The handle requests use to reach the writer.
#[derive(Debug)]
pub struct Lottery {
    tx: SyncSender<Command>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Lottery {
    /// Starts the writer over `store`, recovering open draws from its log first.
    ///
    /// # Errors
    /// The log could not be read or the coordinator config is bad.
    pub fn start<S: DurableLottery>(
        store: S,
        replayed: u64,
        clock: RealClock,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        Self::start_with(store, replayed, clock, metrics, LotteryOptions::default())
    }

    /// [`Lottery::start`] with the coordinator's and the participants' configuration.
    ///
    /// # Errors
    /// As [`Lottery::start`].
    pub fn start_with<S: DurableLottery>(
        mut store: S,
        replayed: u64,
        clock: RealClock,
        metrics: Arc<Metrics>,
        options: LotteryOptions,
    ) -> Result<Self, String> {
        let log = store.log_load().map_err(|e| e.to_string())?;
        let node = CoordinatorNode::recover(
            options.coordinator,
            &log,
            clock.now(),
            Some(OUTCOMES_KEPT_MAX),
        )
        .map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::sync_channel(QUEUE_MAX);
        let outbox = match options.remote {
            Some(remote) => Some(Outbox::new(remote, Arc::clone(&metrics))?),
            None => None,
        };
        let replies = tx.clone();
        // A reply that finds the queue full is a lost message: the coordinator's timeout decides.
        let sink: ReplySink = Arc::new(move |from, reply| {
            let _ = replies.try_send(Command::Reply(from, reply));
        });
        let mut writer = Writer {
            store,
            node,
            participants: options.participants,
            faults: options.faults,
            clock,
            history: VecDeque::new(),
            events: VecDeque::new(),
            held: Vec::new(),
            replayed,
            metrics,
            failed: None,
            exit_on_store_failure: options.exit_on_store_failure,
            outbox,
            partial: options.partial,
            events_dropped: false,
            sink,
            activities: options
                .activities
                .unwrap_or_else(|| Arc::new(Activities::in_memory(sut::lottery::Registry::new()))),
            handles: options
                .handles
                .unwrap_or_else(|| HandleKey::new(*b"no key, in tests")),
        };
        // Finish what the log shows open before taking requests.
        writer.pump();
        writer.commit();
        writer.flush_outbox();
        let thread = std::thread::Builder::new()
            .name("lottery-writer".to_owned())
            .spawn(move || writer.run(&rx))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            tx,
            thread: std::sync::Mutex::new(Some(thread)),
        })
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, ApiError> {
        let (reply, rx) = oneshot::channel();
        match self.tx.try_send(make(reply)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(ApiError::unavailable("lottery writer queue full", 1));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(ApiError::unavailable("lottery writer stopped", 5));
            }
        }
        rx.await
            .map_err(|_| ApiError::unavailable("lottery writer stopped", 5))?
    }

    /// Runs a draw; answers once it is durable.
    pub async fn draw(&self, args: DrawArgs) -> Result<DrawAnswer, ApiError> {
        self.ask(|r| Command::Draw(args, r)).await
    }

    /// Opens accounts `first..first+count`.
    pub async fn open_accounts(
        &self,
        first: u64,
        count: u64,
        balance_minor: u64,
    ) -> Result<(u64, u64), ApiError> {
        self.ask(|reply| Command::OpenAccounts {
            first,
            count,
            balance_minor,
            reply,
        })
        .await
    }

    /// Adds prize stock.
    pub async fn add_stock(&self, activity: u64, units: u64) -> Result<(), ApiError> {
        self.ask(|reply| Command::AddStock {
            activity,
            units,
            reply,
        })
        .await
    }

    /// The ledger report.
    pub async fn ledger(&self) -> Result<LedgerReport, ApiError> {
        self.ask(Command::Ledger).await
    }

    /// Where draw `xid` is (`None`: unknown, or finished long ago and forgotten).
    pub async fn status(&self, xid: Xid) -> Result<Option<DrawStatusBody>, ApiError> {
        self.ask(|reply| Command::Status(xid, reply)).await
    }

    /// The dead-lettered draws.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetterBody>, ApiError> {
        self.ask(Command::DeadLetters).await
    }

    /// Retries dead letter `xid` (409 when it is not dead-lettered).
    pub async fn retry_dead_letter(&self, xid: Xid) -> Result<DrawStatusBody, ApiError> {
        self.ask(|reply| Command::RetryDeadLetter(xid, reply)).await
    }

    /// This process's part of the lottery, raw (after the pending commit).
    pub async fn state(&self) -> Result<LotteryState, ApiError> {
        self.ask(Command::State).await
    }

    /// Runs a coordinator's messages on branches of this process, in order, in one batch;
    /// answers (in the same order) once they are durable.
    pub async fn branches(
        &self,
        msgs: Vec<(Participant, ParticipantMsg)>,
    ) -> Result<Vec<ParticipantReply>, ApiError> {
        self.ask(|reply| Command::Branch(msgs, reply)).await
    }

    /// Stops the writer after the commands already queued (blocking).
    pub fn stop(&self) {
        let _ = self.tx.send(Command::Stop);
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// The writer's store choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LotteryStoreKind {
    /// Command journal + in-memory store, group commit (default): the journal in an SQLite
    /// file beside the database, or in the PostgreSQL or MariaDB database.
    Journal,
    /// One durable transaction per operation: `SqliteLotteryStore` (`synchronous=FULL`),
    /// `PgLotteryStore` on PostgreSQL, `MyLotteryStore` on MariaDB.
    Sqlite,
}

/// Opens the chosen store at `path` and starts the writer.
///
/// # Errors
/// The store could not be opened or replayed.
pub fn open(
    kind: LotteryStoreKind,
    path: &Path,
    clock: RealClock,
    metrics: Arc<Metrics>,
    activities: Arc<Activities>,
) -> Result<Lottery, String> {
    let db = Db::Sqlite(path.to_owned());
    let options = LotteryOptions {
        activities: Some(activities),
        ..LotteryOptions::default()
    };
    open_store(kind, &db, path, clock, metrics, options)
}

/// Opens the lottery store of `db` and starts the writer: on SQLite, the chosen `kind` in the
/// file beside the ID store; on PostgreSQL or MariaDB, the journal or the store of one
/// transaction per operation in the same database.
///
/// # Errors
/// The store could not be opened or replayed.
pub fn open_with(
    kind: LotteryStoreKind,
    db: &Db,
    clock: RealClock,
    metrics: Arc<Metrics>,
    options: LotteryOptions,
) -> Result<Lottery, String> {
    #[cfg(feature = "test-hooks")]
    if !options.faults.rules.is_empty() {
        eprintln!(
            "sut-server: WARNING: test hook on: messages to participants are lost: {:?}",
            options.faults.rules
        );
    }
    if let Some(path) = db.lottery_path() {
        return open_store(kind, db, &path, clock, metrics, options);
    }
    match (kind, db) {
        (LotteryStoreKind::Journal, _) => {
            let store = JournaledStore::with_file(db.open_server_journal()?)
                .map_err(|e| format!("lottery journal {}: {e}", db.describe()))?;
            let replayed = store.replayed();
            Lottery::start_with(store, replayed, clock, metrics, options)
        }
        (LotteryStoreKind::Sqlite, Db::MySql(_)) => {
            Lottery::start_with(db.open_mysql_lottery()?, 0, clock, metrics, options)
        }
        (LotteryStoreKind::Sqlite, _) => {
            Lottery::start_with(db.open_pg_lottery()?, 0, clock, metrics, options)
        }
    }
}

fn open_store(
    kind: LotteryStoreKind,
    db: &Db,
    path: &Path,
    clock: RealClock,
    metrics: Arc<Metrics>,
    options: LotteryOptions,
) -> Result<Lottery, String> {
    let opened = |e: StoreError| format!("lottery store {}: {e}", db.describe());
    match kind {
        LotteryStoreKind::Journal => {
            let store = JournaledStore::open(path).map_err(opened)?;
            let replayed = store.replayed();
            Lottery::start_with(store, replayed, clock, metrics, options)
        }
        LotteryStoreKind::Sqlite => {
            let store = SqliteLotteryStore::open(path).map_err(opened)?;
            Lottery::start_with(store, 0, clock, metrics, options)
        }
    }
}

impl DurableLottery for PgLotteryStore {
    fn commit(&mut self) -> Result<(), StoreError> {
        // Every operation was its own committed transaction already.
        Ok(())
    }
}

impl DurableLottery for crate::mysql::MyLotteryStore {
    fn commit(&mut self) -> Result<(), StoreError> {
        // Every operation was its own committed transaction already.
        Ok(())
    }
}

/// What the journals' tests of every backend share.
#[cfg(test)]
pub(crate) mod test_support {
    use sut::lottery::{
        ActivityId, BranchOp, DrawArgs, Flaws, LogEntry, LotteryStore, Participant, Phase, UserId,
        Xid,
    };

    /// A few draws' worth of operations, applied to `store`.
    pub(crate) fn run_draws<S: LotteryStore>(store: &mut S) {
        store.open_account(UserId(1), 1_000).unwrap();
        store.add_stock(ActivityId(1), 5).unwrap();
        for (xid, won) in [(1, true), (2, false), (3, true)] {
            let draw = DrawArgs {
                xid: Xid(xid),
                user: UserId(1),
                activity: ActivityId(xid),
                price_minor: 10,
                won,
            };
            store.log_append(&LogEntry::Begin(draw)).unwrap();
            for branch in draw.branches() {
                let op = BranchOp {
                    branch,
                    phase: Phase::Try,
                    draw,
                };
                let _ = store.execute(&op, Flaws::NONE).unwrap();
            }
            let _ = store
                .execute(
                    &BranchOp {
                        branch: Participant::Wallet,
                        phase: Phase::Confirm,
                        draw,
                    },
                    Flaws::NONE,
                )
                .unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(xid: u64, user: u64, won: bool) -> DrawArgs {
        DrawArgs {
            xid: Xid(xid),
            user: UserId(user),
            activity: ActivityId(1),
            price_minor: 100,
            won,
        }
    }

    #[test]
    fn journal_replay_rebuilds_the_ledger_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lottery.db");
        let before = {
            let mut s = JournaledStore::open(&path).unwrap();
            assert_eq!(s.open_accounts(1, 3, 1_000).unwrap(), (3, 0));
            s.add_stock(ActivityId(1), 1).unwrap();
            for (i, won) in [(1, true), (2, true), (3, false)] {
                let d = draw(i, i, won);
                s.log_append(&LogEntry::Begin(d)).unwrap();
                for p in d.branches() {
                    let op = BranchOp {
                        branch: p,
                        phase: sut::lottery::Phase::Try,
                        draw: d,
                    };
                    let _ = s.execute(&op, Flaws::NONE).unwrap();
                }
            }
            s.commit().unwrap();
            // An uncommitted tail is lost, as after a crash before the fsync.
            s.add_stock(ActivityId(2), 5).unwrap();
            s.snapshot().unwrap()
        };
        let mut again = JournaledStore::open(&path).unwrap();
        let after = again.snapshot().unwrap();
        assert!(
            !after.stock.contains_key(&ActivityId(2)),
            "uncommitted tail survived"
        );
        let mut expected = before;
        expected.stock.remove(&ActivityId(2));
        assert_eq!(after, expected);
        assert!(again.replayed() > 0);
        // Second draw wanted the last unit after the first took it: refused on replay too.
        assert_eq!(after.stock[&ActivityId(1)].reserved, 1);
    }

    /// Commits `draws` draws (each: Begin, the Tries), one commit per draw.
    fn journal_draws<J: JournalFile>(s: &mut JournaledStore<J>, draws: std::ops::Range<u64>) {
        for i in draws {
            let d = draw(i, i, false);
            s.log_append(&LogEntry::Begin(d)).unwrap();
            for p in d.branches() {
                let op = BranchOp {
                    branch: p,
                    phase: sut::lottery::Phase::Try,
                    draw: d,
                };
                let _ = s.execute(&op, Flaws::NONE).unwrap();
            }
            s.commit().unwrap();
        }
    }

    #[test]
    fn a_checkpoint_truncates_the_journal_and_replay_starts_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lottery.db");
        let rows = |path: &Path| -> i64 {
            Connection::open(path)
                .unwrap()
                .query_row("SELECT COUNT(*) FROM server_lottery_journal", [], |r| {
                    r.get(0)
                })
                .unwrap()
        };
        let before = {
            let mut s = JournaledStore::open(&path)
                .unwrap()
                .with_checkpoint_every(10);
            s.open_accounts(1, 40, 1_000).unwrap();
            s.commit().unwrap();
            // Each draw writes 3 records (Begin, two Tries): a checkpoint every 4 draws.
            journal_draws(&mut s, 1..21);
            assert!(s.checkpoints() >= 5, "{} checkpoints", s.checkpoints());
            s.snapshot().unwrap()
        };
        // What is left: the last checkpoint and the records after it, fewer than the interval.
        let left = rows(&path);
        assert!((1..=10).contains(&left), "{left} rows left");
        let mut again = JournaledStore::open(&path).unwrap();
        assert_eq!(
            again.snapshot().unwrap(),
            before,
            "the same state, from the checkpoint"
        );
        assert_eq!(again.replayed(), u64::try_from(left).unwrap());
        // And it goes on from there.
        journal_draws(&mut again, 21..23);
        let after = again.snapshot().unwrap();
        assert_eq!(
            JournaledStore::open(&path).unwrap().snapshot().unwrap(),
            after
        );
    }

    #[tokio::test]
    async fn the_writer_answers_draws_after_commit_and_checks_hold() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lottery.db");
        let metrics = Arc::new(Metrics::default());
        let activities = Arc::new(Activities::in_memory(
            sut::lottery::Registry::from_entries([(
                ActivityId(1),
                sut::lottery::Terms::always_open(100, 100),
            )])
            .unwrap(),
        ));
        let lottery = open(
            LotteryStoreKind::Journal,
            &path,
            RealClock::new(),
            Arc::clone(&metrics),
            Arc::clone(&activities),
        )
        .unwrap();
        assert_eq!(lottery.open_accounts(1, 50, 1_000).await.unwrap(), (50, 0));
        lottery.add_stock(1, 10).await.unwrap();
        let lottery = Arc::new(lottery);
        // Concurrent draws: the writer batches them into few group commits.
        let tasks: Vec<_> = (1..=50)
            .map(|u| {
                let l = Arc::clone(&lottery);
                tokio::spawn(async move { l.draw(draw(u, u, u % 2 == 0)).await })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let confirmed = answers.iter().filter(|a| a.is_ok()).count();
        // 25 losers always confirm; 10 of the 25 winners get a unit; the rest cancel.
        assert_eq!(confirmed, 35, "{answers:?}");
        let refused = answers.iter().find_map(|a| a.as_ref().err()).unwrap();
        assert_eq!(refused.field.as_deref(), Some("activity"));
        let report = lottery.ledger().await.unwrap();
        assert!(report.safe, "{report:?}");
        assert_eq!(report.collected_minor, 35 * 100);
        assert_eq!(report.stock[0].issued, 10);
        assert!(
            metrics
                .group_commits
                .load(std::sync::atomic::Ordering::Relaxed)
                >= 1
        );
        lottery.stop();
        // A restarted writer replays the journal to the same ledger.
        let lottery = open(
            LotteryStoreKind::Journal,
            &path,
            RealClock::new(),
            metrics,
            activities,
        )
        .unwrap();
        let again = lottery.ledger().await.unwrap();
        assert_eq!(again.collected_minor, report.collected_minor);
        assert_eq!(again.stock[0].issued, 10);
        assert!(again.replayed > 0);
        lottery.stop();
    }
}
