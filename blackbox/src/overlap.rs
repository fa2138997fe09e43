//! How far a black-box run could have raced, measured from its own history.
//!
//! A race between two requests of one key (two servers refreshing one segment, two consumes of
//! one token) can only show when both are in flight at once. A run whose requests never
//! overlapped, because it had one client, or a rate so low that each answer came before the next
//! request left, says nothing about such races, however many requests it made: its pass is
//! inconclusive for them, and [`measure`] says so.
//!
//! Each request is a [`Span`]: from the moment it left the client to the moment its answer came
//! (or the client gave up on it), with the key it asked about and the server it went to.
//! [`measure`] sweeps the spans in time order and finds the most in flight at once, over the
//! run, per key and per server, the time with two or more in flight, and the longest request.

use reports::model::{Concurrency, InvariantResult, Judgement, LaneConcurrency};

/// One request's interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The key it asked about (an ID run's one key is 0; a token's number).
    pub key: u64,
    /// The server it went to (index of its URL).
    pub server: usize,
    /// When it left, ns since the run began.
    pub invoke_ns: u64,
    /// When its answer came (or the client gave up), ns since the run began.
    pub complete_ns: u64,
}

/// The check's name in a run's list of checks.
pub const CHECK: &str = "races.overlapped";

/// The most intervals of `spans` in flight at once (an interval that ends when another begins
/// does not overlap it), and how long two or more were, ns.
fn sweep<'a>(spans: impl Iterator<Item = &'a Span>) -> (u64, u64) {
    // (time, +1 begins / -1 ends); ends sort before begins at the same instant.
    let mut edges: Vec<(u64, i8)> = Vec::new();
    for s in spans {
        edges.push((s.invoke_ns, 1));
        edges.push((s.complete_ns.max(s.invoke_ns), -1));
    }
    edges.sort_unstable();
    let (mut now, mut max, mut overlapped, mut since) = (0_i64, 0_i64, 0_u64, 0_u64);
    for (t, delta) in edges {
        if now >= 2 {
            overlapped += t - since;
        }
        since = t;
        now += i64::from(delta);
        max = max.max(now);
    }
    (u64::try_from(max).unwrap_or(0), overlapped)
}

/// The run's concurrency (see the module docs). `servers` names the servers, in URL order;
/// `key_word` names a key in the inconclusive note (`key \`orders\``, `one token`).
#[must_use]
pub fn measure(spans: &[Span], servers: &[String], key_word: &str) -> Concurrency {
    let (max_in_flight, overlapped_ns) = sweep(spans.iter());
    let mut keys: std::collections::BTreeMap<u64, Vec<&Span>> = Default::default();
    for s in spans {
        keys.entry(s.key).or_default().push(s);
    }
    let per_key: Vec<u64> = keys
        .values()
        .map(|spans| sweep(spans.iter().copied()).0)
        .collect();
    let lanes = servers
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mine: Vec<&Span> = spans.iter().filter(|s| s.server == i).collect();
            LaneConcurrency {
                name: name.clone(),
                requests: mine.len() as u64,
                max_in_flight: sweep(mine.into_iter()).0,
            }
        })
        .collect();
    let first = spans.iter().map(|s| s.invoke_ns).min().unwrap_or(0);
    let last = spans.iter().map(|s| s.complete_ns).max().unwrap_or(0);
    let longest = spans
        .iter()
        .map(|s| s.complete_ns.saturating_sub(s.invoke_ns))
        .max()
        .unwrap_or(0);
    let max_per_key = per_key.iter().copied().max().unwrap_or(0);
    let inconclusive = (max_per_key < 2).then(|| {
        if spans.is_empty() {
            "no request was made".to_owned()
        } else {
            format!(
                "no two requests of {key_word} were ever in flight at once (at most \
                 {max_per_key} of {} requests; longest {:.1} ms): a race between requests \
                 could not have shown",
                spans.len(),
                longest as f64 / 1e6
            )
        }
    });
    Concurrency {
        requests: spans.len() as u64,
        max_in_flight,
        max_in_flight_per_key: max_per_key,
        keys_overlapped: per_key.iter().filter(|&&m| m >= 2).count() as u64,
        keys: per_key.len() as u64,
        servers: lanes,
        overlapped_us: overlapped_ns / 1_000,
        span_us: last.saturating_sub(first) / 1_000,
        longest_request_us: longest / 1_000,
        inconclusive,
    }
}

/// The judgement as a check: held when requests of one key overlapped, not checked (the pass
/// is inconclusive for races) when none did. Never violated: it judges the run, not the service.
#[must_use]
pub fn check(c: &Concurrency) -> InvariantResult {
    let per_server = c
        .servers
        .iter()
        .map(|s| format!("{} {}", s.name, s.max_in_flight))
        .collect::<Vec<_>>()
        .join(", ");
    match &c.inconclusive {
        Some(why) => InvariantResult {
            name: CHECK.to_owned(),
            verdict: Judgement::NotChecked,
            seed: None,
            first_offending_event: None,
            detail: Some(format!("inconclusive for races: {why}")),
        },
        None => InvariantResult {
            detail: Some(format!(
                "at most {} of one key in flight at once{}; per server: {per_server}; 2+ in \
                 flight {:.0}% of the time; longest request {:.1} ms",
                requests(c.max_in_flight_per_key),
                if c.keys > 1 {
                    format!(" ({} of {} keys overlapped)", c.keys_overlapped, c.keys)
                } else {
                    String::new()
                },
                share(c) * 100.0,
                c.longest_request_us as f64 / 1e3
            )),
            ..InvariantResult::held(CHECK)
        },
    }
}

