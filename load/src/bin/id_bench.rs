//! `id_bench`: IDs per second and latency, one client, several ways of making IDs, side by side
//! on one machine (docs/deployment.md, "Figures"):
//!
//! - `ours-K`: `GET /id/{tag}` spread round-robin over K `sut-server --role id` processes on one
//!   PostgreSQL or MariaDB (`--database`; the whole deployment runs, the other roles idle);
//! - `pg-update`: PostgreSQL itself handing out each ID with the segment row's
//!   `UPDATE … SET max_id = max_id + 1 … RETURNING max_id` (one durable commit per ID);
//! - `pg-nextval`: `SELECT nextval(…)` of a PostgreSQL sequence;
//! - with `--database mariadb` instead: `mariadb-update`, MariaDB handing out each ID with Leaf's
//!   segment SQL at step 1 (`UPDATE … SET max_id = max_id + 1 …`, then `SELECT max_id`, one
//!   transaction, one durable commit per ID), and `mariadb-auto-increment`, an `INSERT` into an
//!   `AUTO_INCREMENT` table per ID;
//! - `redis-incr`: Redis `INCR` with `appendfsync always` (when `redis-server` is installed).
//!
//! Every target gets the same client: `--concurrency` tokio tasks, each doing one request at a
//! time for `--seconds`, timed into one HdrHistogram. PostgreSQL runs with fsync on, MariaDB
//! with `innodb_flush_log_at_trx_commit=1` and `sync_binlog=1`. For ours, the database's
//! committed transactions per 1,000 IDs are counted (PostgreSQL: `pg_stat_database` of the
//! `ids` database; MariaDB: the server's `Com_commit`, every database's, so the idle roles'
//! few commits count too).
//!
//! ```text
//! cargo run --release -p load --bin id_bench -- --seconds 10 --concurrency 32 --servers 1,2,4
//! cargo run --release -p load --bin id_bench -- --database mariadb --servers 1
//! ```

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chaos::{Backend, DbServer, Deployment, DeploymentSpec, MariaDb, Postgres, RoleProcess};
use clap::Parser;
use hdrhistogram::Histogram;
use mysql_async::prelude::Queryable;
use tokio_postgres::NoTls;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "id_bench",
    about = "IDs/s and latency: sut-server ID processes vs PostgreSQL or MariaDB, and Redis"
)]
struct Args {
    /// The database of the deployment and of the per-ID baselines.
    #[arg(long, value_enum, default_value_t = Database::Postgres)]
    database: Database,
    /// Seconds per target.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Concurrent requests (each task one at a time).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// ID-server counts to run, comma-separated.
    #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
    servers: Vec<usize>,
    /// The `sut-server` binary (default: beside this one).
    #[arg(long)]
    server_bin: Option<PathBuf>,
}

/// The database server of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Database {
    Postgres,
    Mariadb,
}

impl Database {
    const fn backend(self) -> Backend {
        match self {
            Self::Postgres => Backend::Postgres,
            Self::Mariadb => Backend::MariaDb,
        }
    }
}

/// One target's result.
#[derive(Debug)]
struct Row {
    target: String,
    ids: u64,
    errors: u64,
    seconds: f64,
    latency: Histogram<u64>,
    commits_per_1000: Option<f64>,
}

impl Row {
    fn rate(&self) -> f64 {
        self.ids as f64 / self.seconds
    }
}

/// Runs `op` from `concurrency` tasks for `seconds`; each call returns whether it got an ID.
async fn drive<F, Fut>(concurrency: usize, seconds: u64, op: F) -> (u64, u64, f64, Histogram<u64>)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|k| {
            let (op, stop) = (Arc::clone(&op), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
                let (mut ok, mut bad) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    if op(k).await {
                        ok += 1;
                        let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                        let _ = h.record(us.max(1));
                    } else {
                        bad += 1;
                    }
                }
                (ok, bad, h)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    let (mut ok, mut bad) = (0, 0);
    for t in tasks {
        let (o, b, h) = t.await.expect("task");
        ok += o;
        bad += b;
        all.add(h).expect("same bounds");
    }
    (ok, bad, started.elapsed().as_secs_f64(), all)
}

async fn pg_clients(url: &str, n: usize) -> Vec<Arc<tokio_postgres::Client>> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        clients.push(Arc::new(client));
    }
    clients
}

async fn commits(url: &str) -> i64 {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let row = client
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .expect("pg_stat_database");
    row.get(0)
}

async fn bench_pg(args: &Args, pg: &Postgres, sql: &'static str, name: &str) -> Row {
    let clients = Arc::new(pg_clients(&pg.url_for("bench"), args.concurrency).await);
    let (ids, errors, seconds, latency) = drive(args.concurrency, args.seconds, move |k| {
        let client = Arc::clone(&clients[k]);
        async move { client.query_one(sql, &[]).await.is_ok() }
    })
    .await;
    Row {
        target: name.to_owned(),
        ids,
        errors,
        seconds,
        latency,
        commits_per_1000: Some(1000.0),
    }
}

