//! The eBPF receive tracer against real processes and sockets: a thread
//! blocked in `recv` is reported with its socket and age and cleared when
//! data arrives; an event-loop client never is; unwatched processes leave
//! nothing; a process in another network namespace works; strategy
//! selection reports why strategies failed; bad input is an error.
//!
//! Needs root. Tests that would exercise a strategy this kernel lacks skip
//! it: kprobe and fentry as VM-only (`cargo xtask vm-test` runs them on a
//! kernel that has them), the tracepoints as the kernel's lack.

use std::{
    io::Write as _,
    net::TcpStream,
    path::Path,
    time::{Duration, Instant},
};

use selfheal::{
    ebpf::{Tracer, TracerError, TracerOptions},
    sys::sockdiag,
};
use selfheal_core::ebpf::TracerSnapshot;
use selfheal_core::ebpf::strategy::Strategy;
use tests::{
    Netns, Peer, Ready, Skip, attach, forced_strategy, listener, need_ebpf, skip_as, wait_for,
};

const SEC: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(50);

/// Strategies this kernel can attach, each of the others with the reason it
/// cannot — and that reason must be the kernel's, not ours.
fn strategies_here(test: &str) -> Vec<Strategy> {
    if let Some(f) = forced_strategy() {
        return vec![f];
    }
    let mut ok = Vec::new();
    for s in Strategy::ALL {
        match Tracer::attach(&TracerOptions {
            strategies: vec![s],
            ..TracerOptions::default()
        }) {
            Ok(_) => ok.push(s),
            Err(TracerError::NoStrategy { attempts }) => {
                let why = attempts[0].error.clone().unwrap_or_default();
                assert_kernel_lacks(s, &why);
                // kprobe and fentry: `cargo xtask vm-test` runs them on
                // Debian's stock kernel (CI's kernel has no kprobes). The
                // tracepoints are every kernel's since 6.3: CI's must have
                // them.
                let kind = match s {
                    Strategy::Kprobe | Strategy::Fentry => Skip::Vm,
                    Strategy::TpBtf | Strategy::Tracepoint => Skip::Kernel,
                };
                skip_as(
                    kind,
                    &format!("{test} [{s}]"),
                    &format!("this kernel lacks it: {why}"),
                );
            }
            Err(e) => panic!("{s}: {e}"),
        }
    }
    assert!(!ok.is_empty(), "no strategy attaches on this kernel");
    ok
}

/// A strategy may fail only for a reason that lies in the kernel.
fn assert_kernel_lacks(s: Strategy, why: &str) {
    let kernel_reason = match s {
        Strategy::Kprobe => !Path::new("/sys/bus/event_source/devices/kprobe").exists(),
        Strategy::Fentry => {
            why.contains("Operation not permitted") || why.contains("not supported")
        }
        // Linux before 6.3 has no sock_{recv,send}_length tracepoints.
        Strategy::TpBtf => why.contains("unknown BTF type `btf_trace_sock_"),
        Strategy::Tracepoint => why.contains("sock_recv_length/format: No such file"),
    };
    assert!(
        kernel_reason,
        "{s} failed for a reason that is not the kernel's: {why}"
    );
}

fn accept(l: &std::net::TcpListener) -> TcpStream {
    l.set_nonblocking(false).unwrap();
    l.accept().expect("accept").0
}

/// A `recv-peer` client (`args[0]` its mode, the rest what follows the
/// address) connected to a loopback listener of ours, watched by `tracer`
/// before it is told to start reading. Returns the peer, our end of the
/// connection, and what the peer reported.
fn watched_client(tracer: &mut Tracer, args: &[&str]) -> (Peer, TcpStream, Ready) {
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let mut full = vec![args[0], addr.as_str()];
    full.extend_from_slice(&args[1..]);
    let mut peer = Peer::recv_peer(&full);
    let server_side = accept(&l);
    let ready = peer.ready();
    tracer.watch(ready.pid, 0).unwrap();
    peer.tell("go");
    (peer, server_side, ready)
}

fn snapshot(t: &mut Tracer) -> TracerSnapshot {
    t.snapshot().expect("snapshot")
}

