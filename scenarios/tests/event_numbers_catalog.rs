//! Every flaw of the catalog, in the scenario that catches it: each violation of the first seed
//! that has one names events of that seed's history only, by its `#N`. Every `#N` in the text
//! is a line of the history, and the first offending event is one of them, so that a reader of
//! `--history` lands on a line that exists (issue 49; `sim/tests/event_numbers.rs` follows the
//! lottery and ID checks' numbers to the very operation each names).

use sim::run::run_seed;
use sut::flaw::Flaw;

/// The `#N` numbers of `text`, in order.
fn numbers(text: &str) -> Vec<u64> {
    text.split('#')
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Seeds tried per flaw before the test gives up on finding a violation.
const SEEDS_MAX: u64 = 40;

#[test]
fn every_catalog_violation_names_lines_of_its_own_history() {
    let mut checked = Vec::new();
    for (flaw, name) in scenarios::flaws::CATALOG {
        // Caught only at a crash point: the numbers of a crash-point run are followed in
        // sim/tests/crash_points.rs.
        if flaw == Flaw::CoordTryBeforeBegin {
            continue;
        }
        let mut scenario = scenarios::load(name).expect("a named scenario");
        scenario.run.flaw = Some(flaw);
        scenario.run.crash_points = 0;
        let found = (0..SEEDS_MAX).find_map(|seed| {
            let outcome = run_seed(&scenario, seed, true);
            let violated = outcome.violations().next().is_some();
            violated.then_some((seed, outcome))
        });
        let Some((seed, outcome)) = found else {
            panic!(
                "{} in {name}: no violation in {SEEDS_MAX} seeds",
                flaw.name()
            );
        };
        let history = outcome.history.as_ref().expect("the history was kept");
        for v in outcome.violations() {
            let printed = numbers(&v.detail);
            for n in &printed {
                let line = history.get(usize::try_from(*n).unwrap());
                assert!(
                    line.is_some_and(|e| e.seq == *n),
                    "{} seed {seed}: {} names #{n}, not a line of its history of {} events: {}",
                    flaw.name(),
                    v.invariant,
                    history.len(),
                    v.detail
                );
            }
            if let Some(first) = v.event {
                assert!(
                    history.get(usize::try_from(first).unwrap()).is_some(),
                    "{} seed {seed}: {}'s first offending event #{first} is past the history",
                    flaw.name(),
                    v.invariant
                );
                assert!(
                    printed.is_empty() || printed.contains(&first),
                    "{} seed {seed}: {} prints {printed:?} but names #{first} first: {}",
                    flaw.name(),
                    v.invariant,
                    v.detail
                );
            }
            checked.push(format!("{}: {}", flaw.name(), v.invariant));
        }
    }
    assert!(checked.len() >= 16, "{checked:?}");
}
