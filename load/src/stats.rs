//! Latency recording: per-endpoint HdrHistograms in microseconds, the constant-rate
//! (open-model, wrk2-style) send schedule, and coordinated-omission correction.
//!
//! Every request's own time is measured by the workload itself (an `Instant` around the goose
//! call and the body read), never taken from goose's approximate buckets. Histograms per
//! endpoint: *uncorrected* (from the actual send) and *corrected* (from the actual send plus the
//! time the user's send was held back waiting for its previous answer, i.e. measured from the
//! INTENDED send time of the schedule whenever the server made the user late, so that a stall
//! of the server delays every later request of the schedule and shows up as latency, as in
//! wrk2 / Gil Tene's "How NOT to measure latency"). Lateness the client causes itself (timer
//! granularity, a starved client CPU) is not the server's latency and is kept apart: the third
//! histogram, *from schedule*, measures from the intended time regardless (the strict wrk2
//! figure, reported as a diagnostic), and [`LatenessRecorder`] holds the client's own send
//! lateness. Correction is done from intended times only (never also `record_correct`, which
//! would count a stall twice). Closed-loop runs have no schedule: corrected = uncorrected.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::time::{Duration, SystemTime};

use hdrhistogram::Histogram;
use hdrhistogram::serialization::V2DeflateSerializer;
use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use reports::model::{EndpointStats, IntervalStats, Percentiles};

/// Highest latency a histogram holds, in microseconds (larger values saturate): 10 minutes.
pub const LATENCY_MAX_US: u64 = 600_000_000;
/// Significant figures of every histogram.
pub const SIGFIG: u8 = 3;
/// Length of one `over_time` interval.
pub const INTERVAL_MS: u64 = 1_000;
/// Most intervals kept per endpoint (bounds memory for long runs: one day of 1 s intervals).
pub const INTERVALS_MAX: usize = 86_400;
/// `iter_quantiles` ticks per half distance for the distribution plot.
pub const QUANTILE_TICKS: u32 = 5;

/// The open-model schedule: with `users` users sharing a total of `rate` sends per second, user
/// `k` (0-based) sends its `i`-th request (0-based) at `t0 + (k + i·users)·period`, `period =
/// 1/rate`. Users are thus interleaved evenly and together send exactly `rate` per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    /// Users sharing the rate.
    pub users: u64,
    /// Time between two consecutive sends of the whole population, in nanoseconds.
    pub period_ns: u64,
}

impl Schedule {
    /// The schedule for `rate` requests per second over `users` users; `None` if `rate` is not
    /// a positive finite number or `users` is zero.
    #[must_use]
    pub fn new(rate: f64, users: u64) -> Option<Self> {
        if !(rate.is_finite() && rate > 0.0) || users == 0 {
            return None;
        }
        let period_ns = (1e9 / rate).round().max(1.0) as u64;
        Some(Self { users, period_ns })
    }

    /// Offset from `t0` of user `k`'s `i`-th intended send.
    #[must_use]
    pub fn offset(&self, k: u64, i: u64) -> Duration {
        let slot = k.saturating_add(i.saturating_mul(self.users));
        Duration::from_nanos(slot.saturating_mul(self.period_ns))
    }
}

fn histogram() -> Histogram<u64> {
    // Bounds are constants that are valid for hdrhistogram: creation cannot fail.
    Histogram::new_with_bounds(1, LATENCY_MAX_US, SIGFIG).expect("valid histogram bounds")
}

/// One reporting interval of one endpoint.
#[derive(Clone, Debug)]
struct Interval {
    corrected: Histogram<u64>,
    requests: u64,
    errors: u64,
}

/// Everything recorded for one endpoint.
#[derive(Clone, Debug)]
pub struct EndpointRecorder {
    corrected: Histogram<u64>,
    uncorrected: Histogram<u64>,
    from_schedule: Histogram<u64>,
    requests: u64,
    errors: BTreeMap<String, u64>,
    intervals: Vec<Interval>,
}

impl Default for EndpointRecorder {
    fn default() -> Self {
        Self {
            corrected: histogram(),
            uncorrected: histogram(),
            from_schedule: histogram(),
            requests: 0,
            errors: BTreeMap::new(),
            intervals: Vec::new(),
        }
    }
}

