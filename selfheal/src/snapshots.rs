//! The forensic snapshot log: one JSON line per snapshot, appended and
//! fsynced **before** any healing step is taken ("no action without a
//! snapshot"), rotated by size, and read back by `selfheal snapshots`.
//!
//! This module owns the log's location ([`default_snapshot_dir`]), its
//! record format, snapshot ids, durable appends that never leave a half line
//! behind ([`SnapshotLog::append`]), size rotation, and reading
//! ([`SnapshotLog::list`], [`SnapshotLog::show`]). What goes *into* a
//! snapshot is the caller's.
//!
//! Every agent has a log of its own ([`agent_file`]:
//! `snapshots.NAME-HASH.jsonl` → `.1` → … → `.keep`), with its own quota,
//! so one agent's volume never rotates away another's snapshots. The
//! shared `snapshots.jsonl` (and its rotated files) is read, never
//! written: its records stay listed and shown. A record is at most
//! [`MAX_RECORD_BYTES`].
//!
//! A record is `{"id", "time", "unix_ms", "agent", "verdict", "snapshot"}`.
//! Appends and rotation take `snapshots.lock` (flock, bounded wait), so
//! `selfheal check` and `selfheal watch` can share a log; readers take no
//! lock (they never delay a writer) and tolerate a concurrent rotation.

