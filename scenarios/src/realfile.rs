//! Scenario files that run real systems nobody here wrote under real faults (files under
//! `scenarios/real/`, or any file with a top-level `[cluster]` table): which system, how many
//! clients for how long, and the nemesis. The bench starts the system, owns it, kills it and
//! judges the clients' history (docs/real.md).
//!
//! ```toml
//! name = "redis_incr_rdb"
//! description = "…"
//!
//! [cluster]
//! system = "redis_incr"       # Redis INCR as the ID source; or "postgres_sequence" (nextval),
//!                             # "postgres_sequence_stored", "mariadb_leaf_segment" (Leaf's
//!                             # segment SQL), "mariadb_auto_increment"
//! persistence = "rdb"         # Redis: rdb | aof_everysec | aof_always
//! snapshot_after_s = 3600     # rdb: a snapshot this long after a change
//! # MariaDB: innodb_flush_log_at_trx_commit = 1 (the default: synced at every commit) or 2
//!
//! [clients]
//! count = 4
//! duration_s = 8
//!
//! [nemesis]
//! fault = "kill"              # kill: SIGKILL, then a restart on the same files
//!                             # pause: SIGSTOP, then SIGCONT
//!                             # partition: the clients' link black-holed (a fault proxy)
//!                             # power_loss: SIGKILL and the unsynced writes dropped
//! every_ms = 1500             # time between the end of one fault and the next
//! down_ms = 200               # how long each fault lasts
//! ```

use std::time::Duration;
use sut::fault::MsRange;

use blackbox::real::{Fault, IdRunOptions, IdSystem};
use chaos::RedisPersistence;
use serde::Deserialize;

use crate::LoadError;

/// The named real-system scenarios: name and file text.
pub const NAMED: &[(&str, &str)] = &[
    (
        "redis_incr_rdb",
        include_str!("../real/redis_incr_rdb.toml"),
    ),
    (
        "redis_incr_everysec",
        include_str!("../real/redis_incr_everysec.toml"),
    ),
    (
        "redis_incr_always",
        include_str!("../real/redis_incr_always.toml"),
    ),
    (
        "postgres_sequence",
        include_str!("../real/postgres_sequence.toml"),
    ),
    (
        "postgres_sequence_kill",
        include_str!("../real/postgres_sequence_kill.toml"),
    ),
    (
        "postgres_sequence_pause",
        include_str!("../real/postgres_sequence_pause.toml"),
    ),
    (
        "redis_incr_partition",
        include_str!("../real/redis_incr_partition.toml"),
    ),
    (
        "postgres_sequence_stored",
        include_str!("../real/postgres_sequence_stored.toml"),
    ),
    (
        "mariadb_segment_durable",
        include_str!("../real/mariadb_segment_durable.toml"),
    ),
    (
        "mariadb_segment_flush2",
        include_str!("../real/mariadb_segment_flush2.toml"),
    ),
    (
        "mariadb_auto_increment_kill",
        include_str!("../real/mariadb_auto_increment_kill.toml"),
    ),
    (
        "mariadb_auto_increment_power",
        include_str!("../real/mariadb_auto_increment_power.toml"),
    ),
];

