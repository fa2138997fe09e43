//! `scenario list` and `scenario edges`: what can be run, and every declared edge state.

use std::process::ExitCode;

/// `scenario list`: the load scenarios, then the simulated ones.
pub(crate) fn list() -> ExitCode {
    for (name, description) in scenarios::load_list() {
        println!("{name:<20} {description}");
    }
    for (name, _) in scenarios::NAMED {
        let description = scenarios::load(name)
            .map(|s| s.description)
            .unwrap_or_else(|e| format!("(broken: {e})"));
        println!("{name:<20} {description}");
    }
    for (name, text) in scenarios::realfile::NAMED {
        let description = scenarios::realfile::RealScenario::parse(name, text)
            .map(|s| s.description)
            .unwrap_or_else(|e| format!("(broken: {e})"));
        println!("{name:<20} {description}");
    }
    ExitCode::SUCCESS
}

/// `scenario edges`: every declared edge state, what it is, and the named scenarios and models
/// that own it. Stops quietly when stdout is closed (`| head`).
pub(crate) fn edges() -> ExitCode {
    use std::io::Write;
    let owners = scenarios::edge_owners();
    let mut out = std::io::stdout().lock();
    for edge in sut::edge_registry::all() {
        let mut by: Vec<String> = owners
            .get(edge.name)
            .map(|names| names.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        by.extend(
            models::catalog()
                .iter()
                .filter(|m| m.edges.contains(&edge.name))
                .map(|m| format!("model {}", m.name)),
        );
        let by = if by.is_empty() {
            "owned by no scenario or model".to_owned()
        } else {
            format!("owned by {}", by.join(", "))
        };
        if writeln!(out, "{:<40} {}\n{:<40} {by}", edge.name, edge.about, "").is_err() {
            break;
        }
    }
    ExitCode::SUCCESS
}
