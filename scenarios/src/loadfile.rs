//! Load scenario files (`scenarios/load/*.toml`): a load run against the real `sut-server`
//! described like the simulation scenarios, with users, rate, duration and the operation mix.
//!
//! ```toml
//! name = "load_mixed"
//! description = "goose against sut-server: IDs, Snowflake, tokens, one-time tokens, draws"
//!
//! [load]
//! users = 16
//! rate = 1000        # operations/s, constant rate (open model); leave out for a closed loop
//! duration_s = 10    # measured seconds
//! warmup_s = 1       # run before, not measured
//! kills = 0          # > 0: crash_under_load, the server SIGKILLed and restarted this often
//!
//! [load.cluster]     # optional: a real deployment instead of one server (docs/deployment.md)
//! id_servers = 3     # ID servers on one database
//! kill = ["id-2", "wallet"]   # processes SIGKILLed and restarted mid-run, evenly spaced
//! database = "postgres"       # or "mariadb"; or "sqlite": files, nothing to install
//!
//! [load.mix]         # weights per operation kind (at least one positive)
//! id = 4
//! batch = 1
//! snowflake = 2
//! tokens = 1
//! once = 1
//! lottery = 1
//! ```
//!
//! A file is a load scenario when it has a top-level `[load]` table. Errors name the file, the
//! line and the field (`file:line:column: field ...`), as the simulation scenarios' do.

use serde::Deserialize;
use sim::scenario::ScenarioError;
use sut::fault::MsRange;

/// A parsed load scenario.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadScenario {
    /// The scenario's name (the report's `scenario`).
    pub name: String,
    /// One line on what it does (`scenario list`).
    pub description: String,
    /// The run.
    pub load: LoadSpec,
}

/// The `[load]` table.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// Concurrent goose users.
    #[serde(default = "default_users")]
    pub users: u64,
    /// Total operations per second (constant-rate open model); `None`: closed loop.
    #[serde(default)]
    pub rate: Option<f64>,
    /// Measured seconds.
    #[serde(default = "default_duration_s")]
    pub duration_s: u64,
    /// Warm-up seconds (run, not measured). Must be 0 in a crash run.
    #[serde(default = "default_warmup_s")]
    pub warmup_s: u64,
    /// SIGKILLs of the server during the load (0: none; > 0: a `crash_under_load` run).
    #[serde(default)]
    pub kills: u32,
    /// Operation weights.
    pub mix: load::Mix,
    /// Service-level objectives the run must meet (k6's thresholds); none by default.
    #[serde(default)]
    pub thresholds: Thresholds,
    /// A deployment of separate processes on PostgreSQL instead of one server.
    #[serde(default)]
    pub cluster: Option<ClusterSpec>,
}

/// `[load.cluster]`: the deployment a `cluster_pg` run starts (docs/deployment.md).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// ID servers sharing one PostgreSQL database.
    #[serde(default = "default_id_servers")]
    pub id_servers: usize,
    /// Processes SIGKILLed and restarted mid-run, evenly spaced (`id-N`, `token`,
    /// `coordinator`, `wallet`, `inventory`).
    #[serde(default)]
    pub kill: Vec<String>,
    /// `postgres` (a throwaway server, the default) or `sqlite` (files; nothing to install).
    #[serde(default)]
    pub database: ClusterDatabase,
    /// `[load.cluster.chaos]`: every fault kind against the processes (`cluster_chaos`).
    #[serde(default)]
    pub chaos: Option<ChaosSpec>,
}

/// `[load.cluster.chaos]`: the chaos nemesis (docs/real.md). One fault at a time, `every_ms`
/// apart, each held `down_ms`; the kinds take turns in an order drawn from `seed` (`--seed`
/// overrides it).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChaosSpec {
    /// Fault kinds: `kill`, `pause`, `clock`, `partition`, `power_loss`, `db_kill`.
    pub faults: Vec<String>,
    /// From the end of one fault to the start of the next, ms (the vocabulary's timing,
    /// `sut::fault::MsRange`; this runner takes one number).
    pub every_ms: MsRange,
    /// How long each fault holds, ms.
    pub down_ms: MsRange,
    /// Draws the order of the kinds, the targets and the clock steps.
    #[serde(default)]
    pub seed: u64,
}

