//! The nemesis: injects the scenario's faults during the safety phase and heals everything at
//! the start of the liveness phase. Every fault is recorded (history and fault spans) and its
//! effects are counted where they happen (see `net` and the nodes).

use std::time::Duration;

use madsim::net::NetSim;
use madsim::rand::{Rng, thread_rng};
use madsim::runtime::Handle;
use madsim::task::spawn;

use crate::history::EventKind;
use crate::nodes::sleep_ms;
use crate::scenario::FaultKind;
use crate::world::{FaultSpan, World};

fn between(range: [u64; 2]) -> u64 {
    thread_rng().gen_range(range[0]..=range[1])
}

fn pick(list: &[String]) -> Option<String> {
    (!list.is_empty()).then(|| list[thread_rng().gen_range(0..list.len())].clone())
}

/// Records a fault; returns its span index (to close it at heal).
fn begin(world: &World, node: &str, kind: FaultKind, detail: String) -> usize {
    world.with(|w| {
        let start_ms = w.sim_ms();
        w.record("nemesis", |_| EventKind::Fault {
            kind: kind.name().into(),
            detail: format!("{node}: {detail}"),
        });
        w.count(&format!("fault.{}", kind.name()), 1);
        w.faults.push(FaultSpan {
            node: node.into(),
            kind: kind.name().into(),
            start_ms,
            end_ms: None,
            detail,
        });
        w.faults.len() - 1
    })
}

fn end(world: &World, span: usize) {
    world.with(|w| {
        let now = w.sim_ms();
        if let Some(f) = w.faults.get_mut(span)
            && f.end_ms.is_none()
        {
            f.end_ms = Some(now);
        }
    });
}

fn node_id(world: &World, node: &str) -> Option<madsim::task::NodeId> {
    world.with(|w| w.node_ids.get(node).copied())
}

fn clog_link(world: &World, from: &str, to: &str) {
    let ids = world.with(|w| {
        *w.clogged_links.entry((from.into(), to.into())).or_default() += 1;
        (w.node_ids.get(from).copied(), w.node_ids.get(to).copied())
    });
    if let (Some(a), Some(b)) = ids {
        NetSim::current().clog_link(a, b);
    }
}

fn unclog_link(world: &World, from: &str, to: &str) {
    let (ids, last) = world.with(|w| {
        let key = (from.to_owned(), to.to_owned());
        let last = match w.clogged_links.get_mut(&key) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                w.clogged_links.remove(&key);
                true
            }
            None => false,
        };
        (
            (w.node_ids.get(from).copied(), w.node_ids.get(to).copied()),
            last,
        )
    });
    if let (Some(a), Some(b), true) = (ids.0, ids.1, last) {
        NetSim::current().unclog_link(a, b);
    }
}

fn clog_node(world: &World, node: &str) {
    world.with(|w| *w.clogged_nodes.entry(node.into()).or_default() += 1);
    if let Some(id) = node_id(world, node) {
        NetSim::current().clog_node(id);
    }
}

fn unclog_node(world: &World, node: &str) {
    let last = world.with(|w| match w.clogged_nodes.get_mut(node) {
        Some(n) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => {
            w.clogged_nodes.remove(node);
            true
        }
        None => false,
    });
    if let (true, Some(id)) = (last, node_id(world, node)) {
        NetSim::current().unclog_node(id);
    }
}

/// Crashes a node's disk (pending writes lost, maybe a torn record) and kills the process.
fn kill(world: &World, node: &str) {
    let tear = thread_rng().gen_bool(0.5);
    world.with(|w| {
        let loss = match node {
            "db" => w.disks.db.crash(tear),
            "token" => w.disks.token.crash(tear),
            "coord" => w.disks.coord.crash(tear),
            other => w
                .disks
                .parts
                .get_mut(other)
                .map(|wal| wal.crash(tear))
                .unwrap_or_default(),
        };
        w.count("crash.lost_pending_writes", loss.lost);
        w.count("crash.torn_writes", u64::from(loss.torn));
        w.count("crash.kills", 1);
        if node.starts_with("id") {
            // An ID node keeps its segment buffers and Snowflake state only in memory: the
            // kill strands its claimed-but-unissued IDs and its worker lease.
            w.count("crash.lost_id_buffers", 1);
        }
        w.killed.insert(node.to_owned());
    });
    if let Some(id) = node_id(world, node) {
        Handle::current().kill(id);
    }
}

/// Restarts a killed node (its clock keeps its offset; its monotonic clock starts again).
fn restart(world: &World, node: &str) {
    let was_killed = world.with(|w| {
        let was = w.killed.remove(node);
        if was {
            let now = w.sim_ms();
            w.clocks.entry(node.to_owned()).or_default().reboot(now);
        }
        was
    });
    if let (true, Some(id)) = (was_killed, node_id(world, node)) {
        Handle::current().restart(id);
    }
}

fn resume(world: &World, node: &str) {
    let since = world.with(|w| w.paused.remove(node));
    if let (Some(_), Some(id)) = (since, node_id(world, node)) {
        Handle::current().resume(id);
    }
}

