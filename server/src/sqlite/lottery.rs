//! The SQLite lottery store (`rusqlite`, bundled SQLite): WAL journal, `synchronous=FULL`, and
//! every participant operation in ONE `BEGIN IMMEDIATE` transaction: read the fence row
//! (`tcc_fence_log`, Seata's table) and the business row, call [`rules::decide`], write both,
//! commit. The decision logic is the same function the in-memory store calls.
//!
//! Ids are stored as the bit pattern of an `i64`; amounts are bounded by `AMOUNT_MAX`
//! (`i64::MAX`) before they get here, and a negative or out-of-range value read back is reported
//! as a corrupt row, never wrapped.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use sut::edge::Edges;
use sut::lottery::error::StoreError;
use sut::lottery::ledger::Ledger;
use sut::lottery::log::{self, CoordLog, LogEntry, LogRecord, Verdict};
use sut::lottery::rows::{Account, BranchOutcome, FenceStatus, ParticipationRow, Stock};
use sut::lottery::rules::{self, BranchDecision, BranchOp, BranchView, BusinessRow};
use sut::lottery::store::LotteryStore;
use sut::lottery::{ActivityId, DrawArgs, Flaws, Participant, UserId, Xid};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS tcc_fence_log (
    xid INTEGER NOT NULL,
    branch INTEGER NOT NULL,
    status INTEGER NOT NULL CHECK (status BETWEEN 1 AND 4),
    PRIMARY KEY (xid, branch)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS account (
    user_id INTEGER PRIMARY KEY,
    balance INTEGER NOT NULL CHECK (balance >= 0),
    frozen INTEGER NOT NULL CHECK (frozen >= 0)
);
CREATE TABLE IF NOT EXISTS house (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    minted INTEGER NOT NULL CHECK (minted >= 0),
    collected INTEGER NOT NULL CHECK (collected >= 0)
);
INSERT OR IGNORE INTO house (id, minted, collected) VALUES (0, 0, 0);
CREATE TABLE IF NOT EXISTS stock (
    activity INTEGER PRIMARY KEY,
    total INTEGER NOT NULL CHECK (total >= 0),
    available INTEGER NOT NULL CHECK (available >= 0),
    reserved INTEGER NOT NULL CHECK (reserved >= 0),
    issued INTEGER NOT NULL CHECK (issued >= 0)
);
CREATE TABLE IF NOT EXISTS participation (
    user_id INTEGER NOT NULL,
    activity INTEGER NOT NULL,
    xid INTEGER NOT NULL,
    price INTEGER NOT NULL CHECK (price >= 0),
    won INTEGER NOT NULL,
    confirmed INTEGER NOT NULL,
    PRIMARY KEY (user_id, activity)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS coord_log (
    xid INTEGER PRIMARY KEY,
    user_id INTEGER NOT NULL,
    activity INTEGER NOT NULL,
    price INTEGER NOT NULL CHECK (price >= 0),
    won INTEGER NOT NULL,
    verdict INTEGER
);
";

/// A SQLite failure as the store's backend error.
fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend {
        message: e.to_string(),
    }
}

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

fn unamount(v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| corrupt(what))
}

/// The SQLite store.
#[derive(Debug)]
pub struct SqliteLotteryStore {
    conn: Connection,
}

