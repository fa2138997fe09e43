//! The checking harness every model shares: run a stateright [`ActorModel`] exhaustively (or to
//! a depth), and turn the checker's verdicts into a [`ModelReport`] with counterexamples rendered
//! as short message sequences (`alloc-1 -> store: Allocate#2{v=0, ids=2, ...}`).
//!
//! **The network.** Stateright's duplicating network keeps every message deliverable forever,
//! so every stale request can be re-executed against every later store state, each time with a
//! new answer: the state space of even two allocators and a store does not finish in minutes.
//! Models here therefore run on [`NetModel`]: stateright's unordered, *non*-duplicating network
//! (optionally lossy), plus a [`Step::Duplicate`] action that delivers a copy of any in-flight
//! message and leaves the original in flight, at most `duplicates_max` times per run. Messages
//! are still reordered arbitrarily, lost (when lossy) and duplicated — boundedly, which is what
//! makes the search exhaustive in seconds. (Delivering the copy in the same step loses nothing:
//! on an unordered network a copy made earlier and delivered now behaves exactly like a copy
//! made now, and the original, still in flight, can be delivered at any later point. It saves
//! the states in which two copies wait side by side.)
//! (For safety properties loss adds nothing: an undelivered message is never delivered in some
//! path anyway. It matters for `eventually` properties, where it lets the network drain.)
//!
//! Models with an `eventually` property need *every* fault bounded, or a path of endless faults
//! never settles. For them [`NetModel`] also offers budgeted drops ([`NetModel::with_drops`],
//! instead of stateright's unbounded lossy network) and budgeted **slow timeouts**
//! ([`NetModel::with_slow_timeouts`]): a timer may always fire when nothing it waits for is in
//! flight (the message was lost), but firing while an answer that would still count is in flight
//! (the network is slower than the timeout) is a fault and spends the budget. Once the budgets
//! are spent, every path ends (stateright's terminal states), and that is where `eventually`
//! properties are judged. Messages an actor sends to itself are local continuations (a resumed
//! two-step operation), never dropped or duplicated.
//!
//! Actor messages must be `Ord`, but `sut`'s wire types derive only `Eq + Hash`: [`total_cmp`]
//! gives a total order consistent with `Eq` (hash first, `Debug` text on a hash tie), so the
//! checker's action order — and so its replayable paths — is deterministic.

use std::cmp::Ordering;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

use stateright::actor::{
    Actor, ActorModel, ActorModelAction, ActorModelState, Envelope, Id, Network,
};
use stateright::{Checker, Expectation, Model, Property};

use crate::{ModelError, ModelOptions};

/// A total order on values that are only `Eq + Hash`, consistent with `Eq`: equal values compare
/// equal; unequal ones by a fixed-key hash, then (on a 64-bit hash tie) by their `Debug` text.
pub(crate) fn total_cmp<T: Hash + Eq + Debug>(a: &T, b: &T) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let hash = |v: &T| {
        let mut h = DefaultHasher::new();
        v.hash(&mut h);
        h.finish()
    };
    hash(a)
        .cmp(&hash(b))
        .then_with(|| format!("{a:?}").cmp(&format!("{b:?}")))
}

/// Implements `PartialOrd`/`Ord` for a message type via [`total_cmp`].
macro_rules! ord_by_total_cmp {
    ($ty:ty) => {
        impl PartialOrd for $ty {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }
        impl Ord for $ty {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                $crate::runner::total_cmp(self, other)
            }
        }
    };
}
pub(crate) use ord_by_total_cmp;

/// An [`ActorModel`] on a non-duplicating network with bounded duplication (see the module
/// docs): the model every check and the Explorer run.
pub struct NetModel<A, C = (), H = ()>
where
    A: Actor,
    A::Msg: Ord,
    A::Timer: Ord,
    H: Clone + Debug + Hash,
{
    /// The actor model (its network must be unordered non-duplicating).
    pub inner: ActorModel<A, C, H>,
    /// In-flight messages the network may copy, per run.
    pub duplicates_max: u8,
    /// In-flight messages the network may lose, per run (on top of the inner model's own
    /// `LossyNetwork`, which is unbounded; models using this leave that off).
    pub drops_max: u8,
    /// Which timers race an in-flight answer, and how many such slow timeouts a run may have.
    pub slow: Option<SlowTimeouts<A, H>>,
    /// `Some(actors)`: only these actors crash, and each crash is followed at once by the
    /// restart, in one step (see [`NetModel::with_atomic_restarts`]).
    pub atomic_restarts: Option<Vec<Id>>,
    /// The edge states (`sut::edge`) the search passed through, gathered from every checker
    /// thread after each step.
    pub edges: EdgeCounts,
}

