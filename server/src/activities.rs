//! The operator's activity registry of one process: the terms of each activity (price, odds,
//! opening hours; `sut::lottery::activity`), written by `POST /admin/activities` (or `--activity`
//! at start) and read by the draw gate, the participants and the one-time token service. A
//! client never names a price: the gate takes it from here.
//!
//! Terms are durable before a registration is answered: an SQLite file beside the database
//! (`<db>.activities`, `synchronous=FULL`) or the table `act_terms` of a PostgreSQL database. The
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
use crate::pg::PgConn;

/// Where a process keeps its terms.
trait TermsFile: Send + std::fmt::Debug {
    /// Every registered activity.
    fn read_all(&mut self) -> Result<Vec<(ActivityId, Terms)>, String>;

    /// Adds `activities` durably, all or none (none is registered yet).
    fn insert(&mut self, activities: &[(ActivityId, Terms)]) -> Result<(), String>;
}

fn sql_id(activity: ActivityId) -> Result<i64, String> {
    i64::try_from(activity.0).map_err(|_| format!("activity id {activity} above 2^63"))
}

fn encode(terms: &Terms) -> Result<String, String> {
    serde_json::to_string(terms).map_err(|e| format!("terms encoding: {e}"))
}

fn decode(activity: i64, text: &str) -> Result<(ActivityId, Terms), String> {
    let id = u64::try_from(activity).map_err(|_| format!("corrupt activity id {activity}"))?;
    let terms = serde_json::from_str(text)
        .map_err(|e| format!("corrupt terms of activity {activity}: {e}"))?;
    Ok((ActivityId(id), terms))
}

/// Terms in an SQLite file.
#[derive(Debug)]
struct SqliteTerms {
    conn: Connection,
}

impl SqliteTerms {
    fn open(path: &Path) -> Result<Self, String> {
        let conn = Connection::open(path).map_err(|e| e.to_string())?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(|e| e.to_string())?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS act_terms (
                activity INTEGER PRIMARY KEY,
                terms    TEXT NOT NULL
            );",
        )
        .map_err(|e| e.to_string())?;
        crate::db::private_file(path)?;
        Ok(Self { conn })
    }
}

impl TermsFile for SqliteTerms {
    fn read_all(&mut self) -> Result<Vec<(ActivityId, Terms)>, String> {
        let mut stmt = self
            .conn
            .prepare("SELECT activity, terms FROM act_terms ORDER BY activity")
            .map_err(|e| e.to_string())?;
        let rows: Vec<(i64, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|e| e.to_string())?
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        rows.iter().map(|(a, t)| decode(*a, t)).collect()
    }

    /// One transaction; `synchronous=FULL` makes its commit durable.
    fn insert(&mut self, activities: &[(ActivityId, Terms)]) -> Result<(), String> {
        let tx = self.conn.transaction().map_err(|e| e.to_string())?;
        {
            let mut stmt = tx
                .prepare_cached("INSERT INTO act_terms (activity, terms) VALUES (?1, ?2)")
                .map_err(|e| e.to_string())?;
            for (activity, terms) in activities {
                stmt.execute(params![sql_id(*activity)?, encode(terms)?])
                    .map_err(|e| e.to_string())?;
            }
        }
        tx.commit().map_err(|e| e.to_string())
    }
}

/// Terms in a PostgreSQL database.
#[derive(Debug)]
struct PgTerms {
    conn: PgConn,
}

impl TermsFile for PgTerms {
    fn read_all(&mut self) -> Result<Vec<(ActivityId, Terms)>, String> {
        let rows = self
            .conn
            .transact(|tx| {
                tx.query(
                    "SELECT activity, terms FROM act_terms ORDER BY activity",
                    &[],
                )
            })
            .map_err(|e: crate::pg::DbError| e.to_string())?;
        rows.iter()
            .map(|r| decode(r.get::<_, i64>(0), &r.get::<_, String>(1)))
            .collect()
    }

    /// One statement, its own transaction: all or none.
    fn insert(&mut self, activities: &[(ActivityId, Terms)]) -> Result<(), String> {
        let ids = activities
            .iter()
            .map(|(a, _)| sql_id(*a))
            .collect::<Result<Vec<i64>, _>>()?;
        let texts = activities
            .iter()
            .map(|(_, t)| encode(t))
            .collect::<Result<Vec<String>, _>>()?;
        self.conn
            .execute_alone(
                "INSERT INTO act_terms (activity, terms) SELECT * FROM unnest($1::bigint[], $2::text[])",
                &[&ids, &texts],
            )
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// No file: a registry that lives as long as its process (tests of the lottery writer alone).
#[derive(Debug)]
struct NoFile;

impl TermsFile for NoFile {
    fn read_all(&mut self) -> Result<Vec<(ActivityId, Terms)>, String> {
        Ok(Vec::new())
    }

    fn insert(&mut self, _: &[(ActivityId, Terms)]) -> Result<(), String> {
        Ok(())
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
        };
        let registry = Registry::from_entries(file.read_all()?)
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
            current: RwLock::new(Arc::new(registry)),
            file: Mutex::new(Box::new(NoFile)),
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
        // One registration at a time: the rule is judged on the registry the insert extends.
        let mut file = lock(&self.file);
        let mut next = (*self.snapshot()).clone();
        let mut created = Vec::new();
        let mut unchanged = 0;
        for id in first.0..first.0.saturating_add(count) {
            match next.register(ActivityId(id), terms)? {
                Registered::Created => created.push((ActivityId(id), terms)),
                Registered::Unchanged => unchanged += 1,
            }
        }
        if !created.is_empty() {
            file.insert(&created).map_err(RegisterError::Store)?;
            *self
                .current
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(next);
        }
        Ok((created.len() as u64, unchanged))
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
