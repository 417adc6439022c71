//! Faults, attacked on purpose (issue 7, part 2), each against real
//! processes and sockets: the snapshot directory full, the helper killed
//! mid-request and restarted (and its eBPF programs gone with it), a pid
//! reused between judging and acting, a churn of short-lived matching
//! processes, and the wall clock jumping between checks.
//!
//! Most need root (network namespaces, mounts, pidfd_getfd on other
//! processes, clock_settime); they skip, saying why, otherwise.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use tests::{
    CheckRun, NetnsPair, Peer, Ready, Scratch, keepalive_enabled, need_root, run_check,
    selfheal_bin, socket_fd_of,
};

const SEC: Duration = Duration::from_secs(1);

/// A runner in netns `a`, blocked reading its control connection from a
/// heartbeat server in `b` (a byte every 300 ms), and a config that judges
/// it (`control` upstream, heartbeat 1 s): wedged about 3 s after `b`
/// starts dropping the port.
struct Runner {
    pair: NetnsPair,
    _server: Peer,
    client: Peer,
    ready: Ready,
    fd: i32,
}

impl Runner {
    fn new(tag: &str) -> Runner {
        let pair = NetnsPair::new(tag).expect("netns pair");
        let peer = tests::helper_bin("recv-peer");
        let b = pair.b_addr.clone();
        let mut cmd = pair.b.command(&peer);
        cmd.args(["beat", &format!("{b}:7443"), "300"]);
        let server = Peer::spawn(cmd);
        server.expect("listening", 10 * SEC);
        let mut cmd = pair.a.command(&peer);
        cmd.args(["client", &format!("{b}:7443")]);
        let mut client = Peer::spawn(cmd);
        let ready = client.ready();
        client.tell("go");
        let fd = socket_fd_of(ready.pid, ready.inode).expect("the runner's socket fd");
        Runner {
            pair,
            _server: server,
            client,
            ready,
            fd,
        }
    }

    fn config(&self, path: &Path) {
        let b = &self.pair.b_addr;
        std::fs::write(
            path,
            format!(
                "[[agent]]\nname = \"runner\"\nmatch = {{ cmdline = \"recv-peer client {b}:7443$\" }}\n\
                 [[agent.upstream]]\nrole = \"control\"\naddr = \"{b}:7443\"\nheartbeat = \"1s\"\n\
                 [agent.thresholds]\nsuspect_after = \"2s\"\n\
                 [agent.heal]\nstep_window = \"20s\"\nbackoff = \"1s\"\n"
            ),
        )
        .expect("write config");
    }

    fn keepalive(&self) -> bool {
        keepalive_enabled(self.ready.pid, self.fd).expect("read the runner's SO_KEEPALIVE")
    }

    /// The control server vanishes without a FIN.
    fn cut(&self) {
        self.pair.drop_port_into_b(7443).expect("nft");
    }
}

/// A tmpfs mounted on `dir` for the test, unmounted (lazily, so a busy
/// mount cannot leak) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount tmpfs: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system under `path` with one file until `ENOSPC`; the
/// bytes written.
fn fill(path: &Path) -> u64 {
    use std::io::Write as _;
    let mut f = std::fs::File::create(path).expect("create the filler");
    let chunk = [0x55u8; 4096];
    let mut n = 0u64;
    // Bounded: the tmpfs is 64 KiB.
    for _ in 0..100_000 {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(k) => n += k as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("fill {}: {e}", path.display()),
        }
    }
    // Whatever tail is left (a partial page) too.
    for _ in 0..4096 {
        match f.write(&chunk[..1]) {
            Ok(1) => n += 1,
            _ => break,
        }
    }
    n
}

fn reason_codes(v: &serde_json::Value) -> Vec<String> {
    v["reasons"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["code"].as_str().map(str::to_string))
        .collect()
}