use std::{
    collections::HashSet,
    ffi::OsStr,
    fs::{File, OpenOptions},
    hash::{BuildHasher as _, Hasher as _},
    io::{self, BufRead as _, BufReader, Write as _},
    os::unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

use crate::{
    fs::{StoreError, fsync_dir, io_err, lock_file, prepare_dir, safedir::SafeDir, unix_ms},
    store::{self, DEFAULT_LOCK_TIMEOUT},
    sys::creds::euid,
};

/// The shared log's name (read, never written); rotated files add `.1`,
/// `.2`, ….
pub const SNAPSHOT_FILE: &str = "snapshots.jsonl";
/// The lock appends and rotation take.
pub const LOCK_FILE: &str = "snapshots.lock";
/// Rotate an agent's current file when it would grow past this.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 20;
/// Rotated files kept per agent: an agent's quota is `max_bytes × (keep + 1)`.
pub const DEFAULT_KEEP: usize = 3;
/// The largest record written: a body that would make a longer line is
/// replaced by its verdict, reasons and a note of its size.
pub const MAX_RECORD_BYTES: usize = 4 << 20;
/// Rotated files of the shared log read at least (what it kept).
const SHARED_KEEP: usize = 5;
/// The most per-agent logs a reader looks at.
const MAX_AGENT_LOGS: usize = 4096;
/// Upper bound on `keep` (bounds rotation and reading).
pub const MAX_KEEP: usize = 1000;
/// Longest agent name carried into an id.
const ID_AGENT_CHARS: usize = 32;

/// Where snapshots go for this process: `/var/log/selfheal` as root, else
/// the state directory (`$XDG_STATE_HOME/selfheal`, else
/// `$HOME/.local/state/selfheal`).
pub fn default_snapshot_dir() -> PathBuf {
    snapshot_dir_for(
        euid(),
        std::env::var_os("XDG_STATE_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    )
}

/// [`default_snapshot_dir`] as a pure function of the effective uid and the
/// environment.
pub fn snapshot_dir_for(
    euid: u32,
    xdg_state_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> PathBuf {
    if euid == 0 {
        return PathBuf::from("/var/log/selfheal");
    }
    store::state_dir_for(euid, xdg_state_home, home)
}

/// A snapshot's identity and headline, without its body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// Unique, sortable by time: `20261129T235100Z-sol-3fa2-0`.
    pub id: String,
    /// RFC 3339 UTC, second precision.
    pub time: String,
    /// Milliseconds since the Unix epoch.
    pub unix_ms: u64,
    pub agent: String,
    pub verdict: String,
    /// The file the record was read from.
    #[serde(skip_deserializing, serialize_with = "path_lossy")]
    pub file: PathBuf,
}

fn path_lossy<S: serde::Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

/// What [`SnapshotLog::list`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    /// Matching records, oldest first (file order: rotated files, then the
    /// current one).
    pub entries: Vec<SnapshotMeta>,
    /// Lines that are not records (torn, hand-edited, not JSON): skipped.
    pub skipped: usize,
}

#[derive(Serialize)]
struct RecordOut<'a> {
    id: &'a str,
    time: &'a str,
    unix_ms: u64,
    agent: &'a str,
    verdict: &'a str,
    snapshot: &'a serde_json::Value,
}

/// The snapshot log in one directory.
#[derive(Debug, Clone)]
pub struct SnapshotLog {
    dir: PathBuf,
    /// The directory held open when opened for appending: every write goes
    /// through it, after a re-check of the path.
    safe: Option<SafeDir>,
    max_bytes: u64,
    keep: usize,
    writable: bool,
    lock_timeout: Duration,
}

impl SnapshotLog {
    /// Opens the log in `dir` for appending and reading: creates the
    /// directory (0700) if needed and refuses a symlink, another user's
    /// directory, one others can write to, or one below a directory (or a
    /// symlink) another user could change ([`crate::fs::safedir`]). Holds the
    /// directory: appends go through it, after a re-check of the path.
    /// Rotates when the current file would pass `max_bytes`, keeping `keep`
    /// rotated files (at most [`MAX_KEEP`]).
    pub fn open(dir: &Path, max_bytes: u64, keep: usize) -> Result<SnapshotLog, StoreError> {
        let safe = prepare_dir(dir)?;
        Ok(SnapshotLog {
            dir: dir.to_path_buf(),
            safe: Some(safe),
            max_bytes,
            keep: keep.min(MAX_KEEP),
            writable: true,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        })
    }

    /// Opens the log in `dir` for reading only (`selfheal snapshots`):
    /// creates and checks nothing; a missing directory reads as empty.
    /// Reads the default number of rotated files unless `keep` says more.
    pub fn open_read(dir: &Path, keep: usize) -> SnapshotLog {
        SnapshotLog {
            dir: dir.to_path_buf(),
            safe: None,
            max_bytes: DEFAULT_MAX_BYTES,
            keep: keep.min(MAX_KEEP),
            writable: false,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }

    /// How long [`SnapshotLog::append`] waits for another writer.
    pub fn with_lock_timeout(mut self, timeout: Duration) -> SnapshotLog {
        self.lock_timeout = timeout;
        self
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shared log file (read, never written).
    pub fn path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_FILE)
    }

    /// `agent`'s current log file ([`agent_file`]).
    pub fn path_for(&self, agent: &str) -> PathBuf {
        self.dir.join(agent_file(agent))
    }

    /// Appends one record and makes it durable (fsync) before returning its
    /// id: act on a snapshot only after this returns `Ok`. The line is
    /// serialized first and written with one write; if the write or the
    /// fsync fails (a full disk…), the file is cut back to its previous
    /// length, so no half line is left behind, and the error names the file
    /// and the OS error.
    pub fn append(
        &self,
        agent: &str,
        verdict: &str,
        body: &serde_json::Value,
    ) -> Result<String, StoreError> {
        let base = agent_file(agent);
        let path = self.dir.join(&base);
        let dir = match &self.safe {
            Some(d) if self.writable => d,
            _ => return Err(StoreError::ReadOnly { path }),
        };
        let now = SystemTime::now();
        let time = humantime::format_rfc3339_seconds(now).to_string();
        let id = make_id(&time, agent);
        let record = RecordOut {
            id: &id,
            time: &time,
            unix_ms: unix_ms(now),
            agent,
            verdict,
            snapshot: body,
        };
        let serialize = |record: &RecordOut<'_>| {
            let mut line = Vec::with_capacity(256);
            line.push(b'\n'); // dropped below unless the file ends in a torn line
            serde_json::to_writer(&mut line, record).map_err(|error| StoreError::Serialize {
                path: path.clone(),
                error,
            })?;
            line.push(b'\n');
            Ok::<_, StoreError>(line)
        };
        let mut line = serialize(&record)?;
        if line.len() > MAX_RECORD_BYTES {
            let short = oversized(body, line.len());
            line = serialize(&RecordOut {
                snapshot: &short,
                ..record
            })?;
        }

        // The path must still lead to the directory checked at open
        // (`watch` runs for weeks).
        dir.recheck()?;
        let _lock = lock_file(dir, LOCK_FILE, self.lock_timeout)?;
        let size = match dir.open_file(&base, libc::O_RDONLY, 0) {
            Ok(f) => f.metadata().map_err(io_err("examine", &path))?.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_err("examine", &path)(e)),
        };
        if size > 0 && size.saturating_add(line.len() as u64 - 1) > self.max_bytes {
            self.rotate(dir, &base)?;
        }
        let file = dir
            .open_file(&base, libc::O_RDWR | libc::O_APPEND | libc::O_CREAT, 0o600)
            .map_err(io_err("open", &path))?;
        let prev = file.metadata().map_err(io_err("examine", &path))?.len();
        let mut last = [0u8; 1];
        let torn = prev > 0 && file.read_at(&mut last, prev - 1).is_ok() && last[0] != b'\n';
        let line = if torn { &line[..] } else { &line[1..] };
        let written = (&file)
            .write_all(line)
            .map_err(io_err("append to", &path))
            .and_then(|()| file.sync_data().map_err(io_err("fsync", &path)));
        if let Err(e) = written {
            // Cut the partial line; what was there before stays.
            let _ = file.set_len(prev).and_then(|()| file.sync_data());
            return Err(e);
        }
        if prev == 0 {
            // A new file: make its directory entry durable too.
            fsync_dir(dir)?;
        }
        Ok(id)
    }

    /// `base` → `base.1` → … → `base.keep`; the oldest is dropped, as are
    /// leftovers beyond `keep` (from a larger `keep` before). Called with the
    /// lock held.
    fn rotate(&self, dir: &SafeDir, base: &str) -> Result<(), StoreError> {
        let rotated = |n: usize| format!("{base}.{n}");
        let remove = |name: &str| match dir.remove(name) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove", &dir.join(name))(e)),
        };
        if self.keep == 0 {
            remove(base)?;
        } else {
            remove(&rotated(self.keep))?;
            for n in (1..self.keep).rev() {
                match dir.rename(&rotated(n), &rotated(n + 1)) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("rotate", &self.dir.join(rotated(n)))(e)),
                }
            }
            dir.rename(base, &rotated(1))
                .map_err(io_err("rotate", &self.dir.join(base)))?;
        }
        if let Ok(names) = dir.names() {
            let prefix = format!("{base}.");
            for name in names {
                let Some(n) = name
                    .strip_prefix(&prefix)
                    .and_then(|s| s.parse::<usize>().ok())
                else {
                    continue;
                };
                if n > self.keep {
                    let _ = dir.remove(&name);
                }
            }
        }
        fsync_dir(dir)
    }

    /// The current files of the logs to read: the shared one, and `agent`'s
    /// (every agent's when `None`, found in the directory, at most
    /// [`MAX_AGENT_LOGS`]).
    fn bases(&self, agent: Option<&str>) -> Vec<String> {
        let mut bases = vec![SNAPSHOT_FILE.to_string()];
        match agent {
            Some(a) => bases.push(agent_file(a)),
            None => {
                let mut found: Vec<String> = std::fs::read_dir(&self.dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| is_agent_file(n))
                    .take(MAX_AGENT_LOGS)
                    .collect();
                found.sort();
                bases.extend(found);
            }
        }
        bases
    }

    /// The files of the logs `agent` reads ([`SnapshotLog::bases`]), oldest
    /// first within each log, each opened once. Each log's files are opened
    /// newest first and deduplicated by inode so a rotation by a concurrent
    /// writer neither repeats nor loses a file (but the one it drops).
    fn files(&self, agent: Option<&str>) -> Result<Vec<(PathBuf, File)>, StoreError> {
        let mut files = Vec::new();
        for base in self.bases(agent) {
            files.extend(self.files_of(&base)?);
        }
        Ok(files)
    }

    /// One log's files, oldest first.
    fn files_of(&self, base: &str) -> Result<Vec<(PathBuf, File)>, StoreError> {
        let mut seen = HashSet::new();
        let mut files = Vec::new();
        let base_path = self.dir.join(base);
        let keep = if base == SNAPSHOT_FILE {
            self.keep.max(SHARED_KEEP)
        } else {
            self.keep
        };
        let rotated = (1..=keep).map(|n| self.dir.join(format!("{base}.{n}")));
        for path in std::iter::once(base_path).chain(rotated) {
            let file = match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("open", &path)(e)),
            };
            let md = file.metadata().map_err(io_err("examine", &path))?;
            if !md.is_file() {
                continue;
            }
            if seen.insert((md.dev(), md.ino())) {
                files.push((path, file));
            }
        }
        files.reverse();
        Ok(files)
    }

    /// The records of `agent` (all when `None`) written at or after
    /// `since_unix_ms`, oldest first, across the agents' logs and the
    /// shared one, current and rotated files.
    /// Lines that are not records are skipped and counted.
    pub fn list(
        &self,
        agent: Option<&str>,
        since_unix_ms: Option<u64>,
    ) -> Result<Listing, StoreError> {
        #[derive(Deserialize)]
        struct MetaIn {
            id: String,
            time: String,
            unix_ms: u64,
            agent: String,
            verdict: String,
        }
        let mut listing = Listing::default();
        for (path, file) in self.files(agent)? {
            for line in BufReader::new(file).split(b'\n') {
                let line = line.map_err(io_err("read", &path))?;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let Ok(m) = serde_json::from_slice::<MetaIn>(&line) else {
                    listing.skipped += 1;
                    continue;
                };
                if agent.is_some_and(|a| a != m.agent)
                    || since_unix_ms.is_some_and(|s| m.unix_ms < s)
                {
                    continue;
                }
                listing.entries.push(SnapshotMeta {
                    id: m.id,
                    time: m.time,
                    unix_ms: m.unix_ms,
                    agent: m.agent,
                    verdict: m.verdict,
                    file: path.clone(),
                });
            }
        }
        // Several logs: in time order; within a millisecond, in the order
        // of the writer's counter (the id's last part). The sort is stable,
        // so one file's order stands where neither tells.
        listing
            .entries
            .sort_by_key(|m| (m.unix_ms, id_counter(&m.id)));
        Ok(listing)
    }

    /// The whole record with this id, or `None`.
    pub fn show(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        // Our own lines start with the id: parse only those that match, and
        // any line in another shape.
        let ours = format!("{{\"id\":{}", serde_json::Value::from(id));
        let mut files = self.files(None)?;
        files.reverse();
        for (path, file) in files {
            for line in BufReader::new(file).split(b'\n') {
                let line = line.map_err(io_err("read", &path))?;
                if !line.starts_with(ours.as_bytes()) && line.starts_with(b"{\"id\":") {
                    continue;
                }
                let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
                    continue;
                };
                if v.get("id").and_then(|v| v.as_str()) == Some(id) {
                    return Ok(Some(v));
                }
            }
        }
        Ok(None)
    }
}

