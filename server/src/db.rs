//! Where a server keeps its state (`--db`): one SQLite file (the default; nothing to install),
//! or a PostgreSQL or MariaDB (MySQL) database that several server processes share.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use sut::id_store::{CounterDurability, IdStore};
use sut::token::{TokenStore, TokenStoreLimits};

use crate::lottery::JournalFile;
use crate::mysql::{MyIdStore, MyJournal, MyLotteryStore, MyTokenStore};
use crate::pg::{PgIdStore, PgJournal, PgLotteryStore, PgTokenStore};
use crate::sqlite::{SqliteIdStore, SqliteTokenStore};

/// An ID store a server can hold behind a mutex and show in debug output.
pub trait SharedIdStore: IdStore + Send + std::fmt::Debug {}
impl<T: IdStore + Send + std::fmt::Debug> SharedIdStore for T {}

/// A token store a server can hold behind a mutex and show in debug output.
pub trait SharedTokenStore: TokenStore + Send + std::fmt::Debug {}
impl<T: TokenStore + Send + std::fmt::Debug> SharedTokenStore for T {}

/// An ID store of any backend.
pub type IdStoreBox = Box<dyn SharedIdStore>;
/// A token store of any backend.
pub type TokenStoreBox = Box<dyn SharedTokenStore>;

/// The database of a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Db {
    /// The ID store's SQLite file; the token store and the lottery journal live beside it
    /// (`<file>.tokens`, `<file>.lottery`).
    Sqlite(PathBuf),
    /// A PostgreSQL URL (`postgres://user@host:port/database`); every store keeps its tables
    /// there (`id_*`, `tok_*`, `lot_*`).
    Postgres(String),
    /// A MariaDB or MySQL URL (`mysql://user@host:port/database`); every store keeps its
    /// tables there, as on PostgreSQL.
    MySql(String),
}

impl FromStr for Db {
    type Err = String;

    /// `sqlite:PATH`, `postgres://…` / `postgresql://…`, `mysql://…` / `mariadb://…`, or a
    /// bare path (SQLite).
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(rest) = s
            .strip_prefix("mysql://")
            .or_else(|| s.strip_prefix("mariadb://"))
        {
            let url = format!("mysql://{rest}");
            crate::mysql::opts(&url)
                .map_err(|e| format!("--db `{}`: not a MySQL URL: {e}", redact(s)))?;
            return Ok(Self::MySql(url));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            let _: tokio_postgres::Config = s
                .parse()
                .map_err(|e| format!("--db `{}`: not a PostgreSQL URL: {e}", redact(s)))?;
            return Ok(Self::Postgres(s.to_owned()));
        }
        let path = s.strip_prefix("sqlite:").unwrap_or(s);
        if path.is_empty() {
            return Err("--db: empty path (use sqlite:PATH, postgres://… or mysql://…)".into());
        }
        if path.contains("://") {
            return Err(format!(
                "--db `{}`: unknown scheme (use sqlite:PATH, postgres://… or mysql://…)",
                redact(s)
            ));
        }
        Ok(Self::Sqlite(PathBuf::from(path)))
    }
}

/// `url` with any password replaced by `***` (for messages and logs).
#[must_use]
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let Some(at) = rest.find('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}

/// Restricts `path` (a data file this server created: it may hold unconsumed one-time tokens,
/// balances, the journal) to its owner, `0600`.
///
/// # Errors
/// The permissions cannot be set.
pub(crate) fn private_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("make {} private (0600): {e}", path.display()))
}

/// Opens the SQLite database at `path` (creating it if needed) as a file only its owner can
/// read and write (its `-wal` and `-shm` files take the same permissions).
///
/// # Errors
/// SQLite cannot open it, or its permissions cannot be set (the message names the file).
pub fn open_private(path: &Path) -> Result<rusqlite::Connection, String> {
    let conn = rusqlite::Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if path.is_file() {
        private_file(path)?;
    }
    Ok(conn)
}