impl SqliteLotteryStore {
    /// Opens (creating if needed) the database at `path`, in WAL mode with `synchronous=FULL`.
    ///
    /// # Errors
    /// Backend failures, or a journal mode other than WAL.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let conn = crate::db::open_private(path.as_ref())
            .map_err(|message| StoreError::Backend { message })?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
            .map_err(backend)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Backend {
                message: format!("journal_mode is {mode}, not wal"),
            });
        }
        Self::init(conn)
    }

    /// An in-memory database (no WAL possible; for quick tests only).
    ///
    /// # Errors
    /// Backend failures.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory().map_err(backend)?)
    }

    fn init(conn: Connection) -> Result<Self, StoreError> {
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(backend)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(backend)?;
        conn.execute_batch(SCHEMA).map_err(backend)?;
        Ok(Self { conn })
    }

    fn run(
        &mut self,
        op: &BranchOp,
        checked: Option<&BranchView>,
        flaws: Flaws,
    ) -> Result<BranchOutcome, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend)?;
        let fresh = read_view(&tx, op)?;
        let decision = rules::decide(
            op,
            checked.unwrap_or(&fresh),
            &fresh,
            flaws,
            &mut Edges::new(),
        );
        write(&tx, op, &decision)?;
        tx.commit().map_err(backend)?;
        Ok(decision.outcome)
    }
}

fn read_fence(
    conn: &Connection,
    xid: Xid,
    branch: Participant,
) -> Result<Option<FenceStatus>, StoreError> {
    let code: Option<i64> = conn
        .query_row(
            "SELECT status FROM tcc_fence_log WHERE xid = ?1 AND branch = ?2",
            params![id(xid.0), i64::from(branch.code())],
            |r| r.get(0),
        )
        .optional()
        .map_err(backend)?;
    code.map(|c| {
        u8::try_from(c)
            .ok()
            .and_then(FenceStatus::from_code)
            .ok_or_else(|| corrupt("fence status"))
    })
    .transpose()
}

fn read_house(conn: &Connection) -> Result<(u64, u64), StoreError> {
    let (minted, collected): (i64, i64) = conn
        .query_row(
            "SELECT minted, collected FROM house WHERE id = 0",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(backend)?;
    Ok((
        unamount(minted, "minted")?,
        unamount(collected, "collected")?,
    ))
}

fn read_account(conn: &Connection, user: UserId) -> Result<Option<Account>, StoreError> {
    let row: Option<(i64, i64)> = conn
        .query_row(
            "SELECT balance, frozen FROM account WHERE user_id = ?1",
            params![id(user.0)],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(backend)?;
    row.map(|(b, f)| {
        Ok(Account {
            balance_minor: unamount(b, "balance")?,
            frozen_minor: unamount(f, "frozen")?,
        })
    })
    .transpose()
}

fn read_stock(conn: &Connection, activity: ActivityId) -> Result<Option<Stock>, StoreError> {
    let row: Option<[i64; 4]> = conn
        .query_row(
            "SELECT total, available, reserved, issued FROM stock WHERE activity = ?1",
            params![id(activity.0)],
            |r| Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?]),
        )
        .optional()
        .map_err(backend)?;
    row.map(stock_from).transpose()
}

fn stock_from([t, a, r, i]: [i64; 4]) -> Result<Stock, StoreError> {
    Ok(Stock {
        total: unamount(t, "stock total")?,
        available: unamount(a, "stock available")?,
        reserved: unamount(r, "stock reserved")?,
        issued: unamount(i, "stock issued")?,
    })
}

fn participation_from(
    xid: i64,
    price: i64,
    won: bool,
    confirmed: bool,
) -> Result<ParticipationRow, StoreError> {
    Ok(ParticipationRow {
        xid: Xid(unid(xid)),
        price_minor: unamount(price, "participation price")?,
        won,
        confirmed,
    })
}

