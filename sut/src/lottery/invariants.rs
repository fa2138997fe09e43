//! The `lottery.*` invariants (docs/architecture.md, "The invariants, and where each is
//! checked") as plain functions over a [`Ledger`] snapshot and, where the property is about
//! order, a history of participant replies (in the order the participants produced them).
//! Tests, the simulator, the stateright models and the load verifier all call these. Each
//! returns the first violation found, naming the offending entity or event (its index in the
//! history).
//!
//! Safety (must hold at every instant, under any fault): [`no_duplicate_participation`],
//! [`no_over_issue`], [`conservation`], [`no_hanging`], [`agreement`], [`paid`] (the business's
//! own: every prize was paid for, at the operator's price). Liveness, checked once faults have healed
//! and the system has gone quiet: [`settled`].

use std::collections::BTreeMap;

use super::activity::Registry;
use super::coordinator::{DrawEvent, DrawOutcome};
use super::ledger::Ledger;
use super::log::Verdict;
use super::participant::ParticipantReply;
use super::rows::{Effect, FenceStatus, Stock};
use super::{ActivityId, Participant, Phase, UserId, Xid};

/// `lottery.no_duplicate_participation`
pub const NO_DUPLICATE_PARTICIPATION: &str = "lottery.no_duplicate_participation";
/// `lottery.no_over_issue`
pub const NO_OVER_ISSUE: &str = "lottery.no_over_issue";
/// `lottery.conservation`
pub const CONSERVATION: &str = "lottery.conservation";
/// `lottery.no_hanging`
pub const NO_HANGING: &str = "lottery.no_hanging";
/// `lottery.settled`
pub const SETTLED: &str = "lottery.settled";
/// `lottery.agreement`
pub const AGREEMENT: &str = "lottery.agreement";
/// `lottery.paid`
pub const PAID: &str = "lottery.paid";
/// `lottery.pending_settled`
pub const PENDING_SETTLED: &str = "lottery.pending_settled";

/// The list an index of a [`LotteryViolation`] points into: the participants' replies (in the
/// order they took effect), the coordinator's outcome events, or the clients' final answers, as
/// the caller passed them. [`LotteryViolation::numbered`] writes each as the caller's own event
/// number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// Participant replies.
    Replies,
    /// Coordinator outcome events.
    Events,
    /// Clients' final answers.
    Answers,
}

impl Stream {
    /// What one item of the list is called, for a message that has no event number for it.
    #[must_use]
    pub const fn item(self) -> &'static str {
        match self {
            Self::Replies => "reply",
            Self::Events => "outcome",
            Self::Answers => "answer",
        }
    }
}

/// What is still open when `lottery.settled` expected everything closed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Unsettled {
    /// The coordinator log still holds the draw.
    #[error("draw {xid} is still open in the coordinator's log")]
    OpenDraw {
        /// The draw.
        xid: Xid,
    },
    /// A fence row still says `tried` (neither confirmed nor cancelled).
    #[error("the {branch} branch of draw {xid} is still `tried` (neither confirmed nor cancelled)")]
    FenceTried {
        /// The draw.
        xid: Xid,
        /// The branch.
        branch: Participant,
    },
    /// Money still frozen.
    #[error("user {user} still has {frozen_minor} frozen")]
    Frozen {
        /// The user.
        user: UserId,
        /// How much.
        frozen_minor: u64,
    },
    /// Stock still reserved.
    #[error("activity {activity} still has {reserved} prize unit(s) reserved")]
    Reserved {
        /// The activity.
        activity: ActivityId,
        /// How many units.
        reserved: u64,
    },
    /// A participation record neither confirmed nor erased.
    #[error(
        "user {user} in activity {activity} still has a pending participation record (draw {xid})"
    )]
    PendingParticipation {
        /// The user.
        user: UserId,
        /// The activity.
        activity: ActivityId,
        /// The draw holding it.
        xid: Xid,
    },
    /// The house collected a different amount than the confirmed draws paid.
    #[error(
        "the house collected {collected_minor}, but the confirmed draws paid {confirmed_minor}"
    )]
    CollectedMismatch {
        /// Collected by the house.
        collected_minor: u64,
        /// Sum of the confirmed draws' prices.
        confirmed_minor: u128,
    },
    /// An activity issued a different number of prizes than it has confirmed winning draws.
    #[error(
        "activity {activity} issued {issued} prize(s) for {confirmed_wins} confirmed winning draw(s)"
    )]
    IssuedMismatch {
        /// The activity.
        activity: ActivityId,
        /// Units issued.
        issued: u64,
        /// Confirmed winning participation records.
        confirmed_wins: u64,
    },
}

