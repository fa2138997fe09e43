//! Crash points, enumerated: a crash of a node right before and right after each of its steps
//! that matter, rather than where chance puts a kill.
//!
//! Random kills land at random instants; the windows where a crash-recovery bug shows are often
//! a few simulated microseconds wide (between a message sent and the durable write that should
//! have preceded it, between an fsync and the answers it releases) and a random kill never lands
//! in them. CrashTuner (SOSP '19) crashes a node right before it reads and right after it writes
//! the state it must recover, and ALICE (OSDI '14) enumerates the crash states of an update
//! protocol; this module does the same for a seed of a simulated scenario:
//!
//! 1. **Find.** The seed runs once with a probe ([`Probe::record`]): every server node's arrival
//!    at a [`Site`] in the safety phase is counted, by node, site and [`Label`] (the protocol
//!    step: which message, which log record). A message taken from the inbox
//!    ([`Site::Recv`], "right before it is read"), a message leaving in a send round
//!    ([`Site::Send`], "right after the write to the network"), a log's fsync about to begin or
//!    just done ([`Site::BeforeSync`], [`Site::AfterSync`]). The first arrival of each
//!    [`PointKey`] (node role, site, label) is a [`Found`] point: points are deduplicated by the
//!    code location and protocol state that reach them, so a seed yields tens of points, not the
//!    tens of thousands of arrivals.
//! 2. **Try.** For each point within the budget, the seed runs again with a [`CrashPlan`]: the
//!    run is the same run up to the planned arrival (the probe draws nothing and wakes nothing),
//!    and there the node is killed (its pending writes lost, its queued messages gone), restarted
//!    after [`CrashPlan::down_ms`], and the workload goes on for [`TAIL_MS`] more before the
//!    liveness phase and every invariant. A crash planned after a send waits for the send round
//!    to leave and holds the node's next fsync until then: the crash falls between the send and
//!    the node's next durable step.
//! 3. **Replay.** A failing point replays alone as `--crash-at NODE:SITE:LABEL#N` on its seed.

use std::fmt;

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

use crate::msg::Msg;

/// How long the workload goes on after a planned crash's node is back, before the liveness
/// phase: long enough for the node's next operations to be judged against what it promised
/// before the crash (a lease renewed, a reservation used, a draw's next phase), short enough
/// that a crash point costs a fraction of a seed.
pub const TAIL_MS: u64 = 500;

/// Where on a node's path a crash can strike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Site {
    /// A message taken from the node's inbox, before the node reads it.
    Recv,
    /// A message that left the node in a send round, before the node's next durable step.
    Send,
    /// Records appended to the node's log, its fsync not yet begun: they are lost.
    BeforeSync,
    /// The fsync done, the answers and messages it releases not yet sent.
    AfterSync,
}

impl Site {
    /// Every site, in order.
    pub const ALL: [Self; 4] = [Self::Recv, Self::Send, Self::BeforeSync, Self::AfterSync];

    /// The site's name in reports and in `--crash-at`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Recv => "recv",
            Self::Send => "send",
            Self::BeforeSync => "before_sync",
            Self::AfterSync => "after_sync",
        }
    }

    /// The site named `name`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The protocol step at a site: up to three words (`tcc.try.wallet`, `store_reply.worker_ok`,
