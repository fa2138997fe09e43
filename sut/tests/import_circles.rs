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
    imports::assert_no_circles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), 30);
}