/// A violated `lottery.*` invariant.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum LotteryViolation {
    /// Two different draws of one user in one activity were confirmed.
    #[error(
        "{NO_DUPLICATE_PARTICIPATION}: user {user} took part in activity {activity} twice: draws {first} and {second} were both confirmed (the second at {} {event_index})",
        stream.item()
    )]
    DuplicateParticipation {
        /// The list `event_index` points into.
        stream: Stream,
        /// The user.
        user: UserId,
        /// The activity.
        activity: ActivityId,
        /// The first confirmed draw.
        first: Xid,
        /// The second one.
        second: Xid,
        /// Index of the second confirmation in its list.
        event_index: usize,
    },
    /// More prizes issued than ever stocked.
    #[error(
        "{NO_OVER_ISSUE}: activity {activity} issued {issued} prize(s) but only {total} were ever stocked"
    )]
    OverIssue {
        /// The activity.
        activity: ActivityId,
        /// Units ever stocked.
        total: u64,
        /// Units issued.
        issued: u64,
    },
    /// Stock units created or lost: `available + reserved + issued != total`.
    #[error(
        "{NO_OVER_ISSUE}: activity {activity}'s stock does not add up: available {} + reserved {} + issued {} != total {}",
        stock.available, stock.reserved, stock.issued, stock.total
    )]
    StockMismatch {
        /// The activity.
        activity: ActivityId,
        /// Its row.
        stock: Stock,
    },
    /// Money created or lost.
    #[error(
        "{CONSERVATION}: money was created or lost: balances + frozen + collected = {held_minor}, but {minted_minor} was ever put in"
    )]
    Conservation {
        /// Money put in.
        minted_minor: u64,
        /// Money found.
        held_minor: u128,
    },
    /// A Try took effect after a Cancel of the same branch had been accepted.
    #[error(
        "{NO_HANGING}: the Try of draw {xid} on the {branch} participant took effect (reply {try_index}) after that branch's Cancel had been accepted (reply {cancel_index}): a hanging Try"
    )]
    Hanging {
        /// The draw.
        xid: Xid,
        /// The branch.
        branch: Participant,
        /// Index of the accepted Cancel.
        cancel_index: usize,
        /// Index of the Try that took effect afterwards.
        try_index: usize,
    },
    /// A branch's final state contradicts the outcome the coordinator reported for its draw.
    #[error(
        "{AGREEMENT}: draw {xid} was reported {outcome} (outcome {event_index}), but its {branch} branch is {}",
        found.map_or_else(|| "absent".to_owned(), |s| format!("{s:?}").to_lowercase())
    )]
    Disagreement {
        /// The draw.
        xid: Xid,
        /// The branch whose fence row disagrees.
        branch: Participant,
        /// What the coordinator reported: "confirmed" or "cancelled".
        outcome: &'static str,
        /// The branch's fence row (`None`: absent).
        found: Option<FenceStatus>,
        /// Index of the outcome event.
        event_index: usize,
    },
    /// A client was told a final answer that the coordinator's reports or the participants'
    /// fence rows contradict.
    #[error(
        "{AGREEMENT}: the client of draw {xid} was told {told} (answer {answer_index}), but {found}"
    )]
    AnswerDisagrees {
        /// The draw.
        xid: Xid,
        /// What the client was told: "confirmed" or "cancelled".
        told: &'static str,
        /// What contradicts it.
        found: String,
        /// Index of the answer among the clients' final answers.
        answer_index: usize,
    },
    /// The coordinator reported two different final outcomes for one draw.
    #[error(
        "{AGREEMENT}: draw {xid} was reported {first} (outcome {first_index}) and then {second} (outcome {second_index})"
    )]
    ConflictingOutcomes {
        /// The draw.
        xid: Xid,
        /// The first final outcome.
        first: &'static str,
        /// Its event.
        first_index: usize,
        /// The other one.
        second: &'static str,
        /// Its event.
        second_index: usize,
    },
    /// Something is still open after the system went quiet.
    #[error("{SETTLED}: {0}")]
    Unsettled(Unsettled),
    /// A confirmed participation did not pay its activity's registered price.
    #[error(
        "{PAID}: user {user}'s draw {xid} in activity {activity} was confirmed at {paid_minor}, but {}",
        price_minor.map_or_else(|| "the activity is not registered".to_owned(), |p| format!("the activity costs {p}"))
    )]
    Unpaid {
        /// The draw.
        xid: Xid,
        /// The user.
        user: UserId,
        /// The activity.
        activity: ActivityId,
        /// What the draw paid.
        paid_minor: u64,
        /// The activity's registered price (`None`: not registered).
        price_minor: Option<u64>,
    },
    /// A client was told its draw is pending and never heard a final answer.
    #[error(
        "{PENDING_SETTLED}: {} was told draw {} is pending (#{}) and {}",
        followed.client,
        followed.xid,
        followed.told_at,
        followed.last.as_ref().map_or_else(
            || "never heard of it again: every later poll went unanswered".to_owned(),
            |(at, heard)| format!("last heard (#{at}) {heard}, with every fault healed by the end of the run"),
        )
    )]
    PendingNeverSettled {
        /// What the client saw.
        followed: Box<Followed>,
    },
    /// More prizes issued than winning draws that paid the activity's price.
    #[error(
        "{PAID}: activity {activity} issued {issued} prize(s), but only {paid_wins} winning draw(s) paid its price"
    )]
    PrizeNotPaidFor {
        /// The activity.
        activity: ActivityId,
        /// Units issued.
        issued: u64,
        /// Winning participations (pending or confirmed) at the registered price.
        paid_wins: u64,
    },
}

