//! Whether a file that decides what selfheal does with its privileges — the
//! config (which processes to signal, which restart command to run) and the
//! helper's policy (who may act on whom) — could have been written by
//! someone selfheal must not trust. This module owns that one rule,
//! opening such a file by it ([`open_trusted`]) and reading it as text
//! ([`read_trusted_text`]); the callers own their errors' types.
//!
//! Trusted are root and the user selfheal runs as. The file and every
//! directory above it (along its real path) must be owned by a trusted
//! user and not writable by group or others; a sticky directory (`/tmp`)
//! is accepted above the file's own directory, and — where the caller
//! allows it ([`Sticky::AlsoItsOwn`], the config) — as the file's own
//! directory too: others may not rename or remove there what they do not
//! own, and a file they put there first is theirs, which is refused.

use std::{
    fs::File,
    io::Read as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use selfheal_core::{
    access::policy::PolicyError,
    config::{ConfigError, line_col, walk::Invalid},
};

/// Why a file was not opened.
#[derive(Debug)]
pub enum TrustError {
    /// It (or a directory above it) cannot be read; `path` is the one that
    /// failed.
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Someone untrusted could have written or replaced it.
    Untrusted { reason: String },
}

/// Where a sticky, world-writable directory (`/tmp`) is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sticky {
    /// Only above the file's own directory (the helper's policy: it must
    /// live in a directory of root's).
    AboveItsOwn,
    /// As the file's own directory too (a config in `/tmp`).
    AlsoItsOwn,
}

/// The error type of a file read by [`read_trusted_text`]: how it says
/// that the file could not be read, could not be trusted, or is not valid.
pub trait FileError: Invalid {
    fn read(path: PathBuf, error: std::io::Error) -> Self;
    fn untrusted(path: &Path, reason: String) -> Self;
}

/// The config's and the policy's errors, whose `Read` and `Untrusted`
/// variants are the same.
macro_rules! file_error {
    ($($t:ident),+) => {$(
        impl FileError for $t {
            fn read(path: PathBuf, error: std::io::Error) -> Self {
                $t::Read { path, error }
            }
            fn untrusted(path: &Path, reason: String) -> Self {
                $t::Untrusted {
                    path: path.to_path_buf(),
                    reason,
                }
            }
        }
    )+};
}
file_error!(ConfigError, PolicyError);

/// Reads `path` as UTF-8 text of at most `max_bytes` after
/// [`open_trusted`] opened it.
pub fn read_trusted_text<E: FileError>(
    path: &Path,
    euid: u32,
    sticky: Sticky,
    max_bytes: u64,
) -> Result<String, E> {
    let file = open_trusted(path, euid, sticky).map_err(|e| match e {
        TrustError::Read { path, error } => E::read(path, error),
        TrustError::Untrusted { reason } => E::untrusted(path, reason),
    })?;
    let mut bytes = Vec::new();
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| E::read(path.to_path_buf(), error))?;
    if bytes.len() as u64 > max_bytes {
        let message = format!("file larger than {} MiB", max_bytes >> 20);
        return Err(E::invalid(path, 1, 1, message));
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let text = String::from_utf8_lossy(&e.as_bytes()[..valid]);
        let (line, column) = line_col(&text, valid);
        E::invalid(path, line, column, "not UTF-8 text".into())
    })
}

/// Opens `path` for reading after checking that only root or `euid` could
/// have written it or replaced it. Symlinks are resolved once, first; the
/// checks and the open are on the real path, and the open refuses a
/// symlink put there meanwhile. A directory is a read error (`EISDIR`), as
/// reading it would be.
pub fn open_trusted(path: &Path, euid: u32, sticky: Sticky) -> Result<File, TrustError> {
    let read_err = |p: &Path| {
        let p = p.to_path_buf();
        move |error| TrustError::Read { path: p, error }
    };
    let untrusted = |reason: String| TrustError::Untrusted { reason };
    let trusted = |uid: u32| uid == 0 || uid == euid;
    let owner_name = if euid == 0 {
        "root".to_string()
    } else {
        format!("root or uid {euid}")
    };
    let real = std::fs::canonicalize(path).map_err(read_err(path))?;
    if std::fs::metadata(&real).is_ok_and(|md| md.is_dir()) {
        return Err(TrustError::Read {
            path: path.to_path_buf(),
            error: std::io::Error::from_raw_os_error(libc::EISDIR),
        });
    }
    let mut dir = real.parent();
    let mut first = true;
    while let Some(d) = dir {
        let md = std::fs::metadata(d).map_err(read_err(d))?;
        if !trusted(md.uid()) {
            return Err(untrusted(format!(
                "directory {} is owned by uid {}, not {owner_name}",
                d.display(),
                md.uid()
            )));
        }
        let mode = md.mode() & 0o7777;
        let sticky_ok = mode & 0o1000 != 0 && (!first || sticky == Sticky::AlsoItsOwn);
        if mode & 0o022 != 0 && !sticky_ok {
            return Err(untrusted(format!(
                "directory {} is writable by group or others (mode {mode:04o})",
                d.display()
            )));
        }
        first = false;
        dir = d.parent();
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&real)
        .map_err(read_err(path))?;
    let md = file.metadata().map_err(read_err(path))?;
    if !md.is_file() {
        return Err(untrusted("not a regular file".into()));
    }
    if !trusted(md.uid()) {
        return Err(untrusted(format!(
            "owned by uid {}, not {owner_name}",
            md.uid()
        )));
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(untrusted(format!(
            "writable by group or others (mode {mode:04o}); run chmod go-w on it"
        )));
    }
    Ok(file)
}