fn read_participation(
    conn: &Connection,
    user: UserId,
    activity: ActivityId,
) -> Result<Option<ParticipationRow>, StoreError> {
    let row: Option<(i64, i64, bool, bool)> = conn
        .query_row(
            "SELECT xid, price, won, confirmed FROM participation WHERE user_id = ?1 AND activity = ?2",
            params![id(user.0), id(activity.0)],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional().map_err(backend)?;
    row.map(|(x, p, w, c)| participation_from(x, p, w, c))
        .transpose()
}

fn read_view(conn: &Connection, op: &BranchOp) -> Result<BranchView, StoreError> {
    let d = &op.draw;
    let business = match op.branch {
        Participant::Wallet => BusinessRow::Wallet {
            account: read_account(conn, d.user)?,
            collected_minor: read_house(conn)?.1,
        },
        Participant::Inventory => BusinessRow::Inventory {
            stock: read_stock(conn, d.activity)?,
        },
        Participant::Participation => BusinessRow::Participation {
            row: read_participation(conn, d.user, d.activity)?,
        },
    };
    Ok(BranchView {
        fence: read_fence(conn, d.xid, op.branch)?,
        business,
    })
}

fn write_account(conn: &Connection, user: UserId, a: &Account) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO account (user_id, balance, frozen) VALUES (?1, ?2, ?3)
         ON CONFLICT (user_id) DO UPDATE SET balance = excluded.balance, frozen = excluded.frozen",
        params![
            id(user.0),
            amount(a.balance_minor)?,
            amount(a.frozen_minor)?
        ],
    )
    .map_err(backend)?;
    Ok(())
}

fn write_stock(conn: &Connection, activity: ActivityId, s: &Stock) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO stock (activity, total, available, reserved, issued) VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (activity) DO UPDATE SET total = excluded.total, available = excluded.available,
             reserved = excluded.reserved, issued = excluded.issued",
        params![id(activity.0), amount(s.total)?, amount(s.available)?, amount(s.reserved)?, amount(s.issued)?],
    ).map_err(backend)?;
    Ok(())
}

fn write(conn: &Connection, op: &BranchOp, decision: &BranchDecision) -> Result<(), StoreError> {
    let d = &op.draw;
    if let Some(status) = decision.fence_write {
        conn.execute(
            "INSERT INTO tcc_fence_log (xid, branch, status) VALUES (?1, ?2, ?3)
             ON CONFLICT (xid, branch) DO UPDATE SET status = excluded.status",
            params![
                id(d.xid.0),
                i64::from(op.branch.code()),
                i64::from(status.code())
            ],
        )
        .map_err(backend)?;
    }
    match &decision.business_write {
        None => {}
        Some(BusinessRow::Wallet {
            account,
            collected_minor,
        }) => {
            if let Some(account) = account {
                write_account(conn, d.user, account)?;
            }
            conn.execute(
                "UPDATE house SET collected = ?1 WHERE id = 0",
                params![amount(*collected_minor)?],
            )
            .map_err(backend)?;
        }
        Some(BusinessRow::Inventory { stock: Some(stock) }) => {
            write_stock(conn, d.activity, stock)?
        }
        Some(BusinessRow::Inventory { stock: None }) => {}
        Some(BusinessRow::Participation { row: Some(row) }) => {
            conn.execute(
                "INSERT INTO participation (user_id, activity, xid, price, won, confirmed)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (user_id, activity) DO UPDATE SET xid = excluded.xid, price = excluded.price,
                     won = excluded.won, confirmed = excluded.confirmed",
                params![id(d.user.0), id(d.activity.0), id(row.xid.0), amount(row.price_minor)?, row.won, row.confirmed],
            ).map_err(backend)?;
        }
        Some(BusinessRow::Participation { row: None }) => {
            conn.execute(
                "DELETE FROM participation WHERE user_id = ?1 AND activity = ?2",
                params![id(d.user.0), id(d.activity.0)],
            )
            .map_err(backend)?;
        }
    }
    Ok(())
}

