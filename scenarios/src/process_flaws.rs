//! Flaws in process mode: broken designs run as real server processes and caught through
//! their HTTP API by the black-box testers' generic checks, `scenario ids` for ID services and
//! `scenario tcc` for TCC participants (docs/own-service.md). Two kinds of entry:
//!
//! - upstream bugs: the mechanisms of real bugs in ID services others wrote, each named by its
//!   origin, reproduced by `id-compat` (a test-only service that speaks the upstream project's
//!   API, the `compat` crate's `id-compat` binary);
//! - catalogued flaws of the reference implementation that have a real-server form, switched
//!   on in `sut-server` (`--flaw`).
//!
//! Each entry also runs once without the bug (the control), which must pass: a check that fires
//! on correct code proves nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use blackbox::ids::{
    BlackBoxError, BlackBoxFault, BlackBoxNemesis, BlackBoxOptions, BlackBoxRun, Monotonic, Target,
};
use blackbox::tcc::{ParticipantOptions, ParticipantRun};
use blackbox::tokens::{TokensOptions, TokensRun};
use reports::model::Judgement;

/// The server program an entry runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// `id-compat --api API`.
    IdCompat(&'static str),
    /// `sut-server`, IDs from `GET /id/{key}`.
    SutServer,
    /// `sut-server`, IDs from `GET /snowflake`.
    SutServerSnowflake,
    /// `sut-server`, semantic IDs from `GET /semantic/OD` (their 18 digits as the number).
    SutServerSemantic,
    /// `sut-server` as a TCC participant (`POST /tcc/branch`), tested by `scenario tcc`.
    SutServerParticipant,
    /// `sut-server`'s one-time tokens, tested by `scenario tokens`.
    SutServerTokens,
    /// `tcc-compat`, a participant with Seata's fence table, tested by `scenario tcc`.
    TccCompat,
    /// `redis-server` (on PATH) as an `INCR` counter, tested by `scenario ids --target redis`.
    Redis,
    /// `sut-server`, IDs from `GET /id/{key}`, then the capacity check on a fresh start
    /// (`scenario ids --overload`).
    SutServerOverload,
    /// `sut-server`, IDs from `GET /id/{key}`, gaps judged (`scenario ids --gaps-max 0`).
    SutServerGaps,
    /// `sut-server`, IDs from `GET /id/{key}`, then [`HELD_CLIENTS`] keep-alive connections
    /// held from many addresses (`scenario ids --held-clients`).
    SutServerHeld,
    /// `sut-server --role id` processes on one database in contention mode (`scenario
    /// cluster_pg --contention`).
    SutServerContention(chaos::Backend),
}

impl Program {
    /// The binary's name.
    #[must_use]
    pub const fn binary(self) -> &'static str {
        match self {
            Self::IdCompat(_) => "id-compat",
            Self::TccCompat => "tcc-compat",
            Self::Redis => "redis-server",
            Self::SutServer
            | Self::SutServerOverload
            | Self::SutServerGaps
            | Self::SutServerHeld
            | Self::SutServerContention(_)
            | Self::SutServerSnowflake
            | Self::SutServerSemantic
            | Self::SutServerParticipant
            | Self::SutServerTokens => "sut-server",
        }
    }
}

/// One entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessFlaw {
    /// The name on command lines.
    pub name: &'static str,
    /// Where it comes from.
    pub origin: &'static str,
    /// What it does, in one paragraph.
    pub mechanism: &'static str,
    /// The check that must catch it (a prefix of the check's name).
    pub caught_by: &'static str,
    /// The server program.
    program: Program,
    /// Instances on one database.
    servers: usize,
    /// Server flags that plant the bug (the control runs without them).
    planted: &'static str,
    /// Server flags of the control run only.
    control: &'static str,
    /// Server flags of both runs.
    common: &'static str,
    /// Faults of both runs: which, every how long, for how long, and a clock step's size.
    faults: &'static [BlackBoxFault],
    every_ms: u64,
    down_ms: u64,
    clock_step_ms: i64,
    /// What the service promises.
    monotonic: Monotonic,
}

