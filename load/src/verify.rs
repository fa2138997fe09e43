//! Post-run verification of what the clients saw (docs/architecture.md, "The invariants, and
//! where each is checked"): every ID received is unique within its ID space (all of them are
//! collected, not a sample), the lottery ledger's conservation and no-over-issue hold (the
//! server's `GET /ledger` checks), and no one-time token was accepted twice. Each check is a
//! [`reports::model::InvariantResult`]; a `Violated` one fails the run
//! ([`reports::model::LoadReport::passed`]).

use sut::check::AtMostOnce;

use reports::model::{InvariantResult, Judgement};
use serde_json::Value;

fn violated(name: &str, first: String, detail: String) -> InvariantResult {
    InvariantResult {
        name: name.to_owned(),
        verdict: Judgement::Violated,
        seed: None,
        first_offending_event: Some(first),
        detail: Some(detail),
    }
}

fn held(name: &str, detail: String) -> InvariantResult {
    InvariantResult {
        detail: Some(detail),
        ..InvariantResult::held(name)
    }
}

/// `ids.unique` over one ID space (`space` names it, e.g. `id:bench` or `snowflake`): the IDs
/// in the order received. Reports the first repeated ID and how many repeats there were.
#[must_use]
pub fn ids_unique(space: &str, ids: &[u64]) -> InvariantResult {
    let name = format!("ids.unique[{space}]");
    let mut once = AtMostOnce::new();
    for (i, id) in ids.iter().enumerate() {
        let _ = once.observe(*id, i);
    }
    match once.first_repeat() {
        None => held(&name, format!("{} IDs, all distinct", ids.len())),
        Some((id, first, again)) => violated(
            &name,
            // A load run keeps no history: the answers are counted from 1 in the order received.
            format!(
                "ID {id} received again in answer {} of the run (first in answer {}, counting \
                 from 1 in the order received)",
                again + 1,
                first + 1
            ),
            format!("{} IDs, {} repeats", ids.len(), once.repeats()),
        ),
    }
}

/// `ids.unique` over a history's answers: each ID with the `#N` of the history operation that
/// received it (the `:index` of its EDN export), so that the repeat named is a line a reader can
/// find.
#[must_use]
pub fn ids_unique_in_history(space: &str, ids: &[(u64, u64)]) -> InvariantResult {
    let name = format!("ids.unique[{space}]");
    let mut once = AtMostOnce::new();
    for (id, index) in ids {
        let _ = once.observe(*id, *index);
    }
    match once.first_repeat() {
        None => held(&name, format!("{} IDs, all distinct", ids.len())),
        Some((id, first, again)) => violated(
            &name,
            format!("ID {id} received again (#{again} of the history; first #{first})"),
            format!("{} IDs, {} repeats", ids.len(), once.repeats()),
        ),
    }
}

/// `tokens.once_accepted_once`: `accepted` holds every one-time token whose consume was
/// answered `accepted: true`, each observed once per such answer.
#[must_use]
pub fn once_accepted_once(accepted: &AtMostOnce<String, u64>) -> InvariantResult {
    let name = "tokens.once_accepted_once";
    match accepted.first_repeat() {
        None => held(
            name,
            format!(
                "{} one-time tokens accepted, none twice",
                accepted.distinct()
            ),
        ),
        Some((t, first, again)) => violated(
            name,
            format!(
                "token {t} accepted again (acceptance {} of the run; first at acceptance {}, \
                 counting from 1)",
                again + 1,
                first + 1
            ),
            format!(
                "{} acceptances of a token accepted before",
                accepted.repeats()
            ),
        ),
    }
}