/// `begin`), without allocation.
#[derive(Clone, Copy, Debug, PartialOrd, Ord)]
pub struct Label([&'static str; 3]);

impl PartialEq for Label {
    fn eq(&self, other: &Self) -> bool {
        // The words are literals: the same literal is the same pointer, and only words that
        // differ need their bytes compared (this runs for every message of a probed run).
        self.0
            .iter()
            .zip(&other.0)
            .all(|(a, b)| std::ptr::eq(*a, *b) || a == b)
    }
}

impl Eq for Label {}

impl std::hash::Hash for Label {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // What equal words share whatever their pointers: length and first and last byte.
        for word in &self.0 {
            let bytes = word.as_bytes();
            state.write_usize(bytes.len());
            state.write_u8(bytes.first().copied().unwrap_or(0));
            state.write_u8(bytes.last().copied().unwrap_or(0));
        }
    }
}

impl Label {
    /// A label of one to three words (empty words are left out).
    #[must_use]
    pub const fn new(a: &'static str, b: &'static str, c: &'static str) -> Self {
        Self([a, b, c])
    }

    /// The label of a message.
    #[must_use]
    pub fn of_msg(msg: &Msg) -> Self {
        match msg {
            Msg::Store { call, .. } => Self::new("store", call.kind(), ""),
            Msg::StoreReply { reply, .. } => Self::new("store_reply", reply.kind(), ""),
            Msg::Request { op, .. } => Self::new("request", op.kind(), ""),
            Msg::Response { outcome, .. } => Self::new("response", outcome.kind(), ""),
            Msg::Tcc(branch, m) => Self::new("tcc", m.phase.name(), branch.name()),
            Msg::TccReply(r) => Self::new(
                "tcc_reply",
                r.phase.name(),
                if r.outcome.is_ok() { "ok" } else { "refused" },
            ),
        }
    }

    /// Whether the label reads `text` (its words joined by `.`).
    #[must_use]
    pub fn reads(&self, text: &str) -> bool {
        let mut words = text.split('.');
        self.words().all(|w| words.next() == Some(w)) && words.next().is_none()
    }

    fn words(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.0.iter().copied().filter(|w| !w.is_empty())
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, word) in self.words().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(word)?;
        }
        Ok(())
    }
}

/// A log record's label: the protocol step it makes durable.
pub trait Labeled {
    /// The record's label.
    fn label(&self) -> Label;
}

impl Labeled for sut::lottery::LogEntry {
    fn label(&self) -> Label {
        Label::new(self.kind(), "", "")
    }
}

impl Labeled for sut::lottery::journal::JournalOp {
    fn label(&self) -> Label {
        Label::new(self.kind(), "", "")
    }
}

/// A node's role: what its crash points are deduplicated by (`id2` and `id3` are one role).
/// `None` for clients and the nemesis, which never crash.
#[must_use]
pub fn role(node: &str) -> Option<&'static str> {
    Some(match node {
        "db" => "db",
        "token" => "token",
        "coord" => "coord",
        "wallet" => "wallet",
        "inventory" => "inventory",
        _ if node.starts_with("id") => "id",
        _ => return None,
    })
}

/// What a crash point is, across seeds: a node role, a site and a protocol step.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PointKey {
    /// The node's role (`coord`, `id`, ...).
    pub role: String,
    /// The site.
    pub site: Site,
    /// The protocol step.
    pub label: String,
}

impl fmt::Display for PointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.role, self.site.name(), self.label)
    }
}

/// A crash point found in a seed: the first arrival of its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    /// What it is.
    pub key: PointKey,
    /// The node that arrived there first.
    pub node: String,
    /// Which arrival of that node at this site and label it was (1 = the first).
    pub nth: u64,
    /// When, simulated ms.
    pub at_ms: u64,
}

impl Found {
    /// The plan that crashes the node at this arrival.
    #[must_use]
    pub fn plan(&self, down_ms: u64) -> CrashPlan {
        CrashPlan {
            node: self.node.clone(),
            site: self.key.site,
            label: self.key.label.clone(),
            nth: self.nth,
            down_ms,
        }
    }
}

/// A crash placed at one arrival of one node at a site.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CrashPlan {
    /// The node.
    pub node: String,
    /// The site.
    pub site: Site,
    /// The protocol step, as [`Label`] writes it.
    pub label: String,
    /// Which arrival of the node at this site and label (1 = the first).
    pub nth: u64,
    /// How long the node stays down.
    pub down_ms: u64,
}