/// Edge-state counts shared by a model's checker threads.
pub type EdgeCounts = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>;

/// Moves what the step on this thread observed ([`crate::edges::observe`]) into `into`.
fn gather_edges(into: &EdgeCounts) {
    let mut reached = crate::edges::take_step();
    if reached.is_empty() {
        return;
    }
    let mut into = into
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    reached.drain_into(&mut into);
}

/// Tells whether firing `timer` on actor `id` in this state races a message still in flight that
/// the timer's owner waits for (see the module docs).
pub type RacesFn<A, H> = fn(&ActorModelState<A, H>, Id, &<A as Actor>::Timer) -> bool;

/// The slow-timeout budget of a [`NetModel`].
pub struct SlowTimeouts<A: Actor, H> {
    /// Whether a timeout is slow (races an answer in flight).
    pub races: RacesFn<A, H>,
    /// Slow timeouts per run.
    pub max: u8,
}

impl<A: Actor, H> Debug for SlowTimeouts<A, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlowTimeouts")
            .field("max", &self.max)
            .finish()
    }
}

impl<A: Actor, H> Clone for SlowTimeouts<A, H> {
    fn clone(&self) -> Self {
        Self {
            races: self.races,
            max: self.max,
        }
    }
}

impl<A, C, H> NetModel<A, C, H>
where
    A: Actor,
    A::Msg: Ord,
    A::Timer: Ord,
    H: Clone + Debug + Hash,
{
    /// Wraps `inner`, switching its network to unordered non-duplicating.
    pub fn new(inner: ActorModel<A, C, H>, duplicates_max: u8) -> Self {
        Self {
            inner: inner.init_network(Network::new_unordered_nonduplicating([])),
            duplicates_max,
            drops_max: 0,
            slow: None,
            atomic_restarts: None,
            edges: EdgeCounts::default(),
        }
    }

    /// Only `actors` crash, and a crash is followed by the restart in the same step.
    ///
    /// A reduction that loses no behaviour: while an actor is down nothing is delivered to it
    /// and its timers are gone, and every other actor's step in that interval commutes with
    /// the crash (it could as well have happened before it). What it saves are the states in
    /// which the actor is down: stateright keeps a crashed actor's last state until the
    /// restart, so each crash point made its own family of "down" states, and every other
    /// actor's steps interleaved with the downtime. The restart count must be bounded by the
    /// model's boundary (e.g. a counter on the actor's disk).
    #[must_use]
    pub fn with_atomic_restarts(mut self, actors: &[usize]) -> Self {
        self.atomic_restarts = Some(actors.iter().copied().map(Id::from).collect());
        self
    }

    /// Lets the network lose up to `drops_max` in-flight messages per run.
    #[must_use]
    pub const fn with_drops(mut self, drops_max: u8) -> Self {
        self.drops_max = drops_max;
        self
    }

    /// Lets up to `max` timeouts per run fire while an answer they wait for is in flight
    /// (`races` tells which); other racing timeouts wait for the delivery.
    #[must_use]
    pub fn with_slow_timeouts(mut self, races: RacesFn<A, H>, max: u8) -> Self {
        self.slow = Some(SlowTimeouts { races, max });
        self
    }

    /// One step of the search (what `next_state` does before gathering edge states).
    fn step(&self, last_state: &NetState<A, H>, action: StepOf<A>) -> Option<NetState<A, H>> {
        match action {
            Step::Actor(ActorModelAction::Crash(id)) if self.atomic_restarts.is_some() => {
                let down = self
                    .inner
                    .next_state(&last_state.sys, ActorModelAction::Crash(id))?;
                Some(NetState {
                    sys: self
                        .inner
                        .next_state(&down, ActorModelAction::Recover(id))?,
                    duplicates: last_state.duplicates,
                    drops: last_state.drops,
                    slow: last_state.slow,
                })
            }
            Step::Actor(action) => {
                let slow = u8::from(self.is_slow(&last_state.sys, &action));
                Some(NetState {
                    sys: self.inner.next_state(&last_state.sys, action)?,
                    duplicates: last_state.duplicates,
                    drops: last_state.drops,
                    slow: last_state.slow + slow,
                })
            }
            Step::Drop(env) => Some(NetState {
                sys: self
                    .inner
                    .next_state(&last_state.sys, ActorModelAction::Drop(env))?,
                duplicates: last_state.duplicates,
                drops: last_state.drops + 1,
                slow: last_state.slow,
            }),
            Step::Duplicate(env) => {
                // Deliver a copy; the original stays in flight.
                let deliver = ActorModelAction::Deliver {
                    src: env.src,
                    dst: env.dst,
                    msg: env.msg.clone(),
                };
                let mut sys = self.inner.next_state(&last_state.sys, deliver)?;
                let Network::UnorderedNonDuplicating(in_flight) = &mut sys.network else {
                    unreachable!("NetModel::new sets an unordered non-duplicating network")
                };
                *in_flight.entry(env).or_insert(0) += 1;
                Some(NetState {
                    sys,
                    duplicates: last_state.duplicates + 1,
                    drops: last_state.drops,
                    slow: last_state.slow,
                })
            }
        }
    }

    /// Whether `state` is where a path ends: no step leads to a state inside the boundary
    /// (exactly stateright's notion of a terminal state in its breadth-first search).
    pub fn is_terminal(&self, state: &NetState<A, H>) -> bool {
        let mut actions = Vec::new();
        Model::actions(self, state, &mut actions);
        !actions.into_iter().any(|action| {
            Model::next_state(self, state, action).is_some_and(|next| self.within_boundary(&next))
        })
    }

    /// Whether the timeout step `action` is slow (spends the slow-timeout budget).
    fn is_slow(
        &self,
        sys: &ActorModelState<A, H>,
        action: &ActorModelAction<A::Msg, A::Timer, A::Random>,
    ) -> bool {
        match (action, &self.slow) {
            (ActorModelAction::Timeout(id, timer), Some(slow)) => (slow.races)(sys, *id, timer),
            _ => false,
        }
    }
}

