//! `scenario tokens`: test your own one-time-token service, black box (docs/own-service.md).
//!
//! The service implements the HTTP contract of docs/own-service.md (`POST /tokens` for a
//! user's JWT, `POST /tokens/once` to issue a one-time token, `POST /tokens/once/consume`;
//! this project's `sut-server` implements it). For each of many fresh (user, activity) pairs
//! the tester issues one token, then several clients consume it at once, spread over every
//! URL (instances of one service on one database); after all of them answered, it consumes it
//! once more. With `--server-cmd` it owns the servers and kill -9s and restarts them between
//! rounds. Checks:
//!
//! - `tokens.once`: no token is accepted twice (answers whose outcome is unknown, a timeout or
//!   a broken connection, are never counted either way);
//! - `tokens.once_accepted`: a token every one of whose consumes was answered was accepted
//!   exactly once (refused by all as "already used" means a use nobody was told of);
//! - `tokens.stays_used`: a consume after the round (and after a restart) is refused as used;
//! - `tokens.unknown_refused`: a token never issued is refused.

use std::time::Duration;

use cluster::{CommandService, CommandSpec};

pub use crate::participant::ContractError;
use reports::model::{InvariantResult, Verdict};

/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What to test and how hard.
#[derive(Clone, Debug)]
pub struct TokensOptions {
    /// The service's base URLs (instances on one store); consumes are spread over them.
    pub urls: Vec<String>,
    /// The admin secret for `POST /tokens`.
    pub admin_token: Option<String>,
    /// Tokens to issue and race.
    pub tokens: u64,
    /// Consumes sent at once per token.
    pub consumers: u64,
    /// Commands that start the instances, one per URL (`{data}`: one fresh data directory
    /// shared by all, `{server}`: 1, 2, …).
    pub commands: Vec<String>,
    /// With commands: kill -9 and restart every instance after every this many tokens (0:
    /// never).
    pub kill_every: u64,
}

/// One consume's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumed {
    /// 200: accepted.
    Accepted,
    /// 409: already used.
    Used,
    /// Another refusal (404 unknown, 410 expired, 403 another user's).
    Refused(u16),
    /// No answer, or a 5xx: the outcome is unknown.
    Unknown,
}

impl Consumed {
    /// The class of an HTTP answer (`None`: no answer).
    #[must_use]
    pub fn of(status: Option<u16>) -> Self {
        match status {
            Some(200) => Self::Accepted,
            Some(409) => Self::Used,
            Some(s @ 400..500) => Self::Refused(s),
            _ => Self::Unknown,
        }
    }
}

/// One token's round: the answers of its racing consumes and of the one after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Round {
    /// The token's number.
    pub index: u64,
    /// The racing consumes' answers.
    pub racing: Vec<Consumed>,
    /// The consume after the round (after a restart when one came between).
    pub after: Consumed,
}

/// What a run did and found.
#[derive(Clone, Debug, Default)]
pub struct TokensRun {
    /// Every round.
    pub rounds: Vec<Round>,
    /// kill -9 and restarts of every instance.
    pub restarts: u64,
    /// The answer to a token never issued.
    pub unknown_token: Option<Consumed>,
}

impl TokensRun {
    /// Consumes answered 200, over all rounds.
    #[must_use]
    pub fn accepted(&self) -> u64 {
        self.rounds
            .iter()
            .flat_map(|r| &r.racing)
            .filter(|c| **c == Consumed::Accepted)
            .count() as u64
    }

    /// Tokens accepted more than once.
    #[must_use]
    pub fn accepted_twice(&self) -> u64 {
        self.rounds
            .iter()
            .filter(|r| {
                r.racing
                    .iter()
                    .filter(|c| **c == Consumed::Accepted)
                    .count()
                    > 1
            })
            .count() as u64
    }

    /// Consumes whose outcome is unknown.
    #[must_use]
    pub fn unknown(&self) -> u64 {
        self.rounds
            .iter()
            .flat_map(|r| r.racing.iter().chain([&r.after]))
            .filter(|c| **c == Consumed::Unknown)
            .count() as u64
    }