impl CrashPlan {
    /// The plan `NODE:SITE:LABEL#N` (as `--crash-at` takes it and [`CrashPlan::spec`] writes
    /// it), the node down for `down_ms`.
    ///
    /// # Errors
    /// What is wrong with the text, naming the part.
    pub fn parse(text: &str, down_ms: u64) -> Result<Self, String> {
        const FORM: &str = "the form is NODE:SITE:LABEL#N, e.g. coord:send:tcc.try.wallet#1";
        let (point, nth) = text
            .rsplit_once('#')
            .ok_or_else(|| format!("`{text}`: no `#N` (which arrival); {FORM}"))?;
        let nth: u64 =
            nth.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                format!("`{text}`: `#{nth}` is not an arrival number (1, 2, ...)")
            })?;
        let mut parts = point.splitn(3, ':');
        let (Some(node), Some(site), Some(label)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("`{text}`: {FORM}"));
        };
        if role(node).is_none() {
            return Err(format!(
                "`{text}`: `{node}` is not a server node (db, id1.., token, coord, wallet, \
                 inventory)"
            ));
        }
        let site = Site::parse(site).ok_or_else(|| {
            format!(
                "`{text}`: `{site}` is not a site ({})",
                Site::ALL.map(Site::name).join(", ")
            )
        })?;
        if label.is_empty() || label.split('.').any(str::is_empty) {
            return Err(format!("`{text}`: an empty label word; {FORM}"));
        }
        Ok(Self {
            node: node.to_owned(),
            site,
            label: label.to_owned(),
            nth,
            down_ms,
        })
    }

    /// `NODE:SITE:LABEL#N`, as `--crash-at` takes it.
    #[must_use]
    pub fn spec(&self) -> String {
        format!(
            "{}:{}:{}#{}",
            self.node,
            self.site.name(),
            self.label,
            self.nth
        )
    }
}

/// A crash point tried: the seed run again with its crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tried {
    /// What it is.
    pub key: PointKey,
    /// The crash, as planned.
    pub plan: CrashPlan,
    /// When the crash came (simulated ms); `None`: the run never reached the planned arrival
    /// (the rerun was not the same run: the bench's own fault, reported as such).
    pub crashed_at_ms: Option<u64>,
    /// The invariants the run with the crash violated.
    pub violations: Vec<crate::checkers::Violation>,
    /// Length of that run's history.
    pub events: u64,
    /// Hash of that run's history.
    pub trace_hash: u64,
}

/// What crash points did for one seed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedCrashPoints {
    /// Every distinct point the seed reached, in the order it reached them.
    pub found: Vec<Found>,
    /// The points tried (at most the budget), in the order tried.
    pub tried: Vec<Tried>,
    /// A replay of one point (`--crash-at`): the seed's own run is the run with that crash, and
    /// its results are the seed's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub struck: Option<Struck>,
}

/// The crash point a replay struck (`--crash-at`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Struck {
    /// The crash, as planned.
    pub plan: CrashPlan,
    /// When it came (simulated ms); `None`: the run never reached the planned arrival, and
    /// nothing was crashed.
    pub crashed_at_ms: Option<u64>,
}

/// The points of `found` a seed tries within `budget`: all of them if they fit; otherwise
/// `budget` of them, the window of the keys in order that starts at `seed × budget`: seeds in a
/// row try the next windows, so that a sweep tries every key once it has as many seeds as it
/// takes windows to go round.
#[must_use]
pub fn choose(found: &[Found], budget: usize, seed: u64) -> Vec<&Found> {
    if found.len() <= budget {
        return found.iter().collect();
    }
    let mut sorted: Vec<&Found> = found.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let n = sorted.len() as u64;
    let start = usize::try_from(seed.wrapping_mul(budget as u64) % n).unwrap_or(0);
    (0..budget)
        .map(|i| sorted[(start + i) % sorted.len()])
        .collect()
}

/// One node's arrivals so far, by site and label.
type Arrivals = FxHashMap<(Site, Label), u64>;

/// The probe of one run: counts arrivals, records the first arrival of each key, and strikes a
/// planned crash.
#[derive(Debug, Default)]
pub struct Probe {
    /// Record the points found.
    record: bool,
    /// The crash to strike, if any.
    plan: Option<CrashPlan>,
    /// Arrivals so far by node (a handful: looked up in order), then by site and label.
    arrivals: Vec<(String, Arrivals)>,
    /// The keys found so far.
    keys: FxHashSet<(&'static str, Site, Label)>,
    /// The points found, in order.
    found: Vec<Found>,
    /// A node whose planned crash waits for its send round to leave: its fsyncs are held.
    armed: Option<String>,
    /// When the planned crash came.
    crashed_at_ms: Option<u64>,
    /// Told when the planned crash comes (the run shortens its safety phase).
    crashed: Option<futures::channel::oneshot::Sender<u64>>,
}

impl Probe {
    /// A probe that records the points of a run.
    #[must_use]
    pub fn record() -> Self {
        Self {
            record: true,
            ..Self::default()
        }
    }