async fn my_conns(url: &str, n: usize) -> Vec<tokio::sync::Mutex<mysql_async::Conn>> {
    let opts: mysql_async::Opts =
        mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(url).expect("a MySQL URL"))
            .prefer_socket(false)
            .into();
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let conn = mysql_async::Conn::new(opts.clone()).await.expect("connect");
        conns.push(tokio::sync::Mutex::new(conn));
    }
    conns
}

/// Leaf's segment SQL at step 1: one transaction per ID.
async fn leaf_update(conn: &mut mysql_async::Conn) -> mysql_async::Result<Option<i64>> {
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await?;
    tx.exec_drop("UPDATE seg SET max_id = max_id + 1 WHERE tag = 'bench'", ())
        .await?;
    let id = tx
        .exec_first("SELECT max_id FROM seg WHERE tag = 'bench'", ())
        .await?;
    tx.commit().await?;
    Ok(id)
}

/// An `INSERT` into an `AUTO_INCREMENT` table: the ID is the row's key.
async fn auto_increment(conn: &mut mysql_async::Conn) -> mysql_async::Result<Option<u64>> {
    conn.exec_drop("INSERT INTO seq_ids () VALUES ()", ())
        .await?;
    Ok(conn.last_insert_id())
}

/// MariaDB handing out IDs itself: by [`auto_increment`] when `auto`, else by [`leaf_update`].
async fn bench_mariadb(args: &Args, db: &MariaDb, auto: bool, name: &str) -> Row {
    let conns = Arc::new(my_conns(&db.url(), args.concurrency).await);
    let (ids, errors, seconds, latency) = drive(args.concurrency, args.seconds, move |k| {
        let conns = Arc::clone(&conns);
        async move {
            let mut conn = conns[k].lock().await;
            if auto {
                auto_increment(&mut conn).await.is_ok_and(|id| id.is_some())
            } else {
                leaf_update(&mut conn).await.is_ok_and(|id| id.is_some())
            }
        }
    })
    .await;
    Row {
        target: name.to_owned(),
        ids,
        errors,
        seconds,
        latency,
        commits_per_1000: Some(1000.0),
    }
}

/// The committed transactions the ID store's database has seen so far.
async fn commits_of(server: &DbServer) -> i64 {
    match server {
        DbServer::Postgres(_) => commits(&server.url_for("ids")).await,
        DbServer::MariaDb(db) => {
            let mut conn = my_conns(&db.url(), 1).await.remove(0).into_inner();
            let row: Option<(String, i64)> = conn
                .query_first("SHOW GLOBAL STATUS LIKE 'Com_commit'")
                .await
                .expect("SHOW GLOBAL STATUS");
            row.expect("Com_commit").1
        }
    }
}

/// A throwaway Redis with `appendonly yes`, `appendfsync always`, on a free port.
struct Redis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_redis() -> Option<Redis> {
    let dir = tempfile::tempdir().ok()?;
    let port = chaos::free_port().ok()?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--dir", dir.path().to_str()?, "--save", ""])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let redis = Redis {
        child,
        port,
        _dir: dir,
    };
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(redis);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

async fn bench_redis(args: &Args, redis: &Redis) -> Row {
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port)).expect("url");
    let mut conns = Vec::with_capacity(args.concurrency);
    for _ in 0..args.concurrency {
        conns.push(tokio::sync::Mutex::new(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("redis connection"),
        ));
    }
    let conns = Arc::new(conns);
    let (ids, errors, seconds, latency) = drive(args.concurrency, args.seconds, move |k| {
        let conns = Arc::clone(&conns);
        async move {
            let mut conn = conns[k].lock().await;
            redis::cmd("INCR")
                .arg("bench")
                .query_async::<i64>(&mut *conn)
                .await
                .is_ok()
        }
    })
    .await;
    Row {
        target: "redis-incr (appendfsync always)".to_owned(),
        ids,
        errors,
        seconds,
        latency,
        commits_per_1000: None,
    }
}

async fn bench_ours(args: &Args, bin: &std::path::Path, servers: usize) -> Row {
    let mut spec = DeploymentSpec::new(bin.to_owned());
    spec.id_servers = servers;
    spec.backend = args.database.backend();
    let deployment = tokio::task::spawn_blocking(move || Deployment::start(&spec))
        .await
        .expect("task")
        .expect("start the deployment");
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .build()
        .expect("client");
    let status = http
        .post(format!("{}/admin/tags", deployment.url(RoleProcess::Id(0))))
        .bearer_auth(deployment.admin_token())
        .json(&serde_json::json!({"tag": "bench", "step": 1000}))
        .send()
        .await
        .expect("create the tag")
        .status();
    assert!(status.is_success(), "POST /admin/tags: {status}");
    let urls: Arc<Vec<String>> = Arc::new(
        deployment
            .id_urls()
            .iter()
            .map(|u| format!("{u}/id/bench"))
            .collect(),
    );
    let mut deployment = deployment;
    let before = commits_of(deployment.database().expect("a database server")).await;
    let turn = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let first_error: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let seen = Arc::clone(&first_error);
    let (ids, errors, seconds, latency) = drive(args.concurrency, args.seconds, move |_| {
        let (http, urls, turn) = (http.clone(), Arc::clone(&urls), Arc::clone(&turn));
        let seen = Arc::clone(&seen);
        async move {
            let i = turn.fetch_add(1, Ordering::Relaxed) % urls.len();
            let why = match http.get(&urls[i]).send().await {
                Ok(r) if r.status().is_success() => return r.bytes().await.is_ok(),
                Ok(r) => format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
                Err(e) => e.to_string(),
            };
            seen.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert(why);
            false
        }
    })
    .await;
    if let Some(why) = first_error
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
    {
        eprintln!("id_bench: {servers} server(s): first error: {why}");
    }
    let after = commits_of(deployment.database().expect("a database server")).await;
    let commits_per_1000 = (after - before) as f64 * 1000.0 / ids.max(1) as f64;
    tokio::task::spawn_blocking(move || drop(deployment))
        .await
        .expect("teardown");
    Row {
        target: format!("ours, {servers} ID server(s)"),
        ids,
        errors,
        seconds,
        latency,
        commits_per_1000: Some(commits_per_1000),
    }
}

