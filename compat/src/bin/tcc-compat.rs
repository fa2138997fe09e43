//! `tcc-compat`: TEST ONLY. A small TCC participant written the way Seata's TCC fence is used,
//! so that `scenario tcc` can be shown catching a real bug class in a participant that is not
//! ours (docs/own-service.md). It serves the black-box contract (`POST /admin/activities`,
//! `POST /admin/accounts`, `POST /admin/stock`, `POST /tcc/branch`, `GET /ledger`) over two
//! SQLite files:
//!
//! - the participant's own database, with Seata's fence table (`tcc_fence_log(xid, branch,
//!   status)`, status 1 tried, 2 committed, 3 rollbacked, 4 suspended) written in the same local
//!   transaction as each branch's business, as `TCCFenceHandler` does: a Try inserts status 1 (a
//!   duplicate refuses); a Confirm with no row refuses; a Cancel with no row inserts status 4 (an
//!   empty rollback, which also blocks a late Try);
//! - a second file standing for the payment service the wallet calls: a freeze there is
//!   committed at once, outside the participant's transaction.
//!
//! The wallet's Try freezes the price at the payment service, then records the ticket locally
//! (one open ticket per user and activity). A Try of an activity the operator did not register,
//! or at another price than its registered one, is refused before anything is touched. When the local step fails, the local transaction
//! rolls back, the fence row with it.
//!
//! `--no-registry`: the participant as Seata's and DTM's samples are written, with no price list
//! of its own. `POST /admin/activities` is not served (404) and a Try charges the amount its
//! coordinator sends; `scenario tcc` then judges every promise but the price.
//!
//! `--planted-fence-rollback` (the mechanism of Seata issues #5256 and #6374): the Try then
//! answers its failure and leaves the freeze; the Cancel that follows finds no fence row, records
//! an empty rollback and skips the compensation: the money stays frozen for a draw that never
//! happened. Without it, the failed Try undoes its own freeze before it answers.
//!
//! Every request runs alone (one lock) and both files sync every commit, so the participant is
//! correct under restarts between messages. Prints `listening on ADDR` when it serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use clap::Parser;
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use serde::Deserialize;
use serde_json::{Value, json};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "tcc-compat",
    about = "TEST ONLY: a TCC participant with Seata's fence table, over two SQLite files"
)]
struct Args {
    /// The participant's database.
    #[arg(long)]
    db: PathBuf,
    /// The payment service's database (the wallet's money).
    #[arg(long)]
    payments: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// File holding the admin secret (or the environment variable SUT_ADMIN_TOKEN).
    #[arg(long)]
    admin_token_file: Option<PathBuf>,
    /// Plant Seata #5256/#6374: a failed Try leaves its freeze at the payment service.
    #[arg(long)]
    planted_fence_rollback: bool,
    /// Keep no price list: no `POST /admin/activities`, a Try charges what its coordinator says.
    #[arg(long)]
    no_registry: bool,
}

/// The participant's state: both connections, behind one lock.
struct Inner {
    db: Connection,
    payments: Connection,
    planted: bool,
    /// Whether Tries are held to the operator's price list.
    registry: bool,
}

struct App {
    inner: Mutex<Inner>,
    secret: String,
}

type Shared = Arc<App>;

fn main() -> ExitCode {
    match serve(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tcc-compat: {e}");
            ExitCode::from(1)
        }
    }
}

