//! The participants' decision logic, in ONE place: pure functions from an operation and the rows
//! it reads (the branch's fence row and its business row) to the reply and the rows to write.
//! (They also count the participant's edge states, [`edges::EDGES`], at the point
//! each situation is decided; counting changes nothing.)
//!
//! Both stores ([`crate::lottery::MemoryStore`], `sut-server`'s `SqliteLotteryStore`) run every
//! participant operation as: read the fence row and the business row, call [`decide`], write
//! what it returns, in one atomic step (one transaction). The fence rules are Seata's
//! ([`super::fence`]); the business rules follow the ID, token and lottery design
//! (docs/sources.md): ch. 4's "freeze first, then pay" (Try-Freeze / Confirm-Transfer /
//! Cancel-Unfreeze) and ch. 1's indivisible "check, decrement, decide" on the stock.
//!
//! [`decide`] takes two views: `checked` (what the decision is based on) and `fresh` (what the
//! write is applied to). On the correct path they are the same read. The two documented flaws
//! that split an operation in two ([`super::FenceMode::CheckThenAct`],
//! [`super::Flaws::two_step_stock`]) pass the view read in an earlier, separate store operation
//! as `checked`; that is the whole difference between correct and flawed code.

use crate::edge::Edges;
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::fence::{FenceMode, FenceStep, fence_step};
use super::rows::{
    AMOUNT_MAX, Account, BranchOutcome, Effect, FenceStatus, ParticipationRow, Quantity, Refusal,
    Stock,
};
use super::{ActivityId, DrawArgs, Flaws, Participant, Phase, UserId};

pub mod edges {
    //! The participant's edge states (see [`crate::edge`]), fence and ledger ones included. They are
    //! counted where the situation is decided: the fence and business rules in
    //! [`super::decide`] (judged on the rows as they are when the write happens, so a flawed
    //! two-step operation that decides on an older read counts the same situation) and the start-up
    //! rebuild in [`crate::lottery::journal::Journaled::new`]. A journal replay does not count them again.
    //! Without a fence ([`crate::lottery::FenceMode::Unfenced`]) no fence row exists, so the fence edge
    //! states cannot be observed.

    use crate::edge::{Edge, Machine};

    /// A Cancel finds no fence row: the empty rollback.
    pub const EMPTY_ROLLBACK: Edge = Edge::new(
        Machine::Participant,
        "participant.empty_rollback",
        "a Cancel overtakes its Try (or the Try was lost): nothing may be undone, and the fence must \
         record `suspended` so that the Try, if it still comes, is refused",
    );
    /// A Try finds its branch cancelled: the hanging Try.
    pub const TRY_AFTER_CANCEL: Edge = Edge::new(
        Machine::Participant,
        "participant.try_after_cancel",
        "a Try arrives after its branch was cancelled (row `suspended` or `rollbacked`): it must be \
         refused, or it freezes money and stock that no Confirm or Cancel will ever release",
    );
    /// A Try finds its own `tried` (or `committed`) row: a redelivered Try.
    pub const DUPLICATE_TRY: Edge = Edge::new(
        Machine::Participant,
        "participant.duplicate_try",
        "a Try is delivered again after it took effect: it must be refused without freezing twice, \
         and the refusal must tell the coordinator that the first one landed",
    );
    /// A Confirm or Cancel finds its own result: a repeated verdict.
    pub const REPEATED_VERDICT: Edge = Edge::new(
        Machine::Participant,
        "participant.repeated_verdict",
        "a Confirm or Cancel arrives again after it took effect (retry, duplicate, restarted \
         coordinator): it must be an idempotent no-op, or money is collected or refunded twice",
    );
    /// An inventory Try finds exactly one unit left.
    pub const LAST_UNIT: Edge = Edge::new(
        Machine::Participant,
        "participant.last_unit",
        "a winning Try reserves the last unit of stock: check and decrement must be one step, or two \
         concurrent Tries both take it (over-issue)",
    );
    /// An inventory Try finds no stock.
    pub const OUT_OF_STOCK: Edge = Edge::new(
        Machine::Participant,
        "participant.out_of_stock",
        "a winning Try finds the available stock at exactly zero: it must be refused (the draw \
         cancels), never decremented below zero",
    );
    /// A wallet Try freezes the whole balance.
    pub const BALANCE_EXACT: Edge = Edge::new(
        Machine::Participant,
        "participant.balance_exact",
        "a wallet Try finds the balance exactly equal to the price: the freeze must succeed and leave \
         zero, the bound of the `balance >= price` check",
    );
    /// A participation Try finds the user's record of another draw.
    pub const ALREADY_PARTICIPATED: Edge = Edge::new(
        Machine::Participant,
        "participant.already_participated",
        "a Try records a participation the user already holds for another draw in the same activity \
         (a client retry under a new xid): the unique key must refuse it",
    );
    /// A store rebuilt at start-up holds reservations awaiting their verdict.
    pub const REBUILT_IN_DOUBT: Edge = Edge::new(
        Machine::Participant,
        "participant.rebuilt_in_doubt",
        "a participant restarts and rebuilds its ledger from its journal while reservations await \
         their verdict (frozen money, reserved stock, unconfirmed participations, `tried` rows): \
         the rebuild must keep them for the Confirm or Cancel still to come",
    );

