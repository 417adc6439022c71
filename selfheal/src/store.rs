//! The state file `selfheal check` keeps between timer runs (history: when a
//! socket first turned suspect, counters seen last time, heal attempts).
//!
//! This module owns where the file lives ([`default_state_dir`]), the
//! exclusive lock that makes concurrent runs take turns ([`StateStore::open`]),
//! loading that never fails on bad content ([`StateStore::load`]: a missing,
//! corrupt or future-version file becomes the default with a note, the bad
//! file kept aside), and crash-safe saving ([`StateStore::save`]: temp file,
//! fsync, rename, directory fsync). It also owns the directory checks, the
//! lock helper and the error type shared with the snapshot log
//! ([`crate::snapshots`]).
//!
//! On disk: `state.json` holds `{"version": 1, "saved_unix_ms": …, "data": …}`;
//! `state.lock` is the lock (it holds the pid of the last holder, for the
//! message when a run waits too long); `state.json.bad-<unix seconds>` are
//! bad files kept for forensics (the newest few).

use std::{
    ffi::OsStr,
    fs::{self, DirBuilder, File, OpenOptions},
    io::{self, Read as _, Write as _},
    os::unix::fs::{DirBuilderExt as _, FileExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde::{Serialize, de::DeserializeOwned};

/// The state file's name inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// The lock file's name inside the state directory.
pub const LOCK_FILE: &str = "state.lock";
/// The on-disk format version this build writes and reads.
pub const FORMAT_VERSION: u64 = 1;
/// How long [`StateStore::open`] waits for another run to let go.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// A state file larger than this is treated as corrupt (not read into memory).
pub const MAX_STATE_BYTES: u64 = 64 << 20;
/// How many `state.json.bad-*` files are kept (the newest).
pub const KEEP_BAD_FILES: usize = 5;

/// Why the state directory, the state file or the snapshot log cannot be
/// used. Content problems in the state file are not errors (see
/// [`StateStore::load`]).
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
    #[error("refusing {}: not a directory", path.display())]
    NotDirectory { path: PathBuf },
    /// The directory belongs to another user.
    #[error(
        "refusing {}: owned by uid {owner}, not by this user (uid {euid})",
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
            | StoreError::ReadOnly { path } => path,
        }
    }
}

pub(crate) fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |error| StoreError::Io {
        action,
        path,
        error,
    }
}

/// The effective uid of this process.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Milliseconds since the Unix epoch (0 before it: a broken clock is not an
/// error here).
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Where the state file lives for this process: `/var/lib/selfheal` as
/// root, else `$XDG_STATE_HOME/selfheal`, else `$HOME/.local/state/selfheal`.
pub fn default_state_dir() -> PathBuf {
    state_dir_for(
        euid(),
        std::env::var_os("XDG_STATE_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    )
}

/// [`default_state_dir`] as a pure function of the effective uid and the
/// environment. Relative values are ignored (the XDG spec says so); with
/// neither variable usable, `/tmp/selfheal-<uid>/selfheal` (checked for
/// ownership like any other).
pub fn state_dir_for(euid: u32, xdg_state_home: Option<&OsStr>, home: Option<&OsStr>) -> PathBuf {
    if euid == 0 {
        return PathBuf::from("/var/lib/selfheal");
    }
    user_state_home(euid, xdg_state_home, home).join("selfheal")
}

/// `$XDG_STATE_HOME`, else `$HOME/.local/state`, else a per-uid directory
/// under /tmp.
pub(crate) fn user_state_home(
    euid: u32,
    xdg_state_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> PathBuf {
    fn absolute(v: Option<&OsStr>) -> Option<&Path> {
        v.map(Path::new).filter(|p| p.is_absolute())
    }
    if let Some(x) = absolute(xdg_state_home) {
        return x.to_path_buf();
    }
    if let Some(h) = absolute(home) {
        return h.join(".local/state");
    }
    PathBuf::from(format!("/tmp/selfheal-{euid}"))
}

/// Creates `dir` (and missing parents, mode 0700) if needed, then checks it
/// is a real directory of ours that nobody else can write to, below
/// directories that only root or we can change (see [`check_ancestors`]).
pub(crate) fn prepare_dir(dir: &Path) -> Result<(), StoreError> {
    // Before creating anything: no directory of ours inside another user's.
    check_ancestors(dir)?;
    match fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_err("create directory", dir))?;
        }
        Err(e) => return Err(io_err("examine", dir)(e)),
    }
    let md = fs::symlink_metadata(dir).map_err(io_err("examine", dir))?;
    let path = dir.to_path_buf();
    if md.file_type().is_symlink() {
        return Err(StoreError::Symlink { path });
    }
    if !md.is_dir() {
        return Err(StoreError::NotDirectory { path });
    }
    let me = euid();
    if md.uid() != me {
        return Err(StoreError::NotOwner {
            path,
            owner: md.uid(),
            euid: me,
        });
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StoreError::Writable { path, mode });
    }
    Ok(())
}