impl<A, C, H> Debug for NetModel<A, C, H>
where
    A: Actor,
    A::Msg: Ord,
    A::Timer: Ord,
    H: Clone + Debug + Hash,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetModel")
            .field("actors", &self.inner.actors.len())
            .field("properties", &self.inner.properties.len())
            .field("duplicates_max", &self.duplicates_max)
            .field("drops_max", &self.drops_max)
            .field("slow_timeouts_max", &self.slow.as_ref().map(|s| s.max))
            .finish()
    }
}

/// A state of a [`NetModel`]: the actor system and the duplications used so far.
pub struct NetState<A: Actor, H> {
    /// The actor system.
    pub sys: ActorModelState<A, H>,
    /// Messages duplicated so far.
    pub duplicates: u8,
    /// Messages dropped so far (by [`Step::Drop`]).
    pub drops: u8,
    /// Slow timeouts so far.
    pub slow: u8,
}

impl<A: Actor, H: Clone> Clone for NetState<A, H> {
    fn clone(&self) -> Self {
        Self {
            sys: self.sys.clone(),
            duplicates: self.duplicates,
            drops: self.drops,
            slow: self.slow,
        }
    }
}

impl<A: Actor, H: Debug> Debug for NetState<A, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetState")
            .field("sys", &self.sys)
            .field("duplicates", &self.duplicates)
            .field("drops", &self.drops)
            .field("slow", &self.slow)
            .finish()
    }
}

impl<A: Actor, H: Hash> Hash for NetState<A, H> {
    fn hash<S: Hasher>(&self, state: &mut S) {
        self.sys.hash(state);
        self.duplicates.hash(state);
        self.drops.hash(state);
        self.slow.hash(state);
    }
}

impl<A: Actor, H: PartialEq> PartialEq for NetState<A, H> {
    fn eq(&self, other: &Self) -> bool {
        self.duplicates == other.duplicates
            && self.drops == other.drops
            && self.slow == other.slow
            && self.sys == other.sys
    }
}

