//! The history of a run: every client operation's invocation and completion, and what the
//! nodes did that the checkers need to see (IDs issued in issue order, token and TCC events),
//! plus faults and phases. Each event carries its sequence number, the simulated time, the
//! node and that node's wall-clock reading.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sut::lottery::{DrawEvent, ParticipantReply};
use sut::token::check::TokenEvent;

/// An operation a client asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// A segment ID (tag `order`).
    SegmentId,
    /// A Snowflake ID.
    SnowflakeId,
    /// A semantic ID (prefix, second, machine, sequence; ID, token and lottery design §2.3,
    /// docs/sources.md).
    SemanticId,
    /// A JWT for a user.
    JwtIssue {
        /// The user.
        user: u64,
    },
    /// Verify a JWT.
    JwtVerify {
        /// The token.
        token: String,
    },
    /// Revoke a JWT.
    JwtRevoke {
        /// The token.
        token: String,
    },
    /// Issue the one-time submit token of (user, activity, this hour).
    OnceIssue {
        /// The user.
        user: u64,
        /// The activity.
        activity: String,
    },
    /// Consume a one-time token.
    OnceConsume {
        /// The token (decimal text).
        token: u128,
        /// The user presenting it.
        user: u64,
    },
    /// Draw in the lottery.
    Draw {
        /// The user.
        user: u64,
        /// The activity.
        activity: u64,
        /// The caller's randomness: whether the draw wins.
        won: bool,
        /// The ticket price the request names (`None`: it names none; the operator's terms
        /// decide). A hostile client names its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        price: Option<u64>,
    },
    /// Poll the status of a draw answered `pending` (as a client of `sut-server` follows
    /// `GET /lottery/draws/{draw}`).
    DrawStatus {
        /// The draw.
        xid: u64,
    },
}

impl Op {
    /// The operation's kind (`segment_id`, `draw`, ...), as reports count them.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::SegmentId => "segment_id",
            Self::SnowflakeId => "snowflake_id",
            Self::SemanticId => "semantic_id",
            Self::JwtIssue { .. } => "jwt_issue",
            Self::JwtVerify { .. } => "jwt_verify",
            Self::JwtRevoke { .. } => "jwt_revoke",
            Self::OnceIssue { .. } => "once_issue",
            Self::OnceConsume { .. } => "once_consume",
            Self::Draw { .. } => "draw",
            Self::DrawStatus { .. } => "draw_status",
        }
    }
}

/// A successful answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Answer {
    /// An ID.
    Id(u64),
    /// A JWT and its `jti`.
    Jwt {
        /// The token.
        token: String,
        /// Its id.
        jti: String,
    },
    /// The token verified.
    Verified,
    /// The token is revoked (acknowledged).
    Revoked,
    /// A one-time token.
    Once(u128),
    /// The one-time token was accepted.
    Consumed,
    /// What a client is told of its draw (`sut::lottery::ClientAnswer`, or a poll's
    /// `sut::lottery::DrawStatus`): `confirmed`, `pending` (follow it by polling), and from a
    /// poll also `in_progress`, `dead_lettered` or `cancelled`. A cancelled first answer is a
    /// [`Outcome::Fail`], as the server's is an error.
    Draw {
        /// The draw.
        xid: u64,
        /// Its status's name.
        status: String,
    },
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// It happened.
    Ok(Answer),
    /// It definitely did not happen (a rejection or a refusal).
    Fail(String),
    /// No answer in time: it may or may not have happened.
    Timeout,
}

impl Outcome {
    /// `fail`, `timeout`, or what the answer is (`id`, `jwt`, `verified`, `revoked`, `once`,
    /// `consumed`, `draw`).
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Ok(answer) => answer.kind(),
            Self::Fail(_) => "fail",
            Self::Timeout => "timeout",
        }
    }
}

impl Answer {
    /// What the answer is: `id`, `jwt`, `verified`, `revoked`, `once`, `consumed`, `draw`.
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Id(_) => "id",
            Self::Jwt { .. } => "jwt",
            Self::Verified => "verified",
            Self::Revoked => "revoked",
            Self::Once(_) => "once",
            Self::Consumed => "consumed",
            Self::Draw { .. } => "draw",
        }
    }
}

/// Which ID space an issued ID belongs to (uniqueness is per space).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum IdSpace {
    /// Segment IDs of tag `order`.
    Segment,
    /// Snowflake IDs.
    Snowflake,
    /// Degraded-mode IDs (bit 62 set).
    Degraded,
    /// Semantic IDs, as the number their 18 digits spell.
    Semantic,
}

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// A client sent an operation.
    Invoke {
        /// Per-client operation number.
        op_id: u64,
        /// The operation.
        op: Op,
    },
    /// A client saw the end of an operation.
    Complete {
        /// Per-client operation number.
        op_id: u64,
        /// How it ended.
        outcome: Outcome,
    },
    /// A generator issued an ID (recorded by the node, in issue order, before replying).
    Issued {
        /// The ID space.
        space: IdSpace,
        /// The generator instance (allocator instance or Snowflake worker incarnation).
        generator: String,
        /// The ID.
        id: u64,
    },
    /// A token-service event (its `at` is this event's sequence number).
    Token(TokenEvent),
    /// A TCC participant's reply, recorded when it was made durable.
    Participant(ParticipantReply),
    /// A draw's final outcome at the coordinator.
    Draw(DrawEvent),
    /// A node (re)started.
    Boot {
        /// Incarnation number of this node.
        incarnation: u64,
    },
    /// The nemesis did something.
    Fault {
        /// Fault kind.
        kind: String,
        /// Details.
        detail: String,
    },
    /// A phase began.
    Phase(String),
}

/// One event of the history.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Event {
    /// Position in the history.
    pub seq: u64,
    /// Simulated milliseconds since the start of the run.
    pub sim_ms: u64,
    /// The node it happened on (or the nemesis); shared by its events.
    pub node: Arc<str>,
    /// That node's wall clock at the time.
    pub wall_ms: u64,
    /// What happened.
    pub kind: EventKind,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "#{} t={}ms {} (wall {}): {:?}",
            self.seq, self.sim_ms, self.node, self.wall_ms, self.kind
        )
    }
}
