//! Sample reports built from FAKE data, for looking at the rendering (and for the tests).
//!
//! Nothing here was measured: the numbers are invented to resemble a simulation with a clock
//! nemesis, a model check of a flawed segment allocator, a constant-rate load run with a server
//! kill, and the known-flaws catalog. Deterministic (a fixed xorshift generator), so the output
//! is the same on every run.
//!
//! ```text
//! cargo run -p reports --example sample -- [OUT_DIR]     # default: target/reports-sample
//! ```
//! writes `OUT_DIR/{simulation,model,load,gate}/index.html` (+ `summary.json`), and for the
//! combined gate run also `junit.xml`, `baseline.toml`, and prints the gate table.

use std::collections::BTreeMap;
use std::path::PathBuf;

use reports::model::*;

/// xorshift64*: deterministic noise for the fake data.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `[1 - spread, 1 + spread]`.
    fn around(&mut self, spread: f64) -> f64 {
        1.0 + spread * (2.0 * self.next() - 1.0)
    }
}

fn in_span(t: u64, start: u64, end: u64) -> bool {
    (start..end).contains(&t)
}

/// The injected faults of the fake simulation.
fn sample_faults() -> Vec<FaultSpan> {
    let fault =
        |node: &str, kind: &str, start_ms: u64, end_ms: Option<u64>, detail: &str| FaultSpan {
            node: node.into(),
            kind: kind.into(),
            start_ms,
            end_ms,
            detail: detail.into(),
        };
    vec![
        fault(
            "net",
            "loss",
            5_000,
            Some(20_000),
            "5% packet loss on every link",
        ),
        fault(
            "alloc-2",
            "partition",
            10_000,
            Some(18_000),
            "alloc-2 | alloc-1, alloc-3, db-1 (symmetric)",
        ),
        fault(
            "alloc-1",
            "kill",
            25_000,
            Some(27_500),
            "kill + restart; 3 pending writes lost",
        ),
        fault(
            "alloc-3",
            "pause",
            32_000,
            Some(34_500),
            "GC-like stall 2.5 s",
        ),
        fault("alloc-2", "clock_bump", 40_000, None, "-1500 ms"),
        fault(
            "alloc-3",
            "clock_strobe",
            45_000,
            Some(50_000),
            "±300 ms every 250 ms",
        ),
        fault("alloc-1", "drift", 0, Some(60_000), "+200 ppm"),
        fault("net", "latency", 50_000, Some(55_000), "+250 ms p99"),
        fault(
            "db-1",
            "partition",
            52_000,
            Some(56_000),
            "one-way db-1 -> alloc-1",
        ),
    ]
}

/// Each node's clock offset, every 250 ms (so the strobe's back-and-forth is visible).
fn sample_clock_offsets(nodes: &[String]) -> Vec<ClockSeries> {
    let mut clock_offsets = Vec::new();
    for node in nodes {
        let points = (0..=360u64)
            .map(|i| {
                let t = i * 250;
                let offset = match node.as_str() {
                    "alloc-1" => (t.min(60_000) as f64 * 200e-6) as i64,
                    "alloc-2" if in_span(t, 40_000, 60_000) => -1500,
                    "alloc-3" if in_span(t, 45_000, 50_000) => {
                        if (t / 250) % 2 == 0 {
                            300
                        } else {
                            -300
                        }
                    }
                    _ => 0,
                };
                (t, offset)
            })
            .collect();
        clock_offsets.push(ClockSeries {
            node: node.clone(),
            points,
        });
    }
    clock_offsets
}

/// Operations per second, fewer and failing during the disturbances.
fn sample_ops(n: &mut Noise) -> Vec<OpsBucket> {
    (0..90u64)
        .map(|s| {
            let t = s * 1000;
            let disturbed = in_span(t, 10_000, 18_000)
                || in_span(t, 25_000, 27_500)
                || in_span(t, 32_000, 34_500);
            let ok = (180.0 * n.around(0.08) * if disturbed { 0.62 } else { 1.0 }) as u64;
            let failed = if disturbed {
                (40.0 * n.around(0.3)) as u64
            } else {
                (2.0 * n.next()) as u64
            };
            let indeterminate = if in_span(t, 25_000, 28_000) || in_span(t, 32_000, 35_000) {
                (15.0 * n.around(0.4)) as u64
            } else {
                0
            };
            OpsBucket {
                t_ms: t,
                ok,
                failed,
                indeterminate,
            }
        })
        .collect()
}

