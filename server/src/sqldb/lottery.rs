//! The lottery store on a database server, written once for PostgreSQL and MariaDB: the twin of
//! `SqliteLotteryStore`, the same tables (prefixed `lot_`), and every participant operation in
//! ONE serializable transaction ([`SqlConn::transact`]): read the fence row
//! (`lot_tcc_fence_log`, Seata's table) and the business row, call [`rules::decide`], write
//! what it decided, commit. Two servers deciding the same fence row at once: one is rolled back
//! (a serialization failure, or InnoDB's deadlock) and retried, and then reads the other's
//! committed row: a fence row is decided once.
//!
//! The flawed two-step operation stays two transactions ([`LotteryStore::read_branch`], then
//! [`LotteryStore::execute_checked`]), as in SQLite: the flaw is the gap between them.
//!
//! What differs between the servers is only how a row is read or written ([`LotteryRows`]).

use sut::edge::Edges;
use sut::lottery::error::StoreError;
use sut::lottery::ledger::Ledger;
use sut::lottery::log::{self, CoordLog, LogEntry, LogRecord};
use sut::lottery::rows::{Account, BranchOutcome, FenceStatus, ParticipationRow, Stock};
use sut::lottery::rules::{self, BranchDecision, BranchOp, BranchView, BusinessRow};
use sut::lottery::store::LotteryStore;
use sut::lottery::{ActivityId, Flaws, Participant, UserId, Xid};

use super::SqlConn;

/// A corrupt row, named.
pub(crate) fn corrupt(what: &str) -> StoreError {
    StoreError::Backend {
        message: format!("corrupt row: {what}"),
    }
}

/// An id as stored: the bit pattern of an `i64` (as in SQLite, so every `u64` id round-trips).
pub(crate) const fn id(v: u64) -> i64 {
    v.cast_signed()
}

/// An id read back.
pub(crate) const fn unid(v: i64) -> u64 {
    v.cast_unsigned()
}

/// An amount as stored (amounts are bounded by `AMOUNT_MAX`, `i64::MAX`, before they get here).
pub(crate) fn amount(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::AmountTooLarge { amount_minor: v })
}

/// Every participation, by user and activity.
pub type Participations = Vec<((UserId, ActivityId), ParticipationRow)>;
/// Every fence row, by draw and branch.
pub type Fences = Vec<((Xid, Participant), FenceStatus)>;

/// How the lottery's rows are read and written in one server's transaction.
pub trait LotteryRows {
    /// The fence row of a draw's branch, if any.
    fn fence(&mut self, xid: Xid, branch: Participant) -> Result<Option<FenceStatus>, StoreError>;
    /// Writes the fence row of a draw's branch.
    fn set_fence(
        &mut self,
        xid: Xid,
        branch: Participant,
        status: FenceStatus,
    ) -> Result<(), StoreError>;
    /// The house's minted and collected money.
    fn house(&mut self) -> Result<(u64, u64), StoreError>;
    /// Sets the house's minted money.
    fn set_minted(&mut self, minted_minor: u64) -> Result<(), StoreError>;
    /// Sets the house's collected money.
    fn set_collected(&mut self, collected_minor: u64) -> Result<(), StoreError>;
    /// A user's account, if opened.
    fn account(&mut self, user: UserId) -> Result<Option<Account>, StoreError>;
    /// Writes a user's account.
    fn set_account(&mut self, user: UserId, account: &Account) -> Result<(), StoreError>;
    /// An activity's stock, if any was added.
    fn stock(&mut self, activity: ActivityId) -> Result<Option<Stock>, StoreError>;
    /// Writes an activity's stock.
    fn set_stock(&mut self, activity: ActivityId, stock: &Stock) -> Result<(), StoreError>;
    /// A user's participation in an activity, if any.
    fn participation(
        &mut self,
        user: UserId,
        activity: ActivityId,
    ) -> Result<Option<ParticipationRow>, StoreError>;
    /// Writes a user's participation in an activity (`None`: deletes it).
    fn set_participation(
        &mut self,
        user: UserId,
        activity: ActivityId,
        row: Option<&ParticipationRow>,
    ) -> Result<(), StoreError>;
    /// The coordinator log's record of a draw, if any.
    fn log_record(&mut self, xid: Xid) -> Result<Option<LogRecord>, StoreError>;
    /// Writes the coordinator log's record of draw `xid` (`None`: deletes it).
    fn set_log_record(&mut self, xid: Xid, record: Option<&LogRecord>) -> Result<(), StoreError>;
    /// Every record of the coordinator log.
    fn log_records(&mut self) -> Result<Vec<LogRecord>, StoreError>;
    /// Every account.
    fn accounts(&mut self) -> Result<Vec<(UserId, Account)>, StoreError>;
    /// Every activity's stock.
    fn stocks(&mut self) -> Result<Vec<(ActivityId, Stock)>, StoreError>;
    /// Every participation.
    fn participations(&mut self) -> Result<Participations, StoreError>;
    /// Every fence row.
    fn fences(&mut self) -> Result<Fences, StoreError>;
}