/// The snapshot directory is full (a 64 KiB tmpfs, filled): `check` finds
/// the runner wedged, says the snapshot was NOT written, exits non-zero and
/// takes no healing step — the runner's socket keeps no keepalive. Once the
/// space is back, the next check writes the snapshot and heals (keepalive
/// armed), and the log holds exactly that one whole record.
#[test]
fn a_full_snapshot_dir_means_no_heal_until_space_returns() {
    if !need_root("snapshot_dir_full") {
        return;
    }
    let runner = Runner::new("sf");
    let dirs = Scratch::new("faults-full");
    let config = dirs.join("config.toml");
    runner.config(&config);
    let snaps = dirs.join("snapshots");
    let _tmpfs = match Tmpfs::mount(&snaps, "64k") {
        Ok(t) => t,
        Err(e) => {
            tests::skip("snapshot_dir_full", &format!("cannot mount a tmpfs: {e}"));
            return;
        }
    };
    let check = || {
        run_check(
            &config,
            &dirs.join("state"),
            &snaps,
            &dirs.join("no-helper.sock"),
            &[],
        )
    };
    std::thread::sleep(SEC);
    let warm = check();
    assert_eq!(warm.agent("runner")["verdict"], "idle", "{warm:#?}");
    assert_eq!(warm.code, 0, "{warm:#?}");

    let filler = snaps.join("filler");
    let filled = fill(&filler);
    eprintln!("filled the snapshot tmpfs with {filled} bytes");
    assert!(!runner.keepalive(), "no keepalive before any heal");

    runner.cut();
    let cut = Instant::now();
    let mut wedged: Option<CheckRun> = None;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(500));
        let r = check();
        assert!(!r.stderr.contains("panicked"), "{r:#?}");
        if r.agent("runner")["verdict"] == "wedged" {
            wedged = Some(r);
            break;
        }
    }
    let r = wedged.expect("the runner turned wedged within 15 s");
    eprintln!("wedged {:?} after the cut", cut.elapsed());
    let o = r.agent("runner");
    assert_eq!(r.code, 2, "wedged and NOT healed: {r:#?}");
    assert!(o["snapshot"].is_null(), "{o:#}");
    let err = o["snapshot_error"].as_str().expect("snapshot_error");
    assert!(
        err.contains("No space left") && err.contains("snapshots.jsonl"),
        "the error names the file and ENOSPC: {err}"
    );
    assert!(r.stderr.contains("NOT written"), "{}", r.stderr);
    // The ladder decided to act, and nothing was taken.
    for a in o["heal"]["actions"].as_array().into_iter().flatten() {
        assert_eq!(a["ok"], false, "{o:#}");
        assert!(
            a["detail"]
                .as_str()
                .is_some_and(|d| d.contains("snapshot could not be written")),
            "{o:#}"
        );
    }
    assert!(
        reason_codes(o).contains(&"control_silent".to_string()),
        "{o:#}"
    );
    assert!(!runner.keepalive(), "keepalive armed without a snapshot");

    // Still full: still no action, check after check.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        let r = check();
        assert_eq!(r.agent("runner")["verdict"], "wedged", "{r:#?}");
        assert_eq!(r.code, 2, "{r:#?}");
        assert!(r.agent("runner")["snapshot"].is_null());
        assert!(!runner.keepalive(), "keepalive armed without a snapshot");
    }

    // Space returns: the snapshot is written, then the heal is taken.
    std::fs::remove_file(&filler).unwrap();
    let r = check();
    let o = r.agent("runner");
    assert_eq!(o["verdict"], "wedged", "{r:#?}");
    let id = o["snapshot"].as_str().expect("a snapshot now").to_string();
    let actions = o["heal"]["actions"].as_array().cloned().unwrap_or_default();
    assert_eq!(actions.len(), 1, "{o:#}");
    assert_eq!(actions[0]["step"]["action"], "arm_keepalive", "{o:#}");
    assert_eq!(actions[0]["ok"], true, "{o:#}");
    assert_eq!(r.code, 1, "wedged and healed: {r:#?}");
    assert!(runner.keepalive(), "the heal armed keepalive");

    // The log holds that one record, whole (no torn line from the full disk).
    let out = Command::new(selfheal_bin())
        .args(["snapshots", "list", "--json", "--dir"])
        .arg(&snaps)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let ids: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(ids, vec![id], "{text}");
    let log = std::fs::read(snaps.join("snapshots.jsonl")).unwrap();
    assert_eq!(log.iter().filter(|b| **b == b'\n').count(), 1);
    assert_eq!(log.last(), Some(&b'\n'));
    drop(runner.client);
}
