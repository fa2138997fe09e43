//! One-time submit tokens with group commit: one writer thread per process runs every issue and
//! consume, taking as many as are waiting into one store batch (on PostgreSQL one transaction,
//! one WAL flush, and a handful of statements whatever the batch's size: the rows it needs are
//! read up front) and answering none of them before the batch is durable.
//!
//! What a token means and when a consume is accepted is `sut::token::once`'s business; this
//! module only moves requests to the store and answers back. On SQLite every operation stays
//! its own transaction (batches of one), as before.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};

use sut::clock::Now;
use sut::token::once::{OnceConfig, issue_once};
use sut::token::rows::{OnceIssue, OnceKey, OnceRejection, OnceToken, TokenStoreError};
use sut::token::{ActivityKey, TokenFlaws, TokenStore, UserId};
use tokio::sync::oneshot;

use crate::sqldb::SqlConn;
use crate::sqldb::once_view::OnceHints;
use crate::sqldb::tokens::SqlTokenStore;
use crate::sqlite::SqliteTokenStore;

/// Most operations in one batch.
const BATCH_MAX: usize = 256;

/// A token store the writer can batch on.
pub trait BatchTokenStore: Send + std::fmt::Debug {
    /// Runs `ops` against the store; durable when it returns `Ok`. `ops` may be run more than
    /// once (after a serialization failure); each run must start from scratch.
    ///
    /// # Errors
    /// The first error of `ops`, or a store failure; then none of it may be answered.
    fn batch(
        &mut self,
        hints: &OnceHints,
        ops: &mut dyn FnMut(&mut dyn TokenStore) -> Result<(), TokenStoreError>,
    ) -> Result<(), TokenStoreError>;

    /// Most operations this store takes in one batch.
    fn batch_max(&self) -> usize;
}

/// On a database server: the batch is one transaction, served from a snapshot.
impl<C: SqlConn> BatchTokenStore for SqlTokenStore<C> {
    fn batch(
        &mut self,
        hints: &OnceHints,
        ops: &mut dyn FnMut(&mut dyn TokenStore) -> Result<(), TokenStoreError>,
    ) -> Result<(), TokenStoreError> {
        self.batch_once(hints, ops)
    }

    fn batch_max(&self) -> usize {
        BATCH_MAX
    }
}

impl BatchTokenStore for SqliteTokenStore {
    /// Each operation is its own transaction here, so a batch holds one: a failure can then
    /// never hide an operation that was committed.
    fn batch(
        &mut self,
        _hints: &OnceHints,
        ops: &mut dyn FnMut(&mut dyn TokenStore) -> Result<(), TokenStoreError>,
    ) -> Result<(), TokenStoreError> {
        ops(self)
    }

    fn batch_max(&self) -> usize {
        1
    }
}

/// A one-time token store of either backend.
pub type BatchTokenStoreBox = Box<dyn BatchTokenStore>;

type Reply<T> = oneshot::Sender<Result<T, TokenStoreError>>;

/// What the writer is asked to do.
#[derive(Debug)]
enum Job {
    Issue {
        user: UserId,
        activity: ActivityKey,
        nonce: u128,
        now: Now,
        reply: Reply<OnceIssue>,
    },
    Consume {
        token: OnceToken,
        user: UserId,
        /// The activity the token must be for (`None`: any).
        activity: Option<ActivityKey>,
        now: Now,
        reply: Reply<Result<OnceKey, OnceRejection>>,
    },
}

/// A job's answer, held until its batch commits.
enum Answer {
    Issued(Result<OnceIssue, TokenStoreError>),
    Consumed(Result<Result<OnceKey, OnceRejection>, TokenStoreError>),
}

/// The rules the writer applies (the token service's own settings).
#[derive(Clone, Copy, Debug)]
pub struct OnceRules {
    /// The window and lifetime of a token.
    pub once: OnceConfig,
    /// Documented flaws switched on.
    pub flaws: TokenFlaws,
}

/// The handle the routes use; cheap to clone.
#[derive(Clone, Debug)]
pub struct OnceDesk {
    jobs: mpsc::Sender<Job>,
    stats: Arc<Stats>,
}

/// What the writer did.
#[derive(Debug, Default)]
struct Stats {
    batches: AtomicU64,
    jobs: AtomicU64,
}

impl OnceDesk {
    /// Starts the writer thread over `store`; it stops when the last handle is dropped.
    ///
    /// # Errors
    /// The thread cannot be spawned.
    pub fn start(store: BatchTokenStoreBox, rules: OnceRules) -> Result<Self, String> {
        let (jobs, rx) = mpsc::channel();
        let stats = Arc::new(Stats::default());
        let counted = Arc::clone(&stats);
        std::thread::Builder::new()
            .name("once-writer".into())
            .spawn(move || run(store, rules, &rx, &counted))
            .map_err(|e| format!("one-time token writer: {e}"))?;
        Ok(Self { jobs, stats })
    }