/// The ledger checks of a `GET /ledger` answer: one result per entry of its `checks` array
/// (`lottery.conservation`, `lottery.no_over_issue`, ...), plus `ledger.safe` for its `safe`
/// flag. An answer without the checks is itself a violation (`ledger.answer`): it cannot be
/// shown to hold.
#[must_use]
pub fn ledger(answer: &Value) -> Vec<InvariantResult> {
    let Some(checks) = answer.get("checks").and_then(Value::as_array) else {
        return vec![violated(
            "ledger.answer",
            "GET /ledger has no `checks` array".to_owned(),
            answer.to_string().chars().take(300).collect(),
        )];
    };
    let mut out = Vec::with_capacity(checks.len() + 1);
    for c in checks {
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("ledger.unnamed_check");
        match c.get("ok").and_then(Value::as_bool) {
            Some(true) => out.push(held(name, "server check holds".to_owned())),
            Some(false) => out.push(violated(
                name,
                c.get("violation")
                    .and_then(Value::as_str)
                    .unwrap_or("violated (no detail)")
                    .to_owned(),
                "GET /ledger".to_owned(),
            )),
            None => out.push(violated(
                name,
                "check without an `ok` flag".to_owned(),
                c.to_string(),
            )),
        }
    }
    let summary = format!(
        "minted {} collected {} balances {} frozen {} participations {} open draws {}",
        answer["minted_minor"],
        answer["collected_minor"],
        answer["balances_minor"],
        answer["frozen_minor"],
        answer["participations"],
        answer["open_draws"]
    );
    // Conservation recomputed on the client from the summary: minted = balances + frozen +
    // collected (the server's own check, cross-checked against its reported numbers).
    let num = |k: &str| answer.get(k).and_then(Value::as_u64).map(u128::from);
    if let (Some(minted), Some(bal), Some(frozen), Some(coll)) = (
        num("minted_minor"),
        num("balances_minor"),
        num("frozen_minor"),
        num("collected_minor"),
    ) {
        if minted == bal + frozen + coll {
            out.push(held("ledger.sums", summary.clone()));
        } else {
            out.push(violated(
                "ledger.sums",
                format!("minted {minted} != balances {bal} + frozen {frozen} + collected {coll}"),
                summary.clone(),
            ));
        }
    }
    match answer.get("safe").and_then(Value::as_bool) {
        Some(true) => out.push(held("ledger.safe", summary)),
        _ => out.push(violated(
            "ledger.safe",
            "GET /ledger says safe = false".to_owned(),
            summary,
        )),
    }
    out
}

/// `lottery.acknowledged_durable`: every draw a client saw confirmed (200) is in the ledger,
/// crash or not: the house collected at least `confirmed × price` (each confirmed draw
/// collects its price; draws the clients never heard of may add more).
#[must_use]
pub fn acknowledged_draws_durable(
    confirmed: u64,
    price_minor: u64,
    answer: &Value,
) -> InvariantResult {
    let name = "lottery.acknowledged_durable";
    let Some(collected) = answer.get("collected_minor").and_then(Value::as_u64) else {
        return violated(
            name,
            "GET /ledger has no collected_minor".to_owned(),
            String::new(),
        );
    };
    let owed = confirmed.saturating_mul(price_minor);
    if collected >= owed {
        held(
            name,
            format!("{confirmed} draws confirmed to clients, {collected} collected"),
        )
    } else {
        violated(
            name,
            format!(
                "clients saw {confirmed} confirmed draws (owed {owed}) but the ledger collected {collected}"
            ),
            "an acknowledged draw was lost".to_owned(),
        )
    }
}

/// IDs never handed to a client between the smallest and largest received: the sum of the gaps
/// of the sorted distinct IDs.
#[must_use]
pub fn id_gaps(ids: &[u64]) -> u64 {
    sut::check::ids::lost(ids.iter().copied())
}

/// `ids.monotonic_per_server`: every segment ID a user got from one server's allocator
/// incarnation exceeded the ones it got from that incarnation before, and every Snowflake ID
/// the ones from the same worker id (`regressions` as found by the workload). As in the
/// simulator's `ids.monotonic`, a restart starts a new incarnation.
#[must_use]
pub fn ids_monotonic_per_server(
    regressions: &[crate::workload::IdRegression],
    servers: usize,
) -> InvariantResult {
    let name = "ids.monotonic_per_server";
    match regressions.first() {
        None => held(
            name,
            format!(
                "every user's IDs from each of {servers} server(s) went up (segment IDs per \
                 allocator incarnation, Snowflake IDs per worker id)"
            ),
        ),
        Some(r) if r.kind == "snowflake" => violated(
            name,
            format!(
                "snowflake ID {} from worker id {} after {} (user {})",
                r.after, r.server, r.before, r.user
            ),
            format!("{} regression(s) kept", regressions.len()),
        ),
        Some(r) => violated(
            name,
            format!(
                "{} ID {} from server {}{} after {} (user {})",
                r.kind,
                r.after,
                r.server + 1,
                r.incarnation
                    .map(|i| format!(" (allocator incarnation {i})"))
                    .unwrap_or_default(),
                r.before,
                r.user
            ),
            format!("{} regression(s) kept", regressions.len()),
        ),
    }
}

/// `NAME` (`crash.kills_done`, `cluster.kills_done`): every kill asked for happened.
#[must_use]
pub fn kills_done(name: &str, done: usize, asked: usize) -> InvariantResult {
    let detail = format!("{done} of {asked} kill(s) and restart(s) done");
    if done == asked {
        held(name, detail)
    } else {
        violated(name, format!("{done} of {asked} kills done"), detail)
    }
}

