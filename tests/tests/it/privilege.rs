//! Privilege and the helper's surface, attacked on purpose: what another user can plant in selfheal's paths (symlinks,
//! directories, writable config and policy files), what an unprivileged
//! uid can get from a real `selfheal helper` (another uid's evidence or
//! processes: nothing), a flood from one client against another client,
//! the helper socket's mode and owner, and restart commands run as argv.
//!
//! The "other user" is `nobody` (65534): a thread of this test that
//! dropped to it with raw `setresuid` (that thread only), or a child
//! started as it. Needs root; skips otherwise.

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::Path,
    process::Command,
    time::Duration,
};

use selfheal::{
    helper::{ClientError, HelperClient},
    sys::pidfd::start_ticks,
};
use selfheal_core::protocol::ActRequest;
use selfheal_core::protocol::Action;
use selfheal_core::protocol::ErrorCode;
use tests::fixtures::{Places, Reaped, control_runner, helper_cmd};
use tests::{
    Peer, Ready, Scratch, as_uid, need_root, patient_client_opts, run_check, run_check_at,
};

const SEC: Duration = Duration::from_secs(1);

const NOBODY: u32 = 65534;

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

fn chmod(p: &Path, m: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
}

/// Makes the directory `p` (the caller's) with mode `m`.
fn dir_with_mode(p: &Path, m: u32) {
    std::fs::create_dir(p).unwrap();
    chmod(p, m);
}

/// Makes the directory `p`, then gives it to `nobody`.
fn nobodys_dir(p: &Path) {
    std::fs::create_dir(p).unwrap();
    std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
}

/// Waits up to `within` (looking every `tick`) for `child` to exit, kills
/// it if it has not; its exit status (`None`: killed) and its stderr.
fn exit_and_stderr(
    child: &mut std::process::Child,
    within: Duration,
    tick: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let done = tests::wait_for(within, tick, || child.try_wait().ok().flatten());
    if done.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (done, err)
}

/// A config whose one agent is `down` (no such pid): every check writes a
/// snapshot, so the snapshot log's files exist.
fn down_config(dir: &Scratch) -> std::path::PathBuf {
    tests::config_in(
        dir,
        "[[agent]]\nname = \"ghost\"\nmatch = { pid = 4194000 }\n",
    )
}

/// State and snapshot directories are created 0700 (and the parents we
/// create too), their files 0600; a symlink, a directory or a parent
/// directory planted by another user is refused with an error naming the
/// path, and nothing is written where they lead; a symlink planted where
/// the metrics file's temporary file goes is not followed.
#[test]
fn planted_paths_are_refused_and_ours_are_private() {
    let _area = tests::area(module_path!());
    if !need_root("planted_paths") {
        return;
    }
    let dir = Scratch::new("priv-paths");
    let config = down_config(&dir);
    let helper = dir.join("no-helper.sock");

    // Fresh: created private.
    let state = dir.join("fresh/deeper/state");
    let snaps = dir.join("fresh/deeper/snaps");
    let r = run_check(&config, &state, &snaps, &helper, &[]);
    assert_eq!(r.code, 2, "down: {r:#?}");
    assert!(r.agent("ghost")["snapshot"].is_string(), "{r:#?}");
    for d in [
        &state,
        &snaps,
        &dir.join("fresh"),
        &dir.join("fresh/deeper"),
    ] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    for f in [
        state.join("state.json"),
        state.join("state.lock"),
        snaps.join(selfheal::snapshots::agent_file("ghost")),
        snaps.join("snapshots.lock"),
    ] {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
        assert_eq!(std::fs::metadata(&f).unwrap().uid(), 0);
    }

    // A world-writable sticky directory (like /tmp) where nobody plants
    // things for root to use.
    let public = dir.join("public");
    dir_with_mode(&public, 0o1777);
    // Where nobody's symlinks lead: a directory of root's.
    let target = dir.join("roots");
    dir_with_mode(&target, 0o700);
    let nobodys = public.join("nobodys");
    as_uid(NOBODY, || {
        std::os::unix::fs::symlink(&target, public.join("state-link")).unwrap();
        std::os::unix::fs::symlink(&target, public.join("snaps-link")).unwrap();
        std::fs::create_dir(public.join("state-dir")).unwrap();
        dir_with_mode(&nobodys, 0o755);
    });

    let refused = |state: &Path, snaps: &Path, why_state: &str, why_snaps: &str| {
        let r = run_check(&config, state, snaps, &helper, &[]);
        assert!(!r.stderr.contains("panicked"), "{r:#?}");
        let o = r.agent("ghost");
        assert!(o["snapshot"].is_null(), "{r:#?}");
        let err = o["snapshot_error"].as_str().unwrap_or_default();
        assert!(
            r.stderr.contains(&format!("refusing {}", state.display()))
                && r.stderr.contains(why_state),
            "state {}: {}",
            state.display(),
            r.stderr
        );
        assert!(
            r.stderr.contains(&format!("refusing {}", snaps.display()))
                && r.stderr.contains(why_snaps)
                && err.contains("snapshot log"),
            "snapshots {}: {} / {err}",
            snaps.display(),
            r.stderr
        );
        // Not healthy, and it says so: down, and no snapshot.
        assert_eq!(r.code, 2, "{r:#?}");
    };
    // Symlinks planted by nobody: not followed.
    refused(
        &public.join("state-link"),
        &public.join("snaps-link"),
        "it is a symlink",
        "it is a symlink",
    );
    assert_eq!(
        std::fs::read_dir(&target).unwrap().count(),
        0,
        "nothing written where the symlinks lead"
    );
    // A directory nobody made, and directories inside nobody's directory.
    refused(
        &public.join("state-dir"),
        &nobodys.join("snaps"),
        &format!("owned by uid {NOBODY}"),
        &format!("{} above it is owned by uid {NOBODY}", nobodys.display()),
    );
    assert!(
        !nobodys.join("snaps").exists(),
        "nothing created in nobody's directory"
    );
    // A directory of root's that others may write to, and one below such.
    let open = dir.join("open");
    dir_with_mode(&open, 0o777);
    refused(
        &open,
        &open.join("snaps"),
        "writable by group or others (mode 0777)",
        "is writable by group or others and not sticky (mode 0777)",
    );

    // The metrics file in a directory of nobody's (a textfile collector's):
    // refused by the same rule as the snapshot directory, so nothing is
    // written there (nobody planted its temporary file as a symlink to a
    // file of root's: untouched).
    let secret = target.join("secret");
    std::fs::write(&secret, "root's\n").unwrap();
    let prom = nobodys.join("selfheal.prom");
    as_uid(NOBODY, || {
        std::os::unix::fs::symlink(&secret, nobodys.join("selfheal.prom.tmp")).unwrap();
    });
    let r = run_check(
        &config,
        &state,
        &snaps,
        &helper,
        &["--metrics-file", prom.to_str().unwrap()],
    );
    assert_eq!(r.code, 2, "{r:#?}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root's\n");
    assert!(!prom.exists(), "nothing written in nobody's directory");
    assert!(
        r.stderr
            .contains(&format!("refusing {}", nobodys.display()))
            && r.stderr.contains(&format!("owned by uid {NOBODY}")),
        "{}",
        r.stderr
    );
}

