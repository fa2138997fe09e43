//! Messages between simulated nodes, over madsim's network.
//!
//! Every send goes through [`Ctx::send`], which also counts what the faults did to it: a
//! message into a partition (madsim drops it: clogged datagrams are dropped), a message lost
//! to the packet-loss fault (dropped here, from madsim's seeded RNG), a message sent during a
//! latency spike. That is the fault-coverage bookkeeping: a fault that touched no message
//! took no effect.
//!
//! **Pipelining.** A node does not hand each message to madsim on its own. Like a real
//! client or server writing to its sockets, it queues them; one sender task per node takes
//! everything queued, groups it by destination and sends one madsim datagram per
//! destination (a "send round"; each madsim send takes at least one simulated millisecond, so
//! what a node says within that millisecond leaves together in the next round). The datagram
//! is dropped or delayed by partitions, clogs and latency as a whole, exactly like one TCP
//! segment carrying several pipelined requests; the receiver hands its messages to the node
//! in a random order (madsim's seeded RNG), so messages of one round still arrive reordered.
//! The fault counters count messages, at the moment their datagram leaves.
//!
//! **Delivery.** A datagram reaches its node through madsim's delivery hook
//! (`NetSim::hook_rpc_rsp`, called when madsim's latency timer for the datagram fires, after
//! clogs, partitions and latency have been applied in `Network::try_send`) rather than through
//! madsim's mailbox and `recv_from_raw`. The hook moves the messages into the node's inbox and
//! tells madsim to drop its copy. What it saves per datagram is the receive side's extra timer
//! (`recv_from_raw` sleeps at least one more simulated millisecond after the message arrived),
//! a mailbox hand-off and the wake-up of a receiver task; what a fault does to a datagram is
//! unchanged, because madsim applies every fault before the hook runs. A datagram addressed to a
//! node that is down is not delivered (madsim finds no bound socket), as before.
//!
//! **The wire.** By default ([`Transport::Wire`]) a send round does not hand its datagrams to
//! madsim's `Endpoint::send_to_raw` either but carries them on [`wire`], madsim's
//! UDP path done step for step (the same draws and timers, the same history) without its costs.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use madsim::net::Endpoint;
use madsim::rand::{GlobalRng, Rng, thread_rng};
use madsim::time::Sleep;
use sut::clock::Now;

use crate::buggify::{Buggify, StragglerClass};
use crate::chan::{Receiver, Sender, unbounded};
use crate::clock::SimClock;
use crate::crashpoints::{Label, Site};
use crate::history::EventKind;
pub use crate::msg::Msg;
use crate::wire::{self, Transport};
use crate::world::World;

/// The one port every node listens on.
pub const PORT: u16 = 7000;

/// What madsim's `NetSim::send` does with a datagram once its `rand_delay` is over (steps 2–5
/// of [`wire`](crate::wire)).
fn wire_send(
    world: &World,
    clock: &SimClock,
    rng: &mut GlobalRng,
    from: &Arc<str>,
    to: SocketAddr,
    msgs: Vec<Msg>,
) {
    let carried = {
        let mut w = world.lock();
        // madsim finds no route to an address it does not know (no draws).
        let Some(clogged) = w.names.get(&to.ip()).map(|to| w.partitioned(from, to)) else {
            return;
        };
        w.wire.carry(rng, clogged, to.ip())
    };
    if let Some((latency, inbox)) = carried {
        wire::arm(clock, latency, msgs, Arc::clone(from), inbox);
    }
}

/// The most futures `futures::future::join_all` polls side by side, in order, on every poll
/// (`futures_util::future::join_all::SMALL`); a longer list it polls as a `FuturesOrdered`.
const JOIN_ALL_SMALL: usize = 30;

/// One datagram of a send round on the wire, in the states of madsim's send future.
#[derive(Debug)]
enum Leg {
    /// Not polled yet.
    Start(SocketAddr, Vec<Msg>),
    /// In its `rand_delay`.
    Delayed(Sleep, SocketAddr, Vec<Msg>),
    /// Sent (or dropped).
    Done,
}

