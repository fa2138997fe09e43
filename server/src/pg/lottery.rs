//! The PostgreSQL lottery store, the twin of `SqliteLotteryStore`: the same tables (prefixed
//! `lot_`), and every participant operation in ONE serializable transaction
//! ([`PgConn::transact`]): read the fence row (`lot_tcc_fence_log`, Seata's table) and the
//! business row, call [`rules::decide`], write what it decided, commit. A serialization failure
//! (two servers deciding the same fence row at once) retries the whole transaction, which then
//! reads the other's committed row: a fence row is decided once.
//!
//! The flawed two-step operation stays two transactions ([`LotteryStore::read_branch`], then
//! [`LotteryStore::execute_checked`]), as in SQLite: the flaw is the gap between them.
//!
//! Ids are stored as the bit pattern of an `i64` (as in SQLite, so every `u64` id round-trips);
//! amounts are bounded by `AMOUNT_MAX` (`i64::MAX`) before they get here, and a negative value
//! read back is reported as a corrupt row, never wrapped.

use tokio_postgres::Row;

use sut::edge::Edges;
use sut::lottery::error::StoreError;
use sut::lottery::ledger::Ledger;
use sut::lottery::log::{self, CoordLog, LogEntry, LogRecord, Verdict};
use sut::lottery::rows::{Account, BranchOutcome, FenceStatus, ParticipationRow, Stock};
use sut::lottery::rules::{self, BranchDecision, BranchOp, BranchView, BusinessRow};
use sut::lottery::store::LotteryStore;
use sut::lottery::{ActivityId, DrawArgs, Flaws, Participant, UserId, Xid};

use super::{PgConn, Tx, get_u64};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS lot_tcc_fence_log (
    xid BIGINT NOT NULL,
    branch BIGINT NOT NULL,
    status BIGINT NOT NULL CHECK (status BETWEEN 1 AND 4),
    PRIMARY KEY (xid, branch)
);
CREATE TABLE IF NOT EXISTS lot_account (
    user_id BIGINT PRIMARY KEY,
    balance BIGINT NOT NULL CHECK (balance >= 0),
    frozen BIGINT NOT NULL CHECK (frozen >= 0)
);
CREATE TABLE IF NOT EXISTS lot_house (
    id BIGINT PRIMARY KEY CHECK (id = 0),
    minted BIGINT NOT NULL CHECK (minted >= 0),
    collected BIGINT NOT NULL CHECK (collected >= 0)
);
INSERT INTO lot_house (id, minted, collected) VALUES (0, 0, 0) ON CONFLICT (id) DO NOTHING;
CREATE TABLE IF NOT EXISTS lot_stock (
    activity BIGINT PRIMARY KEY,
    total BIGINT NOT NULL CHECK (total >= 0),
    available BIGINT NOT NULL CHECK (available >= 0),
    reserved BIGINT NOT NULL CHECK (reserved >= 0),
    issued BIGINT NOT NULL CHECK (issued >= 0)
);
CREATE TABLE IF NOT EXISTS lot_participation (
    user_id BIGINT NOT NULL,
    activity BIGINT NOT NULL,
    xid BIGINT NOT NULL,
    price BIGINT NOT NULL CHECK (price >= 0),
    won BOOLEAN NOT NULL,
    confirmed BOOLEAN NOT NULL,
    PRIMARY KEY (user_id, activity)
);
CREATE TABLE IF NOT EXISTS lot_coord_log (
    xid BIGINT PRIMARY KEY,
    user_id BIGINT NOT NULL,
    activity BIGINT NOT NULL,
    price BIGINT NOT NULL CHECK (price >= 0),
    won BOOLEAN NOT NULL,
    verdict BIGINT
);
";

fn corrupt(what: &str) -> StoreError {
    StoreError::Backend {
        message: format!("corrupt row: {what}"),
    }
}

const fn id(v: u64) -> i64 {
    v.cast_signed()
}

const fn unid(v: i64) -> u64 {
    v.cast_unsigned()
}

fn amount(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::AmountTooLarge { amount_minor: v })
}

/// Column `index` of `row`, of any type PostgreSQL can give.
fn col<'r, T: tokio_postgres::types::FromSql<'r>>(
    row: &'r Row,
    index: usize,
    what: &str,
) -> Result<T, StoreError> {
    row.try_get(index).map_err(|e| StoreError::Backend {
        message: format!("column {what}: {e}"),
    })
}

