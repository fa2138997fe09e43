//! Participants against a hostile coordinator: any phase of any branch of any draw, in any
//! order, repeated, and (on the flawed two-step paths) with other messages run between the two
//! halves of one. The properties are the participants' own promises, checked after every
//! message against a reference of what each branch went through:
//!
//! - a Try takes effect only on a branch nothing was accepted for yet (never after its Cancel);
//! - a Confirm takes effect only after that branch's Try did, and once;
//! - a Cancel undoes a Try that took effect, records an empty rollback when there was none,
//!   and never undoes a Confirm;
//! - a repeat answers "already done" and a refusal changes nothing; a Confirm after a Try that
//!   took effect and a Cancel before a Confirm are never refused (the draw could not finish);
//! - the books match: frozen money and reserved stock are the Tries still open, collected money
//!   and issued stock the Confirms, participation records the open or confirmed Tries, and
//!   money and stock are conserved.
//!
//! The correct participants keep them for every sequence; the fence flaws break them, and the
//! tests at the end show the check firing on each.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use sut::lottery::referee::{self, Answer, BranchState, Referee};
use sut::lottery::{
    AMOUNT_MAX, ActivityId, DrawArgs, Effect, FenceMode, Flaws, Handled, Ledger, LotteryStore,
    MemoryStore, Participant, ParticipantConfig, ParticipantMsg, ParticipantReply, Phase, Refusal,
    Registry, Resume, Terms, UserId, Xid,
};

const PRICE_MINOR: u64 = 10;
const BALANCE_MINOR: u64 = 35;
const UNITS: u64 = 2;
const DRAWS: u64 = 6;

/// Draw `xid` (1..=DRAWS): two users, two activities, every third draw a winner. Balances and
/// stock are small, so business refusals happen too.
fn draw(xid: u64) -> DrawArgs {
    DrawArgs {
        xid: Xid(xid),
        user: UserId(1 + xid % 2),
        activity: ActivityId(1 + (xid / 2) % 2),
        price_minor: PRICE_MINOR,
        won: xid.is_multiple_of(3),
    }
}

/// The operator's registry: both activities at [`PRICE_MINOR`].
fn registry() -> Registry {
    Registry::from_entries([1, 2].map(|a| (ActivityId(a), Terms::always_open(PRICE_MINOR, 100))))
        .unwrap()
}

/// What a hostile coordinator does next.
#[derive(Clone, Debug)]
enum Action {
    /// Send `phase` for `branch` of draw `xid` (a branch the draw has).
    Send {
        xid: u64,
        branch: Participant,
        phase: Phase,
    },
    /// Let a paused half-done message finish, the newest or the oldest (flawed two-step paths
    /// only).
    Resume { newest: bool },
    /// Deliver the newest paused half-done message to the wrong participant: it must be refused
    /// and change nothing, and stays paused for its own participant.
    Misroute,
}

fn action() -> impl Strategy<Value = Action> {
    let branch = prop_oneof![
        Just(Participant::Wallet),
        Just(Participant::Inventory),
        Just(Participant::Participation),
    ];
    let phase = prop_oneof![Just(Phase::Try), Just(Phase::Confirm), Just(Phase::Cancel)];
    prop_oneof![
        6 => (1..=DRAWS, branch, phase).prop_map(|(xid, branch, phase)| {
            // A draw without that branch gets its wallet instead.
            let branch = if draw(xid).has_branch(branch) { branch } else { Participant::Wallet };
            Action::Send { xid, branch, phase }
        }),
        1 => any::<bool>().prop_map(|newest| Action::Resume { newest }),
        1 => Just(Action::Misroute),
    ]
}

/// Drives the participants of one store and checks their promises after every reply.
struct Bench {
    store: MemoryStore,
    config: ParticipantConfig,
    referee: Referee,
    paused: Vec<(Participant, ParticipantMsg, Resume)>,
    /// Every (phase, state before, answer kind) met: what a sequence exercised.
    seen: BTreeSet<(String, String, String)>,
}