/// `selfheal` with `args`, as `uid` when given; exit code and stderr.
fn selfheal_as(uid: Option<u32>, args: &[&std::ffi::OsStr]) -> (i32, String) {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(tests::selfheal_bin());
    cmd.args(args);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().expect("run selfheal");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// A config or a helper policy that another user could have written — the
/// file group/other-writable, owned by another non-root uid, or in a
/// directory of theirs or one open to all — is refused when running as
/// root, with an error naming the file (exit 3). The same files, owned by
/// root and closed, are used; a user's own config is that user's to use.
#[test]
fn configs_and_policies_others_could_write_are_refused() {
    let _area = tests::area(module_path!());
    if !need_root("untrusted_config") {
        return;
    }
    let dir = Scratch::new("priv-trust");
    let text = format!(
        "[[agent]]\nname = \"me\"\nmatch = {{ pid = {} }}\n",
        std::process::id()
    );
    let state = dir.join("state");
    let snaps = dir.join("snaps");
    let check = |config: &Path| {
        selfheal_as(
            None,
            &[
                os("check"),
                os("--config"),
                config.as_os_str(),
                os("--state-dir"),
                state.as_os_str(),
                os("--snapshot-dir"),
                snaps.as_os_str(),
                os("--helper"),
                dir.join("no-helper.sock").as_os_str(),
            ],
        )
    };
    let config = tests::config_in(&dir, &text);
    chmod(&config, 0o644);
    let (code, err) = check(&config);
    assert_eq!(code, 0, "root's closed config is used: {err}");

    let refused = |config: &Path, why: &str| {
        let (code, err) = check(config);
        assert_eq!(code, 3, "{err}");
        assert!(
            err.contains(&format!("refusing config {}", config.display())) && err.contains(why),
            "{why}: {err}"
        );
    };
    chmod(&config, 0o666);
    refused(&config, "writable by group or others (mode 0666)");
    chmod(&config, 0o620);
    refused(&config, "writable by group or others (mode 0620)");
    chmod(&config, 0o644);
    std::os::unix::fs::chown(&config, Some(NOBODY), Some(NOBODY)).unwrap();
    refused(&config, &format!("owned by uid {NOBODY}, not root"));
    std::os::unix::fs::chown(&config, Some(0), Some(0)).unwrap();
    // Root's file in a directory of nobody's: nobody could replace it.
    let theirs = dir.join("theirs");
    nobodys_dir(&theirs);
    let in_theirs = theirs.join("config.toml");
    std::fs::write(&in_theirs, &text).unwrap();
    refused(
        &in_theirs,
        &format!("directory {} is owned by uid {NOBODY}", theirs.display()),
    );
    // In a directory anyone may write to.
    let open = dir.join("open");
    dir_with_mode(&open, 0o777);
    let in_open = open.join("config.toml");
    std::fs::write(&in_open, &text).unwrap();
    refused(
        &in_open,
        &format!(
            "directory {} is writable by group or others",
            open.display()
        ),
    );
    // In a sticky directory open to all (/tmp): root's own file is root's
    // (nobody may rename or remove it there); one nobody put there is not.
    let public = dir.join("public");
    dir_with_mode(&public, 0o1777);
    let in_public = public.join("config.toml");
    std::fs::write(&in_public, &text).unwrap();
    let (code, err) = check(&in_public);
    assert_eq!(code, 0, "root's config in a sticky directory: {err}");
    let planted = public.join("planted.toml");
    as_uid(NOBODY, || std::fs::write(&planted, &text).unwrap());
    refused(&planted, &format!("owned by uid {NOBODY}, not root"));
    // Through a symlink (resolved, then checked): the real file decides.
    let link = dir.join("link.toml");
    std::os::unix::fs::symlink(&in_open, &link).unwrap();
    let (code, err) = check(&link);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("refusing config"), "{err}");

    // nobody's own config, in nobody's own directory, is nobody's to use.
    let mine = theirs.join("mine.toml");
    std::fs::write(
        &mine,
        "[[agent]]\nname = \"x\"\nmatch = { pid = 4194000 }\n",
    )
    .unwrap();
    std::os::unix::fs::chown(&mine, Some(NOBODY), Some(NOBODY)).unwrap();
    let (code, err) = selfheal_as(
        Some(NOBODY),
        &[
            os("check"),
            os("--config"),
            mine.as_os_str(),
            os("--state-dir"),
            theirs.join("state").as_os_str(),
            os("--snapshot-dir"),
            theirs.join("snaps").as_os_str(),
            os("--helper"),
            dir.join("no-helper.sock").as_os_str(),
        ],
    );
    assert_eq!(
        code, 2,
        "nobody's own config is used (the agent is down): {err}"
    );
    assert!(!err.contains("refusing"), "{err}");

    // The helper's policy file: the same rule.
    let policy = dir.join("helper.toml");
    std::fs::write(&policy, format!("[[grant]]\nuid = {NOBODY}\nuids = [1]\n")).unwrap();
    let helper = |policy: &Path| {
        selfheal_as(
            None,
            &[
                os("helper"),
                os("--no-ebpf"),
                os("--socket"),
                dir.join("h.sock").as_os_str(),
                os("--policy"),
                policy.as_os_str(),
            ],
        )
    };
    for (m, owner, why) in [
        (
            0o666,
            0,
            "writable by group or others (mode 0666)".to_string(),
        ),
        (0o644, NOBODY, format!("owned by uid {NOBODY}, not root")),
    ] {
        chmod(&policy, m);
        std::os::unix::fs::chown(&policy, Some(owner), Some(owner)).unwrap();
        let (code, err) = helper(&policy);
        assert_eq!(code, 3, "{err}");
        assert!(
            err.contains(&format!("refusing policy {}", policy.display())) && err.contains(&why),
            "{why}: {err}"
        );
    }
}

