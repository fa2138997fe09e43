//! Sets `cfg(has_redis)` when `redis-server` is on PATH and `cfg(has_postgres)` when PostgreSQL's
//! binaries are on this machine, so that the real-system tests needing them are reported as
//! ignored where they cannot run, never as passed.

fn main() {
    hostprobe::emit_cfgs(&[hostprobe::Have::Redis, hostprobe::Have::Postgres]);
}
