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

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use madsim::net::Endpoint;
use madsim::rand::Rng;
use sut::clock::Now;
use sut::lottery::{ParticipantMsg, ParticipantReply};
use sut::store::{StoreCall, StoreReply};

use crate::history::{EventKind, Op, Outcome};
use crate::world::World;

/// The one port every node listens on.
pub const PORT: u16 = 7000;

/// Everything that travels between nodes.
#[derive(Clone, Debug)]
pub enum Msg {
    /// ID node → database: perform a store call.
    Store {
        /// Request id (matches the reply).
        req: u64,
        /// The call.
        call: StoreCall,
    },
    /// Database → ID node.
    StoreReply {
        /// Request id.
        req: u64,
        /// The answer.
        reply: StoreReply,
    },
    /// Client → service.
    Request {
        /// Per-client operation id.
        op_id: u64,
        /// The operation.
        op: Op,
    },
    /// Service → client.
    Response {
        /// Per-client operation id.
        op_id: u64,
        /// The outcome.
        outcome: Outcome,
    },
    /// Coordinator → participant.
    Tcc(sut::lottery::Participant, ParticipantMsg),
    /// Participant → coordinator.
    TccReply(ParticipantReply),
}

/// One madsim datagram: the messages a node sent to one destination in one send round.
#[derive(Debug)]
struct Datagram(Vec<Msg>);

/// Concurrent receivers per node. madsim delays every receive (and every send) by at least
/// one simulated millisecond (its `sleep` never sleeps less), so a single receive loop caps a
/// node at 1,000 datagrams per simulated second, fewer than a busy node gets from all its
/// peers' send rounds. Idle receivers cost nothing (a parked mailbox wait, no timer).
const RECEIVERS: usize = 16;

/// A node's view of the world: its name, its outgoing queue, the shared state.
#[derive(Clone)]
pub struct Ctx {
    /// The shared state.
    pub world: World,
    /// This node's name.
    pub name: String,
    out: UnboundedSender<(SocketAddr, Msg)>,
}

/// A node's incoming messages.
#[derive(Debug)]
pub struct Inbox {
    rx: UnboundedReceiver<(Vec<Msg>, String)>,
    /// The rest of the last datagram, and its sender.
    pending: VecDeque<Msg>,
    from: String,
}

impl Inbox {
    /// The next message and the name of its sender (`None` once the node is going down).
    pub async fn recv(&mut self) -> Option<(Msg, String)> {
        loop {
            if let Some(msg) = self.pending.pop_front() {
                return Some((msg, self.from.clone()));
            }
            let (msgs, from) = self.rx.next().await?;
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
        for _ in 0..RECEIVERS {
            let (world, ep, tx) = (world.clone(), Arc::clone(&ep), tx.clone());
            madsim::task::spawn(async move {
                while let Some(item) = recv_one(&world, &ep).await {
                    if tx.unbounded_send(item).is_err() {
                        return;
                    }
                }
            });
        }
        let ctx = Self {
            world,
            name: name.to_owned(),
            out,
        };
        let inbox = Inbox {
            rx,
            pending: VecDeque::new(),
            from: String::new(),
        };
        (ctx, inbox)
    }

    /// This node's clock.
    #[must_use]
    pub fn now(&self) -> Now {
        self.world.now(&self.name)
    }

    /// Records an event on this node.
    pub fn record(&self, make: impl FnOnce(u64) -> EventKind) -> u64 {
        self.world.record(&self.name, make)
    }

    /// Queues `msg` for node `to` (sends never block the caller); it leaves in this node's
    /// next send round. A message lost to the packet-loss fault is counted and dropped here.
    pub fn send(&self, to: &str, msg: Msg) {
        let addr = {
            let mut w = self.world.lock();
            let Some(addr) = w.addrs.get(to).copied() else {
                return;
            };
            if w.loss_ppm > 0 && madsim::rand::thread_rng().gen_range(0..1_000_000) < w.loss_ppm {
                w.count("net.dropped_by_loss", 1);
                return;
            }
            addr
        };
        // A closed queue means the node is going down (killed): nothing to do.
        let _ = self.out.unbounded_send((addr, msg));
    }
}

/// The node's sender task: takes everything queued, one datagram per destination, counts
/// what partitions and latency spikes do to each message as its datagram leaves, and sends
/// the datagrams side by side (each madsim send takes a simulated millisecond).
async fn send_rounds(
    world: World,
    name: String,
    ep: Arc<Endpoint>,
    mut queued: UnboundedReceiver<(SocketAddr, Msg)>,
) {
    while let Some((addr, msg)) = queued.next().await {
        let mut rounds: BTreeMap<SocketAddr, Vec<Msg>> = BTreeMap::new();
        rounds.entry(addr).or_default().push(msg);
        while let Ok((addr, msg)) = queued.try_recv() {
            rounds.entry(addr).or_default().push(msg);
        }
        {
            let mut w = world.lock();
            let mut sent = 0;
            let mut dropped = 0;
            for (addr, msgs) in &rounds {
                let n = msgs.len() as u64;
                sent += n;
                let to = w.names.get(&addr.ip());
                if to.is_some_and(|to| w.partitioned(&name, to)) {
                    dropped += n;
                }
            }
            w.count("net.messages", sent);
            w.count("net.dropped_by_partition", dropped);
            if w.latency_spike {
                w.count("net.delayed_by_spike", sent);
            }
        }
        let sends = rounds
            .into_iter()
            .map(|(addr, msgs)| ep.send_to_raw(addr, 0, Box::new(Datagram(msgs))));
        // A send error means the network is gone for this node (killed): nothing to do.
        let _ = futures::future::join_all(sends).await;
    }
}

/// Receives one datagram: its messages in a random order, and the name of its sender.
async fn recv_one(world: &World, ep: &Endpoint) -> Option<(Vec<Msg>, String)> {
    let (payload, from) = ep.recv_from_raw(0).await.ok()?;
    let Datagram(mut msgs) = *payload.downcast::<Datagram>().ok()?;
    let mut rng = madsim::rand::thread_rng();
    for i in (1..msgs.len()).rev() {
        msgs.swap(i, rng.gen_range(0..=i));
    }
    let name = world.lock().names.get(&from.ip()).cloned()?;
    Some((msgs, name))
}
