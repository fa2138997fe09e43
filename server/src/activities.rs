//! The operator's activity registry of one process: the terms of each activity (price, odds,
//! opening hours; `sut::lottery::activity`), written by `POST /admin/activities` (or `--activity`
//! at start) and read by the draw gate, the participants and the one-time token service. A
//! client never names a price: the gate takes it from here.
//!
//! Terms are durable before a registration is answered: an SQLite file beside the database
//! (`<db>.activities`, `synchronous=FULL`) or the table `act_terms` of a PostgreSQL or MariaDB
//! database. The
//! rule that decides a registration (new, same again, or a conflict) is `sut`'s
//! [`sut::lottery::activity::register_rule`]; this module only keeps what it decided. Readers
//! take a snapshot ([`Activities::snapshot`]: one `Arc` clone), so the hot path never waits for
//! a registration.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use rusqlite::{Connection, params};
use sut::lottery::{ActivityId, Registered, Registry, Terms, TermsError};

use crate::db::Db;
use crate::ids::lock;
use crate::mysql::MyConn;
use crate::pg::PgConn;

/// What a registration decides, given the registry as it is in the store: the activities to
/// add, or why none may be.
type Decide<'a> = dyn FnMut(&Registry) -> Result<Vec<(ActivityId, Terms)>, TermsError> + 'a;

/// Where a process keeps its terms. Several processes may share one store (instances of a
/// service on one database): a registration reads the registry, decides and writes in one
/// transaction, so it is judged on what every instance registered.
trait TermsFile: Send + std::fmt::Debug {
    /// Every registered activity.
    fn read_all(&mut self) -> Result<Registry, RegisterError>;

    /// In one transaction: reads the registry, asks `decide` what to add, adds it durably (all
    /// or none); returns the registry after.
    fn register(&mut self, decide: &mut Decide<'_>) -> Result<Registry, RegisterError>;
}

fn store(e: impl std::fmt::Display) -> RegisterError {
    RegisterError::Store(e.to_string())
}

fn sql_id(activity: ActivityId) -> Result<i64, RegisterError> {
    i64::try_from(activity.0).map_err(|_| store(format!("activity id {activity} above 2^63")))
}

fn encode(terms: &Terms) -> Result<String, RegisterError> {
    serde_json::to_string(terms).map_err(|e| store(format!("terms encoding: {e}")))
}

/// The registry of stored rows; a row that does not parse, or breaks a rule, is an error.
fn decode(rows: &[(i64, String)]) -> Result<Registry, RegisterError> {
    let mut entries = Vec::with_capacity(rows.len());
    for (activity, text) in rows {
        let id = u64::try_from(*activity)
            .map_err(|_| store(format!("corrupt activity id {activity}")))?;
        let terms = serde_json::from_str(text)
            .map_err(|e| store(format!("corrupt terms of activity {activity}: {e}")))?;
        entries.push((ActivityId(id), terms));
    }
    Registry::from_entries(entries).map_err(|e| store(format!("stored terms break a rule: {e}")))
}

/// The registry after adding `added` to `before` (which the rule already judged).
fn with_added(before: Registry, added: &[(ActivityId, Terms)]) -> Result<Registry, RegisterError> {
    let mut after = before;
    for (activity, terms) in added {
        after.register(*activity, *terms)?;
    }
    Ok(after)
}

/// Terms in an SQLite file.
#[derive(Debug)]
struct SqliteTerms {
    conn: Connection,
}

const SQLITE_SELECT: &str = "SELECT activity, terms FROM act_terms ORDER BY activity";

impl SqliteTerms {
    fn open(path: &Path) -> Result<Self, String> {
        let conn = crate::db::open_private(path)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| e.to_string())?;
        // Instances of a service may share the file: wait for another's write, do not fail.
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS act_terms (
                activity INTEGER PRIMARY KEY,
                terms    TEXT NOT NULL
            );",
        )
        .map_err(|e| e.to_string())?;
        Ok(Self { conn })
    }

    fn rows(conn: &Connection) -> Result<Vec<(i64, String)>, RegisterError> {
        let mut stmt = conn.prepare_cached(SQLITE_SELECT).map_err(store)?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(store)?
            .collect::<Result<_, _>>()
            .map_err(store)
    }
}

impl TermsFile for SqliteTerms {
    fn read_all(&mut self) -> Result<Registry, RegisterError> {
        decode(&Self::rows(&self.conn)?)
    }