/// Column `index` of `row` as an id (the bit pattern of the `BIGINT`).
fn col_id(row: &Row, index: usize, what: &str) -> Result<u64, StoreError> {
    Ok(unid(col::<i64>(row, index, what)?))
}

/// Column `index` of `row` as an amount (a negative value is a corrupt row).
fn col_amount(row: &Row, index: usize, what: &str) -> Result<u64, StoreError> {
    Ok(get_u64(row, index, what)?)
}

/// The PostgreSQL store: one connection, one serializable transaction per operation.
#[derive(Debug)]
pub struct PgLotteryStore {
    conn: PgConn,
}

impl PgLotteryStore {
    /// Connects to `url` (`postgres://user@host:port/db`) and creates the `lot_` tables if they
    /// are missing (several servers may open the same database at once).
    ///
    /// # Errors
    /// Connection or DDL failures.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Ok(Self {
            conn: PgConn::open(url, SCHEMA)?,
        })
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

fn read_fence(
    tx: &mut Tx<'_>,
    xid: Xid,
    branch: Participant,
) -> Result<Option<FenceStatus>, StoreError> {
    let row = tx.query_opt(
        "SELECT status FROM lot_tcc_fence_log WHERE xid = $1 AND branch = $2",
        &[&id(xid.0), &i64::from(branch.code())],
    )?;
    row.map(|r| {
        let code: i64 = col(&r, 0, "fence status")?;
        u8::try_from(code)
            .ok()
            .and_then(FenceStatus::from_code)
            .ok_or_else(|| corrupt("fence status"))
    })
    .transpose()
}

fn read_house(tx: &mut Tx<'_>) -> Result<(u64, u64), StoreError> {
    let row = tx
        .query_opt("SELECT minted, collected FROM lot_house WHERE id = 0", &[])?
        .ok_or_else(|| corrupt("house row missing"))?;
    Ok((
        col_amount(&row, 0, "minted")?,
        col_amount(&row, 1, "collected")?,
    ))
}

fn account_from(row: &Row, first: usize) -> Result<Account, StoreError> {
    Ok(Account {
        balance_minor: col_amount(row, first, "balance")?,
        frozen_minor: col_amount(row, first + 1, "frozen")?,
    })
}

fn read_account(tx: &mut Tx<'_>, user: UserId) -> Result<Option<Account>, StoreError> {
    tx.query_opt(
        "SELECT balance, frozen FROM lot_account WHERE user_id = $1",
        &[&id(user.0)],
    )?
    .map(|r| account_from(&r, 0))
    .transpose()
}

fn stock_from(row: &Row, first: usize) -> Result<Stock, StoreError> {
    Ok(Stock {
        total: col_amount(row, first, "stock total")?,
        available: col_amount(row, first + 1, "stock available")?,
        reserved: col_amount(row, first + 2, "stock reserved")?,
        issued: col_amount(row, first + 3, "stock issued")?,
    })
}

fn read_stock(tx: &mut Tx<'_>, activity: ActivityId) -> Result<Option<Stock>, StoreError> {
    tx.query_opt(
        "SELECT total, available, reserved, issued FROM lot_stock WHERE activity = $1",
        &[&id(activity.0)],
    )?
    .map(|r| stock_from(&r, 0))
    .transpose()
}

/// Columns `first..first + 4` of `row` (xid, price, won, confirmed) as a participation record.
fn participation_from(row: &Row, first: usize) -> Result<ParticipationRow, StoreError> {
    Ok(ParticipationRow {
        xid: Xid(col_id(row, first, "participation xid")?),
        price_minor: col_amount(row, first + 1, "participation price")?,
        won: col(row, first + 2, "participation won")?,
        confirmed: col(row, first + 3, "participation confirmed")?,
    })
}

fn read_participation(
    tx: &mut Tx<'_>,
    user: UserId,
    activity: ActivityId,
) -> Result<Option<ParticipationRow>, StoreError> {
    tx.query_opt(
        "SELECT xid, price, won, confirmed FROM lot_participation
         WHERE user_id = $1 AND activity = $2",
        &[&id(user.0), &id(activity.0)],
    )?
    .map(|r| participation_from(&r, 0))
    .transpose()
}

