//! Activities and their terms: what a draw costs, how often it wins and when it is open. The
//! operator sets them (`POST /admin/activities` on the server, the scenario's workload in the
//! simulator); a client never does. OWASP's API6 ("unrestricted access to sensitive business
//! flows") is the failure this module exists against: a server that takes the ticket price from
//! the request lets a client win for nothing, and every invariant about *consistency* still holds
//! (money is neither created nor destroyed). [`super::invariants::paid`] states what the business
//! needs instead: every confirmed participation paid its activity's price.
//!
//! Terms are immutable once registered: registering the same terms again is a no-op, registering
//! other terms for a known activity is refused ([`TermsError::Conflict`]). A price change is a new
//! activity; so a confirmed participation can always be judged against the one price it was sold
//! at.
//!
//! Where the terms are enforced:
//!
//! - the draw gate ([`crate::gate::draw_terms`]): an unknown or closed activity, or a body that
//!   names another price, is refused before anything is consumed;
//! - the participants ([`check_branch`]): a Try for an unregistered activity, or a wallet or
//!   participation Try whose amount is not the activity's price, is refused (a coordinator that
//!   was fooled, or a forged service call, cannot charge the wrong amount either).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rows::{AMOUNT_MAX, Refusal};
use super::rules::BranchOp;
use super::{ActivityId, Flaws, Participant, Phase};

/// The largest `win_per_mille`: every draw wins.
pub const WIN_PER_MILLE_MAX: u32 = 1000;

/// Most activities one registry holds (a bound on what the operator route can fill).
pub const ACTIVITIES_MAX: usize = 100_000;

/// An activity's terms, set by the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Terms {
    /// The ticket price in minor units (cents), at most [`AMOUNT_MAX`].
    pub price_minor: u64,
    /// Winning draws per thousand, at most [`WIN_PER_MILLE_MAX`].
    pub win_per_mille: u32,
    /// The first instant draws are accepted, ms since the Unix epoch (inclusive).
    pub opens_at_ms: u64,
    /// The instant draws stop being accepted, ms since the Unix epoch (exclusive).
    pub closes_at_ms: u64,
}

impl Terms {
    /// Terms at `price_minor` with `win_per_mille` odds, open from the epoch on.
    #[must_use]
    pub const fn always_open(price_minor: u64, win_per_mille: u32) -> Self {
        Self {
            price_minor,
            win_per_mille,
            opens_at_ms: 0,
            closes_at_ms: u64::MAX,
        }
    }

    /// Checks the terms on their own.
    ///
    /// # Errors
    /// [`TermsError::PriceTooLarge`], [`TermsError::OddsOutOfRange`],
    /// [`TermsError::EmptyWindow`].
    pub const fn validate(&self) -> Result<(), TermsError> {
        if self.price_minor > AMOUNT_MAX {
            return Err(TermsError::PriceTooLarge {
                price_minor: self.price_minor,
            });
        }
        if self.win_per_mille > WIN_PER_MILLE_MAX {
            return Err(TermsError::OddsOutOfRange {
                win_per_mille: self.win_per_mille,
            });
        }
        if self.opens_at_ms >= self.closes_at_ms {
            return Err(TermsError::EmptyWindow {
                opens_at_ms: self.opens_at_ms,
                closes_at_ms: self.closes_at_ms,
            });
        }
        Ok(())
    }

    /// Whether draws are accepted at `wall_ms`.
    #[must_use]
    pub const fn is_open(&self, wall_ms: u64) -> bool {
        self.opens_at_ms <= wall_ms && wall_ms < self.closes_at_ms
    }

    /// Whether a draw with the server's randomness `roll` (any `u32`) wins under these odds.
    #[must_use]
    pub const fn wins(&self, roll: u32) -> bool {
        roll % WIN_PER_MILLE_MAX < self.win_per_mille
    }
}

/// Why terms were not registered. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error, Serialize, Deserialize)]
pub enum TermsError {
    /// A price above [`AMOUNT_MAX`].
    #[error("price_minor {price_minor} exceeds the maximum {AMOUNT_MAX}")]
    PriceTooLarge {
        /// The price asked for.
        price_minor: u64,
    },
    /// Odds above [`WIN_PER_MILLE_MAX`].
    #[error("win_per_mille {win_per_mille} is above {WIN_PER_MILLE_MAX}")]
    OddsOutOfRange {
        /// The odds asked for.
        win_per_mille: u32,
    },
    /// The activity would never be open.
    #[error("opens_at_ms {opens_at_ms} is not before closes_at_ms {closes_at_ms}")]
    EmptyWindow {
        /// Opening instant.
        opens_at_ms: u64,
        /// Closing instant.
        closes_at_ms: u64,
    },
    /// The activity is registered with other terms (terms never change: register a new
    /// activity instead).
    #[error(
        "activity {activity} is registered with other terms (price_minor {}, win_per_mille {}, open {}..{}); terms never change: register a new activity",
        existing.price_minor, existing.win_per_mille, existing.opens_at_ms, existing.closes_at_ms
    )]
    Conflict {
        /// The activity.
        activity: ActivityId,
        /// Its registered terms.
        existing: Terms,
    },
    /// The registry holds [`ACTIVITIES_MAX`] activities already.
    #[error("the registry is full ({ACTIVITIES_MAX} activities)")]
    Full,
}

