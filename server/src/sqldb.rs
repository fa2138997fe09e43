//! The stores on a database server (`--db postgres://…`, `--db mysql://…`), written once for
//! every server: [`ids::SqlIdStore`], [`tokens::SqlTokenStore`] (with the one-time writer's
//! snapshot batch, [`once_view`]) and [`lottery::SqlLotteryStore`] hold each operation's reads,
//! the `sut` rule it calls and the writes of what the rule decided, over a [`SqlConn`]. A server
//! (`crate::pg`, `crate::mysql`) brings only its connection and how a row is read or written in
//! its SQL ([`ids::IdRows`], [`tokens::TokenRows`], [`lottery::LotteryRows`]). Also shared: the
//! failure type with whether a retry may succeed, the small runtime the connections run on, the
//! bounded wait for an answer, and the retry loop of a transaction.
//!
//! The stores keep the sync store traits of `sut`: each blocks the calling thread on its async
//! driver's futures (`block`), whose I/O the runtime of [`io_runtime`] drives.

use std::sync::OnceLock;
use std::time::Duration;

#[cfg(test)]
pub(crate) mod conformance;
pub mod ids;
pub mod lottery;
pub mod once_view;
pub mod tokens;

/// A database server's connection, as the stores use it: each operation one transaction.
pub trait SqlConn: std::fmt::Debug + Send {
    /// A transaction on it: how every store reads and writes its rows there.
    type Tx<'t>: ids::IdRows + lottery::LotteryRows + tokens::TokenRows;

    /// Runs `op` in one SERIALIZABLE transaction, committing when it returns `Ok`; retries the
    /// whole of it after a serialization failure or deadlock.
    ///
    /// # Errors
    /// `op`'s error (the transaction rolled back), or a database failure.
    fn transact<T, E: From<DbError>>(
        &mut self,
        op: impl FnMut(&mut Self::Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E> {
        self.transact_tries(TX_ATTEMPTS_MAX, op)
    }

    /// [`SqlConn::transact`], giving up after `tries` attempts (the last serialization failure
    /// or deadlock is the error).
    ///
    /// # Errors
    /// As [`SqlConn::transact`].
    fn transact_tries<T, E: From<DbError>>(
        &mut self,
        tries: u32,
        op: impl FnMut(&mut Self::Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E>;
}

/// Attempts of one operation before a serialization failure is reported.
pub const TX_ATTEMPTS_MAX: u32 = 50;

/// How long one call to the database (a connect, a statement, a commit) may take before its
/// connection is given up as dead. A connection whose peer went away without a word
/// (half-open: the server closed it, a middlebox still acknowledges) never answers, and TCP
/// keepalive cannot see it; without this a store would wait on it forever, holding its lock.
pub const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(10);

/// A database failure, with whether retrying the whole transaction may succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbError {
    /// What failed, with the database's message.
    pub message: String,
    /// A serialization failure or deadlock: the transaction did nothing and may be retried.
    pub retryable: bool,
    /// The connection cannot be trusted any more (it closed, failed, or gave no answer within
    /// [`ROUND_TRIP_TIMEOUT`]): the store drops it and reconnects on its next operation.
    pub connection_lost: bool,
}

impl DbError {
    /// A failure that retrying will not mend, on a connection still good.
    #[must_use]
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            connection_lost: false,
        }
    }

    /// `server` (`postgres`, `mysql`) gave no answer to `what` in time.
    fn no_answer(server: &str, what: &str) -> Self {
        Self {
            message: format!(
                "{server}: no answer to {what} within {} s (the connection is given up)",
                ROUND_TRIP_TIMEOUT.as_secs()
            ),
            retryable: false,
            connection_lost: true,
        }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<DbError> for sut::id_store::StoreError {
    fn from(e: DbError) -> Self {
        Self::Backend(e.message)
    }
}

impl From<DbError> for sut::token::rows::TokenStoreError {
    fn from(e: DbError) -> Self {
        Self::Backend(e.message)
    }
}

impl From<DbError> for sut::lottery::StoreError {
    fn from(e: DbError) -> Self {
        Self::Backend { message: e.message }
    }
}

/// The runtime that drives every database connection of this process (one worker thread).
///
/// # Panics
/// When the runtime cannot be built (no threads can be spawned).
pub fn io_runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("db-io")
            .enable_all()
            .build()
            .expect("a runtime for database connections")
    })
}

