//! The MariaDB (and MySQL) stores of the real server (`--db mysql://USER@HOST:PORT/DB`): the
//! database Leaf and Tinyid keep their segments in. They are the stores of [`crate::sqldb`]
//! (the same as on PostgreSQL, each implementing the same `sut` store trait as its SQLite twin)
//! on a [`MyConn`], with MariaDB's SQL for their rows; the conformance property tests run them
//! against the memory stores.
//!
//! Concurrency control is InnoDB's:
//!
//! - **Every domain operation is one `SERIALIZABLE` transaction.** InnoDB makes every plain
//!   read of such a transaction a locking read (shared next-key locks, gaps included), so two
//!   servers that read the same row and then write it deadlock; InnoDB rolls one back (error
//!   1213) and the store runs it again from the start, when it reads the other's committed
//!   row. A lock waited for longer than [`LOCK_WAIT_S`] fails the operation (error 1205; the
//!   holder may be a server that is stalled, and a request must not wait on it for long).
//! - Under it, the statements keep their own guards, as on PostgreSQL: the tag row's version in
//!   the allocation's `UPDATE … WHERE version = ?`, primary keys on fences, one-time tokens and
//!   segment leases.
//!
//! Durability is checked, not assumed: a connection refuses a server whose commits are not
//! synced (`innodb_flush_log_at_trx_commit` other than 1, or the binary log on with
//! `sync_binlog` other than 1: a commit whose binlog event is lost in a crash is rolled back
//! by recovery), as the PostgreSQL stores refuse `fsync` off.
//!
//! Each session runs with `ANSI_QUOTES` (so `"end"` and `"key"` are identifiers, as on
//! PostgreSQL), strict mode (a value that does not fit is an error, never truncated), affected
//! rows counted as matched rows (`CLIENT_FOUND_ROWS`, as PostgreSQL counts them), and
//! `idle_transaction_timeout` (MariaDB: a session of a server that stopped in the middle of a
//! transaction is ended, and its locks released, after [`IDLE_TRANSACTION_S`]).
//!
//! The driver is `mysql_async` (pure Rust), blocked on from the calling thread with the I/O on
//! the runtime of [`crate::sqldb::io_runtime`], as the PostgreSQL stores do.

mod ids;
mod journal;
mod lottery;
mod tokens;

pub use ids::MyIdStore;
pub use journal::MyJournal;
pub use lottery::MyLotteryStore;
pub use tokens::MyTokenStore;

use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{Conn, Opts, OptsBuilder, Params, Row, Value};

use crate::sqldb::{Attempt, DbError};

/// How long a statement waits for a row lock before the operation fails (seconds).
pub const LOCK_WAIT_S: u32 = 5;
/// How long a session may sit in an open transaction without a statement before MariaDB ends
/// it (seconds).
pub const IDLE_TRANSACTION_S: u32 = 30;

/// InnoDB chose this transaction as a deadlock victim and rolled it back.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// A row read under a consistent snapshot changed before the write (MariaDB's
/// `innodb_snapshot_isolation`): the transaction may be retried.
const ER_CHECKREAD: u16 = 1020;
/// The server is shutting down, or the session was killed: the connection is gone.
const ER_SERVER_SHUTDOWN: u16 = 1053;
const ER_CONNECTION_KILLED: u16 = 1927;
/// An unknown system variable (a MySQL without MariaDB's `idle_transaction_timeout`).
const ER_UNKNOWN_SYSTEM_VARIABLE: u16 = 1193;

impl From<mysql_async::Error> for DbError {
    fn from(e: mysql_async::Error) -> Self {
        match &e {
            mysql_async::Error::Server(server) => Self {
                message: format!("mysql: {} ({})", server.message, server.code),
                retryable: matches!(server.code, ER_LOCK_DEADLOCK | ER_CHECKREAD),
                connection_lost: matches!(server.code, ER_SERVER_SHUTDOWN | ER_CONNECTION_KILLED),
            },
            // An I/O or protocol failure leaves the connection in an unknown state.
            _ => Self {
                message: format!("mysql: {e}"),
                retryable: false,
                connection_lost: e.is_fatal(),
            },
        }
    }
}

/// [`crate::sqldb::block`] for MariaDB.
fn block<T, E: Into<DbError>>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, DbError> {
    crate::sqldb::block("mysql", what, fut)
}

