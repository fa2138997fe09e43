//! The lottery journal in MariaDB: the table `lot_journal`, appended by one multi-row `INSERT`
//! per group commit (its own transaction: one round trip, one redo-log flush), read in order
//! at start. The writer's connection holds a named lock (`GET_LOCK`), so a second process
//! pointed at the same database refuses to start instead of interleaving its records.

use mysql_async::Value;
use sut::lottery::StoreError;
use sut::lottery::journal::JournalOp;

use super::{MyConn, get_text, get_u64, params};
use crate::lottery::{JournalFile, decode_records, encode_records};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS lot_journal (
    seq BIGINT AUTO_INCREMENT PRIMARY KEY,
    op  LONGTEXT NOT NULL
) ENGINE = InnoDB;
";

/// The lock a journal's writer holds.
pub const JOURNAL_LOCK: &str = "lottery-journal";

/// Records in one `INSERT` at most (a statement takes at most 65,535 parameters); a larger
/// batch is several statements in one transaction.
const APPEND_ROWS_MAX: usize = 1_000;

/// The journal of a MariaDB database.
#[derive(Debug)]
pub struct MyJournal {
    conn: MyConn,
}

impl MyJournal {
    /// Connects, creates the table if missing and claims the database.
    ///
    /// # Errors
    /// Connection failures, or another process holds the claim.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let mut conn = MyConn::open(url, SCHEMA)?;
        conn.claim(JOURNAL_LOCK)?;
        Ok(Self { conn })
    }
}

/// `INSERT INTO lot_journal (op) VALUES (?), (?), …` for `rows` records.
fn insert_sql(rows: usize) -> String {
    let mut sql = String::from("INSERT INTO lot_journal (op) VALUES (?)");
    for _ in 1..rows {
        sql.push_str(", (?)");
    }
    sql
}

impl JournalFile for MyJournal {
    fn read_all(&mut self) -> Result<Vec<JournalOp>, StoreError> {
        let texts: Vec<String> = self.conn.transact(|tx| {
            tx.query("SELECT op FROM lot_journal ORDER BY seq", Vec::new())?
                .iter()
                .map(|r| get_text(r, 0, "op").map_err(StoreError::from))
                .collect::<Result<_, StoreError>>()
        })?;
        decode_records(&texts)
    }

    /// The records keep their order: `seq` is assigned as the rows of an `INSERT` are
    /// inserted, in the order of its `VALUES`.
    fn append(&mut self, records: &[JournalOp]) -> Result<(), StoreError> {
        let texts = encode_records(records)?;
        if texts.is_empty() {
            return Ok(());
        }
        if texts.len() <= APPEND_ROWS_MAX {
            // One statement, its own transaction: the batch is appended whole or not at all,
            // in one round trip (an explicit BEGIN and COMMIT would add two).
            let values = texts.into_iter().map(Value::from).collect::<Vec<_>>();
            self.conn.execute_alone(&insert_sql(values.len()), values)?;
            return Ok(());
        }
        self.conn.transact(|tx| {
            for chunk in texts.chunks(APPEND_ROWS_MAX) {
                let values = chunk.iter().map(|t| Value::from(t.as_str())).collect();
                tx.execute(&insert_sql(chunk.len()), values)?;
            }
            Ok::<_, StoreError>(())
        })
    }

    /// One transaction: the checkpoint, then the records before it deleted.
    fn checkpoint(&mut self, checkpoint: &JournalOp) -> Result<(), StoreError> {
        let text = encode_records(std::slice::from_ref(checkpoint))?.remove(0);
        self.conn.transact(|tx| {
            tx.execute(&insert_sql(1), params![text.as_str()])?;
            let row = tx
                .query_opt("SELECT LAST_INSERT_ID()", Vec::new())?
                .ok_or_else(|| StoreError::Backend {
                    message: "no seq for the checkpoint".into(),
                })?;
            let seq = get_u64(&row, 0, "checkpoint seq")?;
            tx.execute(
                "DELETE FROM lot_journal WHERE seq < ?",
                params![crate::sqldb::to_sql(seq)],
            )?;
            Ok::<_, StoreError>(())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use chaos::MariaDb;
    use sut::lottery::{LotteryStore, MemoryStore, UserId};

    use super::*;
    use crate::lottery::{DurableLottery, JournaledStore};
    use crate::mysql::create_database;
    use crate::sqldb::url_with_database;

    fn fresh(server: &MariaDb) -> String {
        static CASE: AtomicU32 = AtomicU32::new(0);
        let name = format!("journal_{}", CASE.fetch_add(1, Ordering::Relaxed));
        create_database(&server.url(), &name).expect("create database");
        url_with_database(&server.url(), &name)
    }

    #[test]
    #[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
    fn committed_batches_replay_to_the_same_ledger_and_uncommitted_ones_vanish() {
        let server = MariaDb::start().expect("start MariaDB");
        let url = fresh(&server);
        let mut memory = MemoryStore::new();
        crate::lottery::test_support::run_draws(&mut memory);
        {
            let mut store = JournaledStore::with_file(MyJournal::open(&url).unwrap()).unwrap();
            crate::lottery::test_support::run_draws(&mut store);
            store.commit().unwrap();
            // A batch never committed (the process dies before its group commit).
            store.open_account(UserId(2), 5).unwrap();
        }
        let mut again = JournaledStore::with_file(MyJournal::open(&url).unwrap()).unwrap();
        assert!(again.replayed() > 0);
        assert_eq!(again.snapshot().unwrap(), memory.snapshot().unwrap());
    }

    #[test]
    #[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
    fn a_large_batch_and_a_checkpoint_keep_the_records_in_order() {
        let server = MariaDb::start().expect("start MariaDB");
        let url = fresh(&server);
        let mut memory = MemoryStore::new();
        let mut store = JournaledStore::with_file(MyJournal::open(&url).unwrap())
            .unwrap()
            .with_checkpoint_every(APPEND_ROWS_MAX as u64 + 200);
        // More records than one INSERT takes, in one group commit, and then a checkpoint.
        for user in 0..(APPEND_ROWS_MAX as u64 + 500) {
            memory.open_account(UserId(user), user).unwrap();
            store.open_account(UserId(user), user).unwrap();
        }
        store.commit().unwrap();
        assert_eq!(store.checkpoints(), 1);
        memory.open_account(UserId(u64::MAX), 1).unwrap();
        store.open_account(UserId(u64::MAX), 1).unwrap();
        store.commit().unwrap();
        drop(store);
        let mut again = JournaledStore::with_file(MyJournal::open(&url).unwrap()).unwrap();
        assert_eq!(again.snapshot().unwrap(), memory.snapshot().unwrap());
    }

    #[test]
    #[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
    fn a_second_writer_on_the_same_database_is_refused() {
        let server = MariaDb::start().expect("start MariaDB");
        let url = fresh(&server);
        let first = MyJournal::open(&url).expect("the first writer");
        let second = MyJournal::open(&url).expect_err("a second writer must be refused");
        assert!(
            second.to_string().contains("claimed by another process"),
            "{second}"
        );
        // Another database on the same server is another journal.
        let other = fresh(&server);
        MyJournal::open(&other).expect("a writer of another database");
        drop(first);
        // Once the first is gone (its session ended), the database can be claimed again.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match MyJournal::open(&url) {
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
