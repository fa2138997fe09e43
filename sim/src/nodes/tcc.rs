//! The TCC lottery's nodes: the coordinator (with its log on the simulated disk) and the
//! participants (wallet + participation log on `wallet`, stock on `inventory`), each with its
//! store behind a write-ahead log. Compensation (parked draws, retry rounds, dead letters) is the
//! coordinator's own: this driver only wakes it at `poll_timeout`.

use std::sync::{Arc, Mutex};

use madsim::task::spawn;
use sut::lottery::journal::{self, JournalOp, Journaled};
use sut::lottery::{
    ActivityId, ClientAnswer, CoordLog, CoordinatorConfig, CoordinatorIo, CoordinatorNode,
    DrawArgs, DrawEvent, DrawStatus, Handled, Host, LogEntry, Participant, ParticipantConfig,
    ParticipantMsg, ParticipantReply, Registry, Terms, UserId, Written, Xid,
};

use super::{GroupCommit, commit};
use crate::clock::sleep_ms;
use crate::history::{Answer, EventKind, Op, Outcome};
use crate::net::{Ctx, Inbox, Msg};

/// The coordinator role on this node; its clients are `(client node, operation id)`.
type Coord = CoordinatorNode<(String, u64)>;

/// Final outcomes a coordinator node remembers for status polls.
const STATUSES_KEPT_MAX: usize = 10_000;

/// How the `coord` node moves its coordinator's outputs: log entries are collected for the
/// group commit that follows (acknowledged after it), messages and answers go on the simulated
/// network, outcome events into the history.
struct SimIo<'a> {
    ctx: &'a Ctx,
    entries: Vec<LogEntry>,
}

impl CoordinatorIo<(String, u64)> for SimIo<'_> {
    fn write_log(&mut self, entry: &LogEntry) -> Written {
        self.entries.push(*entry);
        Written::Later
    }

    fn send(
        &mut self,
        host: Host,
        branch: Participant,
        msg: ParticipantMsg,
    ) -> Option<ParticipantReply> {
        self.ctx.send(host.name(), Msg::Tcc(branch, msg));
        None
    }

    fn outcome(
        &mut self,
        event: &DrawEvent,
        answer: ClientAnswer<'_>,
        client: Option<(String, u64)>,
    ) {
        let xid = event.draw.xid;
        self.ctx.record(|_| EventKind::Draw(event.clone()));
        // The answer a client of `sut-server` gets, encoded for the simulated client.
        let draw_answer = |status: DrawStatus| {
            Outcome::Ok(Answer::Draw {
                xid: xid.0,
                status: status.name().to_owned(),
            })
        };
        let outcome = match answer {
            ClientAnswer::Confirmed { .. } => draw_answer(DrawStatus::Confirmed),
            ClientAnswer::Cancelled(reason) => Outcome::Fail(format!("cancelled: {reason}")),
            // As the server's 202: the client follows the draw by polling its status.
            ClientAnswer::Pending => {
                self.ctx.world.count("tcc.parked_draws", 1);
                draw_answer(DrawStatus::Pending)
            }
            ClientAnswer::DeadLettered => {
                self.ctx.world.count("tcc.dead_letters", 1);
                draw_answer(DrawStatus::DeadLettered)
            }
        };
        if let Some((client, op_id)) = client {
            self.ctx.send(&client, Msg::Response { op_id, outcome });
        }
    }
}

/// Carries out the coordinator's outputs until it has nothing more to say: writes log entries
/// durably (a group commit on the node's disk) before acknowledging them.
async fn drive(ctx: &Ctx, state: &Arc<Mutex<Coord>>) {
    for _ in 0..64 {
        let mut io = SimIo {
            ctx,
            entries: Vec::new(),
        };
        {
            let mut s = state.lock().expect("coordinator");
            s.drive(&mut io, ctx.now());
            ctx.world.take_edges(&mut *s);
        }
        let entries = io.entries;
        if entries.is_empty() {
            return;
        }
        let pos = ctx.world.with(|w| {
            entries
                .iter()
                .map(|e| w.disks.coord.append(*e))
                .last()
                .unwrap_or(0)
        });
        commit(&ctx.world, |d| &mut d.coord, pos).await;
        let now = ctx.now();
        let mut s = state.lock().expect("coordinator");
        for entry in &entries {
            s.handle_log_written(entry, now);
        }
        ctx.world.take_edges(&mut *s);
    }
}

/// The coordinator as its durable log leaves it (torn records discarded and counted).
fn recover_coordinator(ctx: &Ctx) -> Coord {
    let (entries, torn) = ctx.world.with(|w| w.disks.coord.recover());
    ctx.world.count("crash.torn_records_discarded", torn);
    let mut log = CoordLog::default();
    for entry in &entries {
        let _ = log.append(entry);
    }
    let now = ctx.now();
    let config = ctx
        .world
        .with(|w| coordinator_config(&w.spec.buggify, w.spec.scenario.run.flaw));
    Coord::recover(config, &log, now, Some(STATUSES_KEPT_MAX)).expect("a valid coordinator config")
}

