//! The lost-writes filesystem keeps what was synced and loses what was not, as a machine that
//! loses power does; metadata reaches the backing directory at once.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};

use super::LostFs;

fn mounted() -> (tempfile::TempDir, LostFs) {
    let root = tempfile::tempdir().unwrap();
    fs::create_dir(root.path().join("backing")).unwrap();
    fs::create_dir(root.path().join("mnt")).unwrap();
    let lost = LostFs::mount(&root.path().join("backing"), &root.path().join("mnt")).unwrap();
    (root, lost)
}

fn read(path: &std::path::Path) -> Vec<u8> {
    let mut out = Vec::new();
    File::open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse")]
fn unsynced_writes_are_read_back_until_a_power_loss_drops_them() {
    let (root, lost) = mounted();
    let file = lost.mountpoint().join("log");
    let mut f = File::create(&file).unwrap();
    f.write_all(b"synced;").unwrap();
    f.sync_data().unwrap();
    f.write_all(b"not yet").unwrap();
    drop(f);
    // Through the mount the page cache's view: everything written.
    assert_eq!(read(&file), b"synced;not yet");
    // On the "disk": only what was synced.
    assert_eq!(read(&root.path().join("backing/log")), b"synced;");
    let e = lost.effects();
    assert_eq!((e.synced_bytes, e.unsynced_bytes), (7, 7));

    let after = lost.power_loss();
    assert_eq!(
        (after.lost_bytes, after.files_lost_data, after.power_losses),
        (7, 1, 1)
    );
    assert_eq!(read(&file), b"synced;", "what was never synced is gone");
    assert_eq!(fs::metadata(&file).unwrap().len(), 7);
}

#[test]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse")]
fn appends_overwrites_and_truncation_read_as_a_file_would() {
    let (_root, lost) = mounted();
    let file = lost.mountpoint().join("f");
    fs::write(&file, b"0123456789").unwrap();
    let mut f = OpenOptions::new().append(true).open(&file).unwrap();
    f.write_all(b"ab").unwrap();
    drop(f);
    assert_eq!(read(&file), b"0123456789ab");
    let f = OpenOptions::new().write(true).open(&file).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"XY", 3).unwrap();
    f.set_len(8).unwrap();
    drop(f);
    assert_eq!(read(&file), b"012XY567");
    // None of the data was synced; the truncation to 8 bytes was metadata and reached the
    // backing file at once: after a power loss the file is 8 zero bytes, the "zero-filled
    // tail" a real filesystem can leave behind.
    lost.power_loss();
    assert_eq!(read(&file), [0_u8; 8]);
}

#[test]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse")]
fn metadata_survives_a_power_loss() {
    let (root, lost) = mounted();
    let dir = lost.mountpoint().join("d");
    fs::create_dir(&dir).unwrap();
    let tmp = dir.join("manifest.tmp");
    let mut f = File::create(&tmp).unwrap();
    f.write_all(b"v1").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::rename(&tmp, dir.join("manifest")).unwrap();
    fs::write(dir.join("gone"), b"x").unwrap();
    fs::remove_file(dir.join("gone")).unwrap();
    lost.power_loss();
    assert_eq!(read(&dir.join("manifest")), b"v1");
    assert!(!tmp.exists());
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["manifest"]);
    assert_eq!(read(&root.path().join("backing/d/manifest")), b"v1");
}

#[test]
#[cfg_attr(
    not(all(has_fuse, has_postgres)),
    ignore = "/dev/fuse or PostgreSQL missing"
)]
fn postgres_runs_on_the_mount_and_restarts_after_a_power_loss() {
    let mut pg = crate::Postgres::start_with(true).unwrap();
    pg.create_database("bench").unwrap();
    let lost = pg.power_loss().unwrap();
    assert_eq!(lost.power_losses, 1);
    pg.restart().unwrap();
    pg.create_database("bench2").unwrap();
    assert!(pg.lost_writes().unwrap().synced_bytes > 0);
}
