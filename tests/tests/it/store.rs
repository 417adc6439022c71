//! The state file and the forensic snapshot log on real files: first run,
//! round trips, corrupt and future-version state kept aside, a run killed
//! between write and rename, concurrent runs serialized by the lock, snapshot
//! ids, rotation, malformed lines, a full disk, and `selfheal snapshots` as a
//! user sees it.
//!
//! Child processes are this test binary re-executed on the hidden test
//! `child_process_entry` with `SELFHEAL_STORE_CHILD` set.

use std::{
    collections::HashSet,
    ffi::{CString, OsStr},
    fs,
    io::Write as _,
    os::unix::{ffi::OsStrExt as _, fs::PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use selfheal::{
    fs::StoreError,
    snapshots::{self, SnapshotLog},
    store::{self, StateStore},
};
use serde_json::{Value, json};
use tests::{Peer, is_root, selfheal_bin, skip};

pub(crate) const CHILD_ENV: &str = "SELFHEAL_STORE_CHILD";

/// A scratch directory removed on drop (permissions restored first).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "selfheal-storetest-{tag}-{}-{nanos}",
            std::process::id()
        ));
        fs::create_dir_all(&dir).expect("create temp dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod temp dir");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::set_permissions(&self.0, fs::Permissions::from_mode(0o700));
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A small tmpfs mounted on a scratch directory (root only), unmounted and
/// removed on drop, even when the test fails.
struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    fn mount(tag: &str, options: &str, read_only: bool) -> Result<Tmpfs, String> {
        let dir = TempDir::new(tag);
        let cstr = |b: &[u8]| CString::new(b).map_err(|e| e.to_string());
        let fstype = cstr(b"tmpfs")?;
        let target = cstr(dir.path().as_os_str().as_bytes())?;
        let data = cstr(options.as_bytes())?;
        let flags = if read_only { libc::MS_RDONLY } else { 0 };
        // SAFETY: all pointers are valid NUL-terminated strings that outlive
        // the call.
        let rc = unsafe {
            libc::mount(
                fstype.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                flags,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(format!(
                "cannot mount tmpfs on {}: {}",
                dir.path().display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if let Ok(target) = CString::new(self.dir.path().as_os_str().as_bytes()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
        // `dir` (the now empty mount point) is removed by its own Drop.
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn bad_files(dir: &Path) -> Vec<PathBuf> {
    file_names(dir)
        .into_iter()
        .filter(|n| n.starts_with("state.json.bad-"))
        .map(|n| dir.join(n))
        .collect()
}

/// This test binary, re-executed to run one child role.
fn child(role: &str, dir: &Path, arg: &str) -> Peer {
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    cmd.env(CHILD_ENV, format!("{role}\n{}\n{arg}", dir.display()));
    Peer::spawn(cmd)
}

/// Child roles (not a test: this binary with [`CHILD_ENV`] set,
/// `crate::ROLES`):
/// - `hold-before-rename DIR VALUE`: saves `VALUE` but stops (for at most
///   60 s) after the temp file is written and fsynced, before the rename;
/// - `increment DIR N`: N times open, load, add one, save, drop;
/// - `save-loop DIR PAD`: saves ever larger counters with `PAD` bytes of
///   padding until killed (at most 60 s).
pub(crate) fn child_process_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut parts = spec.splitn(3, '\n');
    let (role, dir, arg) = (
        parts.next().unwrap_or(""),
        PathBuf::from(parts.next().unwrap_or("")),
        parts.next().unwrap_or(""),
    );
    let say = |line: &str| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    match role {
        "hold-before-rename" => {
            let store = StateStore::open(&dir).expect("child: open");
            let value: Value = serde_json::from_str(arg).expect("child: value");
            store
                .save_with_hook(&value, || {
                    say("tmp-written");
                    std::thread::sleep(Duration::from_secs(60));
                })
                .expect("child: save");
            say("renamed (should have been killed)");
        }
        "increment" => {
            let n: u32 = arg.parse().expect("child: count");
            for _ in 0..n {
                let store = StateStore::open(&dir).expect("child: open");
                let loaded = store.load::<u64>();
                assert!(
                    loaded.note.is_none() || loaded.value == 0,
                    "{:?}",
                    loaded.note
                );
                store.save(&(loaded.value + 1)).expect("child: save");
            }
            say("done");
        }
        "save-loop" => {
            let pad = "x".repeat(arg.parse().expect("child: pad"));
            let end = Instant::now() + Duration::from_secs(60);
            let mut n = 0u64;
            say("looping");
            while Instant::now() < end {
                let store = StateStore::open(&dir).expect("child: open");
                n += 1;
                store
                    .save(&json!({"n": n, "pad": pad}))
                    .expect("child: save");
            }
        }
        other => panic!("unknown child role {other:?}"),
    }
}

// ---------------------------------------------------------------- state file

#[test]
fn default_directories_follow_uid_and_xdg() {
    let _area = tests::area(module_path!());
    type DirFor = fn(u32, Option<&OsStr>, Option<&OsStr>) -> PathBuf;
    let (state, snaps): (DirFor, DirFor) = (store::state_dir_for, snapshots::snapshot_dir_for);
    let (xdg, home) = (Some(OsStr::new("/x/state")), Some(OsStr::new("/home/u")));
    for (dir_for, uid, xdg, home, want) in [
        (state, 0, xdg, home, "/var/lib/selfheal"),
        (snaps, 0, xdg, home, "/var/log/selfheal"),
        (state, 1000, xdg, home, "/x/state/selfheal"),
        (snaps, 1000, xdg, home, "/x/state/selfheal"),
        // Relative XDG values are ignored, as the spec says.
        (
            state,
            1000,
            Some(OsStr::new("rel")),
            home,
            "/home/u/.local/state/selfheal",
        ),
        (state, 1000, None, None, "/tmp/selfheal-1000/selfheal"),
    ] {
        assert_eq!(
            dir_for(uid, xdg, home),
            Path::new(want),
            "uid {uid}, XDG_STATE_HOME {xdg:?}, HOME {home:?}"
        );
    }
    let want = if is_root() {
        PathBuf::from("/var/lib/selfheal")
    } else {
        store::state_dir_for(
            1,
            std::env::var_os("XDG_STATE_HOME").as_deref(),
            std::env::var_os("HOME").as_deref(),
        )
    };
    assert_eq!(store::default_state_dir(), want);
}

#[test]
fn first_run_then_round_trip() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("roundtrip");
    let dir = tmp.path().join("nested/state");
    {
        let store = StateStore::open(&dir).expect("open creates the directory");
        assert_eq!(
            fs::metadata(&dir).expect("dir").permissions().mode() & 0o777,
            0o700
        );
        let first = store.load::<Value>();
        assert_eq!(first.value, Value::Null);
        let note = first.note.expect("a first-run note");
        assert!(
            note.contains("first run") && note.contains(&store.path().display().to_string()),
            "{note}"
        );
        let value = json!({"agents": {"sol": {"suspect_since_ms": 12345, "heals": [1, 2]}}});
        let before = now_ms();
        store.save(&value).expect("save");
        let md = fs::metadata(store.path()).expect("state file");
        assert_eq!(md.permissions().mode() & 0o777, 0o600);
        let on_disk: Value =
            serde_json::from_slice(&fs::read(store.path()).expect("read")).expect("json");
        assert_eq!(on_disk["version"], 1);
        assert_eq!(on_disk["data"], value);
        let saved = on_disk["saved_unix_ms"].as_u64().expect("saved_unix_ms");
        assert!(saved >= before && saved <= now_ms() + 1, "{saved}");
        assert!(!dir.join("state.json.tmp").exists());
    }
    let store = StateStore::open(&dir).expect("reopen");
    let again = store.load::<Value>();
    assert_eq!(again.note, None);
    assert_eq!(
        again.value,
        json!({"agents": {"sol": {"suspect_since_ms": 12345, "heals": [1, 2]}}})
    );
    assert!(again.saved_unix_ms.is_some());
    // A second save replaces the first.
    store.save(&json!(7)).expect("save again");
    assert_eq!(store.load::<Value>().value, json!(7));
}

#[test]
fn corrupt_or_future_state_is_kept_aside_and_replaced() {
    let _area = tests::area(module_path!());
    // (file content, a substring of the note)
    let cases: &[(&[u8], &str)] = &[
        (b"", "is corrupt"),
        (b"\x00\xff garbage", "is corrupt"),
        (b"{\"version\": 1, \"data\": 3", "is corrupt"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b"{\"data\": 3}", "no version"),
        (b"{\"version\": \"one\", \"data\": 3}", "not a number"),
        (b"{\"version\": 0, \"data\": 3}", "unknown format version 0"),
        (b"{\"version\": 1}", "no data"),
        (
            b"{\"version\": 1, \"data\": \"not a number\"}",
            "does not fit this build's state",
        ),
        (
            b"{\"version\": 2, \"saved_unix_ms\": 1, \"data\": 3}",
            "newer selfheal (format version 2; this build reads 1)",
        ),
        (
            b"{\"version\": 99999999999, \"data\": {\"new\": true}}",
            "newer selfheal",
        ),
    ];
    for (content, want) in cases {
        let tmp = TempDir::new("corrupt");
        let store = StateStore::open(tmp.path()).expect("open");
        fs::write(store.path(), content).expect("write bad state");
        let loaded = store.load::<u64>();
        let shown = String::from_utf8_lossy(content);
        assert_eq!(loaded.value, 0, "{shown}");
        let note = loaded.note.unwrap_or_else(|| panic!("no note for {shown}"));
        assert!(note.contains(want), "{shown}: {note}");
        assert!(
            note.contains(&store.path().display().to_string()) && note.contains("kept it as"),
            "{note}"
        );
        let bad = bad_files(tmp.path());
        assert_eq!(bad.len(), 1, "{:?}", file_names(tmp.path()));
        assert_eq!(fs::read(&bad[0]).expect("bad file"), *content, "kept as is");
        assert!(note.contains(&bad[0].display().to_string()), "{note}");
        assert!(!store.path().exists(), "the bad file was moved, not copied");
        // The run goes on: the next save and load are clean.
        store.save(&5u64).expect("save after a bad file");
        let loaded = store.load::<u64>();
        assert_eq!((loaded.value, loaded.note), (5, None));
    }
}

#[test]
fn bad_files_are_bounded() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("badbound");
    let store = StateStore::open(tmp.path()).expect("open");
    for i in 0..(store::KEEP_BAD_FILES + 4) {
        fs::write(store.path(), format!("garbage {i}")).expect("write");
        assert!(store.load::<u64>().note.is_some());
    }
    let bad = bad_files(tmp.path());
    assert_eq!(bad.len(), store::KEEP_BAD_FILES, "{bad:?}");
    // The newest is kept.
    let newest = format!("garbage {}", store::KEEP_BAD_FILES + 3);
    assert!(
        bad.iter()
            .any(|p| fs::read_to_string(p).ok().as_deref() == Some(newest.as_str())),
        "{bad:?}"
    );
}

#[test]
fn a_symlinked_state_file_is_not_followed() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("statelink");
    let dir = tmp.path().join("state");
    let store = StateStore::open(&dir).expect("open");
    let elsewhere = tmp.path().join("elsewhere.json");
    fs::write(&elsewhere, r#"{"version":1,"data":42}"#).expect("write");
    std::os::unix::fs::symlink(&elsewhere, store.path()).expect("symlink");
    let loaded = store.load::<u64>();
    assert_eq!(loaded.value, 0);
    assert!(loaded.note.expect("note").contains("cannot be read"));
    store.save(&1u64).expect("save");
    assert!(
        !fs::symlink_metadata(store.path())
            .expect("state")
            .is_symlink()
    );
    assert_eq!(
        fs::read_to_string(&elsewhere).expect("target untouched"),
        r#"{"version":1,"data":42}"#
    );
}

#[test]
fn killed_between_write_and_rename_keeps_the_old_state() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("crash");
    let old = json!({"counter": 41, "note": "old"});
    let new = json!({"counter": 42, "note": "new"});
    StateStore::open(tmp.path())
        .expect("open")
        .save(&old)
        .expect("save old");

    let peer = child("hold-before-rename", tmp.path(), &new.to_string());
    peer.expect("tmp-written", Duration::from_secs(30));
    // The new value is fully written to the temp file, not yet renamed.
    let tmp_file = tmp.path().join("state.json.tmp");
    let written: Value =
        serde_json::from_slice(&fs::read(&tmp_file).expect("temp file exists")).expect("json");
    assert_eq!(written["data"], new);
    drop(peer); // SIGKILL, and wait

    let store = StateStore::open_with_timeout(tmp.path(), Duration::from_secs(5))
        .expect("the lock dies with its holder");
    let loaded = store.load::<Value>();
    assert_eq!(loaded.note, None);
    assert_eq!(loaded.value, old);
    // The stale temp file does not get in the way of the next save.
    store.save(&new).expect("save over a stale temp file");
    assert!(!tmp_file.exists());
    assert_eq!(store.load::<Value>().value, new);
}

#[test]
fn a_torn_temp_file_is_ignored_and_replaced() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("torn");
    let store = StateStore::open(tmp.path()).expect("open");
    store.save(&json!({"n": 1})).expect("save");
    let tmp_file = tmp.path().join("state.json.tmp");
    fs::write(&tmp_file, br#"{"version":1,"saved_unix_ms":1,"data":{"n":"#).expect("torn");
    assert_eq!(store.load::<Value>().value, json!({"n": 1}));
    store.save(&json!({"n": 2})).expect("save");
    assert!(!tmp_file.exists());
    assert_eq!(store.load::<Value>().value, json!({"n": 2}));
}

#[test]
fn killed_at_any_moment_the_state_is_old_or_new() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("killloop");
    let pad = "x".repeat(200_000);
    StateStore::open(tmp.path())
        .expect("open")
        .save(&json!({"n": 0, "pad": pad}))
        .expect("save the first value");
    for round in 0..8u64 {
        let peer = child("save-loop", tmp.path(), "200000");
        peer.expect("looping", Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(3 + round * 7));
        drop(peer);
        let store = StateStore::open_with_timeout(tmp.path(), Duration::from_secs(5))
            .expect("the lock dies with its holder");
        let loaded = store.load::<Value>();
        assert_eq!(loaded.note, None, "round {round}");
        assert!(loaded.value["n"].is_u64(), "round {round}: a whole value");
        assert_eq!(loaded.value["pad"], pad.as_str(), "round {round}");
    }
    assert!(bad_files(tmp.path()).is_empty());
}

#[test]
fn concurrent_threads_take_turns() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("threads");
    let (threads, each) = (16, 5);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..each {
                    let store = StateStore::open(tmp.path()).expect("open");
                    let v = store.load::<u64>().value;
                    std::thread::yield_now(); // widen the window a race would need
                    store.save(&(v + 1)).expect("save");
                }
            });
        }
    });
    let store = StateStore::open(tmp.path()).expect("open");
    assert_eq!(store.load::<u64>().value, threads * each);
}

