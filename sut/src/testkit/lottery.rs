//! A small deterministic driver of the whole lottery: the coordinator and three participant
//! nodes (each with its own store) over a network that loses, duplicates and reorders messages,
//! with coordinator crashes that lose unwritten log entries, then a healing phase. Safety
//! invariants are checked after every step; `lottery.settled` and the outcome events are checked
//! after healing.
//!
//! One `u64` seed decides everything; a failure names the step and the violated invariant. The
//! driver is generic over [`LotteryStore`]: `sut`'s tests run it over [`MemoryStore`]s, and
//! `sut-server`'s over its SQLite stores.
//!
//! [`MemoryStore`]: crate::lottery::MemoryStore

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::clock::Now;
use crate::lottery::{
    ActivityId, ClientAnswer, CoordLog, CoordinatorConfig, CoordinatorIo, CoordinatorNode,
    DrawArgs, DrawEvent, DrawOutcome, Handled, Host, Ledger, LogEntry, LotteryStore, Participant,
    ParticipantConfig, ParticipantMsg, ParticipantReply, Phase, Registry, Resume, Terms, UserId,
    Written, Xid, invariants,
};

/// The ticket price of each activity the drivers use, by activity id (activity 1 costs 10, as
/// [`draw`]'s draws do).
pub const PRICES_MINOR: [u64; 2] = [17, 10];

/// The operator's registry the drivers use: activity `a` at [`PRICES_MINOR`]`[a]`, one draw in
/// ten winning, always open.
///
/// # Panics
/// Never: the terms are valid.
#[must_use]
pub fn registry() -> Registry {
    Registry::from_entries(
        PRICES_MINOR
            .iter()
            .enumerate()
            .map(|(a, price)| (ActivityId(a as u64), Terms::always_open(*price, 100))),
    )
    .expect("valid terms")
}

/// A draw of user 1 in activity 1 at price 10.
#[must_use]
pub fn draw(xid: u64, won: bool) -> DrawArgs {
    DrawArgs {
        xid: Xid(xid),
        user: UserId(1),
        activity: ActivityId(1),
        price_minor: 10,
        won,
    }
}

/// Sends one message to `p` over `store` on the correct path and returns the reply.
///
/// # Panics
/// If the participant answers with a two-step resume (only the documented flaws do).
pub fn send<S: LotteryStore + ?Sized>(
    store: &mut S,
    p: Participant,
    phase: Phase,
    draw: DrawArgs,
) -> ParticipantReply {
    match p.handle(
        store,
        &ParticipantConfig::default(),
        &registry(),
        &ParticipantMsg { phase, draw },
    ) {
        Handled::Reply(r) => r,
        Handled::Resume(_) => panic!("the correct path is one step"),
    }
}

/// splitmix64: the driver's only source of randomness.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next() % n
    }

    fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).unwrap()
    }
}

#[derive(Clone, Debug)]
enum Packet {
    ToParticipant(Participant, ParticipantMsg),
    ToCoordinator(Participant, ParticipantReply),
    /// A flawed two-step operation's second half, pending on the participant node.
    Resume(Participant, Resume),
}

const USERS: u64 = 4;
const ACTIVITIES: u64 = 2;
const NET_MAX: usize = 256;

/// The driven world: a coordinator, its log, one store per participant, the network and what
/// happened so far. Build it with [`World::new`], drive it with [`World::run`].
pub struct World<S> {
    rng: Rng,
    config: CoordinatorConfig,
    pconfig: ParticipantConfig,
    registry: Registry,
    coord: CoordinatorNode<()>,
    log: CoordLog,
    pending_log: Vec<LogEntry>,
    stores: BTreeMap<Participant, S>,
    net: Vec<Packet>,
    history: Vec<ParticipantReply>,
    events: Vec<DrawEvent>,
    begun: BTreeSet<Xid>,
    wall_ms: u64,
    boot_ms: u64,
    next_xid: u64,
    restarts: u32,
    faults: Faults,
}

/// How the world moves its coordinator's outputs: log entries wait to be written (a step writes
/// one, or a restart loses them), messages go on the lossy network, outcomes into the record.
struct TestIo<'a> {
    pending_log: &'a mut Vec<LogEntry>,
    net: &'a mut Vec<Packet>,
    events: &'a mut Vec<DrawEvent>,
}

