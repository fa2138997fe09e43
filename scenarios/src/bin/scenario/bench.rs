//! `scenario bench`: the simulator's speed against a bare madsim ping-pong of the same node count.

use std::process::ExitCode;

use crate::USAGE;
use crate::simulate::write_atomic;

pub(crate) fn bench(name: &str, seeds: u64, json: Option<&std::path::Path>) -> ExitCode {
    let scenario = match scenarios::load(name) {
        Ok(s) => s,
        Err(err) => {
            eprintln!("scenario: {err}");
            return ExitCode::from(USAGE);
        }
    };
    let seeds: Vec<u64> = (0..seeds.max(1)).collect();
    let nodes = sim::run::node_names(&scenario).len();
    let sim_ms = (scenario.run.safety_ms + scenario.run.liveness_ms) * seeds.len() as u64;
    eprintln!(
        "bench: {} seeds of {} and a {nodes}-node madsim ping-pong of the same simulated length, one thread",
        seeds.len(),
        scenario.name
    );
    let baseline = sim::bench::ping_pong(nodes, sim_ms, 1);
    let cluster = sim::bench::cluster(&scenario, &seeds);
    let ratio = cluster.per_wall_second() / baseline.per_wall_second().max(1e-9);
    println!(
        "{:<28} {:>14} {:>12} {:>14} {:>12}",
        "run", "messages", "wall s", "messages/s", "sim s/wall s"
    );
    for (label, r) in [
        ("madsim ping-pong (baseline)", &baseline),
        (scenario.name.as_str(), &cluster),
    ] {
        println!(
            "{label:<28} {:>14} {:>12.2} {:>14.0} {:>12.1}",
            r.messages,
            r.wall_seconds,
            r.per_wall_second(),
            r.compression()
        );
    }
    println!("message rate ratio (cluster / baseline): {ratio:.2}");
    println!(
        "time compression of {}: {:.1}x",
        scenario.name,
        cluster.compression()
    );
    if let Some(path) = json {
        let doc = serde_json::json!({
            "scenario": scenario.name,
            "nodes": nodes,
            "baseline": baseline,
            "cluster": cluster,
            "message_rate_ratio": ratio,
            "time_compression": cluster.compression(),
        });
        if let Err(err) = serde_json::to_string_pretty(&doc)
            .map_err(std::io::Error::other)
            .and_then(|t| write_atomic(path, &t))
        {
            eprintln!("scenario: cannot write {}: {err}", path.display());
            return ExitCode::from(USAGE);
        }
    }
    ExitCode::SUCCESS
}
