//! One-time submit tokens (ID, token and lottery design §3.3, docs/sources.md): one token store
//! and concurrent consumers of the same token, over an unordered, lossy network with bounded
//! duplication (see [`crate::runner`]).
//!
//! - `store` (actor 0) wraps a [`MemoryTokenStore`] holding one issued token; each delivered
//!   [`OnceOp`] is performed by [`apply_once_op`] and answered.
//! - `consumer-N` (actors 1..) each run one [`OnceConsume`] step machine for the token's owner:
//!   on start it sends `poll_op()`; each answer goes to `handle_op_result`, then the next
//!   `poll_op()` (the flawed path has two operations) is sent.
//!
//! Ghost state: none needed: each consumer's `outcome()` is what its client saw. The property
//! `tokens.single_use` builds a [`TokenEvent`] history from the outcomes and runs `sut`'s own
//! checker ([`check_single_use`]) on it.
//!
//! With [`TokenFlaws::once_check_then_delete`] (`--flaw once_check_then_delete`) the checker
//! finds the double accept: both consumers pass the check before either marks the token.

use std::borrow::Cow;

use stateright::Expectation;
use stateright::actor::{Actor, ActorModel, Id, LossyNetwork, Out};
use sut::clock::Now;
use sut::flaw::Flaw;
use sut::token::once::apply_once_op;
use sut::token::{
    ActivityKey, MemoryTokenStore, OnceConfig, OnceConsume, OnceOp, OnceOpResult, OnceRejection,
    OnceToken, TokenEvent, TokenFlaws, TokenStoreLimits, UserId, check_single_use,
};

use crate::ModelError;
use crate::edges::observe;
use crate::hashed::HashedActor;
use crate::runner::{Brief, Cast, NetModel, ord_by_total_cmp};

/// Catalog name.
pub const NAME: &str = "tokens";
/// Catalog description.
pub const DESCRIPTION: &str = "1 token store + concurrent consumers of one one-time token over a \
     reordering, duplicating network: tokens.single_use";
/// The edge states this model owns (reported as `sometimes` properties).
pub const EDGES: &[&str] = &["token.once_consume_race"];

/// Flaws this model can switch on.
pub const FLAWS: &[Flaw] = &[Flaw::OnceCheckThenDelete];

const USER: UserId = UserId(7);
const TOKEN: OnceToken = OnceToken(0xfeed);
const NOW: Now = Now::both(1_000);

/// The model's bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenSetup {
    /// Consumers of the same token (2–3).
    pub consumers: usize,
    /// Flaws switched on.
    pub flaws: TokenFlaws,
    /// In-flight messages the network duplicates, per run.
    pub duplicates_max: u8,
    /// Whether the network loses messages.
    pub lossy: bool,
}

impl Default for TokenSetup {
    fn default() -> Self {
        Self {
            consumers: 3,
            flaws: TokenFlaws::default(),
            duplicates_max: 2,
            lossy: true,
        }
    }
}

impl TokenSetup {
    /// The default setup with the named flaw (one of [`FLAWS`]) switched on.
    #[must_use]
    pub fn with_flaw(flaw: Option<Flaw>) -> Self {
        Self {
            flaws: sut::flaw::token_flaws(flaw),
            ..Self::default()
        }
    }
}

impl Cast for TokenSetup {
    fn actor_name(&self, id: Id) -> String {
        match usize::from(id) {
            0 => "store".to_owned(),
            n => format!("consumer-{n}"),
        }
    }
}

/// Messages.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TokenMsg {
    /// Consumer → store.
    Op(OnceOp),
    /// Store → consumer.
    Answer(OnceOpResult),
}
ord_by_total_cmp!(TokenMsg);

impl Brief for TokenMsg {
    fn brief(&self) -> String {
        match self {
            Self::Op(OnceOp::Consume { .. }) => "Consume".to_owned(),
            Self::Op(OnceOp::Check { .. }) => "Check".to_owned(),
            Self::Op(OnceOp::Mark { .. }) => "Mark".to_owned(),
            Self::Answer(OnceOpResult::Consumed(r)) => format!("Consumed({})", verdict(r)),
            Self::Answer(OnceOpResult::Checked(r)) => format!("Checked({})", verdict(r)),
            Self::Answer(OnceOpResult::Marked(existed)) => format!("Marked(existed={existed})"),
        }
    }
}