// ---------------------------------------------------------------------------
// A real `selfheal helper` and what other uids can get from it.

/// `selfheal helper --socket PATH ARGS…` (the real binary, real executor),
/// up and answering; killed on drop.
struct RealHelper {
    child: Reaped,
    path: std::path::PathBuf,
}

impl RealHelper {
    fn start(path: &Path, args: &[&str]) -> RealHelper {
        let child = Command::new(tests::selfheal_bin())
            .arg("helper")
            .args(args)
            .arg("--socket")
            .arg(path)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start selfheal helper");
        let h = RealHelper {
            child: Reaped(child),
            path: path.to_path_buf(),
        };
        tests::fixtures::wait_answering(path);
        h
    }

    fn client(&self) -> HelperClient {
        HelperClient::connect_with(&self.path, patient_client_opts())
            .expect("connect to the helper")
    }

    /// SIGTERM; its log (stderr).
    fn stop(mut self) -> String {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.pid() as libc::pid_t, libc::SIGTERM) };
        let done = tests::wait_for(10 * SEC, Duration::from_millis(20), || {
            self.child.0.try_wait().ok().flatten()
        });
        assert!(done.is_some(), "the helper stops on SIGTERM");
        self.child.stderr()
    }
}

/// Taken by the tests that run a real helper: the flood saturates both
/// cores for 3 s, which is its own test's business, not the others'.
fn one_helper_test_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A blocking client (`recv-peer client`) of `addr`, as `uid` when given,
/// waiting for "go" before its first read.
fn agent(addr: &str, uid: Option<u32>) -> (Peer, Ready, i32) {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(tests::helper_bin("recv-peer"));
    cmd.args(["client", addr]);
    if let Some(uid) = uid {
        cmd.uid(uid).gid(uid);
    }
    let p = Peer::spawn(cmd);
    let r = p.ready();
    let fd = tests::socket_fd_of(r.pid, r.inode).expect("the agent's socket fd");
    (p, r, fd)
}

fn act(action: Action, pid: u32, fd: Option<(i32, u64)>) -> ActRequest {
    let mut r = ActRequest::new(action, pid, start_ticks(pid).expect("running"));
    // A socket action names the fd and the socket it holds.
    r.fd = fd.map(|(fd, _)| fd);
    r.inode = fd.map(|(_, inode)| inode);
    r.agent = Some("agent".into());
    r
}