/// `<db><suffix>`: a file beside the database file.
pub(crate) fn sibling(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

impl Db {
    /// What it is, for logs (no password).
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite:{}", path.display()),
            Self::Postgres(url) | Self::MySql(url) => redact(url),
        }
    }

    /// Opens a connection to the ID store.
    ///
    /// # Errors
    /// The store cannot be opened (the message names it).
    pub fn open_ids(&self, durability: CounterDurability) -> Result<IdStoreBox, String> {
        self.open_ids_planted(durability, false)
    }

    /// [`Db::open_ids`], with the planted weakness `unguarded_fallback` (TEST ONLY) when
    /// `unguarded`: an allocation of a PostgreSQL or MariaDB store that lost a serialization
    /// race is written unguarded
    /// ([`crate::sqldb::ids::SqlIdStore::unguarded_fallback`]).
    ///
    /// # Errors
    /// The store cannot be opened, or `unguarded` on SQLite (the weakness is planted in the
    /// stores on a database server only).
    pub fn open_ids_planted(
        &self,
        durability: CounterDurability,
        unguarded: bool,
    ) -> Result<IdStoreBox, String> {
        let opened: Result<IdStoreBox, _> = match self {
            Self::Sqlite(_) if unguarded => {
                return Err(
                    "the weakness unguarded_fallback is planted in the PostgreSQL and MariaDB \
                     stores only, and --db is an SQLite file"
                        .to_owned(),
                );
            }
            Self::Sqlite(path) => {
                SqliteIdStore::open(path, durability).map(|s| Box::new(s) as IdStoreBox)
            }
            Self::Postgres(url) => PgIdStore::open(url, durability)
                .map(|s| Box::new(s.unguarded_fallback(unguarded)) as IdStoreBox),
            Self::MySql(url) => MyIdStore::open(url, durability)
                .map(|s| Box::new(s.unguarded_fallback(unguarded)) as IdStoreBox),
        };
        opened.map_err(|e| format!("id store {}: {e}", self.describe()))
    }

    /// Opens the token store.
    ///
    /// # Errors
    /// The store cannot be opened.
    pub fn open_tokens(&self, limits: TokenStoreLimits) -> Result<TokenStoreBox, String> {
        let opened: Result<TokenStoreBox, _> = match self {
            Self::Sqlite(path) => SqliteTokenStore::open(&sibling(path, ".tokens"), limits)
                .map(|s| Box::new(s) as TokenStoreBox),
            Self::Postgres(url) => {
                PgTokenStore::open(url, limits).map(|s| Box::new(s) as TokenStoreBox)
            }
            Self::MySql(url) => {
                MyTokenStore::open(url, limits).map(|s| Box::new(s) as TokenStoreBox)
            }
        };
        opened.map_err(|e| format!("token store {}: {e}", self.describe()))
    }

    /// Opens a second connection to the token store, for the one-time-token writer.
    ///
    /// # Errors
    /// The store cannot be opened.
    pub fn open_once_store(
        &self,
        limits: TokenStoreLimits,
    ) -> Result<crate::once::BatchTokenStoreBox, String> {
        let opened: Result<crate::once::BatchTokenStoreBox, _> = match self {
            Self::Sqlite(path) => SqliteTokenStore::open(&sibling(path, ".tokens"), limits)
                .map(|s| Box::new(s) as crate::once::BatchTokenStoreBox),
            Self::Postgres(url) => PgTokenStore::open(url, limits)
                .map(|s| Box::new(s) as crate::once::BatchTokenStoreBox),
            Self::MySql(url) => MyTokenStore::open(url, limits)
                .map(|s| Box::new(s) as crate::once::BatchTokenStoreBox),
        };
        opened.map_err(|e| format!("one-time token store {}: {e}", self.describe()))
    }

    /// The lottery journal's SQLite file (SQLite only).
    #[must_use]
    pub fn lottery_path(&self) -> Option<PathBuf> {
        match self {
            Self::Sqlite(path) => Some(sibling(path, ".lottery")),
            Self::Postgres(_) | Self::MySql(_) => None,
        }
    }

    /// Opens the lottery journal of a database server (PostgreSQL, MariaDB), claiming the
    /// database.
    ///
    /// # Errors
    /// An SQLite file, the journal cannot be opened, or another process holds it.
    pub fn open_server_journal(&self) -> Result<Box<dyn JournalFile>, String> {
        let opened: Result<Box<dyn JournalFile>, _> = match self {
            Self::Postgres(url) => PgJournal::open(url).map(|j| Box::new(j) as _),
            Self::MySql(url) => MyJournal::open(url).map(|j| Box::new(j) as _),
            Self::Sqlite(_) => {
                return Err(
                    "a database server's journal needs a postgres:// or mysql:// --db".into(),
                );
            }
        };
        opened.map_err(|e| format!("lottery journal {}: {e}", self.describe()))
    }

    /// Opens the PostgreSQL lottery store (PostgreSQL only).
    ///
    /// # Errors
    /// Not PostgreSQL, or the store cannot be opened.
    pub fn open_pg_lottery(&self) -> Result<PgLotteryStore, String> {
        match self {
            Self::Postgres(url) => PgLotteryStore::open(url)
                .map_err(|e| format!("lottery store {}: {e}", self.describe())),
            _ => Err("the PostgreSQL lottery store needs a postgres:// --db".into()),
        }
    }

    /// Opens the MariaDB lottery store (MariaDB and MySQL only).
    ///
    /// # Errors
    /// Not MySQL, or the store cannot be opened.
    pub fn open_mysql_lottery(&self) -> Result<MyLotteryStore, String> {
        match self {
            Self::MySql(url) => MyLotteryStore::open(url)
                .map_err(|e| format!("lottery store {}: {e}", self.describe())),
            _ => Err("the MariaDB lottery store needs a mysql:// --db".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_parses_each_form_and_names_what_is_wrong() {
        assert_eq!("x.db".parse(), Ok(Db::Sqlite("x.db".into())));
        assert_eq!("sqlite:/a/b.db".parse(), Ok(Db::Sqlite("/a/b.db".into())));
        assert_eq!(
            "postgres://u@127.0.0.1:5/d".parse(),
            Ok(Db::Postgres("postgres://u@127.0.0.1:5/d".into()))
        );
        assert_eq!(
            "mysql://u@127.0.0.1:5/d".parse(),
            Ok(Db::MySql("mysql://u@127.0.0.1:5/d".into()))
        );
        assert_eq!(
            "mariadb://u@127.0.0.1:5/d".parse(),
            Ok(Db::MySql("mysql://u@127.0.0.1:5/d".into()))
        );
        let err = "mysql://u:secret@h:notaport/d".parse::<Db>().unwrap_err();
        assert!(err.contains("not a MySQL URL"), "{err}");
        assert!(!err.contains("secret"), "{err}");
        let err = "redis://x".parse::<Db>().unwrap_err();
        assert!(err.contains("unknown scheme"), "{err}");
        let err = "sqlite:".parse::<Db>().unwrap_err();
        assert!(err.contains("empty path"), "{err}");
        let err = "postgres://u:secret@h:notaport/d"
            .parse::<Db>()
            .unwrap_err();
        assert!(!err.contains("secret"), "{err}");
    }

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(redact("postgres://u:pw@h/d"), "postgres://u:***@h/d");
        assert_eq!(redact("postgres://u@h/d"), "postgres://u@h/d");
        assert_eq!(redact("/x.db"), "/x.db");
    }
}