#[test]
fn concurrent_processes_take_turns() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("procs");
    let (procs, each) = (6u64, 10u64);
    let peers: Vec<Peer> = (0..procs)
        .map(|_| child("increment", tmp.path(), &each.to_string()))
        .collect();
    for p in &peers {
        p.expect("done", Duration::from_secs(60));
    }
    drop(peers);
    let store = StateStore::open(tmp.path()).expect("open");
    let loaded = store.load::<u64>();
    assert_eq!((loaded.value, loaded.note), (procs * each, None));
}

#[test]
fn a_held_lock_times_out_as_locked() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("lock");
    let holder = StateStore::open(tmp.path()).expect("open");
    let start = Instant::now();
    let err =
        StateStore::open_with_timeout(tmp.path(), Duration::from_millis(300)).expect_err("locked");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    match &err {
        StoreError::Locked { path, holder, .. } => {
            assert_eq!(path, &tmp.path().join("state.lock"));
            assert_eq!(*holder, Some(std::process::id()));
        }
        other => panic!("not Locked: {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&tmp.path().display().to_string()) && msg.contains("locked"),
        "{msg}"
    );
    drop(holder);
    StateStore::open_with_timeout(tmp.path(), Duration::from_millis(300))
        .expect("free once the holder is gone");
}