/// What a registration did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Registered {
    /// The activity is new.
    Created,
    /// The same terms were registered already: nothing changed.
    Unchanged,
}

/// The registration rule, shared by every store of terms: `new` for `activity`, given the terms
/// already registered (if any) and how many activities the registry holds.
///
/// # Errors
/// The terms are invalid, conflict with the registered ones, or the registry is full.
pub fn register_rule(
    existing: Option<&Terms>,
    activity: ActivityId,
    new: &Terms,
    registered_count: usize,
) -> Result<Registered, TermsError> {
    new.validate()?;
    match existing {
        Some(old) if old == new => Ok(Registered::Unchanged),
        Some(old) => Err(TermsError::Conflict {
            activity,
            existing: *old,
        }),
        None if registered_count >= ACTIVITIES_MAX => Err(TermsError::Full),
        None => Ok(Registered::Created),
    }
}

/// The operator's activities and their terms.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Registry {
    activities: BTreeMap<ActivityId, Terms>,
}

impl Registry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A registry of `activities`, each registered by [`Registry::register`].
    ///
    /// # Errors
    /// The first registration refused.
    pub fn from_entries(
        activities: impl IntoIterator<Item = (ActivityId, Terms)>,
    ) -> Result<Self, TermsError> {
        let mut registry = Self::new();
        for (activity, terms) in activities {
            registry.register(activity, terms)?;
        }
        Ok(registry)
    }

    /// The terms of `activity`, if registered.
    #[must_use]
    pub fn get(&self, activity: ActivityId) -> Option<&Terms> {
        self.activities.get(&activity)
    }

    /// Registers `terms` for `activity` ([`register_rule`]).
    ///
    /// # Errors
    /// As [`register_rule`]; nothing changed.
    pub fn register(
        &mut self,
        activity: ActivityId,
        terms: Terms,
    ) -> Result<Registered, TermsError> {
        let registered = register_rule(
            self.activities.get(&activity),
            activity,
            &terms,
            self.activities.len(),
        )?;
        if registered == Registered::Created {
            self.activities.insert(activity, terms);
        }
        Ok(registered)
    }

    /// Every activity, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (ActivityId, &Terms)> + '_ {
        self.activities.iter().map(|(a, t)| (*a, t))
    }

    /// How many activities are registered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.activities.len()
    }

    /// Whether none is.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.activities.is_empty()
    }

    /// The union of the registries of several processes (a deployment's verifier): an activity
    /// registered in several must have the same terms in each.
    ///
    /// # Errors
    /// [`TermsError::Conflict`] naming the first activity whose terms differ.
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a Self>) -> Result<Self, TermsError> {
        let mut out = Self::new();
        for part in parts {
            for (activity, terms) in part.iter() {
                match out.activities.get(&activity) {
                    Some(known) if known != terms => {
                        return Err(TermsError::Conflict {
                            activity,
                            existing: *known,
                        });
                    }
                    Some(_) => {}
                    None => {
                        out.activities.insert(activity, *terms);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The participants' terms rule: a Try is for a registered activity, and a wallet or
/// participation Try carries exactly the activity's price (the wallet freezes it, the
/// participation record keeps it). Confirm and Cancel follow a Try the fence admitted, and are
/// never refused here (a Cancel must always be able to release what a Try took).
///
/// With [`Flaws::client_price`] (the documented flaw: the price is whatever the request said),
/// the price is not compared.
///
/// # Errors
/// [`Refusal::UnregisteredActivity`], [`Refusal::WrongPrice`]; nothing changes.
pub fn check_branch(op: &BranchOp, terms: Option<&Terms>, flaws: Flaws) -> Result<(), Refusal> {
    if op.phase != Phase::Try {
        return Ok(());
    }
    let draw = &op.draw;
    let Some(terms) = terms else {
        return Err(Refusal::UnregisteredActivity {
            activity: draw.activity,
        });
    };
    let charges = matches!(op.branch, Participant::Wallet | Participant::Participation);
    if charges && !flaws.client_price && draw.price_minor != terms.price_minor {
        return Err(Refusal::WrongPrice {
            activity: draw.activity,
            price_minor: terms.price_minor,
            offered_minor: draw.price_minor,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lottery::{DrawArgs, UserId, Xid};

    fn op(branch: Participant, phase: Phase, price_minor: u64) -> BranchOp {
        BranchOp {
            branch,
            phase,
            draw: DrawArgs {
                xid: Xid(1),
                user: UserId(1),
                activity: ActivityId(7),
                price_minor,
                won: true,
            },
        }
    }

    #[test]
    fn terms_are_validated() {
        assert_eq!(Terms::always_open(10, 100).validate(), Ok(()));
        assert!(matches!(
            Terms::always_open(AMOUNT_MAX + 1, 100).validate(),
            Err(TermsError::PriceTooLarge { .. })
        ));
        assert!(matches!(
            Terms::always_open(10, 1001).validate(),
            Err(TermsError::OddsOutOfRange { .. })
        ));
        let shut = Terms {
            opens_at_ms: 5,
            closes_at_ms: 5,
            ..Terms::always_open(10, 100)
        };
        assert!(matches!(
            shut.validate(),
            Err(TermsError::EmptyWindow { .. })
        ));
        let window = Terms {
            opens_at_ms: 5,
            closes_at_ms: 9,
            ..Terms::always_open(10, 100)
        };
        assert!(!window.is_open(4));
        assert!(window.is_open(5));
        assert!(window.is_open(8));
        assert!(!window.is_open(9));
    }

    #[test]
    fn odds_are_the_terms() {
        let never = Terms::always_open(1, 0);
        let always = Terms::always_open(1, 1000);
        let tenth = Terms::always_open(1, 100);
        for roll in [0, 99, 100, 999, 1000, u32::MAX] {
            assert!(!never.wins(roll));
            assert!(always.wins(roll));
        }
        assert!(tenth.wins(99));
        assert!(!tenth.wins(100));
        assert!(tenth.wins(1099));
    }

    #[test]
    fn terms_never_change_once_registered() {
        let mut r = Registry::new();
        let a = ActivityId(1);
        let terms = Terms::always_open(10, 100);
        assert_eq!(r.register(a, terms), Ok(Registered::Created));
        assert_eq!(r.register(a, terms), Ok(Registered::Unchanged));
        let cheaper = Terms::always_open(0, 100);
        assert_eq!(
            r.register(a, cheaper),
            Err(TermsError::Conflict {
                activity: a,
                existing: terms
            })
        );
        assert_eq!(r.get(a), Some(&terms), "a refusal changes nothing");
        assert!(
            r.register(ActivityId(2), Terms::always_open(10, 2000))
                .is_err()
        );
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn merge_refuses_differing_terms() {
        let one = Registry::from_entries([(ActivityId(1), Terms::always_open(10, 100))]).unwrap();
        let same = one.clone();
        let two = Registry::from_entries([(ActivityId(2), Terms::always_open(5, 100))]).unwrap();
        let merged = Registry::merge([&one, &same, &two]).unwrap();
        assert_eq!(merged.len(), 2);
        let other = Registry::from_entries([(ActivityId(1), Terms::always_open(0, 100))]).unwrap();
        assert!(matches!(
            Registry::merge([&one, &other]),
            Err(TermsError::Conflict { .. })
        ));
    }

    #[test]
    fn a_try_pays_the_registered_price() {
        let terms = Terms::always_open(10, 100);
        let none = Flaws::NONE;
        for branch in [Participant::Wallet, Participant::Participation] {
            assert_eq!(
                check_branch(&op(branch, Phase::Try, 10), Some(&terms), none),
                Ok(())
            );
            assert_eq!(
                check_branch(&op(branch, Phase::Try, 0), Some(&terms), none),
                Err(Refusal::WrongPrice {
                    activity: ActivityId(7),
                    price_minor: 10,
                    offered_minor: 0
                })
            );
            // The flaw: the request's price is taken as it is.
            let flawed = Flaws {
                client_price: true,
                ..Flaws::NONE
            };
            assert_eq!(
                check_branch(&op(branch, Phase::Try, 0), Some(&terms), flawed),
                Ok(())
            );
        }
        // The inventory reserves a unit whatever the price.
        assert_eq!(
            check_branch(
                &op(Participant::Inventory, Phase::Try, 0),
                Some(&terms),
                none
            ),
            Ok(())
        );
        assert_eq!(
            check_branch(&op(Participant::Inventory, Phase::Try, 10), None, none),
            Err(Refusal::UnregisteredActivity {
                activity: ActivityId(7)
            })
        );
        // Confirm and Cancel are never refused by the terms: a Cancel must release a Try.
        for phase in [Phase::Confirm, Phase::Cancel] {
            assert_eq!(
                check_branch(&op(Participant::Wallet, phase, 0), None, none),
                Ok(())
            );
        }
    }
}