    /// A probe that strikes `plan`.
    #[must_use]
    pub fn crash(plan: CrashPlan) -> Self {
        Self {
            plan: Some(plan),
            ..Self::default()
        }
    }

    /// The plan, if any.
    #[must_use]
    pub fn plan(&self) -> Option<&CrashPlan> {
        self.plan.as_ref()
    }

    /// The points found so far.
    #[must_use]
    pub fn found(&self) -> &[Found] {
        &self.found
    }

    /// When the planned crash came, if it did.
    #[must_use]
    pub fn crashed_at_ms(&self) -> Option<u64> {
        self.crashed_at_ms
    }

    /// A receiver told the simulated ms of the planned crash when it comes.
    pub fn on_crash(&mut self) -> futures::channel::oneshot::Receiver<u64> {
        let (tx, rx) = futures::channel::oneshot::channel();
        self.crashed = Some(tx);
        rx
    }

    /// `node` arrives at `site` with `label` at `now_ms`: counted (and recorded when it is the
    /// first arrival of its key); `true` when the planned crash strikes here.
    pub fn arrive(&mut self, node: &str, site: Site, label: Label, now_ms: u64) -> bool {
        let Some(role) = role(node) else {
            return false;
        };
        let planned = self.plan.as_ref().is_some_and(|p| {
            self.crashed_at_ms.is_none()
                && p.node == node
                && p.site == site
                && label.reads(&p.label)
        });
        if !self.record && !planned {
            return false;
        }
        let slot = match self.arrivals.iter().position(|(name, _)| name == node) {
            Some(slot) => slot,
            None => {
                self.arrivals.push((node.to_owned(), FxHashMap::default()));
                self.arrivals.len() - 1
            }
        };
        let n = self.arrivals[slot].1.entry((site, label)).or_insert(0);
        *n += 1;
        let nth = *n;
        if self.record && nth == 1 && self.keys.insert((role, site, label)) {
            self.found.push(Found {
                key: PointKey {
                    role: role.to_owned(),
                    site,
                    label: label.to_string(),
                },
                node: node.to_owned(),
                nth,
                at_ms: now_ms,
            });
        }
        planned && self.plan.as_ref().is_some_and(|p| p.nth == nth)
    }

    /// The planned crash waits for `node`'s send round to leave; its fsyncs are held meanwhile.
    pub fn arm(&mut self, node: &str) {
        self.armed = Some(node.to_owned());
    }

    /// Whether `node`'s fsyncs are held (its planned crash waits for a send round).
    #[must_use]
    pub fn holds_sync(&self, node: &str) -> bool {
        self.armed.as_deref() == Some(node)
    }

    /// `node` went down (the planned crash or any other kill): nothing of it is held any more.
    pub fn node_down(&mut self, node: &str) {
        if self.holds_sync(node) {
            self.armed = None;
        }
    }

