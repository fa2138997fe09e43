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
//! - `tokens.unknown_refused`: a token never issued is refused;
//! - `tokens.unknown_settled`: a token one of whose consumes had an unknown outcome (a timeout,
//!   a broken connection, a 5xx) is asked for once more when every round and fault is over,
//!   and that answer settles it: "used", or accepted if no consume had been accepted before.
//!
//! And what a hostile client tries:
//!
//! - `tokens.owner_only`: before each round the previous round's user presents this round's
//!   token as its own (with its own JWT): it must be refused (and, as every refusal, change
//!   nothing: the round's owner still gets it accepted once);
//! - `tokens.unguessable`: no issued token is a neighbour of another (its trailing decimal or
//!   hex digits one up or down: values from a counter), and after the rounds the last user
//!   presents the neighbours of its own token: none is accepted, and each is answered as a
//!   token never issued is (a 403 "another user's" where a never-issued value gets 404 tells
//!   an attacker which values exist);
//! - `tokens.quota` (`exhaust` > 0): one fresh user asks for `exhaust` tokens, one per
//!   activity, as fast as it can: the service must refuse it before the last, still issue to
//!   another user after that refusal, and give the same (user, activity) one live token only;
//! - with `slow`: `service.slow_clients` and `service.stalled_closed` ([`crate::slow`]),
//!   measuring the consume of a token never issued;
//! - with `bodies`: `service.refused_from_head` and `service.unauthenticated_memory`
//!   ([`crate::bodies`]), posting to `POST /tokens/once` (which takes a user's JWT) with none.

use std::time::Duration;

use std::collections::BTreeSet;
use std::time::Instant;

use chaos::{CommandService, CommandSpec};

pub use crate::tcc::ContractError;
use reports::model::{InvariantResult, Judgement};

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
    /// The instances' database, started by the tester before them (`{db_url}` in `commands`).
    pub db: Option<crate::db::DbOptions>,
    /// With `db`: at each `kill_every` point this fault of the database (killed, or its power
    /// cut, then restarted) instead of the instances' restart; a token consumed before it must
    /// stay used.
    pub db_fault: Option<crate::db::DbFault>,
    /// One-time tokens one user asks for, one per activity, as fast as it can (`tokens.quota`;
    /// 0: not checked).
    pub exhaust: u64,
    /// The slow-clients check after the rounds, against the first URL.
    pub slow: Option<crate::slow::SlowSpec>,
    /// The unauthenticated-bodies check after the rounds, against the first URL.
    pub bodies: Option<crate::bodies::BodiesSpec>,
}

/// The route the unauthenticated-bodies check posts to: it takes a user's JWT.
pub const BODIES_PATH: &str = "/tokens/once";

/// At most this many tokens one user asks for (`exhaust`).
pub const EXHAUST_MAX: u64 = 10_000;
/// The value presented as a token never issued.
pub const NEVER_ISSUED: &str = "0123456789abcdef0123456789abcdef";

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
    /// Its value, as issued.
    pub token: String,
    /// The answer when another user presented it as its own, before the round (`None`: the
    /// first round, which has no other user yet).
    pub stolen: Option<Consumed>,
    /// The racing consumes' answers.
    pub racing: Vec<Consumed>,
    /// The consume after the round (after a restart when one came between).
    pub after: Consumed,
    /// For a round with an answer whose outcome was unknown: one more consume once every round
    /// and every fault is over, which must settle it (`tokens.unknown_settled`).
    pub settled: Option<Consumed>,
}

impl Round {
    /// Whether an answer of the round had an unknown outcome.
    #[must_use]
    pub fn unknown(&self) -> bool {
        self.racing.contains(&Consumed::Unknown) || self.after == Consumed::Unknown
    }
}

/// What a run did and found.
#[derive(Clone, Debug, Default)]
pub struct TokensRun {
    /// Every round.
    pub rounds: Vec<Round>,
    /// kill -9 and restarts of every instance (or database faults, with `db_fault`).
    pub restarts: u64,
    /// Database faults made, and those seen in place (the database's port refused).
    pub db_faults: (u32, u32),
    /// The answer to a token never issued.
    pub unknown_token: Option<Consumed>,
    /// The neighbours of the last round's token, each presented by its owner, and the answers.
    pub neighbours: Vec<(String, Consumed)>,
    /// What one user got when it asked for many tokens.
    pub exhaustion: Option<Exhaustion>,
    /// What the slow-clients check measured, and its two checks.
    pub slow: Option<(crate::slow::SlowRun, Vec<InvariantResult>)>,
    /// What the unauthenticated-bodies check saw.
    pub bodies: Option<crate::bodies::BodiesRun>,
    /// Each racing consume's interval (its token's number as the key, its instance as the
    /// server), for [`TokensRun::concurrency`].
    pub spans: Vec<crate::overlap::Span>,
    /// Instances (URLs).
    pub instances: usize,
}