fn verdict<T>(r: &Result<T, OnceRejection>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(rejection) => format!("{rejection:?}"),
    }
}

/// Actors.
#[derive(Clone, Debug)]
pub enum TokenActor {
    /// The token store, as it starts: the token issued (built by [`model`]).
    Store {
        /// The store holding the issued token.
        initial: Box<MemoryTokenStore>,
    },
    /// A consumer of the token.
    Consumer {
        /// Flaws switched on.
        flaws: TokenFlaws,
    },
}

/// Actor states.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TokenState {
    /// The store.
    Store(MemoryTokenStore),
    /// A consume in progress or done.
    Consumer(OnceConsume),
}

fn send_next(consume: &mut OnceConsume, o: &mut Out<TokenActor>) {
    if let Some(op) = consume.poll_op() {
        o.send(Id::from(0), TokenMsg::Op(op));
    }
}

impl Actor for TokenActor {
    type Msg = TokenMsg;
    type Timer = ();
    type State = TokenState;
    type Storage = ();
    type Random = ();

    fn on_start(&self, _id: Id, _storage: &Option<()>, o: &mut Out<Self>) -> TokenState {
        match self {
            Self::Store { initial } => TokenState::Store((**initial).clone()),
            Self::Consumer { flaws } => {
                let mut consume = OnceConsume::new(TOKEN, USER, NOW, *flaws);
                send_next(&mut consume, o);
                TokenState::Consumer(consume)
            }
        }
    }

    fn on_msg(
        &self,
        _id: Id,
        state: &mut Cow<'_, TokenState>,
        src: Id,
        msg: TokenMsg,
        o: &mut Out<Self>,
    ) {
        match (&**state, msg) {
            (TokenState::Store(store), TokenMsg::Op(op)) => {
                let mut next = store.clone();
                // The memory store has no backend to fail; an error would be a lost answer.
                if let Ok(answer) = apply_once_op(&mut next, op) {
                    o.send(src, TokenMsg::Answer(answer));
                }
                observe(&mut next);
                if &next != store {
                    *state = Cow::Owned(TokenState::Store(next));
                }
            }
            (TokenState::Consumer(consume), TokenMsg::Answer(answer)) => {
                let mut next = consume.clone();
                if next.handle_op_result(answer).is_err() {
                    return; // a duplicate or stale answer: the consume ignores it
                }
                send_next(&mut next, o);
                *state = Cow::Owned(TokenState::Consumer(next));
            }
            _ => {}
        }
    }
}

/// The history the consumers' clients observed, for `sut`'s checkers.
#[must_use]
pub fn history(states: &[&TokenState]) -> Vec<TokenEvent> {
    states
        .iter()
        .filter_map(|s| match s {
            TokenState::Consumer(c) => c.outcome(),
            TokenState::Store(_) => None,
        })
        .map(|outcome| match outcome {
            Ok(_) => TokenEvent::OnceConsumeOk {
                token: TOKEN,
                at: 0,
            },
            Err(_) => TokenEvent::OnceConsumeRejected {
                token: TOKEN,
                at: 0,
            },
        })
        .collect()
}

fn states(sys: &stateright::actor::ActorModelState<HashedActor<TokenActor>>) -> Vec<&TokenState> {
    sys.actor_states.iter().map(|s| &***s).collect()
}

/// The store as the model starts it: the one token issued.
fn initial_store() -> Result<MemoryTokenStore, ModelError> {
    let setup_error = |what: String| ModelError::InvalidOptions(format!("tokens model: {what}"));
    let mut store = MemoryTokenStore::new(TokenStoreLimits::default());
    let activity = ActivityKey::new("A2024")
        .ok_or_else(|| setup_error("`A2024` is not a valid activity id".to_owned()))?;
    let issued = sut::token::once::issue_once(
        &mut store,
        &OnceConfig::default(),
        USER,
        activity,
        TOKEN.0,
        NOW,
    )
    .map_err(|e| setup_error(format!("issuing the token: {e}")))?;
    if issued.token != TOKEN {
        return Err(setup_error(format!(
            "issued {:?}, not {TOKEN:?}",
            issued.token
        )));
    }
    Ok(store)
}

