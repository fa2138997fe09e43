//! Speed of the simulator against a bare madsim baseline, measured in the same process.
//!
//! The baseline is a madsim ping-pong with the same number of nodes: every node keeps 32
//! messages in flight to random peers and answers each message it receives, over the same
//! `Endpoint::send_to_raw`/`recv_from_raw` path the cluster uses. Its messages per wall
//! second is the most madsim itself can carry on this machine; the cluster's rate, as a ratio
//! to it, says what the bench's own machinery (state machines, history, checkers) costs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use madsim::net::Endpoint;
use madsim::rand::{Rng, thread_rng};
use madsim::runtime::{Handle, Runtime};
use serde::{Deserialize, Serialize};

use crate::scenario::Scenario;

/// Messages a baseline node keeps in flight.
const INFLIGHT: usize = 32;

/// One measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Rate {
    /// Messages delivered (the cluster: protocol messages sent).
    pub messages: u64,
    /// madsim datagrams carried (the baseline: one per message; the cluster: one per
    /// destination per send round, see `net`).
    #[serde(default)]
    pub datagrams: u64,
    /// Simulated seconds.
    pub sim_seconds: f64,
    /// Wall seconds.
    pub wall_seconds: f64,
}

impl Rate {
    /// Messages per wall second.
    #[must_use]
    pub fn per_wall_second(&self) -> f64 {
        self.messages as f64 / self.wall_seconds.max(1e-9)
    }

    /// madsim datagrams per wall second.
    #[must_use]
    pub fn datagrams_per_wall_second(&self) -> f64 {
        self.datagrams as f64 / self.wall_seconds.max(1e-9)
    }

    /// Simulated seconds per wall second.
    #[must_use]
    pub fn compression(&self) -> f64 {
        self.sim_seconds / self.wall_seconds.max(1e-9)
    }
}

/// The bare madsim ping-pong baseline with `nodes` nodes for `sim_ms` simulated ms.
#[must_use]
pub fn ping_pong(nodes: usize, sim_ms: u64, seed: u64) -> Rate {
    let delivered = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let runtime = Runtime::with_seed_and_config(seed, madsim::Config::default());
    let counter = Arc::clone(&delivered);
    runtime.block_on(async move {
        let addrs: Vec<SocketAddr> = (0..nodes)
            .map(|i| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, i as u8 + 1)), 9000))
            .collect();
        for addr in &addrs {
            let (addrs, counter) = (addrs.clone(), Arc::clone(&counter));
            Handle::current()
                .create_node()
                .ip(addr.ip())
                .init(move || {
                    let (addrs, counter) = (addrs.clone(), Arc::clone(&counter));
                    async move {
                        let ep = Arc::new(Endpoint::bind(("0.0.0.0", 9000)).await.expect("bind"));
                        for _ in 0..INFLIGHT {
                            let to = addrs[thread_rng().gen_range(0..addrs.len())];
                            let ep = Arc::clone(&ep);
                            madsim::task::spawn(async move {
                                let _ = ep.send_to_raw(to, 0, Box::new(0u64)).await;
                            });
                        }
                        loop {
                            let Ok((_, from)) = ep.recv_from_raw(0).await else {
                                return;
                            };
                            counter.fetch_add(1, Ordering::Relaxed);
                            let ep = Arc::clone(&ep);
                            madsim::task::spawn(async move {
                                let _ = ep.send_to_raw(from, 0, Box::new(0u64)).await;
                            });
                        }
                    }
                })
                .build();
        }
        madsim::time::sleep(Duration::from_millis(sim_ms)).await;
    });
    let messages = delivered.load(Ordering::Relaxed);
    Rate {
        messages,
        datagrams: messages,
        sim_seconds: sim_ms as f64 / 1_000.0,
        wall_seconds: started.elapsed().as_secs_f64(),
    }
}

/// The cluster running `scenario` on `seeds`, single-threaded: messages sent and simulated
/// seconds per wall second.
#[must_use]
pub fn cluster(scenario: &Scenario, seeds: &[u64]) -> Rate {
    let started = Instant::now();
    let mut messages = 0;
    let mut datagrams = 0;
    let mut sim_ms = 0;
    for seed in seeds {
        let outcome = crate::run::run_seed(scenario, *seed, false);
        messages += outcome.coverage.get("net.messages").copied().unwrap_or(0);
        datagrams += outcome.datagrams;
        sim_ms += outcome.sim_ms;
    }
    Rate {
        messages,
        datagrams,
        sim_seconds: sim_ms as f64 / 1_000.0,
        wall_seconds: started.elapsed().as_secs_f64(),
    }
}
