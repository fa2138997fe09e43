//! No import circle across the files of `reports` (the reader is `sut`'s: see
//! `sut/tests/import_circles.rs`): the result model and the atomic writer at the bottom, the
//! gate, the charts and the HTML above them, the report writer on top.

use std::path::Path;

// The sut test runs the reader's self-test.
#[allow(dead_code)]
#[path = "../../sut/tests/support/imports.rs"]
mod imports;

#[test]
fn reports_has_no_import_circle_across_files() {
    imports::assert_no_circles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), 6);
}
