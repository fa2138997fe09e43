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
    imports::assert_no_circles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), 15);
}