/// Through a real helper (eBPF loaded, real executor), `nobody` can watch,
/// read the eBPF evidence of, and arm keepalive on its own agent — and can
/// do none of it to root's: every act is `forbidden`, root's pid in a
/// query is a refused pid (a gap: the rest is answered, nothing of root's
/// is shown), root's socket keeps no
/// keepalive, root's agent gets no signal, and the helper's audit log
/// names each refusal.
#[test]
fn an_unprivileged_uid_gets_nothing_of_another_uids_agent() {
    let _area = tests::area(module_path!());
    if !need_root("helper_other_uid") {
        return;
    }
    let _one = one_helper_test_at_a_time();
    let dir = Scratch::new("priv-uid");
    let ebpf = selfheal::ebpf::BUILT_IN;
    let helper = RealHelper::start(
        &dir.join("helper.sock"),
        if ebpf { &["--tracer"] } else { &["--no-ebpf"] },
    );
    let l = tests::listener();
    let addr = l.local_addr().unwrap().to_string();
    let (mut root_peer, root, root_fd) = agent(&addr, None);
    let (mut nobody_peer, mine, mine_fd) = agent(&addr, Some(NOBODY));
    let mut rc = helper.client();
    let traced = rc.hello().unwrap().ebpf.strategy.is_some();
    if traced {
        rc.watch(&[root.pid]).expect("root watches its agent");
    } else {
        tests::skip(
            "helper_other_uid (eBPF evidence)",
            "the helper has no tracer here",
        );
    }
    let nobody_watch = as_uid(NOBODY, || helper.client().watch(&[mine.pid]));
    if traced {
        nobody_watch.expect("nobody watches its own agent");
    }
    root_peer.tell("go");
    nobody_peer.tell("go");
    if traced {
        // The evidence exists: root sees its agent blocked in the read.
        tests::wait_for(10 * SEC, Duration::from_millis(50), || {
            let s = rc.ebpf_snapshot(&[root.pid]).ok()?;
            s.blocked.iter().any(|b| b.tgid == root.pid).then_some(())
        })
        .expect("the tracer sees root's agent blocked");
    }

    let forbidden = |e: ClientError, what: &str| {
        assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{what}: {e}");
        assert!(
            e.to_string().contains(&format!("uid {NOBODY} may not")),
            "{what}: {e}"
        );
    };
    as_uid(NOBODY, || {
        let mut c = helper.client();
        assert_eq!(c.hello().unwrap().caller.uid, NOBODY);
        if traced {
            // Root's pid is refused (a gap), never shown; its own are.
            let w = c.watch(&[root.pid]).unwrap();
            assert_eq!(
                (w.watched.len(), w.refused.clone()),
                (0, vec![root.pid]),
                "watch root's: {w:?}"
            );
            let g = c.ebpf_snapshot_with_gaps(&[root.pid]).unwrap();
            assert_eq!(g.refused, vec![root.pid], "root's evidence");
            assert!(
                g.snapshot.blocked.is_empty() && g.snapshot.sockets.is_empty(),
                "root's evidence: {g:?}"
            );
            let g = c.ebpf_snapshot_with_gaps(&[mine.pid, root.pid]).unwrap();
            assert_eq!(g.refused, vec![root.pid], "root's evidence with its own");
            assert!(
                g.snapshot.blocked.iter().all(|b| b.tgid == mine.pid)
                    && g.snapshot.sockets.iter().all(|x| x.tgid == mine.pid),
                "root's evidence with its own: {g:?}"
            );
            let s = tests::wait_for(10 * SEC, Duration::from_millis(50), || {
                let s = c.ebpf_snapshot(&[mine.pid]).ok()?;
                s.blocked.iter().any(|b| b.tgid == mine.pid).then_some(s)
            })
            .expect("nobody sees its own agent blocked");
            assert!(
                s.blocked.iter().all(|b| b.tgid == mine.pid)
                    && s.sockets.iter().all(|x| x.tgid == mine.pid),
                "only its own pids: {s:?}"
            );
        }
        for (action, fd) in [
            (Action::ArmKeepalive, Some((root_fd, root.inode))),
            (Action::DestroySocket, Some((root_fd, root.inode))),
            (Action::Signal, None),
        ] {
            forbidden(
                c.act(&act(action, root.pid, fd)).unwrap_err(),
                &format!("{action:?} on root's"),
            );
        }
        // The prove stage's actions are acts like the others: refused on
        // another uid's socket before anything is duplicated.
        for action in [
            Action::ProveKeepalive,
            Action::RestoreKeepalive,
            Action::ExpireKeepalive,
        ] {
            let req = act(action, root.pid, Some((root_fd, root.inode)));
            forbidden(c.act(&req).unwrap_err(), &format!("{action:?} on root's"));
        }
        c.act(&act(
            Action::ArmKeepalive,
            mine.pid,
            Some((mine_fd, mine.inode)),
        ))
        .expect("nobody arms keepalive on its own agent's socket");
    });
    assert!(
        !tests::keepalive_enabled(root.pid, root_fd).unwrap(),
        "root's socket was touched"
    );
    assert!(tests::keepalive_enabled(mine.pid, mine_fd).unwrap());
    // Root's agent is still there, blocked in its read.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", root.pid)).unwrap();
    assert!(!stat.contains(") Z"), "{stat}");
    drop(rc);
    let log = helper.stop();
    let refusals = log
        .lines()
        .filter(|l| {
            l.contains("act refused")
                && l.contains(&format!("caller_uid={NOBODY}"))
                && l.contains(&format!("pid={}", root.pid))
        })
        .count();
    assert_eq!(refusals, 6, "{log}");
    drop((root_peer, nobody_peer));
    assert!(
        log.lines().any(|l| l.contains("act performed")
            && l.contains(&format!("caller_uid={NOBODY}"))
            && l.contains(&format!("pid={}", mine.pid))),
        "{log}"
    );
    drop(l);
}

