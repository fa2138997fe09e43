//! HTML rendering of a [`Summary`]: one self-contained page (inline `<style>`, inline SVG, no
//! script, no external URL, font or stylesheet) that opens anywhere offline. goose's report
//! loads its charts from a CDN and is blank offline; this one must not be (docs/sources.md,
//! "Anchors").
//!
//! Layout: a header, an overview table of all results, then one section per result. Templates
//! are maud (escaping by default); charts come from [`crate::charts`] as trusted SVG strings.

use std::collections::BTreeSet;

use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::charts::{self, LineChart, Scale, Series, Shade, TimelineBar};
use crate::gate::{GateOutcome, GateRow, GateStatus};
use crate::model::{
    Concurrency, EndpointStats, FlawCatalogReport, InvariantResult, Judgement, LoadReport,
    ModelReport, Percentiles, Ramp, RunResult, SimulationReport, Summary, tail_samples_min,
};

/// Most rows of the injected-fault table (the timeline shows them all).
const FAULT_ROWS_MAX: usize = 1000;

/// Width in pixels of full-width charts (they scale down with the page via CSS).
const CHART_W: u32 = 1200;

const STYLE: &str = r#"
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1280px; padding: 0 16px; color: #222; background: #fafafa; }
h1 { margin-bottom: 4px; } h2 { margin-top: 40px; border-bottom: 2px solid #ddd; padding-bottom: 4px; } h3 { margin-top: 24px; }
section.result { background: white; border: 1px solid #e3e3e3; border-radius: 6px; padding: 4px 20px 20px; margin-top: 24px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 14px; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f0f3f7; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.facts th { width: 180px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 13px; font-weight: bold; color: white; }
.pass { background: #2c8a2c; } .fail { background: #c62828; } .neutral { background: #888; }
tr.bad td { background: #fdecea; } td.zero { background: #fff4d6; } tr.chosen td { font-weight: bold; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; }
pre { background: #f4f4f4; padding: 8px; overflow-x: auto; border: 1px solid #e0e0e0; }
svg { max-width: 100%; height: auto; display: block; margin: 8px 0; }
.err { color: #c62828; } .muted { color: #777; } .note { color: #555; font-size: 13px; }
"#;

/// Renders the whole page.
pub fn render(summary: &Summary) -> String {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (summary.title) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { (summary.title) " " (badge(summary.passed())) }
                p.muted { "schema version " (summary.schema_version) ", " (summary.results.len()) " result(s)" }
                @if !summary.meta.is_empty() {
                    table.facts { @for (k, v) in &summary.meta { tr { th { (k) } td { (v) } } } }
                }
                @if let Some(gate) = &summary.gate { (gate_section(gate)) }
                (overview(summary))
                @for (i, result) in summary.results.iter().enumerate() {
                    section.result id=(anchor(i)) {
                        @match result {
                            RunResult::Simulation(r) => (simulation(r)),
                            RunResult::Model(r) => (model(r)),
                            RunResult::Load(r) => (load(r)),
                            RunResult::Flaws(r) => (flaws(r)),
                        }
                    }
                }
            }
        }
    };
    page.into_string()
}

fn anchor(i: usize) -> String {
    format!("result-{i}")
}

fn badge(passed: bool) -> Markup {
    html! { @if passed { span.badge.pass { "PASS" } } @else { span.badge.fail { "FAIL" } } }
}

fn verdict_badge(v: Judgement) -> Markup {
    let class = match v {
        Judgement::Held => "badge pass",
        Judgement::Violated => "badge fail",
        Judgement::NotChecked => "badge neutral",
    };
    html! { span class=(class) { (v.label()) } }
}

fn svg_or_error(result: Result<String, charts::ChartError>) -> Markup {
    match result {
        Ok(svg) => PreEscaped(svg),
        Err(e) => html! { p.err { (e.to_string()) } },
    }
}

/// A gate run's comparison with its baseline: the counts, what did not pass, then every check.
fn gate_section(gate: &GateOutcome) -> Markup {
    let count = |s: GateStatus| gate.with_status(s).count();
    let not_passed: Vec<&GateRow> = gate
        .rows
        .iter()
        .filter(|r| r.status != GateStatus::Pass)
        .collect();
    let row = |r: &GateRow| {
        let class = match r.status {
            GateStatus::Pass => "badge pass",
            GateStatus::Regressed | GateStatus::Missing => "badge fail",
            GateStatus::New => "badge neutral",
        };
        html! { tr { td { (r.check) } td { (r.expected) } td { (r.actual) } td { span class=(class) { (r.status.label()) } } } }
    };
    html! {
        h2 { "Gate: comparison with the baseline " (badge(gate.passed)) }
        p { (format!("{} pass, {} regressed, {} new, {} missing", count(GateStatus::Pass), count(GateStatus::Regressed), count(GateStatus::New), count(GateStatus::Missing))) }
        @if !not_passed.is_empty() {
            table {
                tr { th { "check" } th { "expected" } th { "actual" } th { "status" } }
                @for r in &not_passed { (row(r)) }
            }
        }
        details {
            summary { (format!("every check ({})", gate.rows.len())) }
            table {
                tr { th { "check" } th { "expected" } th { "actual" } th { "status" } }
                @for r in &gate.rows { (row(r)) }
            }
        }
    }
}

fn overview(summary: &Summary) -> Markup {
    html! {
        h2 { "Overview" }
        table {
            tr { th { "#" } th { "kind" } th { "name" } th { "result" } th { "key figures" } }
            @for (i, r) in summary.results.iter().enumerate() {
                tr class=[(!r.passed()).then_some("bad")] {
                    td.num { (i + 1) }
                    td { (r.kind()) }
                    // An in-page fragment link: not an external reference.
                    td { a href=(format!("#{}", anchor(i))) { (r.name()) } }
                    td { (badge(r.passed())) }
                    td { (key_figures(r)) }
                }
            }
        }
    }
}

fn key_figures(r: &RunResult) -> String {
    match r {
        RunResult::Simulation(s) => format!(
            "{} seed(s), {} events, {} violation(s), {} fault effect(s) observed",
            s.seeds_run,
            s.events,
            s.violations.len(),
            s.fault_effects
                .iter()
                .filter(|(k, _)| s.counter_groups.get(*k).is_none_or(|g| g == "effect"))
                .map(|(_, v)| v)
                .sum::<u64>()
        ),
        RunResult::Model(m) => format!(
            "{} unique states, depth {}, {}/{} properties pass",
            m.unique_states,
            m.max_depth,
            m.properties.iter().filter(|p| p.verdict.passed()).count(),
            m.properties.len()
        ),
        RunResult::Load(l) => {
            let rps: f64 = l.endpoints.iter().map(|e| e.throughput_rps).sum();
            let errors: u64 = l.endpoints.iter().map(EndpointStats::error_count).sum();
            let broken: Vec<&str> = l
                .verification
                .iter()
                .filter(|c| c.verdict == Judgement::Violated)
                .map(|c| c.name.as_str())
                .collect();
            let checks = if broken.is_empty() {
                format!("{} check(s)", l.verification.len())
            } else {
                format!(
                    "{} check(s), broken: {}",
                    l.verification.len(),
                    broken.join(", ")
                )
            };
            format!(
                "{} endpoint(s), {:.0} req/s total, {} error(s), {checks}",
                l.endpoints.len(),
                rps,
                errors,
            )
        }
        RunResult::Flaws(f) => format!(
            "{}/{} flaws caught",
            f.flaws.iter().filter(|x| x.caught_by.is_some()).count(),
            f.flaws.len()
        ),
    }
}

fn invariant_table(rows: &[InvariantResult]) -> Markup {
    html! {
        table {
            tr { th { "invariant" } th { "verdict" } th { "seed" } th { "first offending event" } th { "detail" } }
            @for inv in rows {
                tr class=[(inv.verdict == Judgement::Violated).then_some("bad")] {
                    td { code { (inv.name) } }
                    td { (verdict_badge(inv.verdict)) }
                    td.num { @if let Some(s) = inv.seed { (s) } }
                    td { @if let Some(e) = &inv.first_offending_event { code { (e) } } }
                    td { @if let Some(d) = &inv.detail { (d) } }
                }
            }
        }
    }
}

fn ms_to_s(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Timeline lanes: the declared nodes in order, then any other lane that faults mention
/// (`net` last).
fn lanes(r: &SimulationReport) -> Vec<String> {
    let mut lanes: Vec<String> = r.nodes.clone();
    for f in &r.faults {
        if !lanes.contains(&f.node) && f.node != "net" {
            lanes.push(f.node.clone());
        }
    }
    if r.faults.iter().any(|f| f.node == "net") {
        lanes.push("net".to_owned());
    }
    lanes
}

/// The fault timeline: one lane per node, phases shaded, up to the run's last moment.
fn fault_timeline(r: &SimulationReport) -> Result<String, charts::ChartError> {
    let end_ms = r
        .phases
        .iter()
        .map(|p| p.end_ms)
        .chain(r.faults.iter().map(|f| f.end_ms.unwrap_or(f.start_ms)))
        .chain(r.ops_over_time.iter().map(|b| b.t_ms))
        .max()
        .unwrap_or(0);
    let phase_shades: Vec<Shade> = r
        .phases
        .iter()
        .filter(|p| p.name != "safety")
        .map(|p| Shade {
            start: ms_to_s(p.start_ms),
            end: ms_to_s(p.end_ms),
            label: p.name.clone(),
        })
        .collect();
    let bars: Vec<TimelineBar> = r
        .faults
        .iter()
        .map(|f| TimelineBar {
            lane: f.node.clone(),
            kind: f.kind.clone(),
            start_s: ms_to_s(f.start_ms),
            end_s: f.end_ms.map(ms_to_s),
        })
        .collect();
    charts::timeline_chart(
        "Fault timeline (one lane per node)",
        "simulated time (s)",
        &lanes(r),
        &bars,
        &phase_shades,
        ms_to_s(end_ms),
        CHART_W,
    )
}

/// Each node's clock offset over time.
fn clock_chart(r: &SimulationReport) -> Result<String, charts::ChartError> {
    charts::line_chart(&LineChart {
        title: "Clock offset per node".into(),
        x_desc: "simulated time (s)".into(),
        y_desc: "offset from true time (ms)".into(),
        y_scale: Scale::Linear,
        series: r
            .clock_offsets
            .iter()
            .map(|c| Series {
                label: c.node.clone(),
                points: c
                    .points
                    .iter()
                    .map(|&(t, o)| (ms_to_s(t), o as f64))
                    .collect(),
            })
            .collect(),
        shades: vec![],
        size: (CHART_W, 340),
        x_range: None,
    })
}

/// Client operations (ok, failed, indeterminate) over time, with partitions, kills and pauses
/// shaded.
fn ops_chart(r: &SimulationReport) -> Result<String, charts::ChartError> {
    let pick = |f: fn(&crate::model::OpsBucket) -> u64| {
        r.ops_over_time
            .iter()
            .map(|b| (ms_to_s(b.t_ms), f(b) as f64))
            .collect()
    };
    charts::line_chart(&LineChart {
        title: "Client operations over time".into(),
        x_desc: "simulated time (s)".into(),
        y_desc: "operations per bucket".into(),
        y_scale: Scale::Linear,
        series: vec![
            Series {
                label: "ok".into(),
                points: pick(|b| b.ok),
            },
            Series {
                label: "failed".into(),
                points: pick(|b| b.failed),
            },
            Series {
                label: "indeterminate".into(),
                points: pick(|b| b.indeterminate),
            },
        ],
        shades: r
            .faults
            .iter()
            .filter(|f| matches!(f.kind.as_str(), "partition" | "kill" | "pause"))
            .filter_map(|f| {
                Some(Shade {
                    start: ms_to_s(f.start_ms),
                    end: ms_to_s(f.end_ms?),
                    label: format!("fault: {}", f.kind),
                })
            })
            .collect(),
        size: (CHART_W, 340),
        x_range: None,
    })
}

fn simulation(r: &SimulationReport) -> Markup {
    let timeline = fault_timeline(r);
    let clock = (!r.clock_offsets.is_empty()).then(|| clock_chart(r));
    let ops = (!r.ops_over_time.is_empty()).then(|| ops_chart(r));
    html! {
        h2 { "Simulation: " (r.scenario) " " (badge(r.passed())) }
        (simulation_facts(r))
        @if !r.violations.is_empty() {
            h3 { "Violations" }
            table {
                tr { th { "seed" } th { "invariant" } th { "detail" } th { "replay" } }
                @for v in &r.violations {
                    tr.bad {
                        td.num { (v.seed) @if let Some(p) = &v.crash_point { div.muted { "crash point " code { (p) } } } }
                        td { code { (v.invariant) } } td { (v.detail) }
                        td { @if let Some(c) = &v.replay { code { (c) } } }
                    }
                }
            }
        }
        h3 { "Invariants" }
        (invariant_table(&r.invariants))
        h3 { "Faults" }
        (svg_or_error(timeline))
        @if let Some(c) = clock { (svg_or_error(c)) }
        (fault_table(r))
        @if let Some(o) = ops { h3 { "Operations" } (svg_or_error(o)) }
        (operations_table(r))
        (edges_table(r))
        (crash_points_table(r))
        h3 { "Fault coverage" }
        p.note { "Summed over seeds: the faults injected, what they did (the effects fault coverage is judged on; a zero means the run did not exercise that fault), and how the system responded, with its traffic." }
        @if r.fault_effects.is_empty() { p.err { "no fault effect was recorded" } } @else {
            table {
                tr { th { "counter" } th.num { "count" } }
                @for (group, title) in [("injected", "faults injected"), ("effect", "fault effects (what the faults did)"), ("response", "the system's responses and traffic")] {
                    tr { th colspan="2" { (title) } }
                    @for (k, v) in r.fault_effects.iter().filter(|(k, _)| r.counter_groups.get(*k).map_or("effect", String::as_str) == group) {
                        tr { td { code { (k) } } @if *v == 0 { td.num.zero { "0" } } @else { td.num { (v) } } }
                    }
                }
            }
        }
    }
}

/// The simulation's facts: seeds, replay command, times, events, nodes, phases.
fn simulation_facts(r: &SimulationReport) -> Markup {
    let events_per_s = if r.wall_seconds > 0.0 {
        r.events as f64 / r.wall_seconds
    } else {
        0.0
    };
    html! {
        table.facts {
            tr { th { "seeds" } td { (r.seeds.describe()) } }
            tr { th { "seeds run" } td { (r.seeds_run) } }
            @if let Some(s) = r.timeline_seed { tr { th { "timeline shows seed" } td { (s) } } }
            tr { th { "replay" } td { @if let Some(c) = &r.replay_command { code { (c) } } @else { span.muted { "no replay command recorded" } } } }
            tr { th { "simulated time" } td { (format!("{:.1} s", r.sim_seconds)) } }
            tr { th { "wall time" } td { (format!("{:.2} s ({:.1}× real time)", r.wall_seconds, if r.wall_seconds > 0.0 { r.sim_seconds / r.wall_seconds } else { 0.0 })) } }
            tr { th { "events" } td { (r.events) " (" (format!("{events_per_s:.0}")) " events/s)" } }
            tr { th { "nodes" } td { (r.nodes.join(", ")) } }
            @for p in &r.phases { tr { th { (p.name) " phase" } td { (format!("{:.1} s – {:.1} s", ms_to_s(p.start_ms), ms_to_s(p.end_ms))) } } }
        }
    }
}

/// The injected faults as a collapsed table (the first [`FAULT_ROWS_MAX`] of them).
/// Every kind of client operation over the sweep: ok, refused (with the top reasons), no answer.
fn operations_table(r: &SimulationReport) -> Markup {
    html! {
        @if !r.operations.is_empty() {
            p.note { "All seeds. Refused: the client was told the operation failed, and why (numbers written N). No answer: the client timed out, so the outcome is unknown; the checkers treat it as possibly done." }
            table {
                tr { th { "operation" } th.num { "ok" } th.num { "refused" } th.num { "no answer" } th { "why refused (most frequent first)" } }
                @for op in &r.operations {
                    tr {
                        td { code { (op.kind) } }
                        td.num { (op.ok) } td.num { (op.failed) } td.num { (op.no_answer) }
                        td { @for (reason, n) in op.reasons.iter().take(3) { div { (n) " × " (reason) } } @if op.reasons.len() > 3 { div.muted { "… and " (op.reasons.len() - 3) " other reasons" } } }
                    }
                }
            }
        }
    }
}

/// The edge states: those the scenario owns first, then those never reached, then the rest.
fn edges_table(r: &SimulationReport) -> Markup {
    let never = r.edges.iter().filter(|e| e.reached == 0).count();
    let owned = |e: &&crate::model::EdgeRow| e.owned_from_seeds.is_some();
    let rows = r
        .edges
        .iter()
        .filter(owned)
        .chain(r.edges.iter().filter(|e| !owned(e) && e.reached == 0))
        .chain(r.edges.iter().filter(|e| !owned(e) && e.reached > 0));
    html! {
        @if !r.edges.is_empty() {
            h3 { "Edge states" }
            p.note { "The rare situations the protocols' correctness hinges on, counted over all seeds. An edge state the scenario owns (★, judged over sweeps of the seeds shown) that no seed reached fails the sweep: the run proves nothing about it. " (never) " of " (r.edges.len()) " were never reached." }
            table {
                tr { th { "edge state" } th.num { "reached" } th.num { "seeds" } th { "situation" } }
                @for e in rows {
                    tr class=[(e.owned_from_seeds.is_some_and(|n| r.seeds_run >= n) && e.reached == 0).then_some("bad")] {
                        td { code { (e.name) } @if let Some(n) = e.owned_from_seeds { " ★ (≥ " (n) " seeds)" } }
                        @if e.reached == 0 { td.num.zero { "0" } } @else { td.num { (e.reached) } }
                        td.num { (e.seeds_reached) }
                        td { (e.about) }
                    }
                }
            }
        }
    }
}

/// Crash points: how many were found and tried, and each distinct point with its tries.
fn crash_points_table(r: &SimulationReport) -> Markup {
    html! {
        @if let Some(c) = &r.crash_points {
            h3 { "Crash points" }
            p.note { "Each seed's run found the steps its nodes reached (a message read or sent, a log sync about to begin or done), one point per node role, site and protocol step; at most " (c.budget) " per seed were tried, each a run of the seed again with that node crashed right there, restarted, and every invariant judged. " (c.found) " distinct points found, " (c.tried) " tried in " (c.runs) " runs over " (c.seeds) " seeds, " (c.failed) " failed" @if c.unreached > 0 { ", " (c.unreached) " planned crash(es) not reached (the node went down first)" } "." }
            details {
                summary { (c.points.len()) " distinct point(s)" }
                table {
                    tr { th { "point (role, site, step)" } th.num { "seeds found" } th.num { "runs crashed there" } th.num { "failed" } }
                    @for p in &c.points {
                        tr class=[(p.failed > 0).then_some("bad")] {
                            td { code { (p.point) } }
                            td.num { (p.found_in_seeds) }
                            @if p.tried == 0 { td.num.zero { "0" } } @else { td.num { (p.tried) } }
                            td.num { (p.failed) }
                        }
                    }
                }
            }
        }
    }
}

fn fault_table(r: &SimulationReport) -> Markup {
    html! {
        @if !r.faults.is_empty() {
            details {
                summary { (r.faults.len()) " injected fault(s)" }
                table {
                    tr { th { "node" } th { "kind" } th.num { "start (s)" } th.num { "end (s)" } th { "detail" } }
                    @for f in r.faults.iter().take(FAULT_ROWS_MAX) {
                        tr {
                            td { (f.node) } td { (f.kind) }
                            td.num { (format!("{:.3}", ms_to_s(f.start_ms))) }
                            td.num { @if let Some(e) = f.end_ms { (format!("{:.3}", ms_to_s(e))) } @else { "—" } }
                            td { (f.detail) }
                        }
                    }
                }
            }
        }
        @if r.faults.len() > FAULT_ROWS_MAX { p.note { "(first " (FAULT_ROWS_MAX) " faults listed; all are in summary.json)" } }
    }
}

fn model(r: &ModelReport) -> Markup {
    html! {
        h2 { "Model: " (r.model) " " (badge(r.passed())) }
        table.facts {
            tr { th { "states" } td.num { (r.states) } }
            tr { th { "unique states" } td.num { (r.unique_states) } }
            tr { th { "max depth" } td.num { (r.max_depth) } }
            tr { th { "wall time" } td.num { (format!("{:.2} s", r.wall_seconds)) } }
            tr { th { "states/s" } td.num { (format!("{:.0}", r.states_per_second)) } }
        }
        h3 { "Properties" }
        table {
            tr { th { "property" } th { "kind" } th { "verdict" } th { "counterexample" } }
            @for p in &r.properties {
                tr class=[(!p.verdict.passed()).then_some("bad")] {
                    td { code { (p.name) } }
                    td { (format!("{:?}", p.kind).to_lowercase()) }
                    td { span class=(if p.verdict.passed() { "badge pass" } else { "badge fail" }) { (p.verdict.label()) } }
                    td { @if let Some(c) = &p.counterexample { (c.len()) " step(s), below" } }
                }
            }
        }
        @for p in &r.properties {
            @if let Some(c) = &p.counterexample {
                h3 { (if p.verdict.passed() { "Example path" } else { "Counterexample" }) " for " code { (p.name) } }
                (PreEscaped(charts::sequence_chart(c)))
                details { summary { "as text" } pre { @for line in c { (line) "\n" } } }
            }
        }
    }
}

/// Microseconds as milliseconds with sensible precision.
fn fmt_us(us: u64) -> String {
    let ms = us as f64 / 1000.0;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

/// The percentiles of a sample of `n`; a tail percentile the sample is too small to carry
/// (see [`tail_samples_min`]) is shown as "—" rather than as the maximum under its name.
fn percentile_cells(p: &Percentiles, n: u64) -> Markup {
    let tail = |us: u64, nines: u32| {
        if n >= tail_samples_min(nines) {
            fmt_us(us)
        } else {
            "—".to_owned()
        }
    };
    html! {
        td.num { (fmt_us(p.p50_us)) } td.num { (fmt_us(p.p90_us)) } td.num { (tail(p.p99_us, 2)) }
        td.num { (tail(p.p999_us, 3)) } td.num { (tail(p.p9999_us, 4)) } td.num { (fmt_us(p.max_us)) }
    }
}

type Chart = Result<String, charts::ChartError>;

/// Each endpoint's latency over time (P50, P99, P99.9 and the slowest request), fault windows
/// shaded.
fn latency_charts(
    r: &LoadReport,
    shades: &[Shade],
    x_range: Option<(f64, f64)>,
) -> Vec<(String, Chart)> {
    r.endpoints
        .iter()
        .filter(|e| !e.over_time.is_empty())
        .map(|e| {
            // An interval without requests (server down) has no latency: a gap, not a zero.
            let pick = |f: fn(&crate::model::IntervalStats) -> u64| {
                e.over_time
                    .iter()
                    .map(|i| {
                        (
                            i.t_s,
                            if i.rps > 0.0 {
                                f(i) as f64 / 1000.0
                            } else {
                                f64::NAN
                            },
                        )
                    })
                    .collect()
            };
            let chart = charts::line_chart(&LineChart {
                title: format!("{}: latency over time", e.name),
                x_desc: "time since start (s)".into(),
                y_desc: "latency (ms, log scale)".into(),
                y_scale: Scale::Log10,
                series: vec![
                    Series {
                        label: "P50".into(),
                        points: pick(|i| i.p50_us),
                    },
                    Series {
                        label: "P99".into(),
                        points: pick(|i| i.p99_us),
                    },
                    Series {
                        label: "P99.9".into(),
                        points: pick(|i| i.p999_us),
                    },
                    // The slowest request of each interval: a stall of one request in thousands
                    // is under every percentile of its interval and shows only here.
                    Series {
                        label: "max".into(),
                        points: pick(|i| i.max_us),
                    },
                ],
                shades: shades.to_vec(),
                size: (CHART_W, 340),
                x_range,
            });
            (e.name.clone(), chart)
        })
        .collect()
}

/// One time axis for every chart of a load run: from 0 to the end of its last interval, fault
/// window or resource sample.
fn load_time_range(r: &LoadReport) -> (f64, f64) {
    let interval_ends = r
        .endpoints
        .iter()
        .flat_map(|e| e.over_time.iter().map(|i| i.t_s + 1.0));
    // The data's own end (the planned duration is not data: a run cut short ends earlier).
    let end = interval_ends
        .chain(r.fault_windows.iter().map(|w| w.end_s))
        .chain(r.server.iter().map(|s| s.t_s))
        .filter(|t| t.is_finite())
        .fold(0.0_f64, f64::max);
    let end = if end > 0.0 {
        end
    } else {
        (r.duration_s + r.warmup_s).max(1.0)
    };
    (0.0, end)
}

/// How many of `e`'s intervals are whole: the last one of a run that ended inside it holds part
/// of a second's requests, and drawn as a rate it would read as a collapse; it is left out of
/// the throughput chart (its requests are in every total).
fn full_intervals(r: &LoadReport, e: &EndpointStats) -> usize {
    // Intervals count from the start of the measurement (after the warm-up).
    let end_s = r.duration_s;
    e.over_time
        .iter()
        .take_while(|i| i.t_s + 1.0 <= end_s + 1e-6)
        .count()
        .max(e.over_time.len().min(1))
}

/// All endpoints together: requests per second and errors per second, per interval.
fn totals_over_time(r: &LoadReport) -> [Series; 2] {
    let mut totals: std::collections::BTreeMap<u64, (f64, f64)> = std::collections::BTreeMap::new();
    for i in r
        .endpoints
        .iter()
        .flat_map(|e| e.over_time.iter().take(full_intervals(r, e)))
    {
        let slot = totals.entry((i.t_s * 1000.0).round() as u64).or_default();
        slot.0 += i.rps;
        slot.1 += i.errors as f64;
    }
    let points = |pick: fn(&(f64, f64)) -> f64| {
        totals
            .iter()
            .map(|(t_ms, v)| (*t_ms as f64 / 1000.0, pick(v)))
            .collect()
    };
    [
        Series {
            label: "all endpoints".into(),
            points: points(|v| v.0),
        },
        Series {
            label: "errors/s (all endpoints)".into(),
            points: points(|v| v.1),
        },
    ]
}

/// Every endpoint's requests per second over time, then all of them together and their
/// errors, fault windows shaded.
fn throughput_chart(r: &LoadReport, shades: &[Shade], x_range: Option<(f64, f64)>) -> Chart {
    charts::line_chart(&LineChart {
        title: "Throughput over time".into(),
        x_desc: "time since start (s)".into(),
        y_desc: "requests/s".into(),
        y_scale: Scale::Linear,
        series: r
            .endpoints
            .iter()
            .map(|e| Series {
                label: e.name.clone(),
                points: e
                    .over_time
                    .iter()
                    .map(|i| (i.t_s, i.rps))
                    .take(full_intervals(r, e))
                    .collect(),
            })
            .chain(totals_over_time(r))
            .collect(),
        shades: shades.to_vec(),
        size: (CHART_W, 340),
        x_range,
    })
}

/// The server's CPU and memory over time, side by side.
fn server_charts(r: &LoadReport, shades: &[Shade], x_range: Option<(f64, f64)>) -> (Chart, Chart) {
    let cpu = charts::line_chart(&LineChart {
        title: "Server CPU".into(),
        x_desc: "time since start (s)".into(),
        y_desc: "CPU (%)".into(),
        y_scale: Scale::Linear,
        series: vec![Series {
            label: "cpu %".into(),
            points: r.server.iter().map(|s| (s.t_s, s.cpu_pct)).collect(),
        }],
        shades: shades.to_vec(),
        size: (CHART_W / 2 - 10, 280),
        x_range,
    });
    let rss = charts::line_chart(&LineChart {
        title: "Server memory".into(),
        x_desc: "time since start (s)".into(),
        y_desc: "RSS (MiB)".into(),
        y_scale: Scale::Linear,
        series: vec![Series {
            label: "rss MiB".into(),
            points: r
                .server
                .iter()
                .map(|s| (s.t_s, s.rss_bytes as f64 / 1_048_576.0))
                .collect(),
        }],
        shades: shades.to_vec(),
        size: (CHART_W / 2 - 10, 280),
        x_range,
    });
    (cpu, rss)
}

fn load(r: &LoadReport) -> Markup {
    let shades: Vec<Shade> = r
        .fault_windows
        .iter()
        .map(|w| Shade {
            start: w.start_s,
            end: w.end_s,
            label: format!("fault: {}", w.label),
        })
        .collect();
    let dist: Vec<(String, Vec<(f64, u64)>)> = r
        .endpoints
        .iter()
        .filter(|e| !e.distribution.is_empty())
        .map(|e| (e.name.clone(), e.distribution.clone()))
        .collect();
    let percentile = (!dist.is_empty()).then(|| {
        charts::percentile_chart("Latency by percentile (corrected)", &dist, (CHART_W, 420))
    });
    let x_range = Some(load_time_range(r));
    let over_time = latency_charts(r, &shades, x_range);
    let throughput = r
        .endpoints
        .iter()
        .any(|e| !e.over_time.is_empty())
        .then(|| throughput_chart(r, &shades, x_range));
    let server = (!r.server.is_empty()).then(|| server_charts(r, &shades, x_range));
    let fault_timeline = process_timeline(r, x_range.map_or(1.0, |(_, end)| end));
    html! {
        h2 { "Load: " (r.scenario) " " (badge(r.passed())) @if let Some(c) = r.concurrency.as_ref().filter(|c| c.inconclusive.is_some()) { " " span.badge.neutral title=[c.inconclusive.as_deref()] { "inconclusive for races" } } }
        (load_facts(r))
        (endpoint_tables(r))
        @if let Some(c) = &r.concurrency { (concurrency_section(c)) }
        @if let Some(ramp) = &r.ramp { (ramp_section(ramp)) }
        @if let Some(p) = percentile { h3 { "Latency distribution" } (svg_or_error(p)) }
        @if !over_time.is_empty() || throughput.is_some() {
            h3 { "Over time" }
            @if !shades.is_empty() { p.note { "Shaded: fault windows." } }
            @if let Some(t) = throughput { (svg_or_error(t)) }
            @for (_, chart) in over_time { (svg_or_error(chart)) }
        }
        @if let Some(t) = fault_timeline { h3 { "Faults per process" } p.note { "One lane per process or link; one colour per fault kind." } (svg_or_error(t)) }
        @if let Some((cpu, rss)) = server { h3 { "Server resources" } div style="display:flex;gap:16px;flex-wrap:wrap" { (svg_or_error(cpu)) (svg_or_error(rss)) } }
        h3 { "Verification" }
        @if r.verification.is_empty() { p.muted { "no post-run verification recorded" } } @else { (invariant_table(&r.verification)) }
    }
}

/// How far the run's requests overlapped (a black-box run's own history).
fn concurrency_section(c: &Concurrency) -> Markup {
    let share = if c.span_us == 0 {
        0.0
    } else {
        (c.overlapped_us as f64 / c.span_us as f64).min(1.0) * 100.0
    };
    html! {
        h3 { "Concurrency reached" }
        p.note { "Measured from the run's history: each request from its send to its answer. A race between two requests of one key can only show while both are in flight." }
        @if let Some(why) = &c.inconclusive { p.err { "Inconclusive for races: " (why) } }
        table.facts {
            tr { th { "requests" } td { (c.requests) } }
            tr { th { "most in flight at once" } td { (c.max_in_flight) } }
            tr { th { "most of one key in flight at once" } td { (c.max_in_flight_per_key) (if c.keys > 1 { format!(" ({} of {} keys overlapped)", c.keys_overlapped, c.keys) } else { String::new() }) } }
            tr { th { "time with 2+ in flight" } td { (format!("{share:.0}% of {:.1} s", c.span_us as f64 / 1e6)) } }
            tr { th { "longest request" } td { (format!("{:.1} ms", c.longest_request_us as f64 / 1e3)) } }
            @for s in &c.servers { tr { th { (s.name) } td { (format!("{} requests, at most {} in flight at once", s.requests, s.max_in_flight)) } } }
        }
    }
}

/// The client counts a black-box run tried before its checked phase.
fn ramp_section(ramp: &Ramp) -> Markup {
    html! {
        h3 { "Concurrency ramp" }
        p.note { "Client counts tried in short steps before the checked phase (a step that would end the ramp is measured twice); chosen: " (ramp.chosen) " (" (ramp.reason) ")." }
        table {
            tr { th.num { "clients" } th.num { "requests" } th.num { "errors" } th.num { "req/s" } th.num { "P50 (ms)" } th.num { "P99 (ms)" } }
            @for s in &ramp.steps {
                tr class=[(s.clients == ramp.chosen).then_some("chosen")] {
                    td.num { (s.clients) } td.num { (s.requests) } td.num { (s.errors) }
                    td.num { (format!("{:.1}", s.rate_rps)) } td.num { (fmt_us(s.p50_us)) } td.num { (fmt_us(s.p99_us)) }
                }
            }
        }
    }
}

/// The fault windows on one lane per process or link (`None` when no window names its
/// process: a run with one server has the shading of the charts above).
fn process_timeline(r: &LoadReport, end_s: f64) -> Option<Result<String, charts::ChartError>> {
    let mut lanes: Vec<String> = Vec::new();
    for p in r.fault_windows.iter().filter_map(|w| w.process.as_ref()) {
        if !lanes.contains(p) {
            lanes.push(p.clone());
        }
    }
    if lanes.is_empty() {
        return None;
    }
    lanes.sort();
    let bars: Vec<TimelineBar> = r
        .fault_windows
        .iter()
        .filter_map(|w| {
            Some(TimelineBar {
                lane: w.process.clone()?,
                kind: w.kind.clone().unwrap_or_else(|| "fault".into()),
                start_s: w.start_s,
                end_s: Some(w.end_s),
            })
        })
        .collect();
    Some(charts::timeline_chart(
        "Fault timeline (one lane per process or link)",
        "time since start (s, wall clock)",
        &lanes,
        &bars,
        &[],
        end_s,
        CHART_W,
    ))
}

/// The load run's facts: target, duration, mode, users, fault windows.
fn load_facts(r: &LoadReport) -> Markup {
    html! {
        table.facts {
            tr { th { "target" } td { code { (display_target(&r.target)) } } }
            tr { th { "duration" } td { (format!("{:.0} s (+ {:.0} s warm-up, excluded)", r.duration_s, r.warmup_s)) } }
            tr { th { "mode" } td { @if let Some(rate) = r.rate { (format!("constant rate, {rate:.0} req/s (latency from intended send time)")) } @else { "closed loop" } } }
            tr { th { "users" } td { (r.users) } }
            @for w in &r.fault_windows { tr { th { "fault window" } td { (format!("{:.3} s – {:.3} s ({:.0} ms): {}", w.start_s, w.end_s, (w.end_s - w.start_s) * 1000.0, w.label)) } } }
        }
    }
}

/// Per endpoint: requests, throughput, errors and latency percentiles; then errors by kind.
fn endpoint_tables(r: &LoadReport) -> Markup {
    let all_error_kinds: BTreeSet<&str> = r
        .endpoints
        .iter()
        .flat_map(|e| e.errors.keys().map(String::as_str))
        .collect();
    html! {
        h3 { "Endpoints" }
        p.note { "Latencies in milliseconds. Corrected: measured from the intended send time (coordinated omission corrected). Uncorrected: from the actual send time, as a naive client reports. — : the endpoint has too few requests for that percentile to differ from its maximum (P99 needs 100, P99.9 1,000, P99.99 10,000)." }
        table {
            tr {
                th rowspan="2" { "endpoint" } th.num rowspan="2" { "requests" } th.num rowspan="2" { "req/s" } th.num rowspan="2" { "errors" }
                th colspan="6" { "corrected (ms)" } th colspan="6" { "uncorrected (ms)" }
            }
            tr { @for _ in 0..2 { th.num { "P50" } th.num { "P90" } th.num { "P99" } th.num { "P99.9" } th.num { "P99.99" } th.num { "max" } } }
            @for e in &r.endpoints {
                tr {
                    td { code { (e.name) } }
                    td.num { (e.requests) }
                    td.num { (format!("{:.1}", e.throughput_rps)) }
                    td.num { (e.error_count()) }
                    (percentile_cells(&e.corrected, e.requests))
                    (percentile_cells(&e.uncorrected, e.requests))
                }
            }
        }
        @if !all_error_kinds.is_empty() {
            h3 { "Errors by kind" }
            table {
                tr { th { "endpoint" } @for k in &all_error_kinds { th.num { (k) } } }
                @for e in &r.endpoints { tr { td { code { (e.name) } } @for k in &all_error_kinds { td.num { (e.errors.get(*k).copied().unwrap_or(0)) } } } }
            }
        }
    }
}

/// The target as text without its URL scheme (`http://host:port` → `host:port (http)`), so the
/// page contains no URL at all, not even an inert one.
fn display_target(target: &str) -> String {
    match target.split_once("://") {
        Some((scheme, rest)) => format!("{} ({scheme})", rest.trim_end_matches('/')),
        None => target.to_owned(),
    }
}

fn flaws(r: &FlawCatalogReport) -> Markup {
    html! {
        h2 { "Known flaws: " (r.catalog) " " (badge(r.passed())) }
        table {
            tr {
                th { "flaw" } th { "source" } th { "scenario" } th { "caught by" }
                th { "seeds to failure (median)" } th { "model" } th { "depth" } th { "first violation" }
            }
            @for f in &r.flaws {
                tr class=[f.caught_by.is_none().then_some("bad")] {
                    td { code { (f.flaw) } }
                    td { @if let Some(s) = &f.source { (s) } }
                    td { @if let Some(s) = &f.scenario { code { (s) } } }
                    td { @if let Some(c) = &f.caught_by { (c) } @else { span.badge.fail { "NOT CAUGHT" } } }
                    td.num { @if let Some(n) = f.seeds_to_failure { (format!("{n:.0}")) } }
                    td { @if let Some(m) = &f.model { code { (m) } } }
                    td.num { @if let Some(d) = f.model_depth { (d) } }
                    td {
                        @if let Some(d) = &f.detail { (d) }
                        @if let Some(s) = f.seed { " (seed " (s) ")" }
                        @if !f.counterexample.is_empty() {
                            details { summary { "counterexample" } pre { (f.counterexample.join("\n")) } }
                        }
                    }
                }
            }
        }
    }
}