impl ChaosSpec {
    /// The nemesis's options, `seed` in place of the file's when given.
    ///
    /// # Errors
    /// An unknown fault kind.
    pub fn options(&self, seed: Option<u64>) -> Result<chaos::nemesis::ChaosOptions, String> {
        Ok(chaos::nemesis::ChaosOptions {
            seed: seed.unwrap_or(self.seed),
            faults: self
                .faults
                .iter()
                .map(|f| chaos::nemesis::ChaosFault::parse(f))
                .collect::<Result<_, _>>()?,
            every: std::time::Duration::from_millis(self.every_ms.single("every_ms")?),
            down_for: std::time::Duration::from_millis(self.down_ms.single("down_ms")?),
        })
    }
}

/// Where a deployment keeps its state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterDatabase {
    /// A throwaway PostgreSQL server.
    #[default]
    Postgres,
    /// SQLite files.
    Sqlite,
    /// A throwaway MariaDB server (InnoDB, every commit synced).
    MariaDb,
}

impl ClusterDatabase {
    /// The deployment's backend.
    #[must_use]
    pub const fn backend(self) -> chaos::Backend {
        match self {
            Self::Postgres => chaos::Backend::Postgres,
            Self::Sqlite => chaos::Backend::Sqlite,
            Self::MariaDb => chaos::Backend::MariaDb,
        }
    }
}

fn validate_chaos(c: &ChaosSpec, database: ClusterDatabase) -> Result<(), (&'static str, String)> {
    if database == ClusterDatabase::Sqlite {
        return Err((
            "database",
            "the chaos nemesis needs a database server, postgres or mariadb (power losses, \
             proxied database links)"
                .into(),
        ));
    }
    c.every_ms.single("every_ms").map_err(|m| ("every_ms", m))?;
    let down_ms = c.down_ms.single("down_ms").map_err(|m| ("down_ms", m))?;
    if !(100..=60_000).contains(&down_ms) {
        return Err(("down_ms", format!("{down_ms} is not within 100..=60000")));
    }
    let faults = c.options(None).map_err(|m| ("faults", m))?.faults;
    if faults.is_empty() {
        return Err(("faults", "name at least one fault kind".into()));
    }
    Ok(())
}

fn default_id_servers() -> usize {
    3
}

/// `[load.thresholds]`: what the run must meet, checked after it like the verification (a
/// threshold that is not met fails the run with exit 1, and the gate). Every field is optional.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thresholds {
    /// Every endpoint's corrected P99 latency at most this, ms.
    pub p99_ms: Option<f64>,
    /// Every endpoint's corrected P99.9 latency at most this, ms (judged only on an endpoint
    /// with at least 1,000 requests: below that P99.9 is the maximum).
    pub p999_ms: Option<f64>,
    /// Errors (all endpoints) at most this percent of the requests.
    pub error_rate_pct: Option<f64>,
    /// Requests per second, all endpoints together, at least this.
    pub rps_min: Option<f64>,
}

/// The fewest requests an endpoint needs before its P99.9 is more than its maximum.
pub const P999_SAMPLES_MIN: u64 = reports::model::tail_samples_min(3);

impl Thresholds {
    /// Each threshold set, judged on `report`: `slo.p99_ms` and the like, held or violated
    /// with what was measured.
    #[must_use]
    pub fn check(
        &self,
        report: &reports::model::LoadReport,
    ) -> Vec<reports::model::InvariantResult> {
        let mut results = Vec::new();
        if let Some(max_ms) = self.p99_ms {
            results.push(latency_slo("slo.p99_ms", max_ms, report, 0, |p| p.p99_us));
        }
        if let Some(max_ms) = self.p999_ms {
            results.push(latency_slo(
                "slo.p999_ms",
                max_ms,
                report,
                P999_SAMPLES_MIN,
                |p| p.p999_us,
            ));
        }
        let requests: u64 = report.endpoints.iter().map(|e| e.requests).sum();
        if let Some(max_pct) = self.error_rate_pct {
            let errors: u64 = report
                .endpoints
                .iter()
                .map(reports::model::EndpointStats::error_count)
                .sum();
            let pct = if requests == 0 {
                0.0
            } else {
                errors as f64 * 100.0 / requests as f64
            };
            results.push(slo(
                "slo.error_rate_pct",
                pct <= max_pct,
                format!(
                    "{errors} errors in {requests} requests: {pct:.3} % (threshold {max_pct} %)"
                ),
            ));
        }
        if let Some(min_rps) = self.rps_min {
            let rps: f64 = report.endpoints.iter().map(|e| e.throughput_rps).sum();
            results.push(slo(
                "slo.rps_min",
                rps >= min_rps,
                format!("{rps:.1} requests/s (threshold at least {min_rps})"),
            ));
        }
        results
    }
}

