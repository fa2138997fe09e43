//! Operation histories of runs against real processes, in Jepsen's shape: every operation is
//! an `invoke` followed by its completion, `ok` (it happened, with its value), `fail` (it
//! certainly did not happen) or `info` (unknown: a timeout or a connection cut after the request
//! left; it may have happened, and is never counted as failed).
//!
//! [`Recorder`] takes operations from many client threads and numbers them in one total order;
//! [`History::to_edn`] writes the history as Jepsen's EDN (one map per line, `:type`, `:f`,
//! `:value`, `:process`, `:time` in nanoseconds since the start, `:index`, and `:error` when
//! there is one), which Elle, Knossos and Jepsen's own checkers read; [`History::parse_edn`]
//! reads that form back. An ID source's operations are `:f :generate` with the ID as `:value`,
//! the shape of Jepsen's `unique-ids` checker.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

/// An operation's kind of record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpType {
    /// The client sent it.
    Invoke,
    /// It happened (its value is the result).
    Ok,
    /// It certainly did not happen.
    Fail,
    /// Unknown: it may or may not have happened.
    Info,
}

impl OpType {
    const fn keyword(self) -> &'static str {
        match self {
            Self::Invoke => "invoke",
            Self::Ok => "ok",
            Self::Fail => "fail",
            Self::Info => "info",
        }
    }

    fn from_keyword(k: &str) -> Option<Self> {
        Some(match k {
            "invoke" => Self::Invoke,
            "ok" => Self::Ok,
            "fail" => Self::Fail,
            "info" => Self::Info,
            _ => return None,
        })
    }
}

/// One record of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// Position in the history (0, 1, 2, …).
    pub index: u64,
    /// The client (a thread or connection) that did it; one operation at a time per process.
    pub process: u64,
    /// Invoke or completion.
    pub op_type: OpType,
    /// What it does (a keyword: `generate`, `read`, …).
    pub f: String,
    /// Its value (`nil` when absent).
    pub value: Option<i64>,
    /// Nanoseconds since the history started.
    pub time_ns: u64,
    /// Why it failed or is unknown.
    pub error: Option<String>,
}

/// A history under construction, shared by the client threads.
#[derive(Debug)]
pub struct Recorder {
    started: Instant,
    ops: Mutex<Vec<Op>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// An empty history starting now.
    #[must_use]
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            ops: Mutex::new(Vec::new()),
        }
    }

    /// Records one operation record; the index and time are taken under one lock, so the
    /// history's order is the order of its times.
    pub fn record(
        &self,
        process: u64,
        op_type: OpType,
        f: &str,
        value: Option<i64>,
        error: Option<String>,
    ) {
        let mut ops = self
            .ops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let time_ns = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let index = ops.len() as u64;
        ops.push(Op {
            index,
            process,
            op_type,
            f: f.to_owned(),
            value,
            time_ns,
            error,
        });
    }

    /// A recorder for one client thread: it keeps its records to itself (no lock, no
    /// contention between clients) and hands them over when dropped; [`Recorder::finish`]
    /// merges every client's records by time.
    #[must_use]
    pub fn client(&self, process: u64) -> ClientRecorder<'_> {
        ClientRecorder {
            shared: self,
            process,
            ops: Vec::with_capacity(1024),
        }
    }

    /// The history recorded: every record by time (ties in the order they were handed over),
    /// indexed from 0.
    #[must_use]
    pub fn finish(self) -> History {
        let mut ops = self
            .ops
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ops.sort_by_key(|op| op.time_ns);
        for (i, op) in ops.iter_mut().enumerate() {
            op.index = i as u64;
        }
        History { ops }
    }
}

/// One client's records ([`Recorder::client`]), handed to the shared recorder when dropped.
/// It keeps them compact (no allocation per record but an error's text) and makes them
/// [`Op`]s only then, off the client's hot path.
#[derive(Debug)]
pub struct ClientRecorder<'a> {
    shared: &'a Recorder,
    process: u64,
    ops: Vec<Compact>,
}

/// A record as a client keeps it.
#[derive(Debug)]
struct Compact {
    time_ns: u64,
    op_type: OpType,
    f: &'static str,
    value: Option<i64>,
    error: Option<String>,
}