/// The connection options of `url`: over TCP even to a local server (a fault proxy in front of
/// the database must see every byte), matched rows counted, statements cached.
///
/// # Errors
/// Not a MySQL URL (the message names it, without its password).
pub fn opts(url: &str) -> Result<Opts, DbError> {
    let opts = Opts::from_url(url)
        .map_err(|e| DbError::fatal(format!("bad MySQL URL `{}`: {e}", crate::db::redact(url))))?;
    Ok(OptsBuilder::from_opts(opts)
        .prefer_socket(false)
        .client_found_rows(true)
        .stmt_cache_size(256)
        .tcp_nodelay(true)
        .into())
}

/// Creates database `name` on the server of `url` (tests and the deployment give each store
/// its own database). An existing database is kept.
///
/// # Errors
/// Connection failures, a bad name.
pub fn create_database(url: &str, name: &str) -> Result<(), DbError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(DbError::fatal(format!(
            "database name `{name}`: use letters, digits and `_`"
        )));
    }
    let bare: Opts = OptsBuilder::from_opts(opts(url)?)
        .db_name(None::<String>)
        .into();
    let mut conn = block("a connect", Conn::new(bare))?;
    let created = block(
        "CREATE DATABASE",
        conn.query_drop(format!("CREATE DATABASE IF NOT EXISTS {name}")),
    );
    disconnect(conn);
    created
}

/// Closes `conn` politely when it answers at once, else just drops it.
fn disconnect(conn: Conn) {
    let _context = crate::sqldb::io_runtime().enter();
    drop(futures_executor::block_on(tokio::time::timeout(
        std::time::Duration::from_millis(200),
        conn.disconnect(),
    )));
}

/// One store's connection: reconnects when lost, runs serializable transactions with retries.
pub struct MyConn {
    url: String,
    opts: Opts,
    conn: Option<Conn>,
    /// A named lock (`GET_LOCK`) taken on every (re)connect: the connection is this process's
    /// claim to the database (see [`MyConn::claim`]).
    claim: Option<String>,
    /// A transaction was begun and not yet ended: set when an attempt begins, cleared when it
    /// commits or rolls back. Still set at the next operation means an attempt unwound (a
    /// panic) with its transaction open; the next `START TRANSACTION` would commit it, so the
    /// connection is given up instead (the server rolls back the transaction of a session that
    /// ends).
    open_tx: bool,
}

impl std::fmt::Debug for MyConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MyConn")
            .field("url", &crate::db::redact(&self.url))
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for MyConn {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            disconnect(conn);
        }
    }
}