impl CoordinatorIo<()> for TestIo<'_> {
    fn write_log(&mut self, entry: &LogEntry) -> Written {
        self.pending_log.push(*entry);
        Written::Later
    }

    fn send(
        &mut self,
        _host: Host,
        branch: Participant,
        msg: ParticipantMsg,
    ) -> Option<ParticipantReply> {
        self.net.push(Packet::ToParticipant(branch, msg));
        None
    }

    fn outcome(&mut self, event: &DrawEvent, _answer: ClientAnswer<'_>, _client: Option<()>) {
        self.events.push(event.clone());
    }
}

/// Fault weights (out of roughly 1000 per step) for one world.
#[derive(Clone, Copy, Debug)]
struct Faults {
    dup: u64,
    drop: u64,
    restart: u64,
    /// Deliver any packet next (a fully unordered network), not mostly the oldest.
    reorder_all: bool,
}

impl<S> fmt::Debug for World<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("wall_ms", &self.wall_ms)
            .field("next_xid", &self.next_xid)
            .field("in_flight_packets", &self.net.len())
            .field("replies", &self.history.len())
            .field("events", &self.events.len())
            .field("restarts", &self.restarts)
            .finish_non_exhaustive()
    }
}

impl<S: LotteryStore> World<S> {
    /// A world whose faults and draws all follow from `seed`; `make` builds each participant's
    /// store (wallets and stock are opened on them here).
    ///
    /// # Panics
    /// If a fresh store refuses to open the accounts or add the stock.
    pub fn new(
        seed: u64,
        pconfig: ParticipantConfig,
        mut make: impl FnMut(Participant) -> S,
    ) -> Self {
        let config = CoordinatorConfig {
            inflight_max: 6,
            reply_timeout_ms: 150,
            backoff_ms_max: 1_200,
            attempts_max: 4,
            events_max: 64,
            park_delay_ms: 200,
            compensation_retries_max: 2,
            wheel: crate::lottery::wheel::WheelConfig::default(),
            flaw: None,
        };
        let mut stores: BTreeMap<Participant, S> =
            Participant::ALL.into_iter().map(|p| (p, make(p))).collect();
        let wallet = stores.get_mut(&Participant::Wallet).unwrap();
        for u in 0..USERS {
            wallet.open_account(UserId(u), 60).unwrap();
        }
        let inventory = stores.get_mut(&Participant::Inventory).unwrap();
        for a in 0..ACTIVITIES {
            inventory.add_stock(ActivityId(a), 2).unwrap();
        }
        let mut rng = Rng(seed);
        let faults = Faults {
            dup: [0, 30, 70][rng.index(3)],
            drop: [0, 30, 70][rng.index(3)],
            restart: [0, 4, 12][rng.index(3)],
            reorder_all: rng.below(2) == 0,
        };
        Self {
            rng,
            faults,
            config,
            pconfig,
            registry: registry(),
            coord: CoordinatorNode::new(config, None).unwrap(),
            log: CoordLog::default(),
            pending_log: Vec::new(),
            stores,
            net: Vec::new(),
            history: Vec::new(),
            events: Vec::new(),
            begun: BTreeSet::new(),
            wall_ms: 0,
            boot_ms: 0,
            next_xid: 1,
            restarts: 0,
        }
    }

    fn now(&self) -> Now {
        Now {
            wall_ms: self.wall_ms,
            mono_ms: self.wall_ms - self.boot_ms,
        }
    }

    /// Every participant's store and the coordinator log, merged into one ledger.
    ///
    /// # Panics
    /// If a store cannot snapshot or the parts overlap.
    pub fn ledger(&mut self) -> Ledger {
        let mut parts: Vec<Ledger> = self
            .stores
            .values_mut()
            .map(|s| s.snapshot().unwrap())
            .collect();
        parts.push(Ledger {
            coord_log: self.log.clone(),
            ..Ledger::default()
        });
        Ledger::merge(&parts).unwrap()
    }