    /// Batches committed and the operations they held, so far.
    #[must_use]
    pub fn committed(&self) -> (u64, u64) {
        (
            self.stats.batches.load(Ordering::Relaxed),
            self.stats.jobs.load(Ordering::Relaxed),
        )
    }

    /// Issues (or re-reads) the token of `(user, activity, the window of now)`.
    ///
    /// # Errors
    /// The store's error; a stopped writer is a backend error.
    pub async fn issue(
        &self,
        user: UserId,
        activity: ActivityKey,
        nonce: u128,
        now: Now,
    ) -> Result<OnceIssue, TokenStoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::Issue {
            user,
            activity,
            nonce,
            now,
            reply,
        })?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Consumes `token` for `user` (and `activity`, when given: a token of another activity is
    /// refused and stays unused): accepted at most once, ever.
    ///
    /// # Errors
    /// The store's error; a stopped writer is a backend error.
    pub async fn consume(
        &self,
        token: OnceToken,
        user: UserId,
        activity: Option<ActivityKey>,
        now: Now,
    ) -> Result<Result<OnceKey, OnceRejection>, TokenStoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::Consume {
            token,
            user,
            activity,
            now,
            reply,
        })?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    fn send(&self, job: Job) -> Result<(), TokenStoreError> {
        self.jobs.send(job).map_err(|_| stopped())
    }
}

fn stopped() -> TokenStoreError {
    TokenStoreError::Backend("the one-time token writer stopped".to_owned())
}

/// The writer: a batch of whatever is waiting, run and committed, then answered.
fn run(mut store: BatchTokenStoreBox, rules: OnceRules, rx: &mpsc::Receiver<Job>, stats: &Stats) {
    let batch_max = store.batch_max().max(1);
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < batch_max {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let mut answers = Vec::with_capacity(jobs.len());
        let hints = hints(&jobs, rules);
        let committed = store.batch(&hints, &mut |s| {
            answers.clear();
            for job in &jobs {
                let answer = perform(s, rules, job);
                if let Some(e) = answer.backend_error() {
                    // The transaction cannot be trusted any more: none of the batch commits.
                    return Err(e);
                }
                answers.push(answer);
            }
            Ok(())
        });
        match committed {
            Ok(()) => {
                assert_eq!(answers.len(), jobs.len(), "one answer per job");
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.jobs.fetch_add(jobs.len() as u64, Ordering::Relaxed);
                for (job, answer) in jobs.into_iter().zip(answers) {
                    answer.send(job);
                }
            }
            Err(e) => {
                for job in jobs {
                    job.fail(e.clone());
                }
            }
        }
    }
}

/// The rows `jobs` will look at: each token, and each key an issue asks for.
fn hints(jobs: &[Job], rules: OnceRules) -> OnceHints {
    let mut hints = OnceHints::default();
    for job in jobs {
        match job {
            Job::Issue {
                user,
                activity,
                nonce,
                now,
                ..
            } => {
                hints.tokens.push(OnceToken(*nonce));
                hints.keys.push(OnceKey {
                    user: *user,
                    activity: activity.clone(),
                    window_start_ms: rules.once.window_start_ms(now.wall_ms),
                });
            }
            Job::Consume { token, .. } => hints.tokens.push(*token),
        }
    }
    hints
}

/// Runs one job against the batch's store.
fn perform(store: &mut dyn TokenStore, rules: OnceRules, job: &Job) -> Answer {
    match *job {
        Job::Issue {
            user,
            activity: ref activity_id,
            nonce,
            now,
            ..
        } => Answer::Issued(issue_once(
            store,
            &rules.once,
            user,
            activity_id.clone(),
            nonce,
            now,
        )),
        Job::Consume {
            token,
            user,
            ref activity,
            now,
            ..
        } => Answer::Consumed(
            sut::token::once::consume_for(store, token, user, activity.as_ref(), now, rules.flaws)
                .map(|(outcome, _ops)| outcome),
        ),
    }
}

impl Answer {
    /// A failure of the store itself (not a refusal the store committed, like `Full`).
    fn backend_error(&self) -> Option<TokenStoreError> {
        let e = match self {
            Self::Issued(Err(e)) | Self::Consumed(Err(e)) => e,
            _ => return None,
        };
        matches!(e, TokenStoreError::Backend(_)).then(|| e.clone())
    }