/// A thread that blocks reading a pipe while watched, then in a socket
/// receive: the pipe read's entry (no socket hook clears it) must not hide
/// the socket receive. Found under load, where the watch could land before
/// the peer's first stdin read.
#[test]
fn a_socket_receive_after_a_blocking_pipe_read_is_seen() {
    let _area = tests::area(module_path!());
    if !need_ebpf("recv_after_pipe_read") {
        return;
    }
    for strategy in strategies_here("recv_after_pipe_read") {
        let mut tracer = attach(Some(&[strategy]));
        let l = listener();
        let mut peer = Peer::recv_peer(&["client", &l.local_addr().unwrap().to_string(), "--once"]);
        let _server_side = accept(&l);
        let ready = peer.ready();
        tracer.watch(ready.pid, 0).unwrap();
        // Woken, it reads this line and blocks in read(stdin) again, watched.
        peer.tell("not yet");
        std::thread::sleep(SEC / 2);
        peer.tell("go");
        let found = wait_for(5 * SEC, TICK, || {
            let snap = snapshot(&mut tracer);
            snap.blocked
                .iter()
                .find(|b| b.tid == ready.tid && b.inode == Some(ready.inode))
                .cloned()
        });
        assert!(
            found.is_some(),
            "[{strategy}] the socket receive after the pipe read was not reported: {:#?}",
            snapshot(&mut tracer)
        );
    }
}

#[test]
fn blocked_recv_is_reported_with_its_socket_and_age_then_cleared() {
    let _area = tests::area(module_path!());
    if !need_ebpf("blocked_recv") {
        return;
    }
    // Left to itself, the loader picks the strategy this kernel is expected
    // to get (checked by `attach` when SELFHEAL_EXPECT_STRATEGY is set).
    drop(attach(None));
    for strategy in strategies_here("blocked_recv") {
        let mut tracer = attach(Some(&[strategy]));
        let (peer, mut server_side, ready) = watched_client(&mut tracer, &["client", "--once"]);

        std::thread::sleep(2 * SEC);
        let snap = snapshot(&mut tracer);
        let b = snap
            .blocked
            .iter()
            .find(|b| b.tid == ready.tid)
            .unwrap_or_else(|| {
                panic!(
                    "[{strategy}] thread {} not reported blocked: {snap:#?}",
                    ready.tid
                )
            });
        assert_eq!(b.tgid, ready.pid, "[{strategy}]");
        assert_eq!(b.inode, Some(ready.inode), "[{strategy}] socket identity");
        assert!(
            b.age_ms >= 1500,
            "[{strategy}] age {} ms after 2 s",
            b.age_ms
        );
        assert!(
            b.age_ms < 10_000,
            "[{strategy}] age {} ms after 2 s",
            b.age_ms
        );
        // The identity is the one sock_diag reports for that connection.
        let diag = sockdiag::dump_tcp().expect("sock_diag");
        let s = diag
            .iter()
            .find(|s| s.local.to_string() == ready.local)
            .expect("socket in sock_diag");
        assert_eq!(Some(s.inode), b.inode, "[{strategy}] sock_diag inode");

        let sent_at = selfheal::sys::clock::boot_ns();
        server_side.write_all(&[7u8; 10]).unwrap();
        peer.expect("got 10", 5 * SEC);
        let snap = wait_for(5 * SEC, TICK, || {
            let s = snapshot(&mut tracer);
            s.sockets
                .iter()
                .any(|a| a.inode == ready.inode && a.recv_data >= 1)
                .then_some(s)
        })
        .unwrap_or_else(|| panic!("[{strategy}] the receive was never accounted"));
        assert!(
            snap.blocked.iter().all(|b| b.tid != ready.tid),
            "[{strategy}] still blocked: {snap:#?}"
        );
        let a = snap
            .sockets
            .iter()
            .find(|a| a.inode == ready.inode)
            .unwrap();
        assert_eq!(
            (a.last_recv_bytes, a.bytes_received, a.tgid),
            (10, 10, ready.pid),
            "[{strategy}] {a:?}"
        );
        let age = a.last_recv_ms.expect("a last receive");
        assert!(
            age <= age_since(sent_at),
            "[{strategy}] last receive {age} ms ago predates the send"
        );
        eprintln!(
            "[{strategy}] blocked {} ms, then received 10 B: ok",
            b.age_ms
        );
    }
}

