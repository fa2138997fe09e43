//! The invariants of docs/architecture.md as observers over a run's history and final state,
//! each named after its property. A violation names the invariant, the first offending event and
//! what is wrong; the runner adds the seed. The token and lottery checks are `sut`'s own
//! functions (shared with the tests, the models and the load verifier); the ID checks live here
//! because only a whole-cluster history can see them.

use serde::{Deserialize, Serialize};
use sut::check::{AtMostOnce, Rising};
use sut::lottery::invariants::{ClientReport, Followed, LastHeard};
use sut::lottery::{DrawEvent, DrawStatus, Ledger, ParticipantReply, Xid, invariants};
use sut::token::check::{TokenEvent, check_revoked_rejected, check_single_use};

use crate::history::{Answer, Event, EventKind, IdSpace, Outcome};

/// Every invariant, in report order.
pub const INVARIANTS: [&str; 15] = [
    "ids.unique",
    "ids.monotonic",
    "ids.gap_bounded",
    "ids.progress",
    "tokens.single_use",
    "tokens.revoked_rejected",
    "lottery.no_duplicate_participation",
    "lottery.no_over_issue",
    "lottery.conservation",
    "lottery.no_hanging",
    "lottery.settled",
    "lottery.agreement",
    "lottery.paid",
    "lottery.pending_settled",
    "lottery.no_dead_letter_after_heal",
];

/// An invariant that did not hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The invariant's name.
    pub invariant: String,
    /// The first offending event's sequence number, if one event is to blame.
    pub event: Option<u64>,
    /// What is wrong.
    pub detail: String,
}

/// The final state the checkers read besides the history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FinalState {
    /// The merged lottery ledger (participants' stores and the coordinator log), after the
    /// liveness phase.
    pub ledger: Ledger,
    /// The participants' replies in the order they took effect.
    pub replies: Vec<ParticipantReply>,
    /// The most segment IDs the run may lose (see [`gap_bound`]).
    pub gap_bound_ids: u64,
    /// The ID nodes that must issue segment IDs again once the faults have healed, and how
    /// soon (`ids.progress`); `None` when the scenario asks for no segment IDs.
    pub progress: Option<Progress>,
    /// How long after the heal a compensation round that began during the faults may still
    /// fail (`CoordinatorConfig::round_ms_max`): `lottery.no_dead_letter_after_heal` judges
    /// dead letters from then on.
    pub round_grace_ms: u64,
    /// The operator's activities (`lottery.paid` judges every participation against them).
    pub registry: sut::lottery::Registry,
}

/// What `ids.progress` checks: every one of `nodes` issues a segment ID (or a degraded one)
/// within `bound_ms` of the heal. Clients probe every ID node during the liveness phase
/// (`nodes::client::PROBE_INTERVAL_MS`), so a node that is able to serve is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The ID nodes.
    pub nodes: Vec<String>,
    /// How long after the heal each may take, simulated ms.
    pub bound_ms: u64,
}

/// `ids.progress`: once every fault has healed, every ID node issues IDs again within the
/// bound (an allocator that stays stuck after a partition, a lost lease or a restart fails it).
pub fn ids_progress(history: &[Event], progress: Option<&Progress>) -> Result<(), Violation> {
    let Some(progress) = progress else {
        return Ok(());
    };
    let Some(healed_ms) = healed(history).map(|e| e.sim_ms) else {
        return Ok(());
    };
    let deadline_ms = healed_ms.saturating_add(progress.bound_ms);
    for node in &progress.nodes {
        let issued = history.iter().any(|e| {
            *e.node == **node
                && (healed_ms..=deadline_ms).contains(&e.sim_ms)
                && matches!(
                    e.kind,
                    EventKind::Issued {
                        space: IdSpace::Segment | IdSpace::Degraded,
                        ..
                    }
                )
        });
        if !issued {
            return Err(violation(
                "ids.progress",
                None,
                format!(
                    "{node} issued no segment ID in the {} ms after every fault had healed (at {healed_ms} ms), though the clients kept asking",
                    progress.bound_ms
                ),
            ));
        }
    }
    Ok(())
}

/// The documented bound on segment IDs lost: each event that can strand IDs (an ID-node
/// incarnation ending, a fetch whose answer was lost, a lease dropped) strands at most the
/// claimed-but-unissued part of two buffers, which is at most two segments of `step_max`.
#[must_use]
pub fn gap_bound(step_max: u64, stranding_events: u64) -> u64 {
    2 * step_max * (stranding_events + 1)
}

/// A violation of `invariant`; a `detail` that starts with the invariant's name (the core's
/// checkers name it in their messages) is kept without it, so that it is said once.
fn violation(invariant: &str, event: Option<u64>, detail: String) -> Violation {
    let detail = detail
        .strip_prefix(invariant)
        .and_then(|rest| rest.strip_prefix(": "))
        .map_or(detail.clone(), str::to_owned);
    Violation {
        invariant: invariant.to_owned(),
        event,
        detail,
    }
}

