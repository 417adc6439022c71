//! The healing actions on real processes and real connections: keepalive
//! armed on a half-open connection (the agent's read fails and it
//! reconnects, same pid, no signal) and on a live but silent one (nothing
//! changes; the options go back), a socket destroyed under a blocked reader
//! (SOCK_DESTROY and the shutdown fallback), SIGTERM/SIGKILL escalation, a
//! pid that no longer names the judged process, restart commands, and the
//! guard. The keepalive rung over a slow link (a TUN relay that delays
//! every packet): a live peer seconds away is kept, a dead one ended at
//! the core's bound.
//!
//! Timings are printed as `TIMING …` lines (`--nocapture` shows them).

use std::{
    io::{BufRead as _, BufReader},
    os::fd::AsRawFd as _,
    os::unix::process::ExitStatusExt as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use selfheal::{
    actions::{self, ActionError, destroy::DestroyMethod, keepalive::Keepalive, signal::Signal},
    sys::{
        pidfd::{Pidfd, start_ticks},
        sockdiag,
    },
};
use selfheal_core::{
    keepalive::{KeepaliveSettings, ProofKeepalive},
    model::TcpState,
    sockdiag::TcpInfo,
};
use tests::{
    NetnsPair, Peer, Ready, SilentPair, Skip, listener, need_root, port_of, silent_pair,
    socket_fd_of as fd_of, wait_for,
};

const SEC: Duration = Duration::from_secs(1);

/// The keepalive the tests arm: small enough to see a dead peer declared
/// within seconds.
fn small_keepalive() -> Keepalive {
    Keepalive {
        idle: SEC,
        interval: SEC,
        count: 2,
        user_timeout: 3 * SEC,
    }
}

/// A process handle as the helper takes it: guarded, pinned to the start
/// time read now.
fn target(pid: u32) -> Pidfd {
    let start = start_ticks(pid).expect("the target runs");
    actions::guard::open_target(pid, start).expect("open target")
}

/// Waits until thread `tid` of `pid` sleeps in a receive syscall (read,
/// recvfrom), so an action is tested against a reader that is really
/// blocked.
fn wait_blocked_in_read(pid: u32, tid: u32) {
    let blocked = wait_for(5 * SEC, Duration::from_millis(10), || {
        let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
        let nr = s.split_whitespace().next()?;
        (nr == libc::SYS_read.to_string() || nr == libc::SYS_recvfrom.to_string()).then_some(())
    });
    assert!(
        blocked.is_some(),
        "thread {tid} of pid {pid} never blocked in a read"
    );
}

/// A [`SilentPair`] whose client is blocked in its read, and the client's
/// socket fd.
fn blocked_pair(tag: &str) -> (SilentPair, i32) {
    let flow = silent_pair(tag);
    let fd = flow.client_fd();
    wait_blocked_in_read(flow.ready.pid, flow.ready.tid);
    (flow, fd)
}

/// A reconnecting client (`recv-peer reconnecting`) of a listener of this
/// process, connected: the client, its connection, and the listener with
/// this end of the connection (open while held: the client reconnects to
/// it).
fn reconnecting_here() -> (Peer, Ready, (std::net::TcpListener, std::net::TcpStream)) {
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let client = Peer::recv_peer(&["reconnecting", &addr]);
    let ready = client.ready();
    let (side, _) = l.accept().unwrap();
    (client, ready, (l, side))
}

/// `a` as an owned argv.
fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Whether `pid` has no signal pending (thread or process wide).
fn no_pending_signals(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    ["SigPnd:", "ShdPnd:"].iter().all(|k| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .is_some_and(|v| v.trim().chars().all(|c| c == '0'))
    })
}

/// The kernel's build configuration says whether SOCK_DESTROY exists
/// (`CONFIG_INET_DIAG_DESTROY`), when it can be read.
fn kernel_has_sock_destroy() -> Option<bool> {
    let out = Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null || cat /boot/config-$(uname -r) 2>/dev/null",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("CONFIG_INET_DIAG_DESTROY=y") {
        Some(true)
    } else if text.contains("# CONFIG_INET_DIAG_DESTROY is not set") {
        Some(false)
    } else {
        None
    }
}

/// The method `destroy_socket` must use on this kernel: `SOCK_DESTROY` where
/// its config has `CONFIG_INET_DIAG_DESTROY`, the shutdown fallback where it
/// says it has not. A config that cannot be read skips `test`'s method part
/// ([`Skip::Kernel`]: a failure under CI, whose kernel has
/// `/proc/config.gz`).
fn kernel_destroy_method(test: &str) -> Option<DestroyMethod> {
    let config = kernel_has_sock_destroy();
    eprintln!("KERNEL CONFIG_INET_DIAG_DESTROY: {config:?}");
    match config {
        Some(true) => Some(DestroyMethod::SockDestroy),
        Some(false) => Some(DestroyMethod::Shutdown),
        None => {
            tests::skip_as(
                Skip::Kernel,
                &format!("{test} (the method part)"),
                "neither /proc/config.gz nor /boot/config-$(uname -r) is readable: \
                 which destroy method this kernel offers is unknown",
            );
            None
        }
    }
}

