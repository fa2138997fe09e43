//! `scenario tcc`: test your own TCC participant, black box, against a hostile coordinator
//! (docs/own-service.md).
//!
//! The participant implements the HTTP contract of docs/own-service.md (`POST
//! /admin/activities`, `POST /admin/accounts`, `POST /admin/stock`, `POST /tcc/branch`, `GET
//! /ledger`; this project's `sut-server` implements it). The tester opens fresh accounts and stock for each sequence, then sends
//! Try, Confirm and Cancel of a handful of draws in any order, repeated, two at once, and (when
//! it owns the server) across kill -9 and restarts. After every answer it asks the shared
//! referee ([`sut::lottery::referee`]) whether the answer is a transition the participant's
//! promises allow, reads `GET /ledger`, and checks that the books are what the branches went
//! through and that a repeat or refusal changed nothing.
//!
//! It assumes the service is its own during the run (the money figures of `GET /ledger` are
//! global), and a participant that answers every message it accepted: no faults are injected
//! between a message and its answer, so every outcome is known.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chaos::{CommandService, CommandSpec};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reports::model::{InvariantResult, Judgement};
use serde::Deserialize;
use sut::UserId;
use sut::lottery::referee::{self, Answer, BranchState, Referee, Said, Transition};
use sut::lottery::{ActivityId, DrawArgs, Participant, ParticipantMsg, Phase, Xid};

/// Ticket price of every draw.
pub const PRICE_MINOR: u64 = 10;
/// Each user's opening balance: three tickets and a half, so the wallet also refuses.
pub const BALANCE_MINOR: u64 = 35;
/// Prize units per activity: fewer than the winning draws, so the stock also refuses.
pub const UNITS: u64 = 2;
/// Draws per sequence.
pub const DRAWS: u64 = 8;
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a 503 or 429 answer is asked again before the run gives up.
pub(crate) const BUSY_RETRIES: u32 = 20;

/// The draw (its number in a sequence) that names its own price, [`TAMPERED_PRICE_MINOR`]: a
/// coordinator fooled by a client, or a forged call.
pub const TAMPERED_DRAW: u64 = DRAWS;
/// What the tampered draw says it pays.
pub const TAMPERED_PRICE_MINOR: u64 = 0;

/// The business's own check: a Try that charges (wallet, participation log) takes effect only at
/// the activity's registered price.
pub const PAID: &str = "lottery.paid";
/// The protocol checks a run reports.
pub const PROMISES: &str = "participant.promises";
/// A repeat or a refusal changed nothing.
pub const UNCHANGED: &str = "participant.unchanged";
/// The books are what the branches went through, money and stock conserved.
pub const BOOKS: &str = "participant.books";

/// What to test and how hard.
#[derive(Clone, Debug)]
pub struct ParticipantOptions {
    /// The participant's base URL.
    pub url: String,
    /// The operator's secret (`Authorization: Bearer …` on `/admin/*` and `GET /ledger`).
    pub admin_token: Option<String>,
    /// The coordinator's credential on `POST /tcc/branch` (`None`: the operator's secret, for a
    /// participant that has one secret for both).
    pub service_token: Option<String>,
    /// Hostile sequences to run.
    pub sequences: u64,
    /// Messages per sequence, at most.
    pub steps: u64,
    /// The seed of the sequences.
    pub seed: u64,
    /// The command that starts the participant (`{data}`: a fresh data directory).
    pub command: Option<String>,
    /// With `command`: kill -9 and restart it after every this many messages (0: never).
    pub kill_every: u64,
    /// The participant's database, started by the tester before it (`{db_url}` in `command`).
    pub db: Option<crate::db::DbOptions>,
    /// With `db`: at each `kill_every` point this fault of the database (killed, or its power
    /// cut, then restarted) instead of the participant's restart; the participant must answer
    /// again and its books must be what it acknowledged.
    pub db_fault: Option<crate::db::DbFault>,
    /// The slow-clients check after the sequences, measuring `GET /ledger` (stalled bodies go
    /// to `POST /tcc/branch` unless the spec names another path).
    pub slow: Option<crate::slow::SlowSpec>,
    /// The unauthenticated-bodies check after the sequences: requests without the service
    /// credential to `POST /tcc/branch` whose bodies never end ([`crate::bodies`]).
    pub bodies: Option<crate::bodies::BodiesSpec>,
}

/// Where the unauthenticated-bodies check of a participant posts: its branch route, which takes
/// the coordinator's service credential only.
pub const BODIES_PATH: &str = "/tcc/branch";

/// A black-box contract run (`scenario tcc`, `scenario tokens`) could not be made (not a
/// verdict).
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// An option is wrong.
    #[error("{0}")]
    Usage(String),
    /// The service could not be started, or did not answer as the contract says.
    #[error("{0}")]
    Unreachable(String),
}

impl From<chaos::ProcessError> for ContractError {
    fn from(e: chaos::ProcessError) -> Self {
        Self::Unreachable(e.to_string())
    }
}

/// One message of a hostile sequence: `phase` of draw `draw` (1..=DRAWS) on `branch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Send {
    /// The draw's number within the sequence.
    pub draw: u64,
    /// The branch.
    pub branch: Participant,
    /// The phase.
    pub phase: Phase,
}

/// What the hostile coordinator does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// One message, answered before the next.
    One(Send),
    /// Two messages sent at once.
    Race(Send, Send),
    /// kill -9 the participant and start it again on its data.
    Restart,
}

impl std::fmt::Display for Send {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} draw {} {:?}", self.phase, self.draw, self.branch)
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::One(s) => write!(f, "{s}"),
            Self::Race(a, b) => write!(f, "at once {{{a}; {b}}}"),
            Self::Restart => f.write_str("kill -9 and restart"),
        }
    }
}