#[test]
fn refuses_symlinks_files_open_and_foreign_directories() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("refuse");
    let real = tmp.path().join("real");
    fs::create_dir(&real).expect("mkdir");
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let err = StateStore::open(&link).expect_err("symlink");
    assert!(matches!(err, StoreError::Symlink { .. }), "{err}");
    assert!(err.to_string().contains("symlink"), "{err}");
    assert!(matches!(
        SnapshotLog::open(&link, 1 << 20, 2),
        Err(StoreError::Symlink { .. })
    ));

    let file = tmp.path().join("file");
    fs::write(&file, "x").expect("file");
    let err = StateStore::open(&file).expect_err("a file");
    assert!(matches!(err, StoreError::NotDirectory { .. }), "{err}");

    fs::set_permissions(&real, fs::Permissions::from_mode(0o777)).expect("chmod");
    let err = StateStore::open(&real).expect_err("world-writable");
    assert!(
        matches!(err, StoreError::Writable { mode: 0o777, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("chmod go-w"), "{err}");
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).expect("chmod");

    let (foreign, owner) = if is_root() {
        std::os::unix::fs::chown(&real, Some(65534), Some(65534)).expect("chown");
        (real.clone(), 65534)
    } else {
        (PathBuf::from("/"), 0)
    };
    let err = StateStore::open(&foreign).expect_err("another user's directory");
    match &err {
        StoreError::NotOwner { owner: o, .. } => assert_eq!(*o, owner),
        other => panic!("not NotOwner: {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&foreign.display().to_string()) && msg.contains("owned by uid"),
        "{msg}"
    );
    assert!(matches!(
        SnapshotLog::open(&foreign, 1 << 20, 2),
        Err(StoreError::NotOwner { .. })
    ));
}

// ----------------------------------------------------------- snapshot log

fn body(n: u64) -> Value {
    json!({"processes": [{"pid": 100 + n, "threads": []}], "reasons": [{"code": "recv_blocked"}], "n": n})
}

#[test]
fn snapshots_round_trip() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("snap");
    let dir = tmp.path().join("log");
    let log = SnapshotLog::open(&dir, snapshots::DEFAULT_MAX_BYTES, snapshots::DEFAULT_KEEP)
        .expect("open creates the directory");
    assert_eq!(
        fs::metadata(&dir).expect("dir").permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(log.list(None, None).expect("empty"), Default::default());
    let before = now_ms();
    let a = log.append("sol", "wedged", &body(1)).expect("append");
    let b = log.append("luna", "degraded", &body(2)).expect("append");
    let c = log.append("sol", "unresponsive", &body(3)).expect("append");
    let after = now_ms();
    assert_eq!(
        fs::metadata(log.path_for("sol"))
            .expect("log")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );

    let all = log.list(None, None).expect("list");
    assert_eq!(all.skipped, 0);
    let ids: Vec<&str> = all.entries.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, [&a, &b, &c]);
    for m in &all.entries {
        assert!(m.unix_ms >= before && m.unix_ms <= after, "{m:?}");
        assert_eq!(m.file, log.path_for(&m.agent));
        // The id starts with the time, compacted: 2026-11-29T23:51:00Z → 20261129T235100Z.
        let stamp: String = m.time.chars().filter(|c| *c != '-' && *c != ':').collect();
        assert!(m.id.starts_with(&format!("{stamp}-{}-", m.agent)), "{m:?}");
        let t = m.time.as_bytes();
        assert!(
            t.len() == 20 && t[4] == b'-' && t[10] == b'T' && t[19] == b'Z',
            "RFC 3339 UTC, seconds: {}",
            m.time
        );
    }
    let verdicts: Vec<&str> = all.entries.iter().map(|m| m.verdict.as_str()).collect();
    assert_eq!(verdicts, ["wedged", "degraded", "unresponsive"]);

    let sol = log.list(Some("sol"), None).expect("list sol");
    assert_eq!(
        sol.entries.iter().map(|m| &m.id).collect::<Vec<_>>(),
        [&a, &c]
    );
    assert!(
        log.list(Some("nobody"), None)
            .expect("list")
            .entries
            .is_empty()
    );
    assert_eq!(
        log.list(None, Some(before)).expect("since").entries.len(),
        3
    );
    assert!(
        log.list(None, Some(after + 60_000))
            .expect("since later")
            .entries
            .is_empty()
    );

    let record = log.show(&b).expect("show").expect("found");
    assert_eq!(record["id"], b.as_str());
    assert_eq!(record["agent"], "luna");
    assert_eq!(record["verdict"], "degraded");
    assert_eq!(record["snapshot"], body(2));
    assert!(record["unix_ms"].as_u64().is_some() && record["time"].is_string());
    assert_eq!(
        log.show("20000101T000000Z-nope-0000-0").expect("show"),
        None
    );
    assert_eq!(log.show("").expect("show"), None);

    // A reader sees the same; it cannot append.
    let reader = SnapshotLog::open_read(&dir, snapshots::DEFAULT_KEEP);
    assert_eq!(reader.list(None, None).expect("list"), all);
    assert!(matches!(
        reader.append("sol", "wedged", &body(4)),
        Err(StoreError::ReadOnly { .. })
    ));
    // A reader of a directory that does not exist sees nothing.
    let none = SnapshotLog::open_read(&tmp.path().join("missing"), 5);
    assert_eq!(none.list(None, None).expect("list"), Default::default());
    assert_eq!(none.show(&a).expect("show"), None);

    // Odd agent names are safe in ids.
    let odd = log
        .append("a/b c\u{1b}[31m", "wedged", &json!(null))
        .expect("append");
    assert!(
        !odd.contains('/') && !odd.contains(' ') && !odd.contains('\u{1b}'),
        "{odd}"
    );
    assert_eq!(
        log.show(&odd).expect("show").expect("found")["agent"],
        "a/b c\u{1b}[31m"
    );
}