    /// The checks.
    #[must_use]
    pub fn checks(&self) -> Vec<InvariantResult> {
        let twice = self.rounds.iter().find(|r| {
            r.racing
                .iter()
                .filter(|c| **c == Consumed::Accepted)
                .count()
                > 1
        });
        let never = self.rounds.iter().find(|r| {
            !r.racing.contains(&Consumed::Unknown) && !r.racing.contains(&Consumed::Accepted)
        });
        let reused = self
            .rounds
            .iter()
            .find(|r| r.after != Consumed::Used && r.after != Consumed::Unknown);
        let unknown_ok = match self.unknown_token {
            Some(Consumed::Refused(_) | Consumed::Used) | None => None,
            Some(other) => Some(format!("a token never issued was answered {other:?}")),
        };
        vec![
            verdict(
                "tokens.once",
                twice.map(|r| {
                    format!(
                        "token #{} accepted {} times by {} consumes at once: {:?}",
                        r.index,
                        r.racing
                            .iter()
                            .filter(|c| **c == Consumed::Accepted)
                            .count(),
                        r.racing.len(),
                        r.racing
                    )
                }),
            ),
            verdict(
                "tokens.once_accepted",
                never.map(|r| {
                    format!(
                        "token #{}: every consume answered, none accepted: {:?}",
                        r.index, r.racing
                    )
                }),
            ),
            verdict(
                "tokens.stays_used",
                reused.map(|r| {
                    format!(
                        "token #{}: a consume after its round was answered {:?}",
                        r.index, r.after
                    )
                }),
            ),
            verdict("tokens.unknown_refused", unknown_ok),
        ]
    }

    /// True when every check held.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.checks().iter().all(|c| c.verdict != Verdict::Violated)
    }
}

fn verdict(name: &str, violation: Option<String>) -> InvariantResult {
    match violation {
        None => InvariantResult::held(name),
        Some(v) => InvariantResult {
            name: name.into(),
            verdict: Verdict::Violated,
            seed: None,
            first_offending_event: Some(v),
            detail: None,
        },
    }
}

/// The HTTP side.
struct Wire {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    bases: Vec<String>,
    admin: Option<String>,
}

impl Wire {
    fn client() -> Result<reqwest::Client, ContractError> {
        reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| ContractError::Usage(format!("HTTP client: {e}")))
    }

    /// POST `body` to `path` of instance `at`: the status and body, `None` without an answer
    /// (503 and 429 asked again).
    async fn post(
        &self,
        at: usize,
        path: &str,
        bearer: Option<&str>,
        body: &serde_json::Value,
    ) -> Option<(u16, String)> {
        let url = format!("{}{path}", self.bases[at % self.bases.len()]);
        let make = || {
            let request = self.http.post(&url).json(body);
            match bearer {
                Some(b) => request.bearer_auth(b),
                None => request,
            }
        };
        crate::participant::send_retrying_busy(make)
            .await
            .ok()
            .flatten()
    }

    /// Registers `activity` on every instance (a 404 is a service without a registry).
    fn register(&self, activity: u64) -> Result<(), ContractError> {
        let body = serde_json::json!({ "activity": activity, "price_minor": 1 });
        for at in 0..self.bases.len() {
            let answer =
                self.rt
                    .block_on(self.post(at, "/admin/activities", self.admin.as_deref(), &body));
            match answer {
                Some((status, _)) if (200..300).contains(&status) || status == 404 => {}
                Some((status, text)) => {
                    return Err(ContractError::Unreachable(format!(
                        "POST /admin/activities {body} answered {status}: {text:.300}"
                    )));
                }
                None => {
                    return Err(ContractError::Unreachable(format!(
                        "POST {}/admin/activities: no answer",
                        self.bases[at]
                    )));
                }
            }
        }
        Ok(())
    }

    /// A step that must succeed (issuing): the JSON answer's `field`.
    fn must(
        &self,
        at: usize,
        path: &str,
        bearer: Option<&str>,
        body: &serde_json::Value,
        field: &str,
    ) -> Result<String, ContractError> {
        let answer = self.rt.block_on(self.post(at, path, bearer, body));
        let Some((status, text)) = answer else {
            return Err(ContractError::Unreachable(format!(
                "POST {}{path}: no answer",
                self.bases[at % self.bases.len()]
            )));
        };
        if !(200..300).contains(&status) {
            return Err(ContractError::Unreachable(format!(
                "POST {path} {body} answered {status}: {text:.300}"
            )));
        }
        let doc: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ContractError::Unreachable(format!("POST {path}: {e} in {text:.300}")))?;
        doc.get(field)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                ContractError::Unreachable(format!(
                    "POST {path}: no string `{field}` in {text:.300}"
                ))
            })
    }
}