    fn drain(&mut self) {
        let now = self.now();
        let mut io = TestIo {
            pending_log: &mut self.pending_log,
            net: &mut self.net,
            events: &mut self.events,
        };
        self.coord.drive(&mut io, now);
        if let Err(violation) = self.coord.check_invariants() {
            panic!("coordinator invariant: {violation}");
        }
    }

    /// Starts a draw at its activity's price, or (one in 21) at a price the participants must
    /// refuse: what a coordinator fooled by a client, or a forged call, would send.
    fn start_random_draw(&mut self) {
        let user = UserId(self.rng.below(USERS));
        let activity = ActivityId(self.rng.below(ACTIVITIES));
        let tampered = self.rng.below(21) == 0;
        let price_minor = self.registry.get(activity).map_or(0, |t| {
            if tampered {
                t.price_minor / 2
            } else {
                t.price_minor
            }
        });
        let draw = DrawArgs {
            xid: Xid(self.next_xid),
            user,
            activity,
            price_minor,
            won: self.rng.below(2) == 0,
        };
        let now = self.now();
        if self.coord.start_draw(draw, None, now).is_ok() {
            self.next_xid += 1;
        }
    }

    fn write_log(&mut self, i: usize) {
        let e = self.pending_log.remove(i);
        self.log
            .append(&e)
            .unwrap_or_else(|err| panic!("log refused {e:?}: {err}"));
        if let LogEntry::Begin(d) = e {
            self.begun.insert(d.xid);
        }
        let now = self.now();
        self.coord.handle_log_written(&e, now);
    }

    fn deliver(&mut self, i: usize) {
        let now = self.now();
        match self.net.remove(i) {
            Packet::ToParticipant(p, msg) => {
                let store = self.stores.get_mut(&p).unwrap();
                match p.handle(store, &self.pconfig, &self.registry, &msg) {
                    Handled::Reply(r) => {
                        self.history.push(r.clone());
                        self.net.push(Packet::ToCoordinator(p, r));
                    }
                    Handled::Resume(r) => self.net.push(Packet::Resume(p, r)),
                }
            }
            Packet::Resume(p, resume) => {
                let store = self.stores.get_mut(&p).unwrap();
                let r = p.handle_resume(store, &self.pconfig, &resume);
                self.history.push(r.clone());
                self.net.push(Packet::ToCoordinator(p, r));
            }
            Packet::ToCoordinator(p, r) => self.coord.handle_reply(p, &r, now),
        }
    }

    fn advance(&mut self, ms: u64) {
        self.wall_ms += ms;
        let now = self.now();
        self.coord.handle_timeout(now);
    }

    fn restart(&mut self) {
        self.pending_log.clear();
        self.boot_ms = self.wall_ms;
        self.restarts += 1;
        self.coord = CoordinatorNode::recover(self.config, &self.log, self.now(), None).unwrap();
    }

    /// A packet index: mostly among the oldest few (a network that reorders a little), now and
    /// then anywhere (a long delay).
    fn pick_packet(&mut self) -> usize {
        let anywhere = self.faults.reorder_all || self.rng.below(4) == 0;
        let window = if anywhere {
            self.net.len()
        } else {
            self.net.len().min(3)
        };
        self.rng.index(window)
    }

    /// One random step of the fault phase; the fault weights are per world ("swarm testing").
    fn fault_step(&mut self, draws_max: u64) {
        let f = self.faults;
        let weights = [120, 120, 340, f.dup, f.drop, 180, f.restart, 70];
        let total: u64 = weights.iter().sum();
        let mut roll = self.rng.below(total);
        let mut action = 0;
        while roll >= weights[action] {
            roll -= weights[action];
            action += 1;
        }
        match action {
            0 if self.next_xid <= draws_max => self.start_random_draw(),
            1 if !self.pending_log.is_empty() => {
                let i = self.rng.index(self.pending_log.len());
                self.write_log(i);
            }
            2 if !self.net.is_empty() => {
                let i = self.pick_packet();
                self.deliver(i);
            }
            3 if !self.net.is_empty() && self.net.len() < NET_MAX => {
                let i = self.pick_packet();
                let dup = self.net[i].clone();
                self.net.push(dup);
            }
            4 if !self.net.is_empty() => {
                let i = self.pick_packet();
                self.net.remove(i);
            }
            5 => {
                let ms = self.rng.below(100);
                self.advance(ms);
            }
            6 => self.restart(),
            7 => {
                // An operator retries a dead letter.
                let dead: Vec<Xid> = self
                    .coord
                    .coordinator()
                    .dead_letters()
                    .map(|(d, _)| d.xid)
                    .collect();
                if !dead.is_empty() {
                    let x = dead[self.rng.index(dead.len())];
                    let now = self.now();
                    self.coord.handle_retry_dead_letter(x, now).unwrap();
                }
            }
            _ => {}
        }
        self.drain();
    }