/// One user asking for one token per activity as fast as it can (`tokens.quota`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Exhaustion {
    /// Tokens asked for.
    pub asked: u64,
    /// Issued before the first refusal (all of them when none came).
    pub issued: u64,
    /// The first refusal: the ask's number (from 1) and its status (`None`: no answer).
    pub refused: Option<(u64, Option<u16>)>,
    /// How long the asks took, ms.
    pub elapsed_ms: u64,
    /// Another user's ask after them: its status (`None`: no answer, or busy throughout).
    pub other_user: Option<u16>,
    /// The first (user, activity) asked again: whether the answer named the same token
    /// (`None`: refused or unanswered, which is allowed).
    pub same_token_again: Option<bool>,
}

/// Values next to `token`: its trailing run of decimal digits, and of hex digits, one up and
/// one down (width and case kept, never wrapping), without `token` itself.
#[must_use]
pub fn neighbours(token: &str) -> Vec<String> {
    let mut out = BTreeSet::new();
    for (radix, width_max) in [(10u32, 38usize), (16, 32)] {
        let run = token
            .chars()
            .rev()
            .take_while(|c| c.is_digit(radix))
            .take(width_max)
            .count();
        if run == 0 {
            continue;
        }
        let (head, digits) = token.split_at(token.len() - run);
        let Ok(value) = u128::from_str_radix(digits, radix) else {
            continue;
        };
        let upper = digits.chars().any(|c| c.is_ascii_uppercase());
        for next in [value.checked_add(1), value.checked_sub(1)]
            .into_iter()
            .flatten()
        {
            let text = if radix == 10 {
                format!("{next:0run$}")
            } else if upper {
                format!("{next:0run$X}")
            } else {
                format!("{next:0run$x}")
            };
            if text.len() == run {
                out.insert(format!("{head}{text}"));
            }
        }
    }
    out.remove(token);
    out.into_iter().collect()
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

    /// How far the racing consumes of one token overlapped ([`crate::overlap`]): with one
    /// consumer, or a service that answers the first before the next leaves, no race on a
    /// token was tried.
    #[must_use]
    pub fn concurrency(&self) -> reports::model::Concurrency {
        let names: Vec<String> = (1..=self.instances)
            .map(|i| format!("instance {i}"))
            .collect();
        crate::overlap::measure(&self.spans, &names, "one token")
    }

    /// The checks, `races.overlapped` last.
    #[must_use]
    pub fn checks(&self) -> Vec<InvariantResult> {
        // `tokens.once` is `tokens.single_use` over the racing consumes' acceptances.
        let mut accepted = sut::check::AtMostOnce::new();
        for (round, r) in self.rounds.iter().enumerate() {
            for _ in r.racing.iter().filter(|c| **c == Consumed::Accepted) {
                let _ = accepted.observe(r.token.as_str(), round);
            }
        }
        let twice = accepted
            .first_repeat()
            .map(|(_, &round, _)| &self.rounds[round]);
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
        let mut checks = vec![
            verdict(
                "tokens.once",
                twice.map(|r| {
                    format!(
                        "token {} accepted {} times by {} consumes at once: {:?}",
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
                        "token {}: every consume answered, none accepted: {:?}",
                        r.index, r.racing
                    )
                }),
            ),
            verdict(
                "tokens.stays_used",
                reused.map(|r| {
                    format!(
                        "token {}: a consume after its round was answered {:?}",
                        r.index, r.after
                    )
                }),
            ),
            verdict("tokens.unknown_refused", unknown_ok),
            verdict("tokens.unknown_settled", self.unsettled()),
            verdict("tokens.owner_only", self.stolen_accepted()),
            verdict("tokens.unguessable", self.guessable()),
        ];
        if let Some(e) = &self.exhaustion {
            checks.push(verdict("tokens.quota", e.violation()));
        }
        let (made, seen) = self.db_faults;
        if made > 0 {
            checks.push(crate::db::took_effect(made, seen));
        }
        checks.extend(self.slow.iter().flat_map(|(_, c)| c.iter().cloned()));
        checks.extend(
            self.bodies
                .iter()
                .flat_map(crate::bodies::BodiesRun::checks),
        );
        checks.push(crate::overlap::check(&self.concurrency()));
        checks
    }

    /// The first round whose unknown outcome did not settle: the consume after every fault was
    /// over came back unknown again, was refused for another reason than "used", or accepted a
    /// token that an earlier consume already had accepted.
    fn unsettled(&self) -> Option<String> {
        self.rounds.iter().find_map(|r| {
            let settled = r.settled?;
            let accepted_before =
                r.racing.contains(&Consumed::Accepted) || r.after == Consumed::Accepted;
            let fine = match settled {
                Consumed::Used => true,
                Consumed::Accepted => !accepted_before,
                Consumed::Refused(_) | Consumed::Unknown => false,
            };
            (!fine).then(|| {
                format!(
                    "token {}: an answer of unknown outcome ({:?}, then {:?}) was not settled \
                     once every fault was over: a consume then was answered {settled:?}",
                    r.index, r.racing, r.after
                )
            })
        })
    }

    /// A round whose token another user got accepted as its own.
    fn stolen_accepted(&self) -> Option<String> {
        self.rounds
            .iter()
            .find(|r| r.stolen == Some(Consumed::Accepted))
            .map(|r| {
                format!(
                    "token {} was accepted when the previous round's user presented it as its \
                     own: a token is not checked against its owner",
                    r.index
                )
            })
    }

    /// Issued values that are neighbours, or a neighbour probe accepted or answered otherwise
    /// than a value never issued.
    fn guessable(&self) -> Option<String> {
        let issued: std::collections::BTreeMap<&str, u64> = self
            .rounds
            .iter()
            .map(|r| (r.token.as_str(), r.index))
            .collect();
        for r in &self.rounds {
            if let Some((value, other)) = neighbours(&r.token)
                .into_iter()
                .find_map(|n| issued.get(n.as_str()).map(|i| (n.clone(), *i)))
            {
                return Some(format!(
                    "token {other} ({value}) is a neighbour of token {} ({}): values come \
                     from a counter, and anyone holding one can name the others",
                    r.index, r.token
                ));
            }
        }
        if let Some((value, _)) = self
            .neighbours
            .iter()
            .find(|(_, c)| *c == Consumed::Accepted)
        {
            return Some(format!(
                "{value}, a neighbour of an issued token that was never issued to its \
                 presenter, was accepted"
            ));
        }
        let never = self.unknown_token?;
        self.neighbours
            .iter()
            .find(|(_, c)| *c != never && *c != Consumed::Unknown)
            .map(|(value, c)| {
                format!(
                    "{value}, a neighbour of an issued token, was answered {c:?} where a value \
                     never issued is answered {never:?}: the answer tells which values exist"
                )
            })
    }

    /// True when every check held.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.checks()
            .iter()
            .all(|c| c.verdict != Judgement::Violated)
    }
}

