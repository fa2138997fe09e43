//! The lottery journal in PostgreSQL: the table `lot_journal`, appended by one statement (its own
//! transaction: one round trip, one WAL flush with fsync on) per group commit, read in order at start. The
//! writer's connection holds a session advisory lock, so a second process pointed at the same
//! database refuses to start instead of interleaving its records.

use sut::lottery::StoreError;
use sut::lottery::journal::JournalOp;

use super::PgConn;
use crate::lottery::{JournalFile, decode_records, encode_records};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS lot_journal (
    seq BIGSERIAL PRIMARY KEY,
    op  TEXT NOT NULL
);
";

/// The advisory lock key of a journal's writer ("lott").
pub const JOURNAL_LOCK: i64 = 0x6c6f_7474;

/// The journal of a PostgreSQL database.
#[derive(Debug)]
pub struct PgJournal {
    conn: PgConn,
}

impl PgJournal {
    /// Connects, creates the table if missing and claims the database.
    ///
    /// # Errors
    /// Connection failures, or another process holds the claim.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let mut conn = PgConn::open(url, SCHEMA)?;
        conn.claim(JOURNAL_LOCK)?;
        Ok(Self { conn })
    }
}

impl JournalFile for PgJournal {
    fn read_all(&mut self) -> Result<Vec<JournalOp>, StoreError> {
        let texts: Vec<String> = self.conn.transact(|tx| {
            Ok::<_, StoreError>(
                tx.query("SELECT op FROM lot_journal ORDER BY seq", &[])?
                    .iter()
                    .map(|r| r.get::<_, String>(0))
                    .collect(),
            )
        })?;
        decode_records(&texts)
    }

    /// One statement in one transaction: the records keep their order (`unnest` yields them
    /// in array order and `seq` is assigned as they are inserted).
    fn append(&mut self, records: &[JournalOp]) -> Result<(), StoreError> {
        let texts = encode_records(records)?;
        // One statement, its own transaction: the batch is appended whole or not at all, in one
        // round trip (an explicit BEGIN and COMMIT would add two).
        self.conn.execute_alone(
            "INSERT INTO lot_journal (op) SELECT unnest($1::text[])",
            &[&texts],
        )?;
        Ok(())
    }

    /// One transaction: the checkpoint, then the records before it deleted.
    fn checkpoint(&mut self, checkpoint: &JournalOp) -> Result<(), StoreError> {
        let text = encode_records(std::slice::from_ref(checkpoint))?.remove(0);
        self.conn.transact(|tx| {
            let row = tx
                .query(
                    "INSERT INTO lot_journal (op) VALUES ($1) RETURNING seq",
                    &[&text],
                )?
                .into_iter()
                .next()
                .ok_or_else(|| StoreError::Backend {
                    message: "no seq for the checkpoint".into(),
                })?;
            let seq: i64 = row.get(0);
            tx.execute("DELETE FROM lot_journal WHERE seq < $1", &[&seq])?;
            Ok::<_, StoreError>(())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use chaos::Postgres;
    use sut::lottery::{LotteryStore, MemoryStore, UserId};

    use super::*;
    use crate::lottery::{DurableLottery, JournaledStore};
    use crate::pg::{create_database, url_with_database};

    fn fresh(server: &Postgres) -> String {
        static CASE: AtomicU32 = AtomicU32::new(0);
        let name = format!("journal_{}", CASE.fetch_add(1, Ordering::Relaxed));
        create_database(&server.url(), &name).expect("create database");
        url_with_database(&server.url(), &name)
    }

    #[test]
    #[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
    fn committed_batches_replay_to_the_same_ledger_and_uncommitted_ones_vanish() {
        let server = Postgres::start().expect("start PostgreSQL");
        let url = fresh(&server);
        let mut memory = MemoryStore::new();
        crate::lottery::test_support::run_draws(&mut memory);
        {
            let mut store = JournaledStore::with_file(PgJournal::open(&url).unwrap()).unwrap();
            crate::lottery::test_support::run_draws(&mut store);
            store.commit().unwrap();
            // A batch never committed (the process dies before its group commit).
            store.open_account(UserId(2), 5).unwrap();
        }
        let mut again = JournaledStore::with_file(PgJournal::open(&url).unwrap()).unwrap();
        assert!(again.replayed() > 0);
        assert_eq!(again.snapshot().unwrap(), memory.snapshot().unwrap());
    }

    #[test]
    #[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
    fn a_second_writer_on_the_same_database_is_refused() {
        let server = Postgres::start().expect("start PostgreSQL");
        let url = fresh(&server);
        let first = PgJournal::open(&url).expect("the first writer");
        let second = PgJournal::open(&url).expect_err("a second writer must be refused");
        assert!(
            second.to_string().contains("claimed by another process"),
            "{second}"
        );
        drop(first);
        // Once the first is gone (its session ended), the database can be claimed again.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match PgJournal::open(&url) {
                Ok(_) => break,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(e) => panic!("the claim was not released: {e}"),
            }
        }
    }
}
