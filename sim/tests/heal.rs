//! The liveness phase starts with every fault healed, and stays healed: a multi-step fault still
//! running at the heal (a swizzle clogging its nodes one by one) must not clog anything after
//! it. (It did: a swizzle begun 200 ms before the heal clogged `db` 100 ms after it, and the ID
//! nodes got no segment for seconds.)

use sim::history::EventKind;
use sim::run::run_seed;
use sim::scenario::Scenario;

/// A swizzle that reaches `db` 100 ms after the heal (safety phase 6,000 ms).
const LATE_SWIZZLE: &str = r#"
name = "late_swizzle"
description = "a swizzle still clogging nodes when the liveness phase begins"
[run]
safety_ms = 6000
liveness_ms = 6000
[[schedule]]
at_ms = 5800
fault = "swizzle"
nodes = ["client2", "coord", "db"]
period_ms = 150
down_ms = 3000
"#;

#[test]
fn a_swizzle_still_running_at_the_heal_clogs_nothing_after_it() {
    let scenario = Scenario::parse("late_swizzle.toml", LATE_SWIZZLE).expect("valid scenario");
    let outcome = run_seed(&scenario, 1, true);
    let history = outcome.history.as_ref().expect("history kept");
    let healed_ms = history
        .iter()
        .find(|e| matches!(&e.kind, EventKind::Phase(p) if p == "liveness"))
        .map(|e| e.sim_ms)
        .expect("a liveness phase");
    // The first client probes every ID node every 250 ms after the heal. With nothing clogged,
    // each node keeps answering: no gap of a second between two IDs it issues. (With `db`
    // clogged from 6,100 ms, the nodes ran dry once their leases lapsed and issued nothing for
    // over two seconds.)
    let end_ms = healed_ms + scenario.run.liveness_ms - 1_000;
    for node in ["id1", "id2", "id3"] {
        let issued: Vec<u64> = history
            .iter()
            .filter(|e| *e.node == *node && (healed_ms..end_ms).contains(&e.sim_ms))
            .filter(|e| matches!(e.kind, EventKind::Issued { .. }))
            .map(|e| e.sim_ms)
            .collect();
        let gap_ms = std::iter::once(healed_ms)
            .chain(issued.iter().copied())
            .chain(std::iter::once(end_ms))
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(u64::MAX);
        assert!(
            gap_ms <= 1_000,
            "{node}: {gap_ms} ms without an ID after the heal ({} IDs)",
            issued.len()
        );
    }
    assert!(
        outcome.violations().next().is_none(),
        "{:?}",
        outcome.violations().collect::<Vec<_>>()
    );
}
