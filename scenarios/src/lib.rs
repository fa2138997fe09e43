//! The `scenario` command's library half: the catalog of named scenarios and what each needs.
//!
//! Scenario files (TOML, under `scenarios/scenarios/`) arrive with the simulator; until then the
//! catalog records, honestly, which scenarios exist as names and that none can run yet.

/// One entry of the catalog: a name, a one-line description, and whether this build can run it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The name given on the command line (`scenario NAME`).
    pub name: &'static str,
    /// One line saying what the scenario exercises.
    pub description: &'static str,
    /// `None` when it can run; otherwise what is missing.
    pub missing: Option<&'static str>,
}

const SIM: &str = "the deterministic simulator (`sim`) is not built yet";

/// Every scenario name the bench promises, in the order `scenario list` prints them.
pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        name: "clock_skew",
        description: "per-node clock bumps (±288 s), strobes and drift against segment leases and Snowflake",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "partition",
        description: "symmetric, one-way and majority/minority partitions",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "swizzle",
        description: "swizzle-clog: clog nodes one by one, heal in random order",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "crash_restart",
        description: "kill and restart nodes, losing unsynced writes",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "pause",
        description: "GC-like pauses that outlive leases",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "segment_race",
        description: "many allocators racing one tag under faults",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "snowflake_rollback",
        description: "Snowflake workers under backward clock jumps and restarts",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "token_replay",
        description: "one-time tokens consumed concurrently and replayed",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "tcc_storm",
        description: "lottery draws under message loss, duplication and coordinator crashes",
        missing: Some(SIM),
    },
    CatalogEntry {
        name: "chaos",
        description: "all faults at once",
        missing: Some(SIM),
    },
];

/// Looks a scenario up by name.
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|entry| entry.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_names_are_unique_and_findable() {
        for (i, entry) in CATALOG.iter().enumerate() {
            assert_eq!(find(entry.name), Some(entry));
            assert!(CATALOG[..i].iter().all(|other| other.name != entry.name));
        }
        assert!(find("clock_skew").is_some());
        assert!(find("no_such_scenario").is_none());
    }
}
