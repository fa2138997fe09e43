//! The file-level import graph of a crate, read from its sources, and the circles in it (used by
//! `sut/tests/import_circles.rs` and `sim/tests/import_circles.rs`).
//!
//! A file imports another when its non-test code names an item path that resolves to it:
//! `crate::a::b::…`, `super::…` or `self::…` (in `use` lines, braces expanded, or inline in
//! code), or `child::…` for a module the file declares. A path resolves to the deepest file
//! module it passes through (`crate::lottery::wheel::EDGES` → `lottery/wheel.rs`;
//! `crate::lottery::Xid` → `lottery/mod.rs`). Not arrows: `mod x;` declarations, `pub use`
//! re-exports (a module's front door, not a dependency of its own), comments, `#[cfg(test)]`
//! items, paths into other crates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// File (relative to `src/`, `/`-separated) → the files it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module path of a file: `lottery/wheel.rs` → `[lottery, wheel]`; `lottery/mod.rs` and
/// `lib.rs` end at their folder.
fn module_of(file: &str) -> Vec<String> {
    let trimmed = file.trim_end_matches(".rs");
    let mut parts: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// The file of the deepest module of `path` (module segments then item names) among `files`.
fn resolve(path: &[String], files: &BTreeSet<String>) -> Option<String> {
    for len in (0..=path.len()).rev() {
        let dir = path[..len].join("/");
        let candidates = if len == 0 {
            vec!["lib.rs".to_owned(), "main.rs".to_owned()]
        } else {
            vec![format!("{dir}.rs"), format!("{dir}/mod.rs")]
        };
        if let Some(found) = candidates.into_iter().find(|c| files.contains(c)) {
            return Some(found);
        }
    }
    None
}

/// The code that counts: comments removed, `#[cfg(test)]` items (a `mod x;` line or a braced
/// block) left out, `pub use` lines left out.
pub fn non_test_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().map(|l| match l.find("//") {
        Some(at) => &l[..at],
        None => l,
    });
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with("#[cfg(test)]") {
            // Skip the next item: one line ending in `;`, or a block up to its closing brace.
            let mut depth = 0i64;
            let mut opened = false;
            for item in lines.by_ref() {
                depth += item.matches('{').count() as i64 - item.matches('}').count() as i64;
                opened |= item.contains('{');
                if (opened && depth <= 0) || (!opened && item.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        if trimmed.starts_with("pub use ") || trimmed.starts_with("pub(crate) use ") {
            // A re-export, possibly over several lines.
            if !trimmed.ends_with(';') {
                for more in lines.by_ref() {
                    if more.trim_end().ends_with(';') {
                        break;
                    }
                }
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The paths `code` names after `prefix` (`crate::`, `super::`, …), each as segments, braces
/// expanded one level deep (`crate::a::{b::X, c}` → `a::b::X`, `a::c`).
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        // Not part of a longer identifier (`mysuper::`).
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let mut rest = &code[at + prefix.len()..];
        let mut segments = Vec::new();
        loop {
            if let Some(inner) = rest.strip_prefix('{') {
                let inside = inner.split('}').next().unwrap_or("");
                for part in inside.split(',') {
                    let mut path = segments.clone();
                    path.extend(
                        part.trim()
                            .split("::")
                            .map(|s| ident(s.trim()).to_owned())
                            .filter(|s| !s.is_empty() && s != "self"),
                    );
                    found.push(path);
                }
                break;
            }
            let name = ident(rest);
            if name.is_empty() {
                found.push(segments);
                break;
            }
            segments.push(name.to_owned());
            match rest[name.len()..].strip_prefix("::") {
                Some(next) => rest = next,
                None => {
                    found.push(segments);
                    break;
                }
            }
        }
    }
    found
}

/// The modules `code` declares (`mod x;`, `pub mod x;`).
fn declared_modules(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            l.strip_prefix("mod ")
                .and_then(|rest| rest.strip_suffix(';'))
                .map(str::to_owned)
        })
        .collect()
}

/// The arrows of one file (`file`, relative to `src/`) whose code is `code`.
pub fn arrows(file: &str, code: &str, files: &BTreeSet<String>) -> BTreeSet<String> {
    let own = module_of(file);
    let parent: Vec<String> = own[..own.len().saturating_sub(1)].to_vec();
    let mut targets = BTreeSet::new();
    let mut add = |base: &[String], rest: &[String]| {
        let mut path = base.to_vec();
        path.extend_from_slice(rest);
        if let Some(target) = resolve(&path, files)
            && target != file
        {
            targets.insert(target);
        }
    };
    for path in paths_after(code, "crate::") {
        add(&[], &path);
    }
    for path in paths_after(code, "super::") {
        add(&parent, &path);
    }
    for path in paths_after(code, "self::") {
        add(&own, &path);
    }
    for child in declared_modules(code) {
        for path in paths_after(code, &format!("{child}::")) {
            let mut full = vec![child.clone()];
            full.extend(path);
            add(&own, &full);
        }
    }
    targets
}

/// The import graph of the crate whose sources are under `src`.
pub fn graph_of(src: &Path) -> Graph {
    let mut paths = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path: PathBuf = entry.expect("directory entry").path();
            if path.is_dir() {
                // Test folders hold tests only.
                if path.file_name().is_some_and(|n| n != "tests") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_stem().is_some_and(|s| s != "tests")
            {
                paths.push(path);
            }
        }
    }
    let relative = |p: &Path| {
        p.strip_prefix(src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/")
    };
    let files: BTreeSet<String> = paths.iter().map(|p| relative(p)).collect();
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let file = relative(path);
            let deps = arrows(&file, &non_test_code(&text), &files);
            (file, deps)
        })
        .collect()
}