fn read_view(tx: &mut Tx<'_>, op: &BranchOp) -> Result<BranchView, StoreError> {
    let d = &op.draw;
    let business = match op.branch {
        Participant::Wallet => BusinessRow::Wallet {
            account: read_account(tx, d.user)?,
            collected_minor: read_house(tx)?.1,
        },
        Participant::Inventory => BusinessRow::Inventory {
            stock: read_stock(tx, d.activity)?,
        },
        Participant::Participation => BusinessRow::Participation {
            row: read_participation(tx, d.user, d.activity)?,
        },
    };
    Ok(BranchView {
        fence: read_fence(tx, d.xid, op.branch)?,
        business,
    })
}

fn write_account(tx: &mut Tx<'_>, user: UserId, a: &Account) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO lot_account (user_id, balance, frozen) VALUES ($1, $2, $3)
         ON CONFLICT (user_id) DO UPDATE SET balance = excluded.balance, frozen = excluded.frozen",
        &[
            &id(user.0),
            &amount(a.balance_minor)?,
            &amount(a.frozen_minor)?,
        ],
    )?;
    Ok(())
}

fn write_stock(tx: &mut Tx<'_>, activity: ActivityId, s: &Stock) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO lot_stock (activity, total, available, reserved, issued)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (activity) DO UPDATE SET total = excluded.total,
             available = excluded.available, reserved = excluded.reserved,
             issued = excluded.issued",
        &[
            &id(activity.0),
            &amount(s.total)?,
            &amount(s.available)?,
            &amount(s.reserved)?,
            &amount(s.issued)?,
        ],
    )?;
    Ok(())
}

fn write(tx: &mut Tx<'_>, op: &BranchOp, decision: &BranchDecision) -> Result<(), StoreError> {
    let d = &op.draw;
    if let Some(status) = decision.fence_write {
        tx.execute(
            "INSERT INTO lot_tcc_fence_log (xid, branch, status) VALUES ($1, $2, $3)
             ON CONFLICT (xid, branch) DO UPDATE SET status = excluded.status",
            &[
                &id(d.xid.0),
                &i64::from(op.branch.code()),
                &i64::from(status.code()),
            ],
        )?;
    }
    match &decision.business_write {
        None | Some(BusinessRow::Inventory { stock: None }) => {}
        Some(BusinessRow::Wallet {
            account,
            collected_minor,
        }) => {
            if let Some(account) = account {
                write_account(tx, d.user, account)?;
            }
            tx.execute(
                "UPDATE lot_house SET collected = $1 WHERE id = 0",
                &[&amount(*collected_minor)?],
            )?;
        }
        Some(BusinessRow::Inventory { stock: Some(stock) }) => write_stock(tx, d.activity, stock)?,
        Some(BusinessRow::Participation { row: Some(row) }) => {
            tx.execute(
                "INSERT INTO lot_participation (user_id, activity, xid, price, won, confirmed)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (user_id, activity) DO UPDATE SET xid = excluded.xid,
                     price = excluded.price, won = excluded.won, confirmed = excluded.confirmed",
                &[
                    &id(d.user.0),
                    &id(d.activity.0),
                    &id(row.xid.0),
                    &amount(row.price_minor)?,
                    &row.won,
                    &row.confirmed,
                ],
            )?;
        }
        Some(BusinessRow::Participation { row: None }) => {
            tx.execute(
                "DELETE FROM lot_participation WHERE user_id = $1 AND activity = $2",
                &[&id(d.user.0), &id(d.activity.0)],
            )?;
        }
    }
    Ok(())
}

const LOG_COLUMNS: &str = "SELECT xid, user_id, activity, price, won, verdict FROM lot_coord_log";

fn read_log_record(tx: &mut Tx<'_>, xid: Xid) -> Result<Option<LogRecord>, StoreError> {
    tx.query_opt(&format!("{LOG_COLUMNS} WHERE xid = $1"), &[&id(xid.0)])?
        .map(|r| log_record_from(&r))
        .transpose()
}

fn log_record_from(row: &Row) -> Result<LogRecord, StoreError> {
    let verdict = col::<Option<i64>>(row, 5, "verdict")?
        .map(|v| {
            u8::try_from(v)
                .ok()
                .and_then(Verdict::from_code)
                .ok_or_else(|| corrupt("verdict"))
        })
        .transpose()?;
    Ok(LogRecord {
        draw: DrawArgs {
            xid: Xid(col_id(row, 0, "log xid")?),
            user: UserId(col_id(row, 1, "log user")?),
            activity: ActivityId(col_id(row, 2, "log activity")?),
            price_minor: col_amount(row, 3, "log price")?,
            won: col(row, 4, "log won")?,
        },
        verdict,
    })
}

