//! The files selfheal keeps, and the one way it writes them: every state
//! directory and snapshot directory is held open as a [`safedir::SafeDir`]
//! (a real directory of ours that nobody else can write to, reached only
//! through directories only root or we can change), locked with
//! `lock_file`, and written atomically through that descriptor. The
//! state file ([`crate::store`]) and the snapshot log
//! ([`crate::snapshots`]) are built on this room; its error is theirs.

use std::{
    fs::{self, File},
    io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

pub mod safedir;

use self::safedir::SafeDir;

/// Why the state directory, the state file or the snapshot log cannot be
/// used. Content problems in the state file are not errors (see
/// [`crate::store::StateStore::load`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A system call failed; `action` says what we tried ("create", "write",
    /// "fsync", …).
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        error: io::Error,
    },
    /// The directory is a symlink (it could point anywhere).
    #[error("refusing {}: it is a symlink (give the real directory)", path.display())]
    Symlink { path: PathBuf },
    /// The path exists and is not a directory.
    #[error("refusing {}: not a directory (give a directory, or move the file away)", path.display())]
    NotDirectory { path: PathBuf },
    /// The directory belongs to another user.
    #[error(
        "refusing {}: owned by uid {owner}, not by this user (uid {euid}); give a directory \
         of your own, or have uid {owner} (or root) remove this one",
        path.display()
    )]
    NotOwner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    /// A directory above it could be changed by another user, who could
    /// then swap the directory (or a symlink on the way to it) for another.
    #[error("refusing {}: {} above it {reason}", path.display(), ancestor.display())]
    UnsafeAncestor {
        path: PathBuf,
        ancestor: PathBuf,
        reason: String,
    },
    /// Others could replace our files.
    #[error(
        "refusing {}: writable by group or others (mode {mode:04o}); run chmod go-w on it",
        path.display()
    )]
    Writable { path: PathBuf, mode: u32 },
    /// Another run held the lock for longer than we wait.
    #[error(
        "{} is locked by another selfheal run{} (waited {:.1} s)",
        path.display(),
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        waited.as_secs_f64()
    )]
    Locked {
        path: PathBuf,
        waited: Duration,
        /// The pid the holder wrote into the lock file, if readable.
        holder: Option<u32>,
    },
    /// The value could not be turned into JSON.
    #[error("cannot serialize the record for {}: {error}", path.display())]
    Serialize {
        path: PathBuf,
        error: serde_json::Error,
    },
    /// The path no longer leads to the directory checked when it was
    /// opened (renamed away, or a symlink on the way re-pointed).
    #[error(
        "refusing {}: it now leads to another directory than the one checked when selfheal \
         opened it (renamed, or a symlink on the way re-pointed); nothing was written there; \
         put the directory back or restart selfheal with the right path",
        path.display()
    )]
    Moved { path: PathBuf },
    /// The snapshot log was opened for reading only.
    #[error("cannot append to {}: the snapshot log was opened read-only", path.display())]
    ReadOnly { path: PathBuf },
}

impl StoreError {
    /// The OS error number behind an [`StoreError::Io`] (`ENOSPC`, `EACCES`, …).
    pub fn os_error(&self) -> Option<i32> {
        match self {
            StoreError::Io { error, .. } => error.raw_os_error(),
            _ => None,
        }
    }

    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            StoreError::Io { path, .. }
            | StoreError::Symlink { path }
            | StoreError::NotDirectory { path }
            | StoreError::NotOwner { path, .. }
            | StoreError::UnsafeAncestor { path, .. }
            | StoreError::Writable { path, .. }
            | StoreError::Locked { path, .. }
            | StoreError::Serialize { path, .. }
            | StoreError::Moved { path }
            | StoreError::ReadOnly { path } => path,
        }
    }
}

pub(crate) fn io_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(io::Error) -> StoreError + use<> {
    let path = path.to_path_buf();
    move |error| StoreError::Io {
        action,
        path,
        error,
    }
}

/// Milliseconds since the Unix epoch (0 before it: a broken clock is not an
/// error here).
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Creates `dir` (and missing parents, mode 0700) if needed, then checks it
/// by the one rule of [`SafeDir`]: a real directory of ours that nobody
/// else can write to, reached only through directories (and symlinks) that
/// only root or we can change. Writes then go through the returned fd.
pub(crate) fn prepare_dir(dir: &Path) -> Result<SafeDir, StoreError> {
    SafeDir::open(dir, Some(0o700))
}

/// Opens (creating, 0600) `name` in `dir` and takes an exclusive flock on
/// it, waiting at most `timeout`. The lock lasts as long as the returned
/// file is open.
pub(crate) fn lock_file(dir: &SafeDir, name: &str, timeout: Duration) -> Result<File, StoreError> {
    let path = &dir.join(name);
    let file = dir
        .open_file(name, libc::O_RDWR | libc::O_CREAT, 0o600)
        .map_err(io_err("open lock file", path))?;
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(fs::TryLockError::WouldBlock) => {}
            Err(fs::TryLockError::Error(e)) => return Err(io_err("lock", path)(e)),
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(StoreError::Locked {
                path: path.to_path_buf(),
                waited,
                holder: lock_holder(&file),
            });
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    // Best effort: who holds it, for the message of a run that waits.
    let pid = format!("{}\n", std::process::id());
    let _ = file
        .set_len(0)
        .and_then(|()| file.write_all_at(pid.as_bytes(), 0));
    Ok(file)
}

fn lock_holder(file: &File) -> Option<u32> {
    let mut buf = [0u8; 16];
    let n = file.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// Makes a rename or a new entry in `dir` durable.
pub(crate) fn fsync_dir(dir: &SafeDir) -> Result<(), StoreError> {
    dir.fsync().map_err(io_err("fsync directory", dir.path()))
}