/// Checks every existing directory above `dir` — along the path as given
/// and along its real path (symlinks resolved) — is owned by root or by us
/// and not writable by group or others, unless sticky (`/tmp`: others may
/// not rename or remove what they do not own there). Otherwise another user
/// could rename our directory away and put a symlink in its place between
/// two of our writes (`O_NOFOLLOW` guards only the last component).
/// Directories that do not exist yet are created by us, 0700.
pub(crate) fn check_ancestors(dir: &Path) -> Result<(), StoreError> {
    let me = euid();
    let absolute = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(io_err("find the current directory for", dir))?
            .join(dir)
    };
    let unsafe_ancestor = |ancestor: &Path, reason: String| StoreError::UnsafeAncestor {
        path: dir.to_path_buf(),
        ancestor: ancestor.to_path_buf(),
        reason,
    };
    let check = |ancestor: &Path| -> Result<(), StoreError> {
        let md = match fs::metadata(ancestor) {
            Ok(md) => md,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err("examine", ancestor)(e)),
        };
        if !md.is_dir() {
            return Ok(()); // creating below it fails, and says so
        }
        if md.uid() != 0 && md.uid() != me {
            return Err(unsafe_ancestor(
                ancestor,
                format!(
                    "is owned by uid {}, not by root or this user (uid {me})",
                    md.uid()
                ),
            ));
        }
        let mode = md.mode() & 0o7777;
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(unsafe_ancestor(
                ancestor,
                format!("is writable by group or others and not sticky (mode {mode:04o})"),
            ));
        }
        Ok(())
    };
    for a in absolute.ancestors().skip(1) {
        check(a)?;
    }
    // The real path of the deepest existing ancestor: directories a
    // symlink on the way leads into.
    if let Some(real) = absolute
        .ancestors()
        .skip(1)
        .find_map(|a| fs::canonicalize(a).ok())
    {
        for a in real.ancestors() {
            check(a)?;
        }
    }
    Ok(())
}

/// Opens (creating, 0600) `path` and takes an exclusive flock on it, waiting
/// at most `timeout`. The lock lasts as long as the returned file is open.
pub(crate) fn lock_file(path: &Path, timeout: Duration) -> Result<File, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
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
pub(crate) fn fsync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

/// What [`StateStore::load`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded<T> {
    /// The saved value, or `T::default()` on a first run or a bad file.
    pub value: T,
    /// Why the default is used (first run, corrupt, future version, …), for
    /// the log; `None` when the file was read as saved.
    pub note: Option<String>,
    /// When the value was saved (wall clock, ms since the Unix epoch).
    pub saved_unix_ms: Option<u64>,
}

/// The state directory, locked for this run. Dropping it lets the next run in.
#[derive(Debug)]
pub struct StateStore {
    dir: PathBuf,
    _lock: File,
}

#[derive(Serialize)]
struct EnvelopeOut<'a, T> {
    version: u64,
    saved_unix_ms: u64,
    data: &'a T,
}

impl StateStore {
    /// Opens (creating, 0700) the state directory `dir` and takes its lock,
    /// waiting at most [`DEFAULT_LOCK_TIMEOUT`] for another run to finish.
    pub fn open(dir: &Path) -> Result<StateStore, StoreError> {
        StateStore::open_with_timeout(dir, DEFAULT_LOCK_TIMEOUT)
    }