/// The draws of one sequence: fresh users, activities and xids from `base` on, so sequences
/// never meet in the participant's store.
#[derive(Clone, Copy, Debug)]
struct Universe {
    base: u64,
}

impl Universe {
    fn user(self, k: u64) -> UserId {
        UserId(self.base + 1 + k % 2)
    }

    fn activity(self, k: u64) -> ActivityId {
        ActivityId(self.base + 1 + (k / 2) % 2)
    }

    fn activities(self) -> [ActivityId; 2] {
        [ActivityId(self.base + 1), ActivityId(self.base + 2)]
    }

    /// Draw `k`: every third one a winner (it has an inventory branch); draw
    /// [`TAMPERED_DRAW`] names its own price.
    fn draw(self, k: u64) -> DrawArgs {
        DrawArgs {
            xid: Xid(self.base + k),
            user: self.user(k),
            activity: self.activity(k),
            price_minor: if k == TAMPERED_DRAW {
                TAMPERED_PRICE_MINOR
            } else {
                PRICE_MINOR
            },
            won: k.is_multiple_of(3),
        }
    }

    fn msg(self, send: Send) -> ParticipantMsg {
        ParticipantMsg {
            phase: send.phase,
            draw: self.draw(send.draw),
        }
    }
}

/// A random message: a draw without the branch gets its wallet instead.
fn random_send(rng: &mut StdRng) -> Send {
    let draw = rng.gen_range(1..=DRAWS);
    let branch = Participant::ALL[rng.gen_range(0..Participant::ALL.len())];
    let branch = if draw.is_multiple_of(3) || branch != Participant::Inventory {
        branch
    } else {
        Participant::Wallet
    };
    let phase = [Phase::Try, Phase::Confirm, Phase::Cancel][rng.gen_range(0..3)];
    Send {
        draw,
        branch,
        phase,
    }
}

/// The hostile sequence number `index` of a run with `seed`: mostly single messages, some
/// repeated at once with another, restarts where the tester owns the server.
#[must_use]
pub fn sequence(seed: u64, index: u64, steps: u64, kill_every: u64) -> Vec<Action> {
    let mut rng = StdRng::seed_from_u64(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut actions = Vec::new();
    let mut sent = 0;
    while sent < steps {
        let action = match rng.gen_range(0..8) {
            0 => {
                // Two at once, often the same branch (Try racing its Cancel).
                let a = random_send(&mut rng);
                let b = if rng.gen_bool(0.5) {
                    Send {
                        phase: [Phase::Try, Phase::Confirm, Phase::Cancel][rng.gen_range(0..3)],
                        ..a
                    }
                } else {
                    random_send(&mut rng)
                };
                Action::Race(a, b)
            }
            _ => Action::One(random_send(&mut rng)),
        };
        let before = sent;
        sent += if matches!(action, Action::Race(..)) {
            2
        } else {
            1
        };
        actions.push(action);
        if kill_every > 0 && before / kill_every != sent / kill_every {
            actions.push(Action::Restart);
        }
    }
    actions
}

/// The figures of `GET /ledger` the checks read (this contract's subset of it).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct LedgerWire {
    /// Spendable money over all accounts.
    pub balances_minor: u128,
    /// Money frozen by open Tries.
    pub frozen_minor: u128,
    /// Money collected by Confirms.
    pub collected_minor: u128,
    /// Participation records (open or confirmed).
    pub participations: u64,
    /// Stock per activity.
    pub stock: Vec<StockWire>,
}

/// One activity's stock in `GET /ledger`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct StockWire {
    /// The activity.
    pub activity: u64,
    /// Units ever added.
    pub total: u64,
    /// Free.
    pub available: u64,
    /// Reserved by open Tries.
    pub reserved: u64,
    /// Handed out.
    pub issued: u64,
}

/// The ledger figures of one sequence: the global money figures and its own activities.
#[derive(Clone, Debug, PartialEq, Eq)]
struct View {
    balances_minor: u128,
    frozen_minor: u128,
    collected_minor: u128,
    participations: u64,
    stock: BTreeMap<u64, (u64, u64, u64, u64)>,
}

impl View {
    fn of(ledger: &LedgerWire, universe: Universe) -> Self {
        let ours: BTreeSet<u64> = universe.activities().iter().map(|a| a.0).collect();
        Self {
            balances_minor: ledger.balances_minor,
            frozen_minor: ledger.frozen_minor,
            collected_minor: ledger.collected_minor,
            participations: ledger.participations,
            stock: ledger
                .stock
                .iter()
                .filter(|s| ours.contains(&s.activity))
                .map(|s| (s.activity, (s.total, s.available, s.reserved, s.issued)))
                .collect(),
        }
    }

    fn money_minor(&self) -> u128 {
        self.balances_minor + self.frozen_minor + self.collected_minor
    }
}

/// One broken promise: which check, the sequence up to it, and what broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// `participant.promises`, `participant.unchanged` or `participant.books`.
    pub check: &'static str,
    /// The sequence's number.
    pub sequence: u64,
    /// The actions, the last one the offending one.
    pub actions: Vec<Action>,
    /// What broke.
    pub what: String,
    /// The same finding on a fresh sequence of only the offending draws' actions, when that
    /// still breaks it (a shorter reproduction).
    pub shrunk: Option<Vec<Action>>,
}