/// What a client last heard of a draw it was told is pending.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LastHeard {
    /// A final answer: the draw was confirmed or cancelled.
    Final(Verdict),
    /// A status that is not final (`pending`, `in_progress`, `dead_lettered`), by name.
    Open(String),
    /// The service no longer knew the draw, and it had not restarted since the client was
    /// told `pending`.
    Unknown,
    /// The service no longer knew the draw after a restart since the client was told
    /// `pending`: the documented limit (a coordinator remembers final outcomes in memory only,
    /// `CoordinatorNode::recover`), accepted and counted, not a violation.
    Forgotten,
}

/// One client's view of a draw it was told is pending: where it was told so and what it last
/// heard since, by the history's event numbers (`#N`) of the client's own records.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Followed {
    /// The client.
    pub client: String,
    /// The draw.
    pub xid: Xid,
    /// The event (`#N`) that recorded the answer `pending`.
    pub told_at: u64,
    /// The last answer the client recorded about the draw since, with its event (`#N`);
    /// `None`: none came (every poll timed out, or the client never polled).
    pub last: Option<(u64, LastHeard)>,
}

impl std::fmt::Display for LastHeard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Final(Verdict::Confirm) => f.write_str("confirmed"),
            Self::Final(Verdict::Cancel) => f.write_str("cancelled"),
            Self::Open(status) => write!(f, "still `{status}`"),
            Self::Unknown => {
                f.write_str("a draw the service no longer knew (it had not restarted)")
            }
            Self::Forgotten => f.write_str("a draw the service forgot in a restart"),
        }
    }
}

