//! The database server of a [`crate::Deployment`]: PostgreSQL or MariaDB, started by the bench
//! on its own port and data directory, one database per store, and the faults the deployment's
//! nemesis makes on it (kill -9, power loss, restart).

use crate::{MariaDb, MariaDbSpec, Postgres, ProcessError};

/// A deployment's database server.
#[derive(Debug)]
pub enum DbServer {
    /// PostgreSQL, fsync on.
    Postgres(Postgres),
    /// MariaDB (InnoDB, `innodb_flush_log_at_trx_commit=1`, the binary log on with
    /// `sync_binlog=1`).
    MariaDb(MariaDb),
}

impl DbServer {
    /// Starts a PostgreSQL; with `lose_unsynced` on the lost-writes filesystem (power losses).
    ///
    /// # Errors
    /// The start failed.
    pub fn postgres(lose_unsynced: bool) -> Result<Self, ProcessError> {
        Postgres::start_with(lose_unsynced).map(Self::Postgres)
    }

    /// Starts a MariaDB that syncs every commit; with `lose_unsynced` on the lost-writes
    /// filesystem.
    ///
    /// # Errors
    /// The start failed.
    pub fn mariadb(lose_unsynced: bool) -> Result<Self, ProcessError> {
        MariaDb::start_with(MariaDbSpec {
            lose_unsynced,
            ..MariaDbSpec::default()
        })
        .map(Self::MariaDb)
    }

    /// `postgres` or `mariadb`: its lane in a report.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "postgres",
            Self::MariaDb(_) => "mariadb",
        }
    }

    /// What it is, for a report: the server and how durable a commit is.
    #[must_use]
    pub const fn describe(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "PostgreSQL (fsync on)",
            Self::MariaDb(_) => "MariaDB (innodb_flush_log_at_trx_commit=1, sync_binlog=1)",
        }
    }

    /// The port it listens on.
    #[must_use]
    pub const fn port(&self) -> u16 {
        match self {
            Self::Postgres(pg) => pg.port(),
            Self::MariaDb(db) => db.port(),
        }
    }

    /// Creates database `name` (an existing one is kept).
    ///
    /// # Errors
    /// The server refused.
    pub fn create_database(&self, name: &str) -> Result<(), ProcessError> {
        match self {
            Self::Postgres(pg) => pg.create_database(name),
            Self::MariaDb(db) => db.create_database(name),
        }
    }

    /// The URL of database `name`, reached on `port` (its own, or a fault proxy's in front of
    /// it).
    #[must_use]
    pub fn url_via(&self, name: &str, port: u16) -> String {
        match self {
            Self::Postgres(pg) => pg.url_via(name, port),
            Self::MariaDb(db) => db.url_of(name, port),
        }
    }

    /// The URL of database `name` on its own port.
    #[must_use]
    pub fn url_for(&self, name: &str) -> String {
        self.url_via(name, self.port())
    }

    /// SIGKILL of the server.
    ///
    /// # Errors
    /// The signal could not be sent.
    pub fn kill9(&mut self) -> Result<(), ProcessError> {
        match self {
            Self::Postgres(pg) => pg.kill9(),
            Self::MariaDb(db) => db.kill9(),
        }
    }

    /// A power loss: the server killed and every write it had not synced dropped.
    ///
    /// # Errors
    /// Not on the lost-writes filesystem, or the kill failed.
    pub fn power_loss(&mut self) -> Result<crate::LostFsEffects, ProcessError> {
        match self {
            Self::Postgres(pg) => pg.power_loss(),
            Self::MariaDb(db) => db.power_loss(),
        }
    }

    /// What the lost-writes filesystem dropped so far, if the data is on one.
    #[must_use]
    pub fn lost_writes(&self) -> Option<crate::LostFsEffects> {
        match self {
            Self::Postgres(pg) => pg.lost_writes(),
            Self::MariaDb(db) => db.lost_writes(),
        }
    }

    /// Starts the server again on the same data (crash recovery).
    ///
    /// # Errors
    /// The start failed.
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        match self {
            Self::Postgres(pg) => pg.restart(),
            Self::MariaDb(db) => db.restart(),
        }
    }
}