/// A step of a [`NetModel`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step<Msg, Timer, Random> {
    /// A stateright actor-model step (deliver, drop, timeout, crash, restart).
    Actor(ActorModelAction<Msg, Timer, Random>),
    /// The network delivers a copy of an in-flight message; the original stays in flight.
    Duplicate(Envelope<Msg>),
    /// The network loses an in-flight message (budgeted; see [`NetModel::with_drops`]).
    Drop(Envelope<Msg>),
}

type StepOf<A> = Step<<A as Actor>::Msg, <A as Actor>::Timer, <A as Actor>::Random>;

/// Evaluates the inner model's property number `I` (a plain `fn` is what stateright stores).
fn inner_property<const I: usize, A, C, H>(
    model: &NetModel<A, C, H>,
    state: &NetState<A, H>,
) -> bool
where
    A: Actor,
    A::Msg: Ord,
    A::Timer: Ord,
    H: Clone + Debug + Hash,
{
    (model.inner.properties[I].condition)(&model.inner, &state.sys)
}

/// Evaluates the inner model's `eventually` property number `I` **only where a path ends**: in a
/// state with no successor inside the boundary (stateright's terminal state); elsewhere it is
/// false. stateright clears a path's eventually-bit at the first state where the condition holds
/// and reports the path if the bit is still set at its terminal state; it also does not carry
/// the bit into the fingerprint, so at a join of two paths only the first path's bit survives.
/// With the condition false everywhere but at terminal states, no bit is ever cleared before a
/// path ends: every terminal state is judged exactly once, on its own, and the property reads
/// "every path end satisfies the condition" with no join-order false negative (for an acyclic
/// state graph; a path that loops forever has no end and is not judged).
fn inner_eventually_at_end<const I: usize, A, C, H>(
    model: &NetModel<A, C, H>,
    state: &NetState<A, H>,
) -> bool
where
    A: Actor,
    A::Msg: Ord,
    A::Timer: Ord,
    H: Clone + Debug + Hash,
{
    (model.inner.properties[I].condition)(&model.inner, &state.sys) && model.is_terminal(state)
}

/// Most properties one model may declare.
const PROPERTIES_MAX: usize = 12;

