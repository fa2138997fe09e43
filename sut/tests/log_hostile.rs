//! The coordinator log against a hostile writer: `Begin`, `Decided` and `Finished` entries for
//! any draw, in any order, repeated, contradicting each other, with prices at and past
//! `AMOUNT_MAX`, and the verdict's column code read back from a store that may hold any byte.
//! Our coordinator never writes such sequences, so the scenarios and models never reach the
//! log's guards; a recovering coordinator replaying a damaged or foreign log would. The
//! properties are the log's own promises, checked after every entry against a reference:
//!
//! - `log.begin_once`: a draw is begun with one set of arguments; another `Begin` of the same xid
//!   with other arguments is refused (`BeginConflict`), the same one is a harmless repeat;
//! - `log.verdict_once`: a verdict is logged only for a begun draw (`UnknownDraw`), never
//!   changes once logged (`VerdictConflict`), and the same verdict again is a harmless repeat;
//! - `log.finish_after_verdict`: `Finished` only after a verdict (`NotDecided`); finishing a
//!   forgotten draw again is a harmless repeat;
//! - `log.amount_bound`: a price above `AMOUNT_MAX` is refused (`AmountTooLarge`), a price of
//!   exactly `AMOUNT_MAX` is not;
//! - `log.refusal_changes_nothing`: a refused entry leaves the log as it was;
//! - `log.codes`: a verdict's column code reads back as the same verdict, the two codes differ,
//!   and every other byte reads back as no verdict (a corrupt row, not a guess).
//!
//! Each promise has a firing test on a broken log (at the end), and a search test finds every
//! broken log within 256 random sequences.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, RngSeed, TestCaseError, TestRng, TestRunner};
use sut::lottery::journal::Journaled;
use sut::lottery::{
    AMOUNT_MAX, ActivityId, CoordLog, DrawArgs, LogEntry, LogError, LogRecord, LotteryStore,
    MemoryStore, StoreError, UserId, Verdict, Xid,
};

const DRAWS: u64 = 3;

/// A draw's arguments; `variant` changes them (another user, price or outcome).
fn draw(xid: u64, variant: u8, price_minor: u64) -> DrawArgs {
    DrawArgs {
        xid: Xid(xid),
        user: UserId(1 + u64::from(variant % 2)),
        activity: ActivityId(1),
        price_minor,
        won: variant >= 2,
    }
}

/// One write of a hostile writer.
#[derive(Clone, Copy, Debug)]
enum Write {
    Begin {
        xid: u64,
        variant: u8,
        price_minor: u64,
    },
    Decided {
        xid: u64,
        verdict: Verdict,
    },
    Finished {
        xid: u64,
    },
}

impl Write {
    fn entry(self) -> LogEntry {
        match self {
            Self::Begin {
                xid,
                variant,
                price_minor,
            } => LogEntry::Begin(draw(xid, variant, price_minor)),
            Self::Decided { xid, verdict } => LogEntry::Decided {
                xid: Xid(xid),
                verdict,
            },
            Self::Finished { xid } => LogEntry::Finished { xid: Xid(xid) },
        }
    }
}

fn write() -> impl Strategy<Value = Write> {
    let xid = 1..=DRAWS;
    let verdict = prop_oneof![Just(Verdict::Confirm), Just(Verdict::Cancel)];
    // Mostly ordinary prices; the bound and its neighbours often enough to be met.
    let price = prop_oneof![
        6 => Just(10_u64),
        1 => Just(AMOUNT_MAX - 1),
        1 => Just(AMOUNT_MAX),
        1 => Just(AMOUNT_MAX + 1),
        1 => Just(u64::MAX),
    ];
    prop_oneof![
        4 => (xid.clone(), 0_u8..2, price).prop_map(|(xid, variant, price_minor)| Write::Begin { xid, variant, price_minor }),
        4 => (xid.clone(), verdict).prop_map(|(xid, verdict)| Write::Decided { xid, verdict }),
        3 => xid.prop_map(|xid| Write::Finished { xid }),
    ]
}

/// A log under test: the real one, or a broken variant of it.
trait Log {
    fn append(&mut self, entry: &LogEntry) -> Result<(), LogError>;
    fn records(&self) -> BTreeMap<Xid, LogRecord>;
}

impl Log for CoordLog {
    fn append(&mut self, entry: &LogEntry) -> Result<(), LogError> {
        Self::append(self, entry)
    }
    fn records(&self) -> BTreeMap<Xid, LogRecord> {
        self.records.clone()
    }
}

