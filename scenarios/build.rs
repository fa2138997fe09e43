//! Sets `cfg(has_faketime)`, `cfg(has_fuse)`, `cfg(has_postgres)`, `cfg(has_mariadb)` and
//! `cfg(has_nft)` when this machine has them, so that the `scenario` tests whose faults need
//! them are reported as ignored where they cannot run, never as passed.

fn main() {
    use hostprobe::Have;
    hostprobe::emit_cfgs(&[
        Have::Faketime,
        Have::Fuse,
        Have::Postgres,
        Have::MariaDb,
        Have::Nft,
    ]);
}