    fn send(self, job: Job) {
        // A dropped receiver is a client that went away: nothing to do.
        match (self, job) {
            (Self::Issued(r), Job::Issue { reply, .. }) => drop(reply.send(r)),
            (Self::Consumed(r), Job::Consume { reply, .. }) => drop(reply.send(r)),
            _ => unreachable!("answers are made from their own jobs, in order"),
        }
    }
}

impl Job {
    fn fail(self, e: TokenStoreError) {
        match self {
            Self::Issue { reply, .. } => drop(reply.send(Err(e))),
            Self::Consume { reply, .. } => drop(reply.send(Err(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use chaos::Postgres;
    use sut::token::TokenStoreLimits;

    use super::*;
    use crate::pg::{PgTokenStore, create_database, url_with_database};

    fn now(wall_ms: u64) -> Now {
        Now {
            wall_ms,
            mono_ms: wall_ms,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
    async fn concurrent_consumes_through_the_writer_accept_each_token_once_in_group_commits() {
        const USERS: u64 = 64;
        let server = Postgres::start().expect("start PostgreSQL");
        create_database(&server.url(), "once_desk").expect("create database");
        let url = url_with_database(&server.url(), "once_desk");
        let limits = TokenStoreLimits::default();
        let store = PgTokenStore::open(&url, limits).expect("open");
        let rules = OnceRules {
            once: OnceConfig::default(),
            flaws: TokenFlaws::default(),
        };
        let desk = OnceDesk::start(Box::new(store), rules).expect("start");
        let activity = ActivityKey::new("A1").unwrap();
        let issues = (0..USERS).map(|u| {
            let (desk, activity) = (desk.clone(), activity.clone());
            tokio::spawn(async move {
                desk.issue(UserId(u), activity, u128::from(u) + 1, now(1_000))
                    .await
            })
        });
        let mut tokens = Vec::new();
        for issued in issues.collect::<Vec<_>>() {
            let issued = issued.await.unwrap().expect("issue");
            assert!(issued.fresh);
            tokens.push(issued.token);
        }
        // Two consumes of every token at once, as a replayed submit would make them.
        let consumes: Vec<_> = tokens
            .iter()
            .enumerate()
            .flat_map(|(u, &token)| [(u, token), (u, token)])
            .map(|(u, token)| {
                let desk = desk.clone();
                tokio::spawn(async move {
                    desk.consume(token, UserId(u as u64), None, now(2_000))
                        .await
                })
            })
            .collect();
        let mut accepted = vec![0u32; tokens.len()];
        for (i, consumed) in consumes.into_iter().enumerate() {
            match consumed.await.unwrap().expect("store") {
                Ok(key) => {
                    assert_eq!(key.user, UserId((i / 2) as u64));
                    accepted[i / 2] += 1;
                }
                Err(r) => assert_eq!(r, OnceRejection::AlreadyConsumed),
            }
        }
        assert!(accepted.iter().all(|&n| n == 1), "{accepted:?}");
        let (batches, jobs) = desk.committed();
        assert_eq!(jobs, 3 * USERS, "every job committed");
        assert!(
            batches < jobs,
            "no group commit: {batches} batches for {jobs} jobs"
        );
    }

    #[tokio::test]
    async fn on_sqlite_every_operation_is_its_own_batch() {
        let dir = tempfile::tempdir().unwrap();
        let limits = TokenStoreLimits::default();
        let store = SqliteTokenStore::open(&dir.path().join("t.db"), limits).expect("open");
        let rules = OnceRules {
            once: OnceConfig::default(),
            flaws: TokenFlaws::default(),
        };
        let desk = OnceDesk::start(Box::new(store), rules).expect("start");
        let activity = ActivityKey::new("A1").unwrap();
        let issued = desk
            .issue(UserId(1), activity, 5, now(1_000))
            .await
            .expect("issue");
        // Presented for another activity: refused, and the token stays unused.
        let other = ActivityKey::new("2").unwrap();
        let wrong = desk
            .consume(issued.token, UserId(1), Some(other), now(2_000))
            .await;
        assert_eq!(wrong.expect("store"), Err(OnceRejection::OtherActivity));
        let a1 = ActivityKey::new("A1").unwrap();
        let first = desk
            .consume(issued.token, UserId(1), Some(a1), now(2_000))
            .await;
        let second = desk
            .consume(issued.token, UserId(1), None, now(2_000))
            .await;
        assert!(first.expect("store").is_ok());
        assert_eq!(second.expect("store"), Err(OnceRejection::AlreadyConsumed));
        assert_eq!(desk.committed(), (4, 4));
    }
}