/// The model, or why its setup cannot be modelled.
pub fn model(
    setup: &TokenSetup,
) -> Result<NetModel<HashedActor<TokenActor>, TokenSetup>, ModelError> {
    if !(2..=3).contains(&setup.consumers) {
        return Err(ModelError::InvalidOptions(format!(
            "tokens model: {} consumers (2 or 3 keep the model small)",
            setup.consumers
        )));
    }
    let initial = Box::new(initial_store()?);
    let actors = ActorModel::new(setup.clone(), ())
        .actor(HashedActor(TokenActor::Store { initial }))
        .actors(
            (0..setup.consumers).map(|_| HashedActor(TokenActor::Consumer { flaws: setup.flaws })),
        )
        .lossy_network(if setup.lossy {
            LossyNetwork::Yes
        } else {
            LossyNetwork::No
        })
        .property(Expectation::Always, "tokens.single_use", |_, sys| {
            check_single_use(&history(&states(sys))).is_ok()
        })
        .property(Expectation::Always, "store.invariants", |_, sys| {
            states(sys).iter().all(|s| match s {
                TokenState::Store(store) => store.check_invariants().is_ok(),
                TokenState::Consumer(_) => true,
            })
        })
        .property(Expectation::Sometimes, "a consume accepted", |_, sys| {
            history(&states(sys))
                .iter()
                .any(|e| matches!(e, TokenEvent::OnceConsumeOk { .. }))
        })
        .property(Expectation::Sometimes, "a consume rejected", |_, sys| {
            history(&states(sys))
                .iter()
                .any(|e| matches!(e, TokenEvent::OnceConsumeRejected { .. }))
        });
    Ok(NetModel::new(actors, setup.duplicates_max))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ModelOptions, PropertyVerdict, runner};

    fn run(flaw: Option<Flaw>) -> crate::ModelReport {
        let opts = ModelOptions {
            threads: 1,
            depth: None,
            flaw: flaw.map(|f| f.name().to_owned()),
            progress: false,
        };
        runner::run(model(&TokenSetup::with_flaw(flaw)).unwrap(), NAME, &opts).unwrap()
    }

    #[test]
    fn atomic_consume_accepts_at_most_once() {
        let report = run(None);
        assert!(report.exhaustive);
        assert!(report.failures().is_empty(), "{:#?}", report.failures());
        assert_eq!(
            report.property("a consume accepted").unwrap().verdict,
            PropertyVerdict::Found
        );
        assert_eq!(
            report.property("a consume rejected").unwrap().verdict,
            PropertyVerdict::Found
        );
        assert_eq!(report.unique_states, PINNED_UNIQUE, "regression guard");
    }

    #[test]
    fn check_then_delete_is_caught_with_a_double_accept() {
        let report = run(Some(Flaw::OnceCheckThenDelete));
        let single_use = report.property("tokens.single_use").unwrap();
        assert_eq!(single_use.verdict, PropertyVerdict::Violated);
        let steps = single_use.counterexample.as_ref().unwrap();
        let marks = steps
            .iter()
            .filter(|s| s.ends_with("Marked(existed=true)"))
            .count();
        assert_eq!(marks, 2, "two marks accepted: {steps:#?}");
    }

    #[test]
    fn the_history_checker_sees_a_double_accept() {
        let mut a = OnceConsume::new(TOKEN, USER, NOW, TokenFlaws::default());
        let _ = a.poll_op();
        a.handle_op_result(OnceOpResult::Consumed(Ok(sut::token::OnceKey {
            user: USER,
            activity: ActivityKey::new("A2024").unwrap(),
            window_start_ms: 0,
        })))
        .unwrap();
        let accepted = TokenState::Consumer(a);
        assert!(check_single_use(&history(&[&accepted])).is_ok());
        assert!(check_single_use(&history(&[&accepted, &accepted])).is_err());
    }

    const PINNED_UNIQUE: u64 = 3_077;
}