/// The log as the server keeps it: in a journaled lottery store, read back with `log_load`
/// (what a restarted coordinator recovers from).
impl Log for Journaled {
    fn append(&mut self, entry: &LogEntry) -> Result<(), LogError> {
        match self.log_append(entry) {
            Ok(()) => Ok(()),
            Err(StoreError::Log(e)) => Err(e),
            Err(other) => panic!("the memory store failed: {other}"),
        }
    }
    fn records(&self) -> BTreeMap<Xid, LogRecord> {
        self.clone()
            .log_load()
            .expect("a memory store reads")
            .records
    }
}

/// Broken logs, each the real one with one guard wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    /// A second `Begin` with other arguments overwrites the record.
    BeginOverwrites,
    /// A conflicting verdict overwrites the logged one.
    VerdictOverwrites,
    /// `Decided` for an unknown draw begins it with made-up arguments.
    DecidesUnknown,
    /// `Finished` forgets an undecided draw.
    FinishesUndecided,
    /// Refuses a price of exactly `AMOUNT_MAX` (`>=` for `>`).
    BoundExclusive,
    /// A refused entry still empties the draw's record.
    RefusalForgets,
}

struct BrokenLog {
    log: CoordLog,
    broken: Broken,
}

impl Log for BrokenLog {
    fn append(&mut self, entry: &LogEntry) -> Result<(), LogError> {
        let xid = entry.xid();
        let result = self.log.append(entry);
        match (self.broken, entry, &result) {
            (
                Broken::BeginOverwrites,
                LogEntry::Begin(draw),
                Err(LogError::BeginConflict { .. }),
            ) => {
                let verdict = self.log.records[&xid].verdict;
                self.log.records.insert(
                    xid,
                    LogRecord {
                        draw: *draw,
                        verdict,
                    },
                );
                Ok(())
            }
            (
                Broken::VerdictOverwrites,
                LogEntry::Decided { verdict, .. },
                Err(LogError::VerdictConflict { .. }),
            ) => {
                if let Some(r) = self.log.records.get_mut(&xid) {
                    r.verdict = Some(*verdict);
                }
                Ok(())
            }
            (
                Broken::DecidesUnknown,
                LogEntry::Decided { verdict, .. },
                Err(LogError::UnknownDraw { .. }),
            ) => {
                let record = LogRecord {
                    draw: draw(xid.0, 0, 10),
                    verdict: Some(*verdict),
                };
                self.log.records.insert(xid, record);
                Ok(())
            }
            (
                Broken::FinishesUndecided,
                LogEntry::Finished { .. },
                Err(LogError::NotDecided { .. }),
            ) => {
                self.log.records.remove(&xid);
                Ok(())
            }
            (Broken::BoundExclusive, LogEntry::Begin(draw), Ok(()))
                if draw.price_minor == AMOUNT_MAX =>
            {
                self.log.records.remove(&xid);
                Err(LogError::AmountTooLarge {
                    xid,
                    amount_minor: draw.price_minor,
                })
            }
            (Broken::RefusalForgets, _, Err(_)) => {
                self.log.records.remove(&xid);
                result
            }
            _ => result,
        }
    }
    fn records(&self) -> BTreeMap<Xid, LogRecord> {
        self.log.records.clone()
    }
}

/// What the reference says an entry must do to a draw's record: the new record, or the
/// refusal (with its promise's name).
fn expected(
    record: Option<LogRecord>,
    entry: &LogEntry,
) -> Result<Option<LogRecord>, (&'static str, LogError)> {
    let xid = entry.xid();
    match *entry {
        LogEntry::Begin(draw) if draw.price_minor > AMOUNT_MAX => Err((
            "log.amount_bound",
            LogError::AmountTooLarge {
                xid,
                amount_minor: draw.price_minor,
            },
        )),
        LogEntry::Begin(draw) => match record {
            None => Ok(Some(LogRecord {
                draw,
                verdict: None,
            })),
            Some(r) if r.draw == draw => Ok(Some(r)),
            Some(_) => Err(("log.begin_once", LogError::BeginConflict { xid })),
        },
        LogEntry::Decided { verdict, .. } => match record {
            None => Err(("log.verdict_once", LogError::UnknownDraw { xid })),
            Some(r) => match r.verdict {
                None => Ok(Some(LogRecord {
                    verdict: Some(verdict),
                    ..r
                })),
                Some(logged) if logged == verdict => Ok(Some(r)),
                Some(logged) => Err((
                    "log.verdict_once",
                    LogError::VerdictConflict {
                        xid,
                        logged,
                        requested: verdict,
                    },
                )),
            },
        },
        LogEntry::Finished { .. } => match record {
            None => Ok(None),
            Some(r) if r.verdict.is_none() => {
                Err(("log.finish_after_verdict", LogError::NotDecided { xid }))
            }
            Some(_) => Ok(None),
        },
    }
}