impl LotteryViolation {
    /// The invariant's name, e.g. `lottery.no_over_issue`.
    #[must_use]
    pub const fn invariant(&self) -> &'static str {
        match self {
            Self::DuplicateParticipation { .. } => NO_DUPLICATE_PARTICIPATION,
            Self::OverIssue { .. } | Self::StockMismatch { .. } => NO_OVER_ISSUE,
            Self::Conservation { .. } => CONSERVATION,
            Self::Hanging { .. } => NO_HANGING,
            Self::Disagreement { .. }
            | Self::ConflictingOutcomes { .. }
            | Self::AnswerDisagrees { .. } => AGREEMENT,
            Self::Unsettled(_) => SETTLED,
            Self::Unpaid { .. } | Self::PrizeNotPaidFor { .. } => PAID,
            Self::PendingNeverSettled { .. } => PENDING_SETTLED,
        }
    }

    /// The offending item (the later of two), in the list it indexes; `None` for a violation
    /// about state rather than an item.
    #[must_use]
    pub const fn offending(&self) -> Option<(Stream, usize)> {
        match self {
            Self::DuplicateParticipation {
                stream,
                event_index,
                ..
            } => Some((*stream, *event_index)),
            Self::Hanging { try_index, .. } => Some((Stream::Replies, *try_index)),
            Self::Disagreement { event_index, .. } => Some((Stream::Events, *event_index)),
            Self::AnswerDisagrees { answer_index, .. } => Some((Stream::Answers, *answer_index)),
            Self::ConflictingOutcomes { second_index, .. } => Some((Stream::Events, *second_index)),
            _ => None,
        }
    }

    /// The message, with every item it names written as the caller's event number (`#N`,
    /// `number` of the list and index) and, where the caller has none for it (a reply that took
    /// effect but was never acknowledged), as its place in its list.
    #[must_use]
    pub fn numbered(&self, number: &dyn Fn(Stream, usize) -> Option<u64>) -> String {
        let at = |stream: Stream, index: usize| {
            number(stream, index).map_or_else(
                || {
                    format!(
                        "{} {index} of the {}, never recorded as an event",
                        stream.item(),
                        match stream {
                            Stream::Replies => "participants' durable logs",
                            Stream::Events => "coordinator's outcomes",
                            Stream::Answers => "clients' answers",
                        }
                    )
                },
                |n| format!("#{n}"),
            )
        };
        match self {
            Self::DuplicateParticipation {
                stream,
                user,
                activity,
                first,
                second,
                event_index,
            } => format!(
                "{NO_DUPLICATE_PARTICIPATION}: user {user} took part in activity {activity} twice: draws {first} and {second} were both confirmed (the second at {})",
                at(*stream, *event_index)
            ),
            Self::Hanging {
                xid,
                branch,
                cancel_index,
                try_index,
            } => format!(
                "{NO_HANGING}: the Try of draw {xid} on the {branch} participant took effect ({}) after that branch's Cancel had been accepted ({}): a hanging Try",
                at(Stream::Replies, *try_index),
                at(Stream::Replies, *cancel_index)
            ),
            Self::Disagreement {
                xid,
                branch,
                outcome,
                found,
                event_index,
            } => format!(
                "{AGREEMENT}: draw {xid} was reported {outcome} ({}), but its {branch} branch is {}",
                at(Stream::Events, *event_index),
                found.map_or_else(|| "absent".to_owned(), |s| format!("{s:?}").to_lowercase())
            ),
            Self::AnswerDisagrees {
                xid,
                told,
                found,
                answer_index,
            } => format!(
                "{AGREEMENT}: the client of draw {xid} was told {told} ({}), but {found}",
                at(Stream::Answers, *answer_index)
            ),
            Self::ConflictingOutcomes {
                xid,
                first,
                first_index,
                second,
                second_index,
            } => format!(
                "{AGREEMENT}: draw {xid} was reported {first} ({}) and then {second} ({})",
                at(Stream::Events, *first_index),
                at(Stream::Events, *second_index)
            ),
            other => other.to_string(),
        }
    }

    /// The first offending event, as the history numbers it (`#N`), where the violation is
    /// about one event of a history the caller numbered.
    #[must_use]
    pub fn event(&self) -> Option<u64> {
        match self {
            Self::PendingNeverSettled { followed } => Some(
                followed
                    .last
                    .as_ref()
                    .map_or(followed.told_at, |(at, _)| *at),
            ),
            _ => None,
        }
    }
}

