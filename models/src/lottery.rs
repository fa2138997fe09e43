//! The TCC lottery model: not built yet (see the report in `docs/models.md`).

use crate::{ModelError, ModelOptions, ModelReport};

/// Catalog name.
pub const NAME: &str = "lottery";
/// Catalog description.
pub const DESCRIPTION: &str = "TCC lottery (not built yet)";
/// Flaws.
pub const FLAWS: &[&str] = &[];

pub(crate) fn check(
    _flaw: Option<&str>,
    name: &str,
    _opts: &ModelOptions,
) -> Result<ModelReport, ModelError> {
    Err(ModelError::InvalidOptions(format!(
        "model `{name}` is not built yet"
    )))
}

pub(crate) fn serve(_flaw: Option<&str>, addr: &str) -> Result<(), ModelError> {
    Err(ModelError::Serve {
        addr: addr.to_owned(),
        reason: "the lottery model is not built yet".into(),
    })
}