fn read_log_record(conn: &Connection, xid: Xid) -> Result<Option<LogRecord>, StoreError> {
    let row: Option<(i64, i64, i64, i64, bool, Option<i64>)> = conn
        .query_row(
            "SELECT xid, user_id, activity, price, won, verdict FROM coord_log WHERE xid = ?1",
            params![id(xid.0)],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .optional()
        .map_err(backend)?;
    row.map(log_record_from).transpose()
}

fn log_record_from(
    (xid, user, activity, price, won, verdict): (i64, i64, i64, i64, bool, Option<i64>),
) -> Result<LogRecord, StoreError> {
    let verdict = verdict
        .map(|v| {
            u8::try_from(v)
                .ok()
                .and_then(Verdict::from_code)
                .ok_or_else(|| corrupt("verdict"))
        })
        .transpose()?;
    Ok(LogRecord {
        draw: DrawArgs {
            xid: Xid(unid(xid)),
            user: UserId(unid(user)),
            activity: ActivityId(unid(activity)),
            price_minor: unamount(price, "log price")?,
            won,
        },
        verdict,
    })
}

impl LotteryStore for SqliteLotteryStore {
    fn open_account(&mut self, user: UserId, balance_minor: u64) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend)?;
        let (minted, _) = read_house(&tx)?;
        let (account, minted) =
            rules::open_account(read_account(&tx, user)?, minted, user, balance_minor)?;
        write_account(&tx, user, &account)?;
        tx.execute(
            "UPDATE house SET minted = ?1 WHERE id = 0",
            params![amount(minted)?],
        )
        .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(())
    }

    fn add_stock(&mut self, activity: ActivityId, units: u64) -> Result<(), StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend)?;
        let stock = rules::add_stock(read_stock(&tx, activity)?, activity, units)?;
        write_stock(&tx, activity, &stock)?;
        tx.commit().map_err(backend)?;
        Ok(())
    }

    fn execute(&mut self, op: &BranchOp, flaws: Flaws) -> Result<BranchOutcome, StoreError> {
        self.run(op, None, flaws)
    }

    fn read_branch(&mut self, op: &BranchOp) -> Result<BranchView, StoreError> {
        let tx = self.conn.transaction().map_err(backend)?;
        let view = read_view(&tx, op)?;
        tx.commit().map_err(backend)?;
        Ok(view)
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
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(backend)?;
        let xid = entry.xid();
        match log::apply_entry(read_log_record(&tx, xid)?, entry)? {
            Some(r) => {
                tx.execute(
                    "INSERT INTO coord_log (xid, user_id, activity, price, won, verdict)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (xid) DO UPDATE SET verdict = excluded.verdict",
                    params![
                        id(xid.0),
                        id(r.draw.user.0),
                        id(r.draw.activity.0),
                        amount(r.draw.price_minor)?,
                        r.draw.won,
                        r.verdict.map(|v| i64::from(v.code()))
                    ],
                )
                .map_err(backend)?;
            }
            None => {
                tx.execute("DELETE FROM coord_log WHERE xid = ?1", params![id(xid.0)])
                    .map_err(backend)?;
            }
        }
        tx.commit().map_err(backend)?;
        Ok(())
    }

    fn log_load(&mut self) -> Result<CoordLog, StoreError> {
        let tx = self.conn.transaction().map_err(backend)?;
        let log = load_log(&tx)?;
        tx.commit().map_err(backend)?;
        Ok(log)
    }

    fn snapshot(&mut self) -> Result<Ledger, StoreError> {
        let tx = self.conn.transaction().map_err(backend)?;
        let mut ledger = Ledger::default();
        (ledger.minted_minor, ledger.collected_minor) = read_house(&tx)?;
        snapshot_accounts(&tx, &mut ledger)?;
        snapshot_stock(&tx, &mut ledger)?;
        snapshot_participations(&tx, &mut ledger)?;
        snapshot_fences(&tx, &mut ledger)?;
        ledger.coord_log = load_log(&tx)?;
        tx.commit().map_err(backend)?;
        Ok(ledger)
    }
}

/// Every `account` row into the ledger.
fn snapshot_accounts(conn: &Connection, ledger: &mut Ledger) -> Result<(), StoreError> {
    let mut st = conn
        .prepare("SELECT user_id, balance, frozen FROM account")
        .map_err(backend)?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .map_err(backend)?;
    for row in rows {
        let (u, b, f) = row.map_err(backend)?;
        let account = Account {
            balance_minor: unamount(b, "balance")?,
            frozen_minor: unamount(f, "frozen")?,
        };
        ledger.accounts.insert(UserId(unid(u)), account);
    }
    Ok(())
}