/// `ids.lost_per_crash_bounded`: the IDs lost to `crashes` kills stay within `bound_per_crash`
/// each (gaps in the received IDs; see the crash scenario for the bound's derivation).
#[must_use]
pub fn lost_ids_bounded(ids: &[u64], crashes: u64, bound_per_crash: u64) -> InvariantResult {
    let name = "ids.lost_per_crash_bounded";
    let gaps = id_gaps(ids);
    let bound = crashes.max(1).saturating_mul(bound_per_crash);
    let detail = format!(
        "{gaps} IDs skipped over {crashes} crashes (bound {bound_per_crash} per crash, {} IDs received)",
        ids.len()
    );
    if gaps <= bound {
        held(name, detail)
    } else {
        violated(name, format!("{gaps} IDs lost > {bound}"), detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kills_done_fires_when_a_kill_is_missing() {
        assert_eq!(
            kills_done("cluster.kills_done", 2, 2).verdict,
            Judgement::Held
        );
        let missing = kills_done("cluster.kills_done", 1, 2);
        assert_eq!(missing.verdict, Judgement::Violated);
        assert_eq!(
            missing.first_offending_event.as_deref(),
            Some("1 of 2 kills done")
        );
    }

    #[test]
    fn durability_and_gap_checks_fire() {
        let l = json!({"collected_minor": 10});
        assert_eq!(
            acknowledged_draws_durable(10, 1, &l).verdict,
            Judgement::Held
        );
        assert_eq!(
            acknowledged_draws_durable(11, 1, &l).verdict,
            Judgement::Violated
        );
        assert_eq!(id_gaps(&[1, 2, 3, 7, 8, 8, 20]), 3 + 11);
        assert_eq!(
            lost_ids_bounded(&[1, 2, 3, 7], 1, 3).verdict,
            Judgement::Held
        );
        assert_eq!(
            lost_ids_bounded(&[1, 2, 3, 8], 1, 3).verdict,
            Judgement::Violated
        );
        assert_eq!(
            lost_ids_bounded(&[1, 100, 200], 2, 100).verdict,
            Judgement::Held
        );
    }

    #[test]
    fn ids_unique_fires_on_a_duplicate() {
        assert_eq!(ids_unique("t", &[1, 2, 3, 10]).verdict, Judgement::Held);
        let r = ids_unique("t", &[5, 6, 7, 6, 8, 5]);
        assert_eq!(r.verdict, Judgement::Violated);
        assert_eq!(r.name, "ids.unique[t]");
        assert!(r.first_offending_event.unwrap().contains("ID 6"));
        assert!(r.detail.unwrap().contains("2 repeats"));
    }

    #[test]
    fn once_fires_on_a_token_accepted_twice() {
        let mut accepted = AtMostOnce::new();
        for (nth, token) in ["a", "b"].into_iter().enumerate() {
            let _ = accepted.observe(token.to_owned(), nth as u64);
        }
        assert_eq!(once_accepted_once(&accepted).verdict, Judgement::Held);
        let _ = accepted.observe("c".to_owned(), 2);
        let _ = accepted.observe("c".to_owned(), 3);
        let r = once_accepted_once(&accepted);
        assert_eq!(r.verdict, Judgement::Violated);
        assert!(r.first_offending_event.unwrap().contains("token c"));
        assert!(r.detail.unwrap().starts_with("1 acceptance"));
    }

    fn good_ledger() -> Value {
        json!({
            "minted_minor": 1000, "collected_minor": 30, "balances_minor": 960,
            "frozen_minor": 10, "participations": 3, "open_draws": 0,
            "checks": [
                {"name": "lottery.conservation", "ok": true, "violation": null},
                {"name": "lottery.no_over_issue", "ok": true, "violation": null},
            ],
            "safe": true
        })
    }

    #[test]
    fn ledger_holds_on_a_good_answer() {
        let r = ledger(&good_ledger());
        assert!(r.iter().all(|i| i.verdict == Judgement::Held), "{r:?}");
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn ledger_fires_on_broken_conservation() {
        // the server's own check says so
        let mut a = good_ledger();
        a["checks"][0] =
            json!({"name": "lottery.conservation", "ok": false, "violation": "lost 5"});
        a["safe"] = json!(false);
        let r = ledger(&a);
        let c = r.iter().find(|i| i.name == "lottery.conservation").unwrap();
        assert_eq!(c.verdict, Judgement::Violated);
        assert_eq!(c.first_offending_event.as_deref(), Some("lost 5"));
        assert!(
            r.iter()
                .any(|i| i.name == "ledger.safe" && i.verdict == Judgement::Violated)
        );

        // the numbers do not add up although the server claims the checks hold
        let mut b = good_ledger();
        b["balances_minor"] = json!(955);
        let r = ledger(&b);
        let s = r.iter().find(|i| i.name == "ledger.sums").unwrap();
        assert_eq!(s.verdict, Judgement::Violated);

        // an answer without checks cannot pass
        let r = ledger(&json!({"error": "x"}));
        assert_eq!(r[0].verdict, Judgement::Violated);
    }
}
