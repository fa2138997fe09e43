//! A client node: sends the workload at its share of the configured rate, records every
//! operation's invocation and completion (with a timeout: no answer is *indeterminate*, not a
//! failure), and keeps what it needs to build later operations (tokens to verify, revoke,
//! consume — and sometimes to consume twice at once, or with another user's hands).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::rand::{Rng, thread_rng};
use madsim::task::spawn;
use madsim::time::Instant;

use crate::clock::sleep_ms;
use crate::history::{Answer, EventKind, Op, Outcome};
use crate::net::{Ctx, Inbox, Msg};
use crate::scenario::Workload;
use sut::lottery::DrawStatus;

const REMEMBER_MAX: usize = 64;

#[derive(Debug, Default)]
struct State {
    next_op: u64,
    waiting: BTreeMap<u64, Waiting>,
    /// The waiting operations by deadline (so that a timeout sweep looks only at those due,
    /// not at every operation in flight: thousands under a partition).
    deadlines: BTreeSet<(Instant, u64)>,
    jwts: Vec<String>,
    once: Vec<(u64, u128)>,
    /// Draws answered `pending` (or polled not yet final), and when to poll each next.
    polls: BTreeMap<u64, Instant>,
}

/// How often a client polls the status of a draw it was told is `pending`, simulated ms.
pub const DRAW_POLL_INTERVAL_MS: u64 = 250;

/// Whether a draw status is final: nothing follows, so polling stops.
fn final_status(status: &str) -> bool {
    [DrawStatus::Confirmed, DrawStatus::Cancelled]
        .iter()
        .any(|s| s.name() == status)
}

fn remember<T>(list: &mut Vec<T>, item: T) {
    if list.len() >= REMEMBER_MAX {
        let i = thread_rng().gen_range(0..list.len());
        list.swap_remove(i);
    }
    list.push(item);
}

fn pick<T: Clone>(list: &[T]) -> Option<T> {
    (!list.is_empty()).then(|| list[thread_rng().gen_range(0..list.len())].clone())
}

/// Chooses the next operations (usually one; a double submit sends two) and their targets
/// (`id_nodes`: the ID nodes' names, `id1` first).
fn choose<'a>(w: &Workload, id_nodes: &'a [String], state: &State) -> Vec<(&'a str, Op)> {
    let mut rng = thread_rng();
    let m = &w.mix;
    let total = m.segment + m.snowflake + m.semantic + m.jwt + m.once + m.draw;
    let mut roll = rng.gen_range(0..total);
    // Drawn as a `u32`, as the node's number always was (another type draws differently).
    let count = u32::try_from(id_nodes.len()).expect("a u32 of ID nodes");
    let id_node = id_nodes[rng.gen_range(1..=count) as usize - 1].as_str();
    let user = rng.gen_range(1..=u64::from(w.users));
    if roll < m.segment {
        return vec![(id_node, Op::SegmentId)];
    }
    roll -= m.segment;
    if roll < m.snowflake {
        return vec![(id_node, Op::SnowflakeId)];
    }
    roll -= m.snowflake;
    if roll < m.semantic {
        return vec![(id_node, Op::SemanticId)];
    }
    roll -= m.semantic;
    if roll < m.jwt {
        let op = match (rng.gen_range(0..100), pick(&state.jwts)) {
            (0..45, _) | (_, None) => Op::JwtIssue { user },
            (45..85, Some(token)) => Op::JwtVerify { token },
            (_, Some(token)) => Op::JwtRevoke { token },
        };
        return vec![("token", op)];
    }
    roll -= m.jwt;
    if roll < m.once {
        let Some((owner, token)) = pick(&state.once).filter(|_| rng.gen_bool(0.55)) else {
            let activity = format!("act{}", rng.gen_range(1..=w.activities));
            return vec![("token", Op::OnceIssue { user, activity })];
        };
        let presenter = if rng.gen_bool(0.1) { user } else { owner };
        let consume = Op::OnceConsume {
            token,
            user: presenter,
        };
        // A double submit: the same token twice at once.
        let copies = if rng.gen_bool(0.25) { 2 } else { 1 };
        return vec![("token", consume); copies];
    }
    let activity = rng.gen_range(1..=u64::from(w.activities));
    let won = rng.gen_range(0..100) < w.win_pct;
    // A hostile user names its own price, every time (chosen by id: no randomness drawn, so a
    // run without hostile users replays as it did before they existed).
    let price = (user % 100 < u64::from(w.tampered_price_pct)).then_some(0);
    vec![(
        "coord",
        Op::Draw {
            user,
            activity,
            won,
            price,
        },
    )]
}