impl Bench {
    fn new(flaws: Flaws) -> Self {
        let mut store = MemoryStore::new();
        for user in 1..=2 {
            store.open_account(UserId(user), BALANCE_MINOR).unwrap();
        }
        for activity in 1..=2 {
            store.add_stock(ActivityId(activity), UNITS).unwrap();
        }
        Self {
            store,
            config: ParticipantConfig { flaws },
            referee: Referee::new(),
            paused: Vec::new(),
            seen: BTreeSet::new(),
        }
    }

    fn ledger(&mut self) -> Ledger {
        self.store.snapshot().unwrap()
    }

    fn act(&mut self, action: &Action) -> Result<(), String> {
        let before = self.ledger();
        let (branch, msg, reply) = match *action {
            Action::Send { xid, branch, phase } => {
                let msg = ParticipantMsg {
                    phase,
                    draw: draw(xid),
                };
                match branch.handle(&mut self.store, &self.config, &registry(), &msg) {
                    Handled::Reply(reply) => (branch, msg, reply),
                    Handled::Resume(resume) => {
                        self.paused.push((branch, msg, resume));
                        return Ok(());
                    }
                }
            }
            Action::Resume { newest } => {
                if self.paused.is_empty() {
                    return Ok(());
                }
                let at = if newest { self.paused.len() - 1 } else { 0 };
                let (branch, msg, resume) = self.paused.remove(at);
                let reply = branch.handle_resume(&mut self.store, &self.config, &resume);
                (branch, msg, reply)
            }
            Action::Misroute => return self.misroute(&before),
        };
        self.check_reply(branch, &msg, &reply, &before)?;
        self.check_books()
    }

    /// A paused half-operation handed to another participant is refused as
    /// `WrongParticipant`, changes nothing, and remains its own participant's to finish.
    fn misroute(&mut self, before: &Ledger) -> Result<(), String> {
        let Some((branch, _, resume)) = self.paused.last().cloned() else {
            return Ok(());
        };
        let wrong = match branch {
            Participant::Wallet => Participant::Inventory,
            Participant::Inventory => Participant::Participation,
            Participant::Participation => Participant::Wallet,
        };
        let reply = wrong.handle_resume(&mut self.store, &self.config, &resume);
        let refused = Err(Refusal::WrongParticipant {
            expected: branch,
            actual: wrong,
        });
        if reply.outcome != refused {
            return Err(format!(
                "participant.routing: {wrong:?} answered {:?} to {branch:?}'s half-operation",
                reply.outcome
            ));
        }
        if self.ledger() != *before {
            return Err(format!(
                "participant.routing: {wrong:?} changed the books with {branch:?}'s \
                 half-operation"
            ));
        }
        self.seen.insert((
            "misroute".to_owned(),
            format!("{branch:?}"),
            "WrongParticipant".to_owned(),
        ));
        Ok(())
    }

    /// The reply is a transition the promises allow from what the branch went through (the
    /// shared referee, `sut::lottery::referee`), and a repeat or refusal changed nothing.
    fn check_reply(
        &mut self,
        branch: Participant,
        msg: &ParticipantMsg,
        reply: &ParticipantReply,
        before: &Ledger,
    ) -> Result<(), String> {
        let was = self.referee.state(msg.draw.xid, branch);
        let kind = match &reply.outcome {
            Ok(effect) => format!("{effect:?}"),
            Err(_) => "refused".to_owned(),
        };
        self.seen
            .insert((format!("{:?}", msg.phase), format!("{was:?}"), kind));
        let t = self
            .referee
            .judge(branch, msg, reply)
            .map_err(|b| format!("{b} ({:?})", reply.outcome))?;
        if t.changes_nothing() && self.ledger() != *before {
            return Err(format!(
                "a {} changed the books: {:?} of draw {} on {branch:?}",
                if t.answer == Answer::Refused {
                    "refusal"
                } else {
                    "repeat"
                },
                msg.phase,
                msg.draw.xid.0
            ));
        }
        Ok(())
    }