    fn check_safety(&mut self) -> Result<(), String> {
        let ledger = self.ledger();
        invariants::check_safety(&ledger, &self.history).map_err(|v| v.to_string())?;
        invariants::paid(&ledger, &self.registry).map_err(|v| v.to_string())?;
        invariants::no_duplicate_confirmed_draws(&self.events).map_err(|v| v.to_string())
    }

    /// Heals every fault and runs until the coordinator is idle (bounded).
    fn heal(&mut self) -> Result<(), String> {
        for _ in 0..10_000 {
            while !self.pending_log.is_empty() {
                self.write_log(0);
                self.drain();
            }
            while !self.net.is_empty() {
                self.deliver(0);
                self.drain();
            }
            // After the heal an operator retries every dead letter.
            let dead: Vec<Xid> = self
                .coord
                .coordinator()
                .dead_letters()
                .map(|(d, _)| d.xid)
                .collect();
            for x in dead {
                let now = self.now();
                self.coord.handle_retry_dead_letter(x, now).unwrap();
            }
            self.drain();
            if self.net.is_empty() && self.pending_log.is_empty() {
                if self.coord.coordinator().inflight() == 0 {
                    return Ok(());
                }
                match self.coord.poll_timeout() {
                    Some(deadline) => {
                        let now = self.now();
                        self.advance(deadline.saturating_sub(now.mono_ms));
                        self.drain();
                    }
                    None => {
                        return Err(format!(
                            "stuck: {} draws in flight, no timer",
                            self.coord.coordinator().inflight()
                        ));
                    }
                }
            }
        }
        Err("healing did not converge".into())
    }

    /// Checks the end state after healing: settled, and every durably begun draw reported
    /// exactly one final outcome that agrees with the ledger.
    fn check_end(&mut self) -> Result<(), String> {
        let ledger = self.ledger();
        invariants::settled(&ledger).map_err(|v| v.to_string())?;
        let mut finals: BTreeMap<Xid, &DrawEvent> = BTreeMap::new();
        for e in &self.events {
            if !e.outcome.is_final() {
                continue;
            }
            if finals.insert(e.draw.xid, e).is_some() {
                return Err(format!("two final outcomes for {:?}", e.draw.xid));
            }
        }
        let reported: BTreeSet<Xid> = finals.keys().copied().collect();
        if reported != self.begun {
            return Err(format!(
                "begun {:?} but reported {:?}",
                self.begun, reported
            ));
        }
        for (xid, e) in finals {
            let row = ledger.participations.get(&(e.draw.user, e.draw.activity));
            let holds = row.is_some_and(|r| r.xid == xid && r.confirmed);
            let confirmed = matches!(e.outcome, DrawOutcome::Confirmed { .. });
            if holds != confirmed {
                return Err(format!(
                    "event {e:?} disagrees with the participation record {row:?}"
                ));
            }
        }
        Ok(())
    }

    /// Every participant reply so far, in order.
    #[must_use]
    pub fn history(&self) -> &[ParticipantReply] {
        &self.history
    }

    /// Every coordinator event so far, in order.
    #[must_use]
    pub fn events(&self) -> &[DrawEvent] {
        &self.events
    }

    /// Coordinator crashes so far.
    #[must_use]
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// The whole run: `steps` fault steps (safety checked after each), then healing.
    ///
    /// # Errors
    /// The first violated invariant, with the step it was found at.
    pub fn run(&mut self, steps: u32, draws_max: u64) -> Result<(), String> {
        for i in 0..steps {
            self.fault_step(draws_max);
            self.check_safety().map_err(|e| format!("step {i}: {e}"))?;
        }
        self.heal()?;
        self.check_safety()?;
        self.check_end()
    }
}