/// The file name of `agent`'s log: `snapshots.NAME-HASH.jsonl`, NAME the
/// agent's name made safe (at most 32 of `[A-Za-z0-9_.-]`,
/// others `_`), HASH (8 hex digits, FNV-1a) of the whole name, so two
/// names that read the same once made safe have logs of their own. Never a
/// path: no `/`, never `.` or `..`, at most 64 bytes.
pub fn agent_file(agent: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in agent.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("snapshots.{}-{h:08x}.jsonl", safe_name(agent))
}

/// Whether `name` is the current file of an agent's log ([`agent_file`]).
fn is_agent_file(name: &str) -> bool {
    name.strip_prefix("snapshots.")
        .and_then(|n| n.strip_suffix(".jsonl"))
        .and_then(|n| n.rsplit_once('-'))
        .is_some_and(|(_, h)| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The per-process counter an id ends in ([`make_id`]), 0 when it has none.
fn id_counter(id: &str) -> u64 {
    id.rsplit_once('-')
        .and_then(|(_, n)| u64::from_str_radix(n, 16).ok())
        .unwrap_or(0)
}

/// What a record holds in place of a body over [`MAX_RECORD_BYTES`]: its
/// verdict and reasons, and why the rest is missing.
fn oversized(body: &serde_json::Value, bytes: usize) -> serde_json::Value {
    serde_json::json!({
        "verdict": body.get("verdict"),
        "reasons": body.get("reasons"),
        "left_out": format!(
            "the evidence ({bytes} bytes) is over the record cap of {MAX_RECORD_BYTES} bytes"
        ),
    })
}

/// `agent` made safe for a file name and a terminal: at most
/// [`ID_AGENT_CHARS`] of `[A-Za-z0-9_.-]`, anything else `_`; `_` when empty.
fn safe_name(agent: &str) -> String {
    let mut name: String = agent
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(ID_AGENT_CHARS)
        .collect();
    if name.is_empty() {
        name.push('_');
    }
    name
}

/// `20261129T235100Z-sol-3fa2-0`: the time, the agent (made safe for a file
/// name and a terminal), a random per-process token (ids from two processes
/// in the same second differ) and a per-process counter (ids from one
/// process always differ).
fn make_id(rfc3339_seconds: &str, agent: &str) -> String {
    static TOKEN: OnceLock<u16> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let token = *TOKEN.get_or_init(|| {
        // RandomState is seeded from the OS's random source.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        (h.finish() & 0xffff) as u16
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let stamp: String = rfc3339_seconds
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    let name = safe_name(agent);
    format!("{stamp}-{name}-{token:04x}-{n:x}")
}
