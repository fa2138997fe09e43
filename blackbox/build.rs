//! Sets `cfg(has_redis)`, `cfg(has_postgres)`, `cfg(has_mariadb)` and `cfg(has_fuse)` when this
//! machine has them, so that the real-system tests needing them are reported as ignored where
//! they cannot run, never as passed.

fn main() {
    use hostprobe::Have;
    hostprobe::emit_cfgs(&[Have::Redis, Have::Postgres, Have::MariaDb, Have::Fuse]);
}
