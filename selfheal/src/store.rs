//! The state file `selfheal check` keeps between timer runs (history: when a
//! socket first turned suspect, counters seen last time, heal attempts).
//!
//! This module owns where the file lives ([`default_state_dir`]), the
//! exclusive lock that makes concurrent runs take turns ([`StateStore::open`]),
//! loading that never fails on bad content ([`StateStore::load`]: a missing,
//! corrupt or future-version file becomes the default with a note, the bad
//! file kept aside), and crash-safe saving ([`StateStore::save`]: temp file,
//! fsync, rename, directory fsync, through the directory held by
//! [`crate::fs::safedir::SafeDir`], locked and reported as [`crate::fs`]
//! does for every file selfheal keeps). It also owns the fallback for a
//! squatted default directory ([`fallback_state_dirs`]).
//!
//! On disk: `state.json` holds `{"version": 1, "saved_unix_ms": …, "data": …}`;
//! `state.lock` is the lock (it holds the pid of the last holder, for the
//! message when a run waits too long); `state.json.bad-<unix seconds>` are
//! bad files kept for forensics (the newest few).

use std::{
    ffi::OsStr,
    fs::File,
    io::{self, Read as _, Write as _},
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use selfheal_core::state::{EnvelopeOut, FORMAT_VERSION, decode};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    fs::{StoreError, fsync_dir, io_err, lock_file, prepare_dir, safedir::SafeDir, unix_ms},
    sys::creds::euid,
};

/// The state file's name inside the state directory.
pub const STATE_FILE: &str = "state.json";
/// The lock file's name inside the state directory.
pub const LOCK_FILE: &str = "state.lock";
/// How long [`StateStore::open`] waits for another run to let go.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// A state file larger than this is treated as corrupt (not read into memory).
pub const MAX_STATE_BYTES: u64 = 64 << 20;
/// How many `state.json.bad-*` files are kept (the newest).
pub const KEEP_BAD_FILES: usize = 5;

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
/// neither variable usable, `$TMPDIR/selfheal-<uid>/selfheal` (/tmp by default; a squatted one is replaced by a fallback, see [`fallback_state_dirs`]) (checked for
/// ownership like any other).
pub fn state_dir_for(euid: u32, xdg_state_home: Option<&OsStr>, home: Option<&OsStr>) -> PathBuf {
    if euid == 0 {
        return PathBuf::from("/var/lib/selfheal");
    }
    user_state_home(euid, xdg_state_home, home).join("selfheal")
}

/// `$XDG_STATE_HOME`, else `$HOME/.local/state`, else a per-uid directory
/// under `$TMPDIR` (/tmp).
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
    std::env::temp_dir().join(format!("selfheal-{euid}"))
}

/// Where a user's state (and snapshots) go when the default directory is
/// refused — someone else made it first in a shared directory
/// (`XDG_STATE_HOME=/tmp/…`, or no HOME): `/run/user/UID/selfheal` (the
/// user's own runtime directory, which only the system creates), then
/// `$TMPDIR/selfheal-UID.N/selfheal` for N = 1..=8 (the first that is the
/// user's or can be made). Root has none: its defaults are in directories
/// only root can write.
pub fn fallback_state_dirs(euid: u32) -> Vec<PathBuf> {
    if euid == 0 {
        return Vec::new();
    }
    let tmp = std::env::temp_dir();
    std::iter::once(PathBuf::from(format!("/run/user/{euid}/selfheal")))
        .chain((1..=8).map(|n| tmp.join(format!("selfheal-{euid}.{n}/selfheal"))))
        .collect()
}

/// What to do about a default directory that was refused, for the message.
pub fn refused_default_advice(dir: &Path) -> String {
    format!(
        "to use {} again, remove or rename what is in the way (see above) or set \
         XDG_STATE_HOME to a directory of your own (e.g. $HOME/.local/state), or give \
         --state-dir and --snapshot-dir",
        dir.display()
    )
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
    dir: SafeDir,
    _lock: File,
}

impl StateStore {
    /// Opens (creating, 0700) the state directory `dir` and takes its lock,
    /// waiting at most [`DEFAULT_LOCK_TIMEOUT`] for another run to finish.
    pub fn open(dir: &Path) -> Result<StateStore, StoreError> {
        StateStore::open_with_timeout(dir, DEFAULT_LOCK_TIMEOUT)
    }

    /// [`StateStore::open`] with another lock wait.
    pub fn open_with_timeout(dir: &Path, timeout: Duration) -> Result<StateStore, StoreError> {
        let dir = prepare_dir(dir)?;
        let lock = lock_file(&dir, LOCK_FILE, timeout)?;
        Ok(StateStore { dir, _lock: lock })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
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
        let problem = match read_bounded(&self.dir, STATE_FILE) {
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
        // The path must still lead to the directory checked at open.
        self.dir.recheck()?;
        let tmp_name = format!("{STATE_FILE}.tmp");
        let tmp = self.dir.join(&tmp_name);
        match self.dir.remove(&tmp_name) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove stale", &tmp)(e)),
        }
        let written = (|| {
            let mut f = self
                .dir
                .open_file(
                    &tmp_name,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                    0o600,
                )
                .map_err(io_err("create", &tmp))?;
            f.write_all(&bytes).map_err(io_err("write", &tmp))?;
            f.sync_all().map_err(io_err("fsync", &tmp))?;
            drop(f);
            before_rename();
            self.dir
                .rename(&tmp_name, STATE_FILE)
                .map_err(io_err("rename temp file over", &path))
        })();
        if let Err(e) = written {
            let _ = self.dir.remove(&tmp_name);
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
        let last = self
            .dir
            .names()?
            .into_iter()
            .filter_map(|name| match name.strip_prefix(&base)? {
                "" => Some(0),
                rest => rest.strip_prefix('-')?.parse::<u64>().ok(),
            })
            .max();
        let target = match last {
            None => base,
            Some(n) => format!("{base}-{}", n + 1),
        };
        self.dir.rename(STATE_FILE, &target)?;
        self.prune_bad();
        Ok(self.dir.join(&target))
    }

    fn prune_bad(&self) {
        let Ok(names) = self.dir.names() else {
            return;
        };
        let prefix = format!("{STATE_FILE}.bad-");
        let mut bad: Vec<(u64, u64, String)> = names
            .into_iter()
            .filter_map(|name| {
                let rest = name.strip_prefix(&prefix)?;
                let (secs, n) = rest.split_once('-').unwrap_or((rest, "0"));
                Some((secs.parse().ok()?, n.parse().ok()?, name.clone()))
            })
            .collect();
        bad.sort();
        let excess = bad.len().saturating_sub(KEEP_BAD_FILES);
        for (_, _, name) in bad.into_iter().take(excess) {
            let _ = self.dir.remove(&name);
        }
    }
}

/// Reads the whole file `name` of `dir` (not following a symlink), refusing
/// more than [`MAX_STATE_BYTES`] with `FileTooLarge`.
fn read_bounded(dir: &SafeDir, name: &str) -> io::Result<Vec<u8>> {
    let f = dir.open_file(name, libc::O_RDONLY, 0)?;
    let mut bytes = Vec::new();
    f.take(MAX_STATE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_STATE_BYTES {
        return Err(io::ErrorKind::FileTooLarge.into());
    }
    Ok(bytes)
}
