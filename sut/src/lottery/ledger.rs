//! The lottery's state as plain ordered data: wallets, the house's collected total, prize
//! stock, participation records, fence rows and the coordinator log. A [`Ledger`] is what a
//! store snapshot returns, what the `lottery.*` checkers read, and (wrapped) the in-memory
//! store itself. Snapshots of stores on separate nodes combine with [`Ledger::merge`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::log::CoordLog;
use super::rows::{AMOUNT_MAX, Account, FenceStatus, ParticipationRow, Stock};
use super::rules::{self, BranchDecision, BranchOp, BranchView, BusinessRow};
use super::{ActivityId, Participant, UserId, Xid};

/// Why two snapshots cannot be merged.
#[derive(Clone, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum MergeError {
    /// The same row appears in two parts.
    #[error("two snapshots both hold the row {what}")]
    Overlap {
        /// Which row.
        what: String,
    },
    /// A total exceeds [`AMOUNT_MAX`].
    #[error("merged totals exceed the maximum amount")]
    Overflow,
}

/// The whole lottery state (or one store's part of it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Ledger {
    /// Wallets by user.
    pub accounts: BTreeMap<UserId, Account>,
    /// Total money ever put into accounts (the conservation target).
    pub minted_minor: u64,
    /// Ticket money collected by the house from confirmed draws.
    pub collected_minor: u64,
    /// Prize stock by activity.
    pub stock: BTreeMap<ActivityId, Stock>,
    /// Participation records by (user, activity).
    #[serde(with = "pairs")]
    pub participations: BTreeMap<(UserId, ActivityId), ParticipationRow>,
    /// Fence rows by (xid, branch).
    #[serde(with = "pairs")]
    pub fences: BTreeMap<(Xid, Participant), FenceStatus>,
    /// The coordinator log.
    pub coord_log: CoordLog,
}

/// A map with composite keys serialized as a list of `[key, value]` pairs, so that a ledger
/// goes through JSON (whose object keys are strings only).
mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<K: Serialize, V: Serialize, S: Serializer>(
        map: &BTreeMap<K, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(map.iter())
    }

    pub fn deserialize<'de, K, V, D>(deserializer: D) -> Result<BTreeMap<K, V>, D::Error>
    where
        K: Deserialize<'de> + Ord,
        V: Deserialize<'de>,
        D: Deserializer<'de>,
    {
        Ok(Vec::<(K, V)>::deserialize(deserializer)?
            .into_iter()
            .collect())
    }
}

impl Ledger {
    /// What `op` reads: its fence row and its business row.
    #[must_use]
    pub fn view(&self, op: &BranchOp) -> BranchView {
        let d = &op.draw;
        let business = match op.branch {
            Participant::Wallet => BusinessRow::Wallet {
                account: self.accounts.get(&d.user).copied(),
                collected_minor: self.collected_minor,
            },
            Participant::Inventory => BusinessRow::Inventory {
                stock: self.stock.get(&d.activity).copied(),
            },
            Participant::Participation => BusinessRow::Participation {
                row: self.participations.get(&(d.user, d.activity)).copied(),
            },
        };
        BranchView {
            fence: self.fences.get(&(d.xid, op.branch)).copied(),
            business,
        }
    }

    /// Writes what [`rules::decide`] returned for `op`.
    pub fn write(&mut self, op: &BranchOp, decision: &BranchDecision) {
        let d = &op.draw;
        if let Some(status) = decision.fence_write {
            self.fences.insert((d.xid, op.branch), status);
        }
        match &decision.business_write {
            None => {}
            Some(BusinessRow::Wallet {
                account,
                collected_minor,
            }) => {
                if let Some(account) = account {
                    self.accounts.insert(d.user, *account);
                }
                self.collected_minor = *collected_minor;
            }
            Some(BusinessRow::Inventory { stock: Some(stock) }) => {
                self.stock.insert(d.activity, *stock);
            }
            Some(BusinessRow::Inventory { stock: None }) => {}
            Some(BusinessRow::Participation { row }) => match row {
                Some(row) => {
                    self.participations.insert((d.user, d.activity), *row);
                }
                None => {
                    self.participations.remove(&(d.user, d.activity));
                }
            },
        }
    }