impl Exhaustion {
    /// What breaks the quota: every ask issued, two live tokens for one key, or another user
    /// refused after one user's asks.
    fn violation(&self) -> Option<String> {
        if self.refused.is_none() && self.asked > 0 {
            return Some(format!(
                "one user was issued {} one-time tokens, one per activity, in {} ms without a \
                 refusal: one client can fill the table for everyone",
                self.issued, self.elapsed_ms
            ));
        }
        if self.same_token_again == Some(false) {
            return Some(
                "the same user and activity asked twice got two different live tokens (one \
                 per user, activity and window expected)"
                    .to_owned(),
            );
        }
        match self.other_user {
            Some(status) if !(200..300).contains(&status) => Some(format!(
                "after one user's {} asks, another user's ask was answered {status}: one client \
                 denied the service to others",
                self.issued + 1
            )),
            _ => None,
        }
    }

    /// The figures in one phrase.
    #[must_use]
    pub fn summary(&self) -> String {
        match self.refused {
            Some((k, status)) => format!(
                "one user refused at ask {k} of {} ({}) after {} issued in {} ms",
                self.asked,
                status.map_or_else(|| "no answer".to_owned(), |s| s.to_string()),
                self.issued,
                self.elapsed_ms
            ),
            None => format!(
                "one user issued all {} asked in {} ms",
                self.asked, self.elapsed_ms
            ),
        }
    }
}

