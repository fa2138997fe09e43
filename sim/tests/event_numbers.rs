//! Every event number a violation prints is the `#N` of the history it came from: followed back
//! to its history line, each finds the operation the message describes (issue 49: a number that
//! points at an unrelated line is worse than none).

use sim::history::{Answer, Event, EventKind, Outcome};
use sim::run::run_seed;
use sim::scenario::Scenario;
use sut::flaw::Flaw;

fn named(name: &str, flaw: Flaw) -> Scenario {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/scenarios")
        .join(format!("{name}.toml"));
    let text = std::fs::read_to_string(&path).expect("a named scenario");
    let mut scenario = Scenario::parse(&path.display().to_string(), &text).expect("valid");
    scenario.run.safety_ms = 2_000;
    scenario.run.liveness_ms = 4_000;
    scenario.run.crash_points = 0;
    scenario.run.flaw = Some(flaw);
    scenario
}

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

/// The number after `word ` in `text` (`draw 561` → 561).
fn after(text: &str, word: &str) -> u64 {
    let rest = &text[text
        .find(word)
        .unwrap_or_else(|| panic!("`{word}` in {text}"))
        + word.len()..];
    rest.trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("a number after `{word}` in {text}"))
}

/// Runs seeds of `scenario` until one violates `invariant`; its detail and history.
fn first_violation(
    scenario: &Scenario,
    invariant: &str,
    seeds: u64,
) -> (String, Option<u64>, Vec<Event>) {
    for seed in 0..seeds {
        let outcome = run_seed(scenario, seed, true);
        let found = outcome
            .violations()
            .find(|v| v.invariant == invariant)
            .map(|v| (v.detail.clone(), v.event));
        if let Some((detail, event)) = found {
            return (detail, event, outcome.history.expect("kept"));
        }
    }
    panic!(
        "{invariant}: no violation in {seeds} seeds of {}",
        scenario.name
    );
}

fn at(history: &[Event], n: u64) -> &Event {
    let e = &history[usize::try_from(n).expect("an index")];
    assert_eq!(e.seq, n, "the history's line {n} is event #{n}");
    e
}

#[test]
fn a_hanging_try_names_its_try_and_the_cancel_before_it() {
    let (detail, event, history) = first_violation(
        &named("tcc_storm", Flaw::TccNoFence),
        "lottery.no_hanging",
        12,
    );
    let xid = after(&detail, "draw");
    let [try_at, cancel_at] = numbers(&detail)[..] else {
        panic!("two event numbers in {detail}");
    };
    assert_eq!(event, Some(try_at), "the offending event is the Try");
    for (n, phase) in [
        (try_at, sut::lottery::Phase::Try),
        (cancel_at, sut::lottery::Phase::Cancel),
    ] {
        match &at(&history, n).kind {
            EventKind::Participant(r) => {
                assert_eq!((r.draw.xid.0, r.phase), (xid, phase), "#{n}: {detail}");
            }
            other => panic!("#{n} is {other:?}, not a participant's reply: {detail}"),
        }
    }
}

#[test]
fn a_disagreement_names_the_outcome_it_contradicts() {
    let (detail, event, history) = first_violation(
        &named("tcc_storm", Flaw::TccNoFence),
        "lottery.agreement",
        12,
    );
    let xid = after(&detail, "draw");
    let n = numbers(&detail)[0];
    assert_eq!(event, Some(n));
    match &at(&history, n).kind {
        EventKind::Draw(d) => assert_eq!(d.draw.xid.0, xid, "{detail}"),
        EventKind::Complete {
            outcome: Outcome::Ok(Answer::Draw { xid: told, .. }),
            ..
        } => assert_eq!(*told, xid, "{detail}"),
        other => panic!("#{n} is {other:?}: {detail}"),
    }
}

#[test]
fn a_duplicate_id_names_both_issues_of_it() {
    let (detail, event, history) = first_violation(
        &named("segment_race", Flaw::SegmentNoVersionCheck),
        "ids.unique",
        12,
    );
    let id = after(&detail, "ID");
    let found = numbers(&detail);
    assert_eq!(found.len(), 2, "{detail}");
    assert_eq!(event, Some(found[0]));
    for n in found {
        match &at(&history, n).kind {
            EventKind::Issued { id: issued, .. } => assert_eq!(*issued, id, "#{n}: {detail}"),
            other => panic!("#{n} is {other:?}: {detail}"),
        }
    }
}

#[test]
fn an_unsettled_draw_names_the_answer_pending_and_the_last_poll() {
    let (detail, event, history) = first_violation(
        &named("tcc_storm", Flaw::StatusLostAfterCompensation),
        "lottery.pending_settled",
        24,
    );
    let xid = after(&detail, "draw");
    let found = numbers(&detail);
    assert!(!found.is_empty(), "{detail}");
    assert_eq!(event, found.last().copied());
    let told = at(&history, found[0]);
    match &told.kind {
        EventKind::Complete {
            outcome: Outcome::Ok(Answer::Draw { xid: x, status }),
            ..
        } => assert_eq!((*x, status.as_str()), (xid, "pending"), "{detail}"),
        other => panic!("#{} is {other:?}: {detail}", found[0]),
    }
    assert!(
        detail.starts_with(&*told.node),
        "the client that was told: {detail}"
    );
    if let Some(&last) = found.get(1) {
        let polled = at(&history, last);
        assert_eq!(polled.node, told.node, "the same client's poll: {detail}");
        assert!(
            matches!(polled.kind, EventKind::Complete { .. }),
            "{detail}"
        );
    }
}