    /// Opens an account with `balance_minor` (see [`rules::open_account`]).
    ///
    /// # Errors
    /// As [`rules::open_account`].
    pub fn open_account(&mut self, user: UserId, balance_minor: u64) -> Result<(), StoreError> {
        let (account, minted) = rules::open_account(
            self.accounts.get(&user).copied(),
            self.minted_minor,
            user,
            balance_minor,
        )?;
        self.accounts.insert(user, account);
        self.minted_minor = minted;
        Ok(())
    }

    /// Adds `units` of prize stock to `activity` (see [`rules::add_stock`]).
    ///
    /// # Errors
    /// As [`rules::add_stock`].
    pub fn add_stock(&mut self, activity: ActivityId, units: u64) -> Result<(), StoreError> {
        let stock = rules::add_stock(self.stock.get(&activity).copied(), activity, units)?;
        self.stock.insert(activity, stock);
        Ok(())
    }

    /// Combines snapshots of stores that hold disjoint parts of the state (e.g. one node per
    /// participant). Amount totals add up; any row held twice is an error.
    ///
    /// # Errors
    /// [`MergeError`] on overlapping rows or overflowing totals.
    pub fn merge<'a>(parts: impl IntoIterator<Item = &'a Self>) -> Result<Self, MergeError> {
        fn put<K: Ord + Copy + std::fmt::Debug, V: Copy>(
            into: &mut BTreeMap<K, V>,
            from: &BTreeMap<K, V>,
        ) -> Result<(), MergeError> {
            for (k, v) in from {
                if into.insert(*k, *v).is_some() {
                    return Err(MergeError::Overlap {
                        what: format!("{k:?}"),
                    });
                }
            }
            Ok(())
        }
        let mut out = Self::default();
        for part in parts {
            put(&mut out.accounts, &part.accounts)?;
            put(&mut out.stock, &part.stock)?;
            put(&mut out.participations, &part.participations)?;
            put(&mut out.fences, &part.fences)?;
            put(&mut out.coord_log.records, &part.coord_log.records)?;
            out.minted_minor = out
                .minted_minor
                .checked_add(part.minted_minor)
                .filter(|m| *m <= AMOUNT_MAX)
                .ok_or(MergeError::Overflow)?;
            out.collected_minor = out
                .collected_minor
                .checked_add(part.collected_minor)
                .filter(|m| *m <= AMOUNT_MAX)
                .ok_or(MergeError::Overflow)?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_goes_through_json() {
        let mut l = Ledger::default();
        l.fences
            .insert((Xid(7), Participant::Wallet), FenceStatus::Tried);
        l.participations.insert(
            (UserId(1), ActivityId(2)),
            ParticipationRow {
                xid: Xid(7),
                price_minor: 5,
                won: true,
                confirmed: false,
            },
        );
        let text = serde_json::to_string(&l).expect("a ledger serializes to JSON");
        let back: Ledger = serde_json::from_str(&text).expect("and back");
        assert_eq!(back, l);
    }

    #[test]
    fn merge_adds_totals_and_refuses_overlap() {
        let mut a = Ledger::default();
        a.open_account(UserId(1), 10).unwrap();
        let mut b = Ledger::default();
        b.open_account(UserId(2), 5).unwrap();
        b.add_stock(ActivityId(1), 3).unwrap();
        let m = Ledger::merge([&a, &b]).unwrap();
        assert_eq!(m.minted_minor, 15);
        assert_eq!(m.accounts.len(), 2);
        assert_eq!(m.stock[&ActivityId(1)].total, 3);
        assert!(matches!(
            Ledger::merge([&a, &a]),
            Err(MergeError::Overlap { .. })
        ));
    }
}