#[test]
fn snapshot_ids_are_unique_and_time_ordered() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("ids");
    let log = SnapshotLog::open(tmp.path(), snapshots::DEFAULT_MAX_BYTES, 5).expect("open");
    let mut ids = Vec::with_capacity(1000);
    for i in 0..1000 {
        ids.push(
            log.append("sol", "wedged", &json!({"i": i}))
                .expect("append"),
        );
    }
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), 1000);
    // Sortable by time: the leading stamp never goes back.
    let stamps: Vec<&str> = ids.iter().map(|id| &id[..16]).collect();
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamps:?}");
    let listed = log.list(None, None).expect("list");
    assert_eq!(listed.entries.len(), 1000);
    assert_eq!(
        listed.entries.iter().map(|m| &m.id).collect::<Vec<_>>(),
        ids.iter().collect::<Vec<_>>()
    );
    assert_eq!(
        log.show(&ids[500]).expect("show").expect("found")["snapshot"],
        json!({"i": 500})
    );
}

#[test]
fn rotation_keeps_exactly_keep_files_and_list_spans_them() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("rotate");
    let (max, keep) = (2_000u64, 3usize);
    // A leftover from a larger `keep` is cleared by rotation.
    let sol = snapshots::agent_file("sol");
    fs::write(tmp.path().join(format!("{sol}.7")), "old\n").expect("leftover");
    let log = SnapshotLog::open(tmp.path(), max, keep).expect("open");
    let mut ids = Vec::new();
    for i in 0..60u64 {
        ids.push(log.append("sol", "wedged", &body(i)).expect("append"));
    }
    let names = file_names(tmp.path());
    assert_eq!(
        names,
        [
            "snapshots.lock".to_string(),
            sol.clone(),
            format!("{sol}.1"),
            format!("{sol}.2"),
            format!("{sol}.3"),
        ],
        "exactly keep rotated files"
    );
    for n in &names[..4] {
        let len = fs::metadata(tmp.path().join(n)).expect("file").len();
        assert!(len > 0 && len <= max, "{n}: {len}");
    }
    let listed = log.list(None, None).expect("list");
    assert_eq!(listed.skipped, 0);
    let got: Vec<&String> = listed.entries.iter().map(|m| &m.id).collect();
    // The newest records, in order, with nothing missing in between.
    assert!(got.len() > 10 && got.len() < 60, "{}", got.len());
    assert_eq!(got, ids[60 - got.len()..].iter().collect::<Vec<_>>());
    let files: HashSet<&PathBuf> = listed.entries.iter().map(|m| &m.file).collect();
    assert_eq!(files.len(), 4, "list spans the rotated files");
    assert_eq!(
        listed.entries.last().expect("entries").file,
        log.path_for("sol")
    );
    // show finds a record in the oldest kept file; the dropped ones are gone.
    let oldest = got[0];
    assert!(log.show(oldest).expect("show").is_some());
    assert_eq!(log.show(&ids[0]).expect("show"), None);

    // keep = 0: the file is just started anew.
    let tmp0 = TempDir::new("rotate0");
    let log0 = SnapshotLog::open(tmp0.path(), 500, 0).expect("open");
    for i in 0..10 {
        log0.append("sol", "wedged", &body(i)).expect("append");
    }
    assert_eq!(
        file_names(tmp0.path()),
        ["snapshots.lock".to_string(), snapshots::agent_file("sol")]
    );
    assert!(!log0.list(None, None).expect("list").entries.is_empty());
}