/// Every entry.
pub const ENTRIES: [ProcessFlaw; 21] = [
    ProcessFlaw {
        name: "leaf_pr156_commit_before_select",
        origin: "Meituan Leaf PR #156 (unmerged): https://github.com/Meituan-Dianping/Leaf/pull/156",
        mechanism: "updateMaxIdAndGetLeafAlloc commits `UPDATE leaf_alloc SET max_id = max_id + \
                    step` before its `SELECT max_id`; two Leaf servers refreshing one tag both \
                    update, then both read the later max_id and take the same segment",
        caught_by: "ids.unique",
        program: Program::IdCompat("leaf"),
        servers: 2,
        planted: "--planted-race",
        control: "",
        common: "",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::Server,
    },
    ProcessFlaw {
        name: "tinyid_issue47_load_race",
        origin: "Didi Tinyid issue #47 (open): https://github.com/didi/tinyid/issues/47",
        mechanism: "CachedIdGenerator's loadNext fetches segment 2 in the background; the current \
                    segment runs out first and loadCurrent (another lock) fetches segment 3; \
                    segment 2 lands as `next` afterwards: IDs go 1, 3, 2, backwards within one \
                    server",
        caught_by: "ids.monotonic",
        program: Program::IdCompat("tinyid"),
        servers: 1,
        planted: "--planted-reorder",
        control: "",
        common: "--step 50 --race-window-ms 50",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::Server,
    },
    ProcessFlaw {
        name: "uid_generator_issue85_borrowed_seconds",
        origin: "Baidu uid-generator issue #85 (open): https://github.com/baidu/uid-generator/issues/85",
        mechanism: "CachedUidGenerator fills its ring with the next second's IDs whenever it runs \
                    low, so under load the time field runs ahead of the clock; after a restart \
                    IDs restart at the real second, below those already handed out (the new \
                    worker id sits below the time field and does not help)",
        caught_by: "ids.monotonic",
        program: Program::IdCompat("uid"),
        servers: 1,
        planted: "--planted-borrow",
        control: "",
        common: "--seq-bits 6",
        faults: &[BlackBoxFault::Kill],
        every_ms: 1_500,
        down_ms: 200,
        clock_step_ms: 0,
        monotonic: Monotonic::Global,
    },
    ProcessFlaw {
        name: "seata_5256_6374_fence_rolled_back_with_try",
        origin: "Apache Seata issues #5256 and #6374 (open): \
                 https://github.com/apache/incubator-seata/issues/5256, \
                 https://github.com/apache/incubator-seata/issues/6374",
        mechanism: "the TCC fence row is written in the Try's own local transaction; a Try that \
                    fails after an effect outside that transaction (a freeze committed at the \
                    payment service) rolls the fence row back with it, so the Cancel that follows \
                    finds no row, records an empty rollback and skips the compensation: money \
                    stays frozen for a draw that never happened",
        caught_by: "participant.",
        program: Program::TccCompat,
        servers: 1,
        planted: "--planted-fence-rollback",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Kill],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "segment_no_version_check",
        origin: "this catalog (`scenario flaws --list`), in sut-server processes",
        mechanism: "two sut-server processes on one SQLite file, the segment reload writing \
                    `max_id = read + step` without the version check: two servers that read the \
                    same row take the same range",
        caught_by: "ids.unique",
        program: Program::SutServer,
        servers: 2,
        planted: "--flaw segment_no_version_check",
        control: "",
        common: "--step-max 10",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "snowflake_seq_reset_first",
        origin: "this catalog (`scenario flaws --list`), in a sut-server process",
        mechanism: "Snowflake resets the sequence before it checks for a backward clock: the \
                    server's wall clock stepped back 3 ms (libfaketime) is waited out, then the \
                    last millisecond's sequence starts again from 0",
        caught_by: "ids.unique",
        program: Program::SutServerSnowflake,
        servers: 1,
        planted: "--flaw snowflake_seq_reset_first",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Clock],
        every_ms: 100,
        down_ms: 50,
        clock_step_ms: 3,
        monotonic: Monotonic::Server,
    },
    ProcessFlaw {
        name: "semantic_seq_wrap",
        origin: "this catalog (`scenario flaws --list`), in sut-server processes",
        mechanism: "the design's semantic ID takes its sequence as `seq % capacity`: two \
                    sut-server processes serving `GET /semantic/OD` at 100 a second each wrap \
                    within a busy second and hand an ID out again (the correct server answers \
                    503 with `Retry-After` until the next second)",
        caught_by: "ids.unique",
        program: Program::SutServerSemantic,
        servers: 2,
        planted: "--flaw semantic_seq_wrap",
        control: "",
        common: "--semantic-per-second 100",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "counter_no_persist",
        origin: "this catalog (`scenario flaws --list`), in sut-server processes",
        mechanism: "two sut-server processes on one SQLite file, killed in turn every 300 ms, \
                    whose segment reload starts issuing from the max_id it read before its own \
                    write of the new max_id is durable: a process killed in between leaves \
                    IDs handed out from a range the database never granted it",
        caught_by: "ids.unique",
        program: Program::SutServer,
        servers: 2,
        planted: "--flaw counter_no_persist",
        control: "",
        common: "--step-max 10",
        faults: &[BlackBoxFault::Kill],
        every_ms: 300,
        down_ms: 100,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "counter_everysec",
        origin: "this catalog (`scenario flaws --list`), in a real Redis",
        mechanism: "a Redis INCR counter with `appendfsync everysec` acknowledges before its \
                    append-only file is synced; a power loss every second (every write not \
                    fsynced dropped by the lost-writes filesystem under its --dir) makes it hand \
                    out IDs again; the control syncs every write (`appendfsync always`)",
        caught_by: "ids.unique",
        program: Program::Redis,
        servers: 1,
        planted: "--appendfsync everysec",
        control: "--appendfsync always",
        common: "--appendonly yes --save ''",
        faults: &[BlackBoxFault::PowerLoss],
        every_ms: 1_000,
        down_ms: 300,
        clock_step_ms: 0,
        monotonic: Monotonic::Global,
    },
    ProcessFlaw {
        name: "time_field_narrow",
        origin: "this catalog (`scenario flaws --list`), in a sut-server process",
        mechanism: "Snowflake's 41-bit time field (ms since 2020-01-01) runs out in 2089; the \
                    server's wall clock is moved by libfaketime to 2 s before that for 3 s: the flawed sequencer masks the time into the field and its IDs \
                    start again near 0, the correct one refuses once the field is exhausted",
        caught_by: "ids.monotonic",
        program: Program::SutServerSnowflake,
        servers: 1,
        planted: "--flaw time_field_narrow",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Clock],
        every_ms: 1_000,
        down_ms: 3_000,
        clock_step_ms: CLOCK_TO_TIME_FIELD_END,
        monotonic: Monotonic::Server,
    },
    ProcessFlaw {
        name: "tcc_no_fence",
        origin: "this catalog (`scenario flaws --list`), in a sut-server process",
        mechanism: "TCC participants without a fence, sent coordinator messages over POST \
                    /tcc/branch by `scenario tcc`'s hostile coordinator (in any order, repeated, \
                    two at once, across kill -9): a Cancel that overtook its Try is refused \
                    instead of recorded as an empty rollback, a Try delayed past its Cancel \
                    takes effect (money frozen for a cancelled draw), a repeated Confirm \
                    collects twice",
        caught_by: "participant.",
        program: Program::SutServerParticipant,
        servers: 1,
        planted: "--flaw tcc_no_fence",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Kill],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "client_price",
        origin: "this catalog (`scenario flaws --list`), in a sut-server process",
        mechanism: "TCC participants that charge whatever amount the coordinator's Try carries (the draw's price taken from the client's request, OWASP API6): `scenario tcc`'s hostile coordinator sends one draw per sequence at price 0 for an activity the operator registered at 10, and the wallet freezes 0",
        caught_by: "lottery.paid",
        program: Program::SutServerParticipant,
        servers: 1,
        planted: "--flaw client_price",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Kill],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "once_check_then_delete",
        origin: "this catalog (`scenario flaws --list`), in sut-server processes",
        mechanism: "two sut-server processes on one SQLite file whose one-time-token consume \
                    checks the token in one transaction and marks it used in a second: \
                    `scenario tokens` consumes each token from several clients at once over both \
                    servers, and two of them pass the check before either marks it",
        caught_by: "tokens.once",
        program: Program::SutServerTokens,
        servers: 2,
        planted: "--flaw once_check_then_delete",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Kill],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "sequential_tokens",
        origin: "this catalog (`scenario flaws --list`), in sut-server processes",
        mechanism: "one-time token values from a counter instead of 128 random bits (the planted \
                    weakness `sut-server --weakness sequential_tokens`): `scenario tokens` finds \
                    issued values that are neighbours, so a client holding one names the others",
        caught_by: "tokens.unguessable",
        program: Program::SutServerTokens,
        servers: 2,
        planted: "--weakness sequential_tokens",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Kill],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "no_token_quota",
        origin: "this catalog (`scenario flaws --list`), in sut-server processes",
        mechanism: "no per-user rate on issuing one-time tokens (the planted weakness \
                    `sut-server --weakness no_token_quota`): one user of `scenario tokens` is \
                    issued a token for every one of 60 activities back to back, the way one \
                    client fills the table for everyone",
        caught_by: "tokens.quota",
        program: Program::SutServerTokens,
        servers: 2,
        planted: "--weakness no_token_quota",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Kill],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "body_before_auth",
        origin: "a planted weakness of the deployed server (`sut-server --weakness \
                 body_before_auth`): the server as it was before the credential was decided \
                 from the head",
        mechanism: "every admitted route's body read whole (up to 256 KiB) before its \
                    credential is looked at: 1,000 connections of `scenario tokens \
                    --unauth-bodies` each post 255 of 256 KiB to `POST /tokens/once` with no \
                    JWT, and the server waits for the last byte of each instead of refusing \
                    it from the head, holding what it read",
        caught_by: "service.refused_from_head",
        program: Program::SutServerTokens,
        servers: 1,
        planted: "--weakness body_before_auth",
        control: "",
        common: "",
        faults: &[BlackBoxFault::Kill],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::None,
    },
    ProcessFlaw {
        name: "conn_slot_leak",
        origin: "a planted weakness of the deployed server (`sut-server --weakness \
                 conn_slot_leak`), missed by the run's own checks and by --slow-clients",
        mechanism: "a connection's slots (the process's, its peer address's) given back only \
                    when it ends cleanly: every client that gives up mid-request and resets \
                    its connection keeps one for good; the capacity check overloads the server \
                    with 1,000 clients that give up after 20 ms, and its rate after must come \
                    back to 0.7 of the rate before (the catalog's bar, wide for a machine \
                    shared with other tests; `--overload` judges at 0.9)",
        caught_by: "service.capacity_after_overload",
        program: Program::SutServerOverload,
        servers: 1,
        planted: "--weakness conn_slot_leak",
        control: "",
        common: "",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::Server,
    },
    ProcessFlaw {
        name: "no_eviction",
        origin: "a planted weakness of the deployed server (`sut-server --weakness \
                 no_eviction`): the accept loop as it was before idle connections gave way",
        mechanism: "a full server refuses every new connection while idle keep-alive \
                    connections keep their places: `scenario ids --held-clients 700` holds \
                    connections from three addresses against a server of 600, each asking \
                    every 8 s, and a new client asking 200 times a second is refused",
        caught_by: "service.new_client_when_full",
        program: Program::SutServerHeld,
        servers: 1,
        planted: "--weakness no_eviction",
        control: "",
        common: "--connections-max 600",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::Server,
    },
    ProcessFlaw {
        name: "unguarded_fallback",
        origin: "a planted weakness of the deployed server (`sut-server --weakness \
                 unguarded_fallback`), which the default deployment catches only by chance",
        mechanism: "an allocation of the PostgreSQL store that lost a serialization race \
                    falls back to two transactions, the tag row read in one and \
                    `max_id = read + step` written in the next with no version compare: three \
                    ID servers on one PostgreSQL in contention mode (segments of 1 ID, 32 \
                    clients, half asking for batches) lose races all the time and take the \
                    same range; the default deployment (segments of 2,000 IDs) races only in \
                    the burst of its servers' first allocations",
        caught_by: "ids.unique",
        program: Program::SutServerContention(chaos::Backend::Postgres),
        servers: 3,
        planted: "--weakness unguarded_fallback",
        control: "",
        common: "",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::Server,
    },
    ProcessFlaw {
        name: "past_block_repeat",
        origin: "a planted weakness of the deployed server (`sut-server --weakness \
                 past_block_repeat`), on a path process mode's runs never reach",
        mechanism: "a take whose value lies past the block another thread has just published \
                    answers that block's last ID, another thread's, instead of taking the next \
                    block: only blocks smaller than the takes racing for them reach it, which \
                    the blocks of hundreds of IDs of process mode's runs and the default \
                    deployments almost never are; contention mode (three servers on one SQLite \
                    file, segments of 1 ID, 32 clients) reaches it dozens of times a run and \
                    names the paths it reached (`paths.reached`)",
        caught_by: "ids.unique",
        program: Program::SutServerContention(chaos::Backend::Sqlite),
        servers: 3,
        planted: "--weakness past_block_repeat",
        control: "",
        common: "",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::Server,
    },
    ProcessFlaw {
        name: "skip_on_refill",
        origin: "a planted weakness of the deployed server (`sut-server --weakness \
                 skip_on_refill`), missed by the run's own checks (gaps are reported, not \
                 judged)",
        mechanism: "a take that finds the published block used up refills it and then draws a \
                    fresh value, never issuing its own: IDs skipped at every refill; one \
                    sut-server, segments of 10, no restart and no fault, where the contract \
                    promises no gap (`ids.gaps` with a bound of 0)",
        caught_by: "ids.gaps",
        program: Program::SutServerGaps,
        servers: 1,
        planted: "--weakness skip_on_refill",
        control: "",
        common: "--step-max 10",
        faults: &[],
        every_ms: 0,
        down_ms: 0,
        clock_step_ms: 0,
        monotonic: Monotonic::Server,
    },
];