/// `lottery.no_duplicate_participation` over participant replies: at most one draw per
/// (user, activity) has its participation Confirm take effect.
///
/// # Errors
/// [`LotteryViolation::DuplicateParticipation`].
pub fn no_duplicate_participation(history: &[ParticipantReply]) -> Result<(), LotteryViolation> {
    let confirmed = history.iter().enumerate().filter(|(_, r)| {
        r.branch == Participant::Participation
            && r.phase == Phase::Confirm
            && r.outcome == Ok(Effect::Applied)
    });
    first_duplicate(
        Stream::Replies,
        confirmed.map(|(i, r)| (i, r.draw.user, r.draw.activity, r.draw.xid)),
    )
}

/// `lottery.no_duplicate_participation` over coordinator outcome events (what a load verifier
/// sees): at most one `Confirmed` draw per (user, activity).
///
/// # Errors
/// [`LotteryViolation::DuplicateParticipation`].
pub fn no_duplicate_confirmed_draws(events: &[DrawEvent]) -> Result<(), LotteryViolation> {
    let confirmed = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e.outcome, DrawOutcome::Confirmed { .. }));
    first_duplicate(
        Stream::Events,
        confirmed.map(|(i, e)| (i, e.draw.user, e.draw.activity, e.draw.xid)),
    )
}

fn first_duplicate(
    stream: Stream,
    confirmed: impl Iterator<Item = (usize, UserId, ActivityId, Xid)>,
) -> Result<(), LotteryViolation> {
    let mut seen: BTreeMap<(UserId, ActivityId), Xid> = BTreeMap::new();
    for (event_index, user, activity, xid) in confirmed {
        match seen.get(&(user, activity)) {
            Some(first) if *first != xid => {
                return Err(LotteryViolation::DuplicateParticipation {
                    stream,
                    user,
                    activity,
                    first: *first,
                    second: xid,
                    event_index,
                });
            }
            Some(_) => {}
            None => {
                seen.insert((user, activity), xid);
            }
        }
    }
    Ok(())
}

/// `lottery.agreement`: every draw the coordinator reported final ends the same on every
/// branch: a `Confirmed` draw has every branch it has (wallet, participation, inventory if it
/// won) `committed`; a `Cancelled` draw has no branch `committed` or still `tried`; and no draw
/// is reported both. `events` are the coordinator's outcome events in order, `ledgers` the
/// participants' state after them (one merged ledger, or each participant's own: a fence row is
/// looked up in the first that holds it).
///
/// # Errors
/// [`LotteryViolation::Disagreement`], [`LotteryViolation::ConflictingOutcomes`].
pub fn agreement(events: &[DrawEvent], ledgers: &[&Ledger]) -> Result<(), LotteryViolation> {
    let mut finals: BTreeMap<Xid, (&'static str, usize)> = BTreeMap::new();
    for (event_index, e) in events.iter().enumerate() {
        // Parked and dead-lettered draws go on: only a final outcome is judged (one place says
        // which outcomes are final).
        if !e.outcome.is_final() {
            continue;
        }
        let outcome = if matches!(e.outcome, DrawOutcome::Confirmed { .. }) {
            "confirmed"
        } else {
            "cancelled"
        };
        let xid = e.draw.xid;
        match finals.get(&xid) {
            Some(&(first, first_index)) if first != outcome => {
                return Err(LotteryViolation::ConflictingOutcomes {
                    xid,
                    first,
                    first_index,
                    second: outcome,
                    second_index: event_index,
                });
            }
            Some(_) => {}
            None => {
                finals.insert(xid, (outcome, event_index));
            }
        }
        branches_agree(e, outcome == "confirmed", ledgers, event_index)?;
    }
    Ok(())
}

/// A final answer a client saw: its draw, and whether it was told confirmed or cancelled (a
/// first answer, or a poll of the draw's status: see [`super::answer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientReport {
    /// The draw.
    pub xid: Xid,
    /// What the client was told.
    pub verdict: Verdict,
}