/// Runs `fut` to completion on the calling thread (its I/O is driven by [`io_runtime`]), or
/// gives up after [`ROUND_TRIP_TIMEOUT`] with an error naming `server` and `what`.
pub(crate) fn block<T, E: Into<DbError>>(
    server: &str,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, DbError> {
    // The timer and the sockets belong to the I/O runtime, whose thread drives them; this
    // thread polls the future (a driver that opens its socket when first polled finds the
    // runtime's reactor through the context) and waits.
    let _context = io_runtime().enter();
    match futures_executor::block_on(tokio::time::timeout(ROUND_TRIP_TIMEOUT, fut)) {
        Ok(result) => result.map_err(Into::into),
        Err(_elapsed) => Err(DbError::no_answer(server, what)),
    }
}

/// How one try of a transaction ended.
pub(crate) enum Attempt<T, E> {
    /// Committed, or failed in a way a retry will not mend.
    Done(Result<T, E>),
    /// Rolled back by a serialization failure or a deadlock: it may be run again.
    Retry(DbError),
}

/// Runs `attempt` until it is done, at most `attempts_max` times ([`TX_ATTEMPTS_MAX`] for a
/// transaction of [`SqlConn::transact`]), with a short growing pause (jittered, so that two
/// servers that collided do not collide again) between tries.
///
/// # Errors
/// The attempt's own error, or the last retryable failure once the attempts are used up.
pub(crate) fn retrying_up_to<T, E: From<DbError>>(
    attempts_max: u32,
    mut attempt: impl FnMut() -> Attempt<T, E>,
) -> Result<T, E> {
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt() {
            Attempt::Done(result) => return result,
            Attempt::Retry(_) if tries < attempts_max => {
                let pause_us = 100 * u64::from(tries.min(20)) + jitter_us(tries);
                std::thread::sleep(Duration::from_micros(pause_us));
            }
            Attempt::Retry(e) => return Err(e.into()),
        }
    }
}

fn jitter_us(attempt: u32) -> u64 {
    let mut bytes = [0u8; 2];
    let _ = getrandom::fill(&mut bytes);
    u64::from(u16::from_le_bytes(bytes)) % (50 * u64::from(attempt.min(20)) + 1)
}

/// A database's `BIGINT` is i64; IDs stay below 2^62 and times below 2^63, so the casts are
/// exact.
#[must_use]
pub fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A value read back, checked rather than trusted.
///
/// # Errors
/// A negative value (a corrupt row).
pub fn from_sql(v: i64, what: &str) -> Result<u64, DbError> {
    u64::try_from(v).map_err(|_| DbError::fatal(format!("corrupt row: negative {what} {v}")))
}

/// The URL of database `name` on the server of `url` (the path replaced).
#[must_use]
pub fn url_with_database(url: &str, name: &str) -> String {
    let (head, query) = url
        .split_once('?')
        .map_or((url, None), |(h, q)| (h, Some(q)));
    let after_scheme = head.find("://").map_or(0, |i| i + 3);
    let base = head[after_scheme..]
        .find('/')
        .map_or(head, |i| &head[..after_scheme + i]);
    query.map_or_else(
        || format!("{base}/{name}"),
        |q| format!("{base}/{name}?{q}"),
    )
}

#[cfg(test)]
mod tests {
    use super::url_with_database;

    #[test]
    fn url_with_database_replaces_only_the_path() {
        assert_eq!(
            url_with_database("postgres://u@h:1/postgres?connect_timeout=5", "ids"),
            "postgres://u@h:1/ids?connect_timeout=5"
        );
        assert_eq!(
            url_with_database("postgres://u@h:1", "x"),
            "postgres://u@h:1/x"
        );
        assert_eq!(
            url_with_database("postgres://u@h:1/a", "b"),
            "postgres://u@h:1/b"
        );
    }
}