/// The lottery store on a database server whose connection is `C`: one serializable
/// transaction per operation.
#[derive(Debug)]
pub struct SqlLotteryStore<C> {
    conn: C,
}

impl<C: SqlConn> SqlLotteryStore<C> {
    /// The store on `conn`, whose schema exists.
    pub(crate) const fn on(conn: C) -> Self {
        Self { conn }
    }

    fn run(
        &mut self,
        op: &BranchOp,
        checked: Option<&BranchView>,
        flaws: Flaws,
    ) -> Result<BranchOutcome, StoreError> {
        self.conn.transact(|tx| {
            let fresh = read_view(tx, op)?;
            let decision = rules::decide(
                op,
                checked.unwrap_or(&fresh),
                &fresh,
                flaws,
                &mut Edges::new(),
            );
            write(tx, op, &decision)?;
            Ok(decision.outcome)
        })
    }
}

/// The fence row and the business row `op` decides on.
fn read_view<R: LotteryRows>(tx: &mut R, op: &BranchOp) -> Result<BranchView, StoreError> {
    let d = &op.draw;
    let business = match op.branch {
        Participant::Wallet => BusinessRow::Wallet {
            account: tx.account(d.user)?,
            collected_minor: tx.house()?.1,
        },
        Participant::Inventory => BusinessRow::Inventory {
            stock: tx.stock(d.activity)?,
        },
        Participant::Participation => BusinessRow::Participation {
            row: tx.participation(d.user, d.activity)?,
        },
    };
    Ok(BranchView {
        fence: tx.fence(d.xid, op.branch)?,
        business,
    })
}

/// Writes what the rule decided for `op`.
fn write<R: LotteryRows>(
    tx: &mut R,
    op: &BranchOp,
    decision: &BranchDecision,
) -> Result<(), StoreError> {
    let d = &op.draw;
    if let Some(status) = decision.fence_write {
        tx.set_fence(d.xid, op.branch, status)?;
    }
    match &decision.business_write {
        None | Some(BusinessRow::Inventory { stock: None }) => Ok(()),
        Some(BusinessRow::Wallet {
            account,
            collected_minor,
        }) => {
            if let Some(account) = account {
                tx.set_account(d.user, account)?;
            }
            tx.set_collected(*collected_minor)
        }
        Some(BusinessRow::Inventory { stock: Some(stock) }) => tx.set_stock(d.activity, stock),
        Some(BusinessRow::Participation { row }) => {
            tx.set_participation(d.user, d.activity, row.as_ref())
        }
    }
}

fn load_log<R: LotteryRows>(tx: &mut R) -> Result<CoordLog, StoreError> {
    let mut log = CoordLog::default();
    for record in tx.log_records()? {
        log.records.insert(record.draw.xid, record);
    }
    Ok(log)
}

impl<C: SqlConn> LotteryStore for SqlLotteryStore<C> {
    fn open_account(&mut self, user: UserId, balance_minor: u64) -> Result<(), StoreError> {
        self.conn.transact(|tx| {
            let (minted, _) = tx.house()?;
            let (account, minted) =
                rules::open_account(tx.account(user)?, minted, user, balance_minor)?;
            tx.set_account(user, &account)?;
            tx.set_minted(minted)
        })
    }

    fn add_stock(&mut self, activity: ActivityId, units: u64) -> Result<(), StoreError> {
        self.conn.transact(|tx| {
            let stock = rules::add_stock(tx.stock(activity)?, activity, units)?;
            tx.set_stock(activity, &stock)
        })
    }

    fn execute(&mut self, op: &BranchOp, flaws: Flaws) -> Result<BranchOutcome, StoreError> {
        self.run(op, None, flaws)
    }

    fn read_branch(&mut self, op: &BranchOp) -> Result<BranchView, StoreError> {
        self.conn.transact(|tx| read_view(tx, op))
    }

    fn execute_checked(
        &mut self,
        op: &BranchOp,
        checked: &BranchView,
        flaws: Flaws,
    ) -> Result<BranchOutcome, StoreError> {
        self.run(op, Some(checked), flaws)
    }

    fn log_append(&mut self, entry: &LogEntry) -> Result<(), StoreError> {
        let xid = entry.xid();
        self.conn.transact(|tx| {
            let record = log::apply_entry(tx.log_record(xid)?, entry)?;
            tx.set_log_record(xid, record.as_ref())
        })
    }

    fn log_load(&mut self) -> Result<CoordLog, StoreError> {
        self.conn.transact(|tx| load_log(tx))
    }

    fn snapshot(&mut self) -> Result<Ledger, StoreError> {
        self.conn.transact(|tx| {
            let mut ledger = Ledger::default();
            (ledger.minted_minor, ledger.collected_minor) = tx.house()?;
            ledger.accounts.extend(tx.accounts()?);
            ledger.stock.extend(tx.stocks()?);
            ledger.participations.extend(tx.participations()?);
            ledger.fences.extend(tx.fences()?);
            ledger.coord_log = load_log(tx)?;
            Ok(ledger)
        })
    }
}
