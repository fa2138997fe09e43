//! `scenario ids` and `scenario tcc` against services the bench does not know from inside.
//!
//! `scenario ids` against services that are not ours: `id-compat`, a test-only Leaf- or
//! Tinyid-compatible segment service (the `compat` crate's `id-compat` binary), two instances on one
//! database file. With the upstream race planted the bench must catch duplicates through the
//! target's own API; without it the same run must pass, also under every fault.

use std::path::PathBuf;
use std::process::{Command, Output};

fn compat_binary() -> PathBuf {
    let scenario = PathBuf::from(env!("CARGO_BIN_EXE_scenario"));
    let compat = scenario.with_file_name("id-compat");
    assert!(
        compat.is_file(),
        "{} is missing: build it with `cargo build -p compat --bin id-compat` \
         (`cargo test --workspace` builds it)",
        compat.display()
    );
    compat
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// `scenario ids` over two `id-compat` instances of `api` on one fresh database.
fn ids_over_two_instances(api: &str, planted: bool, duration_s: u32, extra: &[&str]) -> Output {
    let race = if planted { " --planted-race" } else { "" };
    ids_over_two(api, race, "", duration_s, extra)
}

/// `scenario ids` over two `id-compat` instances of `api` started with `flags`, on one database
/// in `db_dir` (empty: a fresh temporary directory; `{data}`: the run's own).
fn ids_over_two(api: &str, flags: &str, db_dir: &str, duration_s: u32, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = if db_dir.is_empty() {
        dir.path().join("ids.db")
    } else {
        PathBuf::from(db_dir).join("ids.db")
    };
    let compat = compat_binary();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scenario"));
    let duration = duration_s.to_string();
    cmd.args([
        "ids",
        "--target",
        api,
        "--duration",
        &duration,
        "--monotonic",
        "server",
    ]);
    let key = if api == "tinyid" { "test" } else { "orders" };
    cmd.args(["--key", key]);
    if api == "tinyid" {
        cmd.args(["--token", "tk", "--batch", "5"]);
    }
    for _ in 0..2 {
        let port = free_port();
        cmd.args(["--url", &format!("http://127.0.0.1:{port}")]);
        cmd.args([
            "--server-cmd",
            &format!(
                "exec {} --api {api} --db {} --listen 127.0.0.1:{port} --tag {key} --token tk{flags}",
                compat.display(),
                db.display()
            ),
        ]);
    }
    cmd.args(extra);
    cmd.output().expect("scenario runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn violated_line(out: &Output, check: &str) -> bool {
    text(out)
        .lines()
        .any(|l| l.trim_start().starts_with(check) && l.contains("VIOLATED"))
}

#[test]
fn a_leaf_compatible_service_with_the_planted_segment_race_is_caught_and_a_correct_one_passes() {
    let planted = ids_over_two_instances("leaf", true, 3, &[]);
    assert_eq!(planted.status.code(), Some(1), "{}", text(&planted));
    assert!(
        violated_line(&planted, "ids.unique[leaf:orders]"),
        "{}",
        text(&planted)
    );
    let correct = ids_over_two_instances("leaf", false, 3, &[]);
    assert_eq!(correct.status.code(), Some(0), "{}", text(&correct));
    assert!(
        text(&correct).contains("all distinct"),
        "{}",
        text(&correct)
    );
}

#[test]
fn a_tinyid_compatible_service_without_its_version_check_is_caught_and_a_correct_one_passes() {
    let planted = ids_over_two_instances("tinyid", true, 3, &[]);
    assert_eq!(planted.status.code(), Some(1), "{}", text(&planted));
    assert!(
        violated_line(&planted, "ids.unique[tinyid:test]"),
        "{}",
        text(&planted)
    );
    let correct = ids_over_two_instances("tinyid", false, 3, &[]);
    assert_eq!(correct.status.code(), Some(0), "{}", text(&correct));
}

#[test]
#[cfg_attr(not(has_faketime), ignore = "libfaketime not installed (clock steps)")]
fn a_correct_service_passes_under_kills_pauses_clock_steps_and_partitions() {
    let report = tempfile::tempdir().expect("report dir");
    let report_dir = report.path().display().to_string();
    let out = ids_over_two_instances(
        "leaf",
        false,
        8,
        &[
            "--report",
            &report_dir,
            "--nemesis",
            "kill,pause,clock,partition",
            "--every-ms",
            "700",
            "--down-ms",
            "300",
        ],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("faults.took_effect           held"), "{all}");
    // Every fault kind came round at least once, and each was seen in place.
    let seen = all
        .lines()
        .find(|l| l.contains("faults.took_effect"))
        .unwrap_or_default()
        .split("; ")
        .find_map(|part| part.strip_suffix(" faults seen in place"))
        .unwrap_or_else(|| panic!("no fault count in:\n{all}"));
    let (seen, of) = seen.split_once(" of ").expect("N of M");
    assert_eq!(seen, of, "{all}");
    assert!(of.parse::<u32>().expect("a count") >= 4, "{all}");
    // The report draws each fault on its server's lane and lists the checks.
    let html = std::fs::read_to_string(report.path().join("index.html")).expect("index.html");
    assert!(html.contains("Faults per process"), "no fault lanes");
    assert!(
        html.contains("server-1") && html.contains("server-2"),
        "a lane per server"
    );
    assert!(html.contains("ids.monotonic") && html.contains("faults.took_effect"));
    let summary = std::fs::read_to_string(report.path().join("summary.json")).expect("summary");
    assert!(summary.contains("\"generate\""), "the latency of generate");
}

#[test]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse (power losses)")]
fn a_service_that_acknowledges_before_its_writes_are_durable_is_caught_by_power_losses() {
    let power = [
        "--nemesis",
        "power_loss",
        "--every-ms",
        "800",
        "--down-ms",
        "200",
    ];
    let planted = ids_over_two("leaf", " --planted-nosync", "{data}", 5, &power);
    let all = text(&planted);
    assert_eq!(planted.status.code(), Some(1), "{all}");
    assert!(violated_line(&planted, "ids.unique[leaf:orders]"), "{all}");
    let correct = ids_over_two("leaf", "", "{data}", 5, &power);
    let all = text(&correct);
    assert_eq!(correct.status.code(), Some(0), "{all}");
    assert!(all.contains("lost writes: "), "{all}");
}

/// The `--db-init`, `--db-cmd`, `--db-user` and `--db-url` of a MariaDB the bench starts:
/// every commit synced (`innodb_flush_log_at_trx_commit=1`, `sync_binlog=1`) or, with
/// `flush = 2`, the redo log written at commit and synced once a second.
fn mariadb_args(flush: u8) -> Vec<String> {
    let bin = |p: &str| {
        chaos::mariadb_bin(p)
            .unwrap_or_else(|| panic!("{p}: MariaDB is installed (cfg has_mariadb)"))
            .display()
            .to_string()
    };
    let sync_binlog = if flush == 1 { 1 } else { 0 };
    vec![
        "--db-init".into(),
        format!(
            "{} --no-defaults --user=mysql --datadir={{dbdata}} \
             --auth-root-authentication-method=normal --skip-test-db",
            bin("mariadb-install-db")
        ),
        "--db-cmd".into(),
        format!(
            "exec {} --no-defaults --user=mysql --datadir={{dbdata}} --port={{dbport}} \
             --bind-address=127.0.0.1 --socket={{dbrun}}/mariadb.sock --skip-name-resolve \
             --innodb-flush-log-at-trx-commit={flush} --sync-binlog={sync_binlog} \
             --log-bin={{dbdata}}/binlog --server-id=1 \
             --innodb-flush-method=fsync --innodb-use-native-aio=0 --innodb-buffer-pool-size=64M",
            bin("mariadbd")
        ),
        "--db-user".into(),
        "mysql".into(),
        "--db-url".into(),
        "mysql://root@{db_addr}/bench".into(),
    ]
}

/// `scenario ids` over two Leaf-compatible `id-compat` instances running Leaf's SQL on one
/// MariaDB the bench starts (`flush`: its `innodb_flush_log_at_trx_commit`), under `nemesis`.
fn leaf_on_mariadb(flush: u8, nemesis: &str, duration_s: u32) -> Output {
    let compat = compat_binary();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scenario"));
    let duration = duration_s.to_string();
    cmd.args(["ids", "--target", "leaf", "--key", "orders"]);
    cmd.args(["--monotonic", "server", "--duration", &duration]);
    cmd.args([
        "--nemesis",
        nemesis,
        "--every-ms",
        "1000",
        "--down-ms",
        "800",
    ]);
    // The database link cut one way (queries held, answers free), through the proxy.
    cmd.args(["--cut", "one-way"]);
    cmd.args(mariadb_args(flush));
    for _ in 0..2 {
        let port = free_port();
        cmd.args(["--url", &format!("http://127.0.0.1:{port}")]);
        cmd.args([
            "--server-cmd",
            &format!(
                "exec {} --api leaf --db {{db_url}} --listen 127.0.0.1:{port} --tag orders",
                compat.display()
            ),
        ]);
    }
    cmd.output().expect("scenario runs")
}

/// `scenario ids` at one client, 100 requests a second, over two Tinyid-compatible `id-compat`
/// instances on one MariaDB the bench starts, segments of 20, `flags` added to both.
fn tinyid_on_mariadb(flags: &str, extra: &[&str]) -> Output {
    let compat = compat_binary();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scenario"));
    cmd.args([
        "ids", "--target", "tinyid", "--key", "orders", "--token", "tk",
    ]);
    cmd.args(["--monotonic", "server", "--duration", "5"]);
    cmd.args(["--concurrency", "1", "--rate", "100"]);
    cmd.args(extra);
    cmd.args(mariadb_args(1));
    for _ in 0..2 {
        let port = free_port();
        cmd.args(["--url", &format!("http://127.0.0.1:{port}")]);
        cmd.args([
            "--server-cmd",
            &format!(
                "exec {} --api tinyid --db {{db_url}} --listen 127.0.0.1:{port} --tag orders \
                 --token tk --step 20 --race-window-ms 0 {flags}",
                compat.display()
            ),
        ]);
    }
    cmd.output().expect("scenario runs")
}

#[test]
#[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
fn a_slowed_database_link_opens_tinyids_missing_version_check_at_one_client() {
    // The servers' background fetches read and write the segment row a few milliseconds apart:
    // one client at 100 requests a second rarely lands two of them in one window. Bursts of 20
    // ms ± 10 on every chunk of the database link widen it.
    let delay = ["--delay-db-ms", "20"];
    let planted = tinyid_on_mariadb("--planted-race", &delay);
    assert_eq!(planted.status.code(), Some(1), "{}", text(&planted));
    assert!(
        violated_line(&planted, "ids.unique[tinyid:orders]"),
        "{}",
        text(&planted)
    );
    let correct = tinyid_on_mariadb("", &delay);
    assert_eq!(correct.status.code(), Some(0), "{}", text(&correct));
    let out = text(&correct);
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("faults.db_delayed") && l.contains("held")),
        "{out}"
    );
}