/// The invariants: one violated (at `offending`), one not checked, the rest held.
fn sample_invariants(offending: &str) -> Vec<InvariantResult> {
    let mut invariants: Vec<InvariantResult> = [
        "ids.unique",
        "ids.gap_bounded",
        "tokens.single_use",
        "lottery.conservation",
        "lottery.settled",
    ]
    .iter()
    .map(|n| InvariantResult::held(*n))
    .collect();
    invariants.insert(
        1,
        InvariantResult {
            name: "ids.monotonic".into(),
            verdict: Judgement::Violated,
            seed: Some(1042),
            first_offending_event: Some(offending.into()),
            detail: Some("worker 7 went backwards by 16 after a backward clock bump (flaw: snowflake_seq_reset_before_check)".into()),
        },
    );
    invariants.push(InvariantResult {
        name: "lottery.no_hanging".into(),
        verdict: Judgement::NotChecked,
        seed: None,
        first_offending_event: None,
        detail: Some("scenario runs no lottery".into()),
    });
    invariants
}

/// How often each fault took effect (one never did).
fn sample_fault_effects() -> BTreeMap<String, u64> {
    [
        ("partition.dropped_messages", 1843),
        ("crash.lost_pending_writes", 37),
        ("crash.torn_writes", 2),
        ("pause.timeouts_fired", 14),
        ("clock.rollback_waits", 9),
        ("clock.backward_jumps", 3),
        ("clock.strobe_rejections", 0),
        ("loss.dropped_packets", 512),
        ("latency.delayed_messages", 880),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), *v))
    .collect()
}

