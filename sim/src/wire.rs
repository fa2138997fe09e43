//! The wire: madsim's UDP path, step for step, without its costs.
//!
//! By default ([`Transport::Wire`]) the send rounds of [`net`](crate::net) do not hand their
//! datagrams to madsim's `Endpoint::send_to_raw` but carry them here: a copy of what madsim's UDP
//! path does with a datagram, draw for draw and timer for timer, at a fraction of its cost
//! (madsim formats the destination address into a `String` for its virtual-server table and looks
//! the route up in several SipHash maps on every send: 13–15 % of a run's instructions). Per
//! datagram, madsim's `NetSim::send` (madsim 0.2.34):
//!
//! 1. draws a delay of 0..5 µs from the run's RNG (1..5 s under madsim's own buggify, which this
//!    bench never turns on) and sleeps it, which is at least one simulated ms ([`rand_delay`]);
//! 2. drops the datagram if the link is clogged: the sender clogged out, the receiver clogged
//!    in, or the directed link clogged, which is exactly the nemesis's partitions
//!    ([`WorldState::partitioned`](crate::world::WorldState::partitioned));
//! 3. draws packet loss (one `u64`, even at madsim's loss rate of 0), counts the datagram, draws
//!    its latency from the network's latency range;
//! 4. drops it if the destination has no bound endpoint (a killed node, or one restarting);
//! 5. sets a timer at that latency whose callback hands the datagram to the destination's
//!    delivery hook ([`deliver`]).
//!
//! Steps 3 and 4 are [`Wire::carry`], step 5 [`arm`]. They run in this order, on the same RNG,
//! with a madsim `Sleep` for each timer (polled once with a waker that delivers, so that its
//! timer lands in madsim's timer heap at the same instant and deadline as madsim's own), and a
//! send round polls its datagrams as `join_all` polled madsim's send futures. A run on the wire
//! is therefore the same run as on madsim's UDP path, the same history byte for byte: the test
//! `the_wire_replays_madsims_udp_path` runs seeds of every named scenario both ways
//! ([`Transport::MadsimUdp`] keeps madsim's path) and compares the hashes of their histories.
//! It is what fails if a madsim upgrade changes the draws of its UDP path.

use std::net::IpAddr;
use std::ops::Range;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};
use std::time::Duration;

use futures::future::Future;
use madsim::rand::{GlobalRng, Rng, thread_rng};
use madsim::time::Sleep;
use rustc_hash::FxHashMap;

use crate::chan::Sender;
use crate::clock::SimClock;
use crate::msg::Msg;

/// How datagrams travel between nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// [`Wire`]: madsim's UDP path, step for step, without its costs.
    #[default]
    Wire,
    /// madsim's own UDP path (`Endpoint::send_to_raw` and the delivery hook), kept to check that
    /// the wire replays it.
    MadsimUdp,
}

/// Where a node's incoming datagrams go: the messages of one datagram and the sender's name.
pub type InboxSender = Sender<(Vec<Msg>, Arc<str>)>;

/// The network as madsim's UDP path sees it, for [`Transport::Wire`]: which nodes have an
/// endpoint bound (and where their datagrams go), the latency range, and how many datagrams
/// passed. Clogged links are the world's.
#[derive(Debug)]
pub struct Wire {
    /// The inbox of every node whose endpoint is bound, by IP (madsim's socket table: bound
    /// when the node's `Endpoint::bind` returns, cleared when madsim kills the node).
    bound: FxHashMap<IpAddr, InboxSender>,
    /// madsim's `net::Config::send_latency`.
    send_latency: Range<Duration>,
    /// Datagrams that passed the link (madsim's `Stat::msg_count`).
    datagrams: u64,
}

impl Default for Wire {
    fn default() -> Self {
        Self {
            bound: FxHashMap::default(),
            send_latency: madsim::net::Config::default().send_latency,
            datagrams: 0,
        }
    }
}

impl Wire {
    /// Datagrams that passed the link so far.
    #[must_use]
    pub fn datagrams(&self) -> u64 {
        self.datagrams
    }