/// The coordinator's configuration in this run: backoff capped at 1 s (with 6 attempts a phase
/// gives up within 3.5 s, so a draw begun in the safety phase settles well inside the liveness
/// phase, see `RunSection`), the run's flaw, then the seed's BUGGIFY.
#[must_use]
pub fn coordinator_config(
    buggify: &crate::buggify::Buggify,
    flaw: Option<sut::flaw::Flaw>,
) -> CoordinatorConfig {
    buggify.coordinator(CoordinatorConfig {
        backoff_ms_max: 1_000,
        flaw,
        ..CoordinatorConfig::default()
    })
}

/// Every 5 ms: the coordinator's timeouts, then whatever it has to say. Once the faults have
/// healed and every compensation round begun during them has ended
/// (`CoordinatorConfig::round_ms_max`), the operator's runbook step: every dead letter (a draw
/// whose retry budget ran out during the faults) is retried once.
async fn tick_forever(ctx: Ctx, state: Arc<Mutex<Coord>>) {
    let self_checks = super::self_checks(&ctx.world);
    let mut dead_letters_retried = false;
    loop {
        sleep_ms(5).await;
        let now = ctx.now();
        {
            let mut s = state.lock().expect("coordinator");
            let round_ms_max = s.coordinator().config().round_ms_max();
            let rounds_over = ctx.world.with(|w| {
                w.healed_at_ms
                    .is_some_and(|at| w.sim_ms() > at.saturating_add(round_ms_max))
            });
            if !dead_letters_retried && rounds_over {
                dead_letters_retried = true;
                let letters: Vec<Xid> =
                    s.coordinator().dead_letters().map(|(d, _)| d.xid).collect();
                for xid in &letters {
                    s.handle_retry_dead_letter(*xid, now)
                        .expect("listed as a dead letter");
                }
                ctx.world
                    .count("tcc.dead_letters_retried", letters.len() as u64);
            }
            s.handle_due(now);
            ctx.world.take_edges(&mut *s);
            if self_checks {
                assert_eq!(s.check_invariants(), Ok(()), "coordinator");
            }
        }
        drive(&ctx, &state).await;
    }
}

/// Starts a client's draw; the client waits for its outcome, or is told at once why it
/// cannot start.
fn start_draw(
    ctx: &Ctx,
    state: &Arc<Mutex<Coord>>,
    draw: DrawArgs,
    (from, op_id): (String, u64),
    now: sut::clock::Now,
) {
    let started = {
        let mut s = state.lock().expect("coordinator");
        let started = s.start_draw(draw, Some((from, op_id)), now);
        ctx.world.take_edges(&mut *s);
        started
    };
    if let Err((Some((from, op_id)), err)) = started {
        ctx.send(
            &from,
            Msg::Response {
                op_id,
                outcome: Outcome::Fail(err.to_string()),
            },
        );
    }
}

/// The operator's activities of a run: activities `1..=activities` at the workload's price and
/// odds, always open.
///
/// # Panics
/// If the workload's price or odds are out of range (the scenario's validation refuses them).
#[must_use]
pub fn registry(w: &crate::scenario::Workload) -> Registry {
    Registry::from_entries((1..=u64::from(w.activities)).map(|a| {
        (
            ActivityId(a),
            Terms::always_open(w.price, w.win_pct.saturating_mul(10)),
        )
    }))
    .expect("a validated workload's terms")
}