impl ClientRecorder<'_> {
    /// Records one operation record of this client at the time now.
    pub fn record(
        &mut self,
        op_type: OpType,
        f: &'static str,
        value: Option<i64>,
        error: Option<String>,
    ) {
        let time_ns = u64::try_from(self.shared.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        debug_assert!(
            self.ops.last().is_none_or(|last| last.time_ns <= time_ns),
            "one client's records go forward in time"
        );
        self.ops.push(Compact {
            time_ns,
            op_type,
            f,
            value,
            error,
        });
    }
}

impl Drop for ClientRecorder<'_> {
    fn drop(&mut self) {
        let mut ops = self
            .shared
            .ops
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let process = self.process;
        ops.extend(self.ops.drain(..).map(|c| Op {
            index: 0,
            process,
            op_type: c.op_type,
            f: c.f.to_owned(),
            value: c.value,
            time_ns: c.time_ns,
            error: c.error,
        }));
    }
}

/// A finished history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Its records, in order.
    pub ops: Vec<Op>,
}

/// A line of EDN that is not an operation map this reader knows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("EDN history, line {line}, column {column}: {what}")]
pub struct EdnError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong there.
    pub what: String,
}

/// How many completions of each kind a history holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completions {
    /// `ok`.
    pub ok: u64,
    /// `fail`.
    pub fail: u64,
    /// `info` (unknown outcome).
    pub info: u64,
}

impl History {
    /// The latency of every completed `f` operation (its completion's time minus its
    /// invoke's) as a report's endpoint: percentiles, throughput and latency over time, and the
    /// completions that were not `ok` by kind (`fail`: certainly not run; `info`: unknown
    /// outcome). Times count from the history's start; `duration_s` is the run's length.
    #[must_use]
    pub fn endpoint_stats(&self, f: &str, duration_s: f64) -> reports::model::EndpointStats {
        let mut recorder = load::stats::EndpointRecorder::default();
        let mut invoked_ns: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
        for op in self.ops.iter().filter(|o| o.f == f) {
            if op.op_type == OpType::Invoke {
                invoked_ns.insert(op.process, op.time_ns);
                continue;
            }
            let Some(at_ns) = invoked_ns.remove(&op.process) else {
                continue;
            };
            let latency_us = op.time_ns.saturating_sub(at_ns) / 1_000;
            let error = match op.op_type {
                OpType::Fail => Some("fail (certainly not run)"),
                OpType::Info => Some("info (unknown outcome)"),
                OpType::Ok | OpType::Invoke => None,
            };
            recorder.record(at_ns / 1_000_000, latency_us, latency_us, latency_us, error);
        }
        recorder.stats(f, duration_s)
    }

    /// The values of the `ok` completions of `f`, in history order.
    #[must_use]
    pub fn ok_values(&self, f: &str) -> Vec<i64> {
        self.ops
            .iter()
            .filter(|op| op.op_type == OpType::Ok && op.f == f)
            .filter_map(|op| op.value)
            .collect()
    }

    /// The values of the `ok` operations of `f`, each with its operation's index (`#N`).
    #[must_use]
    pub fn ok_values_indexed(&self, f: &str) -> Vec<(i64, u64)> {
        self.ops
            .iter()
            .filter(|op| op.op_type == OpType::Ok && op.f == f)
            .filter_map(|op| op.value.map(|v| (v, op.index)))
            .collect()
    }

    /// Completions by kind.
    #[must_use]
    pub fn completions(&self) -> Completions {
        let mut c = Completions::default();
        for op in &self.ops {
            match op.op_type {
                OpType::Invoke => {}
                OpType::Ok => c.ok += 1,
                OpType::Fail => c.fail += 1,
                OpType::Info => c.info += 1,
            }
        }
        c
    }

    /// The history as Jepsen's EDN, one operation map per line.
    #[must_use]
    pub fn to_edn(&self) -> String {
        let mut out = String::new();
        for op in &self.ops {
            let value = op.value.map_or_else(|| "nil".to_owned(), |v| v.to_string());
            let _ = write!(
                out,
                "{{:type :{}, :f :{}, :value {value}, :process {}, :time {}, :index {}",
                op.op_type.keyword(),
                op.f,
                op.process,
                op.time_ns,
                op.index
            );
            if let Some(error) = &op.error {
                let _ = write!(out, ", :error {}", edn_string(error));
            }
            out.push_str("}\n");
        }
        out
    }