/// `clock_step_ms` of an entry whose clock goes to 2 s before the end of the default Snowflake
/// layout's time field (computed when the run is made: the step depends on today's date).
pub const CLOCK_TO_TIME_FIELD_END: i64 = i64::MIN;

/// The clock step that takes today's clock to `before_ms` before the default layout's time
/// field runs out (a negative step: the nemesis steps by minus it first, forward).
fn step_to_time_field_end(before_ms: u64) -> i64 {
    let layout = sut::snowflake::Layout::default();
    let end_ms = layout.epoch_ms + (1u64 << layout.time_bits);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let ahead_ms = end_ms.saturating_sub(now_ms).saturating_sub(before_ms);
    -i64::try_from(ahead_ms).unwrap_or(i64::MAX)
}

/// Tokens of a token entry, consumes of each at once, and tokens between restarts.
const TOKENS: u64 = 200;
const TOKEN_CONSUMERS: u64 = 6;
const TOKENS_KILL_EVERY: u64 = 100;
/// Tokens one user asks for in a token entry (`tokens.quota`): more than sut-server's burst.
const TOKENS_EXHAUST: u64 = 60;
/// Unauthenticated bodies a token entry posts at once after its rounds.
const TOKENS_UNAUTH_BODIES: usize = 1_000;

