//! Sets `cfg(has_postgres)` when PostgreSQL's binaries are on this machine, `cfg(has_mariadb)`
//! when MariaDB's are and `cfg(has_faketime)` when libfaketime is, so that the tests needing
//! them are reported as ignored ("PostgreSQL not installed", "MariaDB not installed",
//! "libfaketime not installed") where they cannot run, never as passed.

fn main() {
    hostprobe::emit_cfgs(&[
        hostprobe::Have::Postgres,
        hostprobe::Have::MariaDb,
        hostprobe::Have::Faketime,
    ]);
}
