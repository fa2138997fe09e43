//! The PostgreSQL lottery store: [`SqlLotteryStore`] (the store written once for every database
//! server) on a [`PgConn`], with the rows read and written by PostgreSQL's SQL ([`LotteryRows`]).
//!
//! Ids are stored as the bit pattern of an `i64` (as in SQLite, so every `u64` id round-trips);
//! amounts are bounded by `AMOUNT_MAX` (`i64::MAX`) before they get here, and a negative value
//! read back is reported as a corrupt row, never wrapped.

use tokio_postgres::Row;

use sut::lottery::error::StoreError;
use sut::lottery::log::{LogRecord, Verdict};
use sut::lottery::rows::{Account, FenceStatus, ParticipationRow, Stock};
use sut::lottery::{ActivityId, DrawArgs, Participant, UserId, Xid};

use crate::sqldb::lottery::{
    Fences, LotteryRows, Participations, SqlLotteryStore, amount, corrupt, id, unid,
};

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

/// The PostgreSQL lottery store.
pub type PgLotteryStore = SqlLotteryStore<PgConn>;

impl SqlLotteryStore<PgConn> {
    /// Connects to `url` (`postgres://user@host:port/db`) and creates the `lot_` tables if they
    /// are missing (several servers may open the same database at once).
    ///
    /// # Errors
    /// Connection or DDL failures.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        Ok(Self::on(PgConn::open(url, SCHEMA)?))
    }
}

/// A fence status's code as stored.
fn fence_status(code: i64) -> Result<FenceStatus, StoreError> {
    u8::try_from(code)
        .ok()
        .and_then(FenceStatus::from_code)
        .ok_or_else(|| corrupt("fence status"))
}

fn account_from(row: &Row, first: usize) -> Result<Account, StoreError> {
    Ok(Account {
        balance_minor: col_amount(row, first, "balance")?,
        frozen_minor: col_amount(row, first + 1, "frozen")?,
    })
}

