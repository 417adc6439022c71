//! The helper under attack: each test reproduces one attack that
//! worked against the helper before, and checks that it fails now.
//!
//! - a stale `SO_PEERCRED`: a connection handed on by a process of another
//!   pid namespace, whose pid a host process then takes (with
//!   `SO_PEERPIDFD`, and with the fallback that does without it);
//! - slot exhaustion: four uids hold every connection with long `signal`
//!   acts;
//! - a target that `exec`s a setuid-root binary during its grace;
//! - error answers that tell whether another user's pid exists;
//! - one foreign pid that cost a user all its eBPF evidence;
//! - and a load test: eight uids with long acts and floods, while root
//!   asks (root's latency printed beside the flood's numbers);
//! - the helper's authority against the kernel's: a root master's
//!   listener shared with a worker that dropped to `nobody` (not dumpable,
//!   and dumpable), options `nobody` chose put back by `restore_keepalive`,
//!   the worker's fds mapped through wrong inodes, its eBPF evidence, a
//!   target that execs a setuid binary between the check and the act; and
//!   the legitimate cases beside them (an unprivileged check's proof put
//!   back across the helper's idle timeout, a proof nobody puts back, a
//!   process in a user namespace its caller owns).
//!
//! Other users are threads of this test that dropped to a uid with raw
//! `setresuid` (that thread only), or children started as that uid. Needs
//! root; skips otherwise (the eBPF test also needs the object built in).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::{fs::PermissionsExt as _, net::UnixStream, process::CommandExt as _},
    },
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use selfheal::{
    ebpf::TracerOptions,
    helper::server::performer::ActionsPerformer,
    helper::{ClientOptions, DryPerformer, HelperClient, Performer, ServerHandle, ServerOptions},
    sys::pidfd::start_ticks,
};
use selfheal_core::ebpf::strategy::Strategy;
use selfheal_core::protocol::ActRequest;
use selfheal_core::protocol::Action;
use selfheal_core::protocol::ErrorCode;
use selfheal_core::protocol::Response;
use tests::fixtures::{Procs, ask, outcome, serve_helper};
use tests::{
    HangFs, Scratch, as_uid, client_opts, forced_strategy, need_ebpf, need_root, skip, wait_for,
};

const NOBODY: u32 = 65534;
const SEC: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(20);

/// An in-process helper on `dir`'s socket.
fn start(
    dir: &Scratch,
    exec: Arc<dyn Performer>,
    tweak: impl FnOnce(&mut ServerOptions),
) -> ServerHandle {
    serve_helper(dir.join("helper.sock"), exec, tweak)
}

fn signal(pid: u32, grace_ms: u64) -> ActRequest {
    let mut r = ActRequest::new(Action::Signal, pid, start_ticks(pid).expect("running"));
    r.params.insert("grace_ms".into(), grace_ms.into());
    r.agent = Some("attack".into());
    r
}

fn act_line(id: u64, req: &ActRequest) -> String {
    let mut v = serde_json::to_value(req).unwrap();
    let m = v.as_object_mut().unwrap();
    m.insert("v".into(), 1.into());
    m.insert("id".into(), id.into());
    m.insert("op".into(), "act".into());
    v.to_string()
}

// ---------------------------------------------------------------------------
// 1. A stale SO_PEERCRED across pid namespaces.

/// Set when this test binary runs as one of the attack's processes inside
/// a new pid namespace: `holder` (its pid 1) or `connector` (its child).
pub(crate) const NS_ROLE: &str = "SELFHEAL_ATTACK_NS_ROLE";