impl<A, C, H> Model for NetModel<A, C, H>
where
    A: Actor,
    A::Msg: Ord,
    A::Timer: Ord,
    H: Clone + Debug + Hash,
{
    type State = NetState<A, H>;
    type Action = StepOf<A>;

    fn init_states(&self) -> Vec<Self::State> {
        let _ = crate::edges::take_step();
        let states = self.inner.init_states();
        gather_edges(&self.edges);
        states
            .into_iter()
            .map(|sys| NetState {
                sys,
                duplicates: 0,
                drops: 0,
                slow: 0,
            })
            .collect()
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        let mut inner = Vec::new();
        self.inner.actions(&state.sys, &mut inner);
        let slow_left = self.slow.as_ref().is_some_and(|s| state.slow < s.max);
        actions.extend(
            inner
                .into_iter()
                .filter(|a| match (a, &self.atomic_restarts) {
                    (ActorModelAction::Crash(id), Some(crashable)) => crashable.contains(id),
                    _ => true,
                })
                .filter(|a| slow_left || !self.is_slow(&state.sys, a))
                .map(Step::Actor),
        );
        let duplicate = state.duplicates < self.duplicates_max;
        let drop = state.drops < self.drops_max;
        if duplicate || drop {
            // Messages to oneself are local continuations: the network never touches them.
            let mut in_flight: Vec<_> = state
                .sys
                .network
                .iter_deliverable()
                .filter(|env| env.src != env.dst)
                .map(|env| env.to_cloned_msg())
                .collect();
            in_flight.sort_unstable_by(|a, b| {
                (a.src, a.dst)
                    .cmp(&(b.src, b.dst))
                    .then_with(|| a.msg.cmp(&b.msg))
            });
            if drop {
                actions.extend(in_flight.iter().cloned().map(Step::Drop));
            }
            if duplicate {
                actions.extend(in_flight.into_iter().map(Step::Duplicate));
            }
        }
    }

    fn next_state(&self, last_state: &Self::State, action: Self::Action) -> Option<Self::State> {
        let next = self.step(last_state, action);
        gather_edges(&self.edges);
        next
    }

    fn format_action(&self, action: &Self::Action) -> String
    where
        Self::Action: Debug,
    {
        match action {
            Step::Actor(action) => self.inner.format_action(action),
            Step::Duplicate(env) => format!("DUPLICATE+DELIVER {env:?}"),
            Step::Drop(env) => format!("DROP {env:?}"),
        }
    }

    fn format_step(&self, last_state: &Self::State, action: Self::Action) -> Option<String>
    where
        Self::State: Debug,
    {
        match action {
            Step::Actor(action) => self.inner.format_step(&last_state.sys, action),
            Step::Duplicate(env) => Some(format!("DUPLICATE+DELIVER {env:?}")),
            Step::Drop(env) => Some(format!("DROP {env:?}")),
        }
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let at_end: [fn(&Self, &Self::State) -> bool; PROPERTIES_MAX] = [
            inner_eventually_at_end::<0, A, C, H>,
            inner_eventually_at_end::<1, A, C, H>,
            inner_eventually_at_end::<2, A, C, H>,
            inner_eventually_at_end::<3, A, C, H>,
            inner_eventually_at_end::<4, A, C, H>,
            inner_eventually_at_end::<5, A, C, H>,
            inner_eventually_at_end::<6, A, C, H>,
            inner_eventually_at_end::<7, A, C, H>,
            inner_eventually_at_end::<8, A, C, H>,
            inner_eventually_at_end::<9, A, C, H>,
            inner_eventually_at_end::<10, A, C, H>,
            inner_eventually_at_end::<11, A, C, H>,
        ];
        let conditions: [fn(&Self, &Self::State) -> bool; PROPERTIES_MAX] = [
            inner_property::<0, A, C, H>,
            inner_property::<1, A, C, H>,
            inner_property::<2, A, C, H>,
            inner_property::<3, A, C, H>,
            inner_property::<4, A, C, H>,
            inner_property::<5, A, C, H>,
            inner_property::<6, A, C, H>,
            inner_property::<7, A, C, H>,
            inner_property::<8, A, C, H>,
            inner_property::<9, A, C, H>,
            inner_property::<10, A, C, H>,
            inner_property::<11, A, C, H>,
        ];
        assert!(
            self.inner.properties.len() <= PROPERTIES_MAX,
            "a model declares at most {PROPERTIES_MAX} properties"
        );
        self.inner
            .properties
            .iter()
            .zip(conditions.into_iter().zip(at_end))
            .map(|(p, (condition, at_end))| Property {
                expectation: p.expectation.clone(),
                name: p.name,
                condition: if p.expectation == Expectation::Eventually {
                    at_end
                } else {
                    condition
                },
            })
            .collect()
    }

    fn within_boundary(&self, state: &Self::State) -> bool {
        Model::within_boundary(&self.inner, &state.sys)
    }
}

/// A message that renders itself in one short line for counterexamples.
pub trait Brief {
    /// E.g. `Allocate{v=0, ids=2}`.
    fn brief(&self) -> String;
}

/// A model configuration that names its actors (`store`, `alloc-1`, …).
pub trait Cast {
    /// The actor's name in counterexamples.
    fn actor_name(&self, id: Id) -> String;
}

// The property kind and verdict are the result model's (`reports::model`): one definition for
// the checker, the terminal, the HTML report and the gate.
pub use reports::model::{ModelReport, PropertyKind, PropertyReport, PropertyVerdict};