/// The instances, when the tester owns them.
struct Owned {
    services: Vec<CommandService>,
    _dir: tempfile::TempDir,
}

fn start(opts: &TokensOptions) -> Result<Option<Owned>, ContractError> {
    if opts.commands.is_empty() {
        return Ok(None);
    }
    if opts.commands.len() != opts.urls.len() {
        return Err(ContractError::Usage(format!(
            "{} --server-cmd for {} --url: give one per URL, in the same order",
            opts.commands.len(),
            opts.urls.len()
        )));
    }
    let dir = tempfile::Builder::new()
        .prefix("bench-tokens-")
        .tempdir()
        .map_err(|e| ContractError::Usage(format!("cannot make a folder: {e}")))?;
    let data = dir.path().join("data");
    std::fs::create_dir(&data)
        .map_err(|e| ContractError::Usage(format!("cannot make {}: {e}", data.display())))?;
    let mut services = Vec::new();
    for (i, (command, url)) in opts.commands.iter().zip(&opts.urls).enumerate() {
        let port = crate::blackbox::socket_addr(url)
            .map_err(|e| ContractError::Usage(e.to_string()))?
            .port();
        services.push(CommandService::start(CommandSpec {
            name: format!("server-{}", i + 1),
            command: command
                .replace("{data}", &data.display().to_string())
                .replace("{server}", &(i + 1).to_string()),
            port,
            env: Vec::new(),
            log: dir.path().join(format!("server-{}.log", i + 1)),
        })?);
    }
    Ok(Some(Owned {
        services,
        _dir: dir,
    }))
}

