//! No import cycles inside a module: within each directory module of `sut` (`lottery`, `token`,
//! `segment`, `snowflake`, `id_store`), the sibling files form layers. A sibling that needs
//! another's items imports them; if two siblings (or a longer ring) import each other, the ring
//! is reported and this test fails.
//!
//! The check reads the sources: a file depends on a sibling when its non-test code names it as
//! `super::NAME` or `crate::MODULE::NAME` (doc comments and `#[cfg(test)]` modules do not count;
//! a test may reach anywhere). Items of the parent `mod.rs` (the shared types) are not a sibling.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The directory modules whose siblings must form layers.
const MODULES: &[&str] = &["lottery", "token", "segment", "snowflake", "id_store"];

/// Sibling name → the siblings it imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The code of a file that counts: everything before its first `#[cfg(test)]`, without comments.
fn non_test_code(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    code.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The siblings among `names` that `code` (a file of module `module`) refers to.
fn referenced(code: &str, module: &str, names: &BTreeSet<String>, own: &str) -> BTreeSet<String> {
    let prefixes = [
        "super::".to_owned(),
        format!("crate::{module}::"),
        format!("sut::{module}::"),
    ];
    let mut found = BTreeSet::new();
    for prefix in &prefixes {
        for (at, _) in code.match_indices(prefix.as_str()) {
            let rest = &code[at + prefix.len()..];
            let ident: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if ident != own && names.contains(&ident) {
                found.insert(ident);
            }
        }
        // `use super::{a::X, b::Y}`: the names inside the braces.
        for (at, _) in code.match_indices(&format!("{prefix}{{")) {
            let rest = &code[at + prefix.len() + 1..];
            let inside = rest.split('}').next().unwrap_or("");
            for part in inside.split(',') {
                let head = part.trim().split("::").next().unwrap_or("").trim();
                if head != own && names.contains(head) {
                    found.insert(head.to_owned());
                }
            }
        }
    }
    found
}

/// The sibling graph of one directory module, read from disk.
fn graph_of(dir: &Path, module: &str) -> Graph {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
        .filter(|path| {
            path.file_stem()
                .is_some_and(|stem| stem != "mod" && stem != "tests")
        })
        .collect();
    let names: BTreeSet<String> = files
        .iter()
        .filter_map(|path| path.file_stem()?.to_str().map(str::to_owned))
        .collect();
    files
        .iter()
        .map(|path| {
            let own = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let deps = referenced(&non_test_code(&text), module, &names, own);
            (own.to_owned(), deps)
        })
        .collect()
}

/// One import cycle of `graph`, as the ring of names (first repeated at the end), if any.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut ring = path[at..].to_vec();
            ring.push(node.to_owned());
            return Some(ring);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(ring) = visit(next, graph, path, done) {
                return Some(ring);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn sibling_modules_form_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut cycles = Vec::new();
    for module in MODULES {
        let graph = graph_of(&src.join(module), module);
        assert!(!graph.is_empty(), "{module}: no source file read");
        if let Some(ring) = find_cycle(&graph) {
            cycles.push(format!("{module}: {}", ring.join(" -> ")));
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_reader_sees_imports_and_the_cycle_finder_fires() {
    let names: BTreeSet<String> = ["fence", "rules", "rows"].map(str::to_owned).into();
    let code = non_test_code(
        "use super::{rows::X, fence::Y};\n// super::rules in a comment\nfn f() { crate::lottery::rules::g() }\n#[cfg(test)]\nmod tests { use super::store::Z; }",
    );
    let deps = referenced(&code, "lottery", &names, "ledger");
    assert_eq!(
        deps,
        ["fence", "rows", "rules"].map(str::to_owned).into(),
        "braced, plain and crate paths are read; comments and tests are not"
    );

    let ring: Graph = [
        ("fence".to_owned(), ["rules".to_owned()].into()),
        ("rules".to_owned(), ["fence".to_owned()].into()),
        ("rows".to_owned(), BTreeSet::new()),
    ]
    .into();
    assert_eq!(
        find_cycle(&ring),
        Some(vec!["fence".into(), "rules".into(), "fence".into()])
    );
    let layered: Graph = [
        ("fence".to_owned(), ["rows".to_owned()].into()),
        (
            "rules".to_owned(),
            ["fence".to_owned(), "rows".to_owned()].into(),
        ),
        ("rows".to_owned(), BTreeSet::new()),
    ]
    .into();
    assert_eq!(find_cycle(&layered), None);
}