impl MyConn {
    /// Connects to `url` and runs `schema` (idempotent DDL, statements separated by `;` at the
    /// end of a line).
    ///
    /// # Errors
    /// Connection or DDL failures.
    pub fn open(url: &str, schema: &str) -> Result<Self, DbError> {
        let mut conn = Self {
            url: url.to_owned(),
            opts: opts(url)?,
            conn: None,
            claim: None,
            open_tx: false,
        };
        for statement in schema.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
            conn.batch(statement)?;
        }
        Ok(conn)
    }

    /// Claims the database for this connection alone: takes the named lock `name` (within
    /// this database) now and again after every reconnect, and fails while another session
    /// holds it (a second process writing the same journal would interleave its records with
    /// this one's).
    ///
    /// # Errors
    /// Another session holds the lock, or a database failure.
    pub fn claim(&mut self, name: &str) -> Result<(), DbError> {
        self.claim = Some(name.to_owned());
        self.drop_connection();
        self.ensure_connected()
    }

    /// The URL it connects to.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    fn ensure_connected(&mut self) -> Result<(), DbError> {
        if self.open_tx {
            self.drop_connection();
            self.open_tx = false;
        }
        if self.conn.is_some() {
            return Ok(());
        }
        let mut conn = block("a connect", Conn::new(self.opts.clone()))?;
        match self.set_up(&mut conn) {
            Ok(()) => {
                self.conn = Some(conn);
                Ok(())
            }
            Err(e) => {
                disconnect(conn);
                Err(e)
            }
        }
    }

    /// The session's settings, the durability check and the claim.
    fn set_up(&self, conn: &mut Conn) -> Result<(), DbError> {
        let settings = [
            "SET SESSION sql_mode = 'ANSI_QUOTES,STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'"
                .to_owned(),
            "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE".to_owned(),
            format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}"),
        ];
        for sql in settings {
            block("the session settings", conn.query_drop(sql))?;
        }
        let idle = format!("SET SESSION idle_transaction_timeout = {IDLE_TRANSACTION_S}");
        match block("the session settings", conn.query_drop(idle)) {
            Err(e)
                if e.message
                    .contains(&format!("({ER_UNKNOWN_SYSTEM_VARIABLE})")) => {}
            other => other?,
        }
        check_durable(conn)?;
        if let Some(name) = &self.claim {
            let sql = "SELECT GET_LOCK(CONCAT(DATABASE(), ':', ?), 0)";
            let got: Option<Option<i64>> =
                block("the claim", conn.exec_first(sql, (name.as_str(),)))?;
            if got.flatten() != Some(1) {
                return Err(DbError::fatal(format!(
                    "the database is claimed by another process (lock `{name}`): one writer \
                     per journal"
                )));
            }
        }
        Ok(())
    }

    /// Gives the connection up (the next operation opens a new one).
    fn drop_connection(&mut self) {
        if let Some(conn) = self.conn.take() {
            disconnect(conn);
        }
    }

    /// Runs one statement outside a transaction (schema).
    ///
    /// # Errors
    /// Database failures.
    pub fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        self.ensure_connected()?;
        let conn = self.conn.as_mut().expect("connected just above");
        let done = block("a batch", conn.query_drop(sql));
        self.forget_if_lost(done)
    }

    /// Runs one statement as its own transaction (autocommit: durable when this returns, on a
    /// server that syncs every commit); for a statement whose result does not depend on what it
    /// reads (an append), where isolation cannot matter. The rows it changed.
    ///
    /// # Errors
    /// Database failures (not retried).
    pub fn execute_alone(&mut self, sql: &str, params: Vec<Value>) -> Result<u64, DbError> {
        self.ensure_connected()?;
        let conn = self.conn.as_mut().expect("connected just above");
        let done = block("a statement", async {
            conn.exec_drop(sql, Params::Positional(params)).await?;
            Ok::<_, mysql_async::Error>(conn.affected_rows())
        });
        self.forget_if_lost(done)
    }

    fn forget_if_lost<T>(&mut self, done: Result<T, DbError>) -> Result<T, DbError> {
        if done.as_ref().is_err_and(|e| e.connection_lost) {
            self.drop_connection();
        }
        done
    }

    /// Runs `op` in one SERIALIZABLE transaction, committing when it returns `Ok`; retries the
    /// whole of it (with a short growing pause) after a deadlock.
    ///
    /// # Errors
    /// `op`'s error (the transaction rolled back), or a database failure.
    pub fn transact<T, E: From<DbError>>(
        &mut self,
        op: impl FnMut(&mut MyTx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.transact_tries(crate::sqldb::TX_ATTEMPTS_MAX, op)
    }

    /// [`MyConn::transact`], giving up after `tries` attempts.
    ///
    /// # Errors
    /// As [`MyConn::transact`].
    pub fn transact_tries<T, E: From<DbError>>(
        &mut self,
        tries: u32,
        mut op: impl FnMut(&mut MyTx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        crate::sqldb::retrying_up_to(tries, || {
            let (outcome, lost) = self.attempt(&mut op);
            self.open_tx = false;
            if lost {
                self.drop_connection();
            }
            outcome
        })
    }

    /// One try of `op`; also whether the connection was lost on the way.
    fn attempt<T, E: From<DbError>>(
        &mut self,
        op: &mut impl FnMut(&mut MyTx<'_>) -> Result<T, E>,
    ) -> (Attempt<T, E>, bool) {
        if let Err(e) = self.ensure_connected() {
            return (Attempt::Done(Err(e.into())), false);
        }
        self.open_tx = true;
        let conn = self.conn.as_mut().expect("connected just above");
        if let Err(e) = block("a BEGIN", conn.query_drop("START TRANSACTION")) {
            let lost = e.connection_lost;
            return (Attempt::Done(Err(e.into())), lost);
        }
        let mut tx = MyTx {
            conn,
            retryable: None,
            lost: false,
        };
        let result = op(&mut tx);
        if let Some(e) = tx.retryable.take() {
            let lost = tx.lost || rollback(tx.conn);
            return (Attempt::Retry(e), lost);
        }
        let lost = tx.lost;
        match result {
            Ok(value) => match block("a COMMIT", tx.conn.query_drop("COMMIT")) {
                Ok(()) => (Attempt::Done(Ok(value)), lost),
                Err(e) if e.retryable => {
                    let lost = lost || rollback(tx.conn);
                    (Attempt::Retry(e), lost)
                }
                Err(e) => {
                    let lost = lost || e.connection_lost;
                    (Attempt::Done(Err(e.into())), lost)
                }
            },
            Err(e) => {
                let lost = lost || rollback(tx.conn);
                (Attempt::Done(Err(e)), lost)
            }
        }
    }
}

impl crate::sqldb::SqlConn for MyConn {
    type Tx<'t> = MyTx<'t>;

    fn transact_tries<T, E: From<DbError>>(
        &mut self,
        tries: u32,
        op: impl FnMut(&mut MyTx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        Self::transact_tries(self, tries, op)
    }
}

/// Rolls the open transaction back; whether the connection was lost doing it.
fn rollback(conn: &mut Conn) -> bool {
    block("a ROLLBACK", conn.query_drop("ROLLBACK")).is_err()
}

/// Refuses a server whose acknowledged commits a crash can take back.
fn check_durable(conn: &mut Conn) -> Result<(), DbError> {
    let sql = "SELECT @@global.innodb_flush_log_at_trx_commit, @@global.log_bin, \
               @@global.sync_binlog";
    let row: Option<(i64, i64, i64)> = block("the durability settings", conn.query_first(sql))?;
    let (flush, log_bin, sync_binlog) =
        row.ok_or_else(|| DbError::fatal("mysql: no durability settings"))?;
    if flush != 1 || (log_bin == 1 && sync_binlog != 1) {
        return Err(DbError::fatal(format!(
            "MariaDB durability is off (innodb_flush_log_at_trx_commit {flush}, log_bin \
             {log_bin}, sync_binlog {sync_binlog}): an acknowledged commit could be lost in a \
             crash; run it with innodb_flush_log_at_trx_commit=1 (and sync_binlog=1 with the \
             binary log on)"
        )));
    }
    Ok(())
}

/// A transaction in progress: blocking statements. A deadlock is remembered, so that
/// [`MyConn::transact`] retries whatever error `op` turned it into.
pub struct MyTx<'c> {
    conn: &'c mut Conn,
    retryable: Option<DbError>,
    /// A call found the connection lost (the store gives it up once the transaction is over).
    lost: bool,
}

impl std::fmt::Debug for MyTx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MyTx").finish_non_exhaustive()
    }
}