fn slo(name: &str, held: bool, detail: String) -> reports::model::InvariantResult {
    use reports::model::{InvariantResult, Judgement};
    InvariantResult {
        name: name.to_owned(),
        verdict: if held {
            Judgement::Held
        } else {
            Judgement::Violated
        },
        seed: None,
        first_offending_event: None,
        detail: Some(detail),
    }
}

/// A latency threshold over every endpoint with at least `samples_min` requests: held when each
/// one's percentile (picked by `pick`, µs) is at most `max_ms`; the detail names the worst one.
fn latency_slo(
    name: &str,
    max_ms: f64,
    report: &reports::model::LoadReport,
    samples_min: u64,
    pick: fn(&reports::model::Percentiles) -> u64,
) -> reports::model::InvariantResult {
    let judged: Vec<(&str, f64)> = report
        .endpoints
        .iter()
        .filter(|e| e.requests >= samples_min.max(1))
        .map(|e| (e.name.as_str(), pick(&e.corrected) as f64 / 1_000.0))
        .collect();
    let worst = judged.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1));
    match worst {
        None => slo(
            name,
            true,
            format!(
                "no endpoint had {} requests to judge (threshold {max_ms} ms)",
                samples_min.max(1)
            ),
        ),
        Some((endpoint, ms)) => slo(
            name,
            ms <= max_ms,
            format!(
                "worst endpoint `{endpoint}`: {ms:.2} ms (threshold {max_ms} ms, {} endpoint(s) judged)",
                judged.len()
            ),
        ),
    }
}

fn default_users() -> u64 {
    16
}

fn default_duration_s() -> u64 {
    10
}

fn default_warmup_s() -> u64 {
    1
}

/// The named load scenario files, in the order `scenario list` prints them.
pub const NAMED: &[(&str, &str)] = &[
    ("load_id", include_str!("../load/load_id.toml")),
    ("load_mixed", include_str!("../load/load_mixed.toml")),
    ("load_lottery", include_str!("../load/load_lottery.toml")),
    (
        "crash_under_load",
        include_str!("../load/crash_under_load.toml"),
    ),
    ("cluster_pg", include_str!("../load/cluster_pg.toml")),
    (
        "cluster_mariadb",
        include_str!("../load/cluster_mariadb.toml"),
    ),
    ("cluster_chaos", include_str!("../real/cluster_chaos.toml")),
    (
        "cluster_chaos_mariadb",
        include_str!("../real/cluster_chaos_mariadb.toml"),
    ),
];

/// Whether `text` is a load scenario (has a top-level `load` table). Text that is not TOML
/// at all is not (the simulation parser reports its error).
#[must_use]
pub fn is_load_text(text: &str) -> bool {
    text.parse::<toml::Table>()
        .is_ok_and(|t| t.get("load").is_some_and(toml::Value::is_table))
}

/// The offset of the line assigning `field` (`field = ...`), or of the first mention.
fn field_offset(text: &str, field: &str) -> usize {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(field)
            && rest.trim_start().starts_with('=')
        {
            return offset + (line.len() - trimmed.len());
        }
        offset += line.len();
    }
    text.find(field).unwrap_or(0)
}

fn error_at(file: &str, text: &str, offset: usize, message: String) -> ScenarioError {
    ScenarioError::at(file, text, offset, message)
}