/// Hostile sequences of a participant entry, their length, and the messages between restarts.
const PARTICIPANT_SEQUENCES: u64 = 30;
const PARTICIPANT_STEPS: u64 = 40;
const PARTICIPANT_KILL_EVERY: u64 = 50;

/// Finds a server binary (`sut-server`, or the `compat` crate's `id-compat`, `tcc-compat`)
/// beside the running program (or in its parent folder), or `redis-server` on PATH.
///
/// # Errors
/// A message saying where it looked and how to build it.
pub fn server_binary(name: &str) -> Result<PathBuf, String> {
    if name == "redis-server" {
        return chaos::redis_server_bin().ok_or_else(|| {
            "redis-server not found on PATH (Debian: apt-get install redis-server)".to_owned()
        });
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut tried = Vec::new();
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
        tried.push(candidate.display().to_string());
    }
    let package = if name == "sut-server" {
        "sut-server"
    } else {
        "compat"
    };
    Err(format!(
        "{name} not found (tried {}): build it with `cargo build -p {package} --bin {name}` \
         (add --release to match a release scenario)",
        tried.join(", ")
    ))
}

/// The `scenario ids` run of `bug`, planted or not, with its server binary `program`.
///
/// # Errors
/// No free port, or `bug` is not an ID entry.
pub fn options(
    bug: &ProcessFlaw,
    program: &Path,
    planted: bool,
) -> Result<BlackBoxOptions, String> {
    if matches!(
        bug.program,
        Program::SutServerParticipant
            | Program::SutServerTokens
            | Program::TccCompat
            | Program::SutServerContention(_)
    ) {
        return Err(format!("{} is not tested by `scenario ids`", bug.name));
    }
    let mut urls = Vec::new();
    let mut commands = Vec::new();
    let flags = if planted { bug.planted } else { bug.control };
    for _ in 0..bug.servers {
        let port = chaos::free_port().map_err(|e| e.to_string())?;
        if bug.program == Program::Redis {
            urls.push(format!("redis://127.0.0.1:{port}/"));
            commands.push(format!(
                "exec {} --port {port} --bind 127.0.0.1 --dir {{data}} --daemonize no {} {flags}",
                program.display(),
                bug.common
            ));
            continue;
        }
        let (path, args) = match bug.program {
            Program::IdCompat("uid") => ("/uid", "--api uid".to_owned()),
            Program::IdCompat(api) => ("", format!("--api {api} --tag orders --token bench")),
            Program::SutServer
            | Program::SutServerOverload
            | Program::SutServerGaps
            | Program::SutServerHeld => ("/id/{key}", "--tag orders:10".to_owned()),
            Program::SutServerSemantic => ("/semantic/{key}", String::new()),
            // (The other kinds were refused above.)
            _ => ("/snowflake", String::new()),
        };
        urls.push(format!("http://127.0.0.1:{port}{path}"));
        // sut-server needs the operator's secret to start (the ID routes do not use it).
        let env = if bug.program.binary() == "sut-server" {
            format!("env SUT_ADMIN_TOKEN={} ", load::target::bench_admin_token())
        } else {
            String::new()
        };
        commands.push(format!(
            "exec {env}{} {args} --db {{data}}/ids.db --listen 127.0.0.1:{port} {} {flags}",
            program.display(),
            bug.common
        ));
    }
    let (target, key) = match bug.program {
        Program::IdCompat("leaf") => (Target::Leaf { snowflake: false }, "orders"),
        Program::IdCompat("tinyid") => (
            Target::Tinyid {
                token: "bench".into(),
                batch: 1,
            },
            "orders",
        ),
        Program::IdCompat(_) => (Target::Http { pointer: None }, ""),
        Program::Redis => (Target::Redis, "ids"),
        Program::SutServer
        | Program::SutServerOverload
        | Program::SutServerGaps
        | Program::SutServerHeld => (
            Target::Http {
                pointer: Some("/id".into()),
            },
            "orders",
        ),
        Program::SutServerSemantic => (
            Target::Http {
                pointer: Some("/number".into()),
            },
            "OD",
        ),
        _ => (
            Target::Http {
                pointer: Some("/id".into()),
            },
            "",
        ),
    };
    Ok(BlackBoxOptions {
        slow_clients: (bug.program == Program::SutServerHeld).then(|| blackbox::slow::SlowSpec {
            stalled: 0,
            held: HELD_CLIENTS,
            closed_within: Duration::from_secs(60),
            stall_path: None,
        }),
        db: None,
        netns: false,
        target,
        urls,
        key: key.into(),
        clients: 4,
        ramp: None,
        db_delay: None,
        rate: None,
        duration: Duration::from_secs(5),
        monotonic: bug.monotonic,
        commands,
        nemesis: (!bug.faults.is_empty()).then(|| BlackBoxNemesis {
            faults: bug.faults.to_vec(),
            every: Duration::from_millis(bug.every_ms),
            down_for: Duration::from_millis(bug.down_ms),
            clock_step_ms: if bug.clock_step_ms == CLOCK_TO_TIME_FIELD_END {
                // The first fault comes about 1.5 s after this (the server starts, then
                // every_ms): the clock lands about 2 s before the end, in a 3 s fault, so the
                // end is crossed for any delay from 0.5 s to 3.5 s.
                step_to_time_field_end(2_000 + 1_500)
            } else {
                bug.clock_step_ms
            },
            cut: blackbox::ids::CutShape::Both,
        }),
    })
}

