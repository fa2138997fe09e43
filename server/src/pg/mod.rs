//! The PostgreSQL stores of the real server (`--db postgres://…`), for deployments where several
//! server processes share one database: the stores of [`crate::sqldb`] (each implementing the
//! same `sut` store trait as its SQLite twin) on a [`PgConn`], with PostgreSQL's SQL for their
//! rows; the conformance property tests run them against the memory stores.
//!
//! Concurrency control, per table, is the database's:
//!
//! - **Every domain operation is one `SERIALIZABLE` transaction**, retried from the start when
//!   PostgreSQL reports a serialization failure or a deadlock (SQLSTATE 40001 / 40P01). The rules
//!   of `sut` assume an operation reads and writes as if alone, which is what SQLite's single
//!   writer gives the SQLite stores; here several servers write at once, and SERIALIZABLE is the
//!   level that keeps that promise without the store having to know which rows a rule reads.
//! - Under it, the statements keep their own guards: the tag row's version is compared in the
//!   `UPDATE … WHERE version = $read` of an allocation (Tinyid's optimistic lock), and primary
//!   keys make fences `(xid, branch)`, one-time tokens and segment leases unique.
//!
//! Each store owns one connection (stores are used behind a mutex or from one writer thread, as
//! the SQLite ones are). A closed connection is reopened on the next operation; an operation
//! whose connection dies mid-way returns a backend error (its outcome is unknown to the caller,
//! exactly as for a timeout).
//!
//! The driver is tokio-postgres. Its connection tasks run on one small runtime of their own
//! ([`io_runtime`]), and the stores block on their queries, so the sync store traits of `sut`
//! need no change and the stores can be called from any thread.

mod ids;
mod journal;
mod lottery;

pub use ids::PgIdStore;
pub use journal::PgJournal;
pub use lottery::PgLotteryStore;
mod tokens;
pub use crate::sqldb::once_view::OnceHints;
pub use tokens::PgTokenStore;

use std::collections::HashMap;
use std::sync::OnceLock;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, IsolationLevel, NoTls, Row, Statement};

use crate::sqldb::Attempt;
pub use crate::sqldb::{
    DbError, ROUND_TRIP_TIMEOUT, TX_ATTEMPTS_MAX, from_sql, io_runtime, to_sql, url_with_database,
};

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        let retryable = matches!(
            e.code(),
            Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED)
        );
        let message = e.as_db_error().map_or_else(
            || format!("postgres: {e}"),
            |db| format!("postgres: {} ({})", db.message(), db.code().code()),
        );
        // A closed connection or an I/O error leaves the connection in an unknown state; an
        // answer from the server, or an error of the client's own (a row count, a conversion),
        // does not.
        let connection_lost = e.is_closed()
            || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        Self {
            message,
            retryable,
            connection_lost,
        }
    }
}

/// [`crate::sqldb::block`] for PostgreSQL.
fn block<T, E: Into<DbError>>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, DbError> {
    crate::sqldb::block("postgres", what, fut)
}

/// The TLS every connection of this process uses, once set ([`use_tls`]).
static TLS: OnceLock<std::sync::Arc<rustls::ClientConfig>> = OnceLock::new();

/// Every later PostgreSQL connection of this process speaks TLS with `config` (trusting the
/// server's certificate by it); with `sslmode=require` in the URL, a server without TLS is
/// refused. Set once at start (`--tls-ca-file` with a `postgres://` database).
///
/// # Errors
/// TLS was set already, to another configuration.
pub fn use_tls(config: rustls::ClientConfig) -> Result<(), String> {
    TLS.set(std::sync::Arc::new(config))
        .map_err(|_| "PostgreSQL TLS is set once per process".to_owned())
}

/// Opens one connection to `url` (`postgres://user@host:port/db`).
///
/// # Errors
/// The URL is malformed or the server cannot be reached.
pub fn connect(url: &str) -> Result<Client, DbError> {
    open_connection(url).map(|(client, _task)| client)
}

