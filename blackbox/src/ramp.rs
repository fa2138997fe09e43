//! The concurrency ramp of `scenario ids` (docs/own-service.md, "How many clients"): unless the
//! user names a client count, the run raises it in short steps — 1, 2, 4, 8, … up to a cap —
//! until the answer rate stops growing or the latency doubles, and runs its checked phase at the
//! count it chose. A few clients against a slow service keep few requests in flight and may
//! never open a race that a busier hour opens; the ramp finds the load the service takes.
//!
//! This module is the decision, a pure function of the steps measured ([`Ramp::next`],
//! [`Ramp::finish`]); [`crate::ids`] runs the steps.

use std::time::Duration;

use reports::model::RampStep;

/// A step whose rate grew less than this over the step before is a plateau.
pub const GROWTH_MIN: f64 = 1.10;
/// A step whose P99 (its median, below 100 answers) is more than this times the first step's
/// has queued up.
pub const LATENCY_FACTOR: f64 = 2.0;
/// A step with more errors than this share of its answers is past what the service takes.
pub const ERROR_SHARE_MAX: f64 = 0.01;

/// How a ramp runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RampSpec {
    /// The most clients tried.
    pub max: u64,
    /// How long each step lasts (the first fifth of it is not measured: new clients connect).
    pub step: Duration,
}

impl RampSpec {
    /// The default cap.
    pub const MAX: u64 = 64;
    /// The default step.
    pub const STEP: Duration = Duration::from_millis(1_000);

    /// Checks the spec.
    ///
    /// # Errors
    /// A cap below 1 or a step below 100 ms, named.
    pub fn validate(&self) -> Result<(), String> {
        if self.max < 1 {
            return Err("--ramp-max must be at least 1".into());
        }
        if self.step < Duration::from_millis(100) {
            return Err(format!(
                "--ramp-step-ms {}: at least 100 (a step must carry a rate and a P99)",
                self.step.as_millis()
            ));
        }
        Ok(())
    }
}

/// The ramp so far: the steps measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Ramp {
    spec: RampSpec,
    /// The least clients the checked phase runs with (two per server, so that requests of
    /// one server can overlap), capped by the spec.
    floor: u64,
    steps: Vec<RampStep>,
}

/// What to do after a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Try this many clients.
    Step(u64),
    /// Stop: the checked phase runs with `clients`, for `reason`.
    Done {
        /// The client count chosen.
        clients: u64,
        /// Why the ramp stopped and chose it.
        reason: String,
    },
}

impl Ramp {
    /// A ramp over `servers` servers.
    #[must_use]
    pub fn new(spec: RampSpec, servers: usize) -> Self {
        Self {
            spec,
            floor: (2 * servers as u64).clamp(1, spec.max),
            steps: Vec::new(),
        }
    }

    /// The first step's clients.
    #[must_use]
    pub const fn first(&self) -> u64 {
        1
    }

    /// The steps measured.
    #[must_use]
    pub fn steps(&self) -> &[RampStep] {
        &self.steps
    }

    /// Records a step and decides what comes next. A step that would end the ramp is measured
    /// once more, and ends it only if the repeat does too (one noisy second on a shared
    /// machine must not choose the count).
    pub fn next(&mut self, step: RampStep) -> Next {
        self.steps.push(step);
        let last = &self.steps[self.steps.len() - 1];
        let Some((clients, reason)) = self.stop() else {
            if last.clients >= self.spec.max {
                return self.done(
                    last.clients,
                    format!(
                        "the rate still grew at the cap (--ramp-max {})",
                        self.spec.max
                    ),
                );
            }
            return Next::Step((last.clients * 2).min(self.spec.max));
        };
        let measured = self
            .steps
            .iter()
            .filter(|s| s.clients == last.clients)
            .count();
        if measured < 2 {
            return Next::Step(last.clients);
        }
        self.done(clients, reason)
    }