/// What one entry's two runs found.
#[derive(Debug)]
pub struct ProcessRow {
    /// The entry.
    pub bug: &'static ProcessFlaw,
    /// The check that failed on the planted run, with its first offending event.
    pub caught: Option<String>,
    /// Whether the control run passed.
    pub control_passed: bool,
    /// IDs (answered messages, for a participant) of the planted run and of the control.
    pub ids: (u64, u64),
}

impl ProcessRow {
    /// Caught by the expected check, and the control passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.control_passed
            && self
                .caught
                .as_deref()
                .is_some_and(|c| c.starts_with(self.bug.caught_by))
    }
}

/// Runs `bug` planted and as the control.
///
/// # Errors
/// Its server binary is missing, or a run could not be made (not a verdict).
pub fn run(bug: &'static ProcessFlaw) -> Result<ProcessRow, String> {
    let program = server_binary(bug.program.binary())?;
    match bug.program {
        Program::SutServerParticipant | Program::TccCompat => {
            return run_participant(bug, &program);
        }
        Program::SutServerTokens => return run_tokens(bug, &program),
        Program::SutServerOverload => return run_overload(bug, &program),
        Program::SutServerGaps => return run_gaps(bug, &program),
        Program::SutServerContention(backend) => return run_contention(bug, &program, backend),
        _ => {}
    }
    let once = |planted| -> Result<BlackBoxRun, String> {
        let opts = options(bug, &program, planted)?;
        blackbox::ids::run(&opts).map_err(|e: BlackBoxError| e.to_string())
    };
    // A flaw whose window a fault hits by chance (a kill between a read and its durable write)
    // gets more than one run; how many it took is part of what is reported.
    let mut runs = 0;
    let (planted, caught) = loop {
        runs += 1;
        let planted = once(true)?;
        let caught = first_violated(planted.checks());
        if caught.is_some() || runs == PLANTED_RUNS_MAX {
            break (planted, caught.map(|c| with_runs(c, runs)));
        }
    };
    let control = once(false)?;
    Ok(ProcessRow {
        bug,
        caught,
        control_passed: control.passed(),
        ids: (planted.ids, control.ids),
    })
}