/// A failing clock-skew simulation (fake).
pub fn sample_simulation() -> SimulationReport {
    let mut n = Noise(0x5EED_1042);
    let nodes: Vec<String> = ["alloc-1", "alloc-2", "alloc-3", "db-1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let offending = "#18231 t=40.002s alloc-2 issued 7340032001 after 7340032017 (wall clock stepped back 1500 ms)";
    SimulationReport {
        scenario: "clock_skew".into(),
        seeds: Seeds::Range {
            start: 1000,
            end: 1100,
        },
        seeds_run: 100,
        timeline_seed: Some(1042),
        replay_command: Some("cargo run --bin scenario clock_skew -- --seed 1042".into()),
        sim_seconds: 9000.0,
        wall_seconds: 41.7,
        events: 18_422_113,
        clock_offsets: sample_clock_offsets(&nodes),
        nodes,
        phases: vec![
            Phase {
                name: "safety".into(),
                start_ms: 0,
                end_ms: 60_000,
            },
            Phase {
                name: "liveness".into(),
                start_ms: 60_000,
                end_ms: 90_000,
            },
        ],
        faults: sample_faults(),
        ops_over_time: sample_ops(&mut n),
        invariants: sample_invariants(offending),
        violations: vec![Violation {
            seed: 1042,
            invariant: "ids.monotonic".into(),
            detail: offending.into(),
            replay: Some(
                "cargo run --release --bin scenario -- clock_skew --seed 1042 --seeds 1".into(),
            ),
            crash_point: None,
        }],
        fault_effects: sample_fault_effects(),
        // Unlisted counters are shown as effects; the sample's are all effects.
        counter_groups: BTreeMap::new(),
        operations: vec![OperationRow {
            kind: "draw".into(),
            ok: 341,
            failed: 235,
            no_answer: 310,
            reasons: vec![
                ("cancelled: the inventory participant refused the Try: activity N is out of stock".into(), 116),
                ("cancelled: the participation participant refused the Try: user N already takes part in activity N (draw N)".into(), 119),
            ],
        }],
        edges: vec![
            EdgeRow {
                name: "participant.empty_rollback".into(),
                about: "a Cancel found no Try: the fence records an empty rollback".into(),
                reached: 14,
                seeds_reached: 5,
                owned_from_seeds: Some(8),
            },
            EdgeRow {
                name: "wheel.fired_late".into(),
                about: "a compensation timer fired after its deadline".into(),
                reached: 0,
                seeds_reached: 0,
                owned_from_seeds: None,
            },
        ],
        crash_points: Some(Box::new(CrashPointsReport {
            budget: 8,
            seeds: 100,
            runs: 800,
            found: 3,
            tried: 3,
            failed: 0,
            unreached: 0,
            points: vec![
                CrashPointRow {
                    point: "coord send tcc.try.wallet".into(),
                    found_in_seeds: 100,
                    tried: 31,
                    failed: 0,
                },
                CrashPointRow {
                    point: "id recv store_reply.worker_ok".into(),
                    found_in_seeds: 100,
                    tried: 28,
                    failed: 0,
                },
                CrashPointRow {
                    point: "wallet after_sync execute_try".into(),
                    found_in_seeds: 97,
                    tried: 25,
                    failed: 0,
                },
            ],
        })),
    }
}

/// A model check of a flawed segment allocator (fake).
pub fn sample_model() -> ModelReport {
    let cex = [
        "client-1 -> alloc-1: NextId{tag=order}",
        "client-2 -> alloc-2: NextId{tag=order}",
        "alloc-1 -> store: LoadSegment{tag=order, version=0}",
        "alloc-2 -> store: LoadSegment{tag=order, version=0}",
        "store -> alloc-1: Segment{range=1..1000, version=1}",
        "store -> alloc-2: Segment{range=1..1000, version=1}",
        "alloc-1 -> client-1: Id{1}",
        "alloc-2 -> client-2: Id{1}",
        "ids.unique violated: id 1 issued to client-1 and client-2",
    ];
    ModelReport {
        model: "segment_alloc (flaw: reload_without_version_check)".into(),
        flaw: None,
        threads: 0,
        depth_limit: None,
        exhaustive: false,
        edges: std::collections::BTreeMap::new(),
        states: 1_284_311,
        unique_states: 18_342,
        max_depth: 23,
        wall_seconds: 2.41,
        states_per_second: 532_908.0,
        properties: vec![
            PropertyReport {
                name: "ids.unique".into(),
                kind: PropertyKind::Always,
                verdict: PropertyVerdict::Violated,
                counterexample: Some(cex.iter().map(|s| s.to_string()).collect()),
                example: None,
            },
            PropertyReport {
                name: "ids.monotonic".into(),
                kind: PropertyKind::Always,
                verdict: PropertyVerdict::Holds,
                counterexample: None,
                example: None,
            },
            PropertyReport {
                name: "segment reload happens".into(),
                kind: PropertyKind::Sometimes,
                verdict: PropertyVerdict::Found,
                counterexample: Some(vec![
                    "client-1 -> alloc-1: NextId{tag=order}".into(),
                    "alloc-1 -> store: LoadSegment{tag=order, version=0}".into(),
                    "store -> alloc-1: Segment{range=1..1000, version=1}".into(),
                ]),
                example: None,
            },
            PropertyReport {
                name: "every request answered".into(),
                kind: PropertyKind::Eventually,
                verdict: PropertyVerdict::Holds,
                counterexample: None,
                example: None,
            },
        ],
    }
}

/// Quantiles as HdrHistogram's percentile output spaces them: denser towards the tail.
fn quantiles() -> Vec<f64> {
    (0..=50)
        .map(|k| 1.0 - 10f64.powf(-f64::from(k) / 10.0))
        .collect()
}

struct EndpointShape {
    name: &'static str,
    share: f64,
    p50_us: f64,
    error_rate: f64,
}

/// The fake load's endpoints: their share of the rate, median latency and error rate.
fn endpoint_shapes() -> [EndpointShape; 5] {
    [
        EndpointShape {
            name: "health",
            share: 0.10,
            p50_us: 180.0,
            error_rate: 0.0,
        },
        EndpointShape {
            name: "allocate",
            share: 0.40,
            p50_us: 420.0,
            error_rate: 0.0004,
        },
        EndpointShape {
            name: "token_issue",
            share: 0.15,
            p50_us: 650.0,
            error_rate: 0.0,
        },
        EndpointShape {
            name: "token_submit",
            share: 0.15,
            p50_us: 900.0,
            error_rate: 0.002,
        },
        EndpointShape {
            name: "lottery_draw",
            share: 0.20,
            p50_us: 2100.0,
            error_rate: 0.004,
        },
    ]
}

/// The fake run: its rate, length and kill window (seconds).
struct LoadRun {
    rate: f64,
    duration_s: f64,
    kill: (f64, f64),
}

/// One endpoint's per-second figures: nothing during the kill, a catch-up after the restart.
fn sample_over_time(
    s: &EndpointShape,
    n: &mut Noise,
    rps: f64,
    run: &LoadRun,
) -> Vec<IntervalStats> {
    let kill = run.kill;
    (0..run.duration_s as u64)
        .map(|t| {
            let t_s = t as f64;
            let (p50, p99, p999, rps_t) = if t_s >= kill.0 && t_s < kill.1 {
                (0.0, 0.0, 0.0, 0.0)
            } else if t_s >= kill.1 && t_s < kill.1 + 4.0 {
                // Catch-up after restart: queued requests are sent late.
                let late = (kill.1 + 4.0 - t_s) * 1_500_000.0;
                (late * 0.5, late, late * 1.05, rps * 2.2 * n.around(0.1))
            } else {
                (
                    s.p50_us * n.around(0.1),
                    s.p50_us * 4.0 * n.around(0.25),
                    s.p50_us * 9.0 * n.around(0.35),
                    rps * n.around(0.03),
                )
            };
            IntervalStats {
                t_s,
                p50_us: p50 as u64,
                p99_us: p99 as u64,
                p999_us: p999 as u64,
                max_us: (p999 * 1.6) as u64,
                rps: rps_t,
                errors: 0,
            }
        })
        .collect()
}

/// One endpoint's statistics.
fn sample_endpoint(s: &EndpointShape, n: &mut Noise, run: &LoadRun) -> EndpointStats {
    let (duration_s, kill) = (run.duration_s, run.kill);
    let rps = run.rate * s.share;
    let requests = (rps * duration_s) as u64;
    // Corrected latency: the kill window (6 s of 120 s = 5%) shows up from P95 on,
    // up to the 6 s outage; uncorrected hides it (the client simply did not send).
    let corrected_at = |q: f64| -> u64 {
        let base = s.p50_us * (1.0 / (1.0 - q)).powf(0.45) / 2f64.powf(0.45);
        let outage = if q > 0.95 {
            6_000_000.0 * ((q - 0.95) / 0.05).powf(0.8)
        } else {
            0.0
        };
        (base + outage) as u64
    };
    let uncorrected_at =
        |q: f64| -> u64 { (s.p50_us * (1.0 / (1.0 - q)).powf(0.5) / 2f64.powf(0.5)) as u64 };
    let pct = |f: &dyn Fn(f64) -> u64| Percentiles {
        p50_us: f(0.5),
        p90_us: f(0.9),
        p99_us: f(0.99),
        p999_us: f(0.999),
        p9999_us: f(0.9999),
        max_us: f(0.99999),
    };
    let over_time = sample_over_time(s, n, rps, run);
    let mut errors = BTreeMap::new();
    if s.error_rate > 0.0 {
        errors.insert(
            "connection_refused".to_string(),
            (rps * (kill.1 - kill.0) * 0.02) as u64,
        );
        errors.insert(
            "http_409".to_string(),
            (requests as f64 * s.error_rate) as u64,
        );
    }
    EndpointStats {
        name: s.name.into(),
        requests,
        errors,
        throughput_rps: rps * (duration_s - 2.0) / duration_s,
        corrected: pct(&corrected_at),
        uncorrected: pct(&uncorrected_at),
        distribution: quantiles()
            .into_iter()
            .map(|q| (q, corrected_at(q)))
            .collect(),
        over_time,
    }
}

/// A constant-rate load run with a server kill at 60 s (fake).
pub fn sample_load() -> LoadReport {
    let mut n = Noise(0x10AD);
    let run = LoadRun {
        rate: 2000.0,
        duration_s: 120.0,
        kill: (60.0, 66.0),
    };
    let kill = run.kill;
    let endpoints = endpoint_shapes()
        .iter()
        .map(|s| sample_endpoint(s, &mut n, &run))
        .collect();
    let server = (0..60u64)
        .map(|i| {
            let t_s = i as f64 * 2.0;
            let down = t_s >= kill.0 && t_s < kill.1;
            ResourceSample {
                t_s,
                cpu_pct: if down { 0.0 } else { 68.0 * n.around(0.1) },
                rss_bytes: if down {
                    0
                } else {
                    (38.0 + t_s * 0.05) as u64 * 1_048_576
                },
            }
        })
        .collect();
    LoadReport {
        scenario: "mixed_constant_rate_kill".into(),
        target: "http://127.0.0.1:8080".into(),
        duration_s: run.duration_s,
        warmup_s: 10.0,
        rate: Some(run.rate),
        users: 64,
        endpoints,
        server,
        fault_windows: vec![FaultWindow {
            start_s: kill.0,
            end_s: kill.1,
            label: "kill -9 sut-server, restart".into(),
            process: None,
            kind: Some("kill".into()),
        }],
        verification: vec![
            InvariantResult::held("ids.unique"),
            InvariantResult::held("ids.monotonic"),
            InvariantResult::held("tokens.single_use"),
            InvariantResult::held("lottery.no_over_issue"),
            InvariantResult::held("lottery.conservation"),
            InvariantResult {
                name: "lottery.settled".into(),
                verdict: Judgement::Held,
                seed: None,
                first_offending_event: None,
                detail: Some("all 4 781 draws settled within 4.2 s of the restart".into()),
            },
        ],
        concurrency: None,
        ramp: None,
    }
}

/// The known-flaws catalog (fake): one flaw not caught, to show what that looks like.
pub fn sample_flaws() -> FlawCatalogReport {
    let caught = |flaw: &str, by: &str, seed: Option<u64>| FlawResult {
        flaw: flaw.into(),
        caught_by: Some(by.into()),
        seed,
        ..FlawResult::default()
    };
    FlawCatalogReport {
        catalog: "known-flaws".into(),
        flaws: vec![
            caught(
                "segment_reload_without_version_check",
                "model:ids.unique",
                None,
            ),
            caught(
                "counter_not_persisted_before_use",
                "sim:ids.unique",
                Some(7),
            ),
            caught(
                "snowflake_seq_reset_before_check",
                "sim:ids.monotonic",
                Some(1042),
            ),
            caught("tcc_without_fence", "model:lottery.no_hanging", None),
            caught(
                "stock_check_then_decrement",
                "sim:lottery.no_over_issue",
                Some(311),
            ),
            FlawResult {
                flaw: "time_field_too_narrow".into(),
                caught_by: None,
                seed: None,
                detail: Some("no scenario runs past the epoch limit yet".into()),
                ..FlawResult::default()
            },
        ],
    }
}

/// All of the above as one gate run.
pub fn sample_summary() -> Summary {
    let mut s = Summary::new("gate run (sample data)")
        .with(sample_simulation())
        .with(sample_model())
        .with(sample_load())
        .with(sample_flaws());
    s.meta.insert(
        "data".into(),
        "FAKE sample data from reports/examples/sample.rs".into(),
    );
    s.meta.insert("commit".into(), "0000000 (sample)".into());
    s
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/reports-sample"));
    let single = |title: &str, r: RunResult| {
        let mut s = Summary::new(title);
        s.meta.insert(
            "data".into(),
            "FAKE sample data from reports/examples/sample.rs".into(),
        );
        s.results.push(r);
        s
    };
    reports::write_report(
        &out.join("simulation"),
        &single("simulation (sample)", sample_simulation().into()),
    )?;
    reports::write_report(
        &out.join("model"),
        &single("model check (sample)", sample_model().into()),
    )?;
    reports::write_report(
        &out.join("load"),
        &single("load run (sample)", sample_load().into()),
    )?;
    let summary = sample_summary();
    let gate_dir = out.join("gate");
    reports::write_report(&gate_dir, &summary)?;
    reports::write_junit(&gate_dir.join("junit.xml"), &summary)?;
    let baseline = reports::Baseline::from_summary(&summary, None);
    baseline.save(&gate_dir.join("baseline.toml"))?;
    let outcome = reports::gate::compare(&baseline, &summary);
    print!("{}", outcome.table());
    println!("wrote {}", out.display());
    Ok(())
}