    /// Reads a history written by [`History::to_edn`] (or by Jepsen, for operations whose
    /// values are integers or `nil`): one map per line, blank lines skipped.
    ///
    /// # Errors
    /// The first line that is not such a map, with its position.
    pub fn parse_edn(text: &str) -> Result<Self, EdnError> {
        let mut ops = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            ops.push(parse_op(line).map_err(|(column, what)| EdnError {
                line: i + 1,
                column: column + 1,
                what,
            })?);
        }
        Ok(Self { ops })
    }
}

/// `s` as an EDN string (quotes and backslashes escaped, newlines as `\n`).
fn edn_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A parsed EDN scalar of an operation map.
#[derive(Debug)]
enum Scalar {
    Keyword(String),
    Int(i64),
    Nil,
    Str(String),
}

/// A cursor over one line; errors carry the 0-based column.
struct Cursor<'a> {
    line: &'a str,
    pos: usize,
}

type Parse<T> = Result<T, (usize, String)>;

impl Cursor<'_> {
    fn skip_blank(&mut self) {
        // EDN: commas are whitespace.
        while let Some(c) = self.line[self.pos..].chars().next() {
            if c.is_whitespace() || c == ',' {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
    }

    fn peek(&self) -> Option<char> {
        self.line[self.pos..].chars().next()
    }

    fn fail<T>(&self, what: impl Into<String>) -> Parse<T> {
        Err((self.pos, what.into()))
    }

    fn expect(&mut self, c: char) -> Parse<()> {
        self.skip_blank();
        if self.peek() == Some(c) {
            self.pos += 1;
            Ok(())
        } else {
            self.fail(format!("expected `{c}`"))
        }
    }

    fn token(&mut self) -> &str {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_whitespace() || matches!(c, ',' | '}' | '{') {
                break;
            }
            self.pos += c.len_utf8();
        }
        &self.line[start..self.pos]
    }

    fn scalar(&mut self) -> Parse<Scalar> {
        self.skip_blank();
        let at = self.pos;
        match self.peek() {
            Some(':') => {
                self.pos += 1;
                let k = self.token();
                if k.is_empty() {
                    return Err((at, "an empty keyword".into()));
                }
                Ok(Scalar::Keyword(k.to_owned()))
            }
            Some('"') => self.string(),
            Some(_) => match self.token() {
                "nil" => Ok(Scalar::Nil),
                t => t.parse().map(Scalar::Int).map_err(|_| {
                    (
                        at,
                        format!("`{t}` is not a keyword, an integer, nil or a string"),
                    )
                }),
            },
            None => Err((at, "a value is missing".into())),
        }
    }

    fn string(&mut self) -> Parse<Scalar> {
        let at = self.pos;
        self.pos += 1;
        let mut s = String::new();
        let mut chars = self.line[self.pos..].char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.pos += i + 1;
                    return Ok(Scalar::Str(s));
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => s.push('\n'),
                    Some((_, 't')) => s.push('\t'),
                    Some((_, c)) => s.push(c),
                    None => break,
                },
                c => s.push(c),
            }
        }
        Err((at, "an unterminated string".into()))
    }
}

