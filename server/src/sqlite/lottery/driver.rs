//! The lottery driver of `sut::testkit::lottery` (a lossy, duplicating network with coordinator
//! crashes) over three SQLite stores, one per participant node.

use sut::lottery::ParticipantConfig;
use sut::testkit::lottery::World;

use super::SqliteLotteryStore;

/// The same driver over three SQLite stores (one per participant node).
#[test]
fn driver_over_sqlite_stores() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = World::new(11, ParticipantConfig::default(), |p| {
        SqliteLotteryStore::open(dir.path().join(format!("{p:?}.db"))).unwrap()
    });
    w.run(300, 10).unwrap();
    assert!(!w.history().is_empty());
}