    /// `BEGIN IMMEDIATE` (no other writer between the read and the insert), one commit made
    /// durable by `synchronous=FULL`.
    fn register(&mut self, decide: &mut Decide<'_>) -> Result<Registry, RegisterError> {
        let tx = rusqlite::Transaction::new_unchecked(
            &self.conn,
            rusqlite::TransactionBehavior::Immediate,
        )
        .map_err(store)?;
        let before = decode(&Self::rows(&tx)?)?;
        let added = decide(&before)?;
        {
            let mut stmt = tx
                .prepare_cached("INSERT INTO act_terms (activity, terms) VALUES (?1, ?2)")
                .map_err(store)?;
            for (activity, terms) in &added {
                stmt.execute(params![sql_id(*activity)?, encode(terms)?])
                    .map_err(store)?;
            }
        }
        tx.commit().map_err(store)?;
        with_added(before, &added)
    }
}

/// Terms in a PostgreSQL database.
#[derive(Debug)]
struct PgTerms {
    conn: PgConn,
}

const PG_SELECT: &str = "SELECT activity, terms FROM act_terms ORDER BY activity";

fn pg_rows(tx: &mut crate::pg::Tx<'_>) -> Result<Vec<(i64, String)>, crate::pg::DbError> {
    Ok(tx
        .query(PG_SELECT, &[])?
        .iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)))
        .collect())
}

impl From<crate::pg::DbError> for RegisterError {
    fn from(e: crate::pg::DbError) -> Self {
        store(e)
    }
}

impl TermsFile for PgTerms {
    fn read_all(&mut self) -> Result<Registry, RegisterError> {
        decode(&self.conn.transact(pg_rows)?)
    }

    /// One SERIALIZABLE transaction (retried from the start on a conflict with another
    /// instance's registration).
    fn register(&mut self, decide: &mut Decide<'_>) -> Result<Registry, RegisterError> {
        self.conn.transact(|tx| {
            let before = decode(&pg_rows(tx)?)?;
            let added = decide(&before)?;
            let ids = added
                .iter()
                .map(|(a, _)| sql_id(*a))
                .collect::<Result<Vec<i64>, _>>()?;
            let texts = added
                .iter()
                .map(|(_, t)| encode(t))
                .collect::<Result<Vec<String>, _>>()?;
            tx.execute(
                "INSERT INTO act_terms (activity, terms) \
                 SELECT * FROM unnest($1::bigint[], $2::text[])",
                &[&ids, &texts],
            )?;
            with_added(before, &added)
        })
    }
}

/// Terms in a MariaDB (MySQL) database.
#[derive(Debug)]
struct MyTerms {
    conn: MyConn,
}

fn my_rows(tx: &mut crate::mysql::MyTx<'_>) -> Result<Vec<(i64, String)>, crate::sqldb::DbError> {
    tx.query(PG_SELECT, Vec::new())?
        .iter()
        .map(|r| {
            Ok((
                crate::mysql::col(r, 0, "activity")?,
                crate::mysql::col(r, 1, "terms")?,
            ))
        })
        .collect()
}

impl TermsFile for MyTerms {
    fn read_all(&mut self) -> Result<Registry, RegisterError> {
        decode(&self.conn.transact(my_rows)?)
    }

    /// One SERIALIZABLE transaction (retried from the start after a deadlock with another
    /// instance's registration).
    fn register(&mut self, decide: &mut Decide<'_>) -> Result<Registry, RegisterError> {
        self.conn.transact(|tx| {
            let before = decode(&my_rows(tx)?)?;
            let added = decide(&before)?;
            for (activity, terms) in &added {
                tx.execute(
                    "INSERT INTO act_terms (activity, terms) VALUES (?, ?)",
                    crate::mysql::params![sql_id(*activity)?, encode(terms)?],
                )?;
            }
            with_added(before, &added)
        })
    }
}

/// No file: a registry that lives as long as its process (tests of the lottery writer alone).
#[derive(Debug)]
struct NoFile(Registry);

impl TermsFile for NoFile {
    fn read_all(&mut self) -> Result<Registry, RegisterError> {
        Ok(self.0.clone())
    }

    fn register(&mut self, decide: &mut Decide<'_>) -> Result<Registry, RegisterError> {
        let added = decide(&self.0)?;
        self.0 = with_added(self.0.clone(), &added)?;
        Ok(self.0.clone())
    }
}

/// Why a registration was not made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The rule refused the terms; nothing changed.
    #[error(transparent)]
    Terms(#[from] TermsError),
    /// The store failed; the activity is not registered.
    #[error("activity store: {0}")]
    Store(String),
}

/// One process's registry: in memory for readers, durable in its database.
#[derive(Debug)]
pub struct Activities {
    current: RwLock<Arc<Registry>>,
    file: Mutex<Box<dyn TermsFile>>,
}