/// What a run did and found.
#[derive(Clone, Debug, Default)]
pub struct ParticipantRun {
    /// Sequences run (the last one stopped at a finding).
    pub sequences: u64,
    /// Messages answered.
    pub messages: u64,
    /// Pairs of messages sent at once.
    pub races: u64,
    /// kill -9 and restarts of the participant (or database faults, with `db_fault`).
    pub restarts: u64,
    /// Database faults made, and those seen in place (the database's port refused).
    pub db_faults: (u32, u32),
    /// Times the participant stopped itself after a database fault (and was started again,
    /// as a supervisor would).
    pub exits_after_db_faults: u32,
    /// Every (phase, state before, answer) met.
    pub seen: BTreeSet<(Phase, BranchState, Answer)>,
    /// The first broken promise.
    pub finding: Option<Finding>,
    /// What the slow-clients check measured, and its two checks.
    pub slow: Option<(crate::slow::SlowRun, Vec<InvariantResult>)>,
    /// What the unauthenticated-bodies check measured.
    pub bodies: Option<crate::bodies::BodiesRun>,
    /// Whether the participant keeps an operator's price list.
    pub registry: Registry,
}

/// Whether a participant keeps an operator's price list (`POST /admin/activities`).
///
/// A Seata- or DTM-style participant takes the amount from its coordinator and keeps none: it
/// answers 404 (or 405) there, and [`PAID`] is then not applicable to it, said so in the
/// summary and the JSON; every other promise is judged as for one that keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Registry {
    /// Not asked yet (no sequence ran).
    #[default]
    Unknown,
    /// It took the operator's prices.
    Kept,
    /// Its first `POST /admin/activities` answered this status (404 or 405).
    Absent(u16),
}

impl Registry {
    /// Takes the answer of a `POST /admin/activities`: `Err` when it contradicts what the
    /// participant answered before or is not an answer the contract allows.
    fn after(self, status: u16) -> Result<Self, String> {
        match (status, self) {
            (200..=299, Self::Unknown | Self::Kept) => Ok(Self::Kept),
            (404 | 405, Self::Unknown) => Ok(Self::Absent(status)),
            (404 | 405, Self::Kept) => Err(format!(
                "answered {status} after it had taken the operator's prices"
            )),
            _ => Err(format!("answered {status}")),
        }
    }

    /// True when the participant keeps no price list.
    #[must_use]
    pub fn absent(self) -> bool {
        matches!(self, Self::Absent(_))
    }

    /// The [`PAID`] result of a participant without a price list, said as not applicable.
    fn not_applicable(self) -> Option<InvariantResult> {
        let Self::Absent(status) = self else {
            return None;
        };
        Some(InvariantResult {
            name: PAID.into(),
            verdict: Judgement::NotChecked,
            seed: None,
            first_offending_event: None,
            detail: Some(format!(
                "not applicable: the participant keeps no price list (POST /admin/activities \
                 answered {status}), so it charges what its coordinator sends; the price is the \
                 coordinator's to check"
            )),
        })
    }
}

impl ParticipantRun {
    /// The checks, one per kind of promise.
    #[must_use]
    pub fn checks(&self) -> Vec<InvariantResult> {
        [PAID, PROMISES, UNCHANGED, BOOKS]
            .into_iter()
            .map(|name| match &self.finding {
                Some(f) if f.check == name => InvariantResult {
                    name: name.into(),
                    verdict: Judgement::Violated,
                    seed: None,
                    first_offending_event: Some(f.what.clone()),
                    detail: Some(format!(
                        "sequence {}{}: {}",
                        f.sequence,
                        if f.shrunk.is_some() {
                            ", cut down to the offending draws"
                        } else {
                            ""
                        },
                        render(f.shrunk.as_deref().unwrap_or(&f.actions))
                    )),
                },
                _ if name == PAID => self
                    .registry
                    .not_applicable()
                    .unwrap_or_else(|| InvariantResult::held(name)),
                _ => InvariantResult::held(name),
            })
            .chain(self.db_took_effect())
            .chain(self.slow.iter().flat_map(|(_, c)| c.iter().cloned()))
            .chain(
                self.bodies
                    .iter()
                    .flat_map(crate::bodies::BodiesRun::checks),
            )
            .collect()
    }

    /// `faults.took_effect` of the database faults, when there were any to make.
    fn db_took_effect(&self) -> Option<InvariantResult> {
        let (made, seen) = self.db_faults;
        if made == 0 {
            return None;
        }
        Some(crate::db::took_effect(made, seen))
    }

    /// True when no promise was broken.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.checks()
            .iter()
            .all(|c| c.verdict != Judgement::Violated)
    }

    /// The answers the promises allow that no sequence met.
    #[must_use]
    pub fn unreached(&self) -> Vec<(Phase, BranchState, Answer)> {
        allowed()
            .into_iter()
            .filter(|t| !self.seen.contains(t))
            .collect()
    }
}

/// Every (phase, state before, answer) the promises allow.
#[must_use]
pub fn allowed() -> Vec<(Phase, BranchState, Answer)> {
    use Answer::{AlreadyDone, Applied, EmptyRollback, Refused};
    use BranchState::{Cancelled, Confirmed, Fresh, Suspended, Tried};
    let mut all = Vec::new();
    for phase in [Phase::Try, Phase::Confirm, Phase::Cancel] {
        for was in [Fresh, Tried, Confirmed, Cancelled, Suspended] {
            for answer in [Applied, AlreadyDone, EmptyRollback, Refused] {
                if referee::next(phase, was, answer).is_some() {
                    all.push((phase, was, answer));
                }
            }
        }
    }
    all
}