/// A connection and the handle of the task that drives it (aborted when the connection is
/// given up: a task waiting on a peer that will never answer would otherwise stay forever).
fn open_connection(url: &str) -> Result<(Client, tokio::task::AbortHandle), DbError> {
    let config: tokio_postgres::Config = url
        .parse()
        .map_err(|e| DbError::fatal(format!("bad PostgreSQL URL `{url}`: {e}")))?;
    let tls = TLS.get().cloned();
    let task = io_runtime().spawn(async move {
        // The connection ends when the client is dropped or the server goes away; the client
        // then reports it closed and the store reconnects.
        let (client, driver) = match tls {
            None => {
                let (client, connection) = config.connect(NoTls).await?;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
            Some(tls) => {
                let connector = tokio_postgres_rustls::MakeRustlsConnect::new((*tls).clone());
                let (client, connection) = config.connect(connector).await?;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
        };
        Ok::<_, tokio_postgres::Error>((client, driver.abort_handle()))
    });
    let abort = task.abort_handle();
    let joined = block("a connect", async {
        task.await
            .map_err(|join| DbError::fatal(format!("postgres connect task: {join}")))
    });
    match joined {
        Ok(result) => result.map_err(DbError::from),
        Err(e) => {
            abort.abort();
            Err(e)
        }
    }
}

/// Creates database `name` on the server of `admin_url` (tests and the cluster runner give each
/// store its own database). An existing database is kept.
///
/// # Errors
/// Connection failures, a bad name.
pub fn create_database(admin_url: &str, name: &str) -> Result<(), DbError> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(DbError::fatal(format!(
            "database name `{name}`: use letters, digits and `_`"
        )));
    }
    let client = connect(admin_url)?;
    let exists = block(
        "a catalog query",
        client.query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name]),
    )?;
    if exists.is_none() {
        block(
            "CREATE DATABASE",
            client.batch_execute(&format!("CREATE DATABASE {name}")),
        )?;
    }
    Ok(())
}

/// One store's connection: reconnects when closed, caches prepared statements, runs
/// serializable transactions with retries.
pub struct PgConn {
    url: String,
    client: Option<Client>,
    /// The task driving `client`'s connection.
    driver: Option<tokio::task::AbortHandle>,
    statements: HashMap<String, Statement>,
    /// A session advisory lock taken on every (re)connect: the connection is this process's
    /// claim to the database (see [`PgConn::claim`]).
    claim: Option<i64>,
}

