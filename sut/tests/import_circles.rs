//! No import circle across the files of `sut`: every file's imports (read from its sources by
//! `support/imports.rs`) form layers, so a file can be read, changed and tested from the bottom
//! up. The edge-state registry (`edge_registry.rs`) is apart from the counter (`edge.rs`) for
//! this reason.

use std::path::Path;

#[path = "support/imports.rs"]
mod imports;

#[test]
fn the_reader_and_the_circle_finder_work() {
    imports::self_test();
}

#[test]
fn sut_has_no_import_circle_across_files() {
    let graph = imports::graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 30, "too few files read: {}", graph.len());
    let circles: Vec<String> = imports::circles(&graph)
        .iter()
        .map(|ring| imports::describe(ring, &graph))
        .collect();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}