#[test]
fn malformed_lines_are_skipped_and_counted() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("malformed");
    let log = SnapshotLog::open(tmp.path(), 1 << 20, 2).expect("open");
    let a = log.append("sol", "wedged", &body(1)).expect("append");
    let add = |bytes: &[u8]| {
        fs::OpenOptions::new()
            .append(true)
            .open(log.path_for("sol"))
            .and_then(|mut f| f.write_all(bytes))
            .expect("append by hand");
    };
    add(b"not json at all\n{\"id\": 1}\n\n\xff\xfe\n");
    let b = log.append("sol", "wedged", &body(2)).expect("append");
    // A torn tail (a crash mid-write by something else): the next record
    // still gets a line of its own.
    add(br#"{"id":"torn","time":"#);
    let c = log.append("sol", "down", &body(3)).expect("append");
    let listed = log.list(None, None).expect("list");
    assert_eq!(
        listed.entries.iter().map(|m| &m.id).collect::<Vec<_>>(),
        [&a, &b, &c]
    );
    assert_eq!(
        listed.skipped, 4,
        "3 bad lines + the torn one; blank not counted"
    );
    assert_eq!(
        log.show(&c).expect("show").expect("found")["snapshot"],
        body(3)
    );
    assert_eq!(log.show("torn").expect("show"), None);
    // Filters count skipped lines too, of the logs they read: the agent's
    // own and the shared one.
    assert_eq!(log.list(Some("sol"), None).expect("list").skipped, 4);
    assert_eq!(log.list(Some("luna"), None).expect("list").skipped, 0);
}

