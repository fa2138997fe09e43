//! No import circle across the files of `sim` (the reader is `sut`'s: see
//! `sut/tests/import_circles.rs`): the network, the world, BUGGIFY, the nemesis and the nodes
//! form layers.

use std::path::Path;

// The sut test runs the reader's self-test.
#[allow(dead_code)]
#[path = "../../sut/tests/support/imports.rs"]
mod imports;

#[test]
fn sim_has_no_import_circle_across_files() {
    let graph = imports::graph_of(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(graph.len() > 15, "too few files read: {}", graph.len());
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
