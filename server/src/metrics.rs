//! Counters for `GET /metrics` in the Prometheus text format (version 0.0.4).
//!
//! Request counts are kept per matched route and status code in plain atomics (one row of 500
//! counters per route, looked up under a read lock), so counting never serializes requests.
//! Gauges and counters owned by the state machines (allocator reloads, Snowflake issuance) are
//! read from them at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Status codes counted: 100..=599.
const STATUS_MIN: u16 = 100;
const STATUS_COUNT: usize = 500;
/// Distinct route labels kept (routes are a fixed set; unmatched paths share one label).
const ROUTES_MAX: usize = 64;

/// Label for requests that matched no route.
pub const UNMATCHED: &str = "unmatched";

#[derive(Debug)]
struct RouteRow {
    by_status: Box<[AtomicU64]>,
}

impl RouteRow {
    fn new() -> Self {
        Self {
            by_status: (0..STATUS_COUNT).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

/// The server's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    routes: RwLock<BTreeMap<String, Arc<RouteRow>>>,
    /// IDs issued by `/id` routes.
    pub ids_issued: AtomicU64,
    /// Snowflake IDs issued.
    pub snowflake_issued: AtomicU64,
    /// Semantic IDs issued.
    pub semantic_issued: AtomicU64,
    /// Requests refused by admission control (503).
    pub overload_rejected: AtomicU64,
    /// Requests that waited in the admission queue.
    pub overload_queued: AtomicU64,
    /// Group commits (fsync'ing commits) made by the durable writer.
    pub group_commits: AtomicU64,
    /// Operations made durable by those commits.
    pub group_commit_ops: AtomicU64,
    /// Lottery draws answered.
    pub lottery_draws: AtomicU64,
    /// Reclaim sweeps run, and tails they returned.
    pub reclaim_sweeps: AtomicU64,
    /// Tails returned to pools by reclaim sweeps.
    pub reclaimed_tails: AtomicU64,
    /// Snowflake reservations persisted.
    pub snowflake_reservations: AtomicU64,
    /// Draws parked: their verdict ran out of attempts and compensation took them over.
    pub lottery_draws_parked: AtomicU64,
    /// Draws dead-lettered: compensation spent its retry budget.
    pub lottery_draws_dead_lettered: AtomicU64,
    /// Dead letters an operator retried (`POST /admin/dead-letters/{xid}/retry`).
    pub lottery_dead_letters_retried: AtomicU64,
    /// Draws dead-lettered now (a gauge, set by the lottery writer).
    pub lottery_dead_letters: AtomicU64,
    /// Messages the coordinator sent to participants in other processes.
    pub participant_calls: AtomicU64,
    /// Of those, the ones that got no answer (refused, timed out, an error status); the
    /// coordinator's timeout and compensation take over.
    pub participant_calls_lost: AtomicU64,
    /// Connections open now (a gauge).
    pub connections_open: AtomicU64,
    /// Connections closed at once: the process held `connections_max` already.
    pub connections_refused_full: AtomicU64,
    /// Connections closed at once: their peer address held `per_peer_max` already.
    pub connections_refused_peer: AtomicU64,
    /// Idle connections closed to give their place to a new one (`crate::conns`).
    pub connections_evicted: AtomicU64,
    /// Connections closed because a request head did not arrive in time (or a keep-alive
    /// connection stayed idle too long).
    pub connections_timed_out: AtomicU64,
    /// Requests answered 408: the body did not arrive in time.
    pub bodies_timed_out: AtomicU64,
}

impl Metrics {
    /// Counts one answered request.
    pub fn count_request(&self, route: &str, status: u16) {
        let index = usize::from(status.clamp(STATUS_MIN, 599) - STATUS_MIN);
        let row = {
            let routes = self
                .routes
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            routes.get(route).cloned()
        };
        let row = row.unwrap_or_else(|| {
            let mut routes = self
                .routes
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let key = if routes.len() >= ROUTES_MAX && !routes.contains_key(route) {
                UNMATCHED
            } else {
                route
            };
            Arc::clone(
                routes
                    .entry(key.to_owned())
                    .or_insert_with(|| Arc::new(RouteRow::new())),
            )
        });
        row.by_status[index].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests answered so far for `route` with `status`.
    #[must_use]
    pub fn requests(&self, route: &str, status: u16) -> u64 {
        let routes = self
            .routes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        routes.get(route).map_or(0, |row| {
            row.by_status[usize::from(status.clamp(STATUS_MIN, 599) - STATUS_MIN)]
                .load(Ordering::Relaxed)
        })
    }

    /// Renders the request counters and the plain counters; `extra` lines (already formatted)
    /// are appended.
    #[must_use]
    pub fn render(&self, extra: &[(String, &str, String)]) -> String {
        let mut out = String::new();
        self.render_requests(&mut out);
        for (name, help, c) in self.plain_counters() {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                c.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP sut_lottery_dead_letters Draws dead-lettered now (GET /admin/dead-letters).\n\
             # TYPE sut_lottery_dead_letters gauge\nsut_lottery_dead_letters {}",
            self.lottery_dead_letters.load(Ordering::Relaxed)
        );
        let mut last_name = "";
        for (series, help, value) in extra {
            let name = series.split('{').next().unwrap_or(series);
            if name != last_name {
                let kind = if name.ends_with("_total") {
                    "counter"
                } else {
                    "gauge"
                };
                let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            }
            let _ = writeln!(out, "{series} {value}");
            last_name = name;
        }
        out
    }

    /// `sut_http_requests_total`, one line per route and status seen.
    fn render_requests(&self, out: &mut String) {
        out.push_str(
            "# HELP sut_http_requests_total HTTP requests answered, by route and status.\n",
        );
        out.push_str("# TYPE sut_http_requests_total counter\n");
        let routes = self
            .routes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (route, row) in routes.iter() {
            for (i, c) in row.by_status.iter().enumerate() {
                let n = c.load(Ordering::Relaxed);
                if n > 0 {
                    let status = usize::from(STATUS_MIN) + i;
                    let _ = writeln!(
                        out,
                        "sut_http_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                        escape(route)
                    );
                }
            }
        }
    }

    /// The plain counters: name, help, value.
    fn plain_counters(&self) -> [(&'static str, &'static str, &AtomicU64); 21] {
        [
            (
                "sut_connections_refused_full_total",
                "Connections closed at once: the process held its maximum already.",
                &self.connections_refused_full,
            ),
            (
                "sut_connections_refused_peer_total",
                "Connections closed at once: their peer address held its maximum already.",
                &self.connections_refused_peer,
            ),
            (
                "sut_connections_evicted_total",
                "Idle connections closed to give their place to a new connection.",
                &self.connections_evicted,
            ),
            (
                "sut_connections_timed_out_total",
                "Connections closed: no complete request head in time (or idle too long).",
                &self.connections_timed_out,
            ),
            (
                "sut_bodies_timed_out_total",
                "Requests answered 408: the body did not arrive in time.",
                &self.bodies_timed_out,
            ),
            (
                "sut_ids_issued_total",
                "Segment IDs issued over HTTP.",
                &self.ids_issued,
            ),
            (
                "sut_snowflake_issued_total",
                "Snowflake IDs issued over HTTP.",
                &self.snowflake_issued,
            ),
            (
                "sut_semantic_issued_total",
                "Semantic IDs issued over HTTP.",
                &self.semantic_issued,
            ),
            (
                "sut_overload_rejected_total",
                "Requests refused with 503 by admission control.",
                &self.overload_rejected,
            ),
            (
                "sut_overload_queued_total",
                "Requests that waited for an admission slot.",
                &self.overload_queued,
            ),
            (
                "sut_group_commits_total",
                "fsync'ing group commits of the durable writer.",
                &self.group_commits,
            ),
            (
                "sut_group_commit_ops_total",
                "Operations made durable by group commits.",
                &self.group_commit_ops,
            ),
            (
                "sut_lottery_draws_total",
                "Lottery draws answered.",
                &self.lottery_draws,
            ),
            (
                "sut_reclaim_sweeps_total",
                "Expired-lease reclaim sweeps run.",
                &self.reclaim_sweeps,
            ),
            (
                "sut_reclaimed_tails_total",
                "Segment tails returned to pools by sweeps.",
                &self.reclaimed_tails,
            ),
            (
                "sut_snowflake_reservations_total",
                "Snowflake time reservations persisted.",
                &self.snowflake_reservations,
            ),
            (
                "sut_lottery_draws_parked_total",
                "Draws whose verdict ran out of attempts and went to compensation.",
                &self.lottery_draws_parked,
            ),
            (
                "sut_lottery_draws_dead_lettered_total",
                "Draws compensation gave up on (dead letters).",
                &self.lottery_draws_dead_lettered,
            ),
            (
                "sut_lottery_dead_letters_retried_total",
                "Dead letters an operator retried (POST /admin/dead-letters/{xid}/retry).",
                &self.lottery_dead_letters_retried,
            ),
            (
                "sut_participant_calls_total",
                "Messages sent to participants in other processes.",
                &self.participant_calls,
            ),
            (
                "sut_participant_calls_lost_total",
                "Messages to participants that got no answer (left to timeouts and compensation).",
                &self.participant_calls_lost,
            ),
        ]
    }
}

/// Escapes a label value.
#[must_use]
pub fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_route_and_status_and_renders_them() {
        let m = Metrics::default();
        m.count_request("/id/{tag}", 200);
        m.count_request("/id/{tag}", 200);
        m.count_request("/id/{tag}", 404);
        assert_eq!(m.requests("/id/{tag}", 200), 2);
        assert_eq!(m.requests("/id/{tag}", 404), 1);
        assert_eq!(m.requests("/id/{tag}", 500), 0);
        let text = m.render(&[("sut_x{tag=\"a\"}".into(), "X.", "3".into())]);
        assert!(text.contains("sut_http_requests_total{route=\"/id/{tag}\",status=\"200\"} 2"));
        assert!(text.contains("sut_http_requests_total{route=\"/id/{tag}\",status=\"404\"} 1"));
        assert!(text.contains("# TYPE sut_x gauge\nsut_x{tag=\"a\"} 3"));
    }

    #[test]
    fn route_labels_are_bounded() {
        let m = Metrics::default();
        for i in 0..(ROUTES_MAX + 10) {
            m.count_request(&format!("/r{i}"), 200);
        }
        assert_eq!(
            m.routes.read().unwrap().len(),
            ROUTES_MAX + 1,
            "the cap plus the shared label"
        );
        assert!(m.requests(UNMATCHED, 200) >= 10);
    }
}