/// Four connections of `nobody` flood a real helper (default limits: 16
/// connections and bursts of 100 then 50 requests per second per uid) with
/// pipelined requests for 3 s, while another unprivileged uid asks every
/// 50 ms. The flood is mostly refused `busy`; the other uid is answered,
/// every time, within a bound.
#[test]
fn a_flood_from_one_uid_does_not_starve_another() {
    let _area = tests::area(module_path!());
    use std::io::{BufRead as _, BufReader, Write as _};
    if !need_root("helper_flood_real") {
        return;
    }
    let _one = one_helper_test_at_a_time();
    const OTHER: u32 = 65533;
    const FLOOD_FOR: Duration = Duration::from_secs(3);
    let dir = Scratch::new("priv-flood");
    let helper = RealHelper::start(&dir.join("helper.sock"), &["--no-ebpf"]);
    let path = helper.path.clone();
    let (flood, other) = std::thread::scope(|s| {
        let flooders: Vec<_> = (0..4)
            .map(|k| {
                let path = path.clone();
                s.spawn(move || {
                    as_uid(NOBODY, || {
                        let stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
                        stream.set_read_timeout(Some(10 * SEC)).unwrap();
                        let mut reader = BufReader::new(stream.try_clone().unwrap());
                        let (mut ok, mut busy) = (0u64, 0u64);
                        let end = std::time::Instant::now() + FLOOD_FOR;
                        let mut id = 0u64;
                        while std::time::Instant::now() < end {
                            let mut batch = Vec::new();
                            for _ in 0..50 {
                                id += 1;
                                batch.extend_from_slice(
                                    format!("{{\"v\":1,\"id\":{id},\"op\":\"hello\"}}\n")
                                        .as_bytes(),
                                );
                            }
                            (&stream).write_all(&batch).expect("flood");
                            for _ in 0..50 {
                                let mut line = String::new();
                                reader.read_line(&mut line).expect("an answer");
                                let v: serde_json::Value = serde_json::from_str(&line)
                                    .unwrap_or_else(|e| panic!("{line:?}: {e}"));
                                match v["error"]["code"].as_str() {
                                    None => ok += 1,
                                    Some("busy") => busy += 1,
                                    Some(c) => panic!("flooder {k}: unexpected {c}: {line}"),
                                }
                            }
                        }
                        (ok, busy)
                    })
                })
            })
            .collect();
        let asker = s.spawn(|| {
            as_uid(OTHER, || {
                let mut c = HelperClient::connect_with(&path, patient_client_opts()).unwrap();
                let mut worst = Duration::ZERO;
                let mut n = 0u32;
                let end = std::time::Instant::now() + FLOOD_FOR;
                while std::time::Instant::now() < end {
                    let t = std::time::Instant::now();
                    let h = c.hello().expect("the other uid is answered");
                    assert_eq!(h.caller.uid, OTHER);
                    worst = worst.max(t.elapsed());
                    n += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                (n, worst)
            })
        });
        let flood: Vec<(u64, u64)> = flooders.into_iter().map(|f| f.join().unwrap()).collect();
        (flood, asker.join().unwrap())
    });
    let ok: u64 = flood.iter().map(|f| f.0).sum();
    let busy: u64 = flood.iter().map(|f| f.1).sum();
    let (n, worst) = other;
    eprintln!(
        "flood: {} requests from uid {NOBODY} in {FLOOD_FOR:?} on 4 connections: {ok} served, \
         {busy} refused busy; uid {OTHER}: {n} of {n} answered, slowest {worst:?}",
        ok + busy
    );
    // The burst plus the refill (50/s over 3 s), with slack for timing.
    assert!(
        ok <= 100 + 50 * 4 + 50,
        "the flood was not limited: {ok} served"
    );
    assert!(
        busy > ok,
        "most of the flood is refused: {busy} busy, {ok} served"
    );
    assert!(n >= 20, "the other uid kept asking: {n}");
    assert!(worst < 2 * SEC, "the other uid waited {worst:?}");
    let log = helper.stop();
    assert!(!log.contains("panicked"), "{log}");
}

// ---------------------------------------------------------------------------
// The helper socket, as documented.

/// `Key=value` of a systemd unit file.
fn unit_value(unit: &str, key: &str) -> Option<String> {
    unit.lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_string))
}

/// The real helper binds its socket as its documentation and the shipped
/// socket unit say — mode 0666 (any uid may connect; every request is
/// authorized by SO_PEERCRED), owned by the helper's uid, in a directory it
/// creates 0755 — so `nobody` connects and is known as itself. It refuses
/// a socket directory another user could change (owned by another uid,
/// a symlink, one of root's others could write that holds another user's
/// entry; an empty one it closes and uses), a path that is not a
/// socket, and a path a live helper serves; it removes its socket on exit.
#[test]
fn the_helper_socket_has_the_documented_mode_and_owner() {
    let _area = tests::area(module_path!());
    if !need_root("helper_socket_mode") {
        return;
    }
    let _one = one_helper_test_at_a_time();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let unit = std::fs::read_to_string(repo.join("dist/systemd/selfheal-helper.socket")).unwrap();
    let socket_mode = u32::from_str_radix(&unit_value(&unit, "SocketMode").unwrap(), 8).unwrap();
    let dir_mode = u32::from_str_radix(&unit_value(&unit, "DirectoryMode").unwrap(), 8).unwrap();
    assert_eq!(socket_mode, selfheal::helper::SOCKET_MODE, "unit vs code");
    assert_eq!(
        dir_mode,
        selfheal::helper::server::listen::SOCKET_DIR_MODE,
        "unit vs code"
    );
    let help = Command::new(tests::selfheal_bin())
        .args(["helper", "--help"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&help.stdout).contains(&format!("created mode {socket_mode:04o}")),
        "the help says the mode"
    );

    let dir = Scratch::new("priv-sock");
    let run = dir.join("run");
    let path = run.join("helper.sock");
    let helper = RealHelper::start(&path, &["--no-ebpf"]);
    let md = std::fs::symlink_metadata(&path).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&md.file_type()));
    assert_eq!(md.mode() & 0o7777, socket_mode);
    assert_eq!((md.uid(), md.gid()), (0, 0), "owned by the helper's uid");
    let dmd = std::fs::metadata(&run).unwrap();
    assert_eq!(dmd.mode() & 0o7777, dir_mode);
    assert_eq!(dmd.uid(), 0);
    let who = as_uid(NOBODY, || helper.client().hello().map(|h| h.caller.uid));
    assert_eq!(who.unwrap(), NOBODY, "nobody may connect, and is nobody");

    // A second helper on a live path.
    let (code, err) = selfheal_as(
        None,
        &[
            os("helper"),
            os("--no-ebpf"),
            os("--socket"),
            path.as_os_str(),
        ],
    );
    assert_ne!(code, 0);
    assert!(err.contains("another helper already listens on"), "{err}");
    let log = helper.stop();
    assert!(!path.exists(), "the socket is removed on exit: {log}");

    let refuse = |sock: &Path, why: &str| {
        let (code, err) = selfheal_as(
            None,
            &[
                os("helper"),
                os("--no-ebpf"),
                os("--socket"),
                sock.as_os_str(),
            ],
        );
        assert_ne!(code, 0, "{err}");
        assert!(err.contains(why), "{why}: {err}");
        assert!(
            !sock.exists()
                || !std::os::unix::fs::FileTypeExt::is_socket(
                    &std::fs::symlink_metadata(sock).unwrap().file_type()
                )
        );
    };
    let theirs = dir.join("theirs");
    nobodys_dir(&theirs);
    refuse(
        &theirs.join("helper.sock"),
        &format!(
            "refusing socket directory {}: owned by uid {NOBODY}",
            theirs.display()
        ),
    );
    // A directory of root's others could write (a Kubernetes emptyDir is
    // 0777): something another user put in it while it was open refuses
    // it, naming the entry; an empty one is closed (0755) and used.
    let open = dir.join("open");
    dir_with_mode(&open, 0o777);
    nobodys_dir(&open.join("planted"));
    refuse(
        &open.join("helper.sock"),
        &format!(
            "it was writable by group or others (mode 0777) and holds \"planted\" of uid {NOBODY}"
        ),
    );
    let emptied = dir.join("emptydir");
    dir_with_mode(&emptied, 0o777);
    let taken = RealHelper::start(&emptied.join("helper.sock"), &["--no-ebpf"]);
    assert_eq!(
        std::fs::metadata(&emptied).unwrap().mode() & 0o7777,
        0o755,
        "the open directory was closed to others"
    );
    let who = as_uid(NOBODY, || taken.client().hello().map(|h| h.caller.uid));
    assert_eq!(who.unwrap(), NOBODY, "the helper serves from it");
    taken.stop();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&run, &link).unwrap();
    refuse(&link.join("helper.sock"), "it is a symlink");
    std::fs::write(run.join("file.sock"), "x").unwrap();
    refuse(&run.join("file.sock"), "exists and is not a socket");
}