impl Activities {
    /// Opens (creating if needed) the registry of `db` and reads it.
    ///
    /// # Errors
    /// The store cannot be opened, or holds a record that does not parse or breaks a rule.
    pub fn open(db: &Db) -> Result<Self, String> {
        let mut file: Box<dyn TermsFile> = match db {
            Db::Sqlite(path) => {
                Box::new(SqliteTerms::open(&crate::db::sibling(path, ".activities"))?)
            }
            Db::Postgres(url) => Box::new(PgTerms {
                conn: PgConn::open(
                    url,
                    "CREATE TABLE IF NOT EXISTS act_terms (
                        activity BIGINT PRIMARY KEY,
                        terms    TEXT NOT NULL
                    );",
                )
                .map_err(|e| e.to_string())?,
            }),
            Db::MySql(url) => Box::new(MyTerms {
                conn: MyConn::open(
                    url,
                    "CREATE TABLE IF NOT EXISTS act_terms (
                        activity BIGINT PRIMARY KEY,
                        terms    LONGTEXT NOT NULL
                    ) ENGINE = InnoDB",
                )
                .map_err(|e| e.to_string())?,
            }),
        };
        let registry = file
            .read_all()
            .map_err(|e| format!("activity store {}: {e}", db.describe()))?;
        Ok(Self {
            current: RwLock::new(Arc::new(registry)),
            file: Mutex::new(file),
        })
    }

    /// A registry of `registry`'s activities that is kept in memory only (not durable: for tests
    /// and in-process drivers).
    #[must_use]
    pub fn in_memory(registry: Registry) -> Self {
        Self {
            current: RwLock::new(Arc::new(registry.clone())),
            file: Mutex::new(Box::new(NoFile(registry))),
        }
    }

    /// The registry as it is now (later registrations do not change it).
    #[must_use]
    pub fn snapshot(&self) -> Arc<Registry> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Registers `terms` for `activity`: durable before it returns `Created`; the same terms
    /// again are `Unchanged`; other terms are refused and change nothing. Blocking.
    ///
    /// # Errors
    /// [`RegisterError::Terms`] (invalid, conflicting, full), [`RegisterError::Store`].
    pub fn register(
        &self,
        activity: ActivityId,
        terms: Terms,
    ) -> Result<Registered, RegisterError> {
        let (created, _) = self.register_range(activity, 1, terms)?;
        Ok(if created == 1 {
            Registered::Created
        } else {
            Registered::Unchanged
        })
    }

    /// Registers `terms` for activities `first..first + count`, all or none, in one durable
    /// write; returns how many were created and how many had these terms already. Blocking.
    ///
    /// # Errors
    /// The first activity the rule refuses (nothing changed), or a store failure.
    pub fn register_range(
        &self,
        first: ActivityId,
        count: u64,
        terms: Terms,
    ) -> Result<(u64, u64), RegisterError> {
        let mut unchanged = 0;
        let mut file = lock(&self.file);
        // The rule is judged on the registry as stored (another instance may have added to it).
        let after = file.register(&mut |stored: &Registry| {
            let mut next = stored.clone();
            let mut added = Vec::new();
            unchanged = 0;
            for id in first.0..first.0.saturating_add(count) {
                match next.register(ActivityId(id), terms)? {
                    Registered::Created => added.push((ActivityId(id), terms)),
                    Registered::Unchanged => unchanged += 1,
                }
            }
            Ok(added)
        })?;
        let created = count - unchanged;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(after);
        Ok((created, unchanged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_survive_a_restart_and_never_change() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::Sqlite(dir.path().join("x.db"));
        let a = ActivityId(3);
        let terms = Terms::always_open(10, 100);
        {
            let reg = Activities::open(&db).unwrap();
            assert!(reg.snapshot().is_empty());
            assert_eq!(reg.register(a, terms), Ok(Registered::Created));
            assert_eq!(reg.register(a, terms), Ok(Registered::Unchanged));
            let free = Terms::always_open(0, 100);
            assert!(matches!(
                reg.register(a, free),
                Err(RegisterError::Terms(TermsError::Conflict { .. }))
            ));
            assert!(matches!(
                reg.register(ActivityId(4), Terms::always_open(1, 5000)),
                Err(RegisterError::Terms(TermsError::OddsOutOfRange { .. }))
            ));
        }
        let reopened = Activities::open(&db).unwrap();
        assert_eq!(reopened.snapshot().get(a), Some(&terms));
        assert_eq!(reopened.snapshot().len(), 1, "refusals changed nothing");
    }
}