/// An append to `log` (in `dir`) fails with `errno`, and says `dir`.
fn append_refused(log: &SnapshotLog, dir: &Path, errno: i32) {
    let err = log
        .append("sol", "wedged", &body(1))
        .expect_err("an unwritable directory");
    assert_eq!(err.os_error(), Some(errno), "{err}");
    assert!(
        err.to_string().contains(&dir.display().to_string()),
        "{err}"
    );
}

#[test]
fn an_unwritable_directory_is_an_error_not_a_panic() {
    let _area = tests::area(module_path!());
    if !is_root() {
        // A read-only directory stops a non-root writer.
        let tmp = TempDir::new("ro");
        let log = SnapshotLog::open(tmp.path(), 1 << 20, 2).expect("open");
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o500)).expect("chmod");
        append_refused(&log, tmp.path(), libc::EACCES);
        skip(
            "an_unwritable_directory_is_an_error_not_a_panic (full disk part)",
            "mounting a full tmpfs needs root",
        );
        return;
    }
    // Root writes to read-only directories; a read-only mount stops it.
    match Tmpfs::mount("rofs", "size=64k,mode=0700", true) {
        Err(why) => skip("an_unwritable_directory_is_an_error_not_a_panic", &why),
        Ok(ro) => {
            let log = SnapshotLog::open(ro.path(), 1 << 20, 2).expect("open an existing dir");
            append_refused(&log, ro.path(), libc::EROFS);
            let err = StateStore::open(ro.path()).expect_err("read-only fs");
            assert_eq!(err.os_error(), Some(libc::EROFS), "{err}");
        }
    }
}

