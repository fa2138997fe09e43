//! Runs one load test and prints the report (plus a `diagnostics` object: client send
//! lateness, latency from the schedule) as JSON (a stand-in for the bench CLI, used for the
//! figures in docs/load.md).
//!
//! `cargo run --release -p load --example load -- WORKLOAD USERS RATE|closed DURATION_S
//! WARMUP_S [HOST|-] [HLOG_DIR|-] [FLAW]` (WORKLOAD `crash_under_load`: three kills)

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let get = |i: usize, d: &str| a.get(i).cloned().unwrap_or_else(|| d.to_owned());
    let rate = get(2, "closed");
    let opts = load::LoadOptions {
        workload: get(0, "id"),
        users: get(1, "16").parse().expect("USERS"),
        rate: if rate == "closed" {
            None
        } else {
            Some(rate.parse().expect("RATE"))
        },
        duration_s: get(3, "10").parse().expect("DURATION_S"),
        warmup_s: get(4, "2").parse().expect("WARMUP_S"),
        host: a.get(5).filter(|h| h.as_str() != "-").cloned(),
        hlog_dir: a
            .get(6)
            .filter(|d| d.as_str() != "-")
            .map(std::path::PathBuf::from),
        flaw: a.get(7).map(|f| f.parse().expect("FLAW")),
        ..load::LoadOptions::default()
    };
    let result = if opts.workload == "crash_under_load" {
        // kill -9 three times (for the flaw runs of docs/load.md)
        load::crash_under_load(load::CrashOptions {
            users: opts.users,
            rate: opts.rate,
            duration_s: opts.duration_s,
            kills: 3,
            hlog_dir: None,
            mix: None,
            flaw: opts.flaw,
        })
        .map(|r| (r, load::Diagnostics::default()))
    } else {
        load::run_detailed(opts)
    };
    match result {
        Ok((report, diag)) => {
            let mut doc = serde_json::to_value(&report).expect("serializable report");
            doc["diagnostics"] = serde_json::json!({
                "send_lateness": diag.send_lateness,
                "sends": diag.sends,
                "from_schedule": diag.from_schedule.iter().map(|(n, p)| (n.clone(), serde_json::to_value(p).expect("serializable"))).collect::<serde_json::Map<_, _>>(),
            });
            println!(
                "{}",
                serde_json::to_string_pretty(&doc).expect("serializable report")
            );
            if !report.passed() {
                eprintln!("verification FAILED");
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    }
}