    /// Whether the last step ends the ramp: the count to keep, and why.
    fn stop(&self) -> Option<(u64, String)> {
        let last = self.steps.last()?;
        let base = &self.steps[0];
        // The last step with fewer clients (a repeated step is compared with the same one).
        let previous = self.steps.iter().rev().find(|s| s.clients < last.clients);
        let before = previous.map_or(1, |p| p.clients);
        if last.requests == 0 {
            return Some((
                before,
                format!("no answer within the step at {} clients", last.clients),
            ));
        }
        if last.errors as f64 > ERROR_SHARE_MAX * last.requests as f64 {
            return Some((
                before,
                format!(
                    "{} of {} answers at {} clients were errors",
                    last.errors, last.requests, last.clients
                ),
            ));
        }
        // P99 where both steps carry it (100 answers); below that it is their maximum, and the
        // median is compared instead.
        let (name, now, then) = if last.requests.min(base.requests) >= 100 {
            ("P99", last.p99_us, base.p99_us)
        } else {
            ("P50", last.p50_us, base.p50_us)
        };
        if previous.is_some() && now as f64 > LATENCY_FACTOR * then as f64 {
            return Some((
                before,
                format!(
                    "{name} {:.1} ms at {} clients, more than {LATENCY_FACTOR}× the {:.1} ms at {}",
                    now as f64 / 1e3,
                    last.clients,
                    then as f64 / 1e3,
                    base.clients
                ),
            ));
        }
        let p = previous?;
        if last.rate_rps < GROWTH_MIN * p.rate_rps {
            // The plateau: as many answers a second with more requests in flight at once.
            let keep = if last.rate_rps >= p.rate_rps {
                last.clients
            } else {
                p.clients
            };
            return Some((
                keep,
                format!(
                    "the rate stopped growing: {:.0}/s at {} clients, {:.0}/s at {}",
                    p.rate_rps, p.clients, last.rate_rps, last.clients
                ),
            ));
        }
        None
    }

    fn done(&self, clients: u64, reason: String) -> Next {
        if clients < self.floor {
            return Next::Done {
                clients: self.floor,
                reason: format!(
                    "{reason}; raised to {} (two per server, so that requests can overlap)",
                    self.floor
                ),
            };
        }
        Next::Done { clients, reason }
    }

    /// The ramp as reported, with the count chosen.
    #[must_use]
    pub fn finish(self, chosen: u64, reason: String) -> reports::model::Ramp {
        reports::model::Ramp {
            steps: self.steps,
            chosen,
            reason,
        }
    }
}