fn serve(args: Args) -> Result<(), String> {
    let secret = match &args.admin_token_file {
        Some(p) => std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        None => std::env::var("SUT_ADMIN_TOKEN")
            .map_err(|_| "give --admin-token-file or SUT_ADMIN_TOKEN".to_owned())?,
    };
    let db = open(
        &args.db,
        "CREATE TABLE IF NOT EXISTS accounts (user INTEGER PRIMARY KEY);
         CREATE TABLE IF NOT EXISTS activities (activity INTEGER PRIMARY KEY,
           price_minor INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS stock (activity INTEGER PRIMARY KEY, total INTEGER NOT NULL,
           available INTEGER NOT NULL, reserved INTEGER NOT NULL, issued INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS tickets (user INTEGER NOT NULL, activity INTEGER NOT NULL,
           xid INTEGER NOT NULL UNIQUE, PRIMARY KEY (user, activity));
         CREATE TABLE IF NOT EXISTS participation (user INTEGER NOT NULL,
           activity INTEGER NOT NULL, xid INTEGER NOT NULL, confirmed INTEGER NOT NULL,
           PRIMARY KEY (user, activity));
         CREATE TABLE IF NOT EXISTS collected (id INTEGER PRIMARY KEY, minor INTEGER NOT NULL);
         INSERT OR IGNORE INTO collected VALUES (1, 0);
         CREATE TABLE IF NOT EXISTS tcc_fence_log (xid INTEGER NOT NULL, branch TEXT NOT NULL,
           status INTEGER NOT NULL, PRIMARY KEY (xid, branch));",
    )?;
    let payments = open(
        &args.payments,
        "CREATE TABLE IF NOT EXISTS wallets (user INTEGER PRIMARY KEY,
           balance INTEGER NOT NULL, frozen INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS freezes (xid INTEGER PRIMARY KEY, user INTEGER NOT NULL,
           amount INTEGER NOT NULL);",
    )?;
    let app: Shared = Arc::new(App {
        inner: Mutex::new(Inner {
            db,
            payments,
            planted: args.planted_fence_rollback,
            registry: !args.no_registry,
        }),
        secret: secret.trim().to_owned(),
    });
    let router = if args.no_registry {
        Router::new()
    } else {
        Router::new().route("/admin/activities", post(activities))
    };
    let router = router
        .route("/admin/accounts", post(accounts))
        .route("/admin/stock", post(stock))
        .route("/tcc/branch", post(branch))
        .route("/ledger", get(ledger))
        .with_state(app);
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("listen on {}: {e}", args.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        println!("listening on {addr}");
        axum::serve(listener, router)
            .await
            .map_err(|e| e.to_string())
    })
}

fn open(path: &std::path::Path, schema: &str) -> Result<Connection, String> {
    let failed = |e: rusqlite::Error| format!("{}: {e}", path.display());
    let db = Connection::open(path).map_err(failed)?;
    db.busy_timeout(Duration::from_secs(10)).map_err(failed)?;
    db.pragma_update(None, "journal_mode", "WAL")
        .map_err(failed)?;
    db.pragma_update(None, "synchronous", "FULL")
        .map_err(failed)?;
    db.execute_batch(schema).map_err(failed)?;
    Ok(db)
}

/// An error answer: status and message.
type Failure = (StatusCode, Json<Value>);

fn fail(status: StatusCode, message: impl std::fmt::Display) -> Failure {
    (status, Json(json!({ "error": message.to_string() })))
}

fn db_error(e: &rusqlite::Error) -> Failure {
    fail(StatusCode::SERVICE_UNAVAILABLE, format!("database: {e}"))
}

fn authorized(app: &App, headers: &HeaderMap) -> Result<(), Failure> {
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(app.secret.as_str()) {
        return Ok(());
    }
    Err(fail(
        StatusCode::UNAUTHORIZED,
        "authorization: wrong or no admin secret",
    ))
}

#[derive(Deserialize)]
struct AccountsBody {
    user: i64,
    count: i64,
    balance_minor: i64,
}

async fn accounts(
    State(app): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<AccountsBody>,
) -> Result<(StatusCode, Json<Value>), Failure> {
    authorized(&app, &headers)?;
    let inner = app
        .inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for user in body.user..body.user.saturating_add(body.count) {
        inner
            .db
            .execute("INSERT OR IGNORE INTO accounts VALUES (?1)", params![user])
            .map_err(|e| db_error(&e))?;
        inner
            .payments
            .execute(
                "INSERT OR IGNORE INTO wallets VALUES (?1, ?2, 0)",
                params![user, body.balance_minor],
            )
            .map_err(|e| db_error(&e))?;
    }
    Ok((StatusCode::CREATED, Json(json!({ "opened": body.count }))))
}

#[derive(Deserialize)]
struct ActivityBody {
    activity: i64,
    price_minor: i64,
}

/// The operator's price of an activity; other terms for a registered activity are refused.
async fn activities(
    State(app): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<ActivityBody>,
) -> Result<(StatusCode, Json<Value>), Failure> {
    authorized(&app, &headers)?;
    let inner = app
        .inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let known: Option<i64> = inner
        .db
        .query_row(
            "SELECT price_minor FROM activities WHERE activity = ?1",
            params![body.activity],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| db_error(&e))?;
    match known {
        Some(price) if price == body.price_minor => {
            Ok((StatusCode::OK, Json(json!({ "registered": "unchanged" }))))
        }
        Some(price) => Err(fail(
            StatusCode::CONFLICT,
            format!("activity {} costs {price} already", body.activity),
        )),
        None => {
            inner
                .db
                .execute(
                    "INSERT INTO activities VALUES (?1, ?2)",
                    params![body.activity, body.price_minor],
                )
                .map_err(|e| db_error(&e))?;
            Ok((
                StatusCode::CREATED,
                Json(json!({ "registered": "created" })),
            ))
        }
    }
}

#[derive(Deserialize)]
struct StockBody {
    activity: i64,
    units: i64,
}

async fn stock(
    State(app): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<StockBody>,
) -> Result<Json<Value>, Failure> {
    authorized(&app, &headers)?;
    let inner = app
        .inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    inner
        .db
        .execute(
            "INSERT INTO stock VALUES (?1, ?2, ?2, 0, 0) ON CONFLICT (activity) DO UPDATE SET \
             total = total + ?2, available = available + ?2",
            params![body.activity, body.units],
        )
        .map_err(|e| db_error(&e))?;
    Ok(Json(json!({ "ok": true })))
}

#[derive(Clone, Copy, Deserialize, serde::Serialize)]
struct Draw {
    xid: i64,
    user: i64,
    activity: i64,
    price_minor: i64,
    won: bool,
}

#[derive(Clone, Copy, Deserialize)]
struct Msg {
    phase: Phase,
    draw: Draw,
}

#[derive(Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
enum Phase {
    Try,
    Confirm,
    Cancel,
}

#[derive(Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
enum Branch {
    Wallet,
    Inventory,
    Participation,
}

#[derive(Deserialize)]
struct BranchBody {
    branch: Branch,
    msg: Msg,
}

/// Seata's fence states.
const TRIED: i64 = 1;
const COMMITTED: i64 = 2;
const ROLLBACKED: i64 = 3;
const SUSPENDED: i64 = 4;

async fn branch(
    State(app): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<BranchBody>,
) -> Result<Json<Value>, Failure> {
    authorized(&app, &headers)?;
    let mut inner = app
        .inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let outcome = match body.msg.phase {
        Phase::Try => try_branch(&mut inner, body.branch, &body.msg.draw),
        Phase::Confirm => finish(&mut inner, body.branch, &body.msg.draw, true),
        Phase::Cancel => finish(&mut inner, body.branch, &body.msg.draw, false),
    }
    .map_err(|e| db_error(&e))?;
    let outcome = match outcome {
        Ok(effect) => json!({ "Ok": effect }),
        Err(reason) => json!({ "Err": reason }),
    };
    Ok(Json(json!({
        "branch": body.branch,
        "phase": body.msg.phase,
        "draw": body.msg.draw,
        "outcome": outcome,
    })))
}

/// An answer: the effect's name, or why it was refused.
type Outcome = Result<&'static str, String>;

fn branch_name(branch: Branch) -> &'static str {
    match branch {
        Branch::Wallet => "wallet",
        Branch::Inventory => "inventory",
        Branch::Participation => "participation",
    }
}