/// An operation waiting for its answer.
#[derive(Debug)]
struct Waiting {
    /// When no answer means *indeterminate* (madsim's clock, not the node's wall clock: a
    /// timeout is about how long the client waited).
    deadline: Instant,
    /// The user a one-time token is issued to (0 otherwise).
    owner: u64,
    /// The draw a status poll follows (polled again when it times out).
    polled: Option<u64>,
}

/// Sends `op` and records its invocation; the answer (or the timeout) is recorded by
/// [`complete`], called from the client's receive loop or its timeout sweep. No task, timer
/// or channel per operation: at the default rate those were a tenth of a run's wall time.
fn invoke(ctx: &Ctx, state: &Mutex<State>, target: &str, op: Op, timeout_ms: u64) {
    let op_id = {
        let mut s = state.lock().expect("client state");
        s.next_op += 1;
        let op_id = s.next_op;
        let owner = match &op {
            Op::OnceIssue { user, .. } => *user,
            _ => 0,
        };
        let polled = match &op {
            Op::DrawStatus { xid } => Some(*xid),
            _ => None,
        };
        let deadline = ctx.instant() + Duration::from_millis(timeout_ms);
        s.deadlines.insert((deadline, op_id));
        s.waiting.insert(
            op_id,
            Waiting {
                deadline,
                owner,
                polled,
            },
        );
        op_id
    };
    ctx.record(|_| EventKind::Invoke {
        op_id,
        op: op.clone(),
    });
    ctx.send(target, Msg::Request { op_id, op });
}

/// Records the completion of `op_id` if it is still waiting (a late answer after its timeout
/// was recorded is dropped, as a real client that gave up would drop it).
fn complete(ctx: &Ctx, state: &Mutex<State>, op_id: u64, outcome: Outcome) {
    {
        let mut s = state.lock().expect("client state");
        let Some(waiting) = s.waiting.remove(&op_id) else {
            return;
        };
        s.deadlines.remove(&(waiting.deadline, op_id));
        match &outcome {
            Outcome::Ok(Answer::Jwt { token, .. }) => remember(&mut s.jwts, token.clone()),
            Outcome::Ok(Answer::Once(token)) => remember(&mut s.once, (waiting.owner, *token)),
            // Follow a draw until its status is final (a poll that timed out is repeated; one
            // the coordinator no longer knows, after its restart, is given up).
            Outcome::Ok(Answer::Draw { xid, status }) if !final_status(status) => {
                let next = ctx.instant() + Duration::from_millis(DRAW_POLL_INTERVAL_MS);
                s.polls.insert(*xid, next);
            }
            Outcome::Timeout => {
                if let Some(xid) = waiting.polled {
                    s.polls.insert(xid, ctx.instant());
                }
            }
            _ => {}
        }
    }
    ctx.record(|_| EventKind::Complete { op_id, outcome });
}

/// Records a timeout for every operation whose deadline has passed; returns how many
/// operations are still waiting.
fn expire(ctx: &Ctx, state: &Mutex<State>) -> usize {
    let (expired, left) = {
        let s = state.lock().expect("client state");
        let now = ctx.instant();
        // Recorded in operation order, as a sweep over `waiting` would.
        let mut expired: Vec<u64> = s
            .deadlines
            .range(..=(now, u64::MAX))
            .map(|(_, id)| *id)
            .collect();
        expired.sort_unstable();
        debug_assert_eq!(s.deadlines.len(), s.waiting.len());
        let left = s.waiting.len() - expired.len();
        (expired, left)
    };
    for op_id in expired {
        complete(ctx, state, op_id, Outcome::Timeout);
    }
    left
}