    /// Sets the latency range (as `NetSim::update_config` sets madsim's).
    pub fn set_send_latency(&mut self, latency: Range<Duration>) {
        // A latency under a millisecond would be rounded up by madsim's `Sleep` (the wire's
        // timer) but not by madsim's own timer; the nemesis never sets one (`latency_ms` ≥ 2).
        assert!(
            latency.start >= Duration::from_millis(1),
            "the wire needs latencies of at least 1 ms, got {latency:?}"
        );
        self.send_latency = latency;
    }

    /// The node at `ip` bound its endpoint; its datagrams go to `inbox` (replacing those of its
    /// previous incarnation).
    pub fn bind(&mut self, ip: IpAddr, inbox: InboxSender) {
        self.bound.insert(ip, inbox);
    }

    /// The node at `ip` was killed: madsim closed its sockets.
    pub fn unbind(&mut self, ip: IpAddr) {
        self.bound.remove(&ip);
    }

    /// Steps 2–4 for a datagram to `to` whose link is `clogged` or not: its latency and the
    /// destination's inbox, or `None` when it is dropped.
    pub fn carry(
        &mut self,
        rng: &mut GlobalRng,
        clogged: bool,
        to: IpAddr,
    ) -> Option<(Duration, InboxSender)> {
        if clogged {
            return None;
        }
        // madsim's packet loss: its `packet_loss_rate`, 0 here (loss is the bench's own, drawn
        // when a message is queued), is still a draw.
        if rng.gen_bool(0.0) {
            return None;
        }
        self.datagrams += 1;
        let latency = rng.gen_range(self.send_latency.clone());
        let inbox = self.bound.get(&to)?;
        Some((latency, inbox.clone()))
    }
}

/// Step 1, madsim's `rand_delay`: a delay of 0..5 µs drawn from the run's RNG (1..5 s under
/// madsim's own buggify), slept as a madsim `Sleep` (at least one simulated ms).
pub fn rand_delay(clock: &SimClock, rng: &mut GlobalRng) -> Sleep {
    let mut delay = Duration::from_micros(rng.gen_range(0..5));
    if madsim::buggify::buggify_with_prob(0.1) {
        delay = Duration::from_secs(rng.gen_range(1..5));
    }
    clock.sleep(delay)
}

/// Step 5: the latency timer, a madsim `Sleep` (deadline now + `latency`, as madsim's own timer)
/// polled once with a waker that delivers the datagram to `inbox` when the timer fires.
pub fn arm(
    clock: &SimClock,
    latency: Duration,
    msgs: Vec<Msg>,
    from: Arc<str>,
    inbox: InboxSender,
) {
    let in_flight = Waker::from(Arc::new(InFlight {
        datagram: Mutex::new(Some((msgs, from))),
        inbox,
    }));
    let mut timer = clock.sleep(latency);
    let armed = Pin::new(&mut timer)
        .poll(&mut Context::from_waker(&in_flight))
        .is_pending();
    debug_assert!(armed, "a latency of at least 1 ms is still ahead");
}

/// Hands a datagram's messages to the destination's inbox, in a random order (madsim's seeded
/// RNG): what the delivery hook does on either transport. A closed inbox means that incarnation
/// is gone: the datagram is lost.
pub fn deliver(mut msgs: Vec<Msg>, from: Arc<str>, inbox: &InboxSender) {
    let mut rng = thread_rng();
    for i in (1..msgs.len()).rev() {
        msgs.swap(i, rng.gen_range(0..=i));
    }
    let _ = inbox.send((msgs, from));
}

/// A datagram in flight on the wire: the waker of its latency timer, which delivers it.
#[derive(Debug)]
struct InFlight {
    datagram: Mutex<Option<(Vec<Msg>, Arc<str>)>>,
    inbox: InboxSender,
}

impl Wake for InFlight {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let taken = self.datagram.lock().expect("datagram lock").take();
        if let Some((msgs, from)) = taken {
            deliver(msgs, from, &self.inbox);
        }
    }
}