/// Runs of a planted ID entry before it is called not caught (each a fresh server pair).
pub const PLANTED_RUNS_MAX: u32 = 3;

/// `caught`, saying which run caught it when it was not the first.
fn with_runs(caught: String, runs: u32) -> String {
    if runs == 1 {
        caught
    } else {
        format!("{caught} (run {runs} of at most {PLANTED_RUNS_MAX})")
    }
}

/// The first violated check, with its first offending event.
fn first_violated<'a>(
    checks: impl IntoIterator<Item = impl std::borrow::Borrow<reports::model::InvariantResult> + 'a>,
) -> Option<String> {
    checks.into_iter().find_map(|c| {
        let c = c.borrow();
        (c.verdict == Judgement::Violated).then(|| {
            format!(
                "{}: {}",
                c.name,
                c.first_offending_event.as_deref().unwrap_or_default()
            )
        })
    })
}

/// The `scenario tcc` run of a participant entry, planted or not: the tester owns the server
/// (its admin secret this run's, passed in `SUT_ADMIN_TOKEN`) and restarts it every
/// [`PARTICIPANT_KILL_EVERY`] messages.
///
/// # Errors
/// No free port.
pub fn participant_options(
    bug: &ProcessFlaw,
    program: &Path,
    planted: bool,
) -> Result<ParticipantOptions, String> {
    let port = chaos::free_port().map_err(|e| e.to_string())?;
    let flags = if planted { bug.planted } else { bug.control };
    let token = load::target::bench_admin_token();
    let service = load::target::bench_service_token();
    Ok(ParticipantOptions {
        url: format!("http://127.0.0.1:{port}"),
        admin_token: Some(token.to_owned()),
        // tcc-compat has one secret for both, as many participants do.
        service_token: (bug.program != Program::TccCompat).then(|| service.to_owned()),
        sequences: PARTICIPANT_SEQUENCES,
        steps: PARTICIPANT_STEPS,
        seed: 1,
        command: Some(format!(
            "exec env SUT_ADMIN_TOKEN={token} SUT_SERVICE_TOKEN={service} {} \
             --db {{data}}/participant.db {}\
             --listen 127.0.0.1:{port} {} {flags}",
            program.display(),
            if bug.program == Program::TccCompat {
                "--payments {data}/payments.db "
            } else {
                ""
            },
            bug.common
        )),
        kill_every: PARTICIPANT_KILL_EVERY,
        db: None,
        db_fault: None,
        slow: None,
        bodies: None,
    })
}

