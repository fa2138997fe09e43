//! Participants in other processes: how the coordinator reaches them, and the route they serve.
//!
//! The coordinator of `sut` decides what to send and what a reply means; this module only moves
//! each [`ParticipantMsg`] to the process that hosts its branch (`POST /tcc/branches`, as many
//! as one group commit released, authenticated with the cluster secret) and carries each
//! [`ParticipantReply`] back. A message is sent only
//! after the coordinator's log entries before it are durable (the writer flushes its outbox
//! after the group commit): a Try never runs for a draw the coordinator could forget, and a
//! Confirm or Cancel never runs before its verdict is on disk.
//!
//! Delivery is one attempt with a timeout. A refused connection, a timeout or an error status is
//! a lost message: the coordinator's reply timeout and its compensation wheel (backoff with
//! jitter, a bounded budget, then a dead letter) redeliver, and the participants' fences make
//! every redelivery idempotent by (xid, branch).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sut::lottery::{Host, Participant, ParticipantMsg, ParticipantReply};

use crate::metrics::Metrics;

/// The participant route (one message).
pub const BRANCH_ROUTE: &str = "/tcc/branch";
/// The participant route for many messages at once (what the coordinator sends).
pub const BRANCHES_ROUTE: &str = "/tcc/branches";
/// Most messages in one `POST /tcc/branches` (a full batch stays well under the body limit).
pub const BRANCHES_MAX: usize = 48;
/// The body limit of `POST /tcc/branches` (a full batch is ~12 KiB; room for a malformed one to
/// be read and refused as malformed rather than as too large).
pub const BRANCHES_BODY_MAX_BYTES: usize = 256 * 1024;

/// The body of `POST /tcc/branch`: one coordinator message for one branch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchRequest {
    /// The branch (`Wallet`, `Inventory`, `Participation`).
    #[schema(value_type = String)]
    pub branch: Participant,
    /// The phase and the draw.
    #[schema(value_type = Object)]
    pub msg: ParticipantMsg,
}

/// The body of `POST /tcc/branches`: coordinator messages, run in order in one durable batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchBatch {
    /// The messages (1 to 48).
    #[schema(min_items = 1, max_items = 48)]
    pub messages: Vec<BranchRequest>,
}

/// The answer of `POST /tcc/branches`: one reply per message, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchReplies {
    /// The participants' replies.
    #[schema(value_type = Vec<Object>)]
    pub replies: Vec<ParticipantReply>,
}

/// Where the participants of a coordinator live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteParticipants {
    /// Base URL of the process hosting the wallet and the participation log.
    pub wallet_url: String,
    /// Base URL of the process hosting the prize stock.
    pub inventory_url: String,
    /// The cluster secret the participants require (`Authorization: Bearer …`).
    pub secret: String,
    /// How long one delivery may take before it counts as lost.
    pub timeout_ms: u64,
    /// The CA to trust for `https://` participant URLs.
    pub tls_ca_file: Option<std::path::PathBuf>,
}

/// The branches a participant process of `role` hosts.
#[must_use]
pub const fn hosts(role: crate::Role, branch: Participant) -> bool {
    match role {
        crate::Role::All => true,
        crate::Role::Wallet => Host::Wallet.hosts(branch),
        crate::Role::Inventory => Host::Inventory.hosts(branch),
        crate::Role::Id | crate::Role::Token | crate::Role::Coordinator => false,
    }
}

impl RemoteParticipants {
    /// The base URL of the process of `host` (where `sut::lottery` places each branch).
    #[must_use]
    pub fn url(&self, host: Host) -> &str {
        match host {
            Host::Wallet => &self.wallet_url,
            Host::Inventory => &self.inventory_url,
        }
    }
}

/// Messages waiting for the group commit that makes their cause durable.
pub(crate) struct Outbox {
    config: RemoteParticipants,
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
    metrics: Arc<Metrics>,
    waiting: Vec<(Host, Participant, ParticipantMsg)>,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("config", &self.config.wallet_url)
            .field("waiting", &self.waiting.len())
            .finish_non_exhaustive()
    }
}

/// Where replies go: the writer's queue.
pub(crate) type ReplySink = Arc<dyn Fn(Participant, ParticipantReply) + Send + Sync>;

impl Outbox {
    /// An outbox delivering on the current tokio runtime.
    pub(crate) fn new(config: RemoteParticipants, metrics: Arc<Metrics>) -> Result<Self, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "remote participants need a tokio runtime".to_owned())?;
        let client = crate::tls::http_client(
            config.tls_ca_file.as_deref(),
            Duration::from_millis(config.timeout_ms.max(1)),
            64,
        )?;
        Ok(Self {
            config,
            client,
            runtime,
            metrics,
            waiting: Vec::new(),
        })
    }

    /// Queues a message until [`Outbox::flush`].
    pub(crate) fn push(&mut self, host: Host, to: Participant, msg: ParticipantMsg) {
        debug_assert!(host.hosts(to), "{to} is not on {}", host.name());
        self.waiting.push((host, to, msg));
    }

    /// Sends every queued message (call after the commit that made their causes durable): one
    /// `POST /tcc/branches` per participant process and up to [`BRANCHES_MAX`] messages.
    pub(crate) fn flush(&mut self, sink: &ReplySink) {
        let mut by_url: std::collections::BTreeMap<&str, Vec<BranchRequest>> =
            std::collections::BTreeMap::new();
        for (host, branch, msg) in self.waiting.drain(..) {
            by_url
                .entry(self.config.url(host))
                .or_default()
                .push(BranchRequest { branch, msg });
        }
        for (base, requests) in by_url {
            let url = format!("{base}{BRANCHES_ROUTE}");
            for chunk in requests.chunks(BRANCHES_MAX) {
                self.send(&url, chunk.to_vec(), sink);
            }
        }
    }

    /// Sends one batch; each usable reply goes to `sink`, every other message counts as lost.
    fn send(&self, url: &str, messages: Vec<BranchRequest>, sink: &ReplySink) {
        let (client, url) = (self.client.clone(), url.to_owned());
        let secret = self.config.secret.clone();
        let sink = Arc::clone(sink);
        let metrics = Arc::clone(&self.metrics);
        let sent = messages.len() as u64;
        metrics.participant_calls.fetch_add(sent, Ordering::Relaxed);
        self.runtime.spawn(async move {
            let replies = deliver(&client, &url, &secret, &messages).await;
            let mut answered = 0;
            for (request, reply) in messages.iter().zip(replies.unwrap_or_default()) {
                // A reply for another message is no answer to this one.
                if answers(request, &reply) {
                    answered += 1;
                    sink(request.branch, reply);
                }
            }
            metrics
                .participant_calls_lost
                .fetch_add(sent - answered, Ordering::Relaxed);
        });
    }
}

/// Whether `reply` answers `request`.
fn answers(request: &BranchRequest, reply: &ParticipantReply) -> bool {
    reply.branch == request.branch
        && reply.phase == request.msg.phase
        && reply.draw == request.msg.draw
}

/// One delivery of a batch; `None` when no usable answer came back.
async fn deliver(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    messages: &[BranchRequest],
) -> Option<Vec<ParticipantReply>> {
    let response = client
        .post(url)
        .bearer_auth(secret)
        .json(&serde_json::json!({ "messages": messages }))
        .send()
        .await
        .ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body: BranchReplies = response.json().await.ok()?;
    (body.replies.len() == messages.len()).then_some(body.replies)
}