impl EndpointRecorder {
    /// Records one request. `at_ms`: when it was intended to be sent, in ms since measurement
    /// start (selects the interval); `corrected_us` from the actual send plus the lag the
    /// server caused, `uncorrected_us` from the actual send, `from_schedule_us` from the
    /// intended send (the strict figure, which also counts the client's own lateness);
    /// `error`: its error class, if it failed.
    pub fn record(
        &mut self,
        at_ms: u64,
        corrected_us: u64,
        uncorrected_us: u64,
        from_schedule_us: u64,
        error: Option<&str>,
    ) {
        let corrected_us = corrected_us.max(uncorrected_us).max(1);
        self.corrected.saturating_record(corrected_us);
        self.uncorrected.saturating_record(uncorrected_us.max(1));
        self.from_schedule
            .saturating_record(from_schedule_us.max(uncorrected_us).max(1));
        self.requests += 1;
        if let Some(e) = error {
            *self.errors.entry(e.to_owned()).or_insert(0) += 1;
        }
        let idx = usize::try_from(at_ms / INTERVAL_MS).unwrap_or(usize::MAX);
        if idx < INTERVALS_MAX {
            while self.intervals.len() <= idx {
                self.intervals.push(Interval {
                    corrected: histogram(),
                    requests: 0,
                    errors: 0,
                });
            }
            let iv = &mut self.intervals[idx];
            iv.corrected.saturating_record(corrected_us);
            iv.requests += 1;
            iv.errors += u64::from(error.is_some());
        }
    }

    /// Requests recorded.
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Percentiles of the latency from the intended send time (see [`Self::record`]).
    #[must_use]
    pub fn from_schedule(&self) -> Percentiles {
        percentiles(&self.from_schedule)
    }

    /// The report entry for this endpoint over a measurement of `duration_s` seconds.
    #[must_use]
    pub fn stats(&self, name: &str, duration_s: f64) -> EndpointStats {
        let throughput_rps = if duration_s > 0.0 {
            self.requests as f64 / duration_s
        } else {
            0.0
        };
        let distribution = if self.corrected.is_empty() {
            Vec::new()
        } else {
            self.corrected
                .iter_quantiles(QUANTILE_TICKS)
                .map(|v| (v.quantile_iterated_to(), v.value_iterated_to()))
                .filter(|(q, _)| *q < 1.0)
                .collect()
        };
        let interval_s = INTERVAL_MS as f64 / 1000.0;
        let over_time = self
            .intervals
            .iter()
            .enumerate()
            .map(|(i, iv)| IntervalStats {
                t_s: i as f64 * interval_s,
                p50_us: iv.corrected.value_at_quantile(0.50),
                p99_us: iv.corrected.value_at_quantile(0.99),
                p999_us: iv.corrected.value_at_quantile(0.999),
                max_us: iv.corrected.max(),
                rps: iv.requests as f64 / interval_s,
                errors: iv.errors,
            })
            .collect();
        EndpointStats {
            name: name.to_owned(),
            requests: self.requests,
            errors: self.errors.clone(),
            throughput_rps,
            corrected: percentiles(&self.corrected),
            uncorrected: percentiles(&self.uncorrected),
            distribution,
            over_time,
        }
    }

    /// Writes the corrected per-interval histograms as an HdrHistogram interval log (`.hlog`,
    /// V2 deflate-compressed encoding), one line per interval, tagged with the endpoint name.
    ///
    /// # Errors
    /// The file cannot be created or written.
    pub fn write_hlog(&self, path: &Path, name: &str, start: SystemTime) -> std::io::Result<()> {
        let file = File::create(path)?;
        let mut out = BufWriter::new(file);
        let mut serializer = V2DeflateSerializer::new();
        let mut writer = IntervalLogWriterBuilder::new()
            .add_comment(&format!("loadgen endpoint {name}, corrected latency in us"))
            .with_start_time(start)
            .with_base_time(start)
            .with_max_value_divisor(1000.0)
            .begin_log_with(&mut out, &mut serializer)?;
        let tag_text: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let tag = Tag::new(&tag_text);
        for (i, iv) in self.intervals.iter().enumerate() {
            writer
                .write_histogram(
                    &iv.corrected,
                    Duration::from_millis(i as u64 * INTERVAL_MS),
                    Duration::from_millis(INTERVAL_MS),
                    tag,
                )
                .map_err(|e| std::io::Error::other(format!("hlog: {e:?}")))?;
        }
        drop(writer);
        std::io::Write::flush(&mut out)
    }
}

/// The client's own lateness in sending on schedule, in microseconds (a diagnostic: it is not
/// counted in any latency).
#[derive(Clone, Debug)]
pub struct LatenessRecorder(Histogram<u64>);

impl Default for LatenessRecorder {
    fn default() -> Self {
        Self(histogram())
    }
}

impl LatenessRecorder {
    /// Records one send `late_us` late (0: on time or early).
    pub fn record(&mut self, late_us: u64) {
        self.0.saturating_record(late_us.max(1));
    }

    /// Sends recorded.
    #[must_use]
    pub fn sends(&self) -> u64 {
        self.0.len()
    }

