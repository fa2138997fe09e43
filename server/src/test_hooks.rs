//! Test hooks, compiled only with the `test-hooks` feature (`sut-server`'s own tests turn it
//! on through their dev-dependency on the crate): never part of a production build. Without the
//! feature each hook is an empty stand-in that does nothing.

#[cfg(feature = "test-hooks")]
pub use hooks::{LoseMessages, ParticipantFaults};

#[cfg(feature = "test-hooks")]
mod hooks {
    use sut::lottery::{Participant, Phase};

    /// Test hook: the participants run in this process, so a participant that fails or never
    /// answers is simulated by losing the coordinator's messages to it. Each rule loses the
    /// messages of one phase to one branch, `times` times (`None`: always). Empty by default; the
    /// server logs loudly when a rule is set.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct ParticipantFaults {
        /// The rules, first match wins.
        pub rules: Vec<LoseMessages>,
    }

    /// One [`ParticipantFaults`] rule.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct LoseMessages {
        /// The branch whose messages are lost.
        pub branch: Participant,
        /// The phase.
        pub phase: Phase,
        /// How many messages are still to lose (`None`: every one).
        pub times: Option<u32>,
    }

    impl ParticipantFaults {
        /// Whether the message of `phase` to `branch` is lost (and counts it).
        pub(crate) fn lose(&mut self, branch: Participant, phase: Phase) -> bool {
            let Some(rule) = self
                .rules
                .iter_mut()
                .find(|r| r.branch == branch && r.phase == phase && r.times != Some(0))
            else {
                return false;
            };
            if let Some(left) = rule.times.as_mut() {
                *left -= 1;
            }
            true
        }
    }
}

/// Without the `test-hooks` feature: no message is ever lost (and no rule can be given).
#[cfg(not(feature = "test-hooks"))]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParticipantFaults {
    _none: (),
}

#[cfg(not(feature = "test-hooks"))]
impl ParticipantFaults {
    /// Never.
    #[allow(clippy::unused_self)]
    pub(crate) const fn lose(
        &mut self,
        _: sut::lottery::Participant,
        _: sut::lottery::Phase,
    ) -> bool {
        false
    }
}