/// Renders one checker action as a line of a counterexample.
pub(crate) fn render_action<A, C>(cfg: &C, step: &StepOf<A>, atomic_restarts: bool) -> String
where
    A: Actor,
    A::Msg: Brief,
    C: Cast,
{
    let name = |id: &Id| cfg.actor_name(*id);
    let action = match step {
        Step::Actor(action) => action,
        Step::Duplicate(env) => {
            return format!(
                "{} -> {} (a network duplicate; the original stays in flight): {}",
                name(&env.src),
                name(&env.dst),
                env.msg.brief()
            );
        }
        Step::Drop(env) => {
            return format!(
                "network drops {} -> {}: {}",
                name(&env.src),
                name(&env.dst),
                env.msg.brief()
            );
        }
    };
    match action {
        ActorModelAction::Deliver { src, dst, msg } => {
            format!("{} -> {}: {}", name(src), name(dst), msg.brief())
        }
        ActorModelAction::Drop(env) => format!(
            "network drops {} -> {}: {}",
            name(&env.src),
            name(&env.dst),
            env.msg.brief()
        ),
        ActorModelAction::Timeout(id, timer) => format!("{}: timer {timer:?}", name(id)),
        ActorModelAction::Crash(id) if atomic_restarts => {
            format!("{}: crash and restart", name(id))
        }
        ActorModelAction::Crash(id) => format!("{}: crash", name(id)),
        ActorModelAction::Recover(id) => format!("{}: restart", name(id)),
        ActorModelAction::SelectRandom { actor, random, .. } => {
            format!("{}: choose {random:?}", name(actor))
        }
    }
}

/// Refuses options the checker cannot run with.
fn check_options(opts: &ModelOptions) -> Result<(), ModelError> {
    if opts.threads == 0 {
        return Err(ModelError::InvalidOptions(
            "threads must be at least 1".into(),
        ));
    }
    if opts.depth == Some(0) {
        return Err(ModelError::InvalidOptions(
            "depth must be at least 1".into(),
        ));
    }
    Ok(())
}

/// A property's verdict from the path the checker found for it, if any.
fn property_report<M: Model>(p: &Property<M>, found: Option<Vec<String>>) -> PropertyReport {
    let (kind, verdict, counterexample, example) = match p.expectation {
        Expectation::Always | Expectation::Eventually => {
            let kind = if p.expectation == Expectation::Always {
                PropertyKind::Always
            } else {
                PropertyKind::Eventually
            };
            match found {
                Some(path) => (kind, PropertyVerdict::Violated, Some(path), None),
                None => (kind, PropertyVerdict::Holds, None, None),
            }
        }
        Expectation::Sometimes => match found {
            Some(path) => (
                PropertyKind::Sometimes,
                PropertyVerdict::Found,
                None,
                Some(path),
            ),
            None => (
                PropertyKind::Sometimes,
                PropertyVerdict::NotFound,
                None,
                None,
            ),
        },
    };
    PropertyReport {
        name: p.name.to_owned(),
        kind,
        verdict,
        counterexample,
        example,
    }
}

/// After a check that stopped at its first violation: a property with no discovery was not
/// decided (an `always` not violated *yet*, a `sometimes` not found *yet*).
fn mark_undecided(properties: &mut [PropertyReport]) {
    for p in properties {
        if matches!(
            p.verdict,
            PropertyVerdict::Holds | PropertyVerdict::NotFound
        ) {
            p.verdict = PropertyVerdict::NotChecked;
        }
    }
}

/// The check's progress on stderr, rewritten in place once a second.
struct ProgressLine<'a> {
    name: &'a str,
}

impl<M: Model> stateright::report::Reporter<M> for ProgressLine<'_> {
    fn report_checking(&mut self, data: stateright::report::ReportData) {
        eprint!(
            "\r{}: {} states ({} unique), depth {}, {} s{}",
            self.name,
            data.total_states,
            data.unique_states,
            data.max_depth,
            data.duration.as_secs(),
            if data.done { ", done\n" } else { "   " }
        );
    }

    fn report_discoveries(
        &mut self,
        _model: &M,
        _discoveries: std::collections::BTreeMap<
            &'static str,
            stateright::report::ReportDiscovery<M>,
        >,
    ) where
        M::Action: Debug + PartialEq,
        M::State: Debug + Hash + PartialEq,
    {
        // The report that follows the check lists every property with its path.
    }
}