/// Actions as one line.
#[must_use]
pub fn render(actions: &[Action]) -> String {
    actions
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The HTTP side: the participant's routes, retried while it says it is busy.
struct Wire {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// On `POST /tcc/branch`.
    service: Option<String>,
}

impl Wire {
    fn new(
        url: &str,
        token: Option<String>,
        service: Option<String>,
    ) -> Result<Self, ContractError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| ContractError::Usage(format!("--url {url}: {e}")))?;
        if parsed.host_str().is_none() {
            return Err(ContractError::Usage(format!("--url {url}: no host")));
        }
        let rt = crate::real::runtime().map_err(|e| ContractError::Usage(e.to_string()))?;
        Ok(Self {
            rt,
            http: Self::client()?,
            base: url.trim_end_matches('/').to_owned(),
            service: service.or_else(|| token.clone()),
            token,
        })
    }

    /// A client with an empty connection pool (after a restart, the pooled connections are
    /// dead: a request on one would have an unknown outcome).
    fn client() -> Result<reqwest::Client, ContractError> {
        reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| ContractError::Usage(format!("HTTP client: {e}")))
    }

    /// One request and its answer (status, body), asked again while the participant answers
    /// 503 or 429 (it promises those change nothing).
    async fn ask(
        &self,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, String), ContractError> {
        let url = format!("{}{path}", self.base);
        let make = || {
            let request = match body {
                Some(b) => self.http.post(&url).json(b),
                None => self.http.get(&url),
            };
            // The participants' route takes the coordinator's credential, the rest the
            // operator's.
            let token = if path.starts_with("/tcc/") {
                &self.service
            } else {
                &self.token
            };
            match token {
                Some(t) => request.bearer_auth(t),
                None => request,
            }
        };
        match send_retrying_busy(make).await {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => Err(ContractError::Unreachable(format!(
                "{url}: still busy (503/429) after {BUSY_RETRIES} tries"
            ))),
            Err(e) => Err(ContractError::Unreachable(format!(
                "{url}: {} (the outcome is unknown: the run cannot judge it)",
                crate::ids::error_chain(&e)
            ))),
        }
    }

    fn admin(&self, path: &str, body: &serde_json::Value) -> Result<(), ContractError> {
        let (status, text) = self.rt.block_on(self.ask(path, Some(body)))?;
        if (200..300).contains(&status) {
            return Ok(());
        }
        Err(ContractError::Unreachable(format!(
            "POST {path} {body} answered {status}: {text}"
        )))
    }

    fn ledger(&self) -> Result<LedgerWire, ContractError> {
        let (status, text) = self.rt.block_on(self.ask("/ledger", None))?;
        if status != 200 {
            return Err(ContractError::Unreachable(format!(
                "GET /ledger answered {status}: {text}"
            )));
        }
        serde_json::from_str(&text)
            .map_err(|e| ContractError::Unreachable(format!("GET /ledger: {e} in {text:.200}")))
    }
}

