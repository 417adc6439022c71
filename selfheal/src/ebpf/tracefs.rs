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

/// Offset of `field` in the record of event `category/name`, from its
/// `format` file.
pub fn field_offset(root: &Path, category: &str, name: &str, field: &str) -> Result<u64, String> {
    let path = root.join("events").join(category).join(name).join("format");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_field_offset(&text, field)
        .ok_or_else(|| format!("{} has no field `{field}`", path.display()))
}