fn stock_from(row: &Row, first: usize) -> Result<Stock, StoreError> {
    Ok(Stock {
        total: col_amount(row, first, "stock total")?,
        available: col_amount(row, first + 1, "stock available")?,
        reserved: col_amount(row, first + 2, "stock reserved")?,
        issued: col_amount(row, first + 3, "stock issued")?,
    })
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

const LOG_COLUMNS: &str = "SELECT xid, user_id, activity, price, won, verdict FROM lot_coord_log";

impl LotteryRows for Tx<'_> {
    fn fence(&mut self, xid: Xid, branch: Participant) -> Result<Option<FenceStatus>, StoreError> {
        let row = self.query_opt(
            "SELECT status FROM lot_tcc_fence_log WHERE xid = $1 AND branch = $2",
            &[&id(xid.0), &i64::from(branch.code())],
        )?;
        row.map(|r| fence_status(col(&r, 0, "fence status")?))
            .transpose()
    }

    fn set_fence(
        &mut self,
        xid: Xid,
        branch: Participant,
        status: FenceStatus,
    ) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO lot_tcc_fence_log (xid, branch, status) VALUES ($1, $2, $3)
             ON CONFLICT (xid, branch) DO UPDATE SET status = excluded.status",
            &[
                &id(xid.0),
                &i64::from(branch.code()),
                &i64::from(status.code()),
            ],
        )?;
        Ok(())
    }

    fn house(&mut self) -> Result<(u64, u64), StoreError> {
        let row = self
            .query_opt("SELECT minted, collected FROM lot_house WHERE id = 0", &[])?
            .ok_or_else(|| corrupt("house row missing"))?;
        Ok((
            col_amount(&row, 0, "minted")?,
            col_amount(&row, 1, "collected")?,
        ))
    }

    fn set_minted(&mut self, minted_minor: u64) -> Result<(), StoreError> {
        self.execute(
            "UPDATE lot_house SET minted = $1 WHERE id = 0",
            &[&amount(minted_minor)?],
        )?;
        Ok(())
    }

    fn set_collected(&mut self, collected_minor: u64) -> Result<(), StoreError> {
        self.execute(
            "UPDATE lot_house SET collected = $1 WHERE id = 0",
            &[&amount(collected_minor)?],
        )?;
        Ok(())
    }

    fn account(&mut self, user: UserId) -> Result<Option<Account>, StoreError> {
        self.query_opt(
            "SELECT balance, frozen FROM lot_account WHERE user_id = $1",
            &[&id(user.0)],
        )?
        .map(|r| account_from(&r, 0))
        .transpose()
    }

    fn set_account(&mut self, user: UserId, a: &Account) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO lot_account (user_id, balance, frozen) VALUES ($1, $2, $3)
             ON CONFLICT (user_id) DO UPDATE SET balance = excluded.balance, frozen = excluded.frozen",
            &[&id(user.0), &amount(a.balance_minor)?, &amount(a.frozen_minor)?],
        )?;
        Ok(())
    }

    fn stock(&mut self, activity: ActivityId) -> Result<Option<Stock>, StoreError> {
        self.query_opt(
            "SELECT total, available, reserved, issued FROM lot_stock WHERE activity = $1",
            &[&id(activity.0)],
        )?
        .map(|r| stock_from(&r, 0))
        .transpose()
    }

    fn set_stock(&mut self, activity: ActivityId, s: &Stock) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO lot_stock (activity, total, available, reserved, issued) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (activity) DO UPDATE SET total = excluded.total, available = excluded.available, reserved = excluded.reserved, issued = excluded.issued",
            &[&id(activity.0), &amount(s.total)?, &amount(s.available)?, &amount(s.reserved)?, &amount(s.issued)?],
        )?;
        Ok(())
    }

    fn participation(
        &mut self,
        user: UserId,
        activity: ActivityId,
    ) -> Result<Option<ParticipationRow>, StoreError> {
        self.query_opt(
            "SELECT xid, price, won, confirmed FROM lot_participation WHERE user_id = $1 AND activity = $2",
            &[&id(user.0), &id(activity.0)],
        )?
        .map(|r| participation_from(&r, 0))
        .transpose()
    }

    fn set_participation(
        &mut self,
        user: UserId,
        activity: ActivityId,
        row: Option<&ParticipationRow>,
    ) -> Result<(), StoreError> {
        let Some(row) = row else {
            self.execute(
                "DELETE FROM lot_participation WHERE user_id = $1 AND activity = $2",
                &[&id(user.0), &id(activity.0)],
            )?;
            return Ok(());
        };
        self.execute(
            "INSERT INTO lot_participation (user_id, activity, xid, price, won, confirmed) VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (user_id, activity) DO UPDATE SET xid = excluded.xid, price = excluded.price, won = excluded.won, confirmed = excluded.confirmed",
            &[&id(user.0), &id(activity.0), &id(row.xid.0), &amount(row.price_minor)?, &row.won, &row.confirmed],
        )?;
        Ok(())
    }

    fn log_record(&mut self, xid: Xid) -> Result<Option<LogRecord>, StoreError> {
        let sql = format!("{LOG_COLUMNS} WHERE xid = $1");
        self.query_opt(&sql, &[&id(xid.0)])?
            .map(|r| log_record_from(&r))
            .transpose()
    }

    fn set_log_record(&mut self, xid: Xid, record: Option<&LogRecord>) -> Result<(), StoreError> {
        let Some(r) = record else {
            self.execute("DELETE FROM lot_coord_log WHERE xid = $1", &[&id(xid.0)])?;
            return Ok(());
        };
        self.execute(
            "INSERT INTO lot_coord_log (xid, user_id, activity, price, won, verdict) VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (xid) DO UPDATE SET verdict = excluded.verdict",
            &[&id(xid.0), &id(r.draw.user.0), &id(r.draw.activity.0), &amount(r.draw.price_minor)?, &r.draw.won, &r.verdict.map(|v| i64::from(v.code()))],
        )?;
        Ok(())
    }

    fn log_records(&mut self) -> Result<Vec<LogRecord>, StoreError> {
        self.query(LOG_COLUMNS, &[])?
            .iter()
            .map(log_record_from)
            .collect()
    }

    fn accounts(&mut self) -> Result<Vec<(UserId, Account)>, StoreError> {
        self.query("SELECT user_id, balance, frozen FROM lot_account", &[])?
            .iter()
            .map(|r| Ok((UserId(col_id(r, 0, "account user")?), account_from(r, 1)?)))
            .collect()
    }

    fn stocks(&mut self) -> Result<Vec<(ActivityId, Stock)>, StoreError> {
        self.query(
            "SELECT activity, total, available, reserved, issued FROM lot_stock",
            &[],
        )?
        .iter()
        .map(|r| {
            Ok((
                ActivityId(col_id(r, 0, "stock activity")?),
                stock_from(r, 1)?,
            ))
        })
        .collect()
    }

    fn participations(&mut self) -> Result<Participations, StoreError> {
        self.query(
            "SELECT user_id, activity, xid, price, won, confirmed FROM lot_participation",
            &[],
        )?
        .iter()
        .map(|r| {
            let key = (
                UserId(col_id(r, 0, "participation user")?),
                ActivityId(col_id(r, 1, "participation activity")?),
            );
            Ok((key, participation_from(r, 2)?))
        })
        .collect()
    }

    fn fences(&mut self) -> Result<Fences, StoreError> {
        self.query("SELECT xid, branch, status FROM lot_tcc_fence_log", &[])?
            .iter()
            .map(|r| {
                let xid = Xid(col_id(r, 0, "fence xid")?);
                let branch = u8::try_from(col::<i64>(r, 1, "fence branch")?)
                    .ok()
                    .and_then(Participant::from_code)
                    .ok_or_else(|| corrupt("branch"))?;
                Ok(((xid, branch), fence_status(col(r, 2, "fence status")?)?))
            })
            .collect()
    }
}