/// Every circle of `graph` (its strongly connected components of two files or more), each
/// sorted.
pub fn circles(graph: &Graph) -> Vec<Vec<String>> {
    // Two files are in one circle when each reaches the other.
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_owned()];
        while let Some(node) = stack.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|k| (k, reach(k))).collect();
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for node in graph.keys() {
        if placed.contains(node) || !reached[node].contains(node) {
            continue;
        }
        let ring: Vec<String> = reached[node]
            .iter()
            .filter(|other| reached.get(other).is_some_and(|r| r.contains(node)))
            .cloned()
            .collect();
        placed.extend(ring.iter().cloned());
        out.push(ring);
    }
    out
}

/// A circle, with what ties each file to the next of it.
pub fn describe(ring: &[String], graph: &Graph) -> String {
    let members: BTreeSet<&String> = ring.iter().collect();
    let mut lines = vec![format!("{} files: {}", ring.len(), ring.join(", "))];
    for file in ring {
        let into: Vec<&String> = graph[file].iter().filter(|t| members.contains(t)).collect();
        lines.push(format!(
            "  {file} -> {}",
            into.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    lines.join("\n")
}

/// Panics naming every circle of the crate whose sources are under `src` (at least
/// `files_min` files must have been read).
pub fn assert_no_circles(src: &Path, files_min: usize) {
    let graph = graph_of(src);
    assert!(
        graph.len() >= files_min,
        "too few files read under {}: {}",
        src.display(),
        graph.len()
    );
    let found: Vec<String> = circles(&graph)
        .iter()
        .map(|ring| describe(ring, &graph))
        .collect();
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// Self-test of the reader and the circle finder on small inputs.
pub fn self_test() {
    let files: BTreeSet<String> = ["lib.rs", "a.rs", "b/mod.rs", "b/c.rs", "b/d.rs"]
        .map(str::to_owned)
        .into();
    let code = non_test_code(
        "use crate::b::c::X;\n// crate::b::d in a comment\npub use crate::b::d::Y;\n\
         fn f() { crate::b::Z }\n#[cfg(test)]\nmod tests {\n    use crate::b::d::W;\n}\n",
    );
    let got = arrows("a.rs", &code, &files);
    assert_eq!(got, ["b/c.rs", "b/mod.rs"].map(str::to_owned).into());
    // `super::` from a child is its parent's module; braces expand.
    let got = arrows("b/c.rs", "use super::{d::Q, R};", &files);
    assert_eq!(got, ["b/d.rs", "b/mod.rs"].map(str::to_owned).into());
    // A parent calling into a child it declares.
    let got = arrows("b/mod.rs", "mod c;\nfn g() { c::run() }", &files);
    assert_eq!(got, ["b/c.rs"].map(str::to_owned).into());
    // The finder: a ring of two and a file outside it.
    let graph: Graph = [
        ("a.rs", vec!["b/c.rs"]),
        ("b/c.rs", vec!["b/mod.rs"]),
        ("b/mod.rs", vec!["b/c.rs"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        circles(&graph),
        [vec!["b/c.rs".to_owned(), "b/mod.rs".to_owned()]]
    );
}
