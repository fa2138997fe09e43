//! Short real runs of `load::run` against a fresh server: an in-process `sut_server` (the
//! same code as the binary) in host mode, and the `sut-server` child process (default mode).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;

use load::{LoadOptions, run};
use reports::model::{Judgement, LoadReport};

/// The in-process server's admin secret.
const ADMIN: &str = "loadgen-test-admin-secret";

/// Starts `sut_server` on 127.0.0.1:0 on its own runtime thread (kept for the process's life).
fn in_process_server() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("ids.db");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut cfg = sut_server::ServerConfig::new(&db);
            cfg.admin_token = Some(ADMIN.to_owned());
            let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let server = sut_server::start(cfg, listen).await.unwrap();
            tx.send(server.addr).unwrap();
            std::future::pending::<()>().await;
        });
    });
    let addr = rx.recv().unwrap();
    (format!("http://{addr}"), dir)
}

fn sane(report: &LoadReport) {
    assert!(report.passed(), "verification: {:#?}", report.verification);
    assert!(!report.endpoints.is_empty());
    for e in &report.endpoints {
        assert!(e.requests > 0, "{e:?}");
        assert!(e.throughput_rps > 0.0);
        let c = e.corrected;
        let u = e.uncorrected;
        assert!(c.p50_us > 0 && c.p50_us <= c.p90_us && c.p90_us <= c.p99_us);
        assert!(c.p99_us <= c.p999_us && c.p999_us <= c.p9999_us && c.p9999_us <= c.max_us);
        assert!(u.p50_us > 0 && u.p50_us <= c.p50_us.max(u.p50_us));
        // corrected latency counts from the intended send: never below the actual one
        assert!(c.max_us >= u.max_us, "{e:?}");
        assert!(c.max_us < 30_000_000, "{e:?}");
        assert!(!e.distribution.is_empty());
        assert!(!e.over_time.is_empty());
        assert_eq!(e.error_count(), 0, "{}: {:?}", e.name, e.errors);
    }
}

#[test]
fn mixed_closed_loop_against_a_fresh_server_verifies() {
    let (base, _dir) = in_process_server();
    let hlogs = tempfile::tempdir().unwrap();
    let report = run(LoadOptions {
        workload: "mixed".to_owned(),
        users: 4,
        rate: None,
        duration_s: 2,
        warmup_s: 1,
        host: Some(base),
        hlog_dir: Some(hlogs.path().to_owned()),
        admin_token: Some(ADMIN.to_owned()),
        ..LoadOptions::default()
    })
    .unwrap();
    sane(&report);
    for name in [
        "GET /id/{tag}",
        "GET /snowflake",
        "POST /tokens/verify",
        "POST /tokens/once/consume",
        "POST /lottery/draw",
    ] {
        assert!(report.endpoint(name).is_some(), "{name} missing");
    }
    let names: Vec<&str> = report
        .verification
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    for n in [
        "snowflake",
        "tokens.once_accepted_once",
        "lottery.conservation",
        "ledger.safe",
    ] {
        assert!(
            names.iter().any(|x| x.contains(n)),
            "{n} not checked: {names:?}"
        );
    }
    assert!(
        report
            .verification
            .iter()
            .all(|v| v.verdict == Judgement::Held)
    );
    // one interval log per endpoint
    let files = std::fs::read_dir(hlogs.path()).unwrap().count();
    assert_eq!(files, report.endpoints.len());
}

#[test]
fn constant_rate_run_keeps_its_rate() {
    let (base, _dir) = in_process_server();
    let report = run(LoadOptions {
        workload: "id".to_owned(),
        users: 4,
        rate: Some(200.0),
        duration_s: 2,
        warmup_s: 1,
        host: Some(base),
        hlog_dir: None,
        admin_token: Some(ADMIN.to_owned()),
        ..LoadOptions::default()
    })
    .unwrap();
    sane(&report);
    let total: u64 = report.endpoints.iter().map(|e| e.requests).sum();
    // 200 operations/s for 2 measured seconds
    assert!((380..=420).contains(&total), "{total} requests");
    assert_eq!(report.rate, Some(200.0));
}

use load::target::ensure_server_binary;

#[test]
fn default_mode_starts_the_server_binary_and_samples_it() {
    ensure_server_binary();
    let report = run(LoadOptions {
        workload: "lottery".to_owned(),
        users: 4,
        rate: None,
        duration_s: 2,
        warmup_s: 0,
        host: None,
        hlog_dir: None,
        ..LoadOptions::default()
    })
    .unwrap();
    sane(&report);
    assert!(report.target.starts_with("fresh sut-server child"));
    assert!(!report.server.is_empty(), "no /proc samples");
    assert!(report.server.iter().all(|s| s.rss_bytes > 0));
    // On the endpoints' clock: within the measured seconds, not the set-up or the verification.
    assert!(
        report
            .server
            .iter()
            .all(|s| (0.0..=report.duration_s).contains(&s.t_s)),
        "{:?}",
        report.server
    );
}

#[test]
fn bad_options_are_refused() {
    let e = run(LoadOptions {
        workload: "nope".to_owned(),
        ..LoadOptions::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("workload"), "{e}");
    let e = run(LoadOptions {
        rate: Some(-1.0),
        ..LoadOptions::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("rate"), "{e}");
    let e = run(LoadOptions {
        host: Some("http://127.0.0.1:1".to_owned()),
        flaw: Some(load::Flaw::StockTwoStep),
        ..LoadOptions::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("flaw"), "{e}");
    let e = run(LoadOptions {
        mix: Some(load::Mix::default()),
        ..LoadOptions::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("mix"), "{e}");
}

#[test]
fn crash_under_load_keeps_ids_unique_and_money_conserved() {
    ensure_server_binary();
    let report = load::crash_under_load(load::CrashOptions {
        users: 4,
        rate: None,
        duration_s: 3,
        kills: 2,
        hlog_dir: None,
        mix: None,
        flaw: None,
    })
    .unwrap();
    for v in &report.verification {
        eprintln!(
            "{} {:?} {:?} {:?}",
            v.name, v.verdict, v.first_offending_event, v.detail
        );
    }
    assert!(report.passed(), "{:#?}", report.verification);
    eprintln!("{:?}", report.fault_windows);
    assert_eq!(report.fault_windows.len(), 2);
    for w in &report.fault_windows {
        assert!(w.end_s > w.start_s && w.end_s - w.start_s < 10.0, "{w:?}");
    }
    let names: Vec<&str> = report
        .verification
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    for n in [
        "ids.unique[id:",
        "ids.unique[snowflake]",
        "lottery.conservation",
        "lottery.settled",
        "lottery.acknowledged_durable",
        "ids.lost_per_crash_bounded",
    ] {
        assert!(
            names.iter().any(|x| x.starts_with(n)),
            "{n} not checked: {names:?}"
        );
    }
    let ids = report.endpoint("GET /id/{tag}").unwrap();
    assert!(ids.requests > 0);
    // A kill breaks connections, and nothing else: a restarted server still takes the users'
    // tokens (one that drew a new JWT key at each start answered every draw 401 after the
    // first kill, and the run passed).
    for e in &report.endpoints {
        assert_eq!(
            e.errors.get("http_4xx").copied().unwrap_or(0),
            0,
            "{}: {:?}",
            e.name,
            e.errors
        );
    }
}