/// `ids.unique`: no ID is handed out twice within its ID space, across nodes, restarts and
/// clock jumps.
pub fn ids_unique(history: &[Event]) -> Result<(), Violation> {
    let mut once = AtMostOnce::new();
    for e in history {
        if let EventKind::Issued {
            space,
            generator,
            id,
        } = &e.kind
            && let Some((first, by)) = once.observe((*space, *id), (e.seq, generator))
        {
            return Err(violation(
                "ids.unique",
                Some(e.seq),
                format!(
                    "{space:?} ID {id} issued by {generator} (#{}) was already issued by {by} (#{first})",
                    e.seq
                ),
            ));
        }
    }
    Ok(())
}

/// `ids.monotonic`: per allocator instance and per Snowflake or semantic generator incarnation, IDs strictly
/// increase in issue order.
pub fn ids_monotonic(history: &[Event]) -> Result<(), Violation> {
    let mut rising = Rising::new();
    for e in history {
        if let EventKind::Issued {
            space: IdSpace::Segment | IdSpace::Snowflake | IdSpace::Semantic,
            generator,
            id,
        } = &e.kind
            && let Some(back) = rising.observe(generator.as_str(), *id, e.seq)
        {
            return Err(violation(
                "ids.monotonic",
                Some(e.seq),
                format!(
                    "{generator} issued {id} (#{}) after {} (#{})",
                    e.seq, back.highest, back.highest_by
                ),
            ));
        }
    }
    Ok(())
}

/// `ids.gap_bounded`: segment IDs never issued below the highest issued one stay within the
/// documented bound. Returns the number lost.
pub fn ids_gap_bounded(history: &[Event], bound: u64) -> Result<u64, Violation> {
    let segment_ids = history.iter().filter_map(|e| match &e.kind {
        EventKind::Issued {
            space: IdSpace::Segment,
            id,
            ..
        } => Some(*id),
        _ => None,
    });
    let lost = sut::check::ids::lost(segment_ids);
    if lost > bound {
        return Err(violation(
            "ids.gap_bounded",
            None,
            format!(
                "{lost} segment IDs between the lowest and the highest issued were never issued; the documented bound for this run is {bound}"
            ),
        ));
    }
    Ok(lost)
}