    /// This machine's edge states (see [`crate::edge`]).
    pub const EDGES: &[Edge] = &[
        EMPTY_ROLLBACK,
        TRY_AFTER_CANCEL,
        DUPLICATE_TRY,
        REPEATED_VERDICT,
        LAST_UNIT,
        OUT_OF_STOCK,
        BALANCE_EXACT,
        ALREADY_PARTICIPATED,
        REBUILT_IN_DOUBT,
    ];
}

/// One participant operation: a phase of a draw's branch on one participant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BranchOp {
    /// Which participant (and so which branch of the draw).
    pub branch: Participant,
    /// Try, Confirm or Cancel.
    pub phase: Phase,
    /// The draw.
    pub draw: DrawArgs,
}

/// The business row an operation reads and writes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BusinessRow {
    /// The user's account and the house's collected total (Confirm moves frozen money there).
    Wallet {
        /// The user's account, if opened.
        account: Option<Account>,
        /// Ticket money collected by the house so far.
        collected_minor: u64,
    },
    /// The activity's prize stock, if any was added.
    Inventory {
        /// The stock row.
        stock: Option<Stock>,
    },
    /// The (user, activity) participation record, if any.
    Participation {
        /// The record; `None` means absent (and, as a write, delete).
        row: Option<ParticipationRow>,
    },
}

/// What an operation reads: its fence row and its business row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BranchView {
    /// The `(xid, branch)` fence row.
    pub fence: Option<FenceStatus>,
    /// The business row.
    pub business: BusinessRow,
}

/// What [`decide`] returns: the reply and the rows to write (all or nothing).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BranchDecision {
    /// The reply.
    pub outcome: BranchOutcome,
    /// The new fence row, if it changes (insert or update).
    pub fence_write: Option<FenceStatus>,
    /// The new business row, if it changes.
    pub business_write: Option<BusinessRow>,
}

impl BranchDecision {
    fn refuse(refusal: Refusal) -> Self {
        Self {
            outcome: Err(refusal),
            fence_write: None,
            business_write: None,
        }
    }
}

/// The fence's edge states, judged on the row as it is when the write happens (`fresh`): a
/// flawed check-then-act decides on an older row, but the situation is the same.
fn fence_edges(phase: Phase, row: Option<FenceStatus>, edges_reached: &mut Edges) {
    use FenceStatus::{Committed, Rollbacked, Suspended, Tried};
    let edge = match (phase, row) {
        (Phase::Cancel, None) => &edges::EMPTY_ROLLBACK,
        (Phase::Try, Some(Rollbacked | Suspended)) => &edges::TRY_AFTER_CANCEL,
        (Phase::Try, Some(Tried | Committed)) => &edges::DUPLICATE_TRY,
        (Phase::Confirm, Some(Committed)) | (Phase::Cancel, Some(Rollbacked | Suspended)) => {
            &edges::REPEATED_VERDICT
        }
        _ => return,
    };
    edges_reached.reach(edge);
}