/// The share of the run's time with two or more requests in flight (0 to 1).
#[must_use]
pub fn share(c: &Concurrency) -> f64 {
    if c.span_us == 0 {
        0.0
    } else {
        (c.overlapped_us as f64 / c.span_us as f64).min(1.0)
    }
}

/// The printed line: `concurrency: …`.
#[must_use]
pub fn line(c: &Concurrency) -> String {
    let per_server = if c.servers.len() > 1 {
        format!(
            " (per server: {})",
            c.servers
                .iter()
                .map(|s| s.max_in_flight.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        String::new()
    };
    let keys = if c.keys > 1 {
        format!(
            "; {} of {} keys had 2+ requests in flight at once (at most {})",
            c.keys_overlapped, c.keys, c.max_in_flight_per_key
        )
    } else {
        String::new()
    };
    format!(
        "  concurrency: at most {} in flight at once{per_server}{keys}; 2+ in flight {:.0}% of \
         the time; longest request {:.1} ms",
        requests(c.max_in_flight),
        share(c) * 100.0,
        c.longest_request_us as f64 / 1e3
    )
}

/// `1 request`, `4 requests`.
fn requests(n: u64) -> String {
    if n == 1 {
        "1 request".to_owned()
    } else {
        format!("{n} requests")
    }
}

/// What a pass prints before the verdict line: `every check held`, or with `but inconclusive for
/// races: …` (the verdict line then reads `PASS (inconclusive for races: …)`).
#[must_use]
pub fn pass_line(c: Option<&Concurrency>) -> String {
    match c.and_then(|c| c.inconclusive.as_deref()) {
        Some(why) => format!("every check held, but inconclusive for races: {why}"),
        None => "every check held".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(key: u64, server: usize, from_ms: u64, to_ms: u64) -> Span {
        Span {
            key,
            server,
            invoke_ns: from_ms * 1_000_000,
            complete_ns: to_ms * 1_000_000,
        }
    }

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("server {i}")).collect()
    }

    #[test]
    fn requests_one_after_another_are_inconclusive_for_races() {
        // One client, 44 ms a request: each answer comes before the next request leaves (the
        // end of one and the start of the next at the same instant do not overlap).
        let spans: Vec<Span> = (0..20).map(|i| span(0, 0, i * 44, i * 44 + 44)).collect();
        let c = measure(&spans, &names(1), "the key");
        assert_eq!(c.max_in_flight, 1);
        assert_eq!(c.max_in_flight_per_key, 1);
        assert_eq!(c.keys_overlapped, 0);
        assert_eq!(c.overlapped_us, 0);
        assert_eq!(c.longest_request_us, 44_000);
        let why = c.inconclusive.as_deref().expect("nothing overlapped");
        assert!(why.contains("at most 1 of 20 requests"), "{why}");
        let judged = check(&c);
        assert_eq!(judged.verdict, Judgement::NotChecked);
        assert!(pass_line(Some(&c)).starts_with("every check held, but inconclusive for races:"));
    }

    #[test]
    fn overlapping_requests_of_the_key_make_a_pass_conclusive() {
        // Two clients, offset by half a request.
        let mut spans: Vec<Span> = (0..10).map(|i| span(0, 0, i * 40, i * 40 + 40)).collect();
        spans.extend((0..10).map(|i| span(0, 1, i * 40 + 20, i * 40 + 60)));
        let c = measure(&spans, &names(2), "the key");
        assert_eq!(c.max_in_flight, 2);
        assert_eq!(c.max_in_flight_per_key, 2);
        assert_eq!(c.inconclusive, None);
        // Each server saw its own requests one at a time.
        assert_eq!(c.servers[0].max_in_flight, 1);
        assert_eq!(c.servers[1].max_in_flight, 1);
        assert_eq!(c.servers[0].requests, 10);
        // Two in flight from 20 ms to 400 ms of 0..420 ms.
        assert_eq!(c.overlapped_us, 380_000);
        assert_eq!(c.span_us, 420_000);
        assert_eq!(check(&c).verdict, Judgement::Held);
        assert_eq!(pass_line(Some(&c)), "every check held");
    }

    #[test]
    fn the_most_in_flight_is_counted_per_key() {
        // Two tokens' consumes overlap each other, but each token's own never do: no race on
        // one token was tried.
        let spans = [span(1, 0, 0, 10), span(2, 0, 5, 15), span(1, 0, 20, 30)];
        let c = measure(&spans, &names(1), "one token");
        assert_eq!(c.max_in_flight, 2);
        assert_eq!(c.max_in_flight_per_key, 1);
        assert_eq!(c.keys, 2);
        assert!(
            c.inconclusive
                .as_deref()
                .is_some_and(|w| w.contains("one token"))
        );
        // One token's two consumes at once: conclusive.
        let spans = [span(1, 0, 0, 10), span(1, 1, 2, 8), span(2, 0, 20, 30)];
        let c = measure(&spans, &names(2), "one token");
        assert_eq!(c.max_in_flight_per_key, 2);
        assert_eq!((c.keys_overlapped, c.keys), (1, 2));
        assert_eq!(c.inconclusive, None);
    }

    #[test]
    fn many_in_flight_are_counted_and_no_request_is_inconclusive() {
        let spans: Vec<Span> = (0..64).map(|i| span(0, 0, i, 1_000 + i)).collect();
        let c = measure(&spans, &names(1), "the key");
        assert_eq!(c.max_in_flight, 64);
        assert_eq!(c.servers[0].max_in_flight, 64);
        let empty = measure(&[], &names(1), "the key");
        assert_eq!(empty.inconclusive.as_deref(), Some("no request was made"));
    }
}