/// `tokens.single_use` and `tokens.revoked_rejected`, by `sut::token::check`. Token events'
/// stamps are their history sequence numbers.
pub fn tokens(history: &[Event]) -> [(&'static str, Result<(), Violation>); 2] {
    use sut::token::check::TokenViolation as V;
    let events: Vec<TokenEvent> = history
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Token(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let map = |name: &'static str, r: Result<(), V>| {
        r.map_err(|v| {
            let at = match &v {
                V::SingleUse { at, .. }
                | V::RevokedAccepted { at, .. }
                | V::OutOfOrder { at, .. } => *at,
            };
            violation(name, Some(at), v.to_string())
        })
    };
    [
        (
            "tokens.single_use",
            map("tokens.single_use", check_single_use(&events)),
        ),
        (
            "tokens.revoked_rejected",
            map("tokens.revoked_rejected", check_revoked_rejected(&events)),
        ),
    ]
}

/// The `lottery.*` invariants, by `sut::lottery::invariants`. `replies` are the participants'
/// replies in the order they took effect (the durable logs replayed; the history records them
/// when they are acknowledged, which is a different order).
pub fn lottery(
    history: &[Event],
    replies: &[ParticipantReply],
    ledger: &Ledger,
    registry: &sut::lottery::Registry,
) -> [(&'static str, Result<(), Violation>); 7] {
    // The history records a reply when it is acknowledged: the k-th reply of a value that took
    // effect (a repeated Try is a reply equal to the first) is the k-th acknowledgement of that
    // value (none, for one whose node crashed before answering).
    let acknowledged: rustc_hash::FxHashMap<&ParticipantReply, Vec<u64>> = {
        let mut map: rustc_hash::FxHashMap<&ParticipantReply, Vec<u64>> =
            rustc_hash::FxHashMap::default();
        for e in history {
            if let EventKind::Participant(r) = &e.kind {
                map.entry(r).or_default().push(e.seq);
            }
        }
        map
    };
    let reply_seqs: Vec<Option<u64>> = {
        let mut seen: rustc_hash::FxHashMap<&ParticipantReply, usize> =
            rustc_hash::FxHashMap::default();
        replies
            .iter()
            .map(|r| {
                let k = seen.entry(r).or_insert(0);
                *k += 1;
                acknowledged
                    .get(r)
                    .and_then(|seqs| seqs.get(*k - 1))
                    .copied()
            })
            .collect()
    };
    let (draws, draw_seqs): (Vec<DrawEvent>, Vec<u64>) = history
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Draw(d) => Some((d.clone(), e.seq)),
            _ => None,
        })
        .unzip();
    // What clients were told, finally: a first answer or a poll of a draw answered `pending`.
    let (answers, answer_seqs): (Vec<ClientReport>, Vec<u64>) = history
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Complete {
                outcome: Outcome::Ok(Answer::Draw { xid, status }),
                ..
            } => {
                let verdict = final_verdict(status)?;
                Some((
                    ClientReport {
                        xid: Xid(*xid),
                        verdict,
                    },
                    e.seq,
                ))
            }
            _ => None,
        })
        .unzip();
    // Every item a violation names, as the history's own event number (`#N`).
    let number = |stream: invariants::Stream, i: usize| -> Option<u64> {
        match stream {
            invariants::Stream::Replies => reply_seqs.get(i).copied().flatten(),
            invariants::Stream::Events => draw_seqs.get(i).copied(),
            invariants::Stream::Answers => answer_seqs.get(i).copied(),
        }
    };
    let named = |name: &str, v: &invariants::LotteryViolation| {
        let at = v.offending().and_then(|(stream, i)| number(stream, i));
        violation(name, at, v.numbered(&number))
    };
    let dup = invariants::no_duplicate_participation(replies)
        .map_err(|v| named("lottery.no_duplicate_participation", &v))
        .and_then(|()| {
            invariants::no_duplicate_confirmed_draws(&draws)
                .map_err(|v| named("lottery.no_duplicate_participation", &v))
        });
    [
        ("lottery.no_duplicate_participation", dup),
        (
            "lottery.no_over_issue",
            invariants::no_over_issue(ledger)
                .map_err(|v| violation("lottery.no_over_issue", None, v.to_string())),
        ),
        (
            "lottery.conservation",
            invariants::conservation(ledger)
                .map_err(|v| violation("lottery.conservation", None, v.to_string())),
        ),
        (
            "lottery.no_hanging",
            invariants::no_hanging(replies).map_err(|v| named("lottery.no_hanging", &v)),
        ),
        (
            "lottery.settled",
            invariants::settled(ledger)
                .map_err(|v| violation("lottery.settled", None, v.to_string())),
        ),
        (
            "lottery.agreement",
            invariants::answers_agree(&draws, &answers, &[ledger])
                .map_err(|v| named("lottery.agreement", &v)),
        ),
        (
            invariants::PAID,
            invariants::paid(ledger, registry)
                .map_err(|v| violation(invariants::PAID, None, v.to_string())),
        ),
    ]
}

/// `lottery.no_dead_letter_after_heal`: once every fault has healed (the liveness phase), no
/// draw is given up: a compensation round that begins after the heal must get through. A draw
/// dead-lettered during the faults is allowed (its budget ran out while the network was down;
/// the operator retries it after the heal, and `lottery.settled` requires it to finish), and so
/// is one dead-lettered within `grace_ms` of the heal, by a round that began before it (see
/// `CoordinatorConfig::round_ms_max`).
pub fn no_dead_letter_after_heal(history: &[Event], grace_ms: u64) -> Result<(), Violation> {
    let Some(healed) = healed(history) else {
        return Ok(());
    };
    let judged_from_ms = healed.sim_ms.saturating_add(grace_ms);
    let dead = history.iter().find_map(|e| match &e.kind {
        EventKind::Draw(d)
            if e.seq > healed.seq
                && e.sim_ms > judged_from_ms
                && matches!(d.outcome, sut::lottery::DrawOutcome::DeadLettered { .. }) =>
        {
            Some((e, d.draw.xid))
        }
        _ => None,
    });
    match dead {
        None => Ok(()),
        Some((e, xid)) => Err(violation(
            "lottery.no_dead_letter_after_heal",
            Some(e.seq),
            format!(
                "draw {xid} was dead-lettered (#{}, {} ms) after every fault had healed (#{}, \
                 {} ms) and after the longest round begun before the heal ({grace_ms} ms) could \
                 have ended",
                e.seq, e.sim_ms, healed.seq, healed.sim_ms
            ),
        )),
    }
}