/// Every `stock` row into the ledger.
fn snapshot_stock(conn: &Connection, ledger: &mut Ledger) -> Result<(), StoreError> {
    let mut st = conn
        .prepare("SELECT activity, total, available, reserved, issued FROM stock")
        .map_err(backend)?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                [r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?],
            ))
        })
        .map_err(backend)?;
    for row in rows {
        let (a, s) = row.map_err(backend)?;
        ledger.stock.insert(ActivityId(unid(a)), stock_from(s)?);
    }
    Ok(())
}

/// Every `participation` row into the ledger.
fn snapshot_participations(conn: &Connection, ledger: &mut Ledger) -> Result<(), StoreError> {
    let mut st = conn
        .prepare("SELECT user_id, activity, xid, price, won, confirmed FROM participation")
        .map_err(backend)?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, bool>(4)?,
                r.get::<_, bool>(5)?,
            ))
        })
        .map_err(backend)?;
    for row in rows {
        let (u, a, x, p, w, c) = row.map_err(backend)?;
        ledger.participations.insert(
            (UserId(unid(u)), ActivityId(unid(a))),
            participation_from(x, p, w, c)?,
        );
    }
    Ok(())
}

/// Every `tcc_fence_log` row into the ledger.
fn snapshot_fences(conn: &Connection, ledger: &mut Ledger) -> Result<(), StoreError> {
    let mut st = conn
        .prepare("SELECT xid, branch, status FROM tcc_fence_log")
        .map_err(backend)?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .map_err(backend)?;
    for row in rows {
        let (x, b, s) = row.map_err(backend)?;
        let branch = u8::try_from(b)
            .ok()
            .and_then(Participant::from_code)
            .ok_or_else(|| corrupt("branch"))?;
        let status = u8::try_from(s)
            .ok()
            .and_then(FenceStatus::from_code)
            .ok_or_else(|| corrupt("status"))?;
        ledger.fences.insert((Xid(unid(x)), branch), status);
    }
    Ok(())
}

fn load_log(conn: &Connection) -> Result<CoordLog, StoreError> {
    let mut log = CoordLog::default();
    let mut st = conn
        .prepare("SELECT xid, user_id, activity, price, won, verdict FROM coord_log")
        .map_err(backend)?;
    let rows = st
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .map_err(backend)?;
    for row in rows {
        let record = log_record_from(row.map_err(backend)?)?;
        log.records.insert(record.draw.xid, record);
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_in_wal_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lottery.db");
        {
            let mut s = SqliteLotteryStore::open(&path).unwrap();
            s.open_account(UserId(u64::MAX), 100).unwrap();
            s.add_stock(ActivityId(1), 2).unwrap();
            s.log_append(&LogEntry::Begin(DrawArgs {
                xid: Xid(u64::MAX - 1),
                user: UserId(u64::MAX),
                activity: ActivityId(1),
                price_minor: 10,
                won: true,
            }))
            .unwrap();
        }
        let mut s = SqliteLotteryStore::open(&path).unwrap();
        let mode: String = s
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = s
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "synchronous=FULL");
        let ledger = s.snapshot().unwrap();
        assert_eq!(ledger.accounts[&UserId(u64::MAX)].balance_minor, 100);
        assert_eq!(ledger.minted_minor, 100);
        assert_eq!(ledger.stock[&ActivityId(1)].available, 2);
        assert!(ledger.coord_log.records.contains_key(&Xid(u64::MAX - 1)));
        assert_eq!(
            s.open_account(UserId(u64::MAX), 1),
            Err(StoreError::AccountExists {
                user: UserId(u64::MAX)
            })
        );
    }
}

#[cfg(test)]
pub(crate) mod conformance;
#[cfg(test)]
mod driver;
#[cfg(test)]
mod fence_anomalies;
