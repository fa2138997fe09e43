#![no_main]
//! The server's lottery journal replay (`sut_server::lottery::JournaledStore::open`) over a
//! SQLite file whose records are arbitrary text (one per input line): a typed error or a
//! replayed store, never a panic.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use libfuzzer_sys::fuzz_target;

fn dir() -> &'static tempfile::TempDir {
    static D: OnceLock<tempfile::TempDir> = OnceLock::new();
    // On tmpfs where there is one: the replay's fsyncs are then free, and it is the decoding
    // that is being fuzzed, not the disk.
    D.get_or_init(|| {
        tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("temp dir")
    })
}

fuzz_target!(|data: &[u8]| {
    static N: AtomicU64 = AtomicU64::new(0);
    let path = dir()
        .path()
        .join(format!("j{}.db", N.fetch_add(1, Ordering::Relaxed)));
    {
        let conn = rusqlite::Connection::open(&path).expect("open");
        conn.execute_batch(
            "PRAGMA synchronous=OFF;
             CREATE TABLE server_lottery_journal (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 op  TEXT NOT NULL
             );",
        )
        .expect("schema");
        for line in data.split(|&b| b == b'\n').take(64) {
            let text = String::from_utf8_lossy(line);
            conn.execute(
                "INSERT INTO server_lottery_journal (op) VALUES (?1)",
                [text.as_ref()],
            )
            .expect("insert");
        }
    }
    let _ = sut_server::lottery::JournaledStore::open(&path);
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
});