// ---------------------------------------------------------------------------
// Restart commands: argv, never a shell.

/// A restart command is run as an argv, never through a shell: shell
/// metacharacters in its arguments reach the program literally and run
/// nothing. The config refuses a restart command given as a string, or as
/// one string with spaces in it, naming the file, line and key. End to end:
/// a wedged agent whose ladder goes straight to restart runs the argv, and
/// the marker files its metacharacters name are never created.
#[test]
fn restart_commands_are_argv_never_a_shell() {
    let _area = tests::area(module_path!());
    let dir = Scratch::new("priv-argv");
    let mark = dir.join("pwned");
    let m = mark.display().to_string();
    let tricks = [
        format!("a; touch {m}"),
        format!("$(touch {m})"),
        format!("`touch {m}`"),
        format!("x && touch {m} || touch {m}"),
        format!("| touch {m}"),
        format!("> {m}"),
        "*".to_string(),
    ];
    let mut argv = vec!["/bin/echo".to_string()];
    argv.extend(tricks.iter().cloned());
    let out = selfheal::actions::restart::restart(&argv, 10 * SEC).expect("run /bin/echo");
    assert!(out.success, "{out:?}");
    assert_eq!(out.stdout.trim_end(), tricks.join(" "), "passed literally");
    assert!(!mark.exists(), "a shell ran: {} exists", mark.display());

    // The config: a string is refused, as is one string with spaces.
    let config = dir.join("config.toml");
    let check_config = |restart: &str| {
        std::fs::write(
            &config,
            format!(
                "[[agent]]\nname = \"a\"\nmatch = {{ pid = 4194000 }}\n[agent.heal]\nrestart = {restart}\n"
            ),
        )
        .unwrap();
        let out = Command::new(tests::selfheal_bin())
            .args(["config", "check", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout),
        )
    };
    let (code, err) = check_config(&format!("\"systemctl restart x; touch {m}\""));
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains(&format!("{}:5", config.display())) && err.contains("restart"),
        "{err}"
    );
    let (code, err) = check_config("[\"systemctl restart x\"]");
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("looks like a shell string"), "{err}");
    let (code, err) = check_config("[\"systemctl\", \"restart\", \"x\"]");
    assert_eq!(code, Some(0), "an argv list is fine: {err}");
    assert!(!mark.exists());
}

/// End to end: `check` heals a wedged agent by its restart command (the
/// only rung its config allows), and the command's metacharacters run
/// nothing.
#[test]
fn check_runs_the_restart_argv_literally() {
    let _area = tests::area(module_path!());
    if !need_root("restart_argv_e2e") {
        return;
    }
    let pair = tests::NetnsPair::new("ra").expect("netns pair");
    let b = pair.b_addr.clone();
    let _server = pair.listening_in_b(&["beat", &format!("{b}:7443"), "300"]);
    let (mut client, _) = pair.client_in_a(7443);
    client.tell("go");
    let dir = Scratch::new("priv-argv-e2e");
    let mark = dir.join("pwned");
    let m = mark.display().to_string();
    let config = dir.join("config.toml");
    // env runs its arguments as a program and its arguments, no shell.
    let argv = serde_json::json!([
        "/usr/bin/env",
        "--",
        "/bin/echo",
        format!("$(touch {m}); touch {m} `touch {m}`"),
    ]);
    std::fs::write(
        &config,
        format!(
            "{}[agent.heal]\nsockets = false\nsignal = false\nrestart = {argv}\n",
            control_runner("client", &b)
        ),
    )
    .unwrap();
    let check = || run_check_at(&config, &Places::without_helper(&dir), &[]);
    std::thread::sleep(SEC);
    assert_eq!(check().agent("runner")["verdict"], "idle");
    pair.drop_port_into_b(7443).expect("nft");
    let healed = tests::wait_for(15 * SEC, Duration::from_millis(500), || {
        let r = check();
        (r.agent("runner")["verdict"] == "wedged").then_some(r)
    })
    .expect("wedged within 15 s");
    let o = healed.agent("runner");
    let actions = o["heal"]["actions"].as_array().cloned().unwrap_or_default();
    assert_eq!(actions.len(), 1, "{o:#}");
    assert_eq!(actions[0]["step"]["action"], "restart", "{o:#}");
    assert_eq!(actions[0]["ok"], true, "{o:#}");
    let detail: serde_json::Value =
        serde_json::from_str(actions[0]["detail"].as_str().unwrap()).unwrap();
    assert_eq!(
        detail["stdout"].as_str().unwrap().trim_end(),
        format!("$(touch {m}); touch {m} `touch {m}`"),
        "{detail:#}"
    );
    assert!(!mark.exists(), "a shell ran the restart command");
    drop(client);
}