fn verdict(name: &str, violation: Option<String>) -> InvariantResult {
    match violation {
        None => InvariantResult::held(name),
        Some(v) => InvariantResult {
            name: name.into(),
            verdict: Judgement::Violated,
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

    /// The POST of `body` to `path` of instance `at`, with `bearer`.
    fn request(
        &self,
        at: usize,
        path: &str,
        bearer: Option<&str>,
        body: &serde_json::Value,
    ) -> reqwest::RequestBuilder {
        let url = format!("{}{path}", self.bases[at % self.bases.len()]);
        let request = self.http.post(url).json(body);
        match bearer {
            Some(b) => request.bearer_auth(b),
            None => request,
        }
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
        crate::tcc::send_retrying_busy(|| self.request(at, path, bearer, body))
            .await
            .ok()
            .flatten()
    }

    /// POST once, a 503 or 429 not asked again: the status and body, `None` without an answer.
    async fn post_once(
        &self,
        at: usize,
        path: &str,
        bearer: Option<&str>,
        body: &serde_json::Value,
    ) -> Option<(u16, String)> {
        let request = self.request(at, path, bearer, body);
        let response = request.send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    /// A JWT for `user` (`POST /tokens` with the admin secret).
    fn jwt(&self, at: usize, user: u64) -> Result<String, ContractError> {
        let body = serde_json::json!({ "user": user });
        self.must(at, "/tokens", self.admin.as_deref(), &body, "token")
    }

    /// A one-time token for (`user`, `activity`).
    fn issue(
        &self,
        at: usize,
        jwt: &str,
        user: u64,
        activity: &str,
    ) -> Result<String, ContractError> {
        let body = serde_json::json!({ "user": user, "activity": activity });
        self.must(at, "/tokens/once", Some(jwt), &body, "token")
    }

    /// `user` presents `token` once.
    fn consume(&self, jwt: &str, user: u64, token: &str) -> Consumed {
        let body = serde_json::json!({ "user": user, "token": token });
        let answer = self
            .rt
            .block_on(self.post(0, "/tokens/once/consume", Some(jwt), &body));
        Consumed::of(answer.map(|(s, _)| s))
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

/// The instances, when the tester owns them, and their database.
struct Owned {
    services: Vec<CommandService>,
    /// Stopped after the instances (fields drop in order).
    db: Option<crate::db::Database>,
    _dir: tempfile::TempDir,
}

fn start(opts: &TokensOptions) -> Result<Option<Owned>, ContractError> {
    if opts.commands.is_empty() {
        return Ok(None);
    }
    let db = crate::db::Database::start_for(opts.db.as_ref(), opts.db_fault)?;
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
        let port = load::conn::socket_addr(url)
            .map_err(|e| ContractError::Usage(e.to_string()))?
            .port();
        services.push(CommandService::start(CommandSpec {
            name: format!("server-{}", i + 1),
            command: {
                let command = command
                    .replace("{data}", &data.display().to_string())
                    .replace("{server}", &(i + 1).to_string());
                db.as_ref()
                    .map_or_else(|| command.clone(), |d| d.fill(&command))
            },
            port,
            env: Vec::new(),
            log: dir.path().join(format!("server-{}.log", i + 1)),
            netns: None,
        })?);
    }
    Ok(Some(Owned {
        services,
        db,
        _dir: dir,
    }))
}

/// Runs the rounds, then the hostile client's checks.
///
/// # Errors
/// The service could not be started or reached, or an issue step failed (not a verdict).
pub fn run(opts: &TokensOptions) -> Result<TokensRun, ContractError> {
    check_options(opts)?;
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
    let base = crate::tcc::fresh_base();
    // One activity for the rounds (every user is fresh, so every key is too), registered where
    // the service keeps an operator's registry (`POST /admin/activities`; a service without one
    // answers 404 and issues for any activity).
    let activity = base;
    wire.register(activity)?;
    let mut out = TokensRun {
        instances: opts.urls.len(),
        ..TokensRun::default()
    };
    let began = Instant::now();
    let since =
        |at: Instant| u64::try_from(at.duration_since(began).as_nanos()).unwrap_or(u64::MAX);
    // The previous round's user and JWT: the thief of the next round's token.
    let mut previous: Option<(u64, String)> = None;
    for index in 0..opts.tokens {
        let user = base + index;
        let at = index as usize;
        let jwt = wire.jwt(at, user)?;
        let once = wire.issue(at, &jwt, user, &activity.to_string())?;
        let stolen = previous.as_ref().map(|(thief, thief_jwt)| {
            let body = serde_json::json!({ "user": thief, "token": once });
            let answer =
                wire.rt
                    .block_on(wire.post(at + 1, "/tokens/once/consume", Some(thief_jwt), &body));
            Consumed::of(answer.map(|(s, _)| s))
        });
        let body = serde_json::json!({ "user": user, "token": once });
        let answers = wire.rt.block_on(async {
            let asks = (0..opts.consumers as usize).map(|k| {
                let (wire, body, jwt) = (&wire, &body, &jwt);
                async move {
                    let sent = Instant::now();
                    let answer = wire
                        .post(at + k, "/tokens/once/consume", Some(jwt), body)
                        .await;
                    let span = crate::overlap::Span {
                        key: index,
                        server: (at + k) % wire.bases.len(),
                        invoke_ns: since(sent),
                        complete_ns: since(Instant::now()),
                    };
                    (Consumed::of(answer.map(|(s, _)| s)), span)
                }
            });
            futures::future::join_all(asks).await
        });
        let racing: Vec<Consumed> = answers.iter().map(|(c, _)| *c).collect();
        out.spans.extend(answers.iter().map(|(_, span)| *span));
        let restart = opts.kill_every > 0 && (index + 1) % opts.kill_every == 0;
        if restart && let Some(o) = owned.as_mut() {
            if let (Some(db), Some(fault)) = (o.db.as_mut(), opts.db_fault) {
                let seen = db.fault_and_heal(fault, crate::db::DOWN_BETWEEN_MESSAGES)?;
                out.db_faults.0 += 1;
                out.db_faults.1 += u32::from(seen);
            } else {
                for s in &mut o.services {
                    s.kill9()?;
                    s.restart()?;
                }
            }
            wire.http = Wire::client()?;
            if o.db.is_some() {
                // Back when every instance answers a token never issued as its own (a read of
                // the database), not with an error of its own.
                crate::db::wait_until_back(|| {
                    (0..wire.bases.len()).try_for_each(|at| {
                        let body = serde_json::json!({ "user": user, "token": NEVER_ISSUED });
                        let answer = wire.rt.block_on(wire.post(
                            at,
                            "/tokens/once/consume",
                            Some(&jwt),
                            &body,
                        ));
                        match Consumed::of(answer.map(|(s, _)| s)) {
                            Consumed::Unknown => Err(format!("instance {} not back", at + 1)),
                            _ => Ok(()),
                        }
                    })
                })
                .map_err(ContractError::Unreachable)?;
            }
            out.restarts += 1;
        }
        let after = wire
            .rt
            .block_on(wire.post(at + 1, "/tokens/once/consume", Some(&jwt), &body));
        out.rounds.push(Round {
            index,
            token: once,
            stolen,
            racing,
            after: Consumed::of(after.map(|(s, _)| s)),
            settled: None,
        });
        previous = Some((user, jwt));
    }
    // Every unknown outcome followed to the end: the token asked for once more, now that every
    // fault is over.
    for round in out.rounds.iter_mut().filter(|r| r.unknown()) {
        let user = base + round.index;
        let at = usize::try_from(round.index).unwrap_or(0);
        let jwt = wire.jwt(at, user)?;
        round.settled = Some(wire.consume(&jwt, user, &round.token));
    }
    let (user, jwt) = previous.expect("at least one round ran (checked above)");
    let last = out
        .rounds
        .last()
        .map(|r| r.token.clone())
        .unwrap_or_default();
    out.unknown_token = Some(wire.consume(&jwt, user, NEVER_ISSUED));
    out.neighbours = neighbours(&last)
        .into_iter()
        .map(|n| {
            let answer = wire.consume(&jwt, user, &n);
            (n, answer)
        })
        .collect();
    if opts.exhaust > 0 {
        out.exhaustion = Some(exhaust(&wire, opts, base)?);
    }
    if let Some(spec) = &opts.slow {
        let probe = crate::slow::Probe::post(
            "/tokens/once/consume",
            &serde_json::json!({ "user": user, "token": NEVER_ISSUED }),
            Some(&jwt),
        );
        let slow = spec
            .run(&wire.bases[0], probe)
            .map_err(|e| ContractError::Usage(format!("--slow-clients: {e}")))?;
        out.slow = Some(slow);
    }
    if let Some(spec) = &opts.bodies {
        let pid = owned
            .as_ref()
            .and_then(|o| o.services.first())
            .and_then(CommandService::pid);
        let bodies = crate::bodies::run(spec, &wire.bases[0], BODIES_PATH, pid)
            .map_err(|e| ContractError::Usage(format!("--unauth-bodies: {e}")))?;
        out.bodies = Some(bodies);
    }
    drop(owned);
    Ok(out)
}

fn check_options(opts: &TokensOptions) -> Result<(), ContractError> {
    if opts.urls.is_empty() || opts.tokens == 0 || opts.consumers == 0 {
        return Err(ContractError::Usage(
            "give a --url, and --tokens and --consumers of at least 1".into(),
        ));
    }
    // Users base .. base + tokens, then the exhausting user and another.
    if opts.tokens + 2 > crate::tcc::RUN_NUMBERS || opts.consumers > 256 {
        return Err(ContractError::Usage(format!(
            "--tokens {} --consumers {}: at most {} tokens and 256 consumers",
            opts.tokens,
            opts.consumers,
            crate::tcc::RUN_NUMBERS - 2
        )));
    }
    if opts.exhaust > EXHAUST_MAX {
        return Err(ContractError::Usage(format!(
            "--exhaust {}: at most {EXHAUST_MAX}",
            opts.exhaust
        )));
    }
    if let Some(spec) = &opts.slow {
        spec.validate().map_err(ContractError::Usage)?;
    }
    if let Some(spec) = &opts.bodies {
        spec.validate().map_err(ContractError::Usage)?;
    }
    if opts.kill_every > 0 && opts.commands.is_empty() {
        return Err(ContractError::Usage(
            "--kill-every needs --server-cmd (the tester must own the servers)".into(),
        ));
    }
    crate::db::validate_contract(
        opts.db.as_ref(),
        opts.db_fault,
        &opts.commands,
        opts.kill_every,
    )
    .map_err(ContractError::Usage)
}

/// One fresh user asks for `opts.exhaust` tokens, one per fresh activity, back to back (a
/// refusal is not asked again); then the same first key again, and another user once.
fn exhaust(wire: &Wire, opts: &TokensOptions, base: u64) -> Result<Exhaustion, ContractError> {
    let (user, other) = (base + opts.tokens, base + opts.tokens + 1);
    let activities: Vec<u64> = (1..=opts.exhaust).map(|k| base + k).collect();
    for a in &activities {
        wire.register(*a)?;
    }
    let jwt = wire.jwt(0, user)?;
    let mut e = Exhaustion {
        asked: opts.exhaust,
        ..Exhaustion::default()
    };
    let began = Instant::now();
    let mut first = None;
    for (k, a) in (1..).zip(&activities) {
        let body = serde_json::json!({ "user": user, "activity": a.to_string() });
        let answer = wire
            .rt
            .block_on(wire.post_once(0, "/tokens/once", Some(&jwt), &body));
        match answer {
            Some((status, text)) if (200..300).contains(&status) => {
                e.issued += 1;
                first = first.or_else(|| token_of(&text));
            }
            other => {
                e.refused = Some((k, other.map(|(s, _)| s)));
                break;
            }
        }
    }
    e.elapsed_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
    if let (Some(first), Some(a)) = (first, activities.first()) {
        let body = serde_json::json!({ "user": user, "activity": a.to_string() });
        let again = wire
            .rt
            .block_on(wire.post(0, "/tokens/once", Some(&jwt), &body));
        e.same_token_again = again
            .filter(|(s, _)| (200..300).contains(s))
            .and_then(|(_, text)| token_of(&text))
            .map(|t| t == first);
    }
    let other_jwt = wire.jwt(1, other)?;
    let body = serde_json::json!({ "user": other, "activity": base.to_string() });
    e.other_user = wire
        .rt
        .block_on(wire.post(1, "/tokens/once", Some(&other_jwt), &body))
        .map(|(s, _)| s);
    Ok(e)
}

/// The `token` of a JSON answer.
fn token_of(text: &str) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_str(text).ok()?;
    doc.get("token")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round whose token is far from every other round's.
    fn round(racing: &[Consumed], after: Consumed) -> Round {
        Round {
            index: 0,
            token: "5f0e1a9c3b7d2e4f6a8c0b1d3e5f7a9c".to_owned(),
            stolen: None,
            racing: racing.to_vec(),
            after,
            settled: None,
        }
    }

    fn run_of(rounds: Vec<Round>, unknown: Consumed) -> TokensRun {
        TokensRun {
            rounds,
            unknown_token: Some(unknown),
            ..TokensRun::default()
        }
    }

    fn violated(run: &TokensRun) -> Vec<String> {
        run.checks()
            .into_iter()
            .filter(|c| c.verdict == Judgement::Violated)
            .map(|c| c.name)
            .collect()
    }

    #[test]
    fn one_acceptance_and_the_rest_used_holds() {
        use Consumed::{Accepted, Refused, Unknown, Used};
        let mut second = round(&[Used, Unknown, Used], Used);
        second.index = 1;
        second.token = "a3c5e7f90b1d2f4a6c8e0a2b4d6f8a1c".to_owned();
        second.stolen = Some(Refused(403));
        let mut run = run_of(
            vec![
                round(&[Used, Accepted, Used], Used),
                // An unknown outcome may have been the acceptance.
                second,
            ],
            Refused(404),
        );
        run.neighbours = vec![("a3c5e7f90b1d2f4a6c8e0a2b4d6f8a1d".into(), Refused(404))];
        run.exhaustion = Some(Exhaustion {
            asked: 100,
            issued: 20,
            refused: Some((21, Some(429))),
            elapsed_ms: 40,
            other_user: Some(201),
            same_token_again: Some(true),
        });
        assert!(run.passed(), "{:?}", run.checks());
        assert!(run.checks().iter().any(|c| c.name == "tokens.quota"));
    }

    #[test]
    fn each_check_fires_on_its_bad_history() {
        use Consumed::{Accepted, Used};
        let ok = Consumed::Refused(404);
        assert_eq!(
            violated(&run_of(vec![round(&[Accepted, Accepted], Used)], ok)),
            ["tokens.once"]
        );
        assert_eq!(
            violated(&run_of(vec![round(&[Used, Used], Used)], ok)),
            ["tokens.once_accepted"]
        );
        assert_eq!(
            violated(&run_of(vec![round(&[Accepted, Used], Accepted)], ok)),
            ["tokens.stays_used"]
        );
        assert_eq!(
            violated(&run_of(vec![round(&[Accepted, Used], Used)], Accepted)),
            ["tokens.unknown_refused"]
        );
    }

    #[test]
    fn an_unknown_outcome_must_settle_once_the_faults_are_over() {
        use Consumed::{Accepted, Unknown, Used};
        let ok = Consumed::Refused(404);
        let with = |racing: &[Consumed], after, settled| {
            let mut r = round(racing, after);
            r.settled = Some(settled);
            run_of(vec![r], ok)
        };
        // Settled: "used", or the first acceptance when none came before.
        assert!(with(&[Accepted, Unknown], Used, Used).passed());
        assert!(with(&[Unknown, Unknown], Unknown, Accepted).passed());
        // Not settled: unknown again, refused otherwise, or a second acceptance.
        for bad in [
            with(&[Accepted, Unknown], Used, Unknown),
            with(&[Accepted, Unknown], Used, Consumed::Refused(500)),
            with(&[Accepted, Unknown], Used, Accepted),
        ] {
            assert_eq!(
                violated(&bad),
                ["tokens.unknown_settled"],
                "{:?}",
                bad.rounds
            );
        }
    }

    #[test]
    fn consumes_that_never_overlapped_make_a_pass_inconclusive_for_races() {
        use Consumed::{Accepted, Used};
        let race = |run: &TokensRun| {
            let check = run.checks().pop().expect("races.overlapped is last");
            assert_eq!(check.name, "races.overlapped");
            check.verdict
        };
        let span = |key, server, from_ms: u64, to_ms: u64| crate::overlap::Span {
            key,
            server,
            invoke_ns: from_ms * 1_000_000,
            complete_ns: to_ms * 1_000_000,
        };
        let mut run = run_of(vec![round(&[Accepted, Used], Used)], Consumed::Refused(404));
        run.instances = 2;
        // The second consume left after the first was answered: no race was tried.
        run.spans = vec![span(0, 0, 0, 3), span(0, 1, 3, 5)];
        assert!(run.passed());
        assert_eq!(race(&run), Judgement::NotChecked);
        assert!(run.concurrency().inconclusive.is_some());
        // Both in flight at once: the pass says something about the race.
        run.spans = vec![span(0, 0, 0, 3), span(0, 1, 1, 5)];
        assert_eq!(race(&run), Judgement::Held);
        assert_eq!(run.concurrency().servers[1].requests, 1);
    }

    #[test]
    fn a_token_accepted_for_another_user_breaks_owner_only() {
        let mut stolen = round(&[Consumed::Used], Consumed::Used);
        stolen.stolen = Some(Consumed::Accepted);
        let run = run_of(vec![stolen], Consumed::Refused(404));
        // The thief's use is the one use: the owner's consumes all find it used.
        assert_eq!(
            violated(&run),
            ["tokens.once_accepted", "tokens.owner_only"]
        );
    }

    #[test]
    fn sequential_values_and_an_existence_oracle_break_unguessable() {
        use Consumed::{Accepted, Refused, Used};
        // Values from a counter: the planted weakness `sequential_tokens`.
        let mut a = round(&[Accepted], Used);
        a.token = "000000000000018c2f3a4b5c00000007".into();
        let mut b = round(&[Accepted], Used);
        (b.index, b.token) = (1, "000000000000018c2f3a4b5c00000008".into());
        let run = run_of(vec![a, b], Refused(404));
        assert_eq!(violated(&run), ["tokens.unguessable"]);
        let first = run
            .checks()
            .into_iter()
            .find(|c| c.name == "tokens.unguessable")
            .and_then(|c| c.first_offending_event)
            .expect("tokens.unguessable names the tokens");
        assert!(
            first.contains("token 1 ") && first.contains("token 0 "),
            "{first}"
        );
        // Random values, but a neighbour is answered 403 where a stranger gets 404.
        let mut run = run_of(vec![round(&[Accepted], Used)], Refused(404));
        run.neighbours = vec![("x".into(), Refused(403))];
        assert_eq!(violated(&run), ["tokens.unguessable"]);
        run.neighbours = vec![("x".into(), Accepted)];
        assert_eq!(violated(&run), ["tokens.unguessable"]);
    }

    #[test]
    fn one_user_holding_every_token_breaks_the_quota() {
        let good = Exhaustion {
            asked: 100,
            issued: 20,
            refused: Some((21, Some(429))),
            elapsed_ms: 40,
            other_user: Some(201),
            same_token_again: None,
        };
        let with = |e: Exhaustion| {
            let mut run = run_of(
                vec![round(&[Consumed::Accepted], Consumed::Used)],
                Consumed::Refused(404),
            );
            run.exhaustion = Some(e);
            violated(&run)
        };
        assert!(with(good.clone()).is_empty());
        // The planted weakness `no_token_quota`: every ask issued.
        let all = Exhaustion {
            issued: 100,
            refused: None,
            ..good.clone()
        };
        assert_eq!(with(all), ["tokens.quota"]);
        let two_live = Exhaustion {
            same_token_again: Some(false),
            ..good.clone()
        };
        assert_eq!(with(two_live), ["tokens.quota"]);
        let others_refused = Exhaustion {
            other_user: Some(503),
            ..good
        };
        assert_eq!(with(others_refused), ["tokens.quota"]);
    }

    #[test]
    fn neighbours_step_the_trailing_digits_without_wrapping() {
        assert_eq!(
            neighbours("00ff"),
            ["00fe", "0100"].map(String::from).to_vec()
        );
        // Decimal and hex runs of the same tail.
        assert_eq!(
            neighbours("tok-0099"),
            ["tok-0098", "tok-009a", "tok-0100"]
                .map(String::from)
                .to_vec()
        );
        // Upper-case hex stays upper case; the decimal run "0" has no neighbour below.
        assert_eq!(
            neighbours("AB0F"),
            ["AB0E", "AB10"].map(String::from).to_vec()
        );
        assert!(
            neighbours("ffff")
                .iter()
                .all(|n| n.len() == 4 && n != "ffff")
        );
        assert!(neighbours("zz").is_empty());
        let sut = "5f0e1a9c3b7d2e4f6a8c0b1d3e5f7a9c";
        assert!(neighbours(sut).contains(&"5f0e1a9c3b7d2e4f6a8c0b1d3e5f7a9d".to_owned()));
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