impl MyTx<'_> {
    fn note(&mut self, e: DbError) -> DbError {
        self.lost |= e.connection_lost;
        if e.retryable && self.retryable.is_none() {
            self.retryable = Some(e.clone());
        }
        e
    }

    /// Runs a statement; returns the rows it matched.
    ///
    /// # Errors
    /// Database failures.
    pub fn execute(&mut self, sql: &str, params: Vec<Value>) -> Result<u64, DbError> {
        let conn = &mut *self.conn;
        block("a statement", async {
            conn.exec_drop(sql, Params::Positional(params)).await?;
            Ok::<_, mysql_async::Error>(conn.affected_rows())
        })
        .map_err(|e| self.note(e))
    }

    /// Runs a query; returns its rows.
    ///
    /// # Errors
    /// Database failures.
    pub fn query(&mut self, sql: &str, params: Vec<Value>) -> Result<Vec<Row>, DbError> {
        block(
            "a query",
            self.conn.exec::<Row, _, _>(sql, Params::Positional(params)),
        )
        .map_err(|e| self.note(e))
    }

    /// Runs a query of at most one row.
    ///
    /// # Errors
    /// Database failures, more than one row.
    pub fn query_opt(&mut self, sql: &str, params: Vec<Value>) -> Result<Option<Row>, DbError> {
        let mut rows = self.query(sql, params)?;
        if rows.len() > 1 {
            return Err(DbError::fatal(format!(
                "mysql: {} rows where at most one was expected",
                rows.len()
            )));
        }
        Ok(rows.pop())
    }
}

/// The parameters of a statement, each converted to a MySQL value.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        vec![$(::mysql_async::Value::from($value)),*]
    };
}
pub(crate) use params;