fn load_log(tx: &mut Tx<'_>) -> Result<CoordLog, StoreError> {
    let mut log = CoordLog::default();
    for row in tx.query(LOG_COLUMNS, &[])? {
        let record = log_record_from(&row)?;
        log.records.insert(record.draw.xid, record);
    }
    Ok(log)
}

impl LotteryStore for PgLotteryStore {
    fn open_account(&mut self, user: UserId, balance_minor: u64) -> Result<(), StoreError> {
        self.conn.transact(|tx| {
            let (minted, _) = read_house(tx)?;
            let (account, minted) =
                rules::open_account(read_account(tx, user)?, minted, user, balance_minor)?;
            write_account(tx, user, &account)?;
            tx.execute(
                "UPDATE lot_house SET minted = $1 WHERE id = 0",
                &[&amount(minted)?],
            )?;
            Ok(())
        })
    }

    fn add_stock(&mut self, activity: ActivityId, units: u64) -> Result<(), StoreError> {
        self.conn.transact(|tx| {
            let stock = rules::add_stock(read_stock(tx, activity)?, activity, units)?;
            write_stock(tx, activity, &stock)
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
            match log::apply_entry(read_log_record(tx, xid)?, entry)? {
                Some(r) => {
                    tx.execute(
                        "INSERT INTO lot_coord_log (xid, user_id, activity, price, won, verdict)
                         VALUES ($1, $2, $3, $4, $5, $6)
                         ON CONFLICT (xid) DO UPDATE SET verdict = excluded.verdict",
                        &[
                            &id(xid.0),
                            &id(r.draw.user.0),
                            &id(r.draw.activity.0),
                            &amount(r.draw.price_minor)?,
                            &r.draw.won,
                            &r.verdict.map(|v| i64::from(v.code())),
                        ],
                    )?;
                }
                None => {
                    tx.execute("DELETE FROM lot_coord_log WHERE xid = $1", &[&id(xid.0)])?;
                }
            }
            Ok(())
        })
    }

    fn log_load(&mut self) -> Result<CoordLog, StoreError> {
        self.conn.transact(load_log)
    }

    fn snapshot(&mut self) -> Result<Ledger, StoreError> {
        self.conn.transact(|tx| {
            let mut ledger = Ledger::default();
            (ledger.minted_minor, ledger.collected_minor) = read_house(tx)?;
            for row in tx.query("SELECT user_id, balance, frozen FROM lot_account", &[])? {
                let user = UserId(col_id(&row, 0, "account user")?);
                ledger.accounts.insert(user, account_from(&row, 1)?);
            }
            for row in tx.query(
                "SELECT activity, total, available, reserved, issued FROM lot_stock",
                &[],
            )? {
                let activity = ActivityId(col_id(&row, 0, "stock activity")?);
                ledger.stock.insert(activity, stock_from(&row, 1)?);
            }
            for row in tx.query(
                "SELECT user_id, activity, xid, price, won, confirmed FROM lot_participation",
                &[],
            )? {
                let key = (
                    UserId(col_id(&row, 0, "participation user")?),
                    ActivityId(col_id(&row, 1, "participation activity")?),
                );
                ledger
                    .participations
                    .insert(key, participation_from(&row, 2)?);
            }
            for row in tx.query("SELECT xid, branch, status FROM lot_tcc_fence_log", &[])? {
                let xid = Xid(col_id(&row, 0, "fence xid")?);
                let branch = u8::try_from(col::<i64>(&row, 1, "fence branch")?)
                    .ok()
                    .and_then(Participant::from_code)
                    .ok_or_else(|| corrupt("branch"))?;
                let status = u8::try_from(col::<i64>(&row, 2, "fence status")?)
                    .ok()
                    .and_then(FenceStatus::from_code)
                    .ok_or_else(|| corrupt("status"))?;
                ledger.fences.insert((xid, branch), status);
            }
            ledger.coord_log = load_log(tx)?;
            Ok(ledger)
        })
    }
}