fn fence(tx: &Transaction<'_>, branch: Branch, xid: i64) -> rusqlite::Result<Option<i64>> {
    tx.query_row(
        "SELECT status FROM tcc_fence_log WHERE xid = ?1 AND branch = ?2",
        params![xid, branch_name(branch)],
        |r| r.get(0),
    )
    .optional()
}

fn set_fence(tx: &Transaction<'_>, branch: Branch, xid: i64, status: i64) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO tcc_fence_log VALUES (?1, ?2, ?3) ON CONFLICT (xid, branch) DO UPDATE SET \
         status = ?3",
        params![xid, branch_name(branch), status],
    )
    .map(drop)
}

/// The operator's terms of a Try: its activity registered, and (but for the inventory, which
/// charges nothing) at the registered price.
fn registered_terms(
    tx: &Transaction<'_>,
    branch: Branch,
    d: &Draw,
) -> rusqlite::Result<Result<(), String>> {
    let price: Option<i64> = tx
        .query_row(
            "SELECT price_minor FROM activities WHERE activity = ?1",
            params![d.activity],
            |r| r.get(0),
        )
        .optional()?;
    Ok(match price {
        None => Err(format!("activity {} is not registered", d.activity)),
        Some(p) if p != d.price_minor && branch != Branch::Inventory => Err(format!(
            "activity {} costs {p}, the Try carries {}",
            d.activity, d.price_minor
        )),
        Some(_) => Ok(()),
    })
}

