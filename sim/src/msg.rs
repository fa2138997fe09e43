//! What travels between nodes: the messages of the simulated protocols.

use sut::id_store::{StoreCall, StoreReply};
use sut::lottery::{ParticipantMsg, ParticipantReply};

use crate::history::{Op, Outcome};

/// Everything that travels between nodes.
#[derive(Clone, Debug)]
pub enum Msg {
    /// ID node → database: perform a store call.
    Store {
        /// Request id (matches the reply).
        req: u64,
        /// The call.
        call: StoreCall,
    },
    /// Database → ID node.
    StoreReply {
        /// Request id.
        req: u64,
        /// The answer.
        reply: StoreReply,
    },
    /// Client → service.
    Request {
        /// Per-client operation id.
        op_id: u64,
        /// The operation.
        op: Op,
    },
    /// Service → client.
    Response {
        /// Per-client operation id.
        op_id: u64,
        /// The outcome.
        outcome: Outcome,
    },
    /// Coordinator → participant.
    Tcc(sut::lottery::Participant, ParticipantMsg),
    /// Participant → coordinator.
    TccReply(ParticipantReply),
}