    /// [`StateStore::open`] with another lock wait.
    pub fn open_with_timeout(dir: &Path, timeout: Duration) -> Result<StateStore, StoreError> {
        prepare_dir(dir)?;
        let lock = lock_file(&dir.join(LOCK_FILE), timeout)?;
        Ok(StateStore {
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The state file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Reads the saved value. Never fails: a missing file is a first run; an
    /// unreadable, corrupt, oversized or future-version file is moved aside
    /// (`state.json.bad-<unix seconds>`) and the default is used. Either way
    /// `note` says what happened.
    pub fn load<T: DeserializeOwned + Default>(&self) -> Loaded<T> {
        let path = self.path();
        let problem = match read_bounded(&path) {
            Ok(bytes) => match decode::<T>(&bytes) {
                Ok((value, saved)) => {
                    return Loaded {
                        value,
                        note: None,
                        saved_unix_ms: saved,
                    };
                }
                Err(why) => why,
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Loaded {
                    value: T::default(),
                    note: Some(format!(
                        "no state file {}: first run, starting from empty state",
                        path.display()
                    )),
                    saved_unix_ms: None,
                };
            }
            Err(e) if e.kind() == io::ErrorKind::FileTooLarge => {
                format!("is larger than {} MiB", MAX_STATE_BYTES >> 20)
            }
            Err(e) => format!("cannot be read ({e})"),
        };
        let kept = match self.set_aside() {
            Ok(kept) => format!("kept it as {}", kept.display()),
            Err(e) => format!("could not keep it aside ({e})"),
        };
        Loaded {
            value: T::default(),
            note: Some(format!(
                "state file {} {problem}; {kept} and started from empty state",
                path.display()
            )),
            saved_unix_ms: None,
        }
    }

    /// Saves `value` atomically: `state.json.tmp` (0600, created exclusively
    /// after removing a stale one) is written and fsynced, renamed over
    /// `state.json`, and the directory fsynced. A crash at any point leaves
    /// the old file or the new one, never a torn one.
    pub fn save<T: Serialize>(&self, value: &T) -> Result<(), StoreError> {
        self.save_with_hook(value, || {})
    }

    /// [`StateStore::save`] calling `before_rename` once the temp file is
    /// written and fsynced: lets tests kill a run between write and rename.
    #[doc(hidden)]
    pub fn save_with_hook<T: Serialize>(
        &self,
        value: &T,
        before_rename: impl FnOnce(),
    ) -> Result<(), StoreError> {
        let path = self.path();
        let envelope = EnvelopeOut {
            version: FORMAT_VERSION,
            saved_unix_ms: unix_ms(SystemTime::now()),
            data: value,
        };
        let mut bytes = serde_json::to_vec(&envelope).map_err(|error| StoreError::Serialize {
            path: path.clone(),
            error,
        })?;
        bytes.push(b'\n');
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        match fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove stale", &tmp)(e)),
        }
        let written = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)
                .map_err(io_err("create", &tmp))?;
            f.write_all(&bytes).map_err(io_err("write", &tmp))?;
            f.sync_all().map_err(io_err("fsync", &tmp))?;
            drop(f);
            before_rename();
            fs::rename(&tmp, &path).map_err(io_err("rename temp file over", &path))
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fsync_dir(&self.dir)
    }

    /// Moves a bad state file to `state.json.bad-<unix seconds>[-n]` and
    /// drops the oldest such files beyond [`KEEP_BAD_FILES`].
    fn set_aside(&self) -> io::Result<PathBuf> {
        let secs = unix_ms(SystemTime::now()) / 1000;
        let base = format!("{STATE_FILE}.bad-{secs}");
        // After any file set aside in the same second, so the newest sorts last.
        let last = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|name| match name.strip_prefix(&base)? {
                "" => Some(0),
                rest => rest.strip_prefix('-')?.parse::<u64>().ok(),
            })
            .max();
        let target = match last {
            None => self.dir.join(&base),
            Some(n) => self.dir.join(format!("{base}-{}", n + 1)),
        };
        fs::rename(self.path(), &target)?;
        self.prune_bad();
        Ok(target)
    }

    fn prune_bad(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let prefix = format!("{STATE_FILE}.bad-");
        let mut bad: Vec<(u64, u64, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let rest = name.strip_prefix(&prefix)?;
                let (secs, n) = rest.split_once('-').unwrap_or((rest, "0"));
                Some((secs.parse().ok()?, n.parse().ok()?, e.path()))
            })
            .collect();
        bad.sort();
        let excess = bad.len().saturating_sub(KEEP_BAD_FILES);
        for (_, _, p) in bad.into_iter().take(excess) {
            let _ = fs::remove_file(p);
        }
    }
}

/// Reads the whole file (not following a symlink), refusing more than
/// [`MAX_STATE_BYTES`] with `FileTooLarge`.
fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut bytes = Vec::new();
    f.take(MAX_STATE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_STATE_BYTES {
        return Err(io::ErrorKind::FileTooLarge.into());
    }
    Ok(bytes)
}

/// The value and its save time, or what is wrong with the content.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, Option<u64>), String> {
    let doc: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("is corrupt ({e})"))?;
    let serde_json::Value::Object(mut doc) = doc else {
        return Err("is corrupt (not a JSON object)".into());
    };
    let version = match doc.get("version") {
        None => return Err("is corrupt (no version)".into()),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| format!("is corrupt (version {v} is not a number)"))?,
    };
    if version > FORMAT_VERSION {
        return Err(format!(
            "is from a newer selfheal (format version {version}; this build reads {FORMAT_VERSION})"
        ));
    }
    if version != FORMAT_VERSION {
        return Err(format!("is corrupt (unknown format version {version})"));
    }
    let saved = doc.get("saved_unix_ms").and_then(|v| v.as_u64());
    let data = doc
        .remove("data")
        .ok_or_else(|| "is corrupt (no data)".to_string())?;
    let value = serde_json::from_value(data)
        .map_err(|e| format!("does not fit this build's state ({e})"))?;
    Ok((value, saved))
}