    /// Frozen, reserved, collected, issued and the participation records are what the branches
    /// went through; money and stock are conserved.
    fn check_books(&mut self) -> Result<(), String> {
        let ledger = self.ledger();
        let want = self.referee.books();
        let frozen: u64 = ledger.accounts.values().map(|a| a.frozen_minor).sum();
        let books = [
            ("frozen".to_owned(), frozen, want.frozen_minor),
            (
                "collected".to_owned(),
                ledger.collected_minor,
                want.collected_minor,
            ),
        ];
        let stock = ledger.stock.iter().flat_map(|(activity, s)| {
            [
                (
                    format!("reserved of {activity}"),
                    s.reserved,
                    want.reserved(*activity),
                ),
                (
                    format!("issued of {activity}"),
                    s.issued,
                    want.issued(*activity),
                ),
            ]
        });
        for (what, got, want) in books.into_iter().chain(stock) {
            referee::expect(what, got, want).map_err(|b| b.to_string())?;
        }
        for (branch, d, state) in self.referee.branches() {
            if branch != Participant::Participation {
                continue;
            }
            let row = ledger.participations.get(&(d.user, d.activity));
            let held = row.filter(|r| r.xid == d.xid).map(|r| r.confirmed);
            let want = match state {
                BranchState::Tried => Some(false),
                BranchState::Confirmed => Some(true),
                _ => None,
            };
            if held != want {
                return Err(format!(
                    "draw {}'s participation record is {held:?}, its branch is {state:?}",
                    d.xid.0
                ));
            }
        }
        sut::lottery::invariants::conservation(&ledger).map_err(|v| v.to_string())?;
        sut::lottery::invariants::no_over_issue(&ledger).map_err(|v| v.to_string())
    }
}

/// Runs `actions` against participants with `flaws`; the first broken promise.
fn run(flaws: Flaws, actions: &[Action]) -> Result<(), String> {
    run_seen(flaws, actions).map(|_| ())
}

/// [`run`], and the transitions the sequence went through.
fn run_seen(
    flaws: Flaws,
    actions: &[Action],
) -> Result<BTreeSet<(String, String, String)>, String> {
    let mut bench = Bench::new(flaws);
    for (i, action) in actions.iter().enumerate() {
        bench
            .act(action)
            .map_err(|e| format!("step {i} ({action:?}): {e}"))?;
    }
    Ok(bench.seen)
}

fn flawed(fence: FenceMode) -> Flaws {
    Flaws {
        fence,
        ..Flaws::NONE
    }
}

proptest! {
    #![proptest_config(Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x9A_471C),
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn correct_participants_keep_their_promises_whatever_the_coordinator_sends(
        actions in proptest::collection::vec(action(), 1..60)
    ) {
        prop_assert_eq!(run(Flaws::NONE, &actions), Ok(()));
    }
}

fn send(xid: u64, branch: Participant, phase: Phase) -> Action {
    Action::Send { xid, branch, phase }
}

#[test]
fn without_a_fence_a_try_after_its_cancel_takes_effect() {
    let actions = [
        send(1, Participant::Wallet, Phase::Try),
        send(1, Participant::Wallet, Phase::Cancel),
        send(1, Participant::Wallet, Phase::Try),
    ];
    assert_eq!(run(Flaws::NONE, &actions), Ok(()));
    let broken = run(flawed(FenceMode::Unfenced), &actions).unwrap_err();
    assert!(broken.starts_with("step 2"), "{broken}");
    assert!(
        broken.contains("after the branch was Cancelled"),
        "{broken}"
    );
}

#[test]
fn without_a_fence_an_empty_rollback_is_refused() {
    // A Cancel with no Try before it must be recorded, not refused: else the draw never ends.
    let actions = [send(1, Participant::Wallet, Phase::Cancel)];
    assert_eq!(run(Flaws::NONE, &actions), Ok(()));
    let broken = run(flawed(FenceMode::Unfenced), &actions).unwrap_err();
    assert!(broken.starts_with("step 0"), "{broken}");
    assert!(broken.contains("Underflow"), "{broken}");
}

