//! The HTML page: self-contained (no external reference), well-formed, and charts carrying the
//! expected series.

mod common;

use common::sample;
use reports::model::*;

fn render(result: RunResult) -> String {
    reports::html::render(&Summary::new("t").with(result))
}

#[test]
fn reference_checker_fires_on_every_kind_of_external_reference() {
    let ok = r##"<svg xmlns="http://www.w3.org/2000/svg"></svg><a href="#result-0">x</a>"##;
    assert!(
        common::external_references(ok).is_empty(),
        "{:?}",
        common::external_references(ok)
    );
    for bad in [
        r#"<img src="x.png">"#,
        r#"<link rel="stylesheet" href="a.css">"#,
        r#"<style>@import "a.css";</style>"#,
        r#"<div style="background: url(a.png)"></div>"#,
        r#"<script>1</script>"#,
        r#"<a href="https://example.com">x</a>"#,
        r#"<p>see http://example.com</p>"#,
        r#"<svg xmlns="http://www.w3.org/2000/svg"><image xlink:href="a.png"/></svg>"#,
        r#"<svg xmlns:xlink="http://www.w3.org/1999/xlink" data="http://evil"></svg>"#,
    ] {
        assert!(
            !common::external_references(bad).is_empty(),
            "not flagged: {bad}"
        );
    }
}

#[test]
fn balance_checker_fires_on_broken_markup() {
    assert!(common::check_balanced("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>a > b {}</style></head><body><p>x<br></p><svg><path d=\"M 0 0\"/></svg></body></html>").is_ok());
    assert!(common::check_balanced("<div><p></div></p>").is_err());
    assert!(common::check_balanced("<div>").is_err());
    assert!(common::check_balanced("</div>").is_err());
    assert!(common::check_balanced("<div title=\"a\">x</div").is_err());
    assert!(common::parse_xml("<svg><g></svg>").is_err());
    assert!(common::parse_xml("<svg><text>a & b</text></svg>").is_err());
    assert!(common::parse_xml("<svg><text>a &amp; b &#160;</text></svg>").is_ok());
}

#[test]
fn combined_page_is_self_contained_and_well_formed() {
    let html = reports::html::render(&sample::sample_summary());
    let refs = common::external_references(&html);
    assert!(refs.is_empty(), "external references: {refs:#?}");
    common::check_balanced(&html).expect("balanced tags");
    let svgs = common::svgs(&html);
    // timeline + clock + ops, sequence chart x2, percentile + throughput + 5 latency + cpu + rss.
    assert_eq!(svgs.len(), 3 + 2 + 9, "svg count");
    for (i, svg) in svgs.iter().enumerate() {
        let elements = common::parse_xml(svg)
            .unwrap_or_else(|e| panic!("svg {i} is not well-formed XML: {e}\n{svg}"));
        assert!(elements > 5, "svg {i} is nearly empty");
        assert!(
            !svg.contains("NaN") && !svg.contains("inf"),
            "svg {i} has a non-finite coordinate"
        );
    }
    // Overview: one linked row per result, in-page anchors exist.
    for i in 0..4 {
        assert!(html.contains(&format!("href=\"#result-{i}\"")));
        assert!(html.contains(&format!("id=\"result-{i}\"")));
    }
}

#[test]
fn user_text_is_escaped_and_target_url_is_not_a_link() {
    let mut sim = sample::sample_simulation();
    sim.scenario = "<script>alert(1)</script>".into();
    sim.invariants[0].detail = Some("a < b && c > d".into());
    sim.nodes.push("n<1>".into());
    let html = render(sim.into());
    assert!(!html.contains("<script>"));
    assert!(html.contains("&lt;script&gt;"));
    assert!(html.contains("a &lt; b &amp;&amp; c &gt; d"));
    common::check_balanced(&html).expect("balanced");
    for svg in common::svgs(&html) {
        common::parse_xml(svg).expect("well-formed svg");
    }
    let mut load = sample::sample_load();
    load.target = "https://sut.example:8443/".into();
    let html = render(load.into());
    assert!(common::external_references(&html).is_empty());
    assert!(html.contains("sut.example:8443 (https)"));
}