/// Keepalive options read straight from the kernel through a duplicate
/// (independent of the code under test).
fn raw_keepalive(target: &Pidfd, fd: i32) -> KeepaliveSettings {
    let dup = target.get_fd(fd).expect("pidfd_getfd");
    let get = |level, name| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `v` and `len` are valid for writes.
        let r = unsafe {
            libc::getsockopt(
                dup.as_raw_fd(),
                level,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "getsockopt: {}", std::io::Error::last_os_error());
        v as u32
    };
    KeepaliveSettings {
        enabled: get(libc::SOL_SOCKET, libc::SO_KEEPALIVE) != 0,
        idle_s: get(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
        interval_s: get(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
        count: get(libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
        user_timeout_ms: get(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
    }
}

/// Makes `b` drop every packet of one connection (by the client's port), so
/// that connection goes half-open while new ones still work.
fn drop_connection_into_b(pair: &NetnsPair, client_port: u16) {
    let rules = format!(
        "table inet selfheal_actions_{client_port} {{\n chain input {{ type filter hook input priority 0; tcp sport {client_port} drop; }}\n}}\n"
    );
    let mut child = Command::new("ip")
        .args(["netns", "exec", &pair.b.name, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("run nft");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), rules.as_bytes())
        .expect("write rules");
    assert!(
        child.wait().expect("nft").success(),
        "nft refused the rules"
    );
}

#[test]
fn keepalive_fails_a_half_open_read_and_the_agent_reconnects() {
    let _area = tests::area(module_path!());
    if !need_root("keepalive_fails_a_half_open_read_and_the_agent_reconnects") {
        return;
    }
    let (flow, fd) = blocked_pair("akh");
    let ready = flow.ready.clone();
    drop_connection_into_b(&flow.pair, port_of(&ready.local));

    let target = target(ready.pid);
    let armed_at = Instant::now();
    let out = actions::keepalive::arm_keepalive(&target, fd, None, &small_keepalive())
        .expect("arm keepalive");
    assert_eq!(out.pid, ready.pid);
    assert_eq!(out.inode, ready.inode);
    assert!(!out.previous.enabled, "{out:?}");
    assert_eq!(
        (
            out.applied.idle_s,
            out.applied.interval_s,
            out.applied.count
        ),
        (1, 1, 2)
    );
    assert!(out.applied.user_timeout_ms >= 3000, "{out:?}");
    assert_eq!(raw_keepalive(&target, fd), out.applied);

    // The kernel declares the peer dead and fails the blocked read.
    let line = flow.client.expect("error ", 15 * SEC);
    let failed_after = armed_at.elapsed();
    eprintln!("TIMING half-open read failed {failed_after:?} after arm_keepalive: {line}");
    assert!(
        line.contains(&format!("os={}", libc::ETIMEDOUT)),
        "expected ETIMEDOUT: {line}"
    );
    assert!(failed_after < 10 * SEC, "{failed_after:?}");

    // Its own reconnect logic ran: a new connection, the same process, no
    // signal.
    let again = flow.client.ready();
    eprintln!(
        "TIMING reconnected {:?} after arm_keepalive",
        armed_at.elapsed()
    );
    assert_eq!(again.pid, ready.pid);
    assert_ne!(again.inode, ready.inode);
    assert!(target.is_alive(), "the agent died");
    assert!(no_pending_signals(ready.pid));
    assert!(
        fd_of(ready.pid, ready.inode).is_none(),
        "the old socket is still open"
    );
}

#[test]
fn keepalive_leaves_a_live_silent_peer_alone_and_goes_back() {
    let _area = tests::area(module_path!());
    if !need_root("keepalive_leaves_a_live_silent_peer_alone_and_goes_back") {
        return;
    }
    let (flow, fd) = blocked_pair("akl");
    let ready = flow.ready.clone();
    // Let the connection be silent for a while first.
    std::thread::sleep(Duration::from_millis(1500));

    let target = target(ready.pid);
    let before = raw_keepalive(&target, fd);
    let armed_at = Instant::now();
    let out = actions::keepalive::arm_keepalive(&target, fd, None, &small_keepalive())
        .expect("arm keepalive");
    assert_eq!(out.previous, before);
    let silent = out.silent_ms.expect("tcp_info");
    assert!(silent >= 1000, "{out:?}");
    // Raised to cover the silence so far plus idle + count × interval.
    assert!(
        out.applied.user_timeout_ms >= (silent + 3000).max(3000),
        "{out:?}"
    );

    // Well past the point a dead peer would have been declared: the probes
    // were answered, the connection and the blocked read are untouched.
    std::thread::sleep(5 * SEC);
    let sock = wait_for(3 * SEC, Duration::from_millis(100), || {
        let socks = sockdiag::dump_tcp_in_netns_of(ready.pid).ok()?;
        let s = socks.into_iter().find(|s| s.inode == ready.inode)?;
        let info = s.tcp_info.clone()?;
        (info.probes == 0 && info.last_ack_recv_ms < 2500).then_some(s)
    })
    .expect("the socket, with no unanswered probe and a recent ACK");
    let info = sock.tcp_info.clone().expect("tcp_info");
    eprintln!(
        "TIMING live peer {:?} after arm_keepalive: state {} probes {} last_ack_recv {} ms last_data_recv {} ms timer {:?}",
        armed_at.elapsed(),
        sock.state,
        info.probes,
        info.last_ack_recv_ms,
        info.last_data_recv_ms,
        sock.timer
    );
    assert_eq!(sock.state, selfheal_core::model::TcpState::Established);
    // ACKs keep arriving although no data has for much longer.
    assert!(u64::from(info.last_data_recv_ms) > 5000, "{info:?}");
    assert_eq!(fd_of(ready.pid, ready.inode), Some(fd));
    wait_blocked_in_read(ready.pid, ready.tid);
    assert!(target.is_alive());

    // The options go back as they were.
    let restored =
        actions::keepalive::restore_keepalive(&target, fd, None, &out.previous).expect("restore");
    assert_eq!(restored, out.previous);
    assert_eq!(raw_keepalive(&target, fd), before);
}

/// A blocked reader, destroyed: the read fails at once; the agent
/// reconnects.
fn destroy_and_expect(client: &Peer, ready: &Ready, use_shutdown: bool) -> DestroyMethod {
    let fd = fd_of(ready.pid, ready.inode).expect("the client's socket fd");
    wait_blocked_in_read(ready.pid, ready.tid);
    let target = target(ready.pid);
    let t0 = Instant::now();
    let out = if use_shutdown {
        actions::destroy::shutdown_socket(&target, fd, None)
    } else {
        actions::destroy::destroy_socket(&target, fd, None)
    }
    .expect("destroy");
    let acted = t0.elapsed();
    assert_eq!((out.pid, out.fd, out.inode), (ready.pid, fd, ready.inode));
    assert_eq!(out.local.map(|a| a.to_string()), Some(ready.local.clone()));
    assert_eq!(
        out.remote.map(|a| a.to_string()),
        Some(ready.remote.clone())
    );
    let line = match out.method {
        DestroyMethod::SockDestroy => {
            let line = client.expect("error ", 5 * SEC);
            assert!(
                line.contains(&format!("os={}", libc::ECONNABORTED)),
                "{line}"
            );
            line
        }
        DestroyMethod::Shutdown => client.expect("eof", 5 * SEC),
    };
    let failed_after = t0.elapsed();
    eprintln!(
        "TIMING {:?} (action {acted:?}): blocked read ended {failed_after:?} after: {line} [{}]",
        out.method, out.detail
    );
    assert!(failed_after < SEC, "{failed_after:?}");
    let again = client.ready();
    assert_eq!(again.pid, ready.pid);
    assert_ne!(again.inode, ready.inode);
    assert!(target.is_alive());
    out.method
}

#[test]
fn destroy_socket_fails_a_blocked_read_at_once_in_another_netns() {
    let _area = tests::area(module_path!());
    if !need_root("destroy_socket_fails_a_blocked_read_at_once_in_another_netns") {
        return;
    }
    let flow = silent_pair("ads");
    let ready = flow.ready.clone();
    let method = destroy_and_expect(&flow.client, &ready, false);
    let test = "destroy_socket_fails_a_blocked_read_at_once_in_another_netns";
    if let Some(expected) = kernel_destroy_method(test) {
        assert_eq!(method, expected, "the method this kernel's config offers");
    }
    // The destroyed socket is gone from the namespace's table.
    let socks = sockdiag::dump_tcp_in_netns_of(ready.pid).expect("dump");
    assert!(socks.iter().all(|s| s.inode != ready.inode));
}

#[test]
fn destroy_socket_in_our_own_netns() {
    let _area = tests::area(module_path!());
    if !need_root("destroy_socket_in_our_own_netns") {
        return;
    }
    let (client, ready, _side) = reconnecting_here();
    let method = destroy_and_expect(&client, &ready, false);
    if let Some(expected) = kernel_destroy_method("destroy_socket_in_our_own_netns") {
        assert_eq!(method, expected, "the method this kernel's config offers");
    }
}

#[test]
fn shutdown_fallback_ends_a_blocked_read() {
    let _area = tests::area(module_path!());
    if !need_root("shutdown_fallback_ends_a_blocked_read") {
        return;
    }
    let (client, ready, _side) = reconnecting_here();
    assert_eq!(
        destroy_and_expect(&client, &ready, true),
        DestroyMethod::Shutdown
    );
}

/// Drops `CAP_NET_ADMIN` from the calling thread's effective capabilities
/// (capabilities are per thread: other tests keep theirs).
fn drop_net_admin_in_this_thread() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_NET_ADMIN: u32 = 12;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data structs, as the
    // kernel expects.
    unsafe {
        assert_eq!(
            libc::syscall(
                libc::SYS_capget,
                &mut header as *mut Header,
                data.as_mut_ptr()
            ),
            0
        );
        data[0].effective &= !(1 << CAP_NET_ADMIN);
        assert_eq!(
            libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()),
            0,
            "capset: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[test]
fn destroy_socket_falls_back_to_shutdown_where_sock_destroy_is_refused() {
    let _area = tests::area(module_path!());
    if !need_root("destroy_socket_falls_back_to_shutdown_where_sock_destroy_is_refused") {
        return;
    }
    let (client, ready, _side) = reconnecting_here();
    let fd = fd_of(ready.pid, ready.inode).expect("the client's socket fd");
    wait_blocked_in_read(ready.pid, ready.tid);
    let target = target(ready.pid);
    // Without CAP_NET_ADMIN the kernel refuses SOCK_DESTROY (EPERM), as it
    // refuses it everywhere without CONFIG_INET_DIAG_DESTROY (EOPNOTSUPP).
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            drop_net_admin_in_this_thread();
            actions::destroy::destroy_socket(&target, fd, None)
        })
        .join()
        .expect("thread")
    })
    .expect("destroy");
    eprintln!("FALLBACK {out:?}");
    assert_eq!(out.method, DestroyMethod::Shutdown);
    assert!(out.detail.contains("SOCK_DESTROY failed"), "{}", out.detail);
    assert!(out.detail.contains("not permitted"), "{}", out.detail);
    client.expect("eof", SEC);
    assert_eq!(client.ready().pid, ready.pid);
}

#[test]
fn socket_actions_refuse_what_is_not_a_tcp_socket() {
    let _area = tests::area(module_path!());
    let (_client, ready, _side) = reconnecting_here();
    let target = target(ready.pid);
    // fd 0 is the peer's stdin, a pipe.
    let e = actions::destroy::destroy_socket(&target, 0, None).unwrap_err();
    assert!(matches!(e, ActionError::NotASocket { fd: 0, .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!("fd 0 of pid {} is not a socket", ready.pid)
    );
    let e =
        actions::keepalive::arm_keepalive(&target, 999, None, &Keepalive::default()).unwrap_err();
    assert!(matches!(e, ActionError::NoSuchFd { fd: 999, .. }), "{e}");
    let e =
        actions::keepalive::arm_keepalive(&target, -1, None, &Keepalive::default()).unwrap_err();
    assert!(matches!(e, ActionError::NoSuchFd { .. }), "{e}");
    let e = actions::keepalive::arm_keepalive(&target, 0, None, &Keepalive::default()).unwrap_err();
    assert!(matches!(e, ActionError::NotASocket { .. }), "{e}");
    let bad = Keepalive {
        count: 0,
        ..Keepalive::default()
    };
    let e = actions::keepalive::arm_keepalive(&target, 0, None, &bad).unwrap_err();
    assert!(matches!(e, ActionError::InvalidKeepalive(_)), "{e}");
}

#[test]
fn sigterm_is_enough_for_a_process_that_exits_on_it() {
    let _area = tests::area(module_path!());
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let target = target(child.id());
    let out = actions::signal::signal_escalate(&target, 5 * SEC).expect("signal");
    eprintln!("TIMING exits on SIGTERM: {out:?}");
    assert_eq!(out.sent, vec![Signal::Term]);
    assert!(out.exited);
    assert!(out.exited_after_ms.unwrap() < 1000, "{out:?}");
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
}

#[test]
fn sigkill_follows_after_the_grace_for_a_process_that_ignores_sigterm() {
    let _area = tests::area(module_path!());
    // SIGTERM ignored by the shell is still ignored after `exec`.
    let mut child = Command::new("sh")
        .args(["-c", "trap '' TERM; echo ready; exec sleep 30"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = child.id();
    // Wait (bounded) until the exec happened.
    wait_for(5 * SEC, Duration::from_millis(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .filter(|c| c.trim() == "sleep")
    })
    .expect("exec sleep");
    let target = target(pid);
    let grace = SEC;
    // What the target and this thread ran and waited to run during the
    // call (the target is a zombie until waited for: its schedstat stays).
    let task = format!("/proc/{pid}/task/{pid}");
    let (target0, own0, steal0) = (schedstat(&task), schedstat("/proc/thread-self"), steal());
    let out = actions::signal::signal_escalate(&target, grace).expect("signal");
    let (target1, own1, steal1) = (schedstat(&task), schedstat("/proc/thread-self"), steal());
    let busy = |a: (Duration, Duration), b: (Duration, Duration)| {
        b.0.saturating_sub(a.0) + b.1.saturating_sub(a.1)
    };
    let (target_busy, own_busy) = (busy(target0, target1), busy(own0, own1));
    // Counted in whole ticks: up to one more than the count says.
    let stolen = steal1.0.saturating_sub(steal0.0) + steal1.1;
    eprintln!(
        "TIMING ignores SIGTERM: {out:?}; the target ran or waited to run {target_busy:?}, this thread {own_busy:?}, stolen {stolen:?}"
    );
    assert_eq!(out.sent, vec![Signal::Term, Signal::Kill]);
    assert!(out.exited);
    let after = Duration::from_millis(out.exited_after_ms.unwrap());
    // Not before the grace; after it, only the SIGKILL's delivery and the
    // exit (the target's running and waiting to run), this thread's wake
    // and work, its timed wait's slack, and the time the hypervisor took.
    let bound = grace + target_busy + own_busy + timer_slack() + stolen;
    assert!(
        after >= grace && after <= bound,
        "exited {after:?} after SIGTERM, grace {grace:?}, bound {bound:?}: {out:?}"
    );
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
}

#[test]
fn a_pid_that_no_longer_names_the_judged_process_is_not_signalled() {
    let _area = tests::area(module_path!());
    // Judged, then exited before the action: the pid names nothing (or, if
    // already reused, another process).
    let mut gone = Command::new("sleep").arg("30").spawn().unwrap();
    let (pid, start) = (gone.id(), start_ticks(gone.id()).unwrap());
    gone.kill().unwrap();
    gone.wait().unwrap();
    let e = actions::guard::open_target(pid, start).unwrap_err();
    assert!(
        matches!(e, ActionError::Gone { .. } | ActionError::Reused { .. }),
        "{e}"
    );

    // The pid now names another process than the one judged (another start
    // time): refused, and that process is untouched.
    let mut other = Command::new("sleep").arg("30").spawn().unwrap();
    let start = start_ticks(other.id()).unwrap();
    let e = actions::guard::open_target(other.id(), start + 1).unwrap_err();
    assert!(matches!(e, ActionError::Reused { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!("pid {}", other.id())),
        "{e}"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        other.try_wait().unwrap().is_none(),
        "the other process was hit"
    );

    // A handle taken at decision time, whose process exits before the
    // action: every action says gone, nothing is sent to the pid.
    let h = target(other.id());
    other.kill().unwrap();
    other.wait().unwrap();
    let e = actions::signal::signal_escalate(&h, SEC).unwrap_err();
    assert!(
        matches!(e, ActionError::Gone { .. } | ActionError::Reused { .. }),
        "{e}"
    );
    let e = actions::keepalive::arm_keepalive(&h, 3, None, &Keepalive::default()).unwrap_err();
    assert!(
        matches!(e, ActionError::Gone { .. } | ActionError::Reused { .. }),
        "{e}"
    );
}

#[test]
fn restart_runs_an_argv_with_a_timeout() {
    let _area = tests::area(module_path!());

    let ok = actions::restart::restart(&argv(&["sh", "-c", "echo hello; echo oops >&2"]), 10 * SEC)
        .expect("restart");
    eprintln!("TIMING restart ok: {} ms", ok.duration_ms);
    assert!(ok.success && !ok.timed_out, "{ok:?}");
    assert_eq!(
        (
            ok.exit_code,
            ok.signal,
            ok.stdout.as_str(),
            ok.stderr.as_str()
        ),
        (Some(0), None, "hello\n", "oops\n")
    );

    let failed = actions::restart::restart(
        &argv(&["sh", "-c", "echo out; echo err >&2; exit 3"]),
        10 * SEC,
    )
    .expect("restart");
    assert!(!failed.success && !failed.timed_out, "{failed:?}");
    assert_eq!(failed.exit_code, Some(3));
    assert_eq!(
        (failed.stdout.as_str(), failed.stderr.as_str()),
        ("out\n", "err\n")
    );

    // No shell: the argument arrives verbatim, quotes, spaces and all.
    let literal = "a b; rm -rf / \"q\" 'r' $HOME `x`";
    let verbatim =
        actions::restart::restart(&argv(&["sh", "-c", "echo \"$1\"", "x", literal]), 10 * SEC)
            .expect("restart");
    assert_eq!(verbatim.stdout, format!("{literal}\n"));
    let printf = actions::restart::restart(&argv(&["printf", "%s|", "a b", "c;d"]), 10 * SEC)
        .expect("restart");
    assert_eq!(printf.stdout, "a b|c;d|");

    // A chatty command neither blocks nor floods the outcome.
    let chatty = actions::restart::restart(
        &argv(&["sh", "-c", "yes line | head -c 1000000; echo done >&2"]),
        10 * SEC,
    )
    .expect("restart");
    assert!(chatty.success, "{chatty:?}");
    assert!(chatty.stdout_truncated && !chatty.stderr_truncated);
    assert!(chatty.stdout.len() < actions::restart::OUTPUT_LIMIT + 100);
    assert!(chatty.stdout.starts_with("line\nline\n"));
    assert!(chatty.stdout.contains("bytes left out"));
    assert_eq!(chatty.stderr, "done\n");
}

#[test]
fn a_restart_that_leaves_a_daemon_is_not_killed_and_does_not_hang() {
    let _area = tests::area(module_path!());
    // The command exits at once but leaves a child holding its stdout (a
    // service it started): the outcome comes back within the read grace,
    // with the output so far, and the child is left running.
    let argv = argv(&["sh", "-c", "sleep 30 & echo $!"]);
    let t0 = Instant::now();
    let out = actions::restart::restart(&argv, 10 * SEC).expect("restart");
    eprintln!(
        "TIMING restart leaving a daemon: {:?} {out:?}",
        t0.elapsed()
    );
    assert!(out.success && !out.timed_out, "{out:?}");
    assert!(t0.elapsed() < 2 * SEC);
    assert!(out.stdout_truncated, "{out:?}");
    assert!(out.stdout.contains("still open"), "{out:?}");
    let daemon: i32 = out
        .stdout
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("the daemon's pid");
    let alive =
        std::fs::read_to_string(format!("/proc/{daemon}/comm")).is_ok_and(|c| c.trim() == "sleep");
    // SAFETY: signalling the sleep this test just started.
    unsafe { libc::kill(daemon, libc::SIGKILL) };
    assert!(alive, "the daemon was killed");
}

#[test]
fn a_hanging_restart_is_killed_with_its_children() {
    let _area = tests::area(module_path!());
    let argv = argv(&["sh", "-c", "sleep 60 & echo $!; wait"]);
    let t0 = Instant::now();
    let out = actions::restart::restart(&argv, SEC).expect("restart");
    eprintln!("TIMING hanging restart: {:?} {out:?}", t0.elapsed());
    assert!(out.timed_out && !out.success, "{out:?}");
    assert_eq!(out.signal, Some(libc::SIGKILL));
    assert!((1000..3000).contains(&out.duration_ms), "{out:?}");
    // The background child, in the same process group, died too.
    let grandchild: u32 = out.stdout.trim().parse().expect("the child's pid");
    let dead = wait_for(
        5 * SEC,
        Duration::from_millis(20),
        || match std::fs::read_to_string(format!("/proc/{grandchild}/stat")) {
            Err(_) => Some(()),
            Ok(s) => s
                .rsplit(") ")
                .next()
                .is_some_and(|r| r.starts_with('Z'))
                .then_some(()),
        },
    );
    assert!(dead.is_some(), "pid {grandchild} survived the timeout");
}

#[test]
fn the_guard_refuses_init_ourselves_and_kernel_threads() {
    let _area = tests::area(module_path!());
    let me = std::process::id();
    for pid in [1, me, std::os::unix::process::parent_id()] {
        let e = actions::guard::guard(pid).unwrap_err();
        assert!(matches!(e, ActionError::Forbidden { .. }), "{pid}: {e}");
        let e = actions::guard::open_target(pid, start_ticks(pid).unwrap_or(0)).unwrap_err();
        assert!(matches!(e, ActionError::Forbidden { .. }), "{pid}: {e}");
    }
    // Every action checks it first, even given a handle: had the signal
    // gone out, this test would be dead.
    let ours = Pidfd::open(me, None).unwrap();
    let e = actions::signal::signal_escalate(&ours, SEC).unwrap_err();
    assert!(matches!(e, ActionError::Forbidden { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!("refusing to act on pid {me}: it is this process")
    );
    let init = Pidfd::open(1, None).unwrap();
    assert!(matches!(
        actions::signal::signal_escalate(&init, SEC),
        Err(ActionError::Forbidden { pid: 1, .. })
    ));
    assert!(matches!(
        actions::destroy::destroy_socket(&init, 0, None),
        Err(ActionError::Forbidden { pid: 1, .. })
    ));

    // A kernel thread: PF_KTHREAD, no cmdline (kthreadd is pid 2).
    let kthread = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let flags = stat
                .rsplit(") ")
                .next()
                .and_then(|r| r.split_whitespace().nth(6))
                .and_then(|f| f.parse::<u32>().ok())
                .unwrap_or(0);
            flags & 0x0020_0000 != 0
                && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.is_empty())
        });
    match kthread {
        Some(pid) => {
            let e = actions::guard::guard(pid).unwrap_err();
            assert!(
                matches!(e, ActionError::Forbidden { ref why, .. } if why.contains("kernel thread")),
                "{e}"
            );
            if let Ok(h) = Pidfd::open(pid, None) {
                assert!(matches!(
                    actions::signal::signal_escalate(&h, SEC),
                    Err(ActionError::Forbidden { .. })
                ));
            }
        }
        None => tests::skip_expected(
            "the_guard_refuses_init_ourselves_and_kernel_threads (kernel thread case)",
            "no kernel thread is visible in this pid namespace",
        ),
    }
}

/// The proof the tests arm: one probe a second, three to prove.
fn small_proof() -> ProofKeepalive {
    ProofKeepalive {
        idle_s: 1,
        interval_s: 1,
        count: 3,
        hold_ms: 120_000,
    }
}

/// The socket's tcp_info as sock_diag reports it.
fn info_of(pid: u32, inode: u64) -> Option<selfheal_core::sockdiag::TcpInfo> {
    let socks = sockdiag::dump_tcp_in_netns_of(pid).ok()?;
    socks.into_iter().find(|s| s.inode == inode)?.tcp_info
}

/// The prove stage on a half-open connection whose reader waits silently
/// (a cut during think time): the proof's probes go unanswered and only
/// then is the connection ended, as a keepalive timeout the agent's read
/// sees as `ETIMEDOUT`; it reconnects, same pid.
#[test]
fn a_proof_keepalive_goes_unanswered_on_a_cut_connection_and_expiring_it_fails_the_read() {
    let _area = tests::area(module_path!());
    if !need_root(
        "a_proof_keepalive_goes_unanswered_on_a_cut_connection_and_expiring_it_fails_the_read",
    ) {
        return;
    }
    let (flow, fd) = blocked_pair("apd");
    let ready = flow.ready.clone();
    drop_connection_into_b(&flow.pair, port_of(&ready.local));
    std::thread::sleep(Duration::from_millis(1200)); // silent past idle

    let target = target(ready.pid);
    let before = raw_keepalive(&target, fd);
    let armed_at = Instant::now();
    let out = actions::keepalive::arm_proof_keepalive(&target, fd, ready.inode, &small_proof())
        .expect("arm the proof");
    assert_eq!(out.previous, before);
    assert_eq!(raw_keepalive(&target, fd), out.applied);
    let silent = u64::from(out.silent_ms.expect("tcp_info"));
    // The kernel holds the connection past the judged probes.
    assert!(
        u64::from(out.applied.user_timeout_ms) >= silent + 1000 + 3000 + 120_000,
        "{out:?}"
    );

    // Probes go out and none is answered; the connection is not ended by
    // the proof itself.
    let probes = wait_for(8 * SEC, Duration::from_millis(100), || {
        info_of(ready.pid, ready.inode).filter(|i| i.probes >= 3)
    })
    .expect("three unanswered probes");
    eprintln!(
        "TIMING proof: {} probes unanswered {:?} after arming",
        probes.probes,
        armed_at.elapsed()
    );
    assert!(fd_of(ready.pid, ready.inode).is_some());
    wait_blocked_in_read(ready.pid, ready.tid);

    let t0 = Instant::now();
    let ended = actions::keepalive::expire_keepalive(&target, fd, ready.inode).expect("expire");
    assert!(ended.ended, "{ended:?}");
    assert!(ended.probes >= 3, "{ended:?}");
    let line = flow.client.expect("error ", 5 * SEC);
    eprintln!(
        "TIMING expired: the read failed {:?} after expire_keepalive: {line}",
        t0.elapsed()
    );
    assert!(
        line.contains(&format!("os={}", libc::ETIMEDOUT)),
        "expected ETIMEDOUT: {line}"
    );
    let again = flow.client.ready();
    assert_eq!(again.pid, ready.pid);
    assert!(target.is_alive());
    assert!(no_pending_signals(ready.pid));
}

/// The prove stage on a live peer that is only silent (thinking): it
/// answers the first probe, expiring is refused (no probe outstanding), and
/// the socket's own options, here the agent's own keepalive, go back
/// exactly.
#[test]
fn a_proof_keepalive_is_answered_by_a_live_peer_and_the_agents_options_go_back() {
    let _area = tests::area(module_path!());
    if !need_root("a_proof_keepalive_is_answered_by_a_live_peer_and_the_agents_options_go_back") {
        return;
    }
    let (flow, fd) = blocked_pair("apl");
    let ready = flow.ready.clone();
    let target = target(ready.pid);
    // The agent's own keepalive, as the anthropic SDK sets it.
    let own = KeepaliveSettings {
        enabled: true,
        idle_s: 60,
        interval_s: 15,
        count: 4,
        user_timeout_ms: 0,
    };
    actions::keepalive::restore_keepalive(&target, fd, Some(ready.inode), &own)
        .expect("set the agent's own");
    std::thread::sleep(Duration::from_millis(1200));

    let armed_at = Instant::now();
    let out = actions::keepalive::arm_proof_keepalive(&target, fd, ready.inode, &small_proof())
        .expect("arm the proof");
    assert_eq!(out.previous, own);
    let answered = wait_for(5 * SEC, Duration::from_millis(50), || {
        info_of(ready.pid, ready.inode)
            .filter(|i| u128::from(i.last_ack_recv_ms) < armed_at.elapsed().as_millis())
    })
    .expect("an ACK after arming");
    eprintln!(
        "TIMING proof answered within {:?} (last ACK {} ms ago, probes out {})",
        armed_at.elapsed(),
        answered.last_ack_recv_ms,
        answered.probes
    );
    // A peer that answered is not ended, even if asked.
    std::thread::sleep(Duration::from_millis(300));
    match actions::keepalive::expire_keepalive(&target, fd, ready.inode) {
        Err(ActionError::NotApplicable { .. }) => {}
        other => panic!("expire on a live peer: {other:?}"),
    }
    let back = actions::keepalive::restore_keepalive(&target, fd, Some(ready.inode), &out.previous)
        .expect("put back");
    assert_eq!(back, own);
    assert_eq!(raw_keepalive(&target, fd), own);
    wait_blocked_in_read(ready.pid, ready.tid);
}

/// Bad input for the prove stage's actions: an fd that now holds another
/// socket, or no socket at all, and settings out of the kernel's range: a
/// clear error each, and the socket untouched.
#[test]
fn proof_actions_refuse_a_replaced_fd_and_bad_settings() {
    let _area = tests::area(module_path!());
    if !need_root("proof_actions_refuse_a_replaced_fd_and_bad_settings") {
        return;
    }
    let flow = silent_pair("apr");
    let ready = flow.ready.clone();
    let fd = flow.client_fd();
    let target = target(ready.pid);
    let before = raw_keepalive(&target, fd);
    let other = ready.inode + 1;
    for e in [
        actions::keepalive::arm_proof_keepalive(&target, fd, other, &small_proof()).map(|_| ()),
        actions::keepalive::expire_keepalive(&target, fd, other).map(|_| ()),
        actions::keepalive::restore_keepalive(&target, fd, Some(other), &before).map(|_| ()),
        actions::destroy::destroy_socket(&target, fd, Some(other)).map(|_| ()),
    ] {
        match e {
            Err(ActionError::Replaced {
                expected, found, ..
            }) => assert_eq!((expected, found), (other, ready.inode)),
            other => panic!("expected Replaced: {other:?}"),
        }
    }
    let bad = ProofKeepalive {
        count: 0,
        ..small_proof()
    };
    assert!(matches!(
        actions::keepalive::arm_proof_keepalive(&target, fd, ready.inode, &bad),
        Err(ActionError::InvalidKeepalive(_))
    ));
    assert!(matches!(
        actions::keepalive::arm_proof_keepalive(&target, 999, ready.inode, &small_proof()),
        Err(ActionError::NoSuchFd { .. })
    ));
    // Nothing was changed by any of them.
    assert_eq!(raw_keepalive(&target, fd), before);
    assert_eq!(fd_of(ready.pid, ready.inode), Some(fd));
}

/// A link with a round trip of `rtt` between two namespaces this test
/// makes: a TUN device in each (`a` at 10.251.N.1, `b` at 10.251.N.2, a
/// point-to-point route to each other), joined by a relay in this process
/// that reads each IP packet from one device and writes it to the other
/// `rtt / 2` later (this kernel has no netem). Dropping it stops the relay
/// (its threads joined, the devices closed), then deletes the namespaces.
struct SlowLink {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    relay: Vec<std::thread::JoinHandle<()>>,
    /// Packets relayed a to b and b to a, and what went wrong in the relay
    /// itself (its first 10 failures).
    relayed: [std::sync::Arc<std::sync::atomic::AtomicU64>; 2],
    failures: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    a: tests::Netns,
    b: tests::Netns,
    b_addr: String,
}

/// How long a relay thread runs at most, whatever the test does.
const RELAY_LIFETIME: Duration = Duration::from_secs(120);

impl SlowLink {
    fn new(tag: &str, rtt: Duration) -> SlowLink {
        let a = tests::Netns::new(&format!("{tag}a")).expect("namespace a");
        let b = tests::Netns::new(&format!("{tag}b")).expect("namespace b");
        let n = tests::subnet_251();
        let (a_ip, b_ip) = (format!("10.251.{n}.1"), format!("10.251.{n}.2"));
        let mut devices = Vec::new();
        for (ns, dev, addr, peer) in [
            (&a, format!("{tag}ta"), &a_ip, &b_ip),
            (&b, format!("{tag}tb"), &b_ip, &a_ip),
        ] {
            let name = dev.clone();
            let fd = ns
                .enter(move || open_tun(&name))
                .expect("enter the namespace")
                .unwrap_or_else(|e| panic!("TUN device {dev}: {e}"));
            ip(&[
                "-n", &ns.name, "addr", "add", addr, "peer", peer, "dev", &dev,
            ]);
            ip(&["-n", &ns.name, "link", "set", &dev, "up"]);
            devices.push(std::sync::Arc::new(fd));
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let one_way = rtt / 2;
        let relayed = [Default::default(), Default::default()];
        let failures = std::sync::Arc::default();
        let mut threads = relay(
            [&devices[0], &devices[1]],
            one_way,
            &stop,
            &relayed[0],
            &failures,
        );
        threads.extend(relay(
            [&devices[1], &devices[0]],
            one_way,
            &stop,
            &relayed[1],
            &failures,
        ));
        SlowLink {
            stop,
            relay: threads,
            relayed,
            failures,
            a,
            b,
            b_addr: b_ip,
        }
    }
}

impl SlowLink {
    /// What the relay did: packets each way and its failures, if any.
    fn report(&self) -> String {
        let n = |i: usize| self.relayed[i].load(std::sync::atomic::Ordering::Relaxed);
        let failures = self.failures.lock().map(|f| f.clone()).unwrap_or_default();
        format!(
            "relayed {} packets a to b, {} b to a; relay failures: {failures:?}",
            n(0),
            n(1)
        )
    }

    /// Asserts that the relay itself never failed.
    fn assert_relayed(&self, tag: &str) {
        let failed = self.failures.lock().map_or(true, |f| !f.is_empty());
        assert!(!failed, "{tag}: the relay failed: {}", self.report());
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.relay.drain(..) {
            let _ = t.join();
        }
    }
}

/// Runs `ip ARGS…`, which must succeed.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// A TUN device `name` (raw IP packets, no packet information header) in
/// the calling thread's network namespace, held open by the returned fd.
fn open_tun(name: &str) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: open with a NUL-terminated path; the fd is owned below.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // struct ifreq: the name (16 bytes), then the flags (a short).
    let mut req = [0u8; 40];
    req[..name.len()].copy_from_slice(name.as_bytes());
    let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as i16;
    req[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes a struct ifreq, 40 bytes here.
    if unsafe { libc::ioctl(fd, libc::TUNSETIFF, req.as_mut_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(owned)
}

/// The relay one way: a thread reads packets from `from` (polling every
/// 20 ms for `stop`), a second writes each to `to` `delay` after it was
/// read, in order, counting them in `relayed`; what fails is kept in
/// `failures` (the first 10; a failed read ends the relay). Both end on
/// `stop` or after [`RELAY_LIFETIME`].
fn relay(
    [from, to]: [&std::sync::Arc<std::os::fd::OwnedFd>; 2],
    delay: Duration,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    relayed: &std::sync::Arc<std::sync::atomic::AtomicU64>,
    failures: &std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) -> Vec<std::thread::JoinHandle<()>> {
    use std::sync::atomic::Ordering::Relaxed;
    let failed = |failures: &std::sync::Mutex<Vec<String>>, what: String| {
        if let Ok(mut f) = failures.lock()
            && f.len() < 10
        {
            f.push(what);
        }
    };
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let end = Instant::now() + RELAY_LIFETIME;
    let (from, stop_r, failures_r) = (from.clone(), stop.clone(), failures.clone());
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        while !stop_r.load(Relaxed) && Instant::now() < end {
            let mut p = libc::pollfd {
                fd: from.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, valid for the call.
            if unsafe { libc::poll(&mut p, 1, 20) } <= 0 {
                continue;
            }
            // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
            let n = unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    failed(&failures_r, format!("read fd {}: {e}", from.as_raw_fd()));
                    return;
                }
                continue;
            }
            if tx
                .send((Instant::now() + delay, buf[..n as usize].to_vec()))
                .is_err()
            {
                return;
            }
        }
    });
    let (to, stop_w, relayed, failures_w) =
        (to.clone(), stop.clone(), relayed.clone(), failures.clone());
    let writer = std::thread::spawn(move || {
        while !stop_w.load(Relaxed) && Instant::now() < end {
            let Ok((due, packet)) = rx.recv_timeout(Duration::from_millis(20)) else {
                continue;
            };
            while !stop_w.load(Relaxed) && Instant::now() < due {
                std::thread::sleep((due - Instant::now()).min(Duration::from_millis(20)));
            }
            // SAFETY: `packet` is valid for its length of reads.
            let n = unsafe { libc::write(to.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
            if n == packet.len() as isize {
                relayed.fetch_add(1, Relaxed);
            } else {
                let e = std::io::Error::last_os_error();
                failed(
                    &failures_w,
                    format!("write fd {}: {n}: {e}", to.as_raw_fd()),
                );
            }
        }
    });
    vec![reader, writer]
}

/// One sock_diag check of a socket, timed from arming: when it began and
/// ended, and the socket's state and `tcp_info` (`None`: it was gone).
struct Seen {
    start: Duration,
    end: Duration,
    sock: Option<(TcpState, TcpInfo)>,
}

/// Checks socket `inode` of `pid` every 20 ms from now until `until` after
/// `armed_at` (at most one check per 20 ms of that), or until it is gone.
fn watch_socket(pid: u32, inode: u64, armed_at: Instant, until: Duration) -> Vec<Seen> {
    let step = Duration::from_millis(20);
    let mut seen = Vec::new();
    for _ in 0..=until.as_millis() / step.as_millis() {
        let start = armed_at.elapsed();
        if start > until {
            break;
        }
        let sock = sockdiag::dump_tcp_in_netns_of(pid)
            .expect("sock_diag dump")
            .into_iter()
            .find(|s| s.inode == inode)
            .map(|s| (s.state, s.tcp_info.expect("tcp_info")));
        let gone = sock.is_none();
        seen.push(Seen {
            start,
            end: armed_at.elapsed(),
            sock,
        });
        if gone {
            break;
        }
        std::thread::sleep(step);
    }
    seen
}

/// The longest time from one check's start to the next's: a check's own
/// time, its pause included.
fn check_period(seen: &[Seen]) -> Duration {
    seen.windows(2)
        .map(|w| w[1].start - w[0].start)
        .max()
        .unwrap_or_default()
}

/// How long task `task` (`/proc/PID/task/TID`, `/proc/thread-self`) has
/// run on a CPU and waited on a run queue, in total (`schedstat`'s first
/// two fields): their deltas over a stretch are how much of it the task
/// spent running and how late the scheduler let it run.
fn schedstat(task: &str) -> (Duration, Duration) {
    let s = std::fs::read_to_string(format!("{task}/schedstat"))
        .unwrap_or_else(|e| panic!("{task}/schedstat: {e}"));
    let field = |i: usize| {
        s.split_whitespace()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .map(Duration::from_nanos)
            .unwrap_or_else(|| panic!("{task}/schedstat: {s:?}"))
    };
    (field(0), field(1))
}

/// How long task `task` has waited on a run queue, in total.
fn run_delay(task: &str) -> Duration {
    schedstat(task).1
}

/// The time the hypervisor took from all CPUs so far (`/proc/stat`'s
/// steal; a running task's `schedstat` leaves it out), and the clock tick
/// it is counted in.
fn steal() -> (Duration, Duration) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let ticks: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .and_then(|l| l.split_whitespace().nth(7)?.parse().ok())
        .expect("steal in /proc/stat");
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("clock ticks");
    let tick = Duration::from_nanos(1_000_000_000 / hz);
    (tick * u32::try_from(ticks).unwrap_or(u32::MAX), tick)
}

/// This thread's timer slack: how late the kernel may end its timed
/// waits (`PR_GET_TIMERSLACK`).
fn timer_slack() -> Duration {
    // SAFETY: PR_GET_TIMERSLACK takes no pointer and returns the slack.
    let ns = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// A silent connection over a [`SlowLink`], the rung armed on it: the
/// client (`recv-peer reconnecting`, blocked in its read) and its
/// connection, when it was armed and how long arming took, what was set,
/// and the bound. Dropped in field order: the peers, then the link.
struct Armed {
    client: Peer,
    _server: Peer,
    ready: Ready,
    fd: i32,
    target: Pidfd,
    armed_at: Instant,
    out: actions::keepalive::KeepaliveOutcome,
    /// When the core's model says the kernel ends the connection if
    /// nothing answers, counted from arming.
    bound: Duration,
    link: SlowLink,
}

/// The core's model of the kernel's deadline under `ka` (the
/// `TCP_USER_TIMEOUT` of [`ProofKeepalive::settings`] with no hold: the
/// silence so far + idle + count × interval), less the silence at arming.
fn model_bound(ka: &Keepalive, silent_ms: u32) -> Duration {
    let secs = |d: Duration| u32::try_from(d.as_secs()).expect("whole seconds");
    let model = ProofKeepalive {
        idle_s: secs(ka.idle),
        interval_s: secs(ka.interval),
        count: ka.count,
        hold_ms: 0,
    };
    let s = model
        .settings(Some(silent_ms))
        .expect("the rung's settings");
    Duration::from_millis(u64::from(s.user_timeout_ms - silent_ms))
}

/// Builds a [`SlowLink`] with round trip `rtt`, a silent server in `b` and
/// a reconnecting client in `a`; if `dead`, `b` then drops every packet of
/// that connection (nftables). Once the client has heard nothing for 3 s
/// (a stream with a 1 s heartbeat the judge calls dead), the rung's
/// keepalive (`Keepalive::default()`) is armed on its socket.
fn arm_on_slow_link(tag: &str, rtt: Duration, dead: bool) -> Armed {
    let link = SlowLink::new(tag, rtt);
    let mut cmd = link.b.command(&tests::helper_bin("recv-peer"));
    cmd.args(["acceptor", &format!("{}:0", link.b_addr)]);
    let server = Peer::spawn(cmd);
    let port = port_of(&server.expect("listening ", 10 * SEC));
    let mut cmd = link.a.command(&tests::helper_bin("recv-peer"));
    cmd.args(["reconnecting", &format!("{}:{port}", link.b_addr)]);
    let client = Peer::spawn(cmd);
    let ready = client.ready();
    server.expect("accepted ", 10 * SEC);
    if dead {
        let client_port = port_of(&ready.local);
        link.b
            .nft(&format!(
                "table inet selfheal_dead_{client_port} {{\n chain input {{ type filter hook input priority 0; tcp sport {client_port} drop; }}\n}}\n"
            ))
            .expect("nft drop");
    }
    wait_blocked_in_read(ready.pid, ready.tid);
    let quiet = wait_for(30 * SEC, Duration::from_millis(50), || {
        info_of(ready.pid, ready.inode)
            .filter(|i| i.last_ack_recv_ms >= 3000 && i.last_data_recv_ms >= 3000)
    });
    assert!(
        quiet.is_some(),
        "{tag}: the connection never went silent for 3 s"
    );
    let fd = fd_of(ready.pid, ready.inode).expect("the client's socket fd");
    let target = target(ready.pid);
    let ka = Keepalive::default();
    let armed_at = Instant::now();
    let out = actions::keepalive::arm_keepalive(&target, fd, Some(ready.inode), &ka)
        .expect("arm keepalive");
    let bound = model_bound(&ka, out.silent_ms.expect("tcp_info at arming"));
    Armed {
        client,
        _server: server,
        ready,
        fd,
        target,
        armed_at,
        out,
        bound,
        link,
    }
}

/// A live peer `rtt` away (below the bound): its kernel's answer to the
/// first probe comes back a round trip later, and the connection is still
/// there, established, the client still blocked in the same read, twice
/// the bound after arming.
fn slow_live_peer_is_kept(tag: &str, rtt: Duration) {
    let a = arm_on_slow_link(tag, rtt, false);
    assert!(
        rtt < a.bound,
        "{rtt:?} is not below the bound {:?}",
        a.bound
    );
    let until = 2 * a.bound;
    let seen = watch_socket(a.ready.pid, a.ready.inode, a.armed_at, until);
    if let Some(gone) = seen.iter().find(|c| c.sock.is_none()) {
        panic!(
            "{tag}: the live peer's connection ({rtt:?} round trip) ended between {:?} and {:?} after arming (bound {:?}); {}",
            seen.iter()
                .rev()
                .find(|c| c.sock.is_some())
                .map(|c| c.start),
            gone.end,
            a.bound,
            a.link.report()
        );
    }
    assert!(a.armed_at.elapsed() >= until, "{tag}: watched too briefly");
    for c in &seen {
        let (state, _) = c.sock.as_ref().expect("present");
        assert_eq!(*state, TcpState::Established, "{tag} at {:?}", c.start);
    }
    // The first check that saw an ACK newer than the arming: the answer
    // came after the one before it began and before this one ended.
    let answered = seen
        .iter()
        .position(|c| {
            c.sock
                .as_ref()
                .is_some_and(|(_, i)| u128::from(i.last_ack_recv_ms) < c.start.as_millis())
        })
        .unwrap_or_else(|| panic!("{tag}: no probe was answered within {until:?}"));
    let after = seen[answered.saturating_sub(1)].start;
    let by = seen[answered].end;
    let (_, last) = seen.last().and_then(|c| c.sock.clone()).expect("present");
    eprintln!(
        "TIMING live peer {rtt:?} away: first probe answered between {after:?} and {by:?} after arming, \
         kept {:?} (bound {:?}, {} checks, srtt {} us, last ACK {} ms ago, last data {} ms ago)",
        a.armed_at.elapsed(),
        a.bound,
        seen.len(),
        last.rtt_us,
        last.last_ack_recv_ms,
        last.last_data_recv_ms
    );
    assert!(
        by >= rtt,
        "{tag}: answered within {by:?}, faster than the link's {rtt:?}"
    );
    assert!(after < a.bound, "{tag}: answered only after {after:?}");
    assert!(
        u64::from(last.last_data_recv_ms) > until.as_millis() as u64,
        "{tag}: data arrived: {last:?}"
    );
    a.link.assert_relayed(tag);
    assert_eq!(
        fd_of(a.ready.pid, a.ready.inode),
        Some(a.fd),
        "{tag}: {}",
        a.link.report()
    );
    wait_blocked_in_read(a.ready.pid, a.ready.tid);
    assert_eq!(
        raw_keepalive(&a.target, a.fd),
        a.out.applied,
        "{tag}: the socket changed after the watch; {}",
        a.link.report()
    );
    assert_eq!(fd_of(a.ready.pid, a.ready.inode), Some(a.fd));
    assert!(a.target.is_alive());
    drop(a.link);
}

/// A dead peer behind a slow link (every packet of the connection dropped
/// in `b`): the kernel ends the connection not before the bound and within
/// a margin this run measured, and the client's read fails with
/// `ETIMEDOUT` (then it reconnects, same pid).
fn dead_peer_is_ended_at_its_bound(tag: &str, rtt: Duration) {
    let a = arm_on_slow_link(tag, rtt, true);
    let (pid, tid, inode, armed_at, bound) =
        (a.ready.pid, a.ready.tid, a.ready.inode, a.armed_at, a.bound);
    let client_task = format!("/proc/{pid}/task/{tid}");
    let (client_delay0, own_delay0) = (run_delay(&client_task), run_delay("/proc/thread-self"));
    let watcher = std::thread::spawn(move || watch_socket(pid, inode, armed_at, 3 * bound));
    let line = a.client.expect("error ", 3 * bound);
    let failed_after = armed_at.elapsed();
    let client_delay = run_delay(&client_task).saturating_sub(client_delay0);
    let own_delay = run_delay("/proc/thread-self").saturating_sub(own_delay0);
    let seen = watcher.join().expect("the watcher");
    assert!(
        line.contains(&format!("os={}", libc::ETIMEDOUT)),
        "{tag}: expected ETIMEDOUT: {line}"
    );

    let gone = seen
        .iter()
        .position(|c| c.sock.is_none())
        .unwrap_or_else(|| panic!("{tag}: the connection outlived {:?}", 3 * bound));
    assert!(gone > 0, "{tag}: gone at the first check");
    let (last_seen, ended_by) = (seen[gone - 1].start, seen[gone].end);
    // The keepalive timer's ticks, as the probes counted them: tick k
    // (probe k + 1) is due k intervals after arming; how late the last one
    // was seen, and the most lateness one tick added.
    let interval = Keepalive::default().interval;
    let mut late = Vec::new();
    for probes in 1..=u8::MAX {
        let Some(c) = seen
            .iter()
            .find(|c| c.sock.as_ref().is_some_and(|(_, i)| i.probes >= probes))
        else {
            break;
        };
        late.push(c.end.saturating_sub(interval * u32::from(probes - 1)));
    }
    let tick_late = late.last().copied().unwrap_or_default();
    let tick_step = late
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .max()
        .unwrap_or(tick_late);
    let period = check_period(&seen);
    let margin = tick_late + tick_step + period;
    eprintln!(
        "TIMING dead peer ({rtt:?} link): ETIMEDOUT {failed_after:?} after arming; the kernel ended it \
         between {last_seen:?} and {ended_by:?} (bound {bound:?}, margin {margin:?}: \
         {} probes, the last {tick_late:?} late, a tick adding up to {tick_step:?}, a check {period:?}); \
         the client waited {client_delay:?} to run, this thread {own_delay:?}",
        late.len()
    );
    assert!(
        ended_by >= bound && failed_after >= bound,
        "{tag}: ended before the bound {bound:?}: gone by {ended_by:?}, ETIMEDOUT at {failed_after:?}"
    );
    assert!(
        last_seen <= bound + margin,
        "{tag}: the kernel ended it after {last_seen:?}, past the bound {bound:?} + {margin:?}"
    );
    assert!(
        failed_after <= ended_by + client_delay + own_delay + period,
        "{tag}: ETIMEDOUT seen {failed_after:?} after arming, the end by {ended_by:?}, \
         the client waited {client_delay:?} to run, this thread {own_delay:?}, a check {period:?}"
    );
    a.link.assert_relayed(tag);
    // Its own reconnect logic ran: a new connection, the same process.
    let again = a.client.ready();
    assert_eq!(again.pid, pid);
    assert_ne!(again.inode, inode);
    assert!(a.target.is_alive());
    assert!(no_pending_signals(pid));
}

/// The keepalive rung on real sockets over a slow link (a relay that holds
/// every packet half a round trip, as no netem is here): live peers 2.5 s
/// and 4.5 s away are kept past twice the bound; a dead one is ended not
/// before the core's model says and within what this run measured.
#[test]
fn keepalive_rung_keeps_a_slow_live_peer_and_ends_a_dead_one_at_its_bound() {
    let _area = tests::area(module_path!());
    if !need_root("keepalive_rung_keeps_a_slow_live_peer_and_ends_a_dead_one_at_its_bound") {
        return;
    }
    std::thread::scope(|s| {
        let runs = [
            s.spawn(|| slow_live_peer_is_kept("kl2", Duration::from_millis(2500))),
            s.spawn(|| slow_live_peer_is_kept("kl4", Duration::from_millis(4500))),
            s.spawn(|| dead_peer_is_ended_at_its_bound("kdd", Duration::from_millis(2500))),
        ];
        for r in runs {
            r.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        }
    });
}