fn run_participant(bug: &'static ProcessFlaw, program: &Path) -> Result<ProcessRow, String> {
    let once = |planted| -> Result<ParticipantRun, String> {
        let opts = participant_options(bug, program, planted)?;
        blackbox::tcc::run(&opts).map_err(|e| e.to_string())
    };
    let (planted, control) = (once(true)?, once(false)?);
    Ok(row(
        bug,
        &planted.checks(),
        &control.checks(),
        (planted.messages, control.messages),
    ))
}

/// The row of a contract entry from its planted and control runs' checks.
fn row(
    bug: &'static ProcessFlaw,
    planted: &[reports::model::InvariantResult],
    control: &[reports::model::InvariantResult],
    answers: (u64, u64),
) -> ProcessRow {
    ProcessRow {
        bug,
        caught: first_violated(planted),
        control_passed: control.iter().all(|c| c.verdict != Judgement::Violated),
        ids: answers,
    }
}

/// The `scenario tokens` run of a token entry, planted or not: the tester owns the servers
/// (one SQLite file, this run's admin and JWT secrets) and restarts them every
/// [`TOKENS_KILL_EVERY`] tokens.
///
/// # Errors
/// No free port.
pub fn tokens_options(
    bug: &ProcessFlaw,
    program: &Path,
    planted: bool,
) -> Result<TokensOptions, String> {
    let flags = if planted { bug.planted } else { bug.control };
    let token = load::target::bench_admin_token();
    let (mut urls, mut commands) = (Vec::new(), Vec::new());
    for _ in 0..bug.servers {
        let port = chaos::free_port().map_err(|e| e.to_string())?;
        urls.push(format!("http://127.0.0.1:{port}"));
        // Every instance verifies the others' JWTs: one secret, written before each start.
        commands.push(format!(
            "printf %s {token} > {{data}}/jwt-secret && exec env SUT_ADMIN_TOKEN={token} {} \
             --db {{data}}/tokens.db --listen 127.0.0.1:{port} \
             --jwt-secret-file {{data}}/jwt-secret {} {flags}",
            program.display(),
            bug.common
        ));
    }
    Ok(TokensOptions {
        urls,
        admin_token: Some(token.to_owned()),
        tokens: TOKENS,
        consumers: TOKEN_CONSUMERS,
        commands,
        kill_every: TOKENS_KILL_EVERY,
        db: None,
        db_fault: None,
        exhaust: TOKENS_EXHAUST,
        slow: None,
        // Every token entry, planted or not, is asked the unauthenticated bodies too: the
        // controls show that the correct server refuses them from the head.
        bodies: Some(blackbox::bodies::BodiesSpec::new(TOKENS_UNAUTH_BODIES)),
    })
}

fn run_tokens(bug: &'static ProcessFlaw, program: &Path) -> Result<ProcessRow, String> {
    let once = |planted| -> Result<TokensRun, String> {
        let opts = tokens_options(bug, program, planted)?;
        blackbox::tokens::run(&opts).map_err(|e| e.to_string())
    };
    let (planted, control) = (once(true)?, once(false)?);
    Ok(row(
        bug,
        &planted.checks(),
        &control.checks(),
        (planted.accepted(), control.accepted()),
    ))
}

/// Overload clients of a capacity entry.
pub const OVERLOAD_CLIENTS: usize = 1_000;

/// Keep-alive connections the held-connections entry holds, against a server that holds 600
/// (its `--connections-max`).
pub const HELD_CLIENTS: usize = 700;

/// The least rate after the overload a capacity entry accepts, as a share of the rate before.
/// Lower than `scenario ids --overload`'s 0.9: the catalog runs beside the rest of a test
/// suite on a shared machine, where the correct server read 0.82-0.87x in its best window
/// twice while other tests ran. Capacity kept by clients that gave up reads a rate of 0, or
/// 0.29-1.00 when a few of the address's slots were free as the overload ended; its count of
/// connections served at once reads 0 after, against 512 before (1-8 of 938-1,024 when the
/// per-address cap was 1,024).
pub const OVERLOAD_RATIO_MIN: f64 = 0.7;

/// `caught`, saying what the run's own checks (process mode before these checks) found.
fn with_own_checks(caught: Option<String>, own_passed: bool) -> Option<String> {
    caught.map(|c| {
        format!(
            "{c} [the run's own checks: {}]",
            if own_passed {
                "all held, it was missed"
            } else {
                "violated too"
            }
        )
    })
}