#[test]
fn a_full_disk_is_enospc_without_a_partial_line() {
    let _area = tests::area(module_path!());
    if !is_root() {
        skip(
            "a_full_disk_is_enospc_without_a_partial_line",
            "mounting a small tmpfs needs root",
        );
        return;
    }
    let fsys = match Tmpfs::mount("full", "size=64k,mode=0700", false) {
        Ok(f) => f,
        Err(why) => {
            skip("a_full_disk_is_enospc_without_a_partial_line", &why);
            return;
        }
    };
    let log = SnapshotLog::open(fsys.path(), 1 << 20, 2).expect("open");
    let first = log
        .append("sol", "wedged", &body(1))
        .expect("append with room");
    let store = StateStore::open(fsys.path()).expect("open state");
    store.save(&json!({"n": 1})).expect("save with room");

    // Fill the file system (bounded: it holds 64 KiB).
    let filler = fsys.path().join("filler");
    {
        let mut f = fs::File::create(&filler).expect("filler");
        let chunk = vec![b'f'; 4096];
        let mut full = false;
        for _ in 0..64 {
            if let Err(e) = f.write_all(&chunk) {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                full = true;
                break;
            }
        }
        assert!(full, "64 KiB tmpfs never filled");
    }
    let before = fs::read(log.path_for("sol")).expect("log");

    // A record bigger than the room left in the file's last page: part of it
    // is written before ENOSPC, and must be cut back.
    let big = json!({"stack": "s".repeat(20_000)});
    let err = log.append("sol", "wedged", &big).expect_err("full disk");
    assert_eq!(err.os_error(), Some(libc::ENOSPC), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&log.path_for("sol").display().to_string()) && msg.contains("No space left"),
        "{msg}"
    );
    let after = fs::read(log.path_for("sol")).expect("log");
    assert_eq!(after, before, "no partial line left behind");
    assert!(after.ends_with(b"\n"));

    // The state file: the save fails, the old one stays, no temp file.
    let err = store
        .save(&json!({"n": 2, "pad": "p".repeat(20_000)}))
        .expect_err("full disk");
    assert_eq!(err.os_error(), Some(libc::ENOSPC), "{err}");
    assert!(err.to_string().contains("state.json.tmp"), "{err}");
    assert!(!fsys.path().join("state.json.tmp").exists());
    assert_eq!(store.load::<Value>().value, json!({"n": 1}));

    // With room again, appends work and the log reads clean.
    fs::remove_file(&filler).expect("free space");
    let second = log.append("sol", "wedged", &big).expect("append with room");
    let listed = log.list(None, None).expect("list");
    assert_eq!(listed.skipped, 0);
    assert_eq!(
        listed.entries.iter().map(|m| &m.id).collect::<Vec<_>>(),
        [&first, &second]
    );
}

// ------------------------------------------------------ selfheal snapshots

fn selfheal(args: &[&str]) -> Output {
    Command::new(selfheal_bin())
        .args(args)
        .output()
        .expect("run selfheal")
}

