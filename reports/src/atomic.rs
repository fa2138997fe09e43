//! Writing a file whole or not at all: the report writer, the gate's baseline, the scenario
//! command's JSON, regression and replay files all go through [`write_atomic`]. A reader sees
//! the old file or the new one, never a truncated one; no temporary file is left behind.

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Why a file could not be written: the step, the file and the error.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct AtomicWriteError {
    /// What was being done (`create`, `write`, `fsync`, `rename into place`).
    pub op: &'static str,
    /// The file it was done to.
    pub path: PathBuf,
    /// The error.
    #[source]
    pub source: std::io::Error,
}

fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> AtomicWriteError + 'a {
    move |source| AtomicWriteError {
        op,
        path: path.to_owned(),
        source,
    }
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` atomically: temp file in the same directory, fsync, rename, fsync
/// of the directory. On any error the temp file is removed and `path` is untouched.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "report".to_owned());
    let tmp = dir.join(format!(
        ".{file_name}.tmp-{}-{}",
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(bytes).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        drop(f);
        fs::rename(&tmp, path).map_err(io_err("rename into place", path))?;
        // Make the rename itself durable. Opening a directory for fsync works on Unix; elsewhere
        // it may fail, which does not make the write less atomic.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
