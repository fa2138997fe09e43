//! Messages between simulated nodes, over madsim's network.
//!
//! Every send goes through [`Ctx::send`], which also counts what the faults did to it: a
//! message into a partition (madsim drops it: clogged datagrams are dropped), a message lost
//! to the packet-loss fault (dropped here, from madsim's seeded RNG), a message sent during a
//! latency spike. That is the fault-coverage bookkeeping: a fault that touched no message
//! took no effect.

use std::net::SocketAddr;
use std::sync::Arc;

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

/// Concurrent receivers per node. madsim delays every receive (and every send) by at least
/// one simulated millisecond (its `sleep` never sleeps less), so a single receive loop caps a
/// node at 1,000 messages per simulated second. Several receivers (and a task per send) lift
/// that cap; the network reorders messages anyway (1–10 ms random latency).
const RECEIVERS: usize = 32;

/// A node's view of the world: its name, its endpoint, the shared state.
#[derive(Clone)]
pub struct Ctx {
    /// The shared state.
    pub world: World,
    /// This node's name.
    pub name: String,
    ep: Arc<Endpoint>,
}

/// A node's incoming messages.
#[derive(Debug)]
pub struct Inbox {
    rx: futures::channel::mpsc::UnboundedReceiver<(Msg, String)>,
}

impl Inbox {
    /// The next message and the name of its sender (`None` once the node is going down).
    pub async fn recv(&mut self) -> Option<(Msg, String)> {
        use futures::StreamExt;
        self.rx.next().await
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
    /// Binds this node's endpoint and starts its receivers.
    pub async fn bind(world: World, name: &str) -> (Self, Inbox) {
        let ep = Endpoint::bind(("0.0.0.0", PORT))
            .await
            .expect("bind the node's endpoint");
        let ctx = Self {
            world,
            name: name.to_owned(),
            ep: Arc::new(ep),
        };
        let (tx, rx) = futures::channel::mpsc::unbounded();
        for _ in 0..RECEIVERS {
            let (ctx, tx) = (ctx.clone(), tx.clone());
            madsim::task::spawn(async move {
                while let Some(item) = ctx.recv_one().await {
                    if tx.unbounded_send(item).is_err() {
                        return;
                    }
                }
            });
        }
        (ctx, Inbox { rx })
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

    /// Sends `msg` to node `to` (in its own task: sends never block the caller), counting
    /// what the faults do to it.
    pub fn send(&self, to: &str, msg: Msg) {
        let addr = {
            let mut w = self.world.lock();
            let Some(addr) = w.addrs.get(to).copied() else {
                return;
            };
            if w.partitioned(&self.name, to) {
                w.count("net.dropped_by_partition", 1);
            }
            if w.loss_ppm > 0 && madsim::rand::thread_rng().gen_range(0..1_000_000) < w.loss_ppm {
                w.count("net.dropped_by_loss", 1);
                return;
            }
            if w.latency_spike {
                w.count("net.delayed_by_spike", 1);
            }
            addr
        };
        self.world.count("net.messages", 1);
        let ep = Arc::clone(&self.ep);
        // A send error means the network is gone for this node (killed): nothing to do.
        madsim::task::spawn(async move {
            let _ = ep.send_to_raw(addr, 0, Box::new(msg)).await;
        });
    }

    /// Receives one message and the name of its sender.
    async fn recv_one(&self) -> Option<(Msg, String)> {
        let (payload, from) = self.ep.recv_from_raw(0).await.ok()?;
        let msg = *payload.downcast::<Msg>().ok()?;
        let name = self.name_of(from)?;
        Some((msg, name))
    }

    fn name_of(&self, addr: SocketAddr) -> Option<String> {
        let w = self.world.lock();
        w.addrs
            .iter()
            .find(|(_, a)| a.ip() == addr.ip())
            .map(|(name, _)| name.clone())
    }
}