/// Column `index` of `row`, of any type the driver converts to.
///
/// # Errors
/// A missing column or a value of another type.
pub fn col<T: FromValue>(row: &Row, index: usize, what: &str) -> Result<T, DbError> {
    row.get_opt::<T, usize>(index)
        .ok_or_else(|| DbError::fatal(format!("column {what}: missing")))?
        .map_err(|e| DbError::fatal(format!("column {what}: {e}")))
}

/// Column `index` of `row` as a `u64` (a negative value is a corrupt row).
///
/// # Errors
/// A wrong type or a negative value.
pub fn get_u64(row: &Row, index: usize, what: &str) -> Result<u64, DbError> {
    crate::sqldb::from_sql(col::<i64>(row, index, what)?, what)
}

/// Column `index` of `row` as text (stored as bytes: a `VARBINARY` compares and sorts byte by
/// byte, as the other stores do).
///
/// # Errors
/// A wrong type or bytes that are not UTF-8.
pub fn get_text(row: &Row, index: usize, what: &str) -> Result<String, DbError> {
    let bytes: Vec<u8> = col(row, index, what)?;
    String::from_utf8(bytes).map_err(|_| DbError::fatal(format!("column {what}: not UTF-8")))
}

/// Column `index` of `row` as optional text.
///
/// # Errors
/// A wrong type or bytes that are not UTF-8.
pub fn get_opt_text(row: &Row, index: usize, what: &str) -> Result<Option<String>, DbError> {
    let bytes: Option<Vec<u8>> = col(row, index, what)?;
    bytes
        .map(|b| {
            String::from_utf8(b).map_err(|_| DbError::fatal(format!("column {what}: not UTF-8")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use chaos::{MariaDb, MariaDbSpec};
    use sut::id_store::{CounterDurability, IdStore, TagSpec};

    use super::*;
    use crate::sqldb::url_with_database;

    /// A server that does not sync every commit is refused, naming the setting; one that does
    /// is taken.
    #[test]
    #[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
    fn a_server_that_does_not_sync_every_commit_is_refused() {
        for (spec, refused) in [
            (
                MariaDbSpec {
                    flush_log_at_trx_commit: 2,
                    ..MariaDbSpec::default()
                },
                "innodb_flush_log_at_trx_commit 2",
            ),
            (
                MariaDbSpec {
                    sync_binlog: 0,
                    ..MariaDbSpec::default()
                },
                "sync_binlog 0",
            ),
        ] {
            let server = MariaDb::start_with(spec).expect("start MariaDB");
            create_database(&server.url(), "durable").expect("create database");
            let url = url_with_database(&server.url(), "durable");
            let err = MyIdStore::open(&url, CounterDurability::EveryWrite)
                .expect_err("a store on a server that loses commits");
            assert!(err.to_string().contains(refused), "{err}");
            assert!(err.to_string().contains("durability is off"), "{err}");
        }
        let server = MariaDb::start().expect("start MariaDB");
        create_database(&server.url(), "durable").expect("create database");
        let url = url_with_database(&server.url(), "durable");
        let mut store = MyIdStore::open(&url, CounterDurability::EveryWrite).expect("open");
        store.create_tag("t", &TagSpec::simple(5)).expect("create");
    }

    /// A connection that dies mid-operation is given up and a new one is opened for the next
    /// operation: the store goes on after the database comes back from a kill -9.
    #[test]
    #[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
    fn a_store_reconnects_after_the_server_is_killed_and_restarted() {
        let mut server = MariaDb::start().expect("start MariaDB");
        create_database(&server.url(), "again").expect("create database");
        let url = url_with_database(&server.url(), "again");
        let mut store = MyIdStore::open(&url, CounterDurability::EveryWrite).expect("open");
        store.create_tag("t", &TagSpec::simple(5)).expect("create");
        server.kill9().expect("kill -9");
        let down = store.read_tag("t").expect_err("no server");
        assert!(down.to_string().contains("mysql"), "{down}");
        server.restart().expect("restart");
        assert_eq!(store.read_tag("t").expect("read after restart").step, 5);
    }

    #[test]
    fn a_bad_url_is_named_without_its_password() {
        let err = opts("mysql://u:secret@h:notaport/d").unwrap_err();
        assert!(err.message.contains("bad MySQL URL"), "{err}");
        assert!(!err.message.contains("secret"), "{err}");
        let err = create_database("mysql://u@127.0.0.1:1/d", "no-dashes").unwrap_err();
        assert!(err.message.contains("letters, digits"), "{err}");
    }
}
