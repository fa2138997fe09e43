#![no_main]
//! The simulated disk (`sim::disk::Wal`) under arbitrary append/sync/crash/recover sequences,
//! against a model: recovery returns exactly the synced records, in order; nothing pending
//! survives a crash; a torn slot is counted and dropped.

use libfuzzer_sys::fuzz_target;
use sim::disk::Wal;

fuzz_target!(|data: &[u8]| {
    let mut wal: Wal<u8> = Wal::default();
    let mut durable: Vec<u8> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut torn_on_disk = 0u64;
    for &b in data.iter().take(4096) {
        match b % 5 {
            0 | 1 => {
                wal.append(b);
                pending.push(b);
            }
            2 => {
                let n = wal.sync();
                assert_eq!(n, pending.len());
                durable.append(&mut pending);
            }
            3 => {
                let loss = wal.crash(b & 0x80 != 0);
                assert_eq!(loss.lost, pending.len() as u64);
                assert_eq!(loss.torn, b & 0x80 != 0 && !pending.is_empty());
                if loss.torn {
                    torn_on_disk += 1;
                }
                pending.clear();
            }
            _ => {
                let (records, torn) = wal.recover();
                assert_eq!(records, durable);
                assert_eq!(torn, torn_on_disk);
                torn_on_disk = 0;
            }
        }
        assert_eq!(wal.durable_len(), durable.len() as u64 + torn_on_disk);
        assert_eq!(wal.pending_len(), pending.len());
    }
});