#[test]
fn a_database_delay_without_the_benchs_database_is_a_usage_error() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let leaf = ["ids", "--target", "leaf", "--key", "orders", "--url", &url];
    let out = scenario(&[&leaf[..], &["--delay-db-ms", "20"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--db-cmd"), "{}", text(&out));
}

#[test]
#[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse (power losses)")]
fn leaf_on_a_durable_mariadb_keeps_its_ids_unique_under_every_database_fault() {
    let out = leaf_on_mariadb(1, "db_kill,db_pause,db_power_loss,db_partition", 20);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("all distinct"), "{all}");
    let effect = all
        .lines()
        .find(|l| l.trim_start().starts_with("faults.took_effect"))
        .unwrap_or_else(|| panic!("faults.took_effect is reported: {all}"));
    assert!(effect.contains("held"), "{all}");
    let seen = effect
        .split("; ")
        .find_map(|part| part.strip_suffix(" faults seen in place"))
        .and_then(|n| n.split(" of ").next()?.parse::<u32>().ok())
        .unwrap_or(0);
    assert!(seen >= 4, "every database fault kind once at least: {all}");
    assert!(all.contains("database link: "), "{all}");
    assert!(all.contains("(under {dbdata})"), "{all}");
}

#[test]
#[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse (power losses)")]
fn leaf_on_a_mariadb_that_syncs_once_a_second_hands_out_ids_again_after_a_power_loss() {
    let out = leaf_on_mariadb(2, "db_power_loss", 12);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(violated_line(&out, "ids.unique[leaf:orders]"), "{all}");
}

#[test]
#[cfg_attr(not(has_mariadb), ignore = "MariaDB not installed")]
#[cfg_attr(not(has_nft), ignore = "needs root, ip and nft (network namespaces)")]
fn ip_level_partitions_cut_a_server_off_its_database_and_its_clients_without_a_proxy() {
    ip_level_partitions(&[]);
    // Cut and whole in turn, every 100 ms, while each fault lasts.
    ip_level_partitions(&["--cut", "flap", "--flap-ms", "100"]);
}

/// Leaf on MariaDB in network namespaces under IP-level partitions cut as `cut` says.
fn ip_level_partitions(cut: &[&str]) {
    let compat = compat_binary();
    let mut args: Vec<String> = ["ids", "--target", "leaf", "--key", "orders", "--netns"]
        .map(String::from)
        .to_vec();
    args.extend(["--monotonic", "server", "--duration", "12"].map(String::from));
    let nemesis = ["--nemesis", "db_partition,partition", "--every-ms", "1000"];
    args.extend(
        nemesis
            .into_iter()
            .chain(["--down-ms", "800"])
            .chain(cut.iter().copied())
            .map(String::from),
    );
    // The database listens on its namespace's address; the servers reach it there directly.
    let mut db = mariadb_args(1);
    let cmd = db.iter().position(|a| a == "--db-cmd").expect("a --db-cmd") + 1;
    db[cmd] = db[cmd].replace(
        "--bind-address=127.0.0.1",
        "--bind-address={dbhost} --skip-grant-tables",
    );
    args.extend(db);
    for _ in 0..2 {
        args.extend(["--url", "http://{ip}:8080", "--server-cmd"].map(String::from));
        args.push(format!(
            "exec {} --api leaf --db {{db_url}} --listen {{ip}}:8080 --tag orders",
            compat.display()
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = scenario(&args);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("all distinct"), "{all}");
    assert!(
        all.contains("4 of 4 faults seen in place"),
        "every cut took effect: {all}"
    );
    let dropped: u64 = all
        .lines()
        .find_map(|l| l.trim().strip_prefix("ip-level cuts: "))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(dropped > 0, "the rules dropped packets: {all}");
    assert!(
        !all.contains("database link: "),
        "no proxy carried the database link: {all}"
    );
    let netns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    let left = String::from_utf8_lossy(&netns.stdout).into_owned();
    assert!(!left.contains("bench-"), "namespaces left behind: {left}");
}

#[test]
fn netns_without_each_servers_address_is_a_usage_error() {
    let leaf = ["ids", "--target", "leaf", "--key", "orders", "--netns"];
    let out = scenario(
        &[
            &leaf[..],
            &["--url", "http://127.0.0.1:8080"],
            &["--server-cmd", "exec sleep 60"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("{ip}"), "{}", text(&out));
    let out = scenario(&[&leaf[..], &["--url", "http://{ip}:8080"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--server-cmd"), "{}", text(&out));
}

#[test]
fn database_faults_without_a_database_and_a_database_nobody_uses_are_usage_errors() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let leaf = ["ids", "--target", "leaf", "--key", "orders", "--url", &url];
    let server = ["--server-cmd", "exec sleep 60"];
    let out = scenario(&[&leaf[..], &server, &["--nemesis", "db_kill"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--db-cmd"), "{}", text(&out));
    let db = ["--db-cmd", "exec sleep 60 # {dbport}"];
    let out = scenario(&[&leaf[..], &server, &db].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("{db_url}"), "{}", text(&out));
    let no_port = ["--db-cmd", "exec sleep 60"];
    let used = ["--server-cmd", "exec sleep 60 {db_url}"];
    let out = scenario(&[&leaf[..], &used, &no_port].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("{dbport}"), "{}", text(&out));
    let out = scenario(&["ids", "--help"]);
    let help = text(&out);
    for word in [
        "--db-cmd",
        "db_kill",
        "db_pause",
        "db_power_loss",
        "db_partition",
    ] {
        assert!(
            help.contains(word),
            "{word} in `scenario ids --help`: {help}"
        );
    }
}

/// Whether the tests run as root (then PostgreSQL runs as `postgres`).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The `--db-*` options of a PostgreSQL the bench starts (fsync on), with `conf` added to its
/// command line (`-c synchronous_commit=off`).
fn postgres_args(conf: &str) -> Vec<String> {
    let bin = chaos::postgres_bin_dir().expect("PostgreSQL is installed (cfg has_postgres)");
    let bin = bin.display();
    let (as_user, user) = if is_root() {
        (
            "setpriv --reuid=postgres --regid=postgres --clear-groups -- ",
            vec!["--db-user".to_owned(), "postgres".to_owned()],
        )
    } else {
        ("", Vec::new())
    };
    let mut args = vec![
        "--db-init".to_owned(),
        format!("{as_user}{bin}/initdb -D {{dbdata}} -A trust -U postgres"),
        "--db-cmd".to_owned(),
        format!(
            "exec {as_user}{bin}/postgres -D {{dbdata}} -p {{dbport}} -k {{dbrun}} \
             -c listen_addresses=127.0.0.1 {conf}"
        ),
        "--db-ready".to_owned(),
        format!("{bin}/pg_isready -q -h 127.0.0.1 -p {{dbport}}"),
        "--db-url".to_owned(),
        "postgres://postgres@{db_addr}/postgres".to_owned(),
    ];
    args.extend(user);
    args
}

/// `scenario tcc` on a `sut-server` participant whose database is a PostgreSQL the bench
/// starts (with `conf`), its power cut every 12 messages.
fn tcc_on_postgres(conf: &str) -> Output {
    let server = PathBuf::from(env!("CARGO_BIN_EXE_scenario")).with_file_name("sut-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = dir.path().join("admin-secret");
    std::fs::write(&secret, "a-test-admin-secret-of-32-bytes!").expect("secret written");
    let secret = secret.display().to_string();
    let service = dir.path().join("service-secret");
    std::fs::write(&service, "a-test-service-credential-32-byte").expect("secret written");
    let service = service.display().to_string();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let command = format!(
        "exec {} --db {{db_url}} --listen 127.0.0.1:{port} --admin-token-file {secret} \
         --service-token-file {service}",
        server.display()
    );
    let mut args: Vec<String> = [
        "tcc",
        "--url",
        &url,
        "--admin-token-file",
        &secret,
        "--service-token-file",
        &service,
        "--server-cmd",
        &command,
        "--sequences",
        "4",
        "--steps",
        "24",
        "--kill-every",
        "12",
        "--db-fault",
        "db_power_loss",
    ]
    .map(String::from)
    .to_vec();
    args.extend(postgres_args(conf));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    scenario(&args)
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse (power losses)")]
fn a_participant_on_a_durable_database_keeps_its_books_across_its_power_losses_even_one_tuned_to_commit_asynchronously()
 {
    let durable = tcc_on_postgres("");
    let all = text(&durable);
    assert_eq!(durable.status.code(), Some(0), "{all}");
    assert!(
        all.contains("db_power_loss of the database every 12"),
        "{all}"
    );
    assert!(
        all.contains("database faults: 8 (8 seen in place)"),
        "{all}"
    );
    let effect = all
        .lines()
        .find(|l| l.trim_start().starts_with("faults.took_effect"))
        .unwrap_or_else(|| panic!("faults.took_effect is reported: {all}"));
    assert!(
        effect.contains("held") && !effect.contains(" 0 database faults"),
        "{all}"
    );
    // A server tuned to acknowledge commits before their write-ahead log is synced (the WAL
    // writer held off): sut-server sets synchronous_commit=on in its own sessions, so its power
    // losses take nothing back either.
    let tuned = tcc_on_postgres("-c synchronous_commit=off -c wal_writer_delay=10000");
    let all = text(&tuned);
    assert_eq!(tuned.status.code(), Some(0), "{all}");
}

#[test]
#[cfg_attr(not(has_postgres), ignore = "PostgreSQL not installed")]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse (power losses)")]
fn used_tokens_stay_used_across_power_losses_of_a_durable_database() {
    let server = PathBuf::from(env!("CARGO_BIN_EXE_scenario")).with_file_name("sut-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let (admin, jwt) = (dir.path().join("admin"), dir.path().join("jwt"));
    std::fs::write(&admin, "a-test-admin-secret-of-32-bytes!").expect("secret written");
    std::fs::write(&jwt, "a-test-jwt-secret-of-at-least-32-bytes").expect("secret written");
    let admin = admin.display().to_string();
    let mut args: Vec<String> = ["tokens", "--admin-token-file", &admin, "--tokens", "60"]
        .map(String::from)
        .to_vec();
    args.extend(["--consumers", "4", "--exhaust", "0", "--kill-every", "20"].map(String::from));
    args.extend(["--db-fault", "db_power_loss"].map(String::from));
    args.extend(postgres_args(""));
    for _ in 0..2 {
        let port = free_port();
        args.push("--url".into());
        args.push(format!("http://127.0.0.1:{port}"));
        args.push("--server-cmd".into());
        args.push(format!(
            "exec {} --role token --db {{db_url}} --listen 127.0.0.1:{port} \
             --admin-token-file {admin} --jwt-secret-file {}",
            server.display(),
            jwt.display()
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = scenario(&args);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("3 database faults, 3 seen in place"), "{all}");
}

/// `scenario ARGS…`.
fn scenario(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_scenario"))
        .args(args)
        .output()
        .expect("scenario runs")
}

#[test]
fn an_unreachable_target_and_faults_without_commands_are_usage_errors() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let leaf = ["ids", "--target", "leaf", "--key", "orders", "--url", &url];
    let out = scenario(&[&leaf[..], &["--duration", "1"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("no ID before the run started"),
        "{}",
        text(&out)
    );
    let out = scenario(&[&leaf[..], &["--nemesis", "kill"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--server-cmd"), "{}", text(&out));
    let out = scenario(&["ids", "--target", "zookeeper", "--url", "http://x"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// `scenario ids --target tinyid` against one `id-compat` 44 ms from its clients, segments of
/// 50, its background fetch landing 50 ms late (`flags` adds `--planted-reorder`).
fn tinyid_far_away(flags: &str, extra: &[&str]) -> Output {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let server = format!(
        "exec {} --api tinyid --db {{data}}/ids.db --listen 127.0.0.1:{port} --tag orders \
         --token tk --step 50 --race-window-ms 50 --latency-ms 44 {flags}",
        compat_binary().display()
    );
    let args = [
        "ids",
        "--target",
        "tinyid",
        "--key",
        "orders",
        "--token",
        "tk",
        "--monotonic",
        "server",
        "--url",
        &url,
        "--server-cmd",
        &server,
    ];
    scenario(&[&args[..], extra].concat())
}

#[test]
fn without_a_client_count_the_ramp_opens_tinyids_late_prefetch_behind_a_slow_server() {
    // At 44 ms an answer, four clients hand out 90 IDs a second: the last 10 of a segment take
    // longer than the late fetch, which always lands in time. The ramp raises the clients until
    // the rate stops growing, and IDs run out before it lands.
    let short = ["--duration", "3", "--ramp-step-ms", "500"];
    let planted = tinyid_far_away("--planted-reorder", &short);
    assert_eq!(planted.status.code(), Some(1), "{}", text(&planted));
    assert!(
        violated_line(&planted, "ids.monotonic"),
        "{}",
        text(&planted)
    );
    assert!(
        text(&planted).contains("  ramp: 1 → "),
        "{}",
        text(&planted)
    );
    let correct = tinyid_far_away("", &short);
    assert_eq!(correct.status.code(), Some(0), "{}", text(&correct));
    let out = text(&correct);
    assert!(out.contains("chosen "), "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("races.overlapped") && l.contains("held")),
        "{out}"
    );
    assert!(out.lines().any(|l| l == "every check held"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("PASS: scenario ids")),
        "{out}"
    );
}

#[test]
fn one_client_passes_inconclusive_for_races() {
    let out = tinyid_far_away("", &["--concurrency", "1", "--duration", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let printed = text(&out);
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("PASS (inconclusive for races: no two requests of key")),
        "{printed}"
    );
    assert!(!printed.contains("  ramp:"), "{printed}");
}

#[test]
fn ramp_options_with_a_client_count_or_too_short_a_step_are_usage_errors() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let leaf = ["ids", "--target", "leaf", "--key", "orders", "--url", &url];
    let out = scenario(&[&leaf[..], &["--concurrency", "4", "--ramp-max", "8"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--ramp-max"), "{}", text(&out));
    let out = scenario(&[&leaf[..], &["--ramp-step-ms", "10"]].concat());
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--ramp-step-ms 10"), "{}", text(&out));
}

#[test]
fn ids_help_lists_the_targets() {
    let out = scenario(&["ids", "--help"]);
    let help = text(&out);
    for kind in ["http", "leaf", "tinyid", "redis", "postgres"] {
        assert!(help.contains(kind), "{kind} missing from:\n{help}");
    }
}

#[test]
#[cfg_attr(
    not(has_faketime),
    ignore = "libfaketime not installed (snowflake_seq_reset_first, time_field_narrow)"
)]
#[cfg_attr(
    not(has_fuse),
    ignore = "no /dev/fuse (counter_everysec's power losses)"
)]
#[cfg_attr(
    not(has_postgres),
    ignore = "PostgreSQL not installed (unguarded_fallback's contention mode)"
)]
fn every_process_mode_entry_is_caught_through_its_api_and_its_control_passes() {
    let list = scenario(&["flaws", "--list"]);
    let listed = text(&list);
    for origin in [
        "https://github.com/Meituan-Dianping/Leaf/pull/156",
        "https://github.com/didi/tinyid/issues/47",
        "https://github.com/baidu/uid-generator/issues/85",
        "https://github.com/apache/incubator-seata/issues/5256",
        "https://github.com/apache/incubator-seata/issues/6374",
    ] {
        assert!(listed.contains(origin), "{origin} missing from:\n{listed}");
    }
    compat_binary();
    let out = scenario(&["flaws", "--process"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    for (bug, check) in [
        ("leaf_pr156_commit_before_select", "ids.unique"),
        ("tinyid_issue47_load_race", "ids.monotonic"),
        ("uid_generator_issue85_borrowed_seconds", "ids.monotonic"),
        ("segment_no_version_check", "ids.unique"),
        ("semantic_seq_wrap", "ids.unique"),
        ("snowflake_seq_reset_first", "ids.unique"),
        (
            "seata_5256_6374_fence_rolled_back_with_try",
            "participant.unchanged",
        ),
        ("counter_no_persist", "ids.unique"),
        ("counter_everysec", "ids.unique"),
        ("time_field_narrow", "ids.monotonic"),
        ("tcc_no_fence", "participant.promises"),
        ("once_check_then_delete", "tokens.once"),
        ("sequential_tokens", "tokens.unguessable"),
        ("no_token_quota", "tokens.quota"),
        ("body_before_auth", "service.refused_from_head"),
        ("conn_slot_leak", "service.capacity_after_overload"),
        ("no_eviction", "service.new_client_when_full"),
        ("unguarded_fallback", "ids.unique"),
        ("past_block_repeat", "ids.unique"),
        ("skip_on_refill", "ids.gaps"),
    ] {
        let row = all
            .lines()
            .find(|l| l.starts_with(bug))
            .unwrap_or_else(|| panic!("no row for {bug}:\n{all}"));
        assert!(row.contains(" passed ") && row.contains(check), "{row}");
    }
}

/// `scenario tcc` owning a `sut-server` participant started with `flags`, restarted every 30
/// messages.
fn tcc_over_sut_server(flags: &str, extra: &[&str]) -> Output {
    tcc_with_secret(flags, extra, true)
}

/// [`tcc_over_sut_server`], the tester given the server's admin secret or another one.
fn tcc_with_secret(flags: &str, extra: &[&str], same_secret: bool) -> Output {
    let server = PathBuf::from(env!("CARGO_BIN_EXE_scenario")).with_file_name("sut-server");
    assert!(
        server.is_file(),
        "{} is missing: build it with `cargo build -p sut-server --bin sut-server`",
        server.display()
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = dir.path().join("admin-secret");
    std::fs::write(&secret, "a-test-admin-secret-of-32-bytes!").expect("secret written");
    // The coordinator's credential on the participant routes: not the operator's.
    let service = dir.path().join("service-secret");
    std::fs::write(&service, "a-test-service-credential-32-byte").expect("secret written");
    let service = service.display().to_string();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let command = format!(
        "exec {} --db {{data}}/p.db --listen 127.0.0.1:{port} --admin-token-file {} \
         --service-token-file {service} {flags}",
        server.display(),
        secret.display()
    );
    let secret = if same_secret {
        secret.display().to_string()
    } else {
        let wrong = dir.path().join("wrong-secret");
        std::fs::write(&wrong, "not-the-admin-secret-of-32-bytes").expect("secret written");
        wrong.display().to_string()
    };
    let args = [
        "tcc",
        "--url",
        &url,
        "--admin-token-file",
        &secret,
        "--service-token-file",
        &service,
        "--server-cmd",
        &command,
        "--kill-every",
        "30",
    ];
    scenario(&[&args[..], extra].concat())
}

#[test]
fn a_correct_participant_keeps_its_promises_across_restarts_and_an_unfenced_one_is_caught() {
    let correct = tcc_over_sut_server("", &["--sequences", "15"]);
    let all = text(&correct);
    assert_eq!(correct.status.code(), Some(0), "{all}");
    assert!(all.contains("answers met: 16 of the 16"), "{all}");
    assert!(all.contains("restarts)"), "{all}");
    assert!(!all.contains(" 0 restarts"), "{all}");
    let unfenced = tcc_over_sut_server("--flaw tcc_no_fence", &["--sequences", "15"]);
    let all = text(&unfenced);
    assert_eq!(unfenced.status.code(), Some(1), "{all}");
    assert!(violated_line(&unfenced, "participant.promises"), "{all}");
}

/// `scenario tcc` owning a `tcc-compat` participant (Seata's fence table) started with `flags`.
fn tcc_over_tcc_compat(flags: &str) -> Output {
    tcc_over_tcc_compat_with(flags, &[])
}

/// [`tcc_over_tcc_compat`], with `extra` arguments of `scenario tcc`.
fn tcc_over_tcc_compat_with(flags: &str, extra: &[&str]) -> Output {
    let compat = PathBuf::from(env!("CARGO_BIN_EXE_scenario")).with_file_name("tcc-compat");
    assert!(
        compat.is_file(),
        "{} is missing: build it with `cargo build -p compat --bin tcc-compat`",
        compat.display()
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = dir.path().join("admin-secret");
    std::fs::write(&secret, "a-test-admin-secret-of-32-bytes!").expect("secret written");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let command = format!(
        "exec {} --db {{data}}/p.db --payments {{data}}/pay.db --listen 127.0.0.1:{port} \
         --admin-token-file {} {flags}",
        compat.display(),
        secret.display()
    );
    let secret = secret.display().to_string();
    let args = [
        "tcc",
        "--url",
        &url,
        "--admin-token-file",
        &secret,
        "--server-cmd",
        &command,
        "--kill-every",
        "30",
        "--sequences",
        "30",
    ];
    scenario(&[&args[..], extra].concat())
}

/// A participant written as Seata's and DTM's samples are, taking the amount from its
/// coordinator and keeping no price list (`POST /admin/activities` is 404), is judged on every
/// other promise: the price check says it does not apply, and the fence bug is still caught.
#[test]
fn a_participant_without_a_price_list_is_judged_on_every_other_promise() {
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("tcc.json");
    let json_arg = json.display().to_string();
    let correct = tcc_over_tcc_compat_with("--no-registry", &["--json", &json_arg]);
    let all = text(&correct);
    assert_eq!(correct.status.code(), Some(0), "{all}");
    assert!(
        all.contains("price list: none (POST /admin/activities answered 404)"),
        "{all}"
    );
    let paid = all
        .lines()
        .find(|l| l.trim_start().starts_with("lottery.paid"))
        .unwrap_or_else(|| panic!("no lottery.paid line: {all}"));
    assert!(
        paid.contains("NOT CHECKED") && paid.contains("not applicable"),
        "{paid}"
    );
    for check in [
        "participant.promises",
        "participant.unchanged",
        "participant.books",
    ] {
        let line = all
            .lines()
            .find(|l| l.trim_start().starts_with(check))
            .unwrap_or_else(|| panic!("no {check} line: {all}"));
        assert!(line.contains("held"), "{line}");
    }
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written"))
            .expect("json parses");
    assert_eq!(
        doc["price_registry"],
        serde_json::json!({"absent": 404}),
        "{doc}"
    );
    let paid = doc["invariants"]
        .as_array()
        .expect("invariants")
        .iter()
        .find(|c| c["name"] == "lottery.paid")
        .expect("lottery.paid in the JSON");
    assert_eq!(paid["verdict"], "not_checked", "{paid}");

    let planted = tcc_over_tcc_compat("--no-registry --planted-fence-rollback");
    let all = text(&planted);
    assert_eq!(planted.status.code(), Some(1), "{all}");
    assert!(violated_line(&planted, "participant.unchanged"), "{all}");
}

#[test]
fn a_seata_style_participant_is_caught_when_a_failed_try_leaves_its_outside_effect() {
    let correct = tcc_over_tcc_compat("");
    let all = text(&correct);
    assert_eq!(correct.status.code(), Some(0), "{all}");
    let planted = tcc_over_tcc_compat("--planted-fence-rollback");
    let all = text(&planted);
    assert_eq!(planted.status.code(), Some(1), "{all}");
    assert!(violated_line(&planted, "participant.unchanged"), "{all}");
    assert!(all.contains("frozen_minor"), "{all}");
}

#[test]
fn a_participant_that_is_not_there_or_refuses_the_secret_is_a_usage_error() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = scenario(&["tcc", "--url", &url, "--sequences", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("/admin/accounts"), "{}", text(&out));
    let out = scenario(&["tcc", "--url", &url, "--kill-every", "3"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--server-cmd"), "{}", text(&out));
    // A wrong secret: the participant answers 401 and the run says so (exit 2, no verdict).
    let out = tcc_with_secret("", &["--sequences", "1"], false);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("401"), "{}", text(&out));
}

/// `scenario tokens` owning two `sut-server` instances on one database, started with `flags`,
/// restarted every 50 tokens.
fn tokens_over_two_sut_servers(flags: &str) -> Output {
    tokens_with(flags, &["--kill-every", "50"])
}

/// `scenario tokens` with `extra` options, owning two `sut-server` instances started with
/// `flags`.
fn tokens_with(flags: &str, extra: &[&str]) -> Output {
    let server = PathBuf::from(env!("CARGO_BIN_EXE_scenario")).with_file_name("sut-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let (admin, jwt) = (dir.path().join("admin"), dir.path().join("jwt"));
    std::fs::write(&admin, "a-test-admin-secret-of-32-bytes!").expect("secret written");
    std::fs::write(&jwt, "a-test-jwt-secret-of-at-least-32-bytes").expect("secret written");
    let admin = admin.display().to_string();
    let mut args: Vec<String> = ["tokens", "--admin-token-file", &admin, "--tokens", "150"]
        .map(String::from)
        .to_vec();
    args.extend(["--consumers", "6"].map(String::from));
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    for _ in 0..2 {
        let port = free_port();
        args.push("--url".into());
        args.push(format!("http://127.0.0.1:{port}"));
        args.push("--server-cmd".into());
        args.push(format!(
            "exec {} --db {{data}}/t.db --listen 127.0.0.1:{port} --admin-token-file {admin} \
             --jwt-secret-file {} {flags}",
            server.display(),
            jwt.display()
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    scenario(&args)
}

#[test]
fn correct_one_time_tokens_are_used_once_across_instances_and_restarts_and_a_two_step_consume_is_caught()
 {
    let correct = tokens_over_two_sut_servers("");
    let all = text(&correct);
    assert_eq!(correct.status.code(), Some(0), "{all}");
    assert!(all.contains("150 accepted over 150 tokens"), "{all}");
    assert!(all.contains("3 restarts"), "{all}");
    let flawed = tokens_over_two_sut_servers("--flaw once_check_then_delete");
    let all = text(&flawed);
    assert_eq!(flawed.status.code(), Some(1), "{all}");
    assert!(violated_line(&flawed, "tokens.once "), "{all}");
}

#[test]
fn the_hostile_client_checks_of_scenario_tokens_pass_on_sut_server_and_fire_on_its_weaknesses() {
    let correct = tokens_with("", &["--exhaust", "40"]);
    let all = text(&correct);
    assert_eq!(correct.status.code(), Some(0), "{all}");
    for check in ["tokens.owner_only", "tokens.unguessable", "tokens.quota"] {
        assert!(
            all.lines()
                .any(|l| l.trim_start().starts_with(check) && l.contains("held")),
            "{check}: {all}"
        );
    }
    // sut-server's burst is 20 one-time tokens per user.
    assert!(all.contains("refused at ask 21 of 40 (429)"), "{all}");
    let sequential = tokens_with("--weakness sequential_tokens", &[]);
    assert_eq!(sequential.status.code(), Some(1), "{}", text(&sequential));
    assert!(
        violated_line(&sequential, "tokens.unguessable"),
        "{}",
        text(&sequential)
    );
    let unlimited = tokens_with("--weakness no_token_quota", &["--exhaust", "40"]);
    assert_eq!(unlimited.status.code(), Some(1), "{}", text(&unlimited));
    assert!(
        violated_line(&unlimited, "tokens.quota"),
        "{}",
        text(&unlimited)
    );
    assert!(
        text(&unlimited).contains("issued all 40 asked"),
        "{}",
        text(&unlimited)
    );
}

/// The finding of docs/hostile.md: clients that hold keep-alive connections from many
/// addresses filled the server, and a client from any other address got no answer. With 700
/// held from three addresses against a server that holds 600, a paced new client is served as
/// before; the planted weakness `no_eviction` (the accept loop as it was) locks it out.
#[test]
fn held_connections_are_checked_and_a_full_sut_server_still_serves_a_new_client() {
    let held = ["--sequences", "3", "--held-clients", "700"];
    let correct = tcc_over_sut_server("--connections-max 600", &held);
    let all = text(&correct);
    assert_eq!(correct.status.code(), Some(0), "{all}");
    let line = all
        .lines()
        .find(|l| l.trim_start().starts_with("service.new_client_when_full"))
        .unwrap_or_else(|| panic!("no held-connections check: {all}"));
    // Held (not "not checked"): the server was full and closed some of them to make room.
    assert!(
        line.contains(" held ") && line.contains("refused or closed"),
        "{line}"
    );
    assert!(all.contains("held connections: a new client got"), "{all}");
    let weak = tcc_over_sut_server("--connections-max 600 --weakness no_eviction", &held);
    let all = text(&weak);
    assert_eq!(weak.status.code(), Some(1), "{all}");
    assert!(
        violated_line(&weak, "service.new_client_when_full"),
        "{all}"
    );
}

#[test]
fn slow_clients_are_checked_by_scenario_tokens_and_tcc() {
    let slow = ["--slow-clients", "200", "--stall-timeout-s", "20"];
    // Stalled connections against the accept loop as it was: kept open.
    let weak = tokens_with("--weakness no_read_timeout", &slow);
    assert_eq!(weak.status.code(), Some(1), "{}", text(&weak));
    assert!(
        violated_line(&weak, "service.stalled_closed"),
        "{}",
        text(&weak)
    );
    // The participant as it is: its ledger answered as fast with them open, each closed.
    let tcc = tcc_over_sut_server("", &[&["--sequences", "5"][..], &slow].concat());
    let all = text(&tcc);
    assert_eq!(tcc.status.code(), Some(0), "{all}");
    for check in ["service.slow_clients", "service.stalled_closed"] {
        assert!(
            all.lines()
                .any(|l| l.trim_start().starts_with(check) && l.contains("held")),
            "{check}: {all}"
        );
    }
}

#[test]
fn unauthenticated_bodies_are_checked_by_scenario_tcc() {
    let bodies = ["--sequences", "3", "--unauth-bodies", "200"];
    // The participant as it is: each refused from its head, its memory as it was.
    let correct = tcc_over_sut_server("", &bodies);
    let all = text(&correct);
    assert_eq!(correct.status.code(), Some(0), "{all}");
    for check in [
        "service.refused_from_head",
        "service.unauthenticated_memory",
    ] {
        assert!(
            all.lines()
                .any(|l| l.trim_start().starts_with(check) && l.contains("held")),
            "{check}: {all}"
        );
    }
    assert!(all.contains("unauthenticated bodies:"), "{all}");
    // One that reads a body before it looks at the credential waits for bodies that never end.
    let weak = tcc_over_sut_server("--weakness body_before_auth", &bodies);
    assert_eq!(weak.status.code(), Some(1), "{}", text(&weak));
    assert!(
        violated_line(&weak, "service.refused_from_head"),
        "{}",
        text(&weak)
    );
}

#[test]
#[cfg_attr(not(has_faketime), ignore = "libfaketime not installed (clock steps)")]
#[cfg_attr(not(has_fuse), ignore = "no /dev/fuse (power losses)")]
fn semantic_ids_of_two_sut_servers_stay_unique_under_kills_pauses_clock_steps_and_power_losses() {
    let server = PathBuf::from(env!("CARGO_BIN_EXE_scenario")).with_file_name("sut-server");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_scenario"));
    cmd.args([
        "ids",
        "--target",
        "http",
        "--key",
        "OD",
        "--json-pointer",
        "/number",
    ]);
    cmd.args([
        "--duration",
        "8",
        "--nemesis",
        "kill,pause,clock,power_loss",
    ]);
    cmd.args([
        "--every-ms",
        "700",
        "--down-ms",
        "300",
        "--clock-step-ms",
        "3000",
    ]);
    for _ in 0..2 {
        let port = free_port();
        cmd.args([
            "--url",
            &format!("http://127.0.0.1:{port}/semantic/{{key}}"),
        ]);
        cmd.args([
            "--server-cmd",
            &format!(
                "exec env SUT_ADMIN_TOKEN=a-test-admin-secret-of-32-bytes! {} --db {{data}}/ids.db \
                 --listen 127.0.0.1:{port} --semantic-per-second 2000",
                server.display()
            ),
        ]);
    }
    let out = cmd.output().expect("scenario runs");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        all.lines()
            .any(|l| l.trim_start().starts_with("ids.unique") && l.contains("held")),
        "{all}"
    );
    assert!(all.contains("faults.took_effect           held"), "{all}");
    assert!(all.contains("lost writes: "), "{all}");
}