/// Polls the status of every draw whose poll is due; returns how many draws are followed.
fn poll_due_draws(ctx: &Ctx, state: &Mutex<State>, timeout_ms: u64) -> usize {
    let (due, followed) = {
        let mut s = state.lock().expect("client state");
        let now = ctx.instant();
        let due: Vec<u64> = s
            .polls
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(xid, _)| *xid)
            .collect();
        for xid in &due {
            s.polls.remove(xid);
        }
        (due, s.polls.len())
    };
    for xid in &due {
        invoke(
            ctx,
            state,
            "coord",
            Op::DrawStatus { xid: *xid },
            timeout_ms,
        );
    }
    followed + due.len()
}

/// How often the probing client asks every ID node for a segment ID once the workload has
/// stopped (the liveness phase), simulated ms: what `ids.progress` judges.
pub const PROBE_INTERVAL_MS: u64 = 250;

/// Whether this client probes the ID nodes in the liveness phase: the first client, when the
/// workload asks for segment IDs at all.
fn probes_ids(ctx: &Ctx, workload: &Workload) -> bool {
    ctx.name == "client1" && workload.mix.segment > 0
}

/// One probe round: a segment ID from every ID node, then the probe interval.
async fn probe_id_nodes(ctx: &Ctx, state: &Mutex<State>, id_nodes: u32, timeout_ms: u64) {
    for node in 1..=id_nodes {
        invoke(ctx, state, &format!("id{node}"), Op::SegmentId, timeout_ms);
    }
    sleep_ms(PROBE_INTERVAL_MS).await;
    expire(ctx, state);
}

/// Runs a client node.
pub async fn run(ctx: Ctx, inbox: Inbox) {
    let (workload, clients, id_nodes) = ctx.world.with(|w| {
        (
            w.spec.scenario.workload.clone(),
            w.spec.scenario.topology.clients,
            w.spec.scenario.topology.id_nodes,
        )
    });
    let id_names: Vec<String> = (1..=id_nodes).map(|n| format!("id{n}")).collect();
    let state = Arc::new(Mutex::new(State::default()));
    let receiver = {
        let (ctx, state) = (ctx.clone(), Arc::clone(&state));
        let mut inbox = inbox;
        async move {
            while let Some((msg, _from)) = inbox.recv().await {
                if let Msg::Response { op_id, outcome } = msg {
                    complete(&ctx, &state, op_id, outcome);
                }
            }
        }
    };
    spawn(receiver);
    // Each client sends at rate / clients; intervals are uniform around the mean (in µs).
    // Timeouts are swept on the same beat (a timeout is recorded within one gap, a few
    // simulated ms, of its deadline), and every millisecond once the workload has stopped.
    let mean_us = 1_000_000 * u64::from(clients) / u64::from(workload.rate_per_s);
    loop {
        let gap_us = thread_rng().gen_range(mean_us / 2..=mean_us * 3 / 2).max(1);
        ctx.sleep(Duration::from_micros(gap_us)).await;
        let waiting = expire(&ctx, &state) + poll_due_draws(&ctx, &state, workload.timeout_ms);
        if ctx.world.with(|w| w.workload_stopped) {
            if probes_ids(&ctx, &workload) {
                probe_id_nodes(&ctx, &state, id_nodes, workload.timeout_ms).await;
                continue;
            }
            if waiting == 0 {
                sleep_ms(1_000_000).await;
            }
            continue;
        }
        let ops = choose(&workload, &id_names, &state.lock().expect("client state"));
        for (target, op) in ops {
            invoke(&ctx, &state, target, op, workload.timeout_ms);
        }
    }
}