/// Milliseconds since `t` (`CLOCK_BOOTTIME` ns).
fn age_since(t: u64) -> u64 {
    selfheal_core::clock::age_ms(selfheal::sys::clock::boot_ns(), t)
}

#[test]
fn event_loop_client_is_never_blocked_while_its_reads_are_timed() {
    let _area = tests::area(module_path!());
    if !need_ebpf("event_loop") {
        return;
    }
    for strategy in strategies_here("event_loop") {
        let mut tracer = attach(Some(&[strategy]));
        let (_peer, mut server_side, ready) = watched_client(&mut tracer, &["tokio-client"]);

        let mut last_seen_bytes = 0;
        for i in 0..20 {
            server_side.write_all(&[1u8; 100]).unwrap();
            let start = Instant::now();
            // Between messages the client sits in epoll_wait: never "blocked
            // in a receive", whatever moment we look.
            while start.elapsed() < Duration::from_millis(100) {
                let s = snapshot(&mut tracer);
                assert!(
                    s.blocked.iter().all(|b| b.tgid != ready.pid),
                    "[{strategy}] event-loop client reported blocked after message {i}: {:#?}",
                    s.blocked
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            let s = snapshot(&mut tracer);
            if let Some(a) = s.sockets.iter().find(|a| a.inode == ready.inode) {
                assert!(a.bytes_received >= last_seen_bytes);
                last_seen_bytes = a.bytes_received;
                assert!(
                    a.last_recv_ms.unwrap_or(u64::MAX) < 1000,
                    "[{strategy}] last receive not recent: {a:?}"
                );
            }
        }
        let s = snapshot(&mut tracer);
        let a = s
            .sockets
            .iter()
            .find(|a| a.inode == ready.inode)
            .expect("activity of the client's socket");
        assert_eq!(a.bytes_received, 2000, "[{strategy}] {a:?}");
        assert!(a.recv_data >= 10, "[{strategy}] {a:?}");
        eprintln!(
            "[{strategy}] event loop: {} reads with data, {} empty, never blocked: ok",
            a.recv_data, a.recv_empty
        );
    }
}

#[test]
fn processes_outside_the_pid_filter_leave_nothing() {
    let _area = tests::area(module_path!());
    if !need_ebpf("pid_filter") {
        return;
    }
    let mut tracer = attach(None);
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let mut watched = Peer::recv_peer(&["client", &addr]);
    let mut w_side = accept(&l);
    let mut other = Peer::recv_peer(&["client", &addr]);
    let mut o_side = accept(&l);
    let w = watched.ready();
    let o = other.ready();
    tracer.watch(w.pid, 0).unwrap();
    watched.tell("go");
    other.tell("go");
    for _ in 0..5 {
        w_side.write_all(b"ping").unwrap();
        o_side.write_all(b"ping").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(SEC);
    let s = snapshot(&mut tracer);
    assert!(
        s.blocked.iter().any(|b| b.tgid == w.pid),
        "the watched client is blocked: {s:#?}"
    );
    assert!(
        s.blocked.iter().all(|b| b.tgid == w.pid),
        "only the watched process: {s:#?}"
    );
    assert!(
        s.sockets.iter().all(|a| a.tgid == w.pid),
        "only the watched process: {s:#?}"
    );
    assert!(
        s.sockets.iter().all(|a| a.inode != o.inode),
        "the unwatched socket: {s:#?}"
    );
    assert!(
        s.sockets
            .iter()
            .any(|a| a.inode == w.inode && a.bytes_received == 20),
        "{s:#?}"
    );

    tracer.unwatch(w.pid).unwrap();
    let s = snapshot(&mut tracer);
    assert!(
        s.blocked.is_empty() && s.sockets.is_empty(),
        "unwatch forgets: {s:#?}"
    );
}

#[test]
fn another_network_namespace_is_traced() {
    let _area = tests::area(module_path!());
    if !need_ebpf("netns") {
        return;
    }
    let ns = match Netns::new("ebpf") {
        Ok(ns) => ns,
        Err(e) => panic!("cannot make a network namespace as root: {e}"),
    };
    let mut tracer = attach(None);
    let mut cmd = ns.command(&tests::helper_bin("recv-peer"));
    cmd.args(["server", "127.0.0.1:0"]);
    let mut server = Peer::spawn(cmd);
    let addr = server
        .expect("listening ", 10 * SEC)
        .trim_start_matches("listening ")
        .to_string();
    let mut cmd = ns.command(&tests::helper_bin("recv-peer"));
    cmd.args(["client", &addr, "--once"]);
    let mut client = Peer::spawn(cmd);
    let ready = client.ready();
    tracer.watch(ready.pid, 0).unwrap();
    client.tell("go");
    std::thread::sleep(2 * SEC);

    let snap = snapshot(&mut tracer);
    let b = snap
        .blocked
        .iter()
        .find(|b| b.tid == ready.tid)
        .unwrap_or_else(|| panic!("not blocked: {snap:#?}"));
    assert_eq!(b.inode, Some(ready.inode));
    assert!(b.age_ms >= 1500, "age {}", b.age_ms);
    // Our namespace does not have the socket; the client's does.
    let ours = sockdiag::dump_tcp().unwrap();
    assert!(ours.iter().all(|s| s.inode != ready.inode));
    let theirs = sockdiag::dump_tcp_in_netns_of(ready.pid).unwrap();
    let s = theirs
        .iter()
        .find(|s| s.inode == ready.inode)
        .expect("socket in the client's namespace");
    assert_eq!(s.local.to_string(), ready.local);

    server.tell("send 5");
    client.expect("got 5", 5 * SEC);
    let a = wait_for(5 * SEC, TICK, || {
        snapshot(&mut tracer)
            .sockets
            .into_iter()
            .find(|a| a.inode == ready.inode && a.bytes_received == 5)
    });
    assert!(
        a.is_some(),
        "the receive in the other namespace was accounted"
    );
    server.close_stdin();
}

#[test]
fn strategy_selection_reports_why_each_earlier_strategy_failed() {
    let _area = tests::area(module_path!());
    if !need_ebpf("strategy_selection") {
        return;
    }
    let tracer = attach(None);
    let attempts = tracer.attempts();
    let chosen = attempts.last().expect("at least one attempt");
    assert_eq!(chosen.strategy, tracer.strategy());
    assert_eq!(chosen.error, None);
    for a in &attempts[..attempts.len() - 1] {
        let why = a.error.as_deref().expect("earlier attempts failed");
        assert!(!why.is_empty());
        assert_kernel_lacks(a.strategy, why);
    }
    if forced_strategy().is_none() && !Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        // This development kernel: no kprobes, no trampolines → tp_btf.
        assert_eq!(attempts[0].strategy, Strategy::Kprobe);
        assert!(
            attempts[0].error.as_deref().unwrap().contains("kprobe"),
            "{attempts:?}"
        );
    }
    eprintln!("strategy {}; attempts: {attempts:#?}", tracer.strategy());
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let _area = tests::area(module_path!());
    if !need_ebpf("bad_input") {
        return;
    }
    // No BTF.
    let err = Tracer::attach(&TracerOptions {
        btf_path: "/nonexistent/vmlinux".into(),
        ..TracerOptions::default()
    });
    assert!(
        matches!(err, Err(TracerError::Layout(_))),
        "{:?}",
        err.err()
    );
    // No strategy to try.
    let err = Tracer::attach(&TracerOptions {
        strategies: vec![],
        ..TracerOptions::default()
    });
    assert!(matches!(err, Err(TracerError::NoStrategy { ref attempts }) if attempts.is_empty()));
    // A pid that exits between watching and reading.
    let mut tracer = attach(None);
    let (peer, _side, ready) = watched_client(&mut tracer, &["client"]);
    std::thread::sleep(Duration::from_millis(300));
    drop(peer);
    let s = snapshot(&mut tracer);
    assert!(
        s.blocked.iter().all(|b| b.tgid != ready.pid),
        "a dead process is not blocked: {s:#?}"
    );
    // Watching a pid that does not exist is harmless; one that cannot exist
    // (above the largest pid_max, 2^22) is a clear error.
    tracer.watch((1 << 22) - 1, 0).unwrap();
    snapshot(&mut tracer);
    let err = tracer.watch(u32::MAX - 7, 0).unwrap_err();
    assert!(err.to_string().contains("pid_max"), "{err}");
}
