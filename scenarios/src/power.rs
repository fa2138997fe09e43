//! What a short, gentle run of process mode hides, and the checks that look for it (issue 48):
//! capacity lost after an overload ([`crate::overload`]), isolation anomalies that need
//! contention ([`crate::contention`]), and values silently skipped where the contract promises
//! none (`ids.gaps`, here). Each is a check of `scenario ids` (or of the deployments) and a row
//! of `scenario flaws --process` with a weakness planted in `sut-server` that the run's own
//! checks miss.

use reports::model::{InvariantResult, Judgement};

/// `ids.gaps`
pub const GAPS: &str = "ids.gaps";

/// `ids.gaps`: at most `gaps_max` values never handed out between the smallest and the largest
/// ID of a run whose contract promises that bound (a segment service within one incarnation,
/// no restart, no fault: none at all with one server). The first hole is named.
#[must_use]
pub fn gaps_check(ids: &[i64], gaps_max: u64) -> InvariantResult {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut missing: u64 = 0;
    let mut first = None;
    for pair in sorted.windows(2) {
        let hole = pair[1].abs_diff(pair[0]).saturating_sub(1);
        if hole > 0 {
            missing = missing.saturating_add(hole);
            first.get_or_insert((pair[0], pair[1], hole));
        }
    }
    let range = match (sorted.first(), sorted.last()) {
        (Some(lo), Some(hi)) => format!("{} distinct IDs from {lo} to {hi}", sorted.len()),
        _ => "no ID".to_owned(),
    };
    let held = missing <= gaps_max;
    InvariantResult {
        name: GAPS.into(),
        verdict: if held {
            Judgement::Held
        } else {
            Judgement::Violated
        },
        seed: None,
        first_offending_event: (!held).then(|| {
            let (lo, hi, hole) = first.unwrap_or_default();
            format!(
                "{missing} IDs never handed out where at most {gaps_max} may be; the first \
                 hole: {hole} missing between {lo} and {hi}"
            )
        }),
        detail: Some(format!(
            "{range}: {missing} never handed out (at most {gaps_max})"
        )),
    }
}

/// A server started again, on its own, for a check that needs it after the run (the run's
/// own servers are gone by then): its `--server-cmd` with `{data}` a fresh directory and
/// `{server}` 1, listening on `url`'s port. Dropping it kills the server and removes the
/// directory.
#[derive(Debug)]
pub struct Fresh {
    /// The server.
    pub service: chaos::CommandService,
    _data: tempfile::TempDir,
}

impl Fresh {
    /// Starts `command` and waits until `url`'s port accepts connections.
    ///
    /// # Errors
    /// The URL names no port, or the server did not start (its log's end in the message).
    pub fn start(command: &str, url: &str) -> Result<Self, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("--url {url}: {e}"))?;
        let port = parsed
            .port_or_known_default()
            .ok_or_else(|| format!("--url {url}: no port"))?;
        let data = tempfile::Builder::new()
            .prefix("bench-fresh-")
            .tempdir()
            .map_err(|e| format!("a data directory: {e}"))?;
        let command = command
            .replace("{data}", &data.path().display().to_string())
            .replace("{server}", "1");
        let service = chaos::CommandService::start(chaos::CommandSpec {
            name: "server-1 (fresh)".into(),
            command,
            port,
            env: Vec::new(),
            log: data.path().join("server.log"),
            netns: None,
        })
        .map_err(|e| format!("starting the server again for the check: {e}"))?;
        Ok(Self {
            service,
            _data: data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_fire_on_a_skipped_value_and_not_on_a_dense_run() {
        // Answers arrive out of order across clients: order does not matter, holes do.
        let dense = gaps_check(&[3, 1, 2, 5, 4, 6], 0);
        assert_eq!(dense.verdict, Judgement::Held, "{dense:?}");
        // One value skipped at each refill of a block of 10.
        let ids: Vec<i64> = (1..=40).filter(|v| v % 10 != 1 || *v == 1).collect();
        let skipped = gaps_check(&ids, 0);
        assert_eq!(skipped.verdict, Judgement::Violated);
        let first = skipped.first_offending_event.unwrap();
        assert!(
            first.starts_with("3 IDs never handed out")
                && first.contains("1 missing between 10 and 12"),
            "{first}"
        );
        // Within the documented bound it holds.
        assert_eq!(gaps_check(&ids, 3).verdict, Judgement::Held);
        assert_eq!(gaps_check(&[], 0).verdict, Judgement::Held);
    }
}