/// Try: the fence row and the business in one local transaction.
fn try_branch(inner: &mut Inner, branch: Branch, d: &Draw) -> rusqlite::Result<Outcome> {
    let planted = inner.planted;
    let tx = Transaction::new_unchecked(&inner.db, TransactionBehavior::Immediate)?;
    if inner.registry
        && let Err(why) = registered_terms(&tx, branch, d)?
    {
        return Ok(Err(why));
    }
    if let Some(status) = fence(&tx, branch, d.xid)? {
        return Ok(Err(format!("fence: a row in status {status} exists")));
    }
    set_fence(&tx, branch, d.xid, TRIED)?;
    let business = match branch {
        Branch::Wallet => try_wallet(&tx, &inner.payments, d, planted)?,
        Branch::Inventory => {
            let n = tx.execute(
                "UPDATE stock SET available = available - 1, reserved = reserved + 1 \
                 WHERE activity = ?1 AND available > 0",
                params![d.activity],
            )?;
            if n == 1 {
                Ok(())
            } else {
                Err("no stock left".to_owned())
            }
        }
        Branch::Participation => {
            let n = tx.execute(
                "INSERT OR IGNORE INTO participation VALUES (?1, ?2, ?3, 0)",
                params![d.user, d.activity, d.xid],
            )?;
            if n == 1 {
                Ok(())
            } else {
                Err("already participating".to_owned())
            }
        }
    };
    match business {
        // The fence row goes down with the business's transaction (dropped: rolled back).
        Err(why) => Ok(Err(why)),
        Ok(()) => tx.commit().map(|()| Ok("Applied")),
    }
}

/// The wallet's Try: freeze at the payment service (committed there at once), then the local
/// ticket. A failed local step undoes the freeze, unless the Seata bug is planted.
fn try_wallet(
    tx: &Transaction<'_>,
    payments: &Connection,
    d: &Draw,
    planted: bool,
) -> rusqlite::Result<Result<(), String>> {
    let frozen = payments.execute(
        "UPDATE wallets SET balance = balance - ?2, frozen = frozen + ?2 \
         WHERE user = ?1 AND balance >= ?2",
        params![d.user, d.price_minor],
    )?;
    if frozen == 0 {
        return Ok(Err(
            "payment service: no such wallet or not enough money".into()
        ));
    }
    payments.execute(
        "INSERT INTO freezes VALUES (?1, ?2, ?3)",
        params![d.xid, d.user, d.price_minor],
    )?;
    let ticket = tx.execute(
        "INSERT OR IGNORE INTO tickets VALUES (?1, ?2, ?3)",
        params![d.user, d.activity, d.xid],
    )?;
    if ticket == 1 {
        return Ok(Ok(()));
    }
    if !planted {
        unfreeze(payments, d.xid)?;
    }
    Ok(Err("a ticket of this user and activity is open".into()))
}