/// Runs `writes` against `log`; the first broken promise, named.
fn run(log: &mut dyn Log, writes: &[Write]) -> Result<(), String> {
    for (i, write) in writes.iter().enumerate() {
        let entry = write.entry();
        let before = log.records();
        let xid = entry.xid();
        let got = log.append(&entry);
        let after = log.records();
        let want = expected(before.get(&xid).copied(), &entry);
        let said = format!("write {i} {write:?}");
        match (&got, &want) {
            (Ok(()), Ok(record)) => {
                if after.get(&xid) != record.as_ref() {
                    return Err(format!(
                        "{said}: record {:?}, the reference says {record:?}",
                        after.get(&xid)
                    ));
                }
            }
            (Err(got), Err((promise, want))) => {
                if got != want {
                    return Err(format!(
                        "{promise}: {said} refused with {got:?}, not {want:?}"
                    ));
                }
                if after != before {
                    return Err(format!(
                        "log.refusal_changes_nothing: {said} was refused ({got:?}) and the log \
                         changed from {before:?} to {after:?}"
                    ));
                }
            }
            (Ok(()), Err((promise, want))) => {
                return Err(format!(
                    "{promise}: {said} accepted, must be refused: {want:?}"
                ));
            }
            (Err(got), Ok(_)) => {
                let promise = match entry {
                    LogEntry::Begin(d) if d.price_minor == AMOUNT_MAX => "log.amount_bound",
                    LogEntry::Begin(_) => "log.begin_once",
                    LogEntry::Decided { .. } => "log.verdict_once",
                    LogEntry::Finished { .. } => "log.finish_after_verdict",
                };
                return Err(format!(
                    "{promise}: {said} refused ({got:?}), must be accepted"
                ));
            }
        }
        // Records other than the entry's draw never change.
        let others = |m: &BTreeMap<Xid, LogRecord>| {
            m.iter()
                .filter(|(x, _)| **x != xid)
                .map(|(x, r)| (*x, *r))
                .collect::<Vec<_>>()
        };
        if others(&before) != others(&after) {
            return Err(format!("{said} changed another draw's record"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x1_06),
        failure_persistence: None,
        ..Config::default()
    })]
    #[test]
    fn the_log_keeps_its_promises_whatever_is_written(
        writes in proptest::collection::vec(write(), 1..40)
    ) {
        prop_assert_eq!(run(&mut CoordLog::default(), &writes), Ok(()));
    }

    #[test]
    fn the_journaled_store_keeps_and_reloads_the_same_log(
        writes in proptest::collection::vec(write(), 1..40)
    ) {
        prop_assert_eq!(run(&mut Journaled::new(MemoryStore::default()), &writes), Ok(()));
    }
}

#[test]
fn a_verdict_code_reads_back_as_itself_and_nothing_else_reads_as_a_verdict() {
    // `log.codes`: what the SQLite and PostgreSQL coordinator logs store.
    let verdicts = [Verdict::Confirm, Verdict::Cancel];
    for v in verdicts {
        assert_eq!(Verdict::from_code(v.code()), Some(v), "{v:?}");
    }
    assert_ne!(Verdict::Confirm.code(), Verdict::Cancel.code());
    for code in 0..=u8::MAX {
        let read = Verdict::from_code(code);
        let is_a_code = verdicts.iter().any(|v| v.code() == code);
        assert_eq!(
            read.is_some(),
            is_a_code,
            "code {code} read back as {read:?}"
        );
    }
}

#[test]
fn a_price_of_exactly_amount_max_is_logged_and_one_more_is_refused() {
    let mut log = CoordLog::default();
    let at_bound = [Write::Begin {
        xid: 1,
        variant: 0,
        price_minor: AMOUNT_MAX,
    }];
    assert_eq!(run(&mut log, &at_bound), Ok(()));
    assert!(!log.is_empty());
    let past = [Write::Begin {
        xid: 2,
        variant: 0,
        price_minor: AMOUNT_MAX + 1,
    }];
    assert_eq!(run(&mut log, &past), Ok(()));
    assert_eq!(log.records.len(), 1, "the refused draw is not logged");
}