/// Runs the rounds.
///
/// # Errors
/// The service could not be started or reached, or an issue step failed (not a verdict).
pub fn run(opts: &TokensOptions) -> Result<TokensRun, ContractError> {
    if opts.urls.is_empty() || opts.tokens == 0 || opts.consumers == 0 {
        return Err(ContractError::Usage(
            "give a --url, and --tokens and --consumers of at least 1".into(),
        ));
    }
    if opts.tokens > crate::participant::RUN_NUMBERS || opts.consumers > 256 {
        return Err(ContractError::Usage(format!(
            "--tokens {} --consumers {}: at most {} tokens and 256 consumers",
            opts.tokens,
            opts.consumers,
            crate::participant::RUN_NUMBERS
        )));
    }
    if opts.kill_every > 0 && opts.commands.is_empty() {
        return Err(ContractError::Usage(
            "--kill-every needs --server-cmd (the tester must own the servers)".into(),
        ));
    }
    let mut owned = start(opts)?;
    let mut wire = Wire {
        rt: crate::real::runtime().map_err(|e| ContractError::Usage(e.to_string()))?,
        http: Wire::client()?,
        bases: opts
            .urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_owned())
            .collect(),
        admin: opts.admin_token.clone(),
    };
    let base = crate::participant::fresh_base();
    // One activity for the run (every user is fresh, so every key is too), registered where
    // the service keeps an operator's registry (`POST /admin/activities`; a service without one
    // answers 404 and issues for any activity).
    let activity = base;
    wire.register(activity)?;
    let mut out = TokensRun::default();
    for index in 0..opts.tokens {
        let user = base + index;
        let at = index as usize;
        let jwt = wire.must(
            at,
            "/tokens",
            wire.admin.as_deref(),
            &serde_json::json!({ "user": user }),
            "token",
        )?;
        let once = wire.must(
            at,
            "/tokens/once",
            Some(&jwt),
            &serde_json::json!({ "user": user, "activity": activity.to_string() }),
            "token",
        )?;
        let body = serde_json::json!({ "user": user, "token": once });
        let racing = wire.rt.block_on(async {
            let asks = (0..opts.consumers as usize).map(|k| {
                let (wire, body, jwt) = (&wire, &body, &jwt);
                async move {
                    let answer = wire
                        .post(at + k, "/tokens/once/consume", Some(jwt), body)
                        .await;
                    Consumed::of(answer.map(|(s, _)| s))
                }
            });
            futures::future::join_all(asks).await
        });
        let restart = opts.kill_every > 0 && (index + 1) % opts.kill_every == 0;
        if restart && let Some(o) = owned.as_mut() {
            for s in &mut o.services {
                s.kill9()?;
                s.restart()?;
            }
            wire.http = Wire::client()?;
            out.restarts += 1;
        }
        let after = wire
            .rt
            .block_on(wire.post(at + 1, "/tokens/once/consume", Some(&jwt), &body));
        out.rounds.push(Round {
            index,
            racing,
            after: Consumed::of(after.map(|(s, _)| s)),
        });
        if index + 1 == opts.tokens {
            let never =
                serde_json::json!({ "user": user, "token": "0123456789abcdef0123456789abcdef" });
            let answer =
                wire.rt
                    .block_on(wire.post(at, "/tokens/once/consume", Some(&jwt), &never));
            out.unknown_token = Some(Consumed::of(answer.map(|(s, _)| s)));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(racing: &[Consumed], after: Consumed) -> Round {
        Round {
            index: 0,
            racing: racing.to_vec(),
            after,
        }
    }

    fn violated(run: &TokensRun) -> Vec<String> {
        run.checks()
            .into_iter()
            .filter(|c| c.verdict == Verdict::Violated)
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn one_acceptance_and_the_rest_used_holds() {
        use Consumed::{Accepted, Unknown, Used};
        let run = TokensRun {
            rounds: vec![
                round(&[Used, Accepted, Used], Used),
                // An unknown outcome may have been the acceptance.
                round(&[Used, Unknown, Used], Used),
            ],
            restarts: 0,
            unknown_token: Some(Consumed::Refused(404)),
        };
        assert!(run.passed(), "{:?}", run.checks());
    }

    #[test]
    fn each_check_fires_on_its_bad_history() {
        use Consumed::{Accepted, Used};
        let bad = |rounds: Vec<Round>, unknown: Consumed| TokensRun {
            rounds,
            restarts: 0,
            unknown_token: Some(unknown),
        };
        let ok = Consumed::Refused(404);
        assert_eq!(
            violated(&bad(vec![round(&[Accepted, Accepted], Used)], ok)),
            ["tokens.once"]
        );
        assert_eq!(
            violated(&bad(vec![round(&[Used, Used], Used)], ok)),
            ["tokens.once_accepted"]
        );
        assert_eq!(
            violated(&bad(vec![round(&[Accepted, Used], Accepted)], ok)),
            ["tokens.stays_used"]
        );
        assert_eq!(
            violated(&bad(vec![round(&[Accepted, Used], Used)], Accepted)),
            ["tokens.unknown_refused"]
        );
    }

    #[test]
    fn answers_are_classed_by_status() {
        assert_eq!(Consumed::of(Some(200)), Consumed::Accepted);
        assert_eq!(Consumed::of(Some(409)), Consumed::Used);
        assert_eq!(Consumed::of(Some(404)), Consumed::Refused(404));
        assert_eq!(Consumed::of(Some(500)), Consumed::Unknown);
        assert_eq!(Consumed::of(None), Consumed::Unknown);
    }
}