impl LoadScenario {
    /// Parses a load scenario from TOML text; `file` names it in errors.
    ///
    /// # Errors
    /// Malformed TOML, an unknown or missing field, or a value out of range, with the file,
    /// line and field.
    pub fn parse(file: &str, text: &str) -> Result<Self, ScenarioError> {
        let scenario: Self = toml::from_str(text).map_err(|err| {
            let offset = err.span().map_or(0, |span| span.start);
            error_at(file, text, offset, err.message().to_owned())
        })?;
        scenario.validate().map_err(|(field, message)| {
            error_at(
                file,
                text,
                field_offset(text, field),
                format!("field `{field}`: {message}"),
            )
        })?;
        Ok(scenario)
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        let l = &self.load;
        if self.name.trim().is_empty() {
            return Err(("name", "must not be empty".into()));
        }
        if l.users == 0 || l.users > load::USERS_MAX {
            return Err((
                "users",
                format!("{} is not within 1..={}", l.users, load::USERS_MAX),
            ));
        }
        if let Some(r) = l.rate
            && !(r.is_finite() && r > 0.0 && r <= RATE_MAX)
        {
            return Err((
                "rate",
                format!(
                    "{r} is not within (0, {RATE_MAX}] operations/s (leave it out for a closed loop)"
                ),
            ));
        }
        if l.duration_s == 0 || l.duration_s + l.warmup_s > load::RUN_MAX_S {
            return Err((
                "duration_s",
                format!(
                    "{} s (plus {} s warm-up) is not within 1..={} s",
                    l.duration_s,
                    l.warmup_s,
                    load::RUN_MAX_S
                ),
            ));
        }
        if l.kills > load::crash::KILLS_MAX {
            return Err((
                "kills",
                format!("{} is over {}", l.kills, load::crash::KILLS_MAX),
            ));
        }
        if l.kills > 0 && l.warmup_s > 0 {
            return Err((
                "warmup_s",
                "a crash run (kills > 0) has no warm-up: set it to 0".into(),
            ));
        }
        if let Some(c) = &l.cluster {
            if l.kills > 0 {
                return Err((
                    "kills",
                    "a deployment run names its kills in [load.cluster] kill".into(),
                ));
            }
            if c.id_servers == 0 || c.id_servers > load::cluster::ID_SERVERS_MAX {
                return Err((
                    "id_servers",
                    format!(
                        "{} is not within 1..={}",
                        c.id_servers,
                        load::cluster::ID_SERVERS_MAX
                    ),
                ));
            }
            for name in &c.kill {
                load::cluster::parse_process(name, c.id_servers).map_err(|m| ("kill", m))?;
            }
            if let Some(chaos) = &c.chaos {
                validate_chaos(chaos, c.database)?;
            }
        }
        l.mix.validate().map_err(|m| ("mix", m))?;
        let t = &l.thresholds;
        for (field, value) in [
            ("p99_ms", t.p99_ms),
            ("p999_ms", t.p999_ms),
            ("error_rate_pct", t.error_rate_pct),
            ("rps_min", t.rps_min),
        ] {
            if let Some(v) = value
                && !(v.is_finite() && v >= 0.0)
            {
                return Err((field, format!("{v} is not a number >= 0")));
            }
        }
        if t.error_rate_pct.is_some_and(|p| p > 100.0) {
            return Err(("error_rate_pct", "is a percentage: at most 100".into()));
        }
        Ok(())
    }
}