#[test]
fn a_finished_draw_leaves_the_log_empty() {
    let mut log = CoordLog::default();
    assert!(log.is_empty());
    let writes = [
        Write::Begin {
            xid: 1,
            variant: 0,
            price_minor: 10,
        },
        Write::Decided {
            xid: 1,
            verdict: Verdict::Cancel,
        },
    ];
    assert_eq!(run(&mut log, &writes), Ok(()));
    assert!(!log.is_empty(), "a decided, unfinished draw is open");
    assert_eq!(run(&mut log, &[Write::Finished { xid: 1 }]), Ok(()));
    assert!(log.is_empty());
}

fn fires(broken: Broken, writes: &[Write], needle: &str) {
    let mut log = BrokenLog {
        log: CoordLog::default(),
        broken,
    };
    let err = run(&mut log, writes).expect_err("the broken log is caught");
    assert!(err.contains(needle), "{broken:?}: `{needle}` not in: {err}");
    // And the real log passes the same writes.
    assert_eq!(run(&mut CoordLog::default(), writes), Ok(()));
}

fn begin(xid: u64, variant: u8) -> Write {
    Write::Begin {
        xid,
        variant,
        price_minor: 10,
    }
}

const fn decide(xid: u64, verdict: Verdict) -> Write {
    Write::Decided { xid, verdict }
}

#[test]
fn each_promise_fires_on_a_log_that_breaks_it() {
    fires(
        Broken::BeginOverwrites,
        &[begin(1, 0), begin(1, 1)],
        "log.begin_once",
    );
    fires(
        Broken::VerdictOverwrites,
        &[
            begin(1, 0),
            decide(1, Verdict::Confirm),
            decide(1, Verdict::Cancel),
        ],
        "log.verdict_once",
    );
    fires(
        Broken::DecidesUnknown,
        &[decide(2, Verdict::Cancel)],
        "log.verdict_once",
    );
    fires(
        Broken::FinishesUndecided,
        &[begin(1, 0), Write::Finished { xid: 1 }],
        "log.finish_after_verdict",
    );
    fires(
        Broken::BoundExclusive,
        &[Write::Begin {
            xid: 1,
            variant: 0,
            price_minor: AMOUNT_MAX,
        }],
        "log.amount_bound",
    );
    fires(
        Broken::RefusalForgets,
        &[begin(1, 0), begin(1, 1)],
        "log.refusal_changes_nothing",
    );
}

#[test]
fn random_hostile_writes_find_each_broken_log() {
    for broken in [
        Broken::BeginOverwrites,
        Broken::VerdictOverwrites,
        Broken::DecidesUnknown,
        Broken::FinishesUndecided,
        Broken::BoundExclusive,
        Broken::RefusalForgets,
    ] {
        let config = Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
        let mut runner = TestRunner::new_with_rng(config, rng);
        let found = runner.run(&proptest::collection::vec(write(), 1..40), |writes| {
            let mut log = BrokenLog {
                log: CoordLog::default(),
                broken,
            };
            run(&mut log, &writes).map_err(TestCaseError::fail)
        });
        assert!(found.is_err(), "{broken:?} survived 256 hostile sequences");
    }
}

#[test]
fn the_hostile_writes_reach_every_refusal() {
    // Not vacuous: generated sequences meet every refusal and every harmless repeat.
    let mut runner = TestRunner::deterministic();
    let strategy = proptest::collection::vec(write(), 1..40);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..256 {
        let writes = strategy.new_tree(&mut runner).unwrap().current();
        let mut log = CoordLog::default();
        for write in writes {
            let entry = write.entry();
            let before = log.records.get(&entry.xid()).copied();
            let outcome = match log.append(&entry) {
                Ok(()) if log.records.get(&entry.xid()).copied() == before => "repeat",
                Ok(()) => "applied",
                Err(LogError::BeginConflict { .. }) => "BeginConflict",
                Err(LogError::UnknownDraw { .. }) => "UnknownDraw",
                Err(LogError::VerdictConflict { .. }) => "VerdictConflict",
                Err(LogError::AmountTooLarge { .. }) => "AmountTooLarge",
                Err(LogError::NotDecided { .. }) => "NotDecided",
            };
            let kind = match entry {
                LogEntry::Begin(_) => "Begin",
                LogEntry::Decided { .. } => "Decided",
                LogEntry::Finished { .. } => "Finished",
            };
            seen.insert(format!("{kind} {outcome}"));
        }
    }
    for what in [
        "Begin applied",
        "Begin repeat",
        "Begin BeginConflict",
        "Begin AmountTooLarge",
        "Decided applied",
        "Decided repeat",
        "Decided UnknownDraw",
        "Decided VerdictConflict",
        "Finished applied",
        "Finished repeat",
        "Finished NotDecided",
    ] {
        assert!(seen.contains(what), "never reached: {what}\n{seen:#?}");
    }
}
