//! Every named scenario is deterministic: the same seed twice gives the same history hash, and
//! another seed gives another history; and a seed leaves no world behind. (Short runs, so the
//! test stays quick in debug builds.)

use sim::run::run_seed;
use sim::scenario::Scenario;

fn scenarios() -> Vec<Scenario> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/scenarios");
    let mut found: Vec<Scenario> = std::fs::read_dir(&dir)
        .expect("the scenarios folder")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("readable scenario");
            Scenario::parse(&path.display().to_string(), &text).expect("valid scenario")
        })
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

#[test]
fn every_named_scenario_replays_exactly() {
    let all = scenarios();
    assert!(
        all.len() >= 10,
        "expected the ten named scenarios, found {}",
        all.len()
    );
    for mut scenario in all {
        scenario.run.safety_ms = 1_500;
        scenario.run.liveness_ms = 2_500;
        let a = run_seed(&scenario, 7, false);
        assert_eq!(
            sim::world::worlds_alive(),
            0,
            "{}: seed 7 left its world behind",
            scenario.name
        );
        let b = run_seed(&scenario, 7, false);
        assert_eq!(
            a.trace_hash, b.trace_hash,
            "{}: seed 7 gave two different histories",
            scenario.name
        );
        assert_eq!(a.events, b.events, "{}", scenario.name);
        assert!(
            a.events > 500,
            "{}: the run did almost nothing ({} events)",
            scenario.name,
            a.events
        );
        let c = run_seed(&scenario, 8, false);
        assert_ne!(
            a.trace_hash, c.trace_hash,
            "{}: seeds 7 and 8 gave the same history",
            scenario.name
        );
        for (name, violation) in &a.results {
            assert!(
                violation.is_none(),
                "{}: {name} violated on seed 7: {violation:?}",
                scenario.name
            );
        }
    }
}

/// The wire (`sim::wire`, the default transport) carries datagrams with exactly the draws
/// and timers of madsim's UDP path: a seed gives the same history either way. The seeds of
/// `chaos` cover partitions, swizzles, kills (datagrams to a node that is down), latency spikes
/// (another latency range) and pauses; the check says which of them took effect.
#[test]
fn the_wire_replays_madsims_udp_path() {
    use sim::run::run_seed_on;
    use sim::wire::Transport;
    let mut seen = std::collections::BTreeSet::new();
    for mut scenario in scenarios() {
        let chaos = scenario.name == "chaos";
        let seeds: Vec<u64> = if chaos { (0..6).collect() } else { vec![7] };
        if !chaos {
            scenario.run.safety_ms = 1_500;
            scenario.run.liveness_ms = 2_500;
        }
        for seed in seeds {
            let wire = run_seed_on(&scenario, seed, false, Transport::Wire);
            let udp = run_seed_on(&scenario, seed, false, Transport::MadsimUdp);
            assert_eq!(
                wire.trace_hash, udp.trace_hash,
                "{} seed {seed}: the wire and madsim's UDP path gave different histories",
                scenario.name
            );
            assert_eq!(wire.events, udp.events, "{} seed {seed}", scenario.name);
            assert_eq!(
                wire.datagrams, udp.datagrams,
                "{} seed {seed}",
                scenario.name
            );
            assert_eq!(wire.coverage, udp.coverage, "{} seed {seed}", scenario.name);
            assert!(wire.datagrams > 0, "{} seed {seed}", scenario.name);
            if chaos {
                seen.extend(wire.coverage.keys().cloned());
            }
        }
    }
    for effect in [
        "net.dropped_by_partition",
        "crash.kills",
        "net.delayed_by_spike",
        "pause.delayed_messages",
    ] {
        assert!(
            seen.contains(effect),
            "no chaos seed exercised {effect}: {seen:?}"
        );
    }
}