/// Sends the request `make` builds, again (50 ms apart, up to [`BUSY_RETRIES`] times) while
/// the service answers 503 or 429, which the contracts say change nothing: the status and body,
/// `None` when it stayed busy, or the transport error (the outcome is then unknown).
pub(crate) async fn send_retrying_busy(
    make: impl Fn() -> reqwest::RequestBuilder,
) -> Result<Option<(u16, String)>, reqwest::Error> {
    for _ in 0..BUSY_RETRIES {
        let response = make().send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        if status != 503 && status != 429 {
            return Ok(Some((status, text)));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// The body of `POST /tcc/branch`.
fn branch_body(branch: Participant, msg: &ParticipantMsg) -> serde_json::Value {
    serde_json::json!({ "branch": branch, "msg": msg })
}

/// A reply of `POST /tcc/branch` as the contract has it: the branch, phase and draw it
/// answers, and an outcome `{"Ok": "Applied" | "AlreadyDone" | "EmptyRollback"}` or
/// `{"Err": <any reason>}`.
#[derive(Deserialize)]
struct WireReply {
    branch: Participant,
    phase: Phase,
    draw: DrawArgs,
    outcome: serde_json::Value,
}

/// An answer of `POST /tcc/branch`, reduced to what it says and its outcome's text; anything
/// that is not one is an error of the run (the contract is not kept), never a verdict.
fn answer_of(status: u16, text: &str) -> Result<(Said, String), ContractError> {
    let wrong =
        |why: String| ContractError::Unreachable(format!("POST /tcc/branch: {why}: {text:.300}"));
    if status != 200 {
        return Err(wrong(format!("answered {status}")));
    }
    let reply: WireReply = serde_json::from_str(text)
        .map_err(|e| wrong(format!("the answer is not a participant reply ({e})")))?;
    let answer = match (reply.outcome.get("Ok"), reply.outcome.get("Err")) {
        (Some(ok), None) => match ok.as_str() {
            Some("Applied") => Answer::Applied,
            Some("AlreadyDone") => Answer::AlreadyDone,
            Some("EmptyRollback") => Answer::EmptyRollback,
            _ => {
                return Err(wrong(format!(
                    "`Ok` is {ok}, not Applied, AlreadyDone or EmptyRollback"
                )));
            }
        },
        (None, Some(_)) => Answer::Refused,
        _ => {
            return Err(wrong(
                "the outcome is neither {\"Ok\": …} nor {\"Err\": …}".into(),
            ));
        }
    };
    let said = Said {
        branch: reply.branch,
        phase: reply.phase,
        draw: reply.draw,
        answer,
    };
    Ok((said, reply.outcome.to_string()))
}

/// The participant, and the server process when the tester owns it (and its database).
struct Bench {
    wire: Wire,
    server: Option<(CommandService, tempfile::TempDir)>,
    /// Stopped after the participant (fields drop in order).
    db: Option<crate::db::Database>,
    db_fault: Option<crate::db::DbFault>,
    /// Database faults made and seen in place.
    db_faults: (u32, u32),
    /// Times the participant had stopped itself after a database fault and was started again.
    exits: u32,
    /// Whether it keeps an operator's price list, from its first registration's answer.
    registry: Registry,
}

impl Bench {
    fn start(opts: &ParticipantOptions) -> Result<Self, ContractError> {
        let wire = Wire::new(
            &opts.url,
            opts.admin_token.clone(),
            opts.service_token.clone(),
        )?;
        let db = crate::db::Database::start_for(opts.db.as_ref(), opts.db_fault)?;
        let server = match &opts.command {
            Some(command) => {
                let command = db
                    .as_ref()
                    .map_or_else(|| command.clone(), |d| d.fill(command));
                let dir = tempfile::Builder::new()
                    .prefix("bench-participant-")
                    .tempdir()
                    .map_err(|e| ContractError::Usage(format!("cannot make a folder: {e}")))?;
                let data = dir.path().join("data");
                std::fs::create_dir(&data)
                    .map_err(|e| ContractError::Usage(format!("cannot make {data:?}: {e}")))?;
                let port = load::conn::socket_addr(&opts.url)
                    .map_err(|e| ContractError::Usage(e.to_string()))?
                    .port();
                let service = CommandService::start(CommandSpec {
                    name: "participant".into(),
                    command: command.replace("{data}", &data.display().to_string()),
                    port,
                    env: Vec::new(),
                    log: dir.path().join("participant.log"),
                    netns: None,
                })?;
                Some((service, dir))
            }
            None => None,
        };
        Ok(Self {
            wire,
            server,
            db,
            db_fault: opts.db_fault,
            db_faults: (0, 0),
            exits: 0,
            registry: Registry::Unknown,
        })
    }

    /// Registers `activity` at [`PRICE_MINOR`] where the participant keeps a price list; the
    /// first answer says whether it does.
    fn register(&mut self, activity: ActivityId) -> Result<(), ContractError> {
        if self.registry.absent() {
            return Ok(());
        }
        let body = serde_json::json!({"activity": activity.0, "price_minor": PRICE_MINOR});
        let (status, text) = self
            .wire
            .rt
            .block_on(self.wire.ask("/admin/activities", Some(&body)))?;
        self.registry = self.registry.after(status).map_err(|why| {
            ContractError::Unreachable(format!("POST /admin/activities {body} {why}: {text:.300}"))
        })?;
        Ok(())
    }

    /// `e`, with the end of the participant's log when it is no longer running.
    fn explain(&mut self, e: ContractError) -> ContractError {
        let Some((service, _)) = self.server.as_mut() else {
            return e;
        };
        if !service.is_down() {
            return e;
        }
        let log = std::fs::read_to_string(service.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(8)..].join("\n");
        ContractError::Unreachable(format!(
            "{e}; the participant exited, its log ends:\n{tail}"
        ))
    }

    fn restart(&mut self) -> Result<(), ContractError> {
        if let (Some(db), Some(fault)) = (self.db.as_mut(), self.db_fault) {
            let seen = db.fault_and_heal(fault, crate::db::DOWN_BETWEEN_MESSAGES)?;
            self.db_faults.0 += 1;
            self.db_faults.1 += u32::from(seen);
            self.wire.http = Wire::client()?;
            let (wire, server, exits) = (&self.wire, &mut self.server, &mut self.exits);
            return crate::db::wait_until_back(|| {
                // A participant that stops itself when its database fails (fail-stop) is
                // started again, as its supervisor would; the run counts it.
                if let Some((service, _)) = server.as_mut()
                    && service.is_down()
                {
                    service.restart().map_err(|e| e.to_string())?;
                    *exits += 1;
                }
                wire.ledger().map(|_| ()).map_err(|e| e.to_string())
            })
            .map_err(ContractError::Unreachable);
        }
        let Some((service, _)) = self.server.as_mut() else {
            return Err(ContractError::Usage(
                "restarts need the command that starts the participant (--server-cmd)".into(),
            ));
        };
        service.kill9()?;
        service.restart()?;
        self.wire.http = Wire::client()?;
        Ok(())
    }
}

/// One sequence on the participant: the referee, the books' starting point, what was met.
struct Sequence<'a> {
    bench: &'a mut Bench,
    universe: Universe,
    referee: Referee,
    start: View,
    seen: BTreeSet<(Phase, BranchState, Answer)>,
    messages: u64,
    races: u64,
    restarts: u64,
}

/// A broken promise of one step: the check and what broke.
type Broke = (&'static str, String);

impl<'a> Sequence<'a> {
    /// Opens the sequence's accounts and stock and reads the books' starting point.
    fn open(bench: &'a mut Bench, universe: Universe) -> Result<Self, ContractError> {
        let first = universe.user(0).0.min(universe.user(1).0);
        bench.wire.admin(
            "/admin/accounts",
            &serde_json::json!({"user": first, "count": 2, "balance_minor": BALANCE_MINOR}),
        )?;
        for activity in universe.activities() {
            // The operator's price first: the participant charges it and nothing else.
            bench.register(activity)?;
            bench.wire.admin(
                "/admin/stock",
                &serde_json::json!({"activity": activity.0, "units": UNITS}),
            )?;
        }
        let start = View::of(&bench.wire.ledger()?, universe);
        Ok(Self {
            bench,
            universe,
            referee: Referee::new(),
            start,
            seen: BTreeSet::new(),
            messages: 0,
            races: 0,
            restarts: 0,
        })
    }

    fn view(&self) -> Result<View, ContractError> {
        Ok(View::of(&self.bench.wire.ledger()?, self.universe))
    }

    /// Runs one action: `Ok(Some(..))` is a broken promise.
    fn act(&mut self, action: Action) -> Result<Option<Broke>, ContractError> {
        let before = self.view()?;
        let broke = match action {
            Action::One(send) => self.one(send, &before)?,
            Action::Race(a, b) => self.race(a, b)?,
            Action::Restart => {
                self.bench.restart()?;
                self.restarts += 1;
                None
            }
        };
        if broke.is_some() {
            return Ok(broke);
        }
        Ok(self.books(&self.view()?).err().map(|what| (BOOKS, what)))
    }

    fn send(&self, send: Send) -> impl Future<Output = Result<(u16, String), ContractError>> {
        let body = branch_body(send.branch, &self.universe.msg(send));
        let wire = &self.bench.wire;
        async move { wire.ask("/tcc/branch", Some(&body)).await }
    }

    fn one(&mut self, send: Send, before: &View) -> Result<Option<Broke>, ContractError> {
        let (status, text) = self.bench.wire.rt.block_on(self.send(send))?;
        let (said, outcome) = answer_of(status, &text)?;
        self.messages += 1;
        let msg = self.universe.msg(send);
        let was = self.referee.state(msg.draw.xid, send.branch);
        self.seen.insert((send.phase, was, said.answer));
        if let Some(broke) = self.off_price(send, &msg, said.answer, &outcome) {
            return Ok(Some(broke));
        }
        match self.referee.judge_said(send.branch, &msg, &said) {
            Err(broken) => Ok(Some((PROMISES, format!("{send}: {broken} ({outcome})")))),
            Ok(t) if t.changes_nothing() => {
                let after = self.view()?;
                Ok((after != *before).then(|| (UNCHANGED, changed(send, &t, before, &after))))
            }
            Ok(_) => Ok(None),
        }
    }

    /// Two messages at once: the answers must be explained by one of the two orders.
    fn race(&mut self, a: Send, b: Send) -> Result<Option<Broke>, ContractError> {
        let (ra, rb) = {
            let (fa, fb) = (self.send(a), self.send(b));
            self.bench.wire.rt.block_on(async { tokio::join!(fa, fb) })
        };
        let ((sa, ta), (sb, tb)) = (ra?, rb?);
        let (ra, rb) = (answer_of(sa, &ta)?, answer_of(sb, &tb)?);
        self.messages += 2;
        self.races += 1;
        let (ma, mb) = (self.universe.msg(a), self.universe.msg(b));
        let wasa = self.referee.state(ma.draw.xid, a.branch);
        let wasb = self.referee.state(mb.draw.xid, b.branch);
        let ((sa, oa), (sb, ob)) = (ra, rb);
        if let Some(broke) = self
            .off_price(a, &ma, sa.answer, &oa)
            .or_else(|| self.off_price(b, &mb, sb.answer, &ob))
        {
            return Ok(Some(broke));
        }
        let answers = [(a.branch, ma, sa), (b.branch, mb, sb)];
        match self.referee.judge_concurrent(&answers) {
            Ok(transitions) => {
                self.seen
                    .extend(transitions.iter().map(|t| (t.phase, t.was, t.answer)));
                Ok(None)
            }
            Err(last) => Ok(Some((
                PROMISES,
                format!(
                    "at once {{{a}: {} (branch was {wasa:?}); {b}: {} (branch was \
                     {wasb:?})}}: no order of the two explains both answers ({last})",
                    oa, ob
                ),
            ))),
        }
    }

    /// [`off_price`] where the participant keeps a price list (without one, it charges what
    /// its coordinator sends).
    fn off_price(
        &self,
        send: Send,
        msg: &ParticipantMsg,
        answer: Answer,
        outcome: &str,
    ) -> Option<Broke> {
        if self.bench.registry.absent() {
            return None;
        }
        off_price(send, msg, answer, outcome)
    }

    fn books(&self, now: &View) -> Result<(), String> {
        check_books(
            &self.start,
            now,
            &self.referee.books(),
            self.universe.activities(),
        )
    }
}

/// `lottery.paid` at the participant: a Try that charges (the wallet freezes the price, the
/// participation log records it) took effect at another price than the one the operator
/// registered ([`PRICE_MINOR`]).
fn off_price(send: Send, msg: &ParticipantMsg, answer: Answer, outcome: &str) -> Option<Broke> {
    let charges = matches!(
        send.branch,
        Participant::Wallet | Participant::Participation
    );
    (send.phase == Phase::Try
        && charges
        && answer == Answer::Applied
        && msg.draw.price_minor != PRICE_MINOR)
        .then(|| {
            (
                PAID,
                format!(
                    "{send}: a Try at {} took effect on an activity that costs {PRICE_MINOR} \
                     ({outcome}): the participant charges what the coordinator says, not the \
                     operator's price",
                    msg.draw.price_minor
                ),
            )
        })
}

/// The books are what the branches went through (`want`), counted from the sequence's
/// start; money and each of its `activities`' stock are conserved.
fn check_books(
    start: &View,
    now: &View,
    want: &referee::Books,
    activities: [ActivityId; 2],
) -> Result<(), String> {
    let delta = |now: u128, start: u128| now as i128 - start as i128;
    let money = [
        (
            "frozen money (change since the sequence began)",
            delta(now.frozen_minor, start.frozen_minor),
            i128::from(want.frozen_minor),
        ),
        (
            "collected money (change since the sequence began)",
            delta(now.collected_minor, start.collected_minor),
            i128::from(want.collected_minor),
        ),
        (
            "participation records (change since the sequence began)",
            i128::from(now.participations) - i128::from(start.participations),
            i128::from(want.participations_open + want.participations_confirmed),
        ),
        (
            "money over balances, frozen and collected (change since the sequence began)",
            delta(now.money_minor(), start.money_minor()),
            0,
        ),
    ];
    for (what, got, want) in money {
        if got != want {
            return Err(format!("{what} is {got}, the branches say {want}"));
        }
    }
    for activity in activities {
        let Some(&(total, available, reserved, issued)) = now.stock.get(&activity.0) else {
            return Err(format!("activity {activity} is missing from GET /ledger"));
        };
        let of = |what: &str| format!("{what} of activity {activity}");
        referee::expect(of("reserved"), reserved, want.reserved(activity))
            .and_then(|()| referee::expect(of("issued"), issued, want.issued(activity)))
            .and_then(|()| referee::expect(of("total"), total, UNITS))
            .and_then(|()| {
                referee::expect(
                    of("available + reserved + issued"),
                    available + reserved + issued,
                    total,
                )
            })
            .map_err(|b| b.to_string())?;
    }
    Ok(())
}

/// What a repeat or refusal changed: the figures that differ.
fn changed(send: Send, t: &Transition, before: &View, after: &View) -> String {
    let what = if t.answer == Answer::Refused {
        "refusal"
    } else {
        "repeat"
    };
    let mut diffs = Vec::new();
    let mut figure = |name: &str, b: u128, a: u128| {
        if a != b {
            diffs.push(format!("{name} {b} -> {a}"));
        }
    };
    figure(
        "balances_minor",
        before.balances_minor,
        after.balances_minor,
    );
    figure("frozen_minor", before.frozen_minor, after.frozen_minor);
    figure(
        "collected_minor",
        before.collected_minor,
        after.collected_minor,
    );
    figure(
        "participations",
        u128::from(before.participations),
        u128::from(after.participations),
    );
    if before.stock != after.stock {
        diffs.push(format!("stock {:?} -> {:?}", before.stock, after.stock));
    }
    format!(
        "a {what} changed the books: {send} answered {:?}; {}",
        t.answer,
        diffs.join(", ")
    )
}

/// Numbers (users, activities, draws) one run may use from its [`fresh_base`] on.
pub const RUN_NUMBERS: u64 = 1 << 24;
/// Most sequences of one run: each takes 2 × 1,024 numbers of the run's range.
pub const SEQUENCES_MAX: u64 = RUN_NUMBERS / 2_048;

/// A fresh range of [`RUN_NUMBERS`] numbers for this run, one of 2^22 slots from 2^40 on
/// (below 2^47: within i64 everywhere), picked at random: the service's store keeps what earlier
/// runs opened, and two runs share a slot with odds of one in four million.
pub(crate) fn fresh_base() -> u64 {
    let nonce = load::target::bench_admin_token()
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    (1 << 40) + (nonce % (1 << 22)) * RUN_NUMBERS
}

/// Runs the hostile sequences on the participant.
///
/// # Errors
/// The participant could not be started or reached, or did not keep the contract's form
/// (not a verdict).
pub fn run(opts: &ParticipantOptions) -> Result<ParticipantRun, ContractError> {
    if opts.kill_every > 0 && opts.command.is_none() {
        return Err(ContractError::Usage(
            "--kill-every needs --server-cmd (the tester must own the participant)".into(),
        ));
    }
    let commands: Vec<String> = opts.command.iter().cloned().collect();
    crate::db::validate_contract(opts.db.as_ref(), opts.db_fault, &commands, opts.kill_every)
        .map_err(ContractError::Usage)?;
    if opts.sequences > SEQUENCES_MAX || opts.steps > 1_000 {
        return Err(ContractError::Usage(format!(
            "--sequences {} --steps {}: at most {SEQUENCES_MAX} sequences of 1,000 messages",
            opts.sequences, opts.steps
        )));
    }
    if let Some(spec) = &opts.slow {
        spec.validate().map_err(ContractError::Usage)?;
    }
    if let Some(spec) = &opts.bodies {
        spec.validate().map_err(ContractError::Usage)?;
    }
    let mut bench = Bench::start(opts)?;
    let base = fresh_base();
    let mut run = ParticipantRun::default();
    for index in 0..opts.sequences {
        let actions = sequence(opts.seed, index, opts.steps, opts.kill_every);
        let universe = Universe {
            base: base + 2 * index * 1_024,
        };
        let (done, broke) =
            play(&mut bench, universe, &actions, &mut run).map_err(|e| bench.explain(e))?;
        run.sequences += 1;
        if let Some((check, what)) = broke {
            let offending = &actions[..done];
            let shrunk = shrink(
                &mut bench,
                Universe {
                    base: universe.base + 1_024,
                },
                offending,
                check,
            )?;
            run.finding = Some(Finding {
                check,
                sequence: index,
                actions: offending.to_vec(),
                what,
                shrunk,
            });
            break;
        }
    }
    run.registry = bench.registry;
    if let Some(spec) = &opts.slow {
        let probe = crate::slow::Probe {
            bearer: opts.admin_token.clone(),
            ..crate::slow::Probe::get("/ledger")
        };
        let spec = crate::slow::SlowSpec {
            stall_path: spec
                .stall_path
                .clone()
                .or_else(|| Some("/tcc/branch".to_owned())),
            ..spec.clone()
        };
        let slow = spec
            .run(&opts.url, probe)
            .map_err(|e| ContractError::Usage(format!("--slow-clients: {e}")))?;
        run.slow = Some(slow);
    }
    if let Some(spec) = &opts.bodies {
        let pid = bench.server.as_ref().and_then(|(s, _)| s.pid());
        let bodies = crate::bodies::run(spec, &opts.url, BODIES_PATH, pid)
            .map_err(|e| ContractError::Usage(format!("--unauth-bodies: {e}")))?;
        run.bodies = Some(bodies);
    }
    run.db_faults = bench.db_faults;
    run.exits_after_db_faults = bench.exits;
    drop(bench);
    Ok(run)
}

/// Plays `actions` on a fresh universe: how many ran (the last the offending one) and the
/// first broken promise.
fn play(
    bench: &mut Bench,
    universe: Universe,
    actions: &[Action],
    run: &mut ParticipantRun,
) -> Result<(usize, Option<Broke>), ContractError> {
    let mut seq = Sequence::open(bench, universe)?;
    let mut outcome = (actions.len(), None);
    for (i, action) in actions.iter().enumerate() {
        if let Some(broke) = seq.act(*action)? {
            outcome = (i + 1, Some(broke));
            break;
        }
    }
    run.messages += seq.messages;
    run.races += seq.races;
    run.restarts += seq.restarts;
    run.seen.extend(seq.seen);
    Ok(outcome)
}

/// The offending sequence cut to the actions on the draws of its last action (and restarts);
/// kept when it still breaks the same check on a fresh universe.
fn shrink(
    bench: &mut Bench,
    universe: Universe,
    actions: &[Action],
    check: &'static str,
) -> Result<Option<Vec<Action>>, ContractError> {
    let draws: BTreeSet<u64> = match actions.last() {
        Some(Action::One(s)) => [s.draw].into(),
        Some(Action::Race(a, b)) => [a.draw, b.draw].into(),
        _ => return Ok(None),
    };
    let cut: Vec<Action> = actions
        .iter()
        .copied()
        .filter(|a| match a {
            Action::One(s) => draws.contains(&s.draw),
            Action::Race(x, y) => draws.contains(&x.draw) || draws.contains(&y.draw),
            Action::Restart => true,
        })
        .collect();
    if cut.len() == actions.len() {
        return Ok(None);
    }
    let mut scratch = ParticipantRun::default();
    let (done, broke) = play(bench, universe, &cut, &mut scratch)?;
    Ok(broke
        .filter(|(c, _)| *c == check)
        .map(|_| cut[..done].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: Universe = Universe { base: 1_000 };

    #[test]
    fn a_price_list_is_absent_only_when_the_first_registration_says_so() {
        assert_eq!(Registry::Unknown.after(201), Ok(Registry::Kept));
        assert_eq!(Registry::Unknown.after(404), Ok(Registry::Absent(404)));
        assert_eq!(Registry::Unknown.after(405), Ok(Registry::Absent(405)));
        // A registry that vanishes halfway, or a refusal, is a broken contract, not a pass.
        assert!(Registry::Kept.after(404).is_err());
        assert!(Registry::Unknown.after(401).is_err());
        assert!(Registry::Unknown.after(500).is_err());
    }

    #[test]
    fn the_price_check_says_not_applicable_only_without_a_price_list() {
        let without = ParticipantRun {
            registry: Registry::Absent(404),
            ..ParticipantRun::default()
        };
        let paid = |run: &ParticipantRun| {
            run.checks()
                .into_iter()
                .find(|c| c.name == PAID)
                .expect("lottery.paid is reported")
        };
        let na = paid(&without);
        assert_eq!(na.verdict, Judgement::NotChecked);
        assert!(
            na.detail
                .as_deref()
                .unwrap_or("")
                .starts_with("not applicable")
        );
        let with = ParticipantRun {
            registry: Registry::Kept,
            ..ParticipantRun::default()
        };
        assert_eq!(paid(&with).verdict, Judgement::Held);
        // Every other promise is still judged.
        for check in without.checks().iter().filter(|c| c.name != PAID) {
            assert_eq!(check.verdict, Judgement::Held, "{}", check.name);
        }
    }

    fn view(frozen_minor: u128, stock: (u64, u64, u64, u64)) -> View {
        View {
            balances_minor: 70 - frozen_minor,
            frozen_minor,
            collected_minor: 0,
            participations: 0,
            stock: U.activities().iter().map(|a| (a.0, stock)).collect(),
        }
    }

    fn tried_wallet() -> Referee {
        let mut r = Referee::new();
        let send = Send {
            draw: 1,
            branch: Participant::Wallet,
            phase: Phase::Try,
        };
        r.judge_answer(send.branch, &U.msg(send), Answer::Applied)
            .unwrap();
        r
    }

    #[test]
    fn the_books_check_passes_when_the_ledger_follows_the_branches() {
        let start = view(0, (UNITS, UNITS, 0, 0));
        let now = view(10, (UNITS, UNITS, 0, 0));
        let want = tried_wallet().books();
        assert_eq!(check_books(&start, &now, &want, U.activities()), Ok(()));
    }

    #[test]
    fn the_books_check_fires_on_money_frozen_for_no_open_try() {
        // A hanging Try's signature: money frozen that no open Try explains.
        let start = view(0, (UNITS, UNITS, 0, 0));
        let now = view(10, (UNITS, UNITS, 0, 0));
        let err = check_books(&start, &now, &Referee::new().books(), U.activities()).unwrap_err();
        assert!(err.starts_with("frozen money"), "{err}");
    }

    #[test]
    fn the_books_check_fires_on_money_or_stock_not_conserved() {
        let start = view(0, (UNITS, UNITS, 0, 0));
        let mut now = view(10, (UNITS, UNITS, 0, 0));
        now.balances_minor += 1;
        let want = tried_wallet().books();
        let err = check_books(&start, &now, &want, U.activities()).unwrap_err();
        assert!(err.starts_with("money over balances"), "{err}");
        let now = view(10, (UNITS, UNITS, 1, 0));
        let err = check_books(&start, &now, &want, U.activities()).unwrap_err();
        assert!(err.starts_with("reserved of activity"), "{err}");
        let now = view(10, (UNITS, 1, 0, 0));
        let err = check_books(&start, &now, &want, U.activities()).unwrap_err();
        assert!(err.starts_with("available + reserved + issued"), "{err}");
    }

    #[test]
    fn sequences_are_the_same_for_a_seed_and_restart_where_asked() {
        let a = sequence(7, 3, 40, 10);
        assert_eq!(a, sequence(7, 3, 40, 10));
        assert_ne!(a, sequence(8, 3, 40, 10));
        let restarts = a.iter().filter(|x| **x == Action::Restart).count();
        assert_eq!(restarts, 4, "{}", render(&a));
        assert!(sequence(7, 3, 40, 0).iter().all(|x| *x != Action::Restart));
        // Draws without an inventory branch are never sent one.
        for action in &a {
            if let Action::One(s) | Action::Race(s, _) = action {
                assert!(U.draw(s.draw).has_branch(s.branch), "{s}");
            }
        }
    }

    #[test]
    fn sixteen_answers_are_allowed() {
        assert_eq!(allowed().len(), 16);
    }
}