/// Sends `fd` with `data` over `sock` (`SCM_RIGHTS`).
fn send_fd(sock: &UnixStream, fd: RawFd, data: &[u8]) -> std::io::Result<()> {
    let mut cbuf = [0u64; 8];
    // SAFETY: a msghdr pointing at a live iovec and a control buffer large
    // enough (and aligned) for one fd; the CMSG macros stay inside it.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let space = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as usize;
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd);
        if libc::sendmsg(sock.as_raw_fd(), &msg, 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one fd and its data from `sock`.
fn recv_fd(sock: &UnixStream) -> std::io::Result<(OwnedFd, Vec<u8>)> {
    let mut cbuf = [0u64; 8];
    let mut data = vec![0u8; 64];
    // SAFETY: as in `send_fd`; the fd read out of the control message is
    // one the kernel just installed for us.
    unsafe {
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        data.truncate(n as usize);
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
            return Err(std::io::Error::other("no fd received"));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
        Ok((OwnedFd::from_raw_fd(fd), data))
    }
}

/// Not a test: the processes of the attack below, run inside a new pid
/// namespace (this binary with [`NS_ROLE`] set: `crate::ROLES`).
pub(crate) fn pid_namespace_attack_roles() {
    let Ok(role) = std::env::var(NS_ROLE) else {
        return;
    };
    let path = PathBuf::from(std::env::var("HELPER_SOCKET").unwrap());
    match role.as_str() {
        // Connects, learns the pid the helper sees for it, hands the
        // connection to the holder (its stdin is a socket to it), exits.
        "connector" => {
            let conn = UnixStream::connect(&path).unwrap();
            let hello = ask(&conn, r#"{"v":1,"id":1,"op":"hello"}"#, 5 * SEC).unwrap();
            let pid = hello.result.unwrap()["caller"]["pid"].as_u64().unwrap();
            // SAFETY: fd 0 is the socketpair end the holder gave us.
            let to_holder = unsafe { UnixStream::from_raw_fd(0) };
            send_fd(&to_holder, conn.as_raw_fd(), pid.to_string().as_bytes()).unwrap();
        }
        // Pid 1 of the namespace: starts the connector, receives the
        // connection, reaps the connector (its pid is free from then on),
        // says which pid the helper knew it by, waits for the test to give
        // that pid to a host process, then asks for an act.
        "holder" => {
            let (mine, theirs) = UnixStream::pair().unwrap();
            let mut connector = Command::new(std::env::current_exe().unwrap())
                .env(NS_ROLE, "connector")
                .stdin(Stdio::from(OwnedFd::from(theirs)))
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            let (fd, data) = recv_fd(&mine).unwrap();
            assert!(connector.wait().unwrap().success());
            let stale = String::from_utf8(data).unwrap();
            println!("STALE {stale}");
            std::io::stdout().flush().unwrap();
            let go = PathBuf::from(std::env::var("GO_FILE").unwrap());
            wait_for(60 * SEC, TICK, || go.exists().then_some(())).expect("go");
            let target: u32 = std::env::var("TARGET_PID").unwrap().parse().unwrap();
            let start: u64 = std::env::var("TARGET_START").unwrap().parse().unwrap();
            let conn = UnixStream::from(fd);
            let act = ask(
                &conn,
                &act_line(2, &ActRequest::new(Action::Signal, target, start)),
                5 * SEC,
            );
            let message = act
                .as_ref()
                .and_then(|r| r.error.as_ref())
                .map_or(String::new(), |e| e.message.clone());
            let hello = ask(&conn, r#"{"v":1,"id":3,"op":"hello"}"#, 5 * SEC);
            println!(
                "RESULT act={} hello={} message={message:?}",
                outcome(&act),
                outcome(&hello)
            );
        }
        other => panic!("unknown role {other}"),
    }
}

/// A host process that holds pid `pid` (through `ns_last_pid`), or `None`
/// when another process kept taking it.
fn take_pid(pid: u32) -> Option<Child> {
    for _ in 0..300 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let mut c = Command::new("sleep").arg("60").spawn().ok()?;
        if c.id() == pid {
            return Some(c);
        }
        let _ = c.kill();
        let _ = c.wait();
        if start_ticks(pid).is_some() {
            // Someone else has it: it is not free for us.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    None
}

/// An attack: a root process in another pid namespace
/// connects, hands the connection to another process and exits; a host
/// process then gets its pid. Before, the helper read the new process's
/// pid namespace under the stale `SO_PEERCRED` pid, found the host's, and
/// acted (audited under the innocent pid). Now the connector is pinned by
/// pidfd at accept and checked on every request: refused, the connection
/// closed, and the audit names no pid.
fn stale_peer_credentials(test: &str, peer_pidfd: bool) {
    if !need_root(test) {
        return;
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        skip(test, "unshare is not installed");
        return;
    }
    let dir = Scratch::new(&format!("attack-ns-{peer_pidfd}"));
    let exec = Arc::new(DryPerformer::new());
    let h = start(&dir, exec.clone(), |o| o.peer_pidfd = peer_pidfd);
    let mut procs = Procs::default();
    let target = procs.sh(0, "exec sleep 300");
    let go = dir.join("go");
    let mut ns = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--"])
        .arg(std::env::current_exe().unwrap())
        .env(NS_ROLE, "holder")
        .env("HELPER_SOCKET", dir.join("helper.sock"))
        .env("GO_FILE", &go)
        .env("TARGET_PID", target.to_string())
        .env("TARGET_START", start_ticks(target).unwrap().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(ns.stdout.take().unwrap()).lines();
    let mut next = |prefix: &str| {
        lines
            .by_ref()
            .map_while(Result::ok)
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line"))
    };
    let stale: u32 = next("STALE ")["STALE ".len()..].parse().unwrap();
    // A host process (root's, in the helper's pid namespace) takes the pid.
    let innocent = take_pid(stale);
    let taken = innocent.is_some();
    std::fs::write(&go, "").unwrap();
    let result = next("RESULT ");
    let _ = ns.wait();
    if let Some(mut c) = innocent {
        let _ = c.kill();
        let _ = c.wait();
    }
    eprintln!(
        "{test}: connector's pid {stale} {} by a host process; {result}",
        if taken { "taken" } else { "NOT taken" }
    );
    assert!(taken, "could not give pid {stale} to a host process");
    assert!(
        result.starts_with("RESULT act=forbidden hello=closed"),
        "{result}"
    );
    assert!(result.contains("has exited"), "{result}");
    // Caught by the mechanism under test, not the other one.
    let how = if peer_pidfd {
        "SO_PEERPIDFD"
    } else {
        "pidfd_open"
    };
    assert!(result.contains(&format!("checked by {how}")), "{result}");
    assert!(exec.calls().is_empty(), "acted: {:?}", exec.calls());
    let audit = h.audit();
    assert_eq!(audit.len(), 1, "{audit:#?}");
    assert_eq!(audit[0].caller.pid, 0, "the audit names no process");
    assert_eq!(
        audit[0].error.as_ref().map(|e| e.code),
        Some(ErrorCode::Forbidden)
    );
}

#[test]
fn a_connection_handed_on_by_an_exited_connector_is_refused() {
    let _area = tests::area(module_path!());
    stale_peer_credentials("helper attack: stale SO_PEERCRED (SO_PEERPIDFD)", true);
}

/// The same attack with `SO_PEERPIDFD` turned off
/// (`ServerOptions::peer_pidfd = false`): the fallback for kernels before
/// 6.5, a `pidfd_open` of the connector at accept with its start time.
#[test]
fn a_connection_handed_on_is_refused_without_so_peerpidfd() {
    let _area = tests::area(module_path!());
    stale_peer_credentials("helper attack: stale SO_PEERCRED (fallback)", false);
}

// ---------------------------------------------------------------------------
// 2. Slot exhaustion by long acts.

/// Four uids each send 16 `signal` acts, each on its own connection, on
/// their own processes that ignore SIGTERM, with a 120 s grace, and hold
/// the connections. Before, every act held its connection for the grace:
/// the 64 connections were all taken and root's `hello` was `busy` for two
/// minutes. Now the act answers after SIGTERM (the SIGKILL is the helper's
/// timer's), the uids share at most 48 connections, and root is served.
#[test]
fn long_acts_of_four_uids_leave_root_served() {
    let _area = tests::area(module_path!());
    if !need_root("helper attack: slot exhaustion") {
        return;
    }
    let dir = Scratch::new("attack-slots");
    let h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let path = dir.join("helper.sock");
    let uids: [u32; 4] = [65530, 65531, 65532, 65533];
    let mut procs = Procs::default();
    let targets: Vec<(u32, Vec<u32>)> = uids
        .iter()
        .map(|&uid| (uid, (0..16).map(|_| procs.deaf(uid)).collect()))
        .collect();
    let release = AtomicBool::new(false);
    let (answers, root) = std::thread::scope(|s| {
        let holders: Vec<_> = targets
            .iter()
            .flat_map(|(uid, pids)| pids.iter().map(move |pid| (*uid, *pid)))
            .map(|(uid, pid)| {
                let (path, release) = (&path, &release);
                s.spawn(move || {
                    as_uid(uid, || {
                        let Ok(conn) = UnixStream::connect(path) else {
                            return ("refused".to_string(), Duration::ZERO, false);
                        };
                        let t = Instant::now();
                        let r = ask(&conn, &act_line(1, &signal(pid, 120_000)), 3 * SEC);
                        let took = t.elapsed();
                        let escalating = r
                            .as_ref()
                            .and_then(|r| r.result.as_ref())
                            .is_some_and(|v| v["escalating"] == true);
                        // Hold the connection, as the attack did.
                        wait_for(30 * SEC, TICK, || {
                            release.load(Ordering::SeqCst).then_some(())
                        });
                        (outcome(&r), took, escalating)
                    })
                })
            })
            .collect();
        // Give every act time to reach the helper, then root asks.
        std::thread::sleep(2 * SEC);
        let mut root = Vec::new();
        for _ in 0..10 {
            let t = Instant::now();
            let r = HelperClient::connect_with(&path, client_opts()).and_then(|mut c| c.hello());
            root.push((r.map(|h| h.caller.uid), t.elapsed()));
            std::thread::sleep(Duration::from_millis(50));
        }
        release.store(true, Ordering::SeqCst);
        let answers: Vec<_> = holders.into_iter().map(|t| t.join().unwrap()).collect();
        (answers, root)
    });
    let count = |what: &str| answers.iter().filter(|a| a.0 == what).count();
    let (ok, busy, closed) = (count("ok"), count("busy"), count("closed"));
    let escalating = answers.iter().filter(|a| a.2).count();
    let slowest = answers
        .iter()
        .filter(|a| a.0 == "ok")
        .map(|a| a.1)
        .max()
        .unwrap_or_default();
    let root_worst = root.iter().map(|r| r.1).max().unwrap_or_default();
    eprintln!(
        "slot exhaustion: 64 signal acts (grace 120 s) from 4 uids: {ok} answered ok \
         ({escalating} escalating, slowest {slowest:?}), {busy} busy, {closed} unanswered; \
         root: {} of 10 hellos answered, slowest {root_worst:?}",
        root.iter().filter(|r| r.0.is_ok()).count()
    );
    for (r, _) in &root {
        assert_eq!(r.as_ref().ok(), Some(&0), "root's hello: {r:?}");
    }
    assert!(root_worst < 2 * SEC, "root waited {root_worst:?}");
    assert!(ok > 0 && escalating == ok, "acts answered: {answers:?}");
    assert!(slowest < 2 * SEC, "an act held its connection {slowest:?}");
    assert_eq!(closed, 0, "every act was answered: {answers:?}");
    // The acts sent SIGTERM only: every target still runs (no SIGKILL
    // before its grace).
    for (_, pids) in &targets {
        for pid in pids {
            assert!(start_ticks(*pid).is_some(), "pid {pid} was killed early");
        }
    }
    drop(h);
}

/// A socket action on an fd that is not a socket is refused before the fd
/// is duplicated: `/proc/PID/fd/FD` is read, never the file itself (a
/// FUSE file's `fstat` or `close` could block the helper forever).
#[test]
fn a_socket_action_on_a_file_is_refused_without_touching_it() {
    let _area = tests::area(module_path!());
    if !need_root("helper attack: caller-chosen fd") {
        return;
    }
    let dir = Scratch::new("attack-fd");
    let h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let mut procs = Procs::default();
    let file = dir.join("file");
    std::fs::write(&file, "").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let pid = procs.sh(
        NOBODY,
        &format!("exec 7<{}; exec sleep 300", file.display()),
    );
    wait_for(5 * SEC, TICK, || {
        std::fs::read_link(format!("/proc/{pid}/fd/7")).ok()
    })
    .expect("fd 7 open");
    let path = dir.join("helper.sock");
    let e = as_uid(NOBODY, || {
        let mut c = HelperClient::connect_with(&path, client_opts()).unwrap();
        let mut req = ActRequest::new(Action::DestroySocket, pid, start_ticks(pid).unwrap());
        req.fd = Some(7);
        req.inode = Some(1);
        c.act(&req).unwrap_err()
    });
    assert_eq!(e.code(), Some(ErrorCode::Failed), "{e}");
    assert!(e.to_string().contains("is not a socket: left alone"), "{e}");
    drop(h);
}

// ---------------------------------------------------------------------------
// 3. The policy, checked again before the escalation.

/// A process of `nobody` traps SIGTERM by exec'ing a setuid-root binary:
/// by the end of the grace it is a process of uids [65534, 0, 0]. Before,
/// the SIGKILL asked for by nobody hit it anyway. Now the policy is checked
/// again right before SIGKILL: refused, audited, the process lives.
#[test]
fn a_setuid_exec_during_the_grace_gets_no_sigkill() {
    let _area = tests::area(module_path!());
    if !need_root("helper attack: setuid exec in the grace") {
        return;
    }
    let dir = Scratch::new("attack-setuid");
    let suid = dir.join("suid-sleep");
    std::fs::copy("/usr/bin/sleep", &suid)
        .or_else(|_| std::fs::copy("/bin/sleep", &suid))
        .expect("copy sleep");
    std::os::unix::fs::chown(&suid, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let mut procs = Procs::default();
    // Where nobody may write its readiness file.
    let public = dir.join("public");
    std::fs::create_dir(&public).unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o777)).unwrap();
    let ready = public.join("ready");
    let pid = procs.sh(
        NOBODY,
        &format!(
            "trap 'exec {} 300' TERM; echo > {}; while :; do sleep 0.05; done",
            suid.display(),
            ready.display()
        ),
    );
    // The trap is set once the file is there (a SIGTERM before would just
    // end the shell).
    wait_for(5 * SEC, TICK, || ready.exists().then_some(())).expect("the trap is set");
    let path = dir.join("helper.sock");
    let req = signal(pid, 1500);
    let t = Instant::now();
    let answer = as_uid(NOBODY, || {
        HelperClient::connect_with(&path, client_opts())
            .unwrap()
            .act(&req)
    });
    let answered_after = t.elapsed();
    let uids = || -> Option<String> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
    };
    let setuid = wait_for(5 * SEC, TICK, || {
        uids().filter(|u| u.starts_with(&format!("{NOBODY} 0 0")))
    });
    // The grace, and time for the timer to act.
    std::thread::sleep(3 * SEC);
    // Alive: not a zombie (this test is its parent and has not reaped it).
    let alive = start_ticks(pid) == Some(req.start_ticks)
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        });
    let audit = h.audit();
    eprintln!(
        "setuid in the grace: answered after {answered_after:?}: {answer:?}; uids then {setuid:?}; \
         alive after the grace: {alive}; audit: {audit:?}"
    );
    assert!(setuid.is_some(), "the target exec'd the setuid binary");
    assert!(alive, "SIGKILL hit a process of uids [65534, 0, 0]");
    let answer = answer.expect("the signal act is answered");
    assert_eq!(answer["escalating"], true, "{answer}");
    let escalation = audit
        .iter()
        .find(|a| a.escalation && a.pid == pid)
        .expect("the escalation is audited");
    let e = escalation.error.as_ref().expect("refused");
    assert_eq!(e.code, ErrorCode::Forbidden, "{e:?}");
    assert!(
        e.message.contains("changed since SIGTERM") && e.message.contains("SIGKILL not sent"),
        "{e:?}"
    );
}

// ---------------------------------------------------------------------------
// 4. The existence leak.

/// `nobody` names root's process with its right start time, with a wrong
/// one, and a pid that does not exist. Before, the answers differed
/// (`forbidden` naming the owner, `gone` with the real start time, `gone`
/// "not running"). Now they are one answer, word for word but the pid.
#[test]
fn forbidden_answers_do_not_tell_whether_a_pid_exists() {
    let _area = tests::area(module_path!());
    if !need_root("helper attack: existence leak") {
        return;
    }
    let dir = Scratch::new("attack-exists");
    let exec = Arc::new(DryPerformer::new());
    let _h = start(&dir, exec.clone(), |_| {});
    let mut procs = Procs::default();
    let roots = procs.sh(0, "exec sleep 300");
    let start = start_ticks(roots).unwrap();
    let dead = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    let path = dir.join("helper.sock");
    let cases = [
        ("root's, right start", roots, start),
        ("root's, wrong start", roots, start + 1),
        ("no such pid", dead, start),
    ];
    let answers: Vec<(String, ErrorCode, String)> = as_uid(NOBODY, || {
        let mut c = HelperClient::connect_with(&path, client_opts()).unwrap();
        cases
            .iter()
            .map(|(what, pid, start)| {
                let e = c
                    .act(&ActRequest::new(Action::Signal, *pid, *start))
                    .unwrap_err();
                let (code, m) = match e {
                    selfheal::helper::ClientError::Remote(r) => (r.code, r.message),
                    other => panic!("{what}: {other}"),
                };
                (what.to_string(), code, m.replace(&pid.to_string(), "PID"))
            })
            .collect()
    });
    for a in &answers {
        eprintln!("existence leak: {}: {} {:?}", a.0, a.1, a.2);
    }
    for a in &answers {
        assert_eq!(a.1, ErrorCode::Forbidden, "{a:?}");
        assert_eq!(a.2, answers[0].2, "{a:?} differs from {:?}", answers[0]);
        assert!(!a.2.contains(&start.to_string()), "{a:?}");
    }
    assert!(exec.calls().is_empty());
}

// ---------------------------------------------------------------------------
// 5. One foreign pid no longer costs a user all its evidence.

/// `nobody` watches and reads the evidence of its own process and of a
/// look-alike of root's. Before, both requests were refused whole. Now its
/// own pid is answered and root's is a per-pid gap (`refused`).
#[test]
fn a_foreign_pid_is_a_gap_not_a_refusal() {
    let _area = tests::area(module_path!());
    if !need_ebpf("helper attack: a foreign pid in a query") {
        return;
    }
    let dir = Scratch::new("attack-gap");
    let _h = start(&dir, Arc::new(DryPerformer::new()), |o| {
        o.ebpf = Some(TracerOptions {
            strategies: forced_strategy().map_or(Strategy::ALL.to_vec(), |s| vec![s]),
            ..TracerOptions::default()
        });
    });
    let mut procs = Procs::default();
    let roots = procs.sh(0, "exec sleep 300");
    let mine = procs.sh(NOBODY, "exec sleep 300");
    let path = dir.join("helper.sock");
    let (w, g, tracer) = as_uid(NOBODY, || {
        let mut c = HelperClient::connect_with(&path, client_opts()).unwrap();
        let w = c.watch(&[mine, roots]);
        let g = c.ebpf_snapshot_with_gaps(&[mine, roots]);
        // What `check` uses: the evidence of its own pid, root's a gap.
        let shared = Arc::new(std::sync::Mutex::new(c));
        let mut t = selfheal::check::through_helper::HelperTracer(shared);
        let tracer = selfheal::check::TracerSource::snapshot(&mut t, &[mine, roots]);
        (w, g, tracer)
    });
    eprintln!("foreign pid: watch {w:?}; snapshot {g:?}");
    let w = w.expect("watch answered");
    assert_eq!(
        w.watched.iter().map(|p| p.pid).collect::<Vec<_>>(),
        vec![mine]
    );
    assert_eq!(w.refused, vec![roots]);
    let g = g.expect("snapshot answered");
    assert_eq!(g.refused, vec![roots]);
    assert!(g.snapshot.blocked.iter().all(|b| b.tgid == mine));
    assert!(g.snapshot.sockets.iter().all(|s| s.tgid == mine));
    let (snap, _) = tracer.expect("check's eBPF evidence through the helper");
    assert_eq!(
        snap.refused,
        vec![roots],
        "the refused pid travels to the report"
    );
    // In the report of an agent with both pids: a gap naming root's pid,
    // and the rest of the evidence still eBPF's.
    let mut pids = vec![mine, roots];
    pids.sort_unstable();
    let report = selfheal_core::inspect::build(
        &selfheal::inspect::Collector::from_snapshot(
            Ok((snap, None)),
            selfheal_core::proc::Detail::Minimal,
        )
        .collect(&selfheal::inspect::Target {
            agent: Some("look".into()),
            rule: "pid".into(),
            roots: pids.clone(),
            pids,
            problem: None,
            upstream_of: Box::new(|_| None),
            upstreams: Vec::new(),
            roles: selfheal_core::config::Roles::ByAddress,
            containers: Vec::new(),
            container_gaps: Vec::new(),
            unread_cmdlines: None,
        }),
    );
    let gaps = serde_json::to_value(&report).unwrap()["gaps"].to_string();
    assert!(
        gaps.contains(&format!(
            "the helper refused the eBPF evidence of pid(s) [{roots}]"
        )),
        "{gaps}"
    );
    assert!(!gaps.contains("no eBPF evidence"), "{gaps}");
}

// ---------------------------------------------------------------------------
// 6. Load: eight uids, long acts and floods; root is answered.

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// What one flooding uid sent and got.
#[derive(Debug, Default)]
struct Flood {
    sent: u64,
    ok: u64,
    busy: u64,
    acts_escalating: u64,
}

impl Flood {
    fn add(&mut self, o: Flood) {
        self.sent += o.sent;
        self.ok += o.ok;
        self.busy += o.busy;
        self.acts_escalating += o.acts_escalating;
    }

    fn count(&mut self, r: &Option<Response>) {
        match r {
            Some(r) if r.ok => self.ok += 1,
            Some(r) if r.error.as_ref().is_some_and(|e| e.code == ErrorCode::Busy) => {
                self.busy += 1
            }
            _ => {}
        }
    }
}

/// One uid's share of the load, on threads of that uid: 4 long `signal`
/// acts on connections it then holds, and 300 ms later 2 connections
/// flooding pipelined `hello`s until `end` and 20 connections opened and
/// held.
fn flood_as_uid(path: &std::path::Path, pids: &[u32], end: Instant, stop: &AtomicBool) -> Flood {
    let hold = || wait_for(30 * SEC, TICK, || stop.load(Ordering::SeqCst).then_some(()));
    std::thread::scope(|s| {
        let mut jobs = Vec::new();
        for pid in pids {
            jobs.push(s.spawn(move || {
                let mut f = Flood::default();
                let Ok(c) = UnixStream::connect(path) else {
                    return f;
                };
                f.sent += 1;
                let r = ask(&c, &act_line(1, &signal(*pid, 120_000)), 3 * SEC);
                f.count(&r);
                if r.as_ref()
                    .and_then(|r| r.result.as_ref())
                    .is_some_and(|v| v["escalating"] == true)
                {
                    f.acts_escalating += 1;
                }
                hold();
                f
            }));
        }
        // The long acts first (each is answered after its SIGTERM), then
        // the floods and the held connections.
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..2 {
            jobs.push(s.spawn(move || {
                let mut f = Flood::default();
                let Ok(c) = UnixStream::connect(path) else {
                    return f;
                };
                let _ = c.set_read_timeout(Some(5 * SEC));
                let mut reader = BufReader::new(&c);
                let mut id = 10u64;
                while Instant::now() < end && !stop.load(Ordering::SeqCst) {
                    let mut batch = String::new();
                    for _ in 0..50 {
                        id += 1;
                        batch.push_str(&format!("{{\"v\":1,\"id\":{id},\"op\":\"hello\"}}\n"));
                    }
                    if (&c).write_all(batch.as_bytes()).is_err() {
                        break;
                    }
                    f.sent += 50;
                    for _ in 0..50 {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return f;
                        }
                        f.count(&Response::parse(line.as_bytes()).ok());
                    }
                }
                f
            }));
        }
        for _ in 0..20 {
            jobs.push(s.spawn(move || {
                let mut f = Flood::default();
                let Ok(c) = UnixStream::connect(path) else {
                    return f;
                };
                f.sent += 1;
                f.count(&ask(&c, r#"{"v":1,"id":1,"op":"hello"}"#, 3 * SEC));
                hold();
                f
            }));
        }
        let mut all = Flood::default();
        for j in jobs {
            all.add(j.join().unwrap());
        }
        all
    })
}

/// Eight uids, each with 4 long `signal` acts (120 s grace, on processes
/// that ignore SIGTERM) on connections it holds, 20 more connections held
/// open, and 2 connections flooding pipelined `hello`s for 4 s, all at
/// once; meanwhile root opens a fresh connection every 25 ms and asks
/// `hello`. A measurement, printed: root's latency p50/p99 beside the
/// flood's numbers. Asserted: root is never answered `busy` (nor anything
/// but its hello), and the load was there: all 32 acts escalating, every
/// connection's requests sent, most of the flood refused `busy`.
#[test]
fn eight_uids_flooding_leave_root_answered() {
    let _area = tests::area(module_path!());
    if !need_root("helper load: eight uids") {
        return;
    }
    const FLOOD_FOR: Duration = Duration::from_secs(4);
    let dir = Scratch::new("attack-load");
    let h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let path = dir.join("helper.sock");
    let uids: Vec<u32> = (65520..65528).collect();
    let mut procs = Procs::default();
    let targets: Vec<(u32, Vec<u32>)> = uids
        .iter()
        .map(|&uid| (uid, (0..4).map(|_| procs.deaf(uid)).collect()))
        .collect();
    let stop = AtomicBool::new(false);
    let began = Instant::now();
    let (flood, root) = std::thread::scope(|s| {
        let floods: Vec<_> = targets
            .iter()
            .map(|(uid, pids)| {
                let (path, stop) = (&path, &stop);
                s.spawn(move || as_uid(*uid, || flood_as_uid(path, pids, began + FLOOD_FOR, stop)))
            })
            .collect();
        let mut root: Vec<(Result<u32, String>, Duration)> = Vec::new();
        let end = began + FLOOD_FOR + SEC;
        for _ in 0..1000 {
            if Instant::now() >= end {
                break;
            }
            let t = Instant::now();
            let r = HelperClient::connect_with(&path, client_opts())
                .and_then(|mut c| c.hello())
                .map(|h| h.caller.uid)
                .map_err(|e| e.to_string());
            root.push((r, t.elapsed()));
            std::thread::sleep(Duration::from_millis(25));
        }
        stop.store(true, Ordering::SeqCst);
        let mut flood = Flood::default();
        for f in floods {
            flood.add(f.join().unwrap());
        }
        (flood, root)
    });
    let mut lat: Vec<Duration> = root.iter().map(|r| r.1).collect();
    lat.sort();
    let answered = root.iter().filter(|r| r.0.is_ok()).count();
    eprintln!(
        "load: 8 uids for {FLOOD_FOR:?}: {} requests sent ({} answered ok, {} busy, {} signal acts \
         escalating); root: {answered} of {} hellos answered, p50 {:?}, p99 {:?}, max {:?}",
        flood.sent,
        flood.ok,
        flood.busy,
        flood.acts_escalating,
        root.len(),
        percentile(&lat, 0.50),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or_default(),
    );
    for (r, _) in &root {
        assert_eq!(r.as_ref().ok(), Some(&0), "root's hello: {r:?}");
    }
    assert!(root.len() >= 20, "root kept asking: {}", root.len());
    // The load was there: every act sent and escalating (answered after
    // SIGTERM), every connection's requests sent, and the flood refused.
    let uids = uids.len() as u64;
    assert_eq!(flood.acts_escalating, uids * 4, "{flood:?}");
    assert!(flood.sent >= uids * (4 + 20 + 2 * 50), "{flood:?}");
    assert!(
        flood.busy > flood.ok && flood.ok + flood.busy <= flood.sent,
        "{flood:?}"
    );
    drop(h);
}

/// The other half of the asynchronous `signal`: a process that ignores
/// SIGTERM gets SIGKILL from the helper's timer once the grace runs out,
/// the escalation is audited, and `HelperExecutor` (what `check` acts
/// through) still reports how it ended: it watches the exit itself.
#[test]
fn a_signal_escalates_on_the_helpers_timer_and_the_healer_sees_the_end() {
    let _area = tests::area(module_path!());
    use selfheal::heal::Executor as _;
    if !need_root("helper: escalation on the timer") {
        return;
    }
    let dir = Scratch::new("attack-escalate");
    let h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let mut procs = Procs::default();
    let pid = procs.deaf(NOBODY);
    let step = selfheal_core::protocol::Act::Signal {
        pid,
        start_ticks: start_ticks(pid).unwrap(),
        grace_ms: Some(1000),
    };
    let path = dir.join("helper.sock");
    let t = Instant::now();
    let detail = as_uid(NOBODY, || {
        let c = HelperClient::connect_with(&path, client_opts()).unwrap();
        selfheal::heal::helper::HelperExecutor::new(c).act("deaf", &step)
    });
    let took = t.elapsed();
    eprintln!("escalation: {took:?}: {detail:?}");
    let v: serde_json::Value = serde_json::from_str(&detail.expect("acted").to_string()).unwrap();
    assert_eq!(v["escalating"], true, "{v}");
    assert_eq!(v["exited"], true, "{v}");
    assert!(
        took >= Duration::from_millis(900) && took < 5 * SEC,
        "{took:?}"
    );
    let audit = h.audit();
    let e = audit
        .iter()
        .find(|a| a.escalation && a.pid == pid)
        .expect("the escalation is audited");
    assert!(e.error.is_none(), "{e:?}");
    assert_eq!(e.caller.uid, NOBODY);
}

/// The bounds that keep long acts from piling up: connections beyond what
/// other uids may hold are `busy` while root still gets in (its reserve),
/// and a `signal` beyond the pending escalations a uid may have is `busy`
/// with nothing sent.
#[test]
fn the_root_reserve_and_the_escalation_table_are_bounded() {
    let _area = tests::area(module_path!());
    if !need_root("helper: reserve and escalation bounds") {
        return;
    }
    let dir = Scratch::new("attack-bounds");
    let exec = Arc::new(DryPerformer::new());
    let _h = start(&dir, exec.clone(), |o| {
        o.max_connections = 4;
        o.max_connections_per_uid = 4;
        o.root_reserve = 2;
        o.max_escalations_per_uid = 2;
    });
    let path = dir.join("helper.sock");
    let mut procs = Procs::default();
    let pids: Vec<u32> = (0..3).map(|_| procs.sh(NOBODY, "exec sleep 300")).collect();
    let (held, third, acts) = as_uid(NOBODY, || {
        let held: Vec<UnixStream> = (0..2)
            .map(|_| {
                let c = UnixStream::connect(&path).unwrap();
                assert_eq!(
                    outcome(&ask(&c, r#"{"v":1,"id":1,"op":"hello"}"#, 5 * SEC)),
                    "ok"
                );
                c
            })
            .collect();
        let third = UnixStream::connect(&path).unwrap();
        let third = ask(&third, r#"{"v":1,"id":1,"op":"hello"}"#, 5 * SEC);
        let acts: Vec<Option<Response>> = pids
            .iter()
            .map(|pid| ask(&held[0], &act_line(1, &signal(*pid, 60_000)), 5 * SEC))
            .collect();
        (held, third, acts)
    });
    let third = third.expect("an answer");
    let e = third.error.expect("refused");
    assert_eq!(e.code, ErrorCode::Busy, "{e:?}");
    assert!(e.message.contains("2 are kept for root"), "{e:?}");
    // Root gets in while nobody holds all it may.
    for _ in 0..2 {
        let mut c = HelperClient::connect_with(&path, client_opts()).unwrap();
        assert_eq!(c.hello().unwrap().caller.uid, 0);
    }
    let outcomes: Vec<String> = acts.iter().map(outcome).collect();
    assert_eq!(outcomes, ["ok", "ok", "busy"], "{acts:?}");
    let busy = acts[2].as_ref().unwrap().error.as_ref().unwrap();
    assert!(busy.message.contains("nothing was sent"), "{busy:?}");
    assert_eq!(exec.calls().len(), 2, "the third signal was not sent");
    drop(held);
}

/// The FUSE case itself: the target's fd 7 is a file on a FUSE mount whose
/// server no longer answers. Before, the helper duplicated it and called
/// `fstat` on the duplicate, which waited on the server for good: the act
/// was never answered. Now the fd's `/proc` link is read instead, and the
/// act is refused at once.
#[test]
fn a_socket_action_on_a_hung_fuse_file_is_answered() {
    let _area = tests::area(module_path!());
    if !need_root("helper attack: FUSE fd") {
        return;
    }
    let dir = Scratch::new("attack-fuse");
    let freeze = dir.join("freeze");
    // Declared before the filesystem, so dropped after it, also when the
    // test fails: what waits on the frozen server waits until it dies.
    let mut procs = Procs::default();
    let fs = match HangFs::mount(&dir, &freeze) {
        Ok(fs) => fs,
        Err(why) => {
            skip("helper attack: FUSE fd", &why);
            return;
        }
    };
    let h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let pid = procs.sh(0, &format!("exec 7<{}/f; exec sleep 300", fs.mnt.display()));
    wait_for(5 * SEC, TICK, || {
        std::fs::read_link(format!("/proc/{pid}/fd/7")).ok()
    })
    .expect("fd 7 open");
    std::fs::write(&freeze, "").unwrap();
    let mut req = ActRequest::new(Action::DestroySocket, pid, start_ticks(pid).unwrap());
    req.fd = Some(7);
    req.inode = Some(1);
    let t = Instant::now();
    let opts = ClientOptions {
        act_timeout: 3 * SEC,
        ..client_opts()
    };
    let r = HelperClient::connect_with(dir.join("helper.sock"), opts)
        .unwrap()
        .act(&req);
    let took = t.elapsed();
    eprintln!("FUSE fd: answered after {took:?}: {r:?}");
    // The server goes first: whatever still waits on it (the target's
    // close of fd 7 as it dies) fails then.
    drop(fs);
    drop(procs);
    drop(h);
    let e = r.expect_err("refused");
    assert_eq!(e.code(), Some(ErrorCode::Failed), "{e}");
    assert!(e.to_string().contains("is not a socket: left alone"), "{e}");
    assert!(took < 2 * SEC, "{took:?}");
}

// ---------------------------------------------------------------------------
// 7. The helper's authority is the kernel's.

/// Set when this test binary runs as the root master of the attack below:
/// `dumpable` or `undumpable`, the worker's dumpable flag.
pub(crate) const MASTER_ROLE: &str = "SELFHEAL_ATTACK_MASTER";

/// Not a test (this binary with [`MASTER_ROLE`] set: `crate::ROLES`): the root master of the nginx/postfix model, run
/// as its own process. It listens on 127.0.0.1, forks a worker that shares
/// the listener and drops to `nobody` (not dumpable, or made dumpable
/// again when the role says so), prints `MASTER port fd worker`, then
/// accepts, printing each accepted connection's inherited
/// `TCP_USER_TIMEOUT` and `SO_KEEPALIVE` (`ACCEPTED ut=… ka=…`), or the
/// error (`ACCEPT_ERR …`).
pub(crate) fn master_worker_roles() {
    let Ok(role) = std::env::var(MASTER_ROLE) else {
        return;
    };
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let fd = l.as_raw_fd();
    let dumpable = libc::c_ulong::from(role == "dumpable");
    // SAFETY: the child calls only raw syscalls (async-signal-safe) and
    // never returns.
    let worker = unsafe { libc::fork() };
    if worker == 0 {
        // SAFETY: plain syscalls that change this process's credentials.
        unsafe {
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>());
            libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY);
            libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY);
            // Changing uids cleared both: set them as the role says.
            libc::prctl(libc::PR_SET_DUMPABLE, dumpable, 0, 0, 0);
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            loop {
                libc::pause();
            }
        }
    }
    println!("MASTER {port} {fd} {worker}");
    std::io::stdout().flush().unwrap();
    let mut kept = Vec::new();
    loop {
        match l.accept() {
            Ok((s, _)) => {
                let ut = sockopt_int(s.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT);
                let ka = sockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_KEEPALIVE);
                println!("ACCEPTED ut={ut} ka={ka}");
                kept.push(s);
            }
            Err(e) => {
                println!("ACCEPT_ERR {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        std::io::stdout().flush().unwrap();
    }
}

fn sockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> i32 {
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into a local int of the given size.
    unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    v
}

/// The master of [`master_worker_roles`], its output read line by line;
/// killed (and its worker with it) on drop.
struct Master {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    port: u16,
    fd: i32,
    worker: u32,
}

impl Master {
    fn start(dumpable: bool) -> Master {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(
                MASTER_ROLE,
                if dumpable { "dumpable" } else { "undumpable" },
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut m = Master {
            child,
            lines,
            port: 0,
            fd: 0,
            worker: 0,
        };
        let first = m.next("MASTER ").expect("the master started");
        let f: Vec<&str> = first.split_whitespace().collect();
        (m.port, m.fd, m.worker) = (
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        );
        let worker = m.worker;
        wait_for(5 * SEC, TICK, || {
            let s = std::fs::read_to_string(format!("/proc/{worker}/status")).ok()?;
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65534"))
                .then_some(())
        })
        .expect("the worker dropped to nobody");
        m
    }

    /// The next line starting with `prefix`, within 5 s.
    fn next(&self, prefix: &str) -> Option<String> {
        let end = Instant::now() + 5 * SEC;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let l = self.lines.recv_timeout(left).ok()?;
            if l.starts_with(prefix) {
                return Some(l);
            }
        }
    }

    fn listener_inode(&self) -> u64 {
        let link = std::fs::read_link(format!("/proc/{}/fd/{}", self.worker, self.fd)).unwrap();
        let s = link.to_string_lossy();
        s.trim_start_matches("socket:[")
            .trim_end_matches(']')
            .parse()
            .unwrap()
    }

    /// Connects to the listener; what the master said of the accepted
    /// connection (or of its failure to accept), or why connecting failed.
    fn probe(&self) -> String {
        match std::net::TcpStream::connect(("127.0.0.1", self.port)) {
            Ok(s) => {
                let said = self.next("ACC").unwrap_or_else(|| "no accept".into());
                drop(s);
                said
            }
            Err(e) => format!("connect: {e}"),
        }
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        // SAFETY: a plain kill of the worker this test's master forked.
        unsafe { libc::kill(self.worker as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A socket act on `pid`'s `fd` (judged socket `inode`), with `params`.
fn socket_act(
    action: Action,
    pid: u32,
    fd: i32,
    inode: u64,
    params: serde_json::Value,
) -> ActRequest {
    let mut r = ActRequest::new(action, pid, start_ticks(pid).expect("running"));
    r.fd = Some(fd);
    r.inode = Some(inode);
    r.agent = Some("attack".into());
    if let serde_json::Value::Object(m) = params {
        r.params = m;
    }
    r
}

/// The values an attacker would put on a socket: a 1 ms user timeout, one
/// probe after one second.
fn hostile_options() -> serde_json::Value {
    serde_json::json!({
        "enabled": true, "idle_s": 1, "interval_s": 1, "count": 1, "user_timeout_ms": 1
    })
}

/// What one answer was: `ok`, or its code and message.
fn said(r: &Result<serde_json::Value, selfheal::helper::ClientError>) -> String {
    match r {
        Ok(v) => format!("ok {v}"),
        Err(e) => e.to_string(),
    }
}

/// The worker's listener, attacked by `nobody` through the helper: options
/// it chose put on the listener (inherited by every connection the root
/// master accepts), the listener destroyed, and the refusal for a wrong
/// inode read for the worker's fd→inode map. With `dumpable`, the worker
/// is one `nobody` could `pidfd_getfd` itself: the listener is still no
/// socket the helper acts on for it.
fn master_worker_attack(test: &str, dumpable: bool) {
    if !need_root(test) {
        return;
    }
    let dir = Scratch::new(&format!("attack-auth-master-{dumpable}"));
    let _h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let m = Master::start(dumpable);
    let inode = m.listener_inode();
    let (w, fd) = (m.worker, m.fd);
    // What nobody itself may do: nothing, when the worker is not dumpable.
    let own = as_uid(NOBODY, || {
        let fds = std::fs::read_dir(format!("/proc/{w}/fd")).map(|_| ());
        let getfd = selfheal::sys::pidfd::Pidfd::open(w, None).and_then(|p| {
            p.get_fd(fd)
                .map(|_| ())
                .map_err(|e| selfheal::sys::pidfd::PidfdError::Open { pid: w, source: e })
        });
        format!(
            "read /proc/W/fd: {fds:?}; pidfd_getfd: {}",
            getfd.map_or_else(|e| e.to_string(), |()| "ok".into())
        )
    });
    let path = dir.join("helper.sock");
    let ask = |req: ActRequest| ask_as_nobody(&path, req);
    let restore = ask(socket_act(
        Action::RestoreKeepalive,
        w,
        fd,
        inode,
        hostile_options(),
    ));
    let after_restore = m.probe();
    // A wrong inode on every fd: the answers must not tell them apart.
    let wrong: Vec<(i32, String)> = [0, 1, 2, fd, 99]
        .iter()
        .map(|&k| {
            (
                k,
                said(&ask(socket_act(
                    Action::ArmKeepalive,
                    w,
                    k,
                    1,
                    serde_json::json!({}),
                ))),
            )
        })
        .collect();
    let destroy = ask(socket_act(
        Action::DestroySocket,
        w,
        fd,
        inode,
        serde_json::json!({}),
    ));
    let after = m.probe();
    eprintln!(
        "{test}: nobody itself: {own}\n  restore_keepalive (ut 1 ms) on the listener: {}\n  \
         a connection accepted then: {after_restore}\n  destroy_socket on the listener: {}\n  \
         a connection accepted after: {after}",
        said(&restore),
        said(&destroy)
    );
    for (k, s) in &wrong {
        eprintln!("  wrong inode on fd {k}: {s}");
    }
    if !dumpable {
        assert!(own.contains("EACCES") || own.contains("denied"), "{own}");
    }
    for (what, r) in [
        ("restore_keepalive", &restore),
        ("destroy_socket", &destroy),
    ] {
        let e = r.as_ref().expect_err(what);
        assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{what}: {e}");
    }
    let reason = restore.unwrap_err().to_string();
    if dumpable {
        assert!(reason.contains("listen"), "{reason}");
    } else {
        assert!(reason.contains("not dumpable"), "{reason}");
    }
    // The master's listener is whole, and what it accepts inherits nothing.
    assert_eq!(
        after_restore, "ACCEPTED ut=0 ka=0",
        "the listener's options were changed"
    );
    assert_eq!(after, "ACCEPTED ut=0 ka=0", "the listener was destroyed");
    let inode_text = inode.to_string();
    let first = wrong[0].1.replace(&format!("fd {}", wrong[0].0), "fd N");
    for (k, s) in &wrong {
        assert!(
            !s.contains(&inode_text),
            "fd {k}: the listener's inode: {s}"
        );
        // Nobody may not list the fds of a process it cannot ptrace, so
        // the helper's answers must not tell them apart either (those of a
        // dumpable worker, nobody may read itself).
        if !dumpable {
            assert_eq!(
                s.replace(&format!("fd {k}"), "fd N"),
                first,
                "fd {k} is told apart"
            );
        }
    }
}

#[test]
fn a_non_dumpable_workers_listener_is_out_of_nobodys_reach() {
    let _area = tests::area(module_path!());
    master_worker_attack("helper attack: the non-dumpable worker's listener", false);
}

#[test]
fn a_listener_is_no_socket_the_helper_acts_on_for_a_user() {
    let _area = tests::area(module_path!());
    master_worker_attack("helper attack: a dumpable worker's listener", true);
}

/// A process of `nobody` (dumpable: it exec'd `sleep`) holding fd 3, an
/// established connection to a listener of the test; the test's end of it.
fn nobodys_connection(procs: &mut Procs) -> (u32, i32, u64, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut cmd = Command::new("bash");
    cmd.args([
        "-c",
        &format!("exec 3<>/dev/tcp/127.0.0.1/{port}; exec sleep 300"),
    ]);
    let pid = procs.spawn_as(NOBODY, cmd);
    let (peer, _) = l.accept().unwrap();
    let inode = wait_for(5 * SEC, TICK, || sleep_with_fd3(pid))
        .expect("nobody's sleep holds the connection as fd 3");
    (pid, 3, inode, peer)
}

/// The inode of the socket `pid` holds as fd 3, once it has exec'd `sleep`.
fn sleep_with_fd3(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .filter(|c| c.trim() == "sleep")?;
    let link = std::fs::read_link(format!("/proc/{pid}/fd/3")).ok()?;
    link.to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// `req` asked of the helper on `path` by `nobody`, on a connection of its
/// own.
fn ask_as_nobody(
    path: &std::path::Path,
    req: ActRequest,
) -> Result<serde_json::Value, selfheal::helper::ClientError> {
    as_uid(NOBODY, || {
        HelperClient::connect_with(path, client_opts())
            .unwrap()
            .act(&req)
    })
}

/// A proof's parameters that probe no sooner than in 30 s.
fn patient_proof() -> serde_json::Value {
    serde_json::json!({"idle_s": 30, "interval_s": 30, "count": 3, "hold_ms": 1000})
}

/// The proof target of `pid`'s `fd` (socket `inode`).
fn proof_target(pid: u32, fd: i32, inode: u64) -> selfheal_core::prove::ProofTarget {
    selfheal_core::prove::ProofTarget {
        pid,
        start_ticks: start_ticks(pid).unwrap(),
        fd,
        inode,
    }
}

/// A check's healer on a new connection to the helper on `path`.
fn helper_healer(path: &std::path::Path) -> selfheal::heal::helper::HelperExecutor {
    selfheal::heal::helper::HelperExecutor::new(
        HelperClient::connect_with(path, client_opts()).unwrap(),
    )
}

/// The helper's audit, each act with its error code.
fn acts_of(h: &ServerHandle) -> Vec<(Action, Option<ErrorCode>)> {
    h.audit()
        .into_iter()
        .map(|a| (a.action, a.error.map(|e| e.code)))
        .collect()
}

/// The socket's keepalive options, read by root through a duplicate.
fn options_of(pid: u32, fd: i32) -> selfheal_core::keepalive::KeepaliveSettings {
    let t = selfheal::sys::pidfd::Pidfd::open(pid, None).unwrap();
    selfheal::actions::keepalive::read_keepalive(&t, fd).unwrap()
}

/// `restore_keepalive` on nobody's own established connection: values it
/// chose, before any proof (refused: the helper recorded nothing), and
/// after the helper armed a proof (what is put back is what the helper
/// read before arming, whatever the request says). `expire_keepalive`
/// without a proof the helper armed is refused too. The legitimate acts
/// still work: the proof is armed, the options restored exactly, and the
/// connection destroyed.
#[test]
fn restore_puts_back_only_what_the_helper_recorded() {
    let _area = tests::area(module_path!());
    let test = "helper attack: restore_keepalive with chosen values";
    if !need_root(test) {
        return;
    }
    let dir = Scratch::new("attack-auth-restore");
    let _h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let mut procs = Procs::default();
    let (pid, fd, inode, _peer) = nobodys_connection(&mut procs);
    let own = options_of(pid, fd);
    let path = dir.join("helper.sock");
    let proof = patient_proof();
    let ask = |req: ActRequest| ask_as_nobody(&path, req);
    let early = ask(socket_act(
        Action::RestoreKeepalive,
        pid,
        fd,
        inode,
        hostile_options(),
    ));
    let after_early = options_of(pid, fd);
    let expire = ask(socket_act(
        Action::ExpireKeepalive,
        pid,
        fd,
        inode,
        serde_json::json!({}),
    ));
    let armed = ask(socket_act(Action::ProveKeepalive, pid, fd, inode, proof));
    let restored = ask(socket_act(
        Action::RestoreKeepalive,
        pid,
        fd,
        inode,
        hostile_options(),
    ));
    let again = ask(socket_act(
        Action::RestoreKeepalive,
        pid,
        fd,
        inode,
        hostile_options(),
    ));
    let back = options_of(pid, fd);
    eprintln!(
        "{test}: own options {own:?}\n  restore with chosen values before any proof: {} \
         (options then {after_early:?})\n  expire without a proof: {}\n  prove_keepalive: {}\n  restore with chosen values after \
         the proof: {}\n  restore again: {}\n  options now {back:?}",
        said(&early),
        said(&expire),
        said(&armed),
        said(&restored),
        said(&again)
    );
    let e = early.expect_err("restore before any proof");
    assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
    assert!(e.to_string().contains("armed no proof"), "{e}");
    assert_eq!(after_early, own, "the chosen values were set");
    let e = expire.expect_err("expire without a proof");
    assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
    let armed = armed.expect("nobody proves its own connection");
    assert_eq!(
        armed["previous"],
        serde_json::to_value(&own).unwrap(),
        "{armed}"
    );
    let restored = restored.expect("the proof's restore");
    assert_eq!(
        restored,
        serde_json::to_value(&own).unwrap(),
        "put back: {restored}"
    );
    assert_eq!(back, own, "the socket's own options, exactly");
    let e = again.expect_err("a second restore: the record is spent");
    assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
    // The legitimate rung on its own dumpable agent's connection.
    let destroyed = ask(socket_act(
        Action::DestroySocket,
        pid,
        fd,
        inode,
        serde_json::json!({}),
    ));
    assert!(destroyed.is_ok(), "destroy: {}", said(&destroyed));
}

/// Bad input: the target changes between the helper's check and its act.
/// A process of `nobody` holding an established connection passes the
/// check, then `exec`s a setuid-root binary (the connection, fd 3, goes
/// with it; the pid and start time stay): the act that follows under the
/// same check is refused on the duplicate, right before anything is
/// changed, and the connection lives. Once it exits, a re-check says so.
#[test]
fn a_target_that_execs_setuid_after_the_check_is_not_acted_on() {
    let _area = tests::area(module_path!());
    use selfheal::{actions::ActionError, helper::access::authority::Authority};
    use selfheal_core::protocol::Caller;
    let test = "helper bad input: setuid exec between check and act";
    if !need_root(test) {
        return;
    }
    let dir = Scratch::new("attack-auth-race");
    let suid = dir.join("suid-sleep");
    std::fs::copy("/usr/bin/sleep", &suid)
        .or_else(|_| std::fs::copy("/bin/sleep", &suid))
        .expect("copy sleep");
    std::os::unix::fs::chown(&suid, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let public = dir.join("public");
    std::fs::create_dir(&public).unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o777)).unwrap();
    let ready = public.join("ready");
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut procs = Procs::default();
    let child = Command::new("bash")
        .args([
            "-c",
            &format!(
                "exec 3<>/dev/tcp/127.0.0.1/{port}; trap 'exec {} 300' USR1; echo > {}; \
                 while :; do sleep 0.05; done",
                suid.display(),
                ready.display()
            ),
        ])
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn bash");
    let pid = child.id();
    procs.0.push(child);
    let (peer, _) = l.accept().unwrap();
    wait_for(5 * SEC, TICK, || ready.exists().then_some(())).expect("the trap is set");
    let inode: u64 = std::fs::read_link(format!("/proc/{pid}/fd/3"))
        .unwrap()
        .to_str()
        .and_then(|s| s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .expect("fd 3 is the connection");
    let target = selfheal::sys::pidfd::Pidfd::open(pid, None).unwrap();
    // The caller: nobody, through this (root) process's pid.
    let caller = Caller {
        uid: NOBODY,
        gid: NOBODY,
        pid: std::process::id(),
    };
    let authority =
        Authority::check(&caller, &target, &Default::default()).expect("nobody may act on its own");
    // SAFETY: a plain kill of our child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGUSR1) };
    wait_for(5 * SEC, TICK, || {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
            .then_some(())
    })
    .expect("the target exec'd the setuid binary");
    let exec = ActionsPerformer::default();
    let destroy = socket_act(Action::DestroySocket, pid, 3, inode, serde_json::json!({}));
    let r_destroy = exec.act_checked(&caller, &target, &destroy.act().unwrap(), &authority);
    let r_signal = exec.act_checked(
        &caller,
        &target,
        &signal(pid, 1000).act().unwrap(),
        &authority,
    );
    eprintln!("{test}: destroy: {r_destroy:?}\n  signal: {r_signal:?}");
    for r in [&r_destroy, &r_signal] {
        match r {
            Err(e @ ActionError::Refused { .. }) => {
                assert!(e.to_string().contains("are not all uid 65534's"), "{e}")
            }
            other => panic!("acted on the setuid process: {other:?}"),
        }
    }
    // The connection lives: no RST, no FIN reached the peer.
    peer.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    let read = std::io::Read::read(&mut &peer, &mut buf);
    assert!(
        matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the connection was touched: {read:?}"
    );
    assert!(start_ticks(pid).is_some(), "the process was signalled");
    // A target that exits: refused with that reason.
    drop(procs);
    let e = authority.recheck(&target).unwrap_err().to_string();
    assert!(e.contains("has exited"), "{e}");
}

/// What an unprivileged `check` does through the helper in its prove
/// stage (`HelperExecutor`, as `nobody`): arm a proof keepalive on its own
/// agent's silent connection, let the live peer answer the probes, and put
/// the options back with the values from its state file. The helper puts
/// back what it recorded, which is what the check compares with: equal.
/// Meanwhile the helper (idle timeout 500 ms, as when socket-activated)
/// does not exit: it would lose the record.
#[test]
fn an_unprivileged_checks_proof_goes_back_through_the_helper() {
    let _area = tests::area(module_path!());
    use selfheal::heal::Executor as _;
    use selfheal_core::keepalive::ProofKeepalive;
    let test = "helper: an unprivileged check's proof and restore";
    if !need_root(test) {
        return;
    }
    let dir = Scratch::new("attack-auth-check");
    let h = start(&dir, Arc::new(ActionsPerformer::default()), |o| {
        o.idle_timeout = Some(Duration::from_millis(500));
    });
    let mut procs = Procs::default();
    let (pid, fd, inode, _peer) = nobodys_connection(&mut procs);
    let own = options_of(pid, fd);
    let t = proof_target(pid, fd, inode);
    let ka = ProofKeepalive {
        idle_s: 1,
        interval_s: 1,
        count: 2,
        hold_ms: 1000,
    };
    let path = dir.join("helper.sock");
    let healer = || helper_healer(&path);
    let armed = as_uid(NOBODY, || healer().arm_proof("mine", &t, &ka));
    // The peer (this test's end, alive) answers the probes meanwhile; the
    // helper has no connection for longer than its idle timeout.
    std::thread::sleep(Duration::from_millis(2500));
    let probed = options_of(pid, fd);
    let idle_kept = !h.is_finished();
    let previous = armed
        .as_ref()
        .map(|o| o.previous.clone())
        .unwrap_or(own.clone());
    let back = as_uid(NOBODY, || healer().restore_proof("mine", &t, &previous));
    let exited = wait_for(5 * SEC, TICK, || h.is_finished().then_some(())).is_some();
    eprintln!(
        "{test}: helper still up while the proof was armed: {idle_kept}; exited after the restore: {exited}"
    );
    assert!(idle_kept, "the idle helper exited with a proof armed");
    assert!(exited, "the idle helper stayed up with nothing armed");
    eprintln!("{test}: armed {armed:?}\n  while armed {probed:?}\n  put back {back:?}");
    let armed = armed.expect("armed through the helper");
    assert_eq!(armed.previous, own);
    assert!(probed.enabled, "the proof was on: {probed:?}");
    assert_eq!(back.expect("put back through the helper"), own);
    assert_eq!(options_of(pid, fd), own, "no trace left");
    let acts = acts_of(&h);
    assert_eq!(
        acts,
        [
            (Action::ProveKeepalive, None),
            (Action::RestoreKeepalive, None)
        ]
    );
}

/// A proof nobody puts back: the caller's check never comes back. The
/// helper puts the socket's own options back itself once the proof's time
/// is up (here 1 s instead of 15 minutes), and forgets it: a restore
/// after that is refused, since only what the helper recorded is put back.
#[test]
fn a_proof_nobody_restores_is_put_back_by_the_helper_in_time() {
    let _area = tests::area(module_path!());
    let test = "helper: a proof nobody restores";
    if !need_root(test) {
        return;
    }
    let dir = Scratch::new("attack-auth-expiry");
    let _h = start(
        &dir,
        Arc::new(ActionsPerformer::with_proof_ttl(SEC)),
        |_| {},
    );
    let mut procs = Procs::default();
    let (pid, fd, inode, _peer) = nobodys_connection(&mut procs);
    let own = options_of(pid, fd);
    let path = dir.join("helper.sock");
    let ask = |req: ActRequest| ask_as_nobody(&path, req);
    let proof = patient_proof();
    ask(socket_act(Action::ProveKeepalive, pid, fd, inode, proof)).expect("armed");
    let armed = options_of(pid, fd);
    let back = wait_for(5 * SEC, TICK, || {
        let now = options_of(pid, fd);
        (now == own).then_some(now)
    });
    let late = ask(socket_act(
        Action::RestoreKeepalive,
        pid,
        fd,
        inode,
        hostile_options(),
    ));
    eprintln!(
        "{test}: armed {armed:?}; put back by the helper: {back:?}; a late restore: {}",
        said(&late)
    );
    assert!(armed.enabled, "{armed:?}");
    assert_eq!(
        back,
        Some(own),
        "the helper put the socket's own options back"
    );
    let e = late.expect_err("nothing recorded any more");
    assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
}

/// The legitimate case in a user namespace: `nobody`'s own process in a
/// user namespace `nobody` made (`unshare -r`, a rootless container's
/// root: full capabilities there, uid 65534 on the host). The kernel lets
/// `nobody` `pidfd_getfd` it (it owns the namespace), and so does the
/// helper: its connection is proved and put back, although the process
/// holds capabilities `nobody` lacks (they are the namespace's).
#[test]
fn nobodys_process_in_its_own_user_namespace_is_still_its_own() {
    let _area = tests::area(module_path!());
    let test = "helper: a user namespace the caller owns";
    if !need_root(test) {
        return;
    }
    let dir = Scratch::new("attack-auth-userns");
    let _h = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut procs = Procs::default();
    let child = Command::new("unshare")
        .args([
            "-r",
            "bash",
            "-c",
            &format!("exec 3<>/dev/tcp/127.0.0.1/{port}; exec sleep 300"),
        ])
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn unshare");
    let pid = child.id();
    procs.0.push(child);
    l.set_nonblocking(true).unwrap();
    let peer = wait_for(5 * SEC, TICK, || l.accept().ok());
    let Some(_peer) = peer else {
        skip(
            test,
            "unshare -r did not connect (no unprivileged user namespaces here?)",
        );
        return;
    };
    let inode: u64 = wait_for(5 * SEC, TICK, || sleep_with_fd3(pid))
        .expect("the namespace's sleep holds the connection");
    let caps = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("CapPrm:"))
        .unwrap()
        .to_string();
    let path = dir.join("helper.sock");
    let ask = |req: ActRequest| ask_as_nobody(&path, req);
    let proof = patient_proof();
    let armed = ask(socket_act(Action::ProveKeepalive, pid, 3, inode, proof));
    let back = ask(socket_act(
        Action::RestoreKeepalive,
        pid,
        3,
        inode,
        hostile_options(),
    ));
    eprintln!(
        "{test}: {caps}; prove: {}; restore: {}",
        said(&armed),
        said(&back)
    );
    assert!(armed.is_ok(), "{}", said(&armed));
    assert_eq!(back.expect("restored")["enabled"], false);
}

/// The eBPF evidence of the non-dumpable worker: which of its threads waits
/// on which socket is what `/proc/W/fd` would tell, and `nobody` may not
/// read that itself. Its `watch` and `ebpf_snapshot` name the worker as
/// refused (a gap), and show nothing of it; nobody's own dumpable process
/// beside it is watched.
#[test]
fn a_non_dumpable_workers_evidence_is_out_of_nobodys_reach() {
    let _area = tests::area(module_path!());
    let test = "helper attack: the non-dumpable worker's eBPF evidence";
    if !need_ebpf(test) {
        return;
    }
    let dir = Scratch::new("attack-auth-query");
    let _h = start(&dir, Arc::new(DryPerformer::new()), |o| {
        o.ebpf = Some(TracerOptions {
            strategies: forced_strategy().map_or(Strategy::ALL.to_vec(), |s| vec![s]),
            ..TracerOptions::default()
        });
    });
    let m = Master::start(false);
    let mut procs = Procs::default();
    let mine = procs.sh(NOBODY, "exec sleep 300");
    let w = m.worker;
    let path = dir.join("helper.sock");
    let (watched, snap) = as_uid(NOBODY, || {
        let mut c = HelperClient::connect_with(&path, client_opts()).unwrap();
        (c.watch(&[mine, w]), c.ebpf_snapshot_with_gaps(&[mine, w]))
    });
    eprintln!("{test}: watch {watched:?}\n  snapshot {snap:?}");
    let watched = watched.expect("watch answered");
    assert_eq!(
        watched.watched.iter().map(|p| p.pid).collect::<Vec<_>>(),
        vec![mine]
    );
    assert_eq!(watched.refused, vec![w]);
    let snap = snap.expect("snapshot answered");
    assert_eq!(snap.refused, vec![w]);
    assert!(snap.snapshot.sockets.iter().all(|s| s.tgid != w));
    assert!(snap.snapshot.blocked.iter().all(|b| b.tgid != w));
}

/// The helper is restarted between an unprivileged check's arming and its
/// restore (an upgrade, a crash): the new helper has no record and puts
/// nothing back for the caller; the check's healer then puts the options
/// from its state file back itself, as the kernel lets it on its own agent.
#[test]
fn a_restarted_helpers_unknown_proof_is_put_back_by_the_caller_itself() {
    let _area = tests::area(module_path!());
    use selfheal::heal::Executor as _;
    use selfheal_core::keepalive::ProofKeepalive;
    let test = "helper: a proof armed by a helper since restarted";
    if !need_root(test) {
        return;
    }
    let dir = Scratch::new("attack-auth-restart");
    let mut procs = Procs::default();
    let (pid, fd, inode, _peer) = nobodys_connection(&mut procs);
    let own = options_of(pid, fd);
    let t = proof_target(pid, fd, inode);
    let ka = ProofKeepalive {
        idle_s: 30,
        interval_s: 30,
        count: 3,
        hold_ms: 1000,
    };
    let path = dir.join("helper.sock");
    let healer = || helper_healer(&path);
    let first = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let armed = as_uid(NOBODY, || healer().arm_proof("mine", &t, &ka)).expect("armed");
    drop(first);
    let second = start(&dir, Arc::new(ActionsPerformer::default()), |_| {});
    let back = as_uid(NOBODY, || {
        healer().restore_proof("mine", &t, &armed.previous)
    });
    let audit = acts_of(&second);
    eprintln!("{test}: put back {back:?}; the new helper's audit {audit:?}");
    assert_eq!(back.expect("put back"), own);
    assert_eq!(options_of(pid, fd), own);
    assert_eq!(
        audit,
        [(Action::RestoreKeepalive, Some(ErrorCode::Forbidden))],
        "the new helper put nothing back"
    );
}

// ---------------------------------------------------------------------------
// A read that outlives an exec.

/// What one op answered about the child in one round.
#[derive(Debug, Default)]
struct ExecRace {
    /// Answers holding the shell before its exec.
    before: u32,
    /// Answers holding the setuid program (its name, or its thread asleep
    /// in `clock_nanosleep`, which the shell never calls).
    held: u32,
    refused: u32,
    other: u32,
}

/// The syscall number of `clock_nanosleep`, where the setuid `sleep`
/// waits (x86_64).
const CLOCK_NANOSLEEP: i64 = 230;

/// `nobody` forks a shell that blocks on its stdin and then `exec`s a
/// setuid-root `sleep`, and asks the helper about it while the exec
/// happens (the shell woken 0 to 6 ms after the request is sent, so that
/// some answers come before the exec, some after and some across it).
/// Exec keeps the pid and start time, so a helper that only authorized
/// before its read answers a few rounds in 150 with the setuid program's
/// own state. Every read is authorized again after it, held to what was
/// seen before: no answer holds the setuid program. The race is shown to
/// have run: answers of the shell and refusals both came.
#[test]
fn a_read_across_a_setuid_exec_is_refused() {
    let _area = tests::area(module_path!());
    let test = "helper attack: a read across a setuid exec";
    if !need_root(test) {
        return;
    }
    let iterators = need_ebpf(test);
    let dir = Scratch::new("attack-exec-race");
    let suid = dir.join("suid-sleep");
    std::fs::copy("/usr/bin/sleep", &suid)
        .or_else(|_| std::fs::copy("/bin/sleep", &suid))
        .expect("copy sleep");
    std::os::unix::fs::chown(&suid, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // With its task iterators where they load, so that a light collect
    // and `iterate` walk the process with them.
    let h = start(&dir, Arc::new(DryPerformer::default()), |o| {
        if iterators {
            o.ebpf = Some(TracerOptions {
                strategies: forced_strategy().map_or(Strategy::ALL.to_vec(), |s| vec![s]),
                ..TracerOptions::default()
            });
        }
    });
    let path = dir.join("helper.sock");
    let script = format!("read x; exec {} 300", suid.display());
    let mut ops = vec!["collect (procfs)"];
    if iterators {
        ops.push("collect (iterators)");
        ops.push("iterate");
    }
    const ROUNDS: u64 = 150;
    let cap = Instant::now() + Duration::from_secs(240);
    let mut seen = Vec::new();
    for op in &ops {
        let mut r = ExecRace::default();
        for round in 0..ROUNDS {
            if Instant::now() >= cap {
                break;
            }
            let mut child = Command::new("sh")
                .args(["-c", &script])
                .uid(NOBODY)
                .gid(NOBODY)
                .stdin(Stdio::piped())
                .spawn()
                .expect("spawn sh");
            let pid = child.id();
            // Blocked in its read of stdin.
            let waiting = wait_for(5 * SEC, Duration::from_millis(1), || {
                std::fs::read_to_string(format!("/proc/{pid}/syscall"))
                    .ok()
                    .filter(|s| s.starts_with("0 "))
            });
            assert!(waiting.is_some(), "the shell never read its stdin");
            let mut stdin = child.stdin.take().unwrap();
            let delay = Duration::from_micros((round % 30) * 200);
            let name = |n: &str| n == "suid-sleep";
            let round_start = Instant::now();
            let verdict = as_uid(NOBODY, || {
                let mut c = HelperClient::connect_with(&path, client_opts()).unwrap();
                // The shell is woken `delay` after the request is sent.
                let trigger = std::thread::spawn(move || {
                    let t = Instant::now();
                    while t.elapsed() < delay {
                        std::hint::spin_loop();
                    }
                    stdin.write_all(b"\n").unwrap();
                });
                let v = match *op {
                    "iterate" => {
                        let a = match c.iterate(&[pid]) {
                            Ok(a) => a,
                            Err(e) => panic!("iterate: {e}"),
                        };
                        match a.processes.first() {
                            None if a.refused == vec![pid] => "refused",
                            None => "other",
                            Some(p) => {
                                let sys: Vec<Option<u64>> =
                                    p.pass.threads.iter().map(|t| t.syscall).collect();
                                if sys.contains(&Some(CLOCK_NANOSLEEP as u64)) {
                                    "held"
                                } else if sys.contains(&Some(0)) {
                                    "before"
                                } else {
                                    "other"
                                }
                            }
                        }
                    }
                    _ => {
                        let detail = if *op == "collect (procfs)" {
                            selfheal_core::proc::Detail::Full
                        } else {
                            selfheal_core::proc::Detail::Light
                        };
                        let req = selfheal_core::protocol::CollectRequest {
                            pids: vec![pid],
                            detail,
                            budget_ms: 5000,
                        };
                        let a = c.collect(&req).expect("collect answered");
                        match a.processes.first() {
                            None if a.refused == vec![pid] => "refused",
                            None => "other",
                            Some(p) => {
                                let held = name(&p.process.name)
                                    || p.process.threads.iter().any(|t| {
                                        name(&t.name)
                                            || t.syscall.as_ref().map(|s| s.nr)
                                                == Some(CLOCK_NANOSLEEP)
                                    });
                                if held {
                                    "held"
                                } else if p.process.name == "sh" || p.process.name == "dash" {
                                    "before"
                                } else {
                                    "other"
                                }
                            }
                        }
                    }
                };
                trigger.join().unwrap();
                v
            });
            // Under nobody's request rate (50 a second).
            let pace = Duration::from_millis(25);
            if let Some(rest) = pace.checked_sub(round_start.elapsed()) {
                std::thread::sleep(rest);
            }
            match verdict {
                "held" => r.held += 1,
                "before" => r.before += 1,
                "refused" => r.refused += 1,
                _ => r.other += 1,
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        eprintln!("{test}: {op}: {r:?}");
        seen.push((op, r));
    }
    drop(h);
    for (op, r) in &seen {
        assert_eq!(r.held, 0, "{op}: answers held the setuid program: {r:?}");
        // The race ran: the shell was answered before its exec, and the
        // setuid program refused after it.
        assert!(
            r.before >= 10 && r.refused >= 10,
            "{op}: the race never ran: {r:?}"
        );
    }
}