/// Runs the coordinator node.
pub async fn run_coordinator(ctx: Ctx, mut inbox: Inbox) {
    let state = Arc::new(Mutex::new(recover_coordinator(&ctx)));
    ctx.world
        .take_edges(&mut *state.lock().expect("coordinator"));
    let (registry, client_price) = ctx.world.with(|w| {
        (
            registry(&w.spec.scenario.workload),
            sut::flaw::lottery_flaws(w.spec.scenario.run.flaw).client_price,
        )
    });
    spawn(tick_forever(ctx.clone(), Arc::clone(&state)));

    while let Some((msg, from)) = inbox.recv().await {
        let now = ctx.now();
        match msg {
            Msg::Request {
                op_id,
                op:
                    Op::Draw {
                        user,
                        activity,
                        won,
                        price,
                    },
            } => {
                // The draw gate: the operator's terms, before the draw begins.
                let gate = sut::gate::draw_terms(
                    &registry,
                    ActivityId(activity),
                    price,
                    now.wall_ms,
                    client_price,
                );
                match gate {
                    Ok((_, price_minor)) => {
                        let draw = DrawArgs {
                            xid: Xid(ctx.world.with(|w| w.next_xid())),
                            user: UserId(user),
                            activity: ActivityId(activity),
                            price_minor,
                            won,
                        };
                        start_draw(&ctx, &state, draw, (from.to_string(), op_id), now);
                    }
                    Err(refusal) => {
                        ctx.world.count("tcc.gate_refused", 1);
                        let outcome = Outcome::Fail(format!("refused: {refusal}"));
                        ctx.send(&from, Msg::Response { op_id, outcome });
                    }
                }
            }
            Msg::Request {
                op_id,
                op: Op::DrawStatus { xid },
            } => {
                let outcome = {
                    let s = state.lock().expect("coordinator");
                    match s.status(Xid(xid)) {
                        Some(polled) => Outcome::Ok(Answer::Draw {
                            xid,
                            status: polled.status.name().to_owned(),
                        }),
                        None => Outcome::Fail(format!("unknown draw {xid}")),
                    }
                };
                ctx.send(&from, Msg::Response { op_id, outcome });
                continue;
            }
            Msg::TccReply(reply) => {
                let mut s = state.lock().expect("coordinator");
                s.handle_reply(reply.branch, &reply, now);
                ctx.world.take_edges(&mut *s);
            }
            _ => continue,
        }
        let (ctx, state) = (ctx.clone(), Arc::clone(&state));
        spawn(async move { drive(&ctx, &state).await });
    }
}

/// The participants' configuration for a run: the flaw switches of the run's flaw.
#[must_use]
pub fn participant_config(flaw: Option<sut::flaw::Flaw>) -> ParticipantConfig {
    ParticipantConfig {
        flaws: sut::flaw::lottery_flaws(flaw),
    }
}

/// Runs a participant node (`wallet` or `inventory`).
pub async fn run_participant(ctx: Ctx, mut inbox: Inbox) {
    let name = ctx.name.clone();
    let (records, torn, flaw) = ctx.world.with(|w| {
        let (records, torn) = w.disks.parts.entry(name.clone()).or_default().recover();
        (records, torn, w.spec.scenario.run.flaw)
    });
    ctx.world.count("crash.torn_records_discarded", torn);
    let cfg = participant_config(flaw);
    let registry = ctx.world.with(|w| registry(&w.spec.scenario.workload));
    // The store behind its command journal: the records of every operation go to this node's
    // disk (the same journal the real server keeps), and recovery replays them.
    let store = Arc::new(Mutex::new(Journaled::new(journal::replay(&records).0)));
    ctx.world
        .take_edges(&mut *store.lock().expect("participant store"));
    ctx.world
        .with(|w| w.published.ledgers.insert(name.clone(), Arc::clone(&store)));

    let group = {
        let name = name.clone();
        GroupCommit::new(ctx.world.clone(), move |d| {
            d.parts.entry(name.clone()).or_default()
        })
    };
    // Journals what the operation did and answers once it is durable.
    let answer = {
        let (ctx, name) = (ctx.clone(), name.clone());
        move |from: Arc<str>, reply: ParticipantReply, records: Vec<JournalOp>| {
            ctx.world.with(|w| {
                let disk = w.disks.parts.entry(name.clone()).or_default();
                for record in records {
                    disk.append(record);
                }
            });
            let ctx = ctx.clone();
            group.then(move || {
                ctx.record(|_| EventKind::Participant(reply.clone()));
                ctx.send(&from, Msg::TccReply(reply));
            });
        }
    };
    while let Some((msg, from)) = inbox.recv().await {
        let Msg::Tcc(p, msg) = msg else { continue };
        let (handled, records) = {
            let mut s = store.lock().expect("participant store");
            let handled = p.handle(&mut *s, &cfg, &registry, &msg);
            ctx.world.take_edges(&mut *s);
            (handled, s.take_records())
        };
        match handled {
            Handled::Reply(reply) => answer(from, reply, records),
            Handled::Resume(resume) => {
                // Flawed two-step paths only: the second store operation is a round trip
                // later, and other messages run in between (the correct path never gets
                // here, so its timing is unchanged). The first half only read.
                debug_assert!(records.is_empty(), "a two-step first half writes nothing");
                ctx.world.count("tcc.two_step_gaps", 1);
                let (store, answer, world) =
                    (Arc::clone(&store), answer.clone(), ctx.world.clone());
                spawn(async move {
                    sleep_ms(1).await;
                    let (reply, records) = {
                        let mut s = store.lock().expect("participant store");
                        let reply = p.handle_resume(&mut *s, &cfg, &resume);
                        world.take_edges(&mut *s);
                        (reply, s.take_records())
                    };
                    answer(from, reply, records);
                });
            }
        }
    }
}