/// What each client was told of the draws it was answered `pending` (or another status that
/// is not final) and what it heard last of each, from its own records: the polls' answers, a
/// failed poll as a draw the coordinator no longer knew (forgotten, if it restarted since the
/// client asked for the draw: an answer `pending` made before a restart can arrive after it), a
/// poll that timed out as nothing heard.
#[must_use]
pub fn followed_draws(history: &[Event]) -> Vec<Followed> {
    use crate::history::Op;
    let mut ops: rustc_hash::FxHashMap<(&str, u64), (&Op, u64)> = rustc_hash::FxHashMap::default();
    let mut followed: Vec<Followed> = Vec::new();
    // Where each followed draw was asked for (its Draw's Invoke).
    let mut asked_at: Vec<u64> = Vec::new();
    let mut index: rustc_hash::FxHashMap<(&str, u64), usize> = rustc_hash::FxHashMap::default();
    // The coordinator's restarts (its final outcomes are in memory only).
    let mut coord_boots: Vec<u64> = Vec::new();
    for e in history {
        if &*e.node == "coord" && matches!(e.kind, EventKind::Boot { .. }) {
            coord_boots.push(e.seq);
        }
        match &e.kind {
            EventKind::Invoke { op_id, op }
                if matches!(op, Op::Draw { .. } | Op::DrawStatus { .. }) =>
            {
                ops.insert((&e.node, *op_id), (op, e.seq));
            }
            EventKind::Complete { op_id, outcome } => {
                let Some((op, invoked_at)) = ops.remove(&(&*e.node, *op_id)) else {
                    continue;
                };
                match (op, outcome) {
                    (Op::Draw { .. }, Outcome::Ok(Answer::Draw { xid, status }))
                        if final_verdict(status).is_none() =>
                    {
                        index.insert((&e.node, *xid), followed.len());
                        asked_at.push(invoked_at);
                        followed.push(Followed {
                            client: e.node.to_string(),
                            xid: Xid(*xid),
                            told_at: e.seq,
                            last: None,
                        });
                    }
                    (Op::DrawStatus { xid }, Outcome::Ok(Answer::Draw { status, .. })) => {
                        if let Some(&i) = index.get(&(&*e.node, *xid)) {
                            let heard = final_verdict(status)
                                .map_or_else(|| LastHeard::Open(status.clone()), LastHeard::Final);
                            followed[i].last = Some((e.seq, heard));
                        }
                    }
                    (Op::DrawStatus { xid }, Outcome::Fail(_)) => {
                        if let Some(&i) = index.get(&(&*e.node, *xid)) {
                            let restarted = coord_boots
                                .iter()
                                .any(|boot| (asked_at[i]..e.seq).contains(boot));
                            let heard = if restarted {
                                LastHeard::Forgotten
                            } else {
                                LastHeard::Unknown
                            };
                            followed[i].last = Some((e.seq, heard));
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    followed
}

/// The verdict of a final draw status's name (`confirmed`, `cancelled`); `None` for the others.
fn final_verdict(status: &str) -> Option<sut::lottery::Verdict> {
    [DrawStatus::Confirmed, DrawStatus::Cancelled]
        .into_iter()
        .find(|s| s.name() == status)?
        .final_verdict()
}

/// `lottery.pending_settled` (`sut::lottery::invariants::pending_settled`) over what the clients
/// recorded; judged only on a run whose faults healed (a history without a liveness phase
/// promises nothing yet).
pub fn pending_settled(history: &[Event]) -> Result<(), Violation> {
    if healed(history).is_none() {
        return Ok(());
    }
    invariants::pending_settled(&followed_draws(history))
        .map_err(|v| violation(invariants::PENDING_SETTLED, v.event(), v.to_string()))
}

/// The event that began the liveness phase (every fault healed), if the history has one.
fn healed(history: &[Event]) -> Option<&Event> {
    history
        .iter()
        .find(|e| matches!(&e.kind, EventKind::Phase(p) if p == "liveness"))
}

/// One invariant's name and result.
pub type Checked = (String, Result<(), Violation>);

/// Runs every checker. Returns per invariant its result, plus the segment IDs lost.
pub fn check_all(history: &[Event], state: &FinalState) -> (Vec<Checked>, u64) {
    let mut results = vec![
        ("ids.unique".to_owned(), ids_unique(history)),
        ("ids.monotonic".to_owned(), ids_monotonic(history)),
    ];
    let gaps = ids_gap_bounded(history, state.gap_bound_ids);
    let lost = *gaps.as_ref().unwrap_or(&0);
    results.push(("ids.gap_bounded".to_owned(), gaps.map(|_| ())));
    results.push((
        "ids.progress".to_owned(),
        ids_progress(history, state.progress.as_ref()),
    ));
    results.extend(tokens(history).into_iter().map(|(n, r)| (n.to_owned(), r)));
    results.extend(
        lottery(history, &state.replies, &state.ledger, &state.registry)
            .into_iter()
            .map(|(n, r)| (n.to_owned(), r)),
    );
    results.push((
        invariants::PENDING_SETTLED.to_owned(),
        pending_settled(history),
    ));
    results.push((
        "lottery.no_dead_letter_after_heal".to_owned(),
        no_dead_letter_after_heal(history, state.round_grace_ms),
    ));
    debug_assert_eq!(results.len(), INVARIANTS.len());
    (results, lost)
}

#[cfg(test)]
mod tests;