/// THE participant decision. `checked` is what the decision is based on, `fresh` what the write
/// is applied to; the correct path passes the same view twice (one read in one transaction).
///
/// - [`FenceMode::Atomic`]: the fence rules on `fresh.fence`, then the business effect.
/// - [`FenceMode::Unfenced`] (flaw): the business effect, always; the fence is neither read nor
///   written.
/// - [`FenceMode::CheckThenAct`] (flaw): the fence rules on `checked.fence` (read earlier), the
///   result overwrites whatever row is there now.
/// - `two_step_stock` (flaw): an inventory Try checks `checked`'s available stock and writes
///   that value minus one (a lost update).
#[must_use]
pub fn decide(
    op: &BranchOp,
    checked: &BranchView,
    fresh: &BranchView,
    flaws: Flaws,
    edges_reached: &mut Edges,
) -> BranchDecision {
    if op.draw.price_minor > AMOUNT_MAX {
        return BranchDecision::refuse(Refusal::AmountTooLarge {
            amount_minor: op.draw.price_minor,
        });
    }
    if !op.draw.has_branch(op.branch) {
        return BranchDecision::refuse(Refusal::NotInDraw { branch: op.branch });
    }
    if !view_matches(op.branch, &checked.business) || !view_matches(op.branch, &fresh.business) {
        return BranchDecision::refuse(Refusal::MalformedView { branch: op.branch });
    }
    let fence_write = match flaws.fence {
        FenceMode::Unfenced => None,
        FenceMode::Atomic | FenceMode::CheckThenAct => {
            fence_edges(op.phase, fresh.fence, edges_reached);
            let row = if flaws.fence == FenceMode::Atomic {
                fresh.fence
            } else {
                checked.fence
            };
            match fence_step(op.phase, row) {
                FenceStep::Refuse(refusal) => return BranchDecision::refuse(refusal),
                FenceStep::NoOp { effect, write } => {
                    return BranchDecision {
                        outcome: Ok(effect),
                        fence_write: write,
                        business_write: None,
                    };
                }
                FenceStep::Proceed { write } => Some(write),
            }
        }
    };
    match business(
        op,
        &checked.business,
        &fresh.business,
        flaws.two_step_stock,
        edges_reached,
    ) {
        Ok(row) => BranchDecision {
            outcome: Ok(Effect::Applied),
            fence_write,
            business_write: Some(row),
        },
        // The business refused: the whole transaction rolls back, the fence row included (Seata
        // writes the fence row in the business's local transaction).
        Err(refusal) => BranchDecision::refuse(refusal),
    }
}

/// Setup rule: open `user`'s account with `balance_minor`, given the existing account (if
/// any) and the money minted so far. Returns the account and the new minted total.
///
/// # Errors
/// [`StoreError::AccountExists`], [`StoreError::AmountTooLarge`] (the balance or the minted
/// total would exceed [`AMOUNT_MAX`]).
pub fn open_account(
    existing: Option<Account>,
    minted_minor: u64,
    user: UserId,
    balance_minor: u64,
) -> Result<(Account, u64), StoreError> {
    if existing.is_some() {
        return Err(StoreError::AccountExists { user });
    }
    let minted = minted_minor
        .checked_add(balance_minor)
        .filter(|m| *m <= AMOUNT_MAX)
        .ok_or(StoreError::AmountTooLarge {
            amount_minor: balance_minor,
        })?;
    Ok((
        Account {
            balance_minor,
            frozen_minor: 0,
        },
        minted,
    ))
}

/// Setup rule: add `units` of prize stock to `activity` (creating its row if needed).
///
/// # Errors
/// [`StoreError::StockTooLarge`] when the total would exceed [`AMOUNT_MAX`].
pub fn add_stock(
    existing: Option<Stock>,
    activity: ActivityId,
    units: u64,
) -> Result<Stock, StoreError> {
    let mut stock = existing.unwrap_or_default();
    let too_large = StoreError::StockTooLarge { activity };
    stock.total = add(stock.total, units, Quantity::Available).map_err(|_| too_large.clone())?;
    stock.available = add(stock.available, units, Quantity::Available).map_err(|_| too_large)?;
    Ok(stock)
}

const fn view_matches(branch: Participant, row: &BusinessRow) -> bool {
    matches!(
        (branch, row),
        (Participant::Wallet, BusinessRow::Wallet { .. })
            | (Participant::Inventory, BusinessRow::Inventory { .. })
            | (
                Participant::Participation,
                BusinessRow::Participation { .. }
            )
    )
}

fn add(value: u64, delta: u64, quantity: Quantity) -> Result<u64, Refusal> {
    match value.checked_add(delta) {
        Some(sum) if sum <= AMOUNT_MAX => Ok(sum),
        _ => Err(Refusal::Overflow { quantity }),
    }
}

fn sub(value: u64, delta: u64, quantity: Quantity) -> Result<u64, Refusal> {
    value
        .checked_sub(delta)
        .ok_or(Refusal::Underflow { quantity })
}

/// The business effect of `op` on `fresh` (see [`decide`] for `checked`).
fn business(
    op: &BranchOp,
    checked: &BusinessRow,
    fresh: &BusinessRow,
    two_step_stock: bool,
    edges_reached: &mut Edges,
) -> Result<BusinessRow, Refusal> {
    match fresh {
        BusinessRow::Wallet {
            account,
            collected_minor,
        } => wallet_effect(op, *account, *collected_minor, edges_reached),
        BusinessRow::Inventory { stock } => {
            inventory_effect(op, checked, *stock, two_step_stock, edges_reached)
        }
        BusinessRow::Participation { row } => participation_effect(op, row.as_ref(), edges_reached),
    }
}

