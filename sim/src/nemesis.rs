//! The nemesis: injects the scenario's faults during the safety phase and heals everything at
//! the start of the liveness phase. Every fault is recorded (history and fault spans) and its
//! effects are counted where they happen (see `net` and the nodes).

use std::time::Duration;

use madsim::net::NetSim;
use madsim::rand::{Rng, thread_rng};
use madsim::runtime::Handle;
use madsim::task::spawn;

use crate::buggify::CrashSite;
use crate::clock::sleep_ms;
use crate::crashpoints::{Label, Site};
use crate::faults::{self, Targets};
use crate::history::EventKind;
use crate::scenario::{FaultKind, ScheduledFault};
use crate::world::{FaultSpan, World};

/// madsim's default latency range (`madsim::net::Config::default`), restored when a latency
/// spike ends.
const DEFAULT_SEND_LATENCY: std::ops::Range<Duration> =
    Duration::from_millis(1)..Duration::from_millis(10);

fn between(range: [u64; 2]) -> u64 {
    thread_rng().gen_range(range[0]..=range[1])
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

/// Clogs the link, unless the faults have been healed (a multi-step fault still running).
fn clog_link(world: &World, from: &str, to: &str) {
    if world.with(|w| w.healed) {
        return;
    }
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

/// Clogs the node, unless the faults have been healed (a swizzle still reaching its next node).
fn clog_node(world: &World, node: &str) {
    if world.with(|w| w.healed) {
        return;
    }
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

/// Crashes a node's disk (pending writes lost, and the last record torn when `tear`) and kills
/// the process.
fn kill(world: &World, node: &str, tear: bool) {
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
        if let Some(probe) = &mut w.probe {
            probe.node_down(node);
        }
    });
    if let Some(id) = node_id(world, node) {
        world.with(|w| {
            let ip = w.addrs[node].ip();
            w.wire.unbind(ip);
        });
        Handle::current().kill(id);
    }
}

/// Sets the network's latency range, on madsim's network and on the wire (`net::Wire`).
fn set_send_latency(world: &World, latency: std::ops::Range<Duration>) {
    world.with(|w| w.wire.set_send_latency(latency.clone()));
    NetSim::current().update_config(|c| c.send_latency = latency);
}

/// Restarts a killed node (its clock keeps its offset; its monotonic clock starts again).
fn restart(world: &World, node: &str) {
    let was_killed = world.with(|w| {
        let was = w.killed.remove(node);
        if was {
            let now = w.sim_ms();
            w.clocks.entry(node).reboot(now);
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

/// Injects faults until simulated time `stop_ms`: the scenario's scripted schedule when it has
/// one, otherwise random faults of the kinds this seed enabled.
pub async fn run(world: World, stop_ms: u64) {
    let schedule = world.with(|w| w.spec.scenario.schedule.clone());
    if let Some(schedule) = schedule {
        play(&world, schedule, stop_ms).await;
        return;
    }
    let (kinds, faults) = world.with(|w| (w.spec.faults.clone(), w.spec.scenario.faults.clone()));
    let total: u32 = kinds.iter().map(|(_, weight)| weight).sum();
    if total == 0 {
        return;
    }
    loop {
        madsim::time::sleep(Duration::from_millis(between(faults.every_ms.bounds()))).await;
        // (A crash point's run may end its safety phase before `stop_ms`.)
        if world.sim_ms() >= stop_ms || world.with(|w| w.workload_stopped) {
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
        let targets = live_targets(&world);
        if let Some(space) = faults::space(kind, &faults, &targets) {
            let mut event = space.draw(&mut thread_rng(), world.sim_ms());
            drift_at_bound(&world, &mut event);
            bump_at_leeway(&world, &mut event);
            if !land_at_boundary(&world, &event) {
                inject(&world, &event, stop_ms);
            }
        }
    }
}

/// BUGGIFY: a seed that puts clock drift at its bound drifts at `[faults] drift_ppm_max`
/// exactly, in the drawn direction.
fn drift_at_bound(world: &World, event: &mut ScheduledFault) {
    let (on, bound) = world.with(|w| {
        (
            w.spec.buggify.drift_at_bound,
            w.spec.scenario.faults.drift_ppm_max,
        )
    });
    if let (true, FaultKind::ClockDrift, Some(ppm)) = (on, event.fault, event.ppm) {
        let bound = bound.clamp(1, 1_000_000);
        event.ppm = Some(if ppm < 0 { -bound } else { bound });
    }
}

/// BUGGIFY: a seed that bumps the token node's clock at the JWT leeway moves it back by the
/// leeway plus or minus up to half a second (`token.jwt_within_leeway`,
/// `token.jwt_refused_past_leeway`).
fn bump_at_leeway(world: &World, event: &mut ScheduledFault) {
    let on = world.with(|w| w.spec.buggify.bump_at_leeway);
    if on && event.fault == FaultKind::ClockBump && event.node.as_deref() == Some("token") {
        let leeway_ms = i64::try_from(sut::token::JwtConfig::default().leeway_ms).unwrap_or(0);
        let off_ms = thread_rng().gen_range(-500..=500);
        event.delta_ms = Some(-(leeway_ms + off_ms).max(1));
    }
}

/// BUGGIFY: a seed that lands clock bumps at decision boundaries arms a bump of an ID node to
/// land, at the node's next ID decision, a millisecond before, at or after one of its
/// generators' boundaries ([`land_clock`]); `true` when it did (the drawn bump is not applied).
/// One landing at a time.
fn land_at_boundary(world: &World, event: &ScheduledFault) -> bool {
    let Some(node) = event.node.as_deref() else {
        return false;
    };
    let on = world.with(|w| w.spec.buggify.clock_at_boundary && w.landing.is_none());
    if !on || event.fault != FaultKind::ClockBump || !node.starts_with("id") {
        return false;
    }
    arm_landing(world, node, None, event.delta_ms.unwrap_or(0));
    true
}

/// Arms a landing for `node` (at a boundary named `want`, or any), a millisecond before, at or
/// after it, which one and where decided by `drawn` (a value the fault drew already): the
/// landing draws nothing from the run's RNG, so the run goes on as the bump's would have but
/// for the clock.
fn arm_landing(world: &World, node: &str, want: Option<&'static str>, drawn: i64) {
    let drawn = drawn.unsigned_abs();
    let landing = crate::world::Landing {
        node: node.to_owned(),
        pick: u32::try_from(drawn % 1024).unwrap_or(0),
        offset_ms: i64::try_from(drawn % 3).unwrap_or(1) - 1,
        want,
    };
    world.with(|w| {
        w.landing = Some(landing);
        w.count("clock.landings_armed", 1);
    });
}

/// The node this task runs on is about to decide on an ID with its generators declaring
/// `boundaries`: when a landing is armed for it (and the faults have not healed), its wall
/// clock is stepped so that it reads one of them (wall-clock ones only) plus the landing's
/// offset, recorded as a `clock_bump` fault. Returns whether the clock moved (the caller reads
/// it again). A node with no wall-clock boundary keeps the landing for its next decision.
pub fn land_clock(world: &World, node: &str, boundaries: &[sut::boundary::Boundary]) -> bool {
    let landed = world.with(|w| {
        let landing = w.landing.as_ref().filter(|l| l.node == node)?;
        if w.healed || w.workload_stopped {
            w.landing = None;
            return None;
        }
        // Within the scenario's own clock bumps: a boundary further than its largest step is
        // outside the faults it asks for.
        let now = i64::try_from(w.now(node).wall_ms).unwrap_or(i64::MAX);
        let reach = i64::try_from(w.spec.scenario.faults.bump_ms_max).unwrap_or(i64::MAX);
        let mut wall: Vec<&sut::boundary::Boundary> = boundaries
            .iter()
            .filter(|b| b.clock == sut::boundary::ClockKind::Wall)
            .filter(|b| landing.want.is_none_or(|want| b.name == want))
            .filter(|b| {
                i64::try_from(b.at_ms)
                    .is_ok_and(|at| at.saturating_sub(now).saturating_abs() <= reach)
            })
            .collect();
        if wall.is_empty() {
            return None;
        }
        wall.sort();
        let bound = wall[landing.pick as usize % wall.len()];
        let offset_ms = landing.offset_ms;
        let target = i64::try_from(bound.at_ms).unwrap_or(i64::MAX) + offset_ms;
        w.landing = None;
        w.count("clock.landed_at_boundary", 1);
        Some((target - now, format!("{} {offset_ms:+} ms", bound.name)))
    });
    let Some((delta, at)) = landed else {
        return false;
    };
    let kind = FaultKind::ClockBump;
    world.with(|w| w.adjust_clock(node, |c, _| c.bump(delta)));
    let span = begin(world, node, kind, format!("{delta:+} ms, landed at {at}"));
    end(world, span);
    true
}

/// Plays a scripted schedule: each event at its time, with its own parameters, drawing
/// nothing from the RNG (so removing one event perturbs the rest of the run as little as
/// possible). A fault without a duration lasts until the safety phase ends.
async fn play(world: &World, mut schedule: Vec<ScheduledFault>, stop_ms: u64) {
    schedule.sort_by_key(|e| e.at_ms);
    for event in schedule {
        if event.at_ms >= stop_ms {
            return;
        }
        let now = world.sim_ms();
        if event.at_ms > now {
            sleep_ms(event.at_ms - now).await;
        }
        if world.with(|w| w.workload_stopped) {
            return;
        }
        inject(world, &event, stop_ms);
    }
}

/// Carries out one event, the random nemesis's or a schedule's: a fault without a duration
/// lasts until the safety phase ends (`stop_ms`); an event whose node is down is skipped and
/// recorded as such.
fn inject(world: &World, event: &ScheduledFault, stop_ms: u64) {
    let duration_ms = event
        .down_ms
        .unwrap_or_else(|| stop_ms.saturating_sub(event.at_ms).max(1));
    match scripted(world, event) {
        Ok(action) => apply(world, action, duration_ms),
        Err(why) => {
            world.record("nemesis", |_| EventKind::Fault {
                kind: event.fault.name().into(),
                detail: format!("skipped: {why}"),
            });
        }
    }
}

/// Where the random nemesis may strike now: every node for network faults, and the server
/// nodes that are up (and among the scenario's `[faults] targets`, if set) for node faults.
fn live_targets(world: &World) -> Targets {
    world.with(|w| {
        let targets = &w.spec.scenario.faults.targets;
        let servers = w
            .server_nodes()
            .into_iter()
            .filter(|n| targets.is_empty() || targets.contains(n))
            .filter(|n| !w.killed.contains(n) && !w.paused.contains_key(n))
            .collect();
        Targets {
            all: w.addrs.keys().cloned().collect(),
            servers,
        }
    })
}

/// A fault with every parameter decided.
#[derive(Clone, Debug)]
enum Action {
    Partition {
        side: Vec<String>,
        one_way: bool,
    },
    /// Nodes are clogged one by one, `step_ms` apart, and healed in the same order.
    Swizzle {
        nodes: Vec<String>,
        step_ms: u64,
    },
    Loss {
        ppm: u32,
    },
    Latency {
        high_ms: u64,
    },
    Kill {
        node: String,
        tear: bool,
    },
    Pause {
        node: String,
    },
    ClockBump {
        node: String,
        delta_ms: i64,
    },
    ClockStrobe {
        node: String,
        delta_ms: i64,
        period_ms: u64,
    },
    ClockDrift {
        node: String,
        ppm: i64,
    },
    /// The node stays down `down_ms`.
    ClockRestart {
        node: String,
        back_ms: i64,
        tear: bool,
        down_ms: u64,
    },
}

/// Default ms between swizzle steps in a schedule (the middle of the random 20–200 ms).
const SWIZZLE_STEP_MS: u64 = 100;
/// Default ms a `clock_restart` node stays down in a schedule (within the random 10–100 ms).
const CLOCK_RESTART_DOWN_MS: u64 = 50;

/// A scheduled event as an action; `Err` says why it cannot happen now (its node is down).
fn scripted(world: &World, event: &ScheduledFault) -> Result<Action, String> {
    let node = event.node.clone().unwrap_or_default();
    let down = world.with(|w| w.killed.contains(&node) || w.paused.contains_key(&node));
    let node_up = || {
        if down {
            Err(format!("{node} is already down or paused"))
        } else {
            Ok(node.clone())
        }
    };
    Ok(match event.fault {
        FaultKind::Partition => Action::Partition {
            side: event.nodes.clone(),
            one_way: event.one_way,
        },
        FaultKind::Swizzle => Action::Swizzle {
            nodes: event.nodes.clone(),
            step_ms: event.period_ms.unwrap_or(SWIZZLE_STEP_MS),
        },
        FaultKind::Loss => Action::Loss {
            ppm: event.loss_pct.unwrap_or(1).min(100) * 10_000,
        },
        FaultKind::Latency => Action::Latency {
            high_ms: event.latency_ms.unwrap_or(2).max(2),
        },
        FaultKind::Kill => Action::Kill {
            node: node_up()?,
            tear: event.tear,
        },
        FaultKind::Pause => Action::Pause { node: node_up()? },
        FaultKind::ClockBump => Action::ClockBump {
            node,
            delta_ms: event.delta_ms.unwrap_or(0),
        },
        FaultKind::ClockStrobe => Action::ClockStrobe {
            node,
            delta_ms: event.delta_ms.unwrap_or(1),
            period_ms: event.period_ms.unwrap_or(1).max(1),
        },
        FaultKind::ClockDrift => Action::ClockDrift {
            node,
            ppm: event.ppm.unwrap_or(0),
        },
        FaultKind::ClockRestart => Action::ClockRestart {
            node: node_up()?,
            back_ms: event.delta_ms.unwrap_or(1),
            tear: event.tear,
            down_ms: event.down_ms.unwrap_or(CLOCK_RESTART_DOWN_MS),
        },
    })
}

/// Carries out a fault and arranges its heal after `duration_ms`; records it and counts it.
fn apply(world: &World, action: Action, duration_ms: u64) {
    let (all, lease_ms) = world.with(|w| {
        (
            w.addrs.keys().cloned().collect::<Vec<_>>(),
            w.spec.scenario.ids.lease_ms,
        )
    });
    match action {
        Action::Partition { side, one_way } => {
            apply_partition(world, &all, side, one_way, duration_ms);
        }
        Action::Swizzle { nodes, step_ms } => apply_swizzle(world, nodes, step_ms, duration_ms),
        Action::Loss { ppm } => apply_loss(world, ppm, duration_ms),
        Action::Latency { high_ms } => apply_latency(world, high_ms, duration_ms),
        Action::Kill { node, tear } => apply_kill(world, node, tear, duration_ms),
        Action::Pause { node } => apply_pause(world, node, lease_ms, duration_ms),
        Action::ClockBump { node, delta_ms } => apply_clock_bump(world, &node, delta_ms),
        Action::ClockStrobe {
            node,
            delta_ms,
            period_ms,
        } => apply_clock_strobe(world, node, delta_ms, period_ms, duration_ms),
        Action::ClockDrift { node, ppm } => apply_clock_drift(world, node, ppm, duration_ms),
        Action::ClockRestart {
            node,
            back_ms,
            tear,
            down_ms,
        } => apply_clock_restart(world, node, back_ms, tear, down_ms),
    }
}

/// Clogs the links between `side` and the rest of `all` (both ways unless `one_way`).
fn apply_partition(
    world: &World,
    all: &[String],
    side: Vec<String>,
    one_way: bool,
    duration_ms: u64,
) {
    let kind = FaultKind::Partition;
    let rest: Vec<String> = all.iter().filter(|n| !side.contains(n)).cloned().collect();
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
    supervise(world, move |world| async move {
        sleep_ms(duration_ms).await;
        for (a, b) in &links {
            unclog_link(&world, a, b);
        }
        end(&world, span);
    });
}

/// Clogs `nodes` one by one, `step_ms` apart, and heals them in the same order.
fn apply_swizzle(world: &World, nodes: Vec<String>, step_ms: u64, duration_ms: u64) {
    let kind = FaultKind::Swizzle;
    let span = begin(world, "net", kind, format!("{nodes:?}"));
    supervise(world, move |world| async move {
        for node in &nodes {
            clog_node(&world, node);
            sleep_ms(step_ms).await;
        }
        sleep_ms(duration_ms).await;
        for node in &nodes {
            unclog_node(&world, node);
            sleep_ms(step_ms).await;
        }
        end(&world, span);
    });
}

fn apply_loss(world: &World, ppm: u32, duration_ms: u64) {
    let kind = FaultKind::Loss;
    world.with(|w| w.loss_ppm = ppm);
    let span = begin(world, "net", kind, format!("{}% loss", ppm / 10_000));
    supervise(world, move |world| async move {
        sleep_ms(duration_ms).await;
        world.with(|w| w.loss_ppm = 0);
        end(&world, span);
    });
}

fn apply_latency(world: &World, high: u64, duration_ms: u64) {
    let kind = FaultKind::Latency;
    set_send_latency(
        world,
        Duration::from_millis(high / 2)..Duration::from_millis(high),
    );
    world.with(|w| w.latency_spike = true);
    let span = begin(world, "net", kind, format!("latency up to {high} ms"));
    supervise(world, move |world| async move {
        sleep_ms(duration_ms).await;
        set_send_latency(&world, DEFAULT_SEND_LATENCY);
        world.with(|w| w.latency_spike = false);
        end(&world, span);
    });
}

fn apply_kill(world: &World, node: String, tear: bool, duration_ms: u64) {
    let kind = FaultKind::Kill;
    kill(world, &node, tear);
    let span = begin(world, &node, kind, format!("down for {duration_ms} ms"));
    supervise(world, move |world| async move {
        sleep_ms(duration_ms).await;
        restart(&world, &node);
        end(&world, span);
    });
}

/// A crash placed at a step of `node` (by BUGGIFY or a crash point), called from the node's
/// own task: the node is killed there (counted under `counter`) and restarted `down_ms` later by
/// a task on the supervisor's node (the caller's node is gone). The caller's task must not go on.
pub(crate) fn crash_in_place(world: &World, node: &str, counter: &str, why: &str, down_ms: u64) {
    kill(world, node, false);
    world.count(counter, 1);
    let span = begin(
        world,
        node,
        FaultKind::Kill,
        format!("{why}, down for {down_ms} ms"),
    );
    let supervisor = world.with(|w| w.supervisor);
    let node = node.to_owned();
    let restarts = {
        let world = world.clone();
        Handle::current()
            .get_node(supervisor)
            .expect("the supervisor's node exists for the whole run")
            .spawn(async move {
                sleep_ms(down_ms).await;
                restart(&world, &node);
                end(&world, span);
            })
    };
    world.with(|w| w.supervisor_tasks.push(restarts.abort_handle()));
}

/// A crash point's planned crash strikes `node` here ([`crate::crashpoints`]): the node is
/// killed and restarted after the plan's downtime, and the run is told (it ends its safety
/// phase [`crate::crashpoints::TAIL_MS`] after the restart). The caller's task must not go on.
pub(crate) fn strike(world: &World, node: &str) {
    let (spec, down_ms) = world.with(|w| {
        let now = w.sim_ms();
        let probe = w
            .probe
            .as_mut()
            .expect("a crash strikes only in a probed run");
        probe.struck(now);
        let plan = probe.plan().expect("a crash strikes only where planned");
        (plan.spec(), plan.down_ms)
    });
    crash_in_place(
        world,
        node,
        "crash.points",
        &format!("crash point {spec}"),
        down_ms,
    );
}

/// Spawns a task of the nemesis on the current node (the supervisor's), noting it among the
/// supervisor's tasks (which `run::release` aborts once the seed's outcome is known).
pub(crate) fn supervise<F>(world: &World, task: impl FnOnce(World) -> F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let handle = spawn(task(world.clone())).abort_handle();
    world.with(|w| w.supervisor_tasks.push(handle));
}

fn apply_pause(world: &World, node: String, lease_ms: u64, duration_ms: u64) {
    let kind = FaultKind::Pause;
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
    supervise(world, move |world| async move {
        sleep_ms(duration_ms).await;
        resume(&world, &node);
        end(&world, span);
    });
}

fn apply_clock_bump(world: &World, node: &str, delta: i64) {
    let kind = FaultKind::ClockBump;
    world.with(|w| w.adjust_clock(node, |c, _| c.bump(delta)));
    let span = begin(world, node, kind, format!("{delta:+} ms"));
    end(world, span);
}

fn apply_clock_strobe(world: &World, node: String, delta: i64, period: u64, duration_ms: u64) {
    let kind = FaultKind::ClockStrobe;
    let span = begin(
        world,
        &node,
        kind,
        format!("±{delta} ms every {period} ms for {duration_ms} ms"),
    );
    supervise(world, move |world| async move {
        let flips = (duration_ms / period).max(2) & !1;
        for i in 0..flips {
            if world.with(|w| w.healed) {
                break;
            }
            let d = if i % 2 == 0 { -delta } else { delta };
            world.with(|w| w.adjust_clock(&node, |c, _| c.bump(d)));
            sleep_ms(period).await;
        }
        end(&world, span);
    });
}

fn apply_clock_drift(world: &World, node: String, ppm: i64, duration_ms: u64) {
    let kind = FaultKind::ClockDrift;
    world.with(|w| {
        let now = w.sim_ms();
        w.clocks.entry(&node).set_drift(now, ppm);
    });
    let span = begin(
        world,
        &node,
        kind,
        format!("{ppm:+} ppm for {duration_ms} ms"),
    );
    supervise(world, move |world| async move {
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

/// Steps the node's clock back by `back`, kills it, and restarts it after `down_ms`.
fn apply_clock_restart(world: &World, node: String, back: i64, tear: bool, down_ms: u64) {
    let kind = FaultKind::ClockRestart;
    world.with(|w| w.adjust_clock(&node, |c, _| c.bump(-back)));
    kill(world, &node, tear);
    // BUGGIFY: the restarted node's first ID decision lands at its new generator's floor.
    if world.with(|w| w.spec.buggify.clock_at_boundary && w.landing.is_none()) {
        arm_landing(world, &node, Some("snowflake.floor"), back);
    }
    let span = begin(
        world,
        &node,
        kind,
        format!("clock -{back} ms, then restart"),
    );
    supervise(world, move |world| async move {
        sleep_ms(down_ms).await;
        restart(&world, &node);
        end(&world, span);
    });
}

/// Heals every fault: the start of the liveness phase.
pub fn heal_all(world: &World) {
    let (links, nodes, paused, killed, clocks) = world.with(|w| {
        w.healed = true;
        w.healed_at_ms = Some(w.sim_ms());
        w.loss_ppm = 0;
        w.latency_spike = false;
        (
            w.clogged_links.keys().cloned().collect::<Vec<_>>(),
            w.clogged_nodes.keys().cloned().collect::<Vec<_>>(),
            w.paused.keys().cloned().collect::<Vec<_>>(),
            w.killed.iter().cloned().collect::<Vec<_>>(),
            {
                let mut nodes: Vec<String> = w.clocks.names().cloned().collect();
                nodes.sort();
                nodes
            },
        )
    });
    set_send_latency(world, DEFAULT_SEND_LATENCY);
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

/// A durable step of the node this task runs on (its log's fsync, `site` of it, making durable
/// records whose oldest is labelled `label`): when this seed placed its BUGGIFY crash at this
/// arrival, or a crash point strikes here, the node is crashed and the task never goes on.
pub async fn durable_step(world: &World, site: CrashSite, label: Option<Label>) {
    let hit = world.with(|w| {
        if w.probe.is_none() && w.spec.buggify.crash.is_none() {
            return None;
        }
        let name = w.current_node()?.to_owned();
        if let Some(label) = label {
            let point = match site {
                CrashSite::BeforeSync => Site::BeforeSync,
                CrashSite::AfterSync => Site::AfterSync,
            };
            if w.arrive(&name, point, label) {
                return Some((name, None));
            }
        }
        let crash = w.spec.buggify.crash.as_ref()?;
        if crash.site != site || w.healed || w.workload_stopped || name != crash.node {
            return None;
        }
        let (nth, down_ms) = (crash.nth, crash.down_ms);
        let arrivals = w.durable_steps.entry(name.clone()).or_insert(0);
        *arrivals += 1;
        (*arrivals == nth).then_some((name, Some(down_ms)))
    });
    match hit {
        None => return,
        Some((node, None)) => strike(world, &node),
        Some((node, Some(down_ms))) => {
            let counter = match site {
                CrashSite::BeforeSync => "crash.before_durable_step",
                CrashSite::AfterSync => "crash.after_durable_step",
            };
            crash_in_place(
                world,
                &node,
                counter,
                &format!("BUGGIFY: crashed {}", site.name()),
                down_ms,
            );
        }
    }
    std::future::pending::<()>().await;
}

/// Crash points: the node this task runs on is about to make its log durable; a crash planned
/// after one of its sends holds it here until the send round has left and the crash strikes
/// (the node is killed meanwhile, and the task with it).
pub async fn hold_sync(world: &World) {
    let held = world.with(|w| {
        w.probe
            .as_ref()
            .is_some_and(|probe| w.current_node().is_some_and(|node| probe.holds_sync(node)))
    });
    if held {
        std::future::pending::<()>().await;
    }
}