#[test]
fn without_a_fence_a_repeated_confirm_is_not_idempotent() {
    let actions = [
        send(1, Participant::Wallet, Phase::Try),
        send(1, Participant::Wallet, Phase::Confirm),
        send(1, Participant::Wallet, Phase::Confirm),
    ];
    assert_eq!(run(Flaws::NONE, &actions), Ok(()));
    let broken = run(flawed(FenceMode::Unfenced), &actions).unwrap_err();
    assert!(broken.starts_with("step 2"), "{broken}");
}

#[test]
fn a_fence_checked_then_changed_lets_a_paused_try_in_after_its_cancel() {
    // The Try's fence check passes and the Try pauses; its Cancel checks and records an empty
    // rollback; then the Try finishes: a hanging Try, money frozen for a cancelled draw.
    let actions = [
        send(1, Participant::Wallet, Phase::Try),
        send(1, Participant::Wallet, Phase::Cancel),
        Action::Resume { newest: true },
        Action::Resume { newest: true },
    ];
    let broken = run(flawed(FenceMode::CheckThenAct), &actions).unwrap_err();
    assert!(broken.contains("step 3"), "{broken}");
    assert!(broken.contains("Suspended"), "{broken}");
}

#[test]
fn stock_read_then_written_loses_a_reservation() {
    // Two winning Tries on one activity read the stock before either writes it back: one unit
    // is both still available and reserved.
    let actions = [
        send(3, Participant::Inventory, Phase::Try),
        send(6, Participant::Inventory, Phase::Try),
        Action::Resume { newest: false },
        Action::Resume { newest: false },
    ];
    let two_step = Flaws {
        two_step_stock: true,
        ..Flaws::NONE
    };
    assert_eq!(run(Flaws::NONE, &actions), Ok(()));
    let broken = run(two_step, &actions).unwrap_err();
    assert!(broken.contains("step 3"), "{broken}");
    assert!(broken.contains("does not add up"), "{broken}");
}

#[test]
fn random_hostile_sequences_find_each_participant_flaw() {
    // The property of the tests above, run as a search: each flaw is found within 512 cases.
    let two_step = Flaws {
        two_step_stock: true,
        ..Flaws::NONE
    };
    for flaws in [
        flawed(FenceMode::Unfenced),
        flawed(FenceMode::CheckThenAct),
        two_step,
    ] {
        let mut runner = TestRunner::new(Config {
            cases: 512,
            rng_seed: RngSeed::Fixed(0x9A_471D),
            failure_persistence: None,
            ..Config::default()
        });
        let found = runner.run(&proptest::collection::vec(action(), 1..60), |actions| {
            run(flaws, &actions).map_err(TestCaseError::fail)
        });
        assert!(found.is_err(), "{flaws:?} survived 512 hostile sequences");
    }
}

#[test]
fn the_hostile_sequences_reach_every_transition() {
    // Not vacuous: 512 generated sequences on the correct path meet every answer the promises
    // allow, from every state it is allowed in.
    let mut runner = TestRunner::deterministic();
    let strategy = proptest::collection::vec(action(), 1..60);
    let mut seen = BTreeSet::new();
    for _ in 0..512 {
        let actions = strategy.new_tree(&mut runner).unwrap().current();
        seen.extend(run_seen(Flaws::NONE, &actions).unwrap());
    }
    let t =
        |phase: &str, was: &str, kind: &str| (phase.to_owned(), was.to_owned(), kind.to_owned());
    let expected = [
        t("Try", "Fresh", "Applied"),
        t("Try", "Fresh", "refused"),
        t("Try", "Tried", "refused"),
        t("Try", "Confirmed", "refused"),
        t("Try", "Cancelled", "refused"),
        t("Try", "Suspended", "refused"),
        t("Confirm", "Fresh", "refused"),
        t("Confirm", "Tried", "Applied"),
        t("Confirm", "Confirmed", "AlreadyDone"),
        t("Confirm", "Cancelled", "refused"),
        t("Confirm", "Suspended", "refused"),
        t("Cancel", "Fresh", "EmptyRollback"),
        t("Cancel", "Tried", "Applied"),
        t("Cancel", "Confirmed", "refused"),
        t("Cancel", "Cancelled", "AlreadyDone"),
        t("Cancel", "Suspended", "AlreadyDone"),
    ];
    for e in &expected {
        assert!(seen.contains(e), "never reached: {e:?}");
    }
}