/// The wallet branch: freeze the price, transfer it to the house, or unfreeze it.
fn wallet_effect(
    op: &BranchOp,
    account: Option<Account>,
    collected_minor: u64,
    edges_reached: &mut Edges,
) -> Result<BusinessRow, Refusal> {
    let draw = &op.draw;
    let price = draw.price_minor;
    let Some(mut account) = account else {
        return Err(Refusal::UnknownAccount { user: draw.user });
    };
    let mut collected_minor = collected_minor;
    match op.phase {
        // Try-Freeze: `UPDATE .. SET balance = balance - ?, frozen = frozen + ? WHERE
        // balance >= ?` (ID, token and lottery design §4.1).
        Phase::Try => {
            edges_reached.reach_if(account.balance_minor == price, &edges::BALANCE_EXACT);
            if account.balance_minor < price {
                return Err(Refusal::InsufficientBalance {
                    user: draw.user,
                    balance_minor: account.balance_minor,
                    price_minor: price,
                });
            }
            account.balance_minor -= price;
            account.frozen_minor = add(account.frozen_minor, price, Quantity::Frozen)?;
        }
        // Confirm-Transfer: the frozen ticket money goes to the house.
        Phase::Confirm => {
            account.frozen_minor = sub(account.frozen_minor, price, Quantity::Frozen)?;
            collected_minor = add(collected_minor, price, Quantity::Collected)?;
        }
        // Cancel-Unfreeze.
        Phase::Cancel => {
            account.frozen_minor = sub(account.frozen_minor, price, Quantity::Frozen)?;
            account.balance_minor = add(account.balance_minor, price, Quantity::Balance)?;
        }
    }
    Ok(BusinessRow::Wallet {
        account: Some(account),
        collected_minor,
    })
}

/// The inventory branch: reserve a prize unit, issue it, or put it back.
fn inventory_effect(
    op: &BranchOp,
    checked: &BusinessRow,
    stock: Option<Stock>,
    two_step_stock: bool,
    edges_reached: &mut Edges,
) -> Result<BusinessRow, Refusal> {
    let draw = &op.draw;
    let Some(mut stock) = stock else {
        return Err(Refusal::UnknownActivity {
            activity: draw.activity,
        });
    };
    match op.phase {
        Phase::Try => {
            // The situation is the stock as it is now, whatever the (flawed) check read.
            edges_reached.reach_if(stock.available == 1, &edges::LAST_UNIT);
            edges_reached.reach_if(stock.available == 0, &edges::OUT_OF_STOCK);
            // Correct: check and decrement on the same read (ID, token and lottery
            // design ch. 1). Flawed: check what an earlier operation read and write
            // that value minus one.
            let seen = if two_step_stock {
                match checked {
                    BusinessRow::Inventory { stock: Some(seen) } => seen.available,
                    _ => {
                        return Err(Refusal::UnknownActivity {
                            activity: draw.activity,
                        });
                    }
                }
            } else {
                stock.available
            };
            if seen == 0 {
                return Err(Refusal::OutOfStock {
                    activity: draw.activity,
                });
            }
            stock.available = seen - 1;
            stock.reserved = add(stock.reserved, 1, Quantity::Reserved)?;
        }
        Phase::Confirm => {
            stock.reserved = sub(stock.reserved, 1, Quantity::Reserved)?;
            stock.issued = add(stock.issued, 1, Quantity::Issued)?;
        }
        Phase::Cancel => {
            stock.reserved = sub(stock.reserved, 1, Quantity::Reserved)?;
            stock.available = add(stock.available, 1, Quantity::Available)?;
        }
    }
    Ok(BusinessRow::Inventory { stock: Some(stock) })
}