/// Injects faults until simulated time `stop_ms`.
pub async fn run(world: World, stop_ms: u64) {
    let (kinds, faults) = world.with(|w| (w.spec.faults.clone(), w.spec.scenario.faults.clone()));
    let total: u32 = kinds.iter().map(|(_, weight)| weight).sum();
    if total == 0 {
        return;
    }
    loop {
        madsim::time::sleep(Duration::from_millis(between(faults.interval_ms))).await;
        if world.sim_ms() >= stop_ms {
            return;
        }
        let mut roll = thread_rng().gen_range(0..total);
        let kind = kinds
            .iter()
            .find(|(_, weight)| {
                if roll < *weight {
                    true
                } else {
                    roll -= weight;
                    false
                }
            })
            .map(|(kind, _)| *kind)
            .expect("weights sum to total");
        inject(&world, kind, between(faults.duration_ms));
    }
}

fn inject(world: &World, kind: FaultKind, duration_ms: u64) {
    let (servers, all, faults, lease_ms) = world.with(|w| {
        let targets = &w.spec.scenario.faults.targets;
        let servers: Vec<String> = w
            .server_nodes()
            .into_iter()
            .filter(|n| targets.is_empty() || targets.contains(n))
            .filter(|n| !w.killed.contains(n) && !w.paused.contains_key(n))
            .collect();
        (
            servers,
            w.addrs.keys().cloned().collect::<Vec<_>>(),
            w.spec.scenario.faults.clone(),
            w.spec.scenario.ids.lease_ms,
        )
    });
    let mut rng = thread_rng();
    match kind {
        FaultKind::Partition => {
            let mut side: Vec<String> = all.iter().filter(|_| rng.gen_bool(0.4)).cloned().collect();
            if side.is_empty() || side.len() == all.len() {
                side = vec![all[rng.gen_range(0..all.len())].clone()];
            }
            let rest: Vec<String> = all.iter().filter(|n| !side.contains(n)).cloned().collect();
            let one_way = rng.gen_bool(0.3);
            let mode = if one_way {
                "one-way"
            } else if side.len() * 2 < all.len() {
                "minority"
            } else {
                "majority"
            };
            let mut links = Vec::new();
            for a in &side {
                for b in &rest {
                    links.push((a.clone(), b.clone()));
                    if !one_way {
                        links.push((b.clone(), a.clone()));
                    }
                }
            }
            for (a, b) in &links {
                clog_link(world, a, b);
            }
            let span = begin(world, "net", kind, format!("{mode} {side:?} | rest"));
            let world = world.clone();
            spawn(async move {
                sleep_ms(duration_ms).await;
                for (a, b) in &links {
                    unclog_link(&world, a, b);
                }
                end(&world, span);
            });
        }
        FaultKind::Swizzle => {
            let mut nodes: Vec<String> =
                all.iter().filter(|_| rng.gen_bool(0.5)).cloned().collect();
            if nodes.is_empty() {
                nodes.push(all[0].clone());
            }
            let span = begin(world, "net", kind, format!("{nodes:?}"));
            let world = world.clone();
            spawn(async move {
                for node in &nodes {
                    clog_node(&world, node);
                    sleep_ms(thread_rng().gen_range(20..200)).await;
                }
                sleep_ms(duration_ms).await;
                let mut order = nodes.clone();
                for i in (1..order.len()).rev() {
                    order.swap(i, thread_rng().gen_range(0..=i));
                }
                for node in &order {
                    unclog_node(&world, node);
                    sleep_ms(thread_rng().gen_range(20..200)).await;
                }
                end(&world, span);
            });
        }
        FaultKind::Loss => {
            let ppm = rng.gen_range(1..=faults.loss_pct_max.max(1)) * 10_000;
            world.with(|w| w.loss_ppm = ppm);
            let span = begin(world, "net", kind, format!("{}% loss", ppm / 10_000));
            let world = world.clone();
            spawn(async move {
                sleep_ms(duration_ms).await;
                world.with(|w| w.loss_ppm = 0);
                end(&world, span);
            });
        }
        FaultKind::Latency => {
            let high = rng.gen_range(50..500);
            NetSim::current().update_config(|c| {
                c.send_latency = Duration::from_millis(high / 2)..Duration::from_millis(high)
            });
            world.with(|w| w.latency_spike = true);
            let span = begin(world, "net", kind, format!("latency up to {high} ms"));
            let world = world.clone();
            spawn(async move {
                sleep_ms(duration_ms).await;
                NetSim::current().update_config(|c| {
                    c.send_latency = Duration::from_millis(1)..Duration::from_millis(10)
                });
                world.with(|w| w.latency_spike = false);
                end(&world, span);
            });
        }
        FaultKind::Kill => {
            let Some(node) = pick(&servers) else { return };
            kill(world, &node);
            let span = begin(world, &node, kind, format!("down for {duration_ms} ms"));
            let world = world.clone();
            spawn(async move {
                sleep_ms(duration_ms).await;
                restart(&world, &node);
                end(&world, span);
            });
        }
        FaultKind::Pause => {
            let Some(node) = pick(&servers) else { return };
            world.with(|w| {
                let now = w.sim_ms();
                w.paused.insert(node.clone(), now);
                w.count("pause.stalled_ms", duration_ms);
                if node.starts_with("id") && duration_ms > lease_ms {
                    w.count("pause.outlived_lease", 1);
                }
            });
            if let Some(id) = node_id(world, &node) {
                Handle::current().pause(id);
            }
            let span = begin(world, &node, kind, format!("paused for {duration_ms} ms"));
            let world = world.clone();
            spawn(async move {
                sleep_ms(duration_ms).await;
                resume(&world, &node);
                end(&world, span);
            });
        }
        FaultKind::ClockBump => {
            let Some(node) = pick(&servers) else { return };
            // Log-uniform magnitude: millisecond bumps (inside Snowflake's wait window) as
            // often as minute-long ones.
            let max = faults.bump_ms_max.max(2) as f64;
            let magnitude = max.powf(rng.gen_range(0.0..1.0)).round() as i64;
            let delta = if rng.gen_bool(0.5) {
                -magnitude
            } else {
                magnitude
            };
            world.with(|w| w.adjust_clock(&node, |c, _| c.bump(delta)));
            let span = begin(world, &node, kind, format!("{delta:+} ms"));
            end(world, span);
        }
        FaultKind::ClockStrobe => {
            let Some(node) = pick(&servers) else { return };
            let delta = rng.gen_range(2..2_000);
            let period = rng.gen_range(5..100);
            let span = begin(
                world,
                &node,
                kind,
                format!("±{delta} ms every {period} ms for {duration_ms} ms"),
            );
            let world = world.clone();
            spawn(async move {
                let flips = (duration_ms / period).max(2) & !1;
                for i in 0..flips {
                    let d = if i % 2 == 0 { -delta } else { delta };
                    world.with(|w| w.adjust_clock(&node, |c, _| c.bump(d)));
                    sleep_ms(period).await;
                }
                end(&world, span);
            });
        }
        FaultKind::ClockDrift => {
            let Some(node) = pick(&servers) else { return };
            let ppm = rng.gen_range(-faults.drift_ppm_max..=faults.drift_ppm_max);
            world.with(|w| {
                let now = w.sim_ms();
                w.clocks
                    .entry(node.clone())
                    .or_default()
                    .set_drift(now, ppm);
            });
            let span = begin(
                world,
                &node,
                kind,
                format!("{ppm:+} ppm for {duration_ms} ms"),
            );
            let world = world.clone();
            spawn(async move {
                sleep_ms(duration_ms).await;
                world.with(|w| {
                    w.adjust_clock(&node, |c, now| c.set_drift(now, 0));
                    w.count(
                        "clock.drifted_ms",
                        ppm.unsigned_abs() * duration_ms / 1_000_000,
                    );
                });
                end(&world, span);
            });
        }
        FaultKind::ClockRestart => {
            let ids: Vec<String> = servers
                .iter()
                .filter(|n| n.starts_with("id"))
                .cloned()
                .collect();
            let Some(node) = pick(&ids) else { return };
            let back = rng.gen_range(10..5_000);
            world.with(|w| w.adjust_clock(&node, |c, _| c.bump(-back)));
            kill(world, &node);
            let span = begin(
                world,
                &node,
                kind,
                format!("clock -{back} ms, then restart"),
            );
            let world = world.clone();
            spawn(async move {
                sleep_ms(thread_rng().gen_range(10..100)).await;
                restart(&world, &node);
                end(&world, span);
            });
        }
    }
}