/// A send round on the wire of at most [`JOIN_ALL_SMALL`] datagrams, sent side by side and
/// polled as `join_all` polls that many of madsim's send futures (every poll advances each
/// unfinished one, in order), so that the draws and timers come in the same order.
struct WireRound<'a> {
    world: &'a World,
    clock: &'a SimClock,
    from: &'a Arc<str>,
    rng: GlobalRng,
    legs: &'a mut Vec<Leg>,
}

impl Future for WireRound<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut all_done = true;
        for leg in this.legs.iter_mut() {
            if let Leg::Start(to, msgs) = leg {
                let (to, msgs) = (*to, std::mem::take(msgs));
                *leg = Leg::Delayed(wire::rand_delay(this.clock, &mut this.rng), to, msgs);
            }
            if let Leg::Delayed(delay, to, msgs) = leg {
                if Pin::new(delay).poll(cx).is_pending() {
                    all_done = false;
                    continue;
                }
                let (to, msgs) = (*to, std::mem::take(msgs));
                *leg = Leg::Done;
                wire_send(this.world, this.clock, &mut this.rng, this.from, to, msgs);
            }
        }
        if all_done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// One madsim datagram on madsim's UDP path ([`Transport::MadsimUdp`]): the messages a node sent
/// to one destination in one send round, and the sender's name. The delivery hook takes the
/// messages out (it only gets a shared reference), hence the lock.
#[derive(Debug)]
struct Datagram {
    from: Arc<str>,
    msgs: Mutex<Vec<Msg>>,
}

/// A node's view of the world: its name, its outgoing queue, the shared state.
#[derive(Clone)]
pub struct Ctx {
    /// The shared state.
    pub world: World,
    /// This node's name.
    pub name: String,
    /// The same, shared by its events.
    node: Arc<str>,
    /// Where its clock is ([`crate::world::Clocks`]).
    clock_slot: Option<usize>,
    out: Sender<(SocketAddr, Msg)>,
    clock: SimClock,
}

/// A node's incoming messages.
#[derive(Debug)]
pub struct Inbox {
    rx: Receiver<(Vec<Msg>, Arc<str>)>,
    /// The rest of the last datagram, and its sender.
    pending: VecDeque<Msg>,
    from: Arc<str>,
    /// Crash points: the run's world and this node's name, when the run has a probe
    /// ([`crate::crashpoints`]; a message taken from the inbox is a [`Site::Recv`]).
    probed: Option<(World, String)>,
}

impl Inbox {
    /// The next message and the name of its sender (`None` once the node is going down).
    pub async fn recv(&mut self) -> Option<(Msg, Arc<str>)> {
        loop {
            if let Some(msg) = self.pending.pop_front() {
                if let Some((world, node)) = &self.probed
                    && world.with(|w| w.arrive(node, Site::Recv, Label::of_msg(&msg)))
                {
                    // The node dies with the message unread.
                    crate::nemesis::strike(world, node);
                    std::future::pending::<()>().await;
                }
                return Some((msg, Arc::clone(&self.from)));
            }
            let (msgs, from) = self.rx.recv().await?;
            self.pending = msgs.into();
            self.from = from;
        }
    }
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    /// Binds this node's endpoint and starts its sender and receivers.
    pub async fn bind(world: World, name: &str) -> (Self, Inbox) {
        let ep = Arc::new(
            Endpoint::bind(("0.0.0.0", PORT))
                .await
                .expect("bind the node's endpoint"),
        );
        let (out, queued) = unbounded();
        madsim::task::spawn(send_rounds(
            world.clone(),
            name.to_owned(),
            Arc::clone(&ep),
            queued,
        ));
        let (tx, rx) = unbounded();
        let transport = world.with(|w| {
            if w.transport == Transport::Wire {
                let ip = w.addrs[name].ip();
                w.wire.bind(ip, tx.clone());
            }
            w.transport
        });
        if transport == Transport::MadsimUdp {
            // Replaces the hook of this node's previous incarnation, if any.
            madsim::net::NetSim::current().hook_rpc_rsp(
                madsim::plugin::node(),
                move |datagram: &Datagram| {
                    let msgs = std::mem::take(&mut *datagram.msgs.lock().expect("datagram lock"));
                    wire::deliver(msgs, Arc::clone(&datagram.from), &tx);
                    // madsim's own copy (now empty) is dropped, not put in a mailbox.
                    false
                },
            );
        }
        let clock_slot = world.with(|w| w.clocks.slot(name));
        let ctx = Self {
            world,
            name: name.to_owned(),
            node: Arc::from(name),
            clock_slot,
            out,
            clock: SimClock::current(),
        };
        let probed = ctx
            .world
            .with(|w| w.probe.is_some())
            .then(|| (ctx.world.clone(), name.to_owned()));
        let inbox = Inbox {
            rx,
            pending: VecDeque::new(),
            from: Arc::from(""),
            probed,
        };
        (ctx, inbox)
    }