/// Highest rate a file may ask for, in operations per second.
pub const RATE_MAX: f64 = 1_000_000.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_files_parse_and_are_named_after_themselves() {
        for (name, text) in NAMED {
            assert!(is_load_text(text), "{name}");
            let s = LoadScenario::parse(name, text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&s.name, name);
            assert!(!s.description.is_empty());
        }
        let crash = LoadScenario::parse("c", NAMED[3].1).unwrap();
        assert!(crash.load.kills > 0);
        // the files keep the catalog workloads' mixes
        let mixed = LoadScenario::parse("m", NAMED[1].1).unwrap();
        assert_eq!(Some(mixed.load.mix), load::Mix::named("mixed"));
        let id = LoadScenario::parse("i", NAMED[0].1).unwrap();
        assert_eq!(Some(id.load.mix), load::Mix::named("id"));
    }

    const GOOD: &str = "name = \"x\"\ndescription = \"d\"\n[load]\nusers = 4\nrate = 100\n\
                        duration_s = 2\n[load.mix]\nid = 1\n";

    #[test]
    fn bad_files_name_file_line_and_field() {
        assert!(LoadScenario::parse("good.toml", GOOD).is_ok());
        let cases = [
            // (text, line, what the message must say)
            (GOOD.replace("users = 4", "users = 0"), 4, "field `users`"),
            (GOOD.replace("rate = 100", "rate = -5"), 5, "field `rate`"),
            (
                GOOD.replace("duration_s = 2", "duration_s = 0"),
                6,
                "field `duration_s`",
            ),
            (GOOD.replace("id = 1", "id = 0"), 7, "field `mix`"),
            (GOOD.replace("id = 1", "idd = 1"), 8, "unknown field `idd`"),
            (
                GOOD.replace("users = 4", "userz = 4"),
                4,
                "unknown field `userz`",
            ),
            (
                GOOD.replace("rate = 100", "rate = \"fast\""),
                5,
                "expected f64",
            ),
            (
                GOOD.replace("[load]\n", "[load]\nkills = 2\nwarmup_s = 1\n"),
                5,
                "field `warmup_s`",
            ),
        ];
        for (text, line, what) in cases {
            let err = LoadScenario::parse("bad.toml", &text).unwrap_err();
            assert_eq!(err.file, "bad.toml");
            assert_eq!(err.line, line, "{err}\n{text}");
            assert!(err.to_string().contains(what), "{err}");
        }
        let bad_slo = GOOD.to_owned() + "[load.thresholds]\np99_ms = -1\n";
        let err = LoadScenario::parse("slo.toml", &bad_slo).unwrap_err();
        assert_eq!(err.line, 10, "{err}");
        assert!(err.to_string().contains("field `p99_ms`"), "{err}");
        let unknown = GOOD.to_owned() + "[load.thresholds]\np95_ms = 3\n";
        let err = LoadScenario::parse("slo.toml", &unknown).unwrap_err();
        assert!(err.to_string().contains("unknown field `p95_ms`"), "{err}");
        let missing = LoadScenario::parse("m.toml", "name = \"x\"\ndescription = \"d\"\n[load]\n")
            .unwrap_err();
        assert!(missing.message.contains("mix"), "{missing}");
    }

    #[test]
    fn a_cluster_table_names_its_servers_kills_and_database() {
        let named = LoadScenario::parse("c", NAMED[4].1).unwrap();
        let cluster = named.load.cluster.expect("cluster_pg has [load.cluster]");
        assert_eq!(cluster.id_servers, 3);
        assert_eq!(cluster.kill, ["id-2", "wallet"]);
        assert_eq!(cluster.database, ClusterDatabase::Postgres);
        let sqlite = GOOD.replace(
            "[load.mix]",
            "[load.cluster]\nid_servers = 2\ndatabase = \"sqlite\"\n[load.mix]",
        );
        let parsed = LoadScenario::parse("s", &sqlite).unwrap();
        assert_eq!(
            parsed.load.cluster.map(|c| c.database.backend()),
            Some(chaos::Backend::Sqlite)
        );
        let mariadb = GOOD.replace(
            "[load.mix]",
            "[load.cluster]\nid_servers = 2\ndatabase = \"mariadb\"\n[load.mix]",
        );
        let parsed = LoadScenario::parse("m", &mariadb).unwrap();
        assert_eq!(
            parsed.load.cluster.map(|c| c.database.backend()),
            Some(chaos::Backend::MariaDb)
        );
        for (bad, needle) in [
            ("database = \"mysql\"", "unknown variant `mysql`"),
            ("kill = [\"id-3\"]", "field `kill`"),
            ("id_servers = 0", "field `id_servers`"),
            (
                "[load.cluster.chaos]\nfaults = [\"meteor\"]\nevery_ms = 1\ndown_ms = 500",
                "unknown fault `meteor`",
            ),
            (
                "[load.cluster.chaos]\nfaults = [\"kill\"]\nevery_ms = 1\ndown_ms = 5",
                "field `down_ms`",
            ),
            (
                "database = \"sqlite\"\n[load.cluster.chaos]\nfaults = [\"kill\"]\nevery_ms = 1\ndown_ms = 500",
                "needs a database server",
            ),
        ] {
            let text = GOOD.replace(
                "[load.mix]",
                &format!("[load.cluster]\nid_servers = 2\n{bad}\n[load.mix]"),
            );
            let text = text.replace("id_servers = 2\nid_servers = 0", "id_servers = 0");
            let err = LoadScenario::parse("bad.toml", &text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn only_files_with_a_load_table_are_load_scenarios() {
        assert!(is_load_text(GOOD));
        assert!(!is_load_text(
            "name = \"s\"\ndescription = \"d\"\n[workload]\nrate_per_s = 5\n"
        ));
        assert!(!is_load_text("load = 5\n"));
        assert!(!is_load_text("not toml ["));
    }

    fn endpoint(
        name: &str,
        requests: u64,
        errors: u64,
        p99_us: u64,
        p999_us: u64,
    ) -> reports::model::EndpointStats {
        let p = reports::model::Percentiles {
            p50_us: 100,
            p90_us: 200,
            p99_us,
            p999_us,
            p9999_us: p999_us,
            max_us: p999_us,
        };
        reports::model::EndpointStats {
            name: name.to_owned(),
            requests,
            errors: [("http_503".to_owned(), errors)].into(),
            throughput_rps: requests as f64 / 10.0,
            corrected: p,
            uncorrected: p,
            distribution: Vec::new(),
            over_time: Vec::new(),
        }
    }

    fn report(endpoints: Vec<reports::model::EndpointStats>) -> reports::model::LoadReport {
        reports::model::LoadReport {
            scenario: "t".into(),
            target: "test".into(),
            duration_s: 10.0,
            warmup_s: 0.0,
            rate: None,
            users: 1,
            endpoints,
            server: Vec::new(),
            fault_windows: Vec::new(),
            verification: Vec::new(),
            concurrency: None,
            ramp: None,
        }
    }

    #[test]
    fn thresholds_hold_and_fire_on_what_was_measured() {
        use reports::model::Judgement;
        let t = Thresholds {
            p99_ms: Some(5.0),
            p999_ms: Some(20.0),
            error_rate_pct: Some(1.0),
            rps_min: Some(100.0),
        };
        let good = report(vec![
            endpoint("id", 2_000, 10, 4_000, 15_000),
            endpoint("batch", 500, 0, 2_000, 90_000),
        ]);
        let results = t.check(&good);
        assert_eq!(results.len(), 4);
        assert!(
            results.iter().all(|r| r.verdict == Judgement::Held),
            "{results:?}"
        );
        // `batch` has too few requests for its P99.9 (its maximum) to be judged.
        assert!(
            results[1]
                .detail
                .as_deref()
                .unwrap_or("")
                .contains("1 endpoint(s) judged"),
            "{results:?}"
        );

        let bad = report(vec![endpoint("id", 2_000, 30, 7_500, 25_000)]);
        let results = t.check(&bad);
        let verdict = |name: &str| results.iter().find(|r| r.name == name).map(|r| r.verdict);
        assert_eq!(verdict("slo.p99_ms"), Some(Judgement::Violated));
        assert_eq!(verdict("slo.p999_ms"), Some(Judgement::Violated));
        assert_eq!(verdict("slo.error_rate_pct"), Some(Judgement::Violated));
        assert_eq!(verdict("slo.rps_min"), Some(Judgement::Held));
        let p99 = results
            .iter()
            .find(|r| r.name == "slo.p99_ms")
            .and_then(|r| r.detail.clone());
        assert_eq!(
            p99.as_deref(),
            Some("worst endpoint `id`: 7.50 ms (threshold 5 ms, 1 endpoint(s) judged)")
        );
        assert!(
            Thresholds::default().check(&bad).is_empty(),
            "no threshold, nothing judged"
        );
    }
}