/// `lottery.agreement` over what clients were told (with [`agreement`] over the coordinator's
/// own reports): every final answer a client saw — confirmed or cancelled, at once or by
/// polling a draw answered `pending` — matches the coordinator's final report of that draw and
/// the fence rows of every branch it has. A client answer the coordinator never reported is
/// itself a disagreement: the answer was made up.
///
/// # Errors
/// [`LotteryViolation::AnswerDisagrees`] (or what [`agreement`] finds first).
pub fn answers_agree(
    events: &[DrawEvent],
    answers: &[ClientReport],
    ledgers: &[&Ledger],
) -> Result<(), LotteryViolation> {
    agreement(events, ledgers)?;
    // Each draw's reports, in order (one pass, rather than one per answer).
    let mut by_draw: BTreeMap<Xid, Vec<&DrawEvent>> = BTreeMap::new();
    for e in events {
        by_draw.entry(e.draw.xid).or_default().push(e);
    }
    for (answer_index, answer) in answers.iter().enumerate() {
        let confirmed = answer.verdict == Verdict::Confirm;
        let told = if confirmed { "confirmed" } else { "cancelled" };
        let disagrees = |found: String| LotteryViolation::AnswerDisagrees {
            xid: answer.xid,
            told,
            found,
            answer_index,
        };
        let mut reports = by_draw
            .get(&answer.xid)
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .copied();
        let Some(first) = reports.clone().next() else {
            return Err(disagrees(
                "the coordinator never reported the draw".to_owned(),
            ));
        };
        if let Some(other) = reports.find(|e| {
            e.outcome.is_final() && matches!(e.outcome, DrawOutcome::Confirmed { .. }) != confirmed
        }) {
            return Err(disagrees(format!(
                "the coordinator reported {:?}",
                other.outcome
            )));
        }
        branches_agree(first, confirmed, ledgers, answer_index).map_err(|v| match v {
            LotteryViolation::Disagreement { branch, found, .. } => disagrees(format!(
                "the fence row of its {branch:?} branch is {}",
                found.map_or_else(|| "absent".to_owned(), |f| format!("{f:?}"))
            )),
            other => other,
        })?;
    }
    Ok(())
}

/// Every branch of `e`'s draw agrees with its outcome (`confirmed`, else cancelled).
fn branches_agree(
    e: &DrawEvent,
    confirmed: bool,
    ledgers: &[&Ledger],
    event_index: usize,
) -> Result<(), LotteryViolation> {
    use FenceStatus::{Committed, Tried};
    for branch in Participant::ALL {
        if !e.draw.has_branch(branch) {
            continue;
        }
        let found = ledgers
            .iter()
            .find_map(|l| l.fences.get(&(e.draw.xid, branch)))
            .copied();
        let agrees = if confirmed {
            found == Some(Committed)
        } else {
            !matches!(found, Some(Committed | Tried))
        };
        if !agrees {
            return Err(LotteryViolation::Disagreement {
                xid: e.draw.xid,
                branch,
                outcome: if confirmed { "confirmed" } else { "cancelled" },
                found,
                event_index,
            });
        }
    }
    Ok(())
}

/// `lottery.no_over_issue`: per activity, `issued <= total` and
/// `available + reserved + issued == total` (no unit created by a lost update).
///
/// # Errors
/// [`LotteryViolation::OverIssue`], [`LotteryViolation::StockMismatch`].
pub fn no_over_issue(ledger: &Ledger) -> Result<(), LotteryViolation> {
    for (activity, stock) in &ledger.stock {
        if stock.issued > stock.total {
            return Err(LotteryViolation::OverIssue {
                activity: *activity,
                total: stock.total,
                issued: stock.issued,
            });
        }
        let sum =
            u128::from(stock.available) + u128::from(stock.reserved) + u128::from(stock.issued);
        if sum != u128::from(stock.total) {
            return Err(LotteryViolation::StockMismatch {
                activity: *activity,
                stock: *stock,
            });
        }
    }
    Ok(())
}