/// Heals every fault: the start of the liveness phase.
pub fn heal_all(world: &World) {
    let (links, nodes, paused, killed, clocks) = world.with(|w| {
        w.loss_ppm = 0;
        w.latency_spike = false;
        (
            w.clogged_links.keys().cloned().collect::<Vec<_>>(),
            w.clogged_nodes.keys().cloned().collect::<Vec<_>>(),
            w.paused.keys().cloned().collect::<Vec<_>>(),
            w.killed.iter().cloned().collect::<Vec<_>>(),
            w.clocks.keys().cloned().collect::<Vec<_>>(),
        )
    });
    NetSim::current()
        .update_config(|c| c.send_latency = Duration::from_millis(1)..Duration::from_millis(10));
    for (a, b) in links {
        world.with(|w| w.clogged_links.insert((a.clone(), b.clone()), 1));
        unclog_link(world, &a, &b);
    }
    for node in nodes {
        world.with(|w| w.clogged_nodes.insert(node.clone(), 1));
        unclog_node(world, &node);
    }
    for node in paused {
        resume(world, &node);
    }
    for node in killed {
        restart(world, &node);
    }
    world.with(|w| {
        let now = w.sim_ms();
        for node in clocks {
            w.adjust_clock(&node, |c, now| c.reset(now));
        }
        for span in &mut w.faults {
            span.end_ms.get_or_insert(now);
        }
    });
}