fn count_stroke(svg: &str, i: usize) -> usize {
    let c = reports::charts::series_color(i);
    let stroke = format!(
        r##"stroke="#{:02X}{:02X}{:02X}" stroke-width="2""##,
        c.0, c.1, c.2
    );
    svg.lines()
        .filter(|l| l.starts_with("<polyline") && l.contains(&stroke))
        .count()
}

fn has_label(svg: &str, label: &str) -> bool {
    svg.contains(&format!("\n{label}\n</text>"))
}

#[test]
fn load_charts_carry_every_endpoint_and_shade_the_kill() {
    let load = sample::sample_load();
    let html = render(load.clone().into());
    let svgs = common::svgs(&html);
    let percentile = svgs
        .iter()
        .find(|s| has_label(s, "percentile"))
        .expect("percentile chart");
    for (i, e) in load.endpoints.iter().enumerate() {
        assert!(has_label(percentile, &e.name), "legend for {}", e.name);
        // One line per endpoint plus its legend sample.
        assert_eq!(count_stroke(percentile, i), 2, "{}", e.name);
    }
    for tick in ["50%", "90%", "99%", "99.9%", "99.99%", "99.999%"] {
        assert!(has_label(percentile, tick), "tick {tick}");
    }
    let throughput = svgs
        .iter()
        .find(|s| has_label(s, "Throughput over time"))
        .expect("throughput chart");
    assert!(has_label(throughput, "fault: kill -9 sut-server, restart"));
    assert!(
        throughput.contains(r##"opacity="0.15" fill="#D62728""##),
        "shaded window"
    );
    let latency = svgs
        .iter()
        .find(|s| has_label(s, "allocate: latency over time"))
        .expect("latency chart");
    for label in ["P50", "P99", "P99.9"] {
        assert!(has_label(latency, label));
    }
    // The kill window has no samples: each latency line is split into two runs (before, after),
    // plus the legend sample.
    assert_eq!(count_stroke(latency, 0), 3);
    assert!(latency.contains(r##"fill="#D62728""##));
    // Table: corrected and uncorrected side by side.
    assert!(html.contains("corrected (ms)") && html.contains("uncorrected (ms)"));
    let allocate = load.endpoint("allocate").unwrap();
    assert!(html.contains(&format!("{:.2}", allocate.corrected.p50_us as f64 / 1000.0)));
}

#[test]
fn load_charts_share_one_time_axis_show_totals_and_a_sub_second_window() {
    let mut load = sample::sample_load();
    // A kill of 200 ms, and one endpoint whose samples stop early.
    load.fault_windows[0].end_s = load.fault_windows[0].start_s + 0.2;
    load.endpoints[1].over_time.truncate(3);
    for i in &mut load.endpoints[0].over_time {
        i.errors = 2;
    }
    let html = render(load.clone().into());
    assert!(
        html.contains("(200 ms)"),
        "the window's length, to the millisecond"
    );
    let svgs = common::svgs(&html);
    let throughput = svgs
        .iter()
        .find(|s| has_label(s, "Throughput over time"))
        .expect("throughput chart");
    assert!(has_label(throughput, "all endpoints"));
    assert!(has_label(throughput, "errors/s (all endpoints)"));
    // The second endpoint's samples stop at 3 s; its latency chart still spans the whole run
    // (ticks up to 120 s), like the other charts, so that the time axes line up.
    let short = svgs
        .iter()
        .find(|s| has_label(s, &format!("{}: latency over time", load.endpoints[1].name)))
        .expect("the short endpoint's latency chart");
    assert!(has_label(short, "120"), "{short}");
}

#[test]
fn message_counts_are_not_shown_as_fault_effects() {
    let mut sim = sample::sample_simulation();
    sim.fault_effects.insert("net.messages".into(), 123_456_789);
    sim.fault_effects.insert("fault.kill".into(), 3);
    sim.counter_groups = [
        ("net.messages".to_owned(), "response".to_owned()),
        ("fault.kill".to_owned(), "injected".to_owned()),
    ]
    .into();
    let effects_total: u64 = sim
        .fault_effects
        .iter()
        .filter(|(k, _)| !sim.counter_groups.contains_key(*k))
        .map(|(_, v)| v)
        .sum();
    let html = render(sim.into());
    assert!(
        html.contains(&format!("{effects_total} fault effect(s) observed")),
        "the overview's effect total leaves the injections and the message count out"
    );
    let coverage = html
        .split("<h3>Fault coverage</h3>")
        .nth(1)
        .expect("section");
    let injected = coverage.find("faults injected").expect("injected group");
    let effects = coverage
        .find("fault effects (what the faults did)")
        .expect("effects");
    let responses = coverage
        .find("the system's responses and traffic")
        .expect("responses");
    let messages = coverage.find("net.messages").expect("the message count");
    assert!(injected < effects && effects < responses && responses < messages);
}

#[test]
fn refused_operations_are_explained() {
    let sim = sample::sample_simulation();
    let html = render(sim.into());
    assert!(html.contains("why refused (most frequent first)"), "{html}");
    assert!(
        html.contains(
            "116 × cancelled: the inventory participant refused the Try: activity N is out of stock"
        ),
        "{html}"
    );
    assert!(
        html.contains("<td class=\"num\">310</td>"),
        "no answer count: {html}"
    );
}

#[test]
fn simulation_page_shows_seed_replay_timeline_and_violations() {
    let sim = sample::sample_simulation();
    let html = render(sim.clone().into());
    assert!(html.contains("cargo run --bin scenario clock_skew -- --seed 1042"));
    assert!(html.contains("1000..1100"));
    // Each violation is listed with the line that replays its own seed.
    assert!(
        html.contains(
            "<td><code>cargo run --release --bin scenario -- clock_skew --seed 1042 --seeds 1</code></td>"
        ),
        "violation replay line: {html}"
    );
    assert!(
        html.contains("#18231 t=40.002s alloc-2"),
        "first offending event"
    );
    let svgs = common::svgs(&html);
    let timeline = svgs
        .iter()
        .find(|s| has_label(s, "Fault timeline (one lane per node)"))
        .expect("timeline");
    for lane in ["alloc-1", "alloc-2", "alloc-3", "db-1", "net"] {
        assert!(has_label(timeline, lane), "lane {lane}");
    }
    let kinds: std::collections::BTreeSet<&str> =
        sim.faults.iter().map(|f| f.kind.as_str()).collect();
    for kind in &kinds {
        assert!(has_label(timeline, kind), "legend for {kind}");
    }
    // One bar per fault plus one legend swatch per kind, all filled with opacity 0.85.
    assert_eq!(
        timeline.matches(r#"opacity="0.85""#).count(),
        sim.faults.len() + kinds.len()
    );
    let clock = svgs
        .iter()
        .find(|s| has_label(s, "Clock offset per node"))
        .expect("clock chart");
    for (i, c) in sim.clock_offsets.iter().enumerate() {
        assert!(has_label(clock, &c.node));
        assert_eq!(count_stroke(clock, i), 2);
    }
    let ops = svgs
        .iter()
        .find(|s| has_label(s, "Client operations over time"))
        .expect("ops chart");
    for label in [
        "ok",
        "failed",
        "indeterminate",
        "fault: partition",
        "fault: kill",
    ] {
        assert!(has_label(ops, label), "{label}");
    }
    // Fault coverage table, zero highlighted.
    assert!(html.contains("partition.dropped_messages"));
    assert!(html.contains(r#"<td class="num zero">0</td>"#));
}

#[test]
fn model_page_draws_the_counterexample_as_a_sequence_chart() {
    let model = sample::sample_model();
    let html = render(model.into());
    let svgs = common::svgs(&html);
    let seq = svgs[0];
    assert_eq!(seq.matches(r#"class="lifeline""#).count(), 5);
    assert_eq!(seq.matches(r#"<g class="msg">"#).count(), 8);
    assert_eq!(seq.matches(r#"<g class="note">"#).count(), 1);
    assert!(html.contains("18342"));
    assert!(html.contains("Counterexample for"));
}

#[test]
fn a_deployment_run_shows_each_fault_on_its_process_lane() {
    let mut load = sample::sample_load();
    // The sample's kill names no process: no per-process timeline.
    let single = render(load.clone().into());
    assert!(!single.contains("Faults per process"));
    let window = |process: &str, kind: &str, start_s: f64| FaultWindow {
        start_s,
        end_s: start_s + 1.5,
        label: format!("{process}: {kind}"),
        process: Some(process.into()),
        kind: Some(kind.into()),
    };
    load.fault_windows = vec![
        window("coordinator", "pause", 3.0),
        window("wallet→postgres", "partition", 6.0),
        window("postgres", "power_loss", 9.0),
        window("coordinator", "clock", 12.0),
    ];
    let html = render(load.into());
    assert!(html.contains("Faults per process"));
    let svgs = common::svgs(&html);
    let timeline = svgs
        .iter()
        .find(|s| has_label(s, "Fault timeline (one lane per process or link)"))
        .expect("the per-process fault timeline");
    for lane in ["coordinator", "wallet→postgres", "postgres"] {
        assert!(has_label(timeline, lane), "lane {lane}");
    }
    for kind in ["pause", "partition", "power_loss", "clock"] {
        assert!(has_label(timeline, kind), "kind {kind} in the legend");
    }
    common::check_balanced(&html).unwrap();
    assert!(common::external_references(&html).is_empty());
}

#[test]
fn a_stall_shows_on_the_latency_chart_and_a_partial_second_is_not_a_collapse() {
    let mut load = sample::sample_load();
    // One request of a second stalls 505 ms; every percentile of its interval stays low.
    let stalled = &mut load.endpoints[0].over_time[10];
    stalled.max_us = 505_000;
    let html = render(load.clone().into());
    let svgs = common::svgs(&html);
    let name = &load.endpoints[0].name;
    let latency = svgs
        .iter()
        .find(|s| has_label(s, &format!("{name}: latency over time")))
        .expect("latency chart");
    assert!(has_label(latency, "max"), "the slowest request has a line");
    // The fourth series (P50, P99, P99.9, max) is drawn, beside its legend sample.
    assert!(count_stroke(latency, 3) >= 2, "the max line is drawn");

    // A run that ended 0.4 s into its last second: that second is left out of the throughput
    // chart rather than drawn as a drop to almost nothing.
    let full = sample::sample_load();
    let mut cut = full.clone();
    cut.duration_s -= 0.6;
    let points = |r: &LoadReport| {
        let html = render(r.clone().into());
        let svgs = common::svgs(&html);
        let t = svgs
            .iter()
            .find(|s| has_label(s, "Throughput over time"))
            .expect("throughput chart");
        t.matches(',').count()
    };
    assert!(
        points(&cut) < points(&full),
        "the partial second is not drawn"
    );
}

#[test]
fn a_failing_load_run_names_its_broken_checks_in_the_overview() {
    let mut load = sample::sample_load();
    load.verification = vec![
        InvariantResult::held("ids.unique[id]"),
        InvariantResult {
            verdict: Judgement::Violated,
            ..InvariantResult::held("slo.p99_ms")
        },
    ];
    let html = render(load.into());
    assert!(
        html.contains("2 check(s), broken: slo.p99_ms"),
        "the overview names the broken check"
    );
}

#[test]
fn the_time_axis_says_which_clock_and_series_get_distinct_colours() {
    let html = reports::html::render(&sample::sample_summary());
    assert!(
        html.contains("simulated time (s)"),
        "a simulation's timeline"
    );
    let mut load = sample::sample_load();
    load.fault_windows[0].process = Some("sut-server".into());
    load.fault_windows[0].kind = Some("kill".into());
    let html = render(load.into());
    assert!(
        html.contains("time since start (s, wall clock)"),
        "a real run's fault lanes are on the wall clock"
    );
    let colours: std::collections::BTreeSet<_> = (0..24)
        .map(|i| {
            let c = reports::charts::series_color(i);
            (c.0, c.1, c.2)
        })
        .collect();
    assert_eq!(colours.len(), 24, "24 series, 24 colours");
}