fn print(rows: &[Row], args: &Args) {
    // The first row is the database's own per-ID UPDATE.
    let base = rows.first().map_or(1.0, Row::rate);
    let database = match args.database {
        Database::Postgres => "PostgreSQL with fsync on",
        Database::Mariadb => "MariaDB with innodb_flush_log_at_trx_commit=1, sync_binlog=1",
    };
    println!(
        "{} s per target, {} concurrent requests, one client, {database}\n",
        args.seconds, args.concurrency
    );
    println!(
        "| target | IDs/s | P50 ms | P99 ms | P99.9 ms | errors | DB transactions per 1,000 IDs | × per-ID UPDATE |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let ms = |q: f64| r.latency.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {:.1} |",
            r.target,
            r.rate(),
            ms(0.5),
            ms(0.99),
            ms(0.999),
            r.errors,
            r.commits_per_1000
                .map_or("—".to_owned(), |c| format!("{c:.1}")),
            r.rate() / base
        );
    }
}

fn main() {
    let args = Args::parse();
    chaos::clean_up_on_interrupt().expect("the interrupt handler");
    let bin = args.server_bin.clone().unwrap_or_else(|| {
        let me = std::env::current_exe().expect("own path");
        me.with_file_name("sut-server")
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut rows = match args.database {
            Database::Postgres => postgres_baselines(&args).await,
            Database::Mariadb => mariadb_baselines(&args).await,
        };
        match start_redis() {
            Some(redis) => rows.push(bench_redis(&args, &redis).await),
            None => eprintln!("id_bench: no redis-server: Redis INCR skipped"),
        }
        for &servers in &args.servers {
            rows.push(bench_ours(&args, &bin, servers).await);
        }
        print(&rows, &args);
    });
}

/// MariaDB's own ways of making IDs, on a throwaway server that syncs every commit.
async fn mariadb_baselines(args: &Args) -> Vec<Row> {
    let db = tokio::task::spawn_blocking(MariaDb::start)
        .await
        .expect("task")
        .expect("start MariaDB");
    db.sql(&format!(
        "USE {};
         CREATE TABLE seg (tag VARCHAR(64) PRIMARY KEY, max_id BIGINT NOT NULL) ENGINE = InnoDB;
         INSERT INTO seg VALUES ('bench', 0);
         CREATE TABLE seq_ids (id BIGINT AUTO_INCREMENT PRIMARY KEY) ENGINE = InnoDB;",
        chaos::MARIADB_DATABASE
    ))
    .expect("schema");
    let rows = vec![
        bench_mariadb(
            args,
            &db,
            false,
            "mariadb-update (UPDATE + SELECT per ID, Leaf's SQL)",
        )
        .await,
        bench_mariadb(args, &db, true, "mariadb-auto-increment (INSERT per ID)").await,
    ];
    tokio::task::spawn_blocking(move || drop(db))
        .await
        .expect("teardown");
    rows
}

/// PostgreSQL's own ways of making IDs, on a throwaway server with fsync on.
async fn postgres_baselines(args: &Args) -> Vec<Row> {
    let pg = tokio::task::spawn_blocking(Postgres::start)
        .await
        .expect("task")
        .expect("start PostgreSQL");
    pg.create_database("bench").expect("create database");
    let (client, conn) = tokio_postgres::connect(&pg.url_for("bench"), NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute(
            "CREATE TABLE seg (tag TEXT PRIMARY KEY, max_id BIGINT NOT NULL);
             INSERT INTO seg VALUES ('bench', 0);
             CREATE SEQUENCE bench_seq;",
        )
        .await
        .expect("schema");
    let rows = vec![
        bench_pg(
            args,
            &pg,
            "UPDATE seg SET max_id = max_id + 1 WHERE tag = 'bench' RETURNING max_id",
            "pg-update (UPDATE … RETURNING per ID)",
        )
        .await,
        bench_pg(args, &pg, "SELECT nextval('bench_seq')", "pg-nextval").await,
    ];
    tokio::task::spawn_blocking(move || drop(pg))
        .await
        .expect("teardown");
    rows
}