/// The printed line: `ramp: 1 → 22/s (P50 44.9, P99 45.1 ms), 2 → …; chosen N: why`.
#[must_use]
pub fn line(ramp: &reports::model::Ramp) -> String {
    let steps = ramp
        .steps
        .iter()
        .map(|s| {
            let errors = if s.errors > 0 {
                format!(", {} errors", s.errors)
            } else {
                String::new()
            };
            format!(
                "{} → {:.0}/s (P50 {:.1}, P99 {:.1} ms{errors})",
                s.clients,
                s.rate_rps,
                s.p50_us as f64 / 1e3,
                s.p99_us as f64 / 1e3
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "  ramp: {steps}; chosen {} clients: {}",
        ramp.chosen, ramp.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(clients: u64, rate_rps: f64, latency_ms: f64) -> RampStep {
        RampStep {
            clients,
            requests: (rate_rps * 0.8) as u64,
            errors: 0,
            rate_rps,
            p50_us: (latency_ms * 0.9e3) as u64,
            p99_us: (latency_ms * 1e3) as u64,
        }
    }

    fn spec(max: u64) -> RampSpec {
        RampSpec {
            max,
            step: RampSpec::STEP,
        }
    }

    /// Feeds the steps of a service whose answers `at(clients, n)` gives (`n`: the how-manieth
    /// measurement of that count), until the ramp stops: the counts tried, the one chosen, why.
    fn ramp_with(
        max: u64,
        servers: usize,
        at: impl Fn(u64, usize) -> (f64, f64),
    ) -> (Vec<u64>, u64, String) {
        let mut r = Ramp::new(spec(max), servers);
        let mut clients = r.first();
        loop {
            let n = r.steps().iter().filter(|s| s.clients == clients).count();
            let (rate, latency) = at(clients, n);
            match r.next(step(clients, rate, latency)) {
                Next::Step(c) => clients = c,
                Next::Done { clients, reason } => {
                    return (
                        r.steps().iter().map(|s| s.clients).collect(),
                        clients,
                        reason,
                    );
                }
            }
        }
    }

    fn ramp(max: u64, servers: usize, at: impl Fn(u64) -> (f64, f64)) -> (Vec<u64>, u64, String) {
        ramp_with(max, servers, |c, _| at(c))
    }

    #[test]
    fn a_slow_service_whose_rate_keeps_growing_is_ramped_to_the_cap() {
        // 44 ms a request whatever the load: the rate doubles with the clients.
        let (tried, chosen, why) = ramp(64, 1, |c| (c as f64 / 0.044, 45.0));
        assert_eq!(tried, [1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(chosen, 64);
        assert!(why.contains("still grew at the cap"), "{why}");
        // A cap that is not a power of two is tried itself.
        let (tried, chosen, _) = ramp(48, 1, |c| (c as f64 / 0.044, 45.0));
        assert_eq!(tried, [1, 2, 4, 8, 16, 32, 48]);
        assert_eq!(chosen, 48);
    }

    #[test]
    fn the_ramp_stops_where_the_rate_stops_growing_measured_twice() {
        // Saturated at 8 clients: 16 gives 4 % more, on both measurements.
        let (tried, chosen, why) = ramp(64, 1, |c| {
            let rate = (c.min(8) as f64) * 1_000.0 * if c > 8 { 1.04 } else { 1.0 };
            (rate, 1.0 + c as f64 * 0.05)
        });
        assert_eq!(tried, [1, 2, 4, 8, 16, 16]);
        assert_eq!(chosen, 16, "the same rate with more in flight");
        assert!(why.contains("stopped growing"), "{why}");
        // A rate that falls back: the step before.
        let (_, chosen, _) = ramp(64, 1, |c| {
            (if c > 8 { 7_000.0 } else { c as f64 * 1e3 }, 1.0)
        });
        assert_eq!(chosen, 8);
    }

    #[test]
    fn the_ramp_stops_before_the_latency_doubles() {
        // Enough answers for a P99: the P99 is compared.
        let (tried, chosen, why) =
            ramp(64, 1, |c| (c as f64 * 1e3, if c >= 8 { 2.5 } else { 1.0 }));
        assert_eq!(tried, [1, 2, 4, 8, 8]);
        assert_eq!(chosen, 4);
        assert!(why.contains("P99 2.5 ms at 8 clients"), "{why}");
        // Fewer than 100 answers a step: the median.
        let (_, chosen, why) = ramp(64, 1, |c| {
            (c as f64 * 20.0, if c >= 4 { 120.0 } else { 45.0 })
        });
        assert_eq!(chosen, 2);
        assert!(why.contains("P50 108.0 ms at 4 clients"), "{why}");
    }

    #[test]
    fn one_noisy_step_does_not_end_the_ramp() {
        // The first measurement at 8 clients is slow (the machine was busy), the repeat is not.
        let (tried, chosen, _) = ramp_with(64, 1, |c, n| {
            let latency = if c == 8 && n == 0 { 150.0 } else { 45.0 };
            (c as f64 / 0.044, latency)
        });
        assert_eq!(tried, [1, 2, 4, 8, 8, 16, 32, 64]);
        assert_eq!(chosen, 64);
    }

    #[test]
    fn the_checked_phase_has_two_clients_per_server_at_least() {
        // A service that gives nothing more beyond one client: 2 servers need 4 clients for
        // requests of one server to overlap.
        let (tried, chosen, why) = ramp(64, 2, |c| (1_000.0, c as f64));
        assert_eq!(tried, [1, 2, 2]);
        assert_eq!(chosen, 4);
        assert!(why.contains("raised to 4"), "{why}");
        // …but never above the cap.
        let (_, chosen, _) = ramp(3, 4, |_| (1_000.0, 1.0));
        assert_eq!(chosen, 3);
    }

    #[test]
    fn errors_stop_the_ramp_at_the_step_before() {
        let mut r = Ramp::new(spec(64), 1);
        assert_eq!(r.next(step(1, 100.0, 1.0)), Next::Step(2));
        assert_eq!(r.next(step(2, 200.0, 1.0)), Next::Step(4));
        let mut failing = step(4, 400.0, 1.0);
        failing.errors = failing.requests / 10;
        assert_eq!(r.next(failing.clone()), Next::Step(4), "measured again");
        match r.next(failing) {
            Next::Done { clients, reason } => {
                assert_eq!(clients, 2);
                assert!(reason.contains("were errors"), "{reason}");
            }
            other => panic!("expected the end, got {other:?}"),
        }
    }

    #[test]
    fn bad_specs_are_refused_naming_the_flag() {
        assert!(spec(64).validate().is_ok());
        assert!(spec(0).validate().unwrap_err().contains("--ramp-max"));
        let short = RampSpec {
            max: 8,
            step: Duration::from_millis(50),
        };
        assert!(short.validate().unwrap_err().contains("--ramp-step-ms"));
    }
}