/// A parsed real-system scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RealScenario {
    /// Its name.
    pub name: String,
    /// One line on what it shows.
    pub description: String,
    /// The run.
    pub options: blackbox::real::IdRunOptions,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    description: String,
    cluster: ClusterTable,
    clients: ClientsTable,
    nemesis: NemesisTable,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterTable {
    system: System,
    persistence: Option<Persistence>,
    snapshot_after_s: Option<u32>,
    innodb_flush_log_at_trx_commit: Option<u8>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum System {
    RedisIncr,
    PostgresSequence,
    PostgresSequenceStored,
    MariadbLeafSegment,
    MariadbAutoIncrement,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Persistence {
    Rdb,
    AofEverysec,
    AofAlways,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientsTable {
    count: u64,
    duration_s: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NemesisTable {
    /// A name of the fault vocabulary (`sut::fault`) that real-system runs inject.
    fault: String,
    /// The vocabulary's fault timing (`sut::fault::MsRange`); this runner takes one number.
    every_ms: MsRange,
    down_ms: MsRange,
}

/// Most clients of one run.
const CLIENTS_MAX: u64 = 256;
/// Longest run, seconds.
const DURATION_MAX_S: u64 = 24 * 3600;

/// Whether `text` is a real-system scenario (a top-level `[cluster]` table).
#[must_use]
pub fn is_real_text(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| t.contains_key("cluster"))
}

impl RealScenario {
    /// Parses the file `path` holding `text`.
    ///
    /// # Errors
    /// A malformed file or a value out of range, naming the file and the field.
    pub fn parse(path: &str, text: &str) -> Result<Self, LoadError> {
        let file: File = toml::from_str(text).map_err(|e| LoadError::Real {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let bad = |message: String| LoadError::Real {
            path: path.to_owned(),
            message,
        };
        let is_mariadb = matches!(
            file.cluster.system,
            System::MariadbLeafSegment | System::MariadbAutoIncrement
        );
        if !is_mariadb && file.cluster.innodb_flush_log_at_trx_commit.is_some() {
            return Err(bad(
                "cluster.innodb_flush_log_at_trx_commit applies to the mariadb_* systems only"
                    .into(),
            ));
        }
        let system = match file.cluster.system {
            System::RedisIncr => {
                IdSystem::RedisIncr(redis_persistence(&file.cluster).map_err(bad)?)
            }
            System::MariadbLeafSegment | System::MariadbAutoIncrement => {
                if file.cluster.persistence.is_some() || file.cluster.snapshot_after_s.is_some() {
                    return Err(bad(
                        "cluster.persistence and cluster.snapshot_after_s apply to \
                         system \"redis_incr\" only (MariaDB's durability is \
                         cluster.innodb_flush_log_at_trx_commit)"
                            .into(),
                    ));
                }
                let flush = file.cluster.innodb_flush_log_at_trx_commit.unwrap_or(1);
                if flush > 2 {
                    return Err(bad(format!(
                        "cluster.innodb_flush_log_at_trx_commit must be 0, 1 or 2, not {flush}"
                    )));
                }
                if matches!(file.cluster.system, System::MariadbLeafSegment) {
                    IdSystem::MariaDbLeafSegment { flush }
                } else {
                    IdSystem::MariaDbAutoIncrement { flush }
                }
            }
            System::PostgresSequence | System::PostgresSequenceStored => {
                if file.cluster.persistence.is_some() || file.cluster.snapshot_after_s.is_some() {
                    return Err(bad(
                        "cluster.persistence and cluster.snapshot_after_s apply to \
                         system \"redis_incr\" only (PostgreSQL runs with fsync on)"
                            .into(),
                    ));
                }
                if matches!(file.cluster.system, System::PostgresSequence) {
                    IdSystem::PostgresSequence
                } else {
                    IdSystem::PostgresSequenceStored
                }
            }
        };
        if !(1..=CLIENTS_MAX).contains(&file.clients.count) {
            return Err(bad(format!(
                "clients.count must be 1..={CLIENTS_MAX}, not {}",
                file.clients.count
            )));
        }
        if !(1..=DURATION_MAX_S).contains(&file.clients.duration_s) {
            return Err(bad(format!(
                "clients.duration_s must be 1..={DURATION_MAX_S}, not {}",
                file.clients.duration_s
            )));
        }
        let every_ms = file
            .nemesis
            .every_ms
            .single("nemesis.every_ms")
            .map_err(bad)?;
        let down_ms = file
            .nemesis
            .down_ms
            .single("nemesis.down_ms")
            .map_err(bad)?;
        let fault =
            Fault::parse(&file.nemesis.fault).map_err(|e| bad(format!("nemesis.fault: {e}")))?;
        Ok(Self {
            name: file.name,
            description: file.description,
            options: IdRunOptions {
                system,
                fault,
                clients: file.clients.count,
                duration: Duration::from_secs(file.clients.duration_s),
                every: Duration::from_millis(every_ms),
                down_for: Duration::from_millis(down_ms),
            },
        })
    }
}

/// Whether `name` is a real-system scenario: a named one, or a file with a top-level
/// `[cluster]` table (well formed or not: a malformed one is then reported as such).
#[must_use]
pub fn is_real_scenario(name: &str) -> bool {
    NAMED.iter().any(|(n, _)| *n == name)
        || std::fs::read_to_string(name).is_ok_and(|t| is_real_text(&t))
}

/// Redis's persistence from the `[cluster]` table.
fn redis_persistence(cluster: &ClusterTable) -> Result<RedisPersistence, String> {
    Ok(match (&cluster.persistence, cluster.snapshot_after_s) {
        (None, _) => {
            return Err(
                "cluster.persistence: system \"redis_incr\" needs one of \"rdb\", \
                 \"aof_everysec\", \"aof_always\""
                    .into(),
            );
        }
        (Some(Persistence::Rdb), Some(after_s)) if after_s > 0 => RedisPersistence::Rdb { after_s },
        (Some(Persistence::Rdb), _) => {
            return Err(
                "cluster.snapshot_after_s: persistence \"rdb\" needs a positive number of seconds"
                    .into(),
            );
        }
        (Some(p), Some(_)) => {
            return Err(format!(
                "cluster.snapshot_after_s applies to persistence \"rdb\" only, not {p:?}"
            ));
        }
        (Some(Persistence::AofEverysec), None) => RedisPersistence::AofEverysec,
        (Some(Persistence::AofAlways), None) => RedisPersistence::AofAlways,
    })
}

/// Loads a real-system scenario by name or from a file; `Ok(None)` when `name` is neither.
///
/// # Errors
/// The file cannot be read, or is malformed.
pub fn load(name: &str) -> Result<Option<RealScenario>, LoadError> {
    if let Some((n, text)) = NAMED.iter().find(|(n, _)| *n == name) {
        return RealScenario::parse(&format!("scenarios/real/{n}.toml"), text).map(Some);
    }
    match crate::read_file_of_kind(name, is_real_text)? {
        Some(text) => RealScenario::parse(name, &text).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_file_parses() {
        for (name, text) in NAMED {
            let s = RealScenario::parse(name, text).unwrap();
            assert_eq!(s.name, *name);
            assert!(is_real_text(text));
        }
    }

    #[test]
    fn bad_files_name_the_field() {
        let base = NAMED[0].1;
        for (from, to, needle) in [
            ("count = 4", "count = 0", "clients.count"),
            (
                "snapshot_after_s = 3600",
                "snapshot_after_s = 0",
                "snapshot_after_s",
            ),
            (
                "persistence = \"rdb\"",
                "persistence = \"aof_always\"",
                "applies to persistence \"rdb\" only",
            ),
            ("down_ms = 200", "down_ms = 200\nextra = 1", "unknown field"),
            (
                "system = \"redis_incr\"",
                "system = \"leaf\"",
                "unknown variant",
            ),
        ] {
            assert!(base.contains(from), "{from}");
            let e = RealScenario::parse("x.toml", &base.replace(from, to)).unwrap_err();
            assert!(e.to_string().contains(needle), "{to}: {e}");
            assert!(e.to_string().contains("x.toml"), "{e}");
        }
        // A fault of the one vocabulary that real-system runs do not inject.
        let fault = base
            .lines()
            .find(|l| l.starts_with("fault = "))
            .expect("a fault line");
        for (to, needle) in [
            (
                "fault = \"swizzle\"",
                "nemesis.fault: fault `swizzle` is injected in simulated",
            ),
            ("fault = \"meteor\"", "unknown fault `meteor`"),
        ] {
            let e = RealScenario::parse("x.toml", &base.replace(fault, to)).unwrap_err();
            assert!(e.to_string().contains(needle), "{to}: {e}");
            assert!(e.to_string().contains("x.toml"), "{e}");
        }
    }
}