/// Gives a freeze back to its wallet; false when there was none.
fn unfreeze(payments: &Connection, xid: i64) -> rusqlite::Result<bool> {
    let Some((user, amount)) = payments
        .query_row(
            "SELECT user, amount FROM freezes WHERE xid = ?1",
            params![xid],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()?
    else {
        return Ok(false);
    };
    payments.execute(
        "UPDATE wallets SET balance = balance + ?2, frozen = frozen - ?2 WHERE user = ?1",
        params![user, amount],
    )?;
    payments.execute("DELETE FROM freezes WHERE xid = ?1", params![xid])?;
    Ok(true)
}

/// Confirm (`commit`) or Cancel: Seata's fence rules, then the business.
fn finish(inner: &mut Inner, branch: Branch, d: &Draw, commit: bool) -> rusqlite::Result<Outcome> {
    let tx = Transaction::new_unchecked(&inner.db, TransactionBehavior::Immediate)?;
    let status = fence(&tx, branch, d.xid)?;
    let (done, refused) = if commit {
        (COMMITTED, [ROLLBACKED, SUSPENDED])
    } else {
        (ROLLBACKED, [COMMITTED, COMMITTED])
    };
    match status {
        None if commit => return Ok(Err("fence: no Try to confirm".into())),
        None => {
            set_fence(&tx, branch, d.xid, SUSPENDED)?;
            return tx.commit().map(|()| Ok("EmptyRollback"));
        }
        Some(s) if s == done || (!commit && s == SUSPENDED) => return Ok(Ok("AlreadyDone")),
        Some(s) if refused.contains(&s) => {
            return Ok(Err(format!("fence: the branch is in status {s}")));
        }
        Some(_) => {}
    }
    set_fence(&tx, branch, d.xid, done)?;
    match (branch, commit) {
        (Branch::Wallet, true) => {
            let amount: i64 = inner.payments.query_row(
                "SELECT amount FROM freezes WHERE xid = ?1",
                params![d.xid],
                |r| r.get(0),
            )?;
            inner.payments.execute(
                "UPDATE wallets SET frozen = frozen - ?2 WHERE user = ?1",
                params![d.user, amount],
            )?;
            inner
                .payments
                .execute("DELETE FROM freezes WHERE xid = ?1", params![d.xid])?;
            tx.execute(
                "UPDATE collected SET minor = minor + ?1 WHERE id = 1",
                params![amount],
            )?;
        }
        (Branch::Wallet, false) => {
            unfreeze(&inner.payments, d.xid)?;
            tx.execute("DELETE FROM tickets WHERE xid = ?1", params![d.xid])?;
        }
        (Branch::Inventory, true) => {
            tx.execute(
                "UPDATE stock SET reserved = reserved - 1, issued = issued + 1 WHERE activity = ?1",
                params![d.activity],
            )?;
        }
        (Branch::Inventory, false) => {
            tx.execute(
                "UPDATE stock SET reserved = reserved - 1, available = available + 1 \
                 WHERE activity = ?1",
                params![d.activity],
            )?;
        }
        (Branch::Participation, true) => {
            tx.execute(
                "UPDATE participation SET confirmed = 1 WHERE xid = ?1",
                params![d.xid],
            )?;
        }
        (Branch::Participation, false) => {
            tx.execute("DELETE FROM participation WHERE xid = ?1", params![d.xid])?;
        }
    }
    tx.commit().map(|()| Ok("Applied"))
}

async fn ledger(State(app): State<Shared>) -> Result<Json<Value>, Failure> {
    let inner = app
        .inner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let sums = |db: &Connection, sql: &str| -> rusqlite::Result<i64> {
        db.query_row(sql, [], |r| r.get(0))
    };
    let read = || -> rusqlite::Result<Value> {
        let balances = sums(
            &inner.payments,
            "SELECT COALESCE(SUM(balance), 0) FROM wallets",
        )?;
        let frozen = sums(
            &inner.payments,
            "SELECT COALESCE(SUM(frozen), 0) FROM wallets",
        )?;
        let collected = sums(&inner.db, "SELECT minor FROM collected WHERE id = 1")?;
        let participations = sums(&inner.db, "SELECT COUNT(*) FROM participation")?;
        let mut q = inner
            .db
            .prepare("SELECT activity, total, available, reserved, issued FROM stock")?;
        let stock = q
            .query_map([], |r| {
                Ok(json!({
                    "activity": r.get::<_, i64>(0)?,
                    "total": r.get::<_, i64>(1)?,
                    "available": r.get::<_, i64>(2)?,
                    "reserved": r.get::<_, i64>(3)?,
                    "issued": r.get::<_, i64>(4)?,
                }))
            })?
            .collect::<rusqlite::Result<Vec<Value>>>()?;
        Ok(json!({
            "balances_minor": balances,
            "frozen_minor": frozen,
            "collected_minor": collected,
            "participations": participations,
            "stock": stock,
        }))
    };
    read().map(Json).map_err(|e| db_error(&e))
}