/// Runs `model` with the options and reports.
pub(crate) fn run<A, C, H>(
    model: NetModel<A, C, H>,
    name: &str,
    opts: &ModelOptions,
) -> Result<ModelReport, ModelError>
where
    A: Actor + Send + Sync + 'static,
    A::Msg: Ord + Brief + Send + Sync + 'static,
    A::Timer: Ord + Send + Sync + 'static,
    A::State: Send + Sync + 'static,
    A::Storage: Send + Sync + 'static,
    A::Random: Send + Sync + 'static,
    C: Cast + Send + Sync + 'static,
    H: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
{
    check_options(opts)?;
    let started = Instant::now();
    let mut builder = model.checker().threads(opts.threads);
    // stateright's breadth-first search records a property's discovery again at every state
    // where it holds, so after a full run a violation's path is the last one found, not the
    // shortest. A flawed run is about its counterexample: stop at the first violation, which
    // the breadth-first order makes (close to) the shortest.
    let stop_at_first_failure = opts.flaw.is_some();
    if stop_at_first_failure {
        builder = builder.finish_when(stateright::HasDiscoveries::AnyFailures);
    }
    if let Some(depth) = opts.depth {
        builder = builder.target_max_depth(depth);
    }
    let checker = if opts.progress {
        builder
            .spawn_bfs()
            .join_and_report(&mut ProgressLine { name })
    } else {
        builder.spawn_bfs().join()
    };
    let wall_seconds = started.elapsed().as_secs_f64();
    let states = checker.state_count();
    let max_depth = checker.max_depth();
    let model = checker.model();
    let mut discoveries = checker.discoveries();
    let render = |path: stateright::Path<_, _>| -> Vec<String> {
        path.into_actions()
            .iter()
            .map(|a| render_action::<A, C>(&model.inner.cfg, a, model.atomic_restarts.is_some()))
            .collect()
    };
    let mut properties: Vec<PropertyReport> = model
        .properties()
        .iter()
        .map(|p| property_report(p, discoveries.remove(p.name).map(&render)))
        .collect();
    let stopped_early = stop_at_first_failure
        && properties
            .iter()
            .any(|p| p.verdict == PropertyVerdict::Violated);
    if stopped_early {
        mark_undecided(&mut properties);
    }
    Ok(ModelReport {
        model: name.to_owned(),
        flaw: opts.flaw.clone(),
        threads: opts.threads,
        depth_limit: opts.depth,
        exhaustive: opts.depth.is_none_or(|d| max_depth < d) && !stopped_early,
        states: states as u64,
        unique_states: checker.unique_state_count() as u64,
        max_depth: max_depth as u64,
        wall_seconds,
        states_per_second: if wall_seconds > 0.0 {
            states as f64 / wall_seconds
        } else {
            0.0
        },
        properties,
        edges: model
            .edges
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone(),
    })
}

/// Adds each owned edge state as a `sometimes` property `edge: NAME`: found when the search
/// passed through it; not checked when the search stopped at the first violation.
pub(crate) fn add_edge_properties(report: &mut ModelReport, owned: &[&str]) {
    let stopped_early =
        report.flaw.is_some() && !report.failures().is_empty() && !report.exhaustive;
    for name in owned {
        assert!(
            sut::edge_registry::find(name).is_some(),
            "model {} owns `{name}`, which is not a declared edge state",
            report.model
        );
        let reached = report.edges.get(*name).copied().unwrap_or(0) > 0;
        report.properties.push(PropertyReport {
            name: format!("edge: {name}"),
            kind: PropertyKind::Sometimes,
            verdict: match (reached, stopped_early) {
                (true, _) => PropertyVerdict::Found,
                (false, true) => PropertyVerdict::NotChecked,
                (false, false) => PropertyVerdict::NotFound,
            },
            counterexample: None,
            example: None,
        });
    }
}

/// Serves the Explorer web UI for `model` on `addr`; blocks.
pub(crate) fn serve<A, C, H>(model: NetModel<A, C, H>, addr: &str) -> Result<(), ModelError>
where
    A: Actor + Send + Sync + 'static,
    A::Msg: Ord + Send + Sync + 'static,
    A::Timer: Ord + Send + Sync + 'static,
    A::State: Send + Sync + 'static,
    A::Storage: Send + Sync + 'static,
    A::Random: Send + Sync + 'static,
    C: Send + Sync + 'static,
    H: Clone + Debug + Hash + PartialEq + Send + Sync + 'static,
{
    // stateright's server panics when it cannot bind: bind once first to report a clean error.
    drop(
        std::net::TcpListener::bind(addr).map_err(|err| ModelError::Serve {
            addr: addr.to_owned(),
            reason: err.to_string(),
        })?,
    );
    eprintln!("stateright Explorer: open http://{addr}/ in a browser (Ctrl-C stops it)");
    let _checker = model.checker().serve(addr);
    Ok(())
}