/// The capacity check against a fresh start of `bug`'s server, planted or not.
fn overload_check(
    bug: &ProcessFlaw,
    program: &Path,
    planted: bool,
) -> Result<reports::model::InvariantResult, String> {
    let opts = options(bug, program, planted)?;
    let url = opts.target.request_url(&opts.urls[0], &opts.key);
    let _fresh = crate::power::Fresh::start(&opts.commands[0], &url)?;
    let parsed = reqwest::Url::parse(&url).map_err(|e| e.to_string())?;
    let overload = crate::overload::OverloadOptions {
        ratio_min: OVERLOAD_RATIO_MIN,
        ..crate::overload::OverloadOptions::new(
            &parsed.origin().ascii_serialization(),
            parsed.path(),
            OVERLOAD_CLIENTS,
        )
    };
    let measured = crate::overload::run(&overload).map_err(|e| e.to_string())?;
    Ok(measured.check())
}

/// The first of up to [`PLANTED_RUNS_MAX`] runs of `check` judged `wanted` (or the last), and
/// how many runs it took.
fn first_judged(
    wanted: Judgement,
    mut check: impl FnMut() -> Result<reports::model::InvariantResult, String>,
) -> Result<(reports::model::InvariantResult, u32), String> {
    let mut runs = 1;
    let mut last = check()?;
    while last.verdict != wanted && runs < PLANTED_RUNS_MAX {
        runs += 1;
        last = check()?;
    }
    Ok((last, runs))
}

/// A capacity entry: the run's own checks on the planted server (which miss it), then the
/// capacity check on a fresh start of the planted server and of the correct one, which must
/// hold there (an overload that reached no limit proves nothing, and fails the control).
fn run_overload(bug: &'static ProcessFlaw, program: &Path) -> Result<ProcessRow, String> {
    let own = blackbox::ids::run(&options(bug, program, true)?).map_err(|e| e.to_string())?;
    // Up to [`PLANTED_RUNS_MAX`] runs each: the planted server until its capacity is lost (how
    // many slots an overload leaves taken depends on when its clients give up), the correct
    // one until it holds (a machine busy with other work can take one run's windows after).
    let (planted, runs) = first_judged(Judgement::Violated, || overload_check(bug, program, true))?;
    let (control, _) = first_judged(Judgement::Held, || overload_check(bug, program, false))?;
    // The row says only that the control failed, or that the planted server was not caught:
    // what the check measured goes with it.
    for (which, check, expected) in [
        ("the control's", &control, Judgement::Held),
        ("the planted server's", &planted, Judgement::Violated),
    ] {
        if check.verdict != expected {
            eprintln!(
                "{}: {which} capacity check: {} ({})",
                bug.name,
                check.first_offending_event.as_deref().unwrap_or("-"),
                check.detail.as_deref().unwrap_or("-")
            );
        }
    }
    Ok(ProcessRow {
        bug,
        caught: with_own_checks(
            first_violated([&planted]).map(|c| with_runs(c, runs)),
            own.passed(),
        ),
        control_passed: control.verdict == Judgement::Held,
        ids: (own.ids, 0),
    })
}

/// A gap entry: the run judged as `scenario ids --gaps-max 0` judges it, planted and correct.
fn run_gaps(bug: &'static ProcessFlaw, program: &Path) -> Result<ProcessRow, String> {
    let once = |planted| -> Result<(BlackBoxRun, reports::model::InvariantResult), String> {
        let run = blackbox::ids::run(&options(bug, program, planted)?)
            .map_err(|e: BlackBoxError| e.to_string())?;
        let gaps = crate::power::gaps_check(&run.history.ok_values("generate"), 0);
        Ok((run, gaps))
    };
    let (planted, planted_gaps) = once(true)?;
    let (control, control_gaps) = once(false)?;
    Ok(ProcessRow {
        bug,
        caught: with_own_checks(first_violated([&planted_gaps]), planted.passed()),
        control_passed: control.passed() && control_gaps.verdict == Judgement::Held,
        ids: (planted.ids, control.ids),
    })
}

/// A contention entry: the planted servers in contention mode (up to [`PLANTED_RUNS_MAX`] runs)
/// and the correct ones, which must also reach every required path. Whether the default
/// deployment misses the weakness is a matter of chance (its start-up is a short burst of
/// contention too): docs/deployment.md has the rates, `scenario cluster_pg --weakness W` the run.
fn run_contention(
    bug: &'static ProcessFlaw,
    program: &Path,
    backend: chaos::Backend,
) -> Result<ProcessRow, String> {
    use crate::contention::ContentionOptions;
    let with = |planted: bool| ContentionOptions {
        id_servers: bug.servers,
        server_flags: format!(
            "{} {}",
            bug.common,
            if planted { bug.planted } else { bug.control }
        ),
        ..ContentionOptions::new(backend)
    };
    let mut runs = 0;
    let (planted, caught) = loop {
        runs += 1;
        let planted = crate::contention::run(&with(true), program)?;
        let caught = first_violated(planted.all_checks());
        if caught.is_some() || runs == PLANTED_RUNS_MAX {
            break (planted, caught.map(|c| with_runs(c, runs)));
        }
    };
    let control = crate::contention::run(&with(false), program)?;
    Ok(ProcessRow {
        bug,
        caught,
        control_passed: control.passed(),
        ids: (planted.ids(), control.ids()),
    })
}