    /// The planned crash came at `now_ms`.
    pub fn struck(&mut self, now_ms: u64) {
        self.crashed_at_ms = Some(now_ms);
        self.armed = None;
        if let Some(tx) = self.crashed.take() {
            let _ = tx.send(now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_round_trip_through_their_spec() {
        let plan = CrashPlan::parse("coord:send:tcc.try.wallet#3", 40).expect("a valid spec");
        assert_eq!(plan.node, "coord");
        assert_eq!(plan.site, Site::Send);
        assert_eq!(plan.label, "tcc.try.wallet");
        assert_eq!(plan.nth, 3);
        assert_eq!(plan.down_ms, 40);
        assert_eq!(plan.spec(), "coord:send:tcc.try.wallet#3");
        assert_eq!(CrashPlan::parse(&plan.spec(), 40), Ok(plan));
    }

    #[test]
    fn bad_plans_are_refused_naming_the_part() {
        for (text, names) in [
            ("coord:send:tcc.try", "#N"),
            ("coord:send:tcc.try#0", "#0"),
            ("coord:send:tcc.try#x", "#x"),
            ("client1:send:tcc.try#1", "client1"),
            ("coord:sent:tcc.try#1", "sent"),
            ("coord:send#1", "NODE:SITE:LABEL"),
            ("coord:send:tcc..try#1", "empty label word"),
        ] {
            let err = CrashPlan::parse(text, 1).expect_err(text);
            assert!(err.contains(names), "{text}: {err}");
        }
    }

    #[test]
    fn labels_read_their_words() {
        let label = Label::new("tcc", "try", "wallet");
        assert_eq!(label.to_string(), "tcc.try.wallet");
        assert!(label.reads("tcc.try.wallet"));
        assert!(!label.reads("tcc.try"));
        assert!(!label.reads("tcc.try.wallet.x"));
        let short = Label::new("begin", "", "");
        assert_eq!(short.to_string(), "begin");
        assert!(short.reads("begin"));
    }

    #[test]
    fn a_probe_records_each_key_once_and_strikes_the_planned_arrival() {
        let try_wallet = Label::new("tcc", "try", "wallet");
        let mut probe = Probe::record();
        assert!(!probe.arrive("coord", Site::Send, try_wallet, 5));
        assert!(!probe.arrive("coord", Site::Send, try_wallet, 6));
        assert!(!probe.arrive(
            "id1",
            Site::Recv,
            Label::new("request", "segment_id", ""),
            7
        ));
        assert!(!probe.arrive(
            "id2",
            Site::Recv,
            Label::new("request", "segment_id", ""),
            8
        ));
        assert!(
            !probe.arrive("client1", Site::Send, try_wallet, 9),
            "clients never crash"
        );
        let found = probe.found();
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!((found[0].node.as_str(), found[0].nth), ("coord", 1));
        assert_eq!(found[1].key.role, "id");

        let plan = CrashPlan::parse("coord:send:tcc.try.wallet#2", 10).expect("valid");
        let mut probe = Probe::crash(plan);
        assert!(!probe.arrive("coord", Site::Send, try_wallet, 5));
        assert!(
            !probe.arrive("coord", Site::Recv, try_wallet, 5),
            "another site"
        );
        assert!(
            probe.arrive("coord", Site::Send, try_wallet, 6),
            "the second arrival"
        );
        probe.struck(6);
        assert!(
            !probe.arrive("coord", Site::Send, try_wallet, 7),
            "struck once"
        );
        assert_eq!(probe.crashed_at_ms(), Some(6));
        assert!(probe.found().is_empty(), "a crash probe records nothing");
    }

    #[test]
    fn a_held_sync_is_released_when_its_node_goes_down() {
        let mut probe = Probe::default();
        probe.arm("coord");
        assert!(probe.holds_sync("coord"));
        assert!(!probe.holds_sync("wallet"));
        probe.node_down("wallet");
        assert!(probe.holds_sync("coord"));
        probe.node_down("coord");
        assert!(!probe.holds_sync("coord"));
    }

    #[test]
    fn a_budget_chooses_a_window_of_keys_that_moves_with_the_seed() {
        let found: Vec<Found> = (0..10)
            .map(|i| Found {
                key: PointKey {
                    role: "coord".into(),
                    site: Site::Send,
                    label: format!("l{i}"),
                },
                node: "coord".into(),
                nth: 1,
                at_ms: i,
            })
            .collect();
        assert_eq!(choose(&found, 20, 3).len(), 10, "all of them fit");
        let mut seen = std::collections::BTreeSet::new();
        for seed in 100..104 {
            let chosen = choose(&found, 3, seed);
            assert_eq!(chosen.len(), 3);
            seen.extend(chosen.iter().map(|f| f.key.label.clone()));
        }
        assert_eq!(seen.len(), 10, "four seeds in a row try every key");
    }
}