/// Sets `fs.protected_symlinks` for a test and puts it back on drop.
struct Sysctl {
    key: &'static str,
    old: String,
}

impl Sysctl {
    fn set(key: &'static str, value: &str) -> Option<Sysctl> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        let old = std::fs::read_to_string(&path).ok()?.trim().to_string();
        if old != value {
            std::fs::write(&path, value).ok()?;
        }
        println!("{key}: {old} -> {value}");
        Some(Sysctl { key, old })
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let path = format!("/proc/sys/{}", self.key.replace('.', "/"));
        let _ = std::fs::write(&path, &self.old);
    }
}

/// `--metrics-file` through a symlinked directory that another
/// user owns (or planted in a sticky directory) into a directory of root's:
/// refused, and root's files there are neither overwritten nor deleted.
#[test]
fn a_metrics_file_through_another_users_symlink_is_refused() {
    let _area = tests::area(module_path!());
    if !need_root("metrics_symlink") {
        return;
    }
    let dir = Scratch::new("priv-prom-link");
    let config = down_config(&dir);
    let helper = dir.join("no-helper.sock");
    let roots = dir.join("roots");
    dir_with_mode(&roots, 0o700);
    std::fs::write(roots.join("selfheal.prom"), "root's prom\n").unwrap();
    std::fs::write(roots.join("selfheal.tmp"), "root's tmp\n").unwrap();
    std::fs::write(roots.join("selfheal.prom.tmp"), "root's tmp\n").unwrap();
    let nobodys = dir.join("nobodys");
    nobodys_dir(&nobodys);
    let public = dir.join("public");
    dir_with_mode(&public, 0o1777);
    as_uid(NOBODY, || {
        std::os::unix::fs::symlink(&roots, nobodys.join("link")).unwrap();
        std::os::unix::fs::symlink(&roots, public.join("link")).unwrap();
    });
    for via in [nobodys.join("link"), public.join("link")] {
        let prom = via.join("selfheal.prom");
        let r = run_check(
            &config,
            &dir.join("state"),
            &dir.join("snaps"),
            &helper,
            &["--metrics-file", prom.to_str().unwrap()],
        );
        assert_eq!(r.code, 2, "{r:#?}");
        for (f, was) in [
            ("selfheal.prom", "root's prom\n"),
            ("selfheal.tmp", "root's tmp\n"),
            ("selfheal.prom.tmp", "root's tmp\n"),
        ] {
            assert_eq!(
                std::fs::read_to_string(roots.join(f)).ok().as_deref(),
                Some(was),
                "{f} through {}: {}",
                via.display(),
                r.stderr
            );
        }
        assert!(
            r.stderr.contains("metrics file not written")
                && r.stderr.contains("refusing")
                && (r.stderr.contains(&format!("owned by uid {NOBODY}"))
                    || r.stderr.contains("it is a symlink")),
            "said why: {}",
            r.stderr
        );
    }
}