fn parse_op(line: &str) -> Parse<Op> {
    let mut cur = Cursor { line, pos: 0 };
    cur.expect('{')?;
    let (mut op_type, mut f, mut value, mut process, mut time, mut index, mut error) =
        (None, None, None, None, None, None, None);
    loop {
        cur.skip_blank();
        if cur.peek() == Some('}') {
            cur.pos += 1;
            break;
        }
        let key_at = cur.pos;
        let Scalar::Keyword(key) = cur.scalar()? else {
            return Err((key_at, "a map key must be a keyword".into()));
        };
        cur.skip_blank();
        let value_at = cur.pos;
        let v = cur.scalar()?;
        let int = |v: &Scalar| match v {
            Scalar::Int(n) => Ok(*n),
            other => Err((
                value_at,
                format!(":{key} must be an integer, not {other:?}"),
            )),
        };
        let unsigned = |n: i64| {
            u64::try_from(n).map_err(|_| (value_at, format!(":{key} must not be negative")))
        };
        match key.as_str() {
            "type" => match &v {
                Scalar::Keyword(k) => {
                    op_type = Some(OpType::from_keyword(k).ok_or_else(|| {
                        (
                            value_at,
                            format!(":type :{k} is not :invoke, :ok, :fail or :info"),
                        )
                    })?);
                }
                other => return Err((value_at, format!(":type must be a keyword, not {other:?}"))),
            },
            "f" => match v {
                Scalar::Keyword(k) => f = Some(k),
                other => return Err((value_at, format!(":f must be a keyword, not {other:?}"))),
            },
            "value" => {
                value = Some(match v {
                    Scalar::Nil => None,
                    other => Some(int(&other)?),
                });
            }
            "process" => process = Some(unsigned(int(&v)?)?),
            "time" => time = Some(unsigned(int(&v)?)?),
            "index" => index = Some(unsigned(int(&v)?)?),
            "error" => {
                error = match v {
                    Scalar::Str(s) | Scalar::Keyword(s) => Some(s),
                    Scalar::Int(n) => Some(n.to_string()),
                    Scalar::Nil => None,
                };
            }
            // Other keys (Jepsen adds some) are kept out of this reader's model.
            _ => {}
        }
    }
    cur.skip_blank();
    if cur.pos < line.len() {
        return cur.fail("text after the map");
    }
    let missing = |what: &str| (0, format!("the map has no :{what}"));
    Ok(Op {
        index: index.ok_or_else(|| missing("index"))?,
        process: process.ok_or_else(|| missing("process"))?,
        op_type: op_type.ok_or_else(|| missing("type"))?,
        f: f.ok_or_else(|| missing("f"))?,
        value: value.flatten(),
        time_ns: time.ok_or_else(|| missing("time"))?,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_recorders_merge_by_time_and_are_indexed_in_that_order() {
        let r = Recorder::new();
        std::thread::scope(|scope| {
            for process in 0..4 {
                let r = &r;
                scope.spawn(move || {
                    let mut h = r.client(process);
                    for i in 0..500 {
                        h.record(OpType::Invoke, "generate", None, None);
                        h.record(OpType::Ok, "generate", Some(i), None);
                    }
                });
            }
        });
        let history = r.finish();
        assert_eq!(history.ops.len(), 4 * 1000);
        for (i, pair) in history.ops.windows(2).enumerate() {
            assert!(pair[0].time_ns <= pair[1].time_ns, "by time at {i}");
        }
        for (i, op) in history.ops.iter().enumerate() {
            assert_eq!(op.index, i as u64);
        }
        for process in 0..4 {
            // Each client's own records keep their order: invoke, ok 0, invoke, ok 1, …
            let values: Vec<i64> = history
                .ops
                .iter()
                .filter(|o| o.process == process && o.op_type == OpType::Ok)
                .filter_map(|o| o.value)
                .collect();
            assert_eq!(values, (0..500).collect::<Vec<_>>(), "client {process}");
        }
    }

    fn sample() -> History {
        let r = Recorder::new();
        r.record(0, OpType::Invoke, "generate", None, None);
        r.record(1, OpType::Invoke, "generate", None, None);
        r.record(0, OpType::Ok, "generate", Some(41), None);
        r.record(
            1,
            OpType::Info,
            "generate",
            None,
            Some("timed out \"after\" 2 s\n".into()),
        );
        r.record(2, OpType::Invoke, "generate", None, None);
        r.record(
            2,
            OpType::Fail,
            "generate",
            None,
            Some("connection refused".into()),
        );
        r.finish()
    }

    #[test]
    fn a_repeated_id_is_named_by_the_edn_index_of_the_operations_that_received_it() {
        let r = Recorder::new();
        for (process, value) in [(0, Some(5)), (1, Some(6)), (2, None), (0, Some(5))] {
            r.record(process, OpType::Invoke, "generate", None, None);
            match value {
                Some(v) => r.record(process, OpType::Ok, "generate", Some(v), None),
                None => r.record(
                    process,
                    OpType::Fail,
                    "generate",
                    None,
                    Some("refused".into()),
                ),
            }
        }
        let h = r.finish();
        let indexed: Vec<(u64, u64)> = h
            .ok_values_indexed("generate")
            .into_iter()
            .map(|(v, i)| (u64::try_from(v).unwrap(), i))
            .collect();
        assert_eq!(indexed, [(5, 1), (6, 3), (5, 7)]);
        let check = load::verify::ids_unique_in_history("t", &indexed);
        let named = check.first_offending_event.unwrap();
        assert_eq!(named, "ID 5 received again (#7 of the history; first #1)");
        // Each number is the `:index` of an `ok` of that ID in the EDN a reader greps.
        let edn = h.to_edn();
        for n in [7, 1] {
            let line = edn
                .lines()
                .find(|l| l.contains(&format!(":index {n}}}")))
                .unwrap();
            assert!(
                line.starts_with("{:type :ok, :f :generate, :value 5,"),
                "{line}"
            );
        }
    }

    #[test]
    fn a_history_goes_to_edn_and_back_unchanged() {
        let h = sample();
        let edn = h.to_edn();
        assert_eq!(edn.lines().count(), 6);
        assert!(
            edn.lines()
                .next()
                .unwrap()
                .starts_with("{:type :invoke, :f :generate, :value nil, :process 0, :time "),
            "{edn}"
        );
        assert_eq!(History::parse_edn(&edn), Ok(h.clone()));
        assert_eq!(h.ok_values("generate"), [41]);
        assert_eq!(
            h.completions(),
            Completions {
                ok: 1,
                fail: 1,
                info: 1
            }
        );
        let indices: Vec<u64> = h.ops.iter().map(|op| op.index).collect();
        assert_eq!(indices, [0, 1, 2, 3, 4, 5]);
        assert!(h.ops.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
    }

    #[test]
    fn endpoint_stats_pair_each_completion_with_its_invoke() {
        let op = |process, op_type, time_ns| Op {
            index: 0,
            process,
            op_type,
            f: "generate".into(),
            value: None,
            time_ns,
            error: None,
        };
        let h = History {
            ops: vec![
                op(0, OpType::Invoke, 1_000_000),
                op(1, OpType::Invoke, 2_000_000),
                // process 0: 4 ms, ok; process 1: 1,500 ms, unknown outcome.
                op(0, OpType::Ok, 5_000_000),
                op(0, OpType::Invoke, 6_000_000),
                op(0, OpType::Fail, 7_000_000),
                op(1, OpType::Info, 1_502_000_000),
                // A completion with no invoke (a truncated history) is not a request.
                op(2, OpType::Ok, 1_600_000_000),
            ],
        };
        let e = h.endpoint_stats("generate", 2.0);
        assert_eq!(e.requests, 3);
        assert_eq!(e.errors.get("info (unknown outcome)"), Some(&1));
        assert_eq!(e.errors.get("fail (certainly not run)"), Some(&1));
        assert!((e.throughput_rps - 1.5).abs() < 1e-9);
        // The slowest request took 1.5 s; the fastest 1 ms.
        assert!(e.corrected.max_us >= 1_499_000, "{:?}", e.corrected);
        assert!(e.corrected.p50_us <= 4_100, "{:?}", e.corrected);
        assert_eq!(h.endpoint_stats("read", 2.0).requests, 0);
    }

    #[test]
    fn a_jepsen_written_line_reads_with_its_extra_keys_ignored() {
        let line =
            "{:type :ok, :f :generate, :value 3, :time 1234, :process 7, :index 9, :node \"n1\"}";
        let h = History::parse_edn(line).unwrap();
        assert_eq!(h.ops[0].value, Some(3));
        assert_eq!(h.ops[0].process, 7);
        assert_eq!(h.ops[0].op_type, OpType::Ok);
    }

    #[test]
    fn a_bad_line_is_named_with_its_position_and_what_is_wrong() {
        let text = "{:type :ok, :f :generate, :value 1, :process 0, :time 0, :index 0}\n\
                    {:type :maybe, :f :generate, :value 1, :process 0, :time 0, :index 1}\n";
        let e = History::parse_edn(text).unwrap_err();
        assert_eq!((e.line, e.column), (2, 8), "{e}");
        assert!(e.what.contains(":type :maybe"), "{e}");
        for (bad, needle) in [
            (
                "{:type :ok, :f :generate, :value x1, :process 0, :time 0, :index 0}",
                "`x1`",
            ),
            (
                "{:type :ok, :f :generate, :value 1, :process -1, :time 0, :index 0}",
                "negative",
            ),
            (
                "{:type :ok, :f :generate, :value 1, :process 0, :time 0}",
                "no :index",
            ),
            ("{:type :ok, :f :generate, :error \"open", "unterminated"),
            ("[:type :ok]", "expected `{`"),
            (
                "{:type :ok, :f :generate, :value 1, :process 0, :time 0, :index 0} x",
                "after the map",
            ),
        ] {
            let e = History::parse_edn(bad).unwrap_err();
            assert!(e.to_string().contains(needle), "{bad}: {e}");
        }
    }
}
