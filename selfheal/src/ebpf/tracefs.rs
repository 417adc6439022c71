//! Reads tracefs event formats, to check that the classic tracepoints'
//! record layout is the one the eBPF programs read.

use std::path::{Path, PathBuf};

use selfheal_core::ebpf::tracefs::parse_field_offset;

/// Where tracefs is mounted, if it is.
pub fn root() -> Option<PathBuf> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// Why an event's `format` file did not give a field's offset.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file names no such field.
    #[error("{} has no field `{field}`", path.display())]
    NoField { path: PathBuf, field: String },
}

/// Offset of `field` in the record of event `category/name`, from its
/// `format` file.
pub fn field_offset(
    root: &Path,
    category: &str,
    name: &str,
    field: &str,
) -> Result<u64, FormatError> {
    let path = root.join("events").join(category).join(name).join("format");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => return Err(FormatError::Read { path, source }),
    };
    parse_field_offset(&text, field).ok_or_else(|| FormatError::NoField {
        path,
        field: field.to_string(),
    })
}