impl std::fmt::Debug for PgConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConn")
            .field("url", &self.url)
            .field("connected", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl PgConn {
    /// Connects to `url` and runs `schema` (idempotent DDL).
    ///
    /// # Errors
    /// Connection or DDL failures.
    pub fn open(url: &str, schema: &str) -> Result<Self, DbError> {
        let mut conn = Self {
            url: url.to_owned(),
            client: None,
            driver: None,
            statements: HashMap::new(),
            claim: None,
        };
        conn.batch(schema)?;
        Ok(conn)
    }

    /// Claims the database for this connection alone: takes the session advisory lock `key`
    /// now and again after every reconnect, and fails while another session holds it (a second
    /// process writing the same journal would interleave its records with this one's).
    ///
    /// # Errors
    /// Another session holds the lock, or a database failure.
    pub fn claim(&mut self, key: i64) -> Result<(), DbError> {
        self.claim = Some(key);
        self.client = None;
        self.ensure_connected()
    }

    /// Connects if there is no open connection (and takes the claim, if any).
    fn ensure_connected(&mut self) -> Result<(), DbError> {
        if self.client.as_ref().is_some_and(|c| !c.is_closed()) {
            return Ok(());
        }
        self.drop_connection();
        let (client, driver) = open_connection(&self.url)?;
        self.driver = Some(driver);
        if let Some(key) = self.claim {
            let row = block(
                "the claim",
                client.query_one("SELECT pg_try_advisory_lock($1)", &[&key]),
            )
            .map_err(|e| self.forget_if_lost(e))?;
            if !row.get::<_, bool>(0) {
                return Err(DbError::fatal(format!(
                    "the database is claimed by another process (advisory lock {key}): \
                         one writer per journal"
                )));
            }
        }
        // Durability is this session's own setting, not whatever the server or the role says:
        // a COMMIT returns once its WAL record is flushed (and refuse a server that never
        // flushes).
        let settings = block(
            "the durability settings",
            client.query_one(
                "SELECT set_config('synchronous_commit', 'on', false), current_setting('fsync')",
                &[],
            ),
        )
        .map_err(|e| self.forget_if_lost(e))?;
        let (commit, fsync): (String, String) = (settings.get(0), settings.get(1));
        if commit != "on" || fsync != "on" {
            return Err(DbError::fatal(format!(
                "PostgreSQL durability is off (synchronous_commit {commit}, fsync {fsync}): an \
                 acknowledged write could be lost in a crash; run it with fsync=on"
            )));
        }
        self.client = Some(client);
        Ok(())
    }

    /// Gives the connection up (the next operation opens a new one).
    fn drop_connection(&mut self) {
        self.statements.clear();
        self.client = None;
        if let Some(driver) = self.driver.take() {
            driver.abort();
        }
    }

    /// Passes `e` on, first giving the connection up if `e` says it cannot be trusted.
    fn forget_if_lost(&mut self, e: DbError) -> DbError {
        if e.connection_lost {
            self.drop_connection();
        }
        e
    }

    /// The URL it connects to.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    fn client(&mut self) -> Result<&mut Client, DbError> {
        self.ensure_connected()?;
        Ok(self.client.as_mut().expect("connected just above"))
    }

    /// Runs statements outside a transaction (schema).
    ///
    /// # Errors
    /// Database failures.
    pub fn batch(&mut self, sql: &str) -> Result<(), DbError> {
        // Concurrent `CREATE TABLE IF NOT EXISTS` from several servers can collide on the
        // catalog's unique index; that is the other server having created it.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let client = self.client()?;
            let answered = block("a batch", async {
                Ok::<_, DbError>(client.batch_execute(sql).await)
            });
            match answered.map_err(|e| self.forget_if_lost(e))? {
                Ok(()) => return Ok(()),
                Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) && attempt < 5 => {}
                Err(e) => return Err(self.forget_if_lost(e.into())),
            }
        }
    }

    /// Runs one statement as its own transaction (autocommit: durable when this returns, with
    /// `synchronous_commit` on); one round trip once its statement is prepared. For a statement
    /// whose result does not depend on what it reads (an append), where isolation cannot matter.
    ///
    /// # Errors
    /// Database failures (not retried).
    pub fn execute_alone(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, DbError> {
        self.execute_once(sql, params)
            .map_err(|e| self.forget_if_lost(e))
    }

    fn execute_once(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, DbError> {
        self.ensure_connected()?;
        let client = self.client.as_mut().expect("connected just above");
        let statement = match self.statements.get(sql) {
            Some(s) => s.clone(),
            None => {
                let prepared = block("a prepare", client.prepare(sql))?;
                self.statements.insert(sql.to_owned(), prepared.clone());
                prepared
            }
        };
        block("a statement", client.execute(&statement, params))
    }

    /// Runs `op` in one SERIALIZABLE transaction, committing when it returns `Ok`; retries the
    /// whole of it (with a short growing pause) after a serialization failure or deadlock.
    ///
    /// # Errors
    /// `op`'s error (the transaction rolled back), or a database failure.
    pub fn transact<T, E: From<DbError>>(
        &mut self,
        op: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.transact_tries(crate::sqldb::TX_ATTEMPTS_MAX, op)
    }

    /// [`PgConn::transact`], giving up after `tries` attempts.
    ///
    /// # Errors
    /// As [`PgConn::transact`].
    pub fn transact_tries<T, E: From<DbError>>(
        &mut self,
        tries: u32,
        mut op: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        crate::sqldb::retrying_up_to(tries, || {
            let (outcome, lost) = self.attempt(&mut op);
            if lost {
                self.drop_connection();
            }
            outcome
        })
    }

    /// One try of `op`; also whether the connection was lost on the way.
    fn attempt<T, E: From<DbError>>(
        &mut self,
        op: &mut impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> (Attempt<T, E>, bool) {
        if let Err(e) = self.ensure_connected() {
            return (Attempt::Done(Err(e.into())), false);
        }
        let statements = &mut self.statements;
        let client = self.client.as_mut().expect("connected just above");
        let begun = block(
            "a BEGIN",
            client
                .build_transaction()
                .isolation_level(IsolationLevel::Serializable)
                .start(),
        );
        let tx = match begun {
            Ok(tx) => tx,
            Err(e) => {
                let lost = e.connection_lost;
                return (Attempt::Done(Err(e.into())), lost);
            }
        };
        let mut wrapped = Tx {
            tx,
            statements,
            retryable: None,
            lost: false,
        };
        let result = op(&mut wrapped);
        if let Some(e) = wrapped.retryable.take() {
            return (Attempt::Retry(e), wrapped.lost);
        }
        let lost = wrapped.lost;
        match result {
            Ok(value) => match block("a COMMIT", wrapped.tx.commit()) {
                Ok(()) => (Attempt::Done(Ok(value)), lost),
                Err(e) if e.retryable => (Attempt::Retry(e), lost),
                Err(e) => {
                    let lost = lost || e.connection_lost;
                    (Attempt::Done(Err(e.into())), lost)
                }
            },
            // Dropping the transaction rolls it back.
            Err(e) => (Attempt::Done(Err(e)), lost),
        }
    }
}

impl crate::sqldb::SqlConn for PgConn {
    type Tx<'t> = Tx<'t>;

    fn transact_tries<T, E: From<DbError>>(
        &mut self,
        tries: u32,
        op: impl FnMut(&mut Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        Self::transact_tries(self, tries, op)
    }
}

/// A transaction in progress: blocking queries with cached statements. A serialization failure
/// is remembered, so that [`PgConn::transact`] retries whatever error `op` turned it into.
pub struct Tx<'a> {
    tx: tokio_postgres::Transaction<'a>,
    statements: &'a mut HashMap<String, Statement>,
    retryable: Option<DbError>,
    /// A call found the connection lost (the store gives it up once the transaction is over).
    lost: bool,
}

impl std::fmt::Debug for Tx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

/// A query parameter.
pub type Param<'p> = &'p (dyn ToSql + Sync);

impl Tx<'_> {
    fn note(&mut self, e: DbError) -> DbError {
        self.lost |= e.connection_lost;
        if e.retryable && self.retryable.is_none() {
            self.retryable = Some(e.clone());
        }
        e
    }

    fn statement(&mut self, sql: &str) -> Result<Statement, DbError> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let prepared = block("a prepare", self.tx.prepare(sql)).map_err(|e| self.note(e))?;
        self.statements.insert(sql.to_owned(), prepared.clone());
        Ok(prepared)
    }

    /// Runs a statement; returns the rows it changed.
    ///
    /// # Errors
    /// Database failures.
    pub fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64, DbError> {
        let statement = self.statement(sql)?;
        block("a statement", self.tx.execute(&statement, params)).map_err(|e| self.note(e))
    }

    /// Runs a query; returns its rows.
    ///
    /// # Errors
    /// Database failures.
    pub fn query(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Row>, DbError> {
        let statement = self.statement(sql)?;
        block("a query", self.tx.query(&statement, params)).map_err(|e| self.note(e))
    }

    /// Runs a query of at most one row.
    ///
    /// # Errors
    /// Database failures, more than one row.
    pub fn query_opt(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Row>, DbError> {
        let statement = self.statement(sql)?;
        block("a query", self.tx.query_opt(&statement, params)).map_err(|e| self.note(e))
    }
}

/// Column `index` of `row` as a `u64`.
///
/// # Errors
/// A wrong type or a negative value.
pub fn get_u64(row: &Row, index: usize, what: &str) -> Result<u64, DbError> {
    let v: i64 = row
        .try_get(index)
        .map_err(|e| DbError::fatal(format!("column {what}: {e}")))?;
    from_sql(v, what)
}