/// The participation branch: record the draw under (user, activity), confirm it, or erase it.
fn participation_effect(
    op: &BranchOp,
    row: Option<&ParticipationRow>,
    edges_reached: &mut Edges,
) -> Result<BusinessRow, Refusal> {
    let draw = &op.draw;
    let not_participating = Refusal::NotParticipating {
        xid: draw.xid,
        user: draw.user,
        activity: draw.activity,
    };
    let row = match (op.phase, row) {
        // `INSERT` under the unique key (user, activity) (ID, token and lottery
        // design ch. 1: 幂等表).
        (Phase::Try, Some(holder)) => {
            edges_reached.reach_if(holder.xid != draw.xid, &edges::ALREADY_PARTICIPATED);
            return Err(Refusal::AlreadyParticipated {
                user: draw.user,
                activity: draw.activity,
                holder: holder.xid,
            });
        }
        (Phase::Try, None) => Some(ParticipationRow {
            xid: draw.xid,
            price_minor: draw.price_minor,
            won: draw.won,
            confirmed: false,
        }),
        (Phase::Confirm, Some(held)) if held.xid == draw.xid => Some(ParticipationRow {
            confirmed: true,
            ..*held
        }),
        // `DELETE .. WHERE xid = ?`: a flawed (unfenced) Cancel after Confirm erases a
        // confirmed record; the fence makes that unreachable.
        (Phase::Cancel, Some(held)) if held.xid == draw.xid => None,
        (Phase::Confirm | Phase::Cancel, _) => return Err(not_participating),
    };
    Ok(BusinessRow::Participation { row })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lottery::Xid;

    fn draw(won: bool) -> DrawArgs {
        DrawArgs {
            xid: Xid(7),
            user: UserId(1),
            activity: ActivityId(2),
            price_minor: 10,
            won,
        }
    }

    fn wallet_view(fence: Option<FenceStatus>, balance: u64, frozen: u64) -> BranchView {
        BranchView {
            fence,
            business: BusinessRow::Wallet {
                account: Some(Account {
                    balance_minor: balance,
                    frozen_minor: frozen,
                }),
                collected_minor: 0,
            },
        }
    }

    #[test]
    fn try_freezes_and_records_tried() {
        let op = BranchOp {
            branch: Participant::Wallet,
            phase: Phase::Try,
            draw: draw(false),
        };
        let v = wallet_view(None, 100, 0);
        let d = decide(&op, &v, &v, Flaws::NONE, &mut Edges::new());
        assert_eq!(d.outcome, Ok(Effect::Applied));
        assert_eq!(d.fence_write, Some(FenceStatus::Tried));
        assert_eq!(
            d.business_write,
            Some(BusinessRow::Wallet {
                account: Some(Account {
                    balance_minor: 90,
                    frozen_minor: 10
                }),
                collected_minor: 0
            })
        );
    }

    #[test]
    fn business_refusal_writes_nothing_not_even_the_fence() {
        let op = BranchOp {
            branch: Participant::Wallet,
            phase: Phase::Try,
            draw: draw(false),
        };
        let v = wallet_view(None, 5, 0);
        let d = decide(&op, &v, &v, Flaws::NONE, &mut Edges::new());
        assert!(matches!(
            d.outcome,
            Err(Refusal::InsufficientBalance { .. })
        ));
        assert_eq!(d.fence_write, None);
        assert_eq!(d.business_write, None);
    }

    #[test]
    fn inventory_branch_of_a_losing_draw_is_refused() {
        let op = BranchOp {
            branch: Participant::Inventory,
            phase: Phase::Try,
            draw: draw(false),
        };
        let v = BranchView {
            fence: None,
            business: BusinessRow::Inventory { stock: None },
        };
        assert_eq!(
            decide(&op, &v, &v, Flaws::NONE, &mut Edges::new()).outcome,
            Err(Refusal::NotInDraw {
                branch: Participant::Inventory
            })
        );
    }

    #[test]
    fn too_large_price_and_malformed_view_are_refused() {
        let mut big = draw(false);
        big.price_minor = AMOUNT_MAX + 1;
        let op = BranchOp {
            branch: Participant::Wallet,
            phase: Phase::Try,
            draw: big,
        };
        let v = wallet_view(None, 100, 0);
        assert!(matches!(
            decide(&op, &v, &v, Flaws::NONE, &mut Edges::new()).outcome,
            Err(Refusal::AmountTooLarge { .. })
        ));
        let op = BranchOp {
            branch: Participant::Participation,
            phase: Phase::Try,
            draw: draw(false),
        };
        assert!(matches!(
            decide(&op, &v, &v, Flaws::NONE, &mut Edges::new()).outcome,
            Err(Refusal::MalformedView { .. })
        ));
    }

    #[test]
    fn overflow_is_refused_not_wrapped() {
        let op = BranchOp {
            branch: Participant::Wallet,
            phase: Phase::Cancel,
            draw: draw(false),
        };
        let v = wallet_view(Some(FenceStatus::Tried), AMOUNT_MAX, 10);
        assert_eq!(
            decide(&op, &v, &v, Flaws::NONE, &mut Edges::new()).outcome,
            Err(Refusal::Overflow {
                quantity: Quantity::Balance
            })
        );
    }
}
