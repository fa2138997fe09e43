//! Mounts the lost-writes filesystem at MOUNTPOINT over BACKING until standard input closes or a
//! line is read; `loss` on a line drops every unsynced write (a power loss). For trying a
//! program's files on it by hand: `cargo run -p chaos --example lostfs_mount -- BACKING MNT`.

use std::io::BufRead;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, backing, mountpoint] = args.as_slice() else {
        eprintln!("usage: lostfs_mount BACKING MOUNTPOINT");
        std::process::exit(2);
    };
    let fs = match chaos::LostFs::mount(backing.as_ref(), mountpoint.as_ref()) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("lostfs_mount: {e}");
            std::process::exit(1);
        }
    };
    println!("mounted at {mountpoint}");
    for line in std::io::stdin().lock().lines() {
        match line.as_deref().map(str::trim) {
            Ok("loss") => println!("{:?}", fs.power_loss()),
            Ok(_) => println!("{:?}", fs.effects()),
            Err(_) => break,
        }
    }
}