/// `lottery.conservation`: balances + frozen + collected == minted.
///
/// # Errors
/// [`LotteryViolation::Conservation`].
pub fn conservation(ledger: &Ledger) -> Result<(), LotteryViolation> {
    let held: u128 = ledger
        .accounts
        .values()
        .map(|a| u128::from(a.balance_minor) + u128::from(a.frozen_minor))
        .sum::<u128>()
        + u128::from(ledger.collected_minor);
    if held == u128::from(ledger.minted_minor) {
        Ok(())
    } else {
        Err(LotteryViolation::Conservation {
            minted_minor: ledger.minted_minor,
            held_minor: held,
        })
    }
}

/// `lottery.no_hanging` over participant replies: once a Cancel of a branch was accepted
/// (applied, empty rollback or repeat), no Try of that branch takes effect.
///
/// # Errors
/// [`LotteryViolation::Hanging`].
pub fn no_hanging(history: &[ParticipantReply]) -> Result<(), LotteryViolation> {
    let mut cancelled: BTreeMap<(Xid, Participant), usize> = BTreeMap::new();
    for (i, r) in history.iter().enumerate() {
        let key = (r.draw.xid, r.branch);
        match (r.phase, &r.outcome) {
            (Phase::Cancel, Ok(_)) => {
                cancelled.entry(key).or_insert(i);
            }
            (Phase::Try, Ok(Effect::Applied)) => {
                if let Some(cancel_index) = cancelled.get(&key) {
                    return Err(LotteryViolation::Hanging {
                        xid: key.0,
                        branch: key.1,
                        cancel_index: *cancel_index,
                        try_index: i,
                    });
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `lottery.paid`: what the business needs, which conservation alone does not say (a client
/// that names price 0 wins for nothing and every sum still adds up):
///
/// - every confirmed participation paid exactly its activity's registered price;
/// - per activity, the prizes issued are at most the winning participations (pending or
///   confirmed) at that price: every issued prize belongs to a draw that paid for it. (A prize is
///   issued by the inventory's Confirm, which only a logged Confirm verdict sends, and a draw
///   with that verdict keeps its participation record: so the bound holds at every instant, not
///   only once settled.)
///
/// `ledger` must hold the participations and the stock together (one process, or the merged
/// parts of a deployment); `registry` is the operator's.
///
/// # Errors
/// [`LotteryViolation::Unpaid`], [`LotteryViolation::PrizeNotPaidFor`].
pub fn paid(ledger: &Ledger, registry: &Registry) -> Result<(), LotteryViolation> {
    let mut paid_wins: BTreeMap<ActivityId, u64> = BTreeMap::new();
    for ((user, activity), row) in &ledger.participations {
        let price_minor = registry.get(*activity).map(|t| t.price_minor);
        let paid_in_full = price_minor == Some(row.price_minor);
        if row.confirmed && !paid_in_full {
            return Err(LotteryViolation::Unpaid {
                xid: row.xid,
                user: *user,
                activity: *activity,
                paid_minor: row.price_minor,
                price_minor,
            });
        }
        if paid_in_full && row.won {
            *paid_wins.entry(*activity).or_default() += 1;
        }
    }
    for (activity, stock) in &ledger.stock {
        let paid_wins = paid_wins.get(activity).copied().unwrap_or(0);
        if stock.issued > paid_wins {
            return Err(LotteryViolation::PrizeNotPaidFor {
                activity: *activity,
                issued: stock.issued,
                paid_wins,
            });
        }
    }
    Ok(())
}

/// Every safety invariant at once (the ones that must hold at every instant).
///
/// # Errors
/// The first violation.
pub fn check_safety(ledger: &Ledger, history: &[ParticipantReply]) -> Result<(), LotteryViolation> {
    conservation(ledger)?;
    no_over_issue(ledger)?;
    no_hanging(history)?;
    no_duplicate_participation(history)
}

/// `lottery.pending_settled`: every draw a client was told is pending (the server's 202, the
/// simulator's `pending`) reached a final answer for that client, confirmed or cancelled, by
/// the end of the run, once every fault had healed. The branch-level invariants judge what the
/// participants did; this one judges what the client saw: a draw given up by compensation (or
/// answered "unknown" by a service that never restarted) and still polled as `pending` at the
/// end is a broken promise even when every fence row closed. A draw forgotten in a restart
/// ([`LastHeard::Forgotten`]) is the documented limit and passes. `followed` lists, per client
/// and draw, where it was told `pending` and what it heard last.
///
/// # Errors
/// [`LotteryViolation::PendingNeverSettled`] for the first draw (in `followed` order) whose last
/// answer is not final.
pub fn pending_settled(followed: &[Followed]) -> Result<(), LotteryViolation> {
    match followed.iter().find(|f| {
        !matches!(
            f.last,
            Some((_, LastHeard::Final(_) | LastHeard::Forgotten))
        )
    }) {
        Some(f) => Err(LotteryViolation::PendingNeverSettled {
            followed: Box::new(f.clone()),
        }),
        None => Ok(()),
    }
}

/// `lottery.settled`: once faults healed and the system went quiet, every draw ended Confirmed
/// or Cancelled: no open coordinator record, no `tried` fence row, nothing frozen or reserved,
/// no pending participation, and the house collected exactly the confirmed draws' prices and
/// each activity issued exactly its confirmed wins.
///
/// # Errors
/// [`LotteryViolation::Unsettled`] naming what is still open.
pub fn settled(ledger: &Ledger) -> Result<(), LotteryViolation> {
    match still_open(ledger).or_else(|| totals_mismatch(ledger)) {
        Some(u) => Err(LotteryViolation::Unsettled(u)),
        None => Ok(()),
    }
}

/// The first record still open: a coordinator record, a `tried` fence, frozen money, reserved
/// stock, or an unconfirmed participation.
fn still_open(ledger: &Ledger) -> Option<Unsettled> {
    if let Some(xid) = ledger.coord_log.records.keys().next() {
        return Some(Unsettled::OpenDraw { xid: *xid });
    }
    if let Some(((xid, branch), _)) = ledger
        .fences
        .iter()
        .find(|(_, s)| **s == super::FenceStatus::Tried)
    {
        return Some(Unsettled::FenceTried {
            xid: *xid,
            branch: *branch,
        });
    }
    if let Some((user, a)) = ledger.accounts.iter().find(|(_, a)| a.frozen_minor != 0) {
        return Some(Unsettled::Frozen {
            user: *user,
            frozen_minor: a.frozen_minor,
        });
    }
    if let Some((activity, s)) = ledger.stock.iter().find(|(_, s)| s.reserved != 0) {
        return Some(Unsettled::Reserved {
            activity: *activity,
            reserved: s.reserved,
        });
    }
    if let Some(((user, activity), row)) = ledger.participations.iter().find(|(_, r)| !r.confirmed)
    {
        return Some(Unsettled::PendingParticipation {
            user: *user,
            activity: *activity,
            xid: row.xid,
        });
    }
    None
}

/// The first total that disagrees with the confirmed draws: the house's collected money, or an
/// activity's issued prizes.
fn totals_mismatch(ledger: &Ledger) -> Option<Unsettled> {
    let confirmed_minor: u128 = ledger
        .participations
        .values()
        .map(|r| u128::from(r.price_minor))
        .sum();
    if confirmed_minor != u128::from(ledger.collected_minor) {
        return Some(Unsettled::CollectedMismatch {
            collected_minor: ledger.collected_minor,
            confirmed_minor,
        });
    }
    let mut wins: BTreeMap<ActivityId, u64> = BTreeMap::new();
    for ((_, activity), row) in &ledger.participations {
        if row.won {
            *wins.entry(*activity).or_default() += 1;
        }
    }
    for (activity, stock) in &ledger.stock {
        let confirmed_wins = wins.remove(activity).unwrap_or(0);
        if confirmed_wins != stock.issued {
            return Some(Unsettled::IssuedMismatch {
                activity: *activity,
                issued: stock.issued,
                confirmed_wins,
            });
        }
    }
    if let Some((activity, confirmed_wins)) = wins.into_iter().next() {
        return Some(Unsettled::IssuedMismatch {
            activity,
            issued: 0,
            confirmed_wins,
        });
    }
    None
}