/// A symlink of nobody's in a sticky directory, on the way to
/// the snapshot directory, re-pointed while `watch` runs: root never
/// appends to the attacker's file. (Needs fs.protected_symlinks=0, the
/// setting that lets root follow another user's link in a sticky
/// directory; set for the test and put back.)
#[test]
fn a_re_pointed_symlink_does_not_redirect_watch() {
    let _area = tests::area(module_path!());
    if !need_root("re_pointed_symlink") {
        return;
    }
    let Some(_sysctl) = Sysctl::set("fs.protected_symlinks", "0") else {
        tests::skip("re_pointed_symlink", "cannot set fs.protected_symlinks");
        return;
    };
    let dir = Scratch::new("priv-repoint");
    let config = down_config(&dir);
    let roots = dir.join("roots");
    dir_with_mode(&roots, 0o755);
    let public = dir.join("public");
    dir_with_mode(&public, 0o1777);
    let nobodys = dir.join("nobodys");
    nobodys_dir(&nobodys);
    let planted = nobodys.join("snaps/snapshots.jsonl");
    as_uid(NOBODY, || {
        std::fs::create_dir(nobodys.join("snaps")).unwrap();
        std::fs::write(&planted, "").unwrap();
        std::os::unix::fs::symlink(&roots, public.join("link")).unwrap();
    });
    let snaps = public.join("link/snaps");
    let mut child = Command::new(tests::selfheal_bin())
        .args(["watch", "--interval", "100ms", "--count", "30", "--config"])
        .arg(&config)
        .args(
            Places::under(&dir)
                .snapshots(&snaps)
                .helper(dir.join("no-helper.sock"))
                .args(),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    // Re-point the link at nobody's directory (atomically: a new link
    // renamed over the old; nobody owns it, so the sticky bit allows it).
    as_uid(NOBODY, || {
        std::os::unix::fs::symlink(&nobodys, public.join("link.new")).unwrap();
        std::fs::rename(public.join("link.new"), public.join("link")).unwrap();
    });
    let (_, err) = exit_and_stderr(&mut child, 20 * SEC, Duration::from_millis(50));
    let appended = std::fs::read_to_string(&planted).unwrap();
    println!(
        "bytes root appended to nobody's file: {}; created there: {:?}",
        appended.len(),
        std::fs::read_dir(nobodys.join("snaps"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect::<Vec<_>>()
    );
    assert!(appended.is_empty(), "root appended to nobody's file: {err}");
    assert!(
        !nobodys.join("snaps/snapshots.lock").exists(),
        "nothing created in nobody's directory"
    );
    assert!(err.contains("refusing"), "the refusal is said: {err}");
}

/// Another uid made the user's default state directory first
/// (XDG_STATE_HOME in a shared sticky directory; or no HOME and a shared
/// TMPDIR): the check falls back to a directory of the user's, says what
/// to do, and the snapshot (so healing) still happens.
#[test]
fn a_squatted_state_dir_falls_back_and_says_what_to_do() {
    let _area = tests::area(module_path!());
    use std::os::unix::process::CommandExt as _;
    if !need_root("squatted_state") {
        return;
    }
    const VICTIM: u32 = 65533;
    let dir = Scratch::new("priv-squat");
    let config = down_config(&dir);
    let shared = dir.join("shared");
    dir_with_mode(&shared, 0o1777);
    // The squatter (nobody) makes both default names first.
    as_uid(NOBODY, || {
        std::fs::create_dir(shared.join("selfheal")).unwrap();
        std::fs::create_dir(shared.join(format!("selfheal-{VICTIM}"))).unwrap();
    });
    for (tag, env) in [
        (
            "XDG_STATE_HOME in a shared directory",
            vec![
                ("XDG_STATE_HOME", shared.as_os_str()),
                ("TMPDIR", shared.as_os_str()),
            ],
        ),
        (
            "no HOME, shared TMPDIR",
            vec![("TMPDIR", shared.as_os_str())],
        ),
    ] {
        let mut cmd = Command::new(tests::selfheal_bin());
        cmd.args(["check", "--json", "--config"])
            .arg(&config)
            .arg("--helper")
            .arg(dir.join("no-helper.sock"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .uid(VICTIM)
            .gid(VICTIM);
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{tag}: {stderr}");
        let v: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap_or("null"))
            .unwrap_or(serde_json::Value::Null);
        assert!(
            v["snapshot"].is_string(),
            "{tag}: the snapshot is written somewhere safe: {stdout} {stderr}"
        );
        assert!(
            stderr.contains("instead") && stderr.contains("XDG_STATE_HOME"),
            "{tag}: says where it went and what to do: {stderr}"
        );
    }
    // Whatever fell back under the shared directory is the victim's, 0700.
    for e in std::fs::read_dir(&shared).unwrap() {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        if md.uid() == VICTIM {
            assert_eq!(md.mode() & 0o777, 0o700, "{}", e.path().display());
        }
    }
}

/// A parent that is root's and writable by a system group
/// (Ubuntu's /var/log is 0775 root:syslog) is accepted; one writable by a
/// user's group is refused, saying what to do.
#[test]
fn a_root_parent_writable_by_a_system_group_is_accepted() {
    let _area = tests::area(module_path!());
    if !need_root("system_group_parent") {
        return;
    }
    let dir = Scratch::new("priv-syslog");
    let config = down_config(&dir);
    let log = dir.join("log");
    std::fs::create_dir(&log).unwrap();
    std::os::unix::fs::chown(&log, Some(0), Some(4)).unwrap(); // adm, say
    chmod(&log, 0o775);
    let r = run_check_at(
        &config,
        &Places::without_helper(&dir).snapshots(log.join("selfheal")),
        &[],
    );
    assert!(r.agent("ghost")["snapshot"].is_string(), "{r:#?}");
    std::os::unix::fs::chown(&log, Some(0), Some(1000)).unwrap();
    let r = run_check_at(
        &config,
        &Places::without_helper(&dir).snapshots(log.join("selfheal2")),
        &[],
    );
    assert!(r.agent("ghost")["snapshot"].is_null(), "{r:#?}");
    assert!(r.stderr.contains("run chmod go-w on it"), "{}", r.stderr);
}

/// A custom `--socket` is checked all the way up: a helper asked
/// to serve below a directory of nobody's refuses to start.
#[test]
fn a_helper_socket_below_another_users_directory_is_refused() {
    let _area = tests::area(module_path!());
    if !need_root("socket_ancestors") {
        return;
    }
    let dir = Scratch::new("priv-sockdir");
    let nobodys = dir.join("nobodys");
    nobodys_dir(&nobodys);
    let sub = nobodys.join("sub");
    std::fs::create_dir(&sub).unwrap(); // root's, 0755, inside nobody's
    let path = sub.join("helper.sock");
    let mut child = helper_cmd(&path)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (done, err) = exit_and_stderr(&mut child, 5 * SEC, Duration::from_millis(20));
    assert!(
        done.is_some_and(|s| !s.success()),
        "the helper refused to serve there: {err}"
    );
    assert!(
        err.contains(&nobodys.display().to_string()) && err.contains(&format!("uid {NOBODY}")),
        "{err}"
    );
}

/// A client checks who serves the socket (SO_PEERCRED): a socket
/// that nobody listens on, where the helper's should be, is refused with
/// an error that says what to do.
#[test]
fn a_client_refuses_a_socket_served_by_another_uid() {
    let _area = tests::area(module_path!());
    if !need_root("peer_uid") {
        return;
    }
    let dir = Scratch::new("priv-fake-helper");
    let nobodys = dir.join("nobodys");
    nobodys_dir(&nobodys);
    let path = nobodys.join("helper.sock");
    // The socket's creds are the listener's at listen time: nobody's.
    let listener = as_uid(NOBODY, || std::os::unix::net::UnixListener::bind(&path))
        .unwrap_or_else(|e| panic!("bind as nobody at {}: {e}", path.display()));
    let r = HelperClient::connect_with(&path, patient_client_opts());
    drop(listener);
    match r {
        Ok(_) => panic!("connected to a socket that uid {NOBODY} serves, as if it were the helper"),
        Err(e) => {
            let msg = e.to_string();
            println!("refused: {msg}");
            assert!(
                msg.contains(&format!("served by uid {NOBODY}"))
                    && msg.contains("SELFHEAL_HELPER_UID"),
                "{msg}"
            );
        }
    }
}