    /// madsim's instant now (what `Instant::now()` returns in the simulation, read cheaply).
    #[must_use]
    pub fn instant(&self) -> madsim::time::Instant {
        self.clock.now()
    }

    /// Sleeps `duration` of simulated time (`madsim::time::sleep`, on the clock this context
    /// holds).
    pub fn sleep(&self, duration: std::time::Duration) -> Sleep {
        self.clock.sleep(duration)
    }

    /// This node's clock.
    #[must_use]
    pub fn now(&self) -> Now {
        debug_assert_eq!(
            self.clock_slot,
            self.world.with(|w| w.clocks.slot(&self.name)),
            "{}'s clock slot",
            self.name
        );
        self.world.now_at(self.clock_slot)
    }

    /// Records an event on this node.
    pub fn record(&self, make: impl FnOnce(u64) -> EventKind) -> u64 {
        self.world.record_as(&self.node, self.clock_slot, make)
    }

    /// Queues `msg` for node `to` (sends never block the caller); it leaves in this node's
    /// next send round. A message lost to the packet-loss fault is counted and dropped here.
    pub fn send(&self, to: &str, msg: Msg) {
        let addr = {
            let mut w = self.world.lock();
            let Some(addr) = w.addr(to) else {
                return;
            };
            if w.loss_ppm > 0 && thread_rng().gen_range(0..1_000_000) < w.loss_ppm {
                w.count("net.dropped_by_loss", 1);
                return;
            }
            if !w.healed
                && w.spec.buggify.stragglers.is_some()
                && let Some(delay_ms) = straggle(&w.spec.buggify, &msg, &mut thread_rng())
            {
                w.count("buggify.stragglers", 1);
                let out = self.out.clone();
                madsim::task::spawn(async move {
                    madsim::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
                    let _ = out.send((addr, msg));
                });
                return;
            }
            addr
        };
        // A closed queue means the node is going down (killed): nothing to do.
        let _ = self.out.send((addr, msg));
    }
}