    /// Percentiles of the lateness.
    #[must_use]
    pub fn percentiles(&self) -> Percentiles {
        percentiles(&self.0)
    }
}

/// The report's percentiles of a histogram (all zero when empty).
#[must_use]
pub fn percentiles(h: &Histogram<u64>) -> Percentiles {
    if h.is_empty() {
        return Percentiles::default();
    }
    Percentiles {
        p50_us: h.value_at_quantile(0.50),
        p90_us: h.value_at_quantile(0.90),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        p9999_us: h.value_at_quantile(0.9999),
        max_us: h.max(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_interleaves_users_at_the_total_rate() {
        let s = Schedule::new(1000.0, 4).unwrap();
        assert_eq!(s.period_ns, 1_000_000);
        // user k's i-th send at (k + 4i) ms
        assert_eq!(s.offset(0, 0), Duration::ZERO);
        assert_eq!(s.offset(1, 0), Duration::from_millis(1));
        assert_eq!(s.offset(3, 0), Duration::from_millis(3));
        assert_eq!(s.offset(0, 1), Duration::from_millis(4));
        assert_eq!(s.offset(2, 5), Duration::from_millis(22));
        // all sends of the first second are distinct and exactly 1000 of them fall in [0, 1 s)
        let mut slots: Vec<Duration> = (0..4)
            .flat_map(|k| (0..300).map(move |i| s.offset(k, i)))
            .filter(|d| *d < Duration::from_secs(1))
            .collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), 1000);
        assert!(Schedule::new(0.0, 4).is_none());
        assert!(Schedule::new(f64::NAN, 4).is_none());
        assert!(Schedule::new(10.0, 0).is_none());
    }

    /// A simulated stall: a client on a 1 ms schedule whose server answers in 100 us, except
    /// one request that takes 1 s. A closed-loop client waits for it and does not send the
    /// ~1000 requests it should have sent meanwhile; measuring from the intended send times
    /// charges the stall to every one of them.
    #[test]
    fn a_stall_raises_corrected_p99_but_not_uncorrected() {
        let s = Schedule::new(1000.0, 1).unwrap();
        let mut rec = EndpointRecorder::default();
        let mut now_us: u64 = 0; // client clock
        for i in 0..10_000u64 {
            let intended_us = s.offset(0, i).as_micros() as u64;
            let send_us = now_us.max(intended_us);
            let service_us = if i == 5_000 { 1_000_000 } else { 100 };
            let done_us = send_us + service_us;
            // the send is late only because the user waited for its previous answer: all of
            // the lateness is the server's
            let server_lag_us = send_us - intended_us;
            rec.record(
                intended_us / 1000,
                done_us - send_us + server_lag_us,
                done_us - send_us,
                done_us - intended_us,
                None,
            );
            now_us = done_us;
        }
        let st = rec.stats("x", 10.0);
        assert_eq!(st.requests, 10_000);
        // uncorrected: one slow request out of 10,000: P99 stays at the service time
        assert!(st.uncorrected.p99_us < 200, "{:?}", st.uncorrected);
        assert!(st.uncorrected.max_us >= 999_000);
        // corrected: ~1000 requests waited behind the stall: P99 is hundreds of ms
        assert!(st.corrected.p99_us > 500_000, "{:?}", st.corrected);
        assert!(st.corrected.p50_us < 200);
        // the stall's second shows up in the interval stats
        assert!(st.over_time.iter().any(|iv| iv.p99_us > 500_000));
        assert_eq!(st.over_time.len(), 10);
        assert!(!st.distribution.is_empty());
    }

    #[test]
    fn errors_are_counted_by_class_and_hlog_is_written() {
        let mut rec = EndpointRecorder::default();
        rec.record(0, 10, 10, 10, None);
        rec.record(1500, 20, 20, 20, Some("http_5xx"));
        rec.record(1600, 20, 20, 20, Some("timeout"));
        let st = rec.stats("GET /id", 2.0);
        assert_eq!(st.error_count(), 2);
        assert_eq!(st.errors["http_5xx"], 1);
        assert!((st.throughput_rps - 1.5).abs() < 1e-9);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("id.hlog");
        rec.write_hlog(&p, "GET /id", SystemTime::now()).unwrap();
        let text = std::fs::read(&p).unwrap();
        let lines: Vec<_> =
            hdrhistogram::serialization::interval_log::IntervalLogIterator::new(&text)
                .filter_map(|l| match l {
                    Ok(hdrhistogram::serialization::interval_log::LogEntry::Interval(h)) => {
                        Some(h.tag().map(|t| t.as_str().to_owned()))
                    }
                    _ => None,
                })
                .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].as_deref(), Some("GET__id"));
    }
}