/// `selfheal snapshots list --dir DIR ARGS…`.
fn list(dir: &str, args: &[&str]) -> Output {
    let mut all = vec!["snapshots", "list", "--dir", dir];
    all.extend_from_slice(args);
    selfheal(&all)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn snapshots_command_lists_and_shows() {
    let _area = tests::area(module_path!());
    let help = selfheal(&["--help"]);
    if !text(&help.stdout).contains("snapshots") {
        skip(
            "snapshots_command_lists_and_shows",
            "`selfheal snapshots` is not wired into main.rs in this build",
        );
        return;
    }
    let tmp = TempDir::new("cli");
    let dir = tmp.path().display().to_string();
    let log = SnapshotLog::open(tmp.path(), 1 << 20, 2).expect("open");
    let a = log.append("sol", "wedged", &body(1)).expect("append");
    let b = log.append("luna", "degraded", &body(2)).expect("append");

    let out = list(&dir, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("VERDICT"),
        "{table}"
    );
    assert!(
        lines[1].starts_with(&a) && lines[1].contains("sol") && lines[1].ends_with("wedged"),
        "{table}"
    );
    assert!(
        lines[2].starts_with(&b) && lines[2].contains("luna"),
        "{table}"
    );

    let out = list(&dir, &["--agent", "luna", "--since", "1h", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let metas: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(metas.len(), 1);
    assert_eq!(metas[0]["id"], b.as_str());
    assert_eq!(metas[0]["verdict"], "degraded");
    assert!(metas[0]["unix_ms"].is_u64() && metas[0]["file"].is_string());

    let out = list(&dir, &["--since", "2999-01-01T00:00:00Z"]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("no snapshots"),
        "{}",
        text(&out.stderr)
    );

    let out = selfheal(&["snapshots", "show", &a, "--dir", &dir]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pretty = text(&out.stdout);
    assert!(pretty.lines().count() > 5, "pretty by default: {pretty}");
    let record: Value = serde_json::from_str(&pretty).expect("json");
    assert_eq!(record["snapshot"], body(1));

    let out = selfheal(&["snapshots", "show", &a, "--dir", &dir, "--json"]);
    assert!(out.status.success());
    let compact = text(&out.stdout);
    assert_eq!(compact.lines().count(), 1, "{compact}");
    assert_eq!(
        serde_json::from_str::<Value>(&compact).expect("json"),
        record
    );

    let out = selfheal(&["snapshots", "show", "no-such-id", "--dir", &dir]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = text(&out.stderr);
    assert!(err.contains("no-such-id") && err.contains(&dir), "{err}");

    let out = list(&dir, &["--since", "yesterday-ish"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("bad time"));

    // A malformed line: listed around, and said on stderr.
    fs::OpenOptions::new()
        .append(true)
        .open(log.path_for("sol"))
        .and_then(|mut f| f.write_all(b"garbage\n"))
        .expect("append by hand");
    let out = list(&dir, &[]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout).lines().count(), 3);
    assert!(
        text(&out.stderr).contains("skipped 1 malformed line"),
        "{}",
        text(&out.stderr)
    );
}

/// The snapshot log and the state file are written through the
/// directory held since they were opened, and the path is checked again
/// before each write: once it leads elsewhere (the directory renamed away
/// and another put in its place), writes are refused, and nothing lands in
/// either directory.
#[test]
fn a_directory_swapped_after_open_is_refused_not_written() {
    let _area = tests::area(module_path!());
    let tmp = TempDir::new("swapped");
    let dir = tmp.path().join("snaps");
    let log = SnapshotLog::open(&dir, 1 << 20, 2).expect("open");
    let state = StateStore::open(&tmp.path().join("state")).expect("open state");
    log.append("sol", "wedged", &body(1)).expect("first append");
    state.save(&json!({"n": 1})).expect("first save");
    let moved = tmp.path().join("snaps.moved");
    fs::rename(&dir, &moved).expect("rename away");
    fs::create_dir(&dir).expect("another in its place");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let state_moved = tmp.path().join("state.moved");
    fs::rename(tmp.path().join("state"), &state_moved).unwrap();
    fs::create_dir(tmp.path().join("state")).unwrap();
    fs::set_permissions(tmp.path().join("state"), fs::Permissions::from_mode(0o700)).unwrap();

    let err = log.append("sol", "wedged", &body(2)).expect_err("swapped");
    assert!(matches!(err, StoreError::Moved { .. }), "{err}");
    assert!(
        err.to_string().contains("now leads to another directory"),
        "{err}"
    );
    let err = state.save(&json!({"n": 2})).expect_err("swapped");
    assert!(matches!(err, StoreError::Moved { .. }), "{err}");
    assert_eq!(
        file_names(&dir),
        Vec::<String>::new(),
        "nothing in the new one"
    );
    assert_eq!(
        fs::read_to_string(moved.join(snapshots::agent_file("sol")))
            .unwrap()
            .lines()
            .count(),
        1,
        "nothing more in the old one"
    );
    assert!(file_names(&tmp.path().join("state")).is_empty());
}

/// The walk follows symlinks that are ours (relative and absolute, with
/// `..`), writes land in the real directory, and a symlink loop or a file
/// on the way is an error, not a panic or a hang.
#[test]
fn the_walk_follows_our_symlinks_and_refuses_loops() {
    let _area = tests::area(module_path!());
    use selfheal::fs::safedir::SafeDir;
    let tmp = TempDir::new("walk");
    let real = tmp.path().join("a/b");
    fs::create_dir_all(&real).unwrap();
    fs::set_permissions(tmp.path().join("a"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink("a/b/../b", tmp.path().join("rel")).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("a"), tmp.path().join("abs")).unwrap();
    for via in [tmp.path().join("rel/x"), tmp.path().join("abs/b/x")] {
        let log = SnapshotLog::open(&via, 1 << 20, 2).expect("through our own symlinks");
        log.append("sol", "wedged", &body(1)).expect("append");
        assert!(
            real.join("x").join(snapshots::agent_file("sol")).is_file(),
            "{}",
            via.display()
        );
        fs::remove_dir_all(real.join("x")).unwrap();
    }
    std::os::unix::fs::symlink("loop2", tmp.path().join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", tmp.path().join("loop2")).unwrap();
    let err = SafeDir::open(&tmp.path().join("loop1/x"), Some(0o700)).expect_err("a loop");
    assert!(err.to_string().contains("loop1"), "{err}");
    fs::write(tmp.path().join("file"), "x").unwrap();
    let err = SafeDir::open(&tmp.path().join("file/x"), Some(0o700)).expect_err("a file");
    assert!(err.to_string().contains("file"), "{err}");
    let err = SafeDir::open(&tmp.path().join("missing"), None).expect_err("missing");
    assert_eq!(err.os_error(), Some(libc::ENOENT), "{err}");
}