/// The node's sender task: takes everything queued, one datagram per destination, counts
/// what partitions and latency spikes do to each message as its datagram leaves, and sends
/// the datagrams side by side (each madsim send takes a simulated millisecond).
async fn send_rounds(
    world: World,
    name: String,
    ep: Arc<Endpoint>,
    mut queued: Receiver<(SocketAddr, Msg)>,
) {
    let from: Arc<str> = Arc::from(name.as_str());
    let clock = SimClock::current();
    let transport = world.with(|w| w.transport);
    // A round's datagrams, and on the wire their send states: emptied by every round, their
    // room kept for the next.
    let mut rounds: Vec<(SocketAddr, Vec<Msg>)> = Vec::new();
    let mut legs: Vec<Leg> = Vec::new();
    let probed = world.with(|w| w.probe.is_some());
    while let Some((addr, msg)) = queued.recv().await {
        debug_assert!(rounds.is_empty() && legs.is_empty());
        // One datagram per destination, in address order (a handful of destinations a round).
        let mut add = |addr: SocketAddr, msg: Msg| match rounds.iter_mut().find(|(a, _)| *a == addr)
        {
            Some((_, msgs)) => msgs.push(msg),
            None => rounds.push((addr, vec![msg])),
        };
        add(addr, msg);
        queued.try_recv_all(|(addr, msg)| add(addr, msg));
        rounds.sort_unstable_by_key(|(addr, _)| *addr);
        {
            let mut w = world.lock();
            let (mut sent, mut dropped, mut to_paused) = (0, 0, 0);
            for (addr, msgs) in &rounds {
                let n = msgs.len() as u64;
                sent += n;
                let to = w.names.get(&addr.ip());
                if to.is_some_and(|to| w.partitioned(&name, to)) {
                    dropped += n;
                } else if to.is_some_and(|to| w.paused.contains_key(to)) {
                    to_paused += n;
                }
            }
            w.count("net.messages", sent);
            w.count("net.dropped_by_partition", dropped);
            w.count("pause.delayed_messages", to_paused);
            if w.latency_spike {
                w.count("net.delayed_by_spike", sent);
            }
        }
        // Crash points: each message is a send; a crash planned at one of them strikes once the
        // round has left, and holds the node's fsyncs until then.
        let strike = probed && arrive_sends(&world, &name, &rounds);
        match transport {
            Transport::Wire if rounds.len() <= JOIN_ALL_SMALL => {
                legs.extend(rounds.drain(..).map(|(to, msgs)| Leg::Start(to, msgs)));
                WireRound {
                    world: &world,
                    clock: &clock,
                    from: &from,
                    rng: thread_rng(),
                    legs: &mut legs,
                }
                .await;
                legs.clear();
            }
            Transport::Wire => {
                // More destinations than `join_all` polls in order: it polls them as a
                // `FuturesOrdered` does (each when its own timer wakes it), and so does this.
                let sends = rounds.drain(..).map(|(to, msgs)| {
                    let (world, clock, from) = (&world, &clock, &from);
                    async move {
                        let mut rng = thread_rng();
                        wire::rand_delay(clock, &mut rng).await;
                        wire_send(world, clock, &mut rng, from, to, msgs);
                    }
                });
                futures::future::join_all(sends).await;
            }
            Transport::MadsimUdp => {
                let sends = rounds.drain(..).map(|(addr, msgs)| {
                    let datagram = Datagram {
                        from: Arc::clone(&from),
                        msgs: Mutex::new(msgs),
                    };
                    // The shape `hook_rpc_rsp` looks for: (message, bytes).
                    ep.send_to_raw(addr, 0, Box::new((datagram, Bytes::new())))
                });
                // A send error means the network is gone for this node (killed): nothing to do.
                let _ = futures::future::join_all(sends).await;
            }
        }
        if strike {
            crate::nemesis::strike(&world, &name);
            std::future::pending::<()>().await;
        }
    }
}

/// Crash points: the messages of a send round arrive at [`Site::Send`] in order; `true` when the
/// planned crash strikes at one of them (the node's fsyncs are then held until it does).
fn arrive_sends(world: &World, node: &str, rounds: &[(SocketAddr, Vec<Msg>)]) -> bool {
    let mut w = world.lock();
    let mut strike = false;
    for msg in rounds.iter().flat_map(|(_, msgs)| msgs) {
        strike |= w.arrive(node, Site::Send, Label::of_msg(msg));
    }
    if strike && let Some(probe) = &mut w.probe {
        probe.arm(node);
    }
    strike
}

/// How long this seed's BUGGIFY holds `msg` back, if it straggles (drawn from `rng`).
fn straggle(buggify: &Buggify, msg: &Msg, rng: &mut impl Rng) -> Option<u64> {
    let s = buggify.stragglers.as_ref()?;
    (matches(s.class, msg) && rng.gen_range(0..1_000_000) < s.ppm).then_some(s.delay_ms)
}

/// Whether `msg` is of the straggler class `class`.
fn matches(class: StragglerClass, msg: &Msg) -> bool {
    match (class, msg) {
        (StragglerClass::Tcc(phase), Msg::Tcc(_, m)) => m.phase == phase,
        (StragglerClass::TccReply, Msg::TccReply(_))
        | (StragglerClass::Store, Msg::Store { .. }) => true,
        _ => false,
    }
}