#[test]
fn a_half_operation_handed_to_another_participant_is_refused_and_stays_paused() {
    // Under a two-step flaw the Try pauses between its halves; the hostile coordinator hands
    // the half to the inventory participant (refused, nothing changes), then to the wallet.
    let actions = [
        send(1, Participant::Wallet, Phase::Try),
        Action::Misroute,
        Action::Resume { newest: true },
        send(1, Participant::Wallet, Phase::Confirm),
        Action::Resume { newest: true },
    ];
    let seen = run_seen(flawed(FenceMode::CheckThenAct), &actions).unwrap();
    assert!(
        seen.contains(&(
            "misroute".to_owned(),
            "Wallet".to_owned(),
            "WrongParticipant".to_owned()
        )),
        "{seen:?}"
    );
}

#[test]
fn a_price_of_exactly_amount_max_is_taken_and_one_more_is_refused_unchanged() {
    // The coordinator refuses such prices first; a hostile one sends them straight to the
    // participants, which must hold the same bound on their own. (The activity's terms refuse
    // any other price first; with the price taken from the request, the documented flaw, the
    // rules' own bound is what stops it.)
    let mut store = MemoryStore::new();
    store.open_account(UserId(9), AMOUNT_MAX).unwrap();
    let registry =
        Registry::from_entries([(ActivityId(1), Terms::always_open(AMOUNT_MAX, 100))]).unwrap();
    let config = ParticipantConfig {
        flaws: Flaws {
            client_price: true,
            ..Flaws::NONE
        },
    };
    let correct = ParticipantConfig { flaws: Flaws::NONE };
    let send_wallet = |store: &mut MemoryStore,
                       config: &ParticipantConfig,
                       xid: u64,
                       price_minor: u64,
                       phase: Phase| {
        let draw = DrawArgs {
            xid: Xid(xid),
            user: UserId(9),
            activity: ActivityId(1),
            price_minor,
            won: false,
        };
        let msg = ParticipantMsg { phase, draw };
        match Participant::Wallet.handle(store, config, &registry, &msg) {
            Handled::Reply(reply) => reply.outcome,
            Handled::Resume(_) => panic!("the correct wallet answers in one step"),
        }
    };
    let before = store.snapshot().unwrap();
    assert_eq!(
        send_wallet(&mut store, &correct, 2, AMOUNT_MAX + 1, Phase::Try),
        Err(Refusal::WrongPrice {
            activity: ActivityId(1),
            price_minor: AMOUNT_MAX,
            offered_minor: AMOUNT_MAX + 1
        })
    );
    assert_eq!(
        send_wallet(&mut store, &config, 2, AMOUNT_MAX + 1, Phase::Try),
        Err(Refusal::AmountTooLarge {
            amount_minor: AMOUNT_MAX + 1
        })
    );
    assert_eq!(
        store.snapshot().unwrap(),
        before,
        "a refusal changes nothing"
    );
    assert_eq!(
        send_wallet(&mut store, &correct, 1, AMOUNT_MAX, Phase::Try),
        Ok(Effect::Applied)
    );
    assert_eq!(
        send_wallet(&mut store, &correct, 1, AMOUNT_MAX, Phase::Confirm),
        Ok(Effect::Applied)
    );
    let after = store.snapshot().unwrap();
    assert_eq!(after.collected_minor, AMOUNT_MAX);
    assert_eq!(after.accounts[&UserId(9)].balance_minor, 0);
}
