//! procfs and sock_diag collectors against real processes and sockets:
//! threads in three different waits, zombies under a PID 1, sockets in
//! ESTABLISHED and CLOSE_WAIT and with unacknowledged data, and a connection
//! whose peer vanished without a FIN, before and after keepalive is armed.

use std::{process::Command, time::Duration};

use selfheal::{proc, sys::sockdiag};
use tests::{NetnsPair, Peer, Ready, arm_keepalive, listener, need_root, selfheal_bin, wait_for};

const SEC: Duration = Duration::from_secs(1);

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// The fd number of socket `inode` in process `pid`.
fn fd_of(pid: u32, inode: u64) -> i32 {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == want))
        .and_then(|e| e.file_name().to_string_lossy().parse().ok())
        .expect("the socket's fd")
}

#[test]
fn three_threads_in_three_waits() {
    let _area = tests::area(module_path!());
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let peer = Peer::recv_peer(&["threads", &addr]);
    let _side = l.accept().unwrap();
    let line = peer.expect("ready ", 10 * SEC);
    let (pid, recv, futex, spin, inode) = (
        field(&line, "pid") as u32,
        field(&line, "recv"),
        field(&line, "futex"),
        field(&line, "spin"),
        field(&line, "inode"),
    );

    // Let the waits settle and the spinner accumulate CPU time.
    let p = wait_for(5 * SEC, Duration::from_millis(50), || {
        let p = proc::process(pid, selfheal_core::proc::Detail::Full).ok()?;
        let t = |tid: u64| p.threads.iter().find(|t| u64::from(t.tid) == tid).cloned();
        let r = t(recv)?;
        (r.recv.is_some() && r.idle_ms.is_some_and(|ms| ms >= 300) && t(spin)?.cpu_ticks > 10)
            .then_some(p)
    })
    .expect("threads settle into their waits");
    let t = |tid: u64| p.threads.iter().find(|t| u64::from(t.tid) == tid).unwrap();

    let r = t(recv);
    assert_eq!(r.name, "recv-wait");
    assert_eq!(r.state, 'S');
    let pr = r.recv.as_ref().unwrap();
    assert_eq!((pr.syscall, pr.inode), ("recvfrom", inode));
    assert!(p.sockets.iter().any(|(_, i)| *i == inode));
    if tests::is_root() {
        assert!(
            r.kstack
                .iter()
                .any(|f| f.contains("recvmsg") || f.contains("wait")),
            "{:?}",
            r.kstack
        );
    }

    let f = t(futex);
    assert_eq!(f.syscall.as_ref().and_then(|s| s.name), Some("futex"));
    assert!(f.recv.is_none());

    let s = t(spin);
    assert_eq!(s.state, 'R');
    assert!(s.recv.is_none());
    assert!(s.cpu_ticks > 10, "{}", s.cpu_ticks);
    assert_eq!(p.threads.len(), 4, "main + 3: {:?}", p.threads);
}

/// `recv-peer zombies N` as PID 1 of a new pid namespace: it leaks `n`
/// zombies and never reaps them. Once it is ready: it, and its ready line.
fn leaking_pid_1(n: u32) -> (Peer, String) {
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc"])
        .arg(tests::helper_bin("recv-peer"))
        .args(["zombies", &n.to_string()]);
    let peer = Peer::spawn(cmd);
    let line = peer.expect("ready ", 10 * SEC);
    (peer, line)
}

#[test]
fn zombies_under_their_own_pid_1() {
    let _area = tests::area(module_path!());
    if !need_root("zombies") {
        return;
    }
    // The peer as PID 1 of a new pid namespace, leaking 5 zombies.
    let (peer, line) = leaking_pid_1(5);
    assert_eq!(
        field(&line, "pid"),
        1,
        "the peer sees itself as PID 1: {line}"
    );
    // Find it from outside: the child of `unshare`.
    let outer =
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", peer.pid(), peer.pid()))
            .expect("unshare's children");
    let init: u32 = outer
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the namespace's init");
    let p = proc::process(init, selfheal_core::proc::Detail::Full).unwrap();
    assert!(p.pid_ns_init, "{p:?}");
    let kids = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).unwrap();
    let zombies: Vec<u32> = kids
        .split_whitespace()
        .filter_map(|k| k.parse().ok())
        .collect();
    assert_eq!(zombies.len(), 5);
    for z in zombies {
        let zp = proc::process(z, selfheal_core::proc::Detail::Full).unwrap();
        assert_eq!((zp.state, zp.ppid), ('Z', init));
        assert!(!zp.pid_ns_init);
    }
}

#[test]
fn established_close_wait_and_unacked_sockets() {
    let _area = tests::area(module_path!());
    if !need_root("socket_states") {
        return;
    }
    // ESTABLISHED and CLOSE_WAIT on loopback: the server side closes, the
    // client neither reads nor closes.
    let l = listener();
    let addr = l.local_addr().unwrap();
    let keep = std::net::TcpStream::connect(addr).unwrap();
    let (_keep_srv, _) = l.accept().unwrap();
    let closing = std::net::TcpStream::connect(addr).unwrap();
    let (closing_srv, _) = l.accept().unwrap();
    drop(closing_srv);
    let state_of = |local: std::net::SocketAddr| {
        sockdiag::dump_tcp()
            .unwrap()
            .into_iter()
            .find(|s| s.local == local)
            .map(|s| s.state)
    };
    assert_eq!(
        state_of(keep.local_addr().unwrap()),
        Some(selfheal_core::model::TcpState::Established)
    );
    let cw = wait_for(5 * SEC, Duration::from_millis(20), || {
        (state_of(closing.local_addr().unwrap()) == Some(selfheal_core::model::TcpState::CloseWait))
            .then_some(())
    });
    assert!(cw.is_some(), "CLOSE-WAIT");

    // Unacknowledged data: connect, then the peer drops everything, then
    // data is sent into the dead connection.
    let pair = NetnsPair::new("unack").expect("netns pair");
    let sink = pair.listening_in_b(&["sink", &format!("{}:7000", pair.b_addr)]);
    let (_client, ready) = pair.client_in_a(7000);
    sink.expect("accepted", 10 * SEC);
    pair.drop_all_into_b().expect("nft");
    // Write into the dead connection from outside the client: duplicate its
    // socket and send on the duplicate.
    send_via_pidfd(ready.pid, fd_of(ready.pid, ready.inode), b"hello?");
    let s = wait_for(5 * SEC, Duration::from_millis(50), || {
        sockdiag::dump_tcp_in_netns_of(ready.pid)
            .ok()?
            .into_iter()
            .find(|s| {
                s.inode == ready.inode
                    && s.tcp_info
                        .as_ref()
                        .is_some_and(|i| i.unacked > 0 && i.retransmits > 0)
            })
    })
    .expect("unacknowledged, retransmitted data");
    assert_eq!(
        s.timer.as_ref().map(|t| t.kind),
        Some("retransmit"),
        "{s:?}"
    );
}

/// Sends `data` on socket `fd` of `pid` through a pidfd duplicate.
fn send_via_pidfd(pid: u32, fd: i32, data: &[u8]) {
    // SAFETY: plain syscalls; the fds are closed here.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as libc::c_int;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) as libc::c_int;
        assert!(dup >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        let n = libc::send(dup, data.as_ptr().cast(), data.len(), libc::MSG_DONTWAIT);
        assert_eq!(
            n,
            data.len() as isize,
            "send: {}",
            std::io::Error::last_os_error()
        );
        libc::close(dup);
        libc::close(pidfd);
    }
}

#[test]
fn half_open_connection_then_keepalive_probes() {
    let _area = tests::area(module_path!());
    if !need_root("half_open") {
        return;
    }
    let pair = NetnsPair::new("half").expect("netns pair");
    let mut server = pair.listening_in_b(&["server", &format!("{}:7443", pair.b_addr)]);
    let (mut client, ready) = pair.client_in_a(7443);
    client.tell("go");
    server.tell("send 5");
    client.expect("got 5", 5 * SEC);

    // The server vanishes without a FIN.
    pair.drop_all_into_b().expect("nft");
    let info = |pid: u32, inode: u64| {
        sockdiag::dump_tcp_in_netns_of(pid)
            .unwrap()
            .into_iter()
            .find(|s| s.inode == inode)
            .expect("the socket")
    };
    let before = inspect_pid(ready.pid);
    std::thread::sleep(2 * SEC);
    let after = inspect_pid(ready.pid);
    let sock = |v: &serde_json::Value| {
        v["sockets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["inode"] == ready.inode)
            .cloned()
            .expect("socket in inspect")
    };
    for key in ["last_data_recv_ms", "last_ack_recv_ms"] {
        let (b, a) = (
            sock(&before)["tcp_info"][key].as_u64().unwrap(),
            sock(&after)["tcp_info"][key].as_u64().unwrap(),
        );
        assert!(
            a >= b + 1500,
            "{key} grows while the peer is gone: {b} then {a}"
        );
    }
    // The client's thread is blocked in its receive the whole time.
    let t = after["processes"][0]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == ready.tid)
        .cloned()
        .unwrap();
    assert!(
        t["recv_blocked_ms"].as_u64().is_some_and(|ms| ms >= 1500),
        "{t}"
    );
    assert_eq!(sock(&after)["tcp_info"]["probes"], 0);

    // Arm keepalive on the client's socket from outside: probes go out, none
    // is answered, and the count climbs.
    arm_keepalive(ready.pid, fd_of(ready.pid, ready.inode), 1, 1, 20).expect("arm keepalive");
    let probed = wait_for(8 * SEC, Duration::from_millis(200), || {
        let s = info(ready.pid, ready.inode);
        (s.tcp_info.as_ref()?.probes >= 3).then_some(s)
    })
    .expect("keepalive probes count up");
    assert_eq!(
        probed.timer.as_ref().map(|t| t.kind),
        Some("keepalive"),
        "{probed:?}"
    );
    let v = inspect_pid(ready.pid);
    assert!(
        sock(&v)["tcp_info"]["probes"]
            .as_u64()
            .is_some_and(|p| p >= 3),
        "{}",
        sock(&v)
    );
    assert!(
        sock(&v)["anomalies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a.as_str().unwrap().contains("probe"))
    );
}

/// Writes `text` to a fresh config file and returns its path.
fn config_file(tag: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("selfheal-{tag}-{}.toml", std::process::id()));
    std::fs::write(&path, text).expect("write config");
    path
}

fn inspect_name(config: &std::path::Path, name: &str) -> serde_json::Value {
    let out = tests::output_ok(
        Command::new(selfheal_bin())
            .args(["inspect", name, "--json", "--no-ebpf", "--config"])
            .arg(config),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn inspect_by_name_in_another_netns_with_roles() {
    let _area = tests::area(module_path!());
    if !need_root("inspect_name") {
        return;
    }
    let pair = NetnsPair::new("name").expect("netns pair");
    let _servers: Vec<Peer> = [7443, 8443]
        .into_iter()
        .map(|port| pair.listening_in_b(&["server", &format!("{}:{port}", pair.b_addr)]))
        .collect();
    let clients: Vec<(Peer, Ready)> = [7443, 8443]
        .into_iter()
        .map(|port| pair.client_in_a(port))
        .collect();
    let config = config_file(
        "name",
        &format!(
            "[[agent]]\nname = \"runner\"\nmatch = {{ cmdline = \"recv-peer client {b}:\" }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"{b}:7443\"\nheartbeat = \"10s\"\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \":8443\"\n",
            b = pair.b_addr
        ),
    );
    let v = inspect_name(&config, "runner");
    let _ = std::fs::remove_file(&config);
    assert_eq!(v["agent"], "runner");
    let pids: Vec<u64> = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    for (_, r) in &clients {
        assert!(pids.contains(&u64::from(r.pid)), "{pids:?} lacks {}", r.pid);
    }
    let role_of = |inode: u64| {
        v["sockets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["inode"] == inode)
            .map(|s| s["role"].clone())
    };
    assert_eq!(role_of(clients[0].1.inode), Some("control".into()));
    assert_eq!(role_of(clients[1].1.inode), Some("provider".into()));
}

#[test]
fn inspect_by_name_diagnoses_the_missing_init() {
    let _area = tests::area(module_path!());
    if !need_root("missing_init") {
        return;
    }
    let (_peer, _) = leaking_pid_1(7);
    let config = config_file(
        "init",
        "[[agent]]\nname = \"leaky\"\nmatch = { cmdline = '^/\\S*recv-peer zombies 7$' }\n",
    );
    let v = inspect_name(&config, "leaky");
    let _ = std::fs::remove_file(&config);
    // The rule names the process that is PID 1 of its namespace (as an
    // agent that is a container's entrypoint), not the `unshare` above it.
    assert_eq!(
        v["zombies"].as_array().unwrap().len(),
        7,
        "{}",
        v["zombies"]
    );
    assert_eq!(v["init"]["root_is_pid1"], true, "{}", v["init"]);
    assert!(
        v["init"]["diagnosis"]
            .as_str()
            .is_some_and(|d| d.contains("7 zombie(s)")),
        "{}",
        v["init"]
    );
}

/// A python3 client of `127.0.0.1:PORT` that announces its socket
/// (`ready pid=… inode=… fd=…`) and then waits on it in `MODE`: `poll` (a
/// socket with a timeout, as every LLM SDK's), `select`, or `asyncio` (an
/// event loop's epoll). It dies with the test thread (PR_SET_PDEATHSIG).
const PY_WAITER: &str = r#"
import asyncio, ctypes, os, select, socket, sys
ctypes.CDLL(None).prctl(1, 9)
port, mode = int(sys.argv[1]), sys.argv[2]
def ready(s):
    print(f"ready pid={os.getpid()} inode={os.fstat(s.fileno()).st_ino} fd={s.fileno()}", flush=True)
if mode == "poll":
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(600)
    ready(s)
    s.recv(1)
elif mode == "select":
    s = socket.create_connection(("127.0.0.1", port))
    ready(s)
    select.select([s], [], [], 600)
elif mode == "asyncio":
    async def main():
        r, w = await asyncio.open_connection("127.0.0.1", port)
        ready(w.get_extra_info("socket"))
        await asyncio.wait_for(r.read(1), 600)
    asyncio.run(main())
"#;

/// The python3 waiter in `mode` against a fresh loopback listener that
/// accepts and never answers: the peer, the accepted side (kept open), and
/// the waiter's (pid, socket inode, fd). `None` (skipped) without python3.
fn python_waiter(test: &str, mode: &str) -> Option<(Peer, std::net::TcpStream, u32, u64, i32)> {
    if Command::new("python3").arg("-V").output().is_err() {
        tests::skip(test, "no python3");
        return None;
    }
    let l = listener();
    let port = l.local_addr().unwrap().port().to_string();
    let mut cmd = Command::new("python3");
    cmd.args(["-c", PY_WAITER, &port, mode]);
    let peer = Peer::spawn(cmd);
    let (side, _) = l.accept().unwrap();
    let line = peer.expect("ready ", 10 * SEC);
    let (pid, inode, fd) = (
        field(&line, "pid") as u32,
        field(&line, "inode"),
        field(&line, "fd") as i32,
    );
    Some((peer, side, pid, inode, fd))
}

/// Thread `tid` of `pid` once it sits in a readiness wait covering socket
/// `inode` (within 10 s), read with `detail`.
fn settled_wait(
    pid: u32,
    tid: u32,
    inode: u64,
    detail: selfheal_core::proc::Detail,
) -> selfheal_core::proc::ThreadInfo {
    wait_for(10 * SEC, Duration::from_millis(50), || {
        let p = proc::process(pid, detail).ok()?;
        p.threads.into_iter().find(|t| {
            t.tid == tid
                && t.wait
                    .as_ref()
                    .is_some_and(|w| w.sockets.iter().any(|(_, i)| *i == inode))
        })
    })
    .unwrap_or_else(|| {
        panic!(
            "thread {tid} never waited on socket {inode}: {:?}",
            proc::process(pid, detail).map(|p| p.threads)
        )
    })
}

/// `selfheal inspect --pid PID --json --no-ebpf`.
fn inspect_pid(pid: u32) -> serde_json::Value {
    let out = tests::output_ok(Command::new(selfheal_bin()).args([
        "inspect",
        "--no-ebpf",
        "--json",
        "--pid",
        &pid.to_string(),
    ]));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Thread `tid` of the first process of an inspect report.
fn json_thread(v: &serde_json::Value, tid: u32) -> serde_json::Value {
    v["processes"][0]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == tid)
        .cloned()
        .unwrap_or_else(|| panic!("no thread {tid} in {v}"))
}

#[test]
fn python_socket_with_a_timeout_waits_in_poll() {
    let _area = tests::area(module_path!());
    let Some((_peer, _side, pid, inode, fd)) = python_waiter("python_poll", "poll") else {
        return;
    };
    for detail in [
        selfheal_core::proc::Detail::Light,
        selfheal_core::proc::Detail::Full,
    ] {
        let t = settled_wait(pid, pid, inode, detail);
        let w = t.wait.as_ref().unwrap();
        assert!(matches!(w.syscall, "poll" | "ppoll"), "{w:?}");
        assert_eq!(
            (w.sockets.as_slice(), w.epoll_fd),
            (&[(fd, inode)][..], None)
        );
        assert!(w.idle_ms.is_some() && w.idle_ms == t.idle_ms, "{t:?}");
        // A wait, not a receive.
        assert!(t.recv.is_none(), "{t:?}");
    }
    let t = json_thread(&inspect_pid(pid), pid);
    assert!(
        matches!(t["wait_syscall"].as_str(), Some("poll" | "ppoll")),
        "{t}"
    );
    assert_eq!(t["wait_inodes"], serde_json::json!([inode]), "{t}");
    assert!(t.get("wait_event_loop").is_none(), "{t}");
}

#[test]
fn python_select_waits_on_its_read_set() {
    let _area = tests::area(module_path!());
    let Some((_peer, _side, pid, inode, fd)) = python_waiter("python_select", "select") else {
        return;
    };
    let t = settled_wait(pid, pid, inode, selfheal_core::proc::Detail::Light);
    let w = t.wait.as_ref().unwrap();
    assert!(matches!(w.syscall, "select" | "pselect6"), "{w:?}");
    assert_eq!(
        (w.sockets.as_slice(), w.epoll_fd),
        (&[(fd, inode)][..], None)
    );
    assert!(w.idle_ms.is_some(), "{t:?}");
}

#[test]
fn python_asyncio_waits_in_its_event_loops_epoll() {
    let _area = tests::area(module_path!());
    let Some((_peer, _side, pid, inode, fd)) = python_waiter("python_asyncio", "asyncio") else {
        return;
    };
    let t = settled_wait(pid, pid, inode, selfheal_core::proc::Detail::Light);
    let w = t.wait.as_ref().unwrap();
    assert!(w.syscall.starts_with("epoll_"), "{w:?}");
    assert!(w.sockets.contains(&(fd, inode)), "{w:?}");
    let epfd = w.epoll_fd.expect("an event loop's epoll fd");
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/fd/{epfd}"))
            .unwrap()
            .to_string_lossy(),
        "anon_inode:[eventpoll]"
    );
    // Through inspect: only the TCP socket (asyncio's self-pipe is a unix
    // socket pair, registered too), marked as an event loop's.
    let t = json_thread(&inspect_pid(pid), pid);
    assert!(
        t["wait_syscall"]
            .as_str()
            .is_some_and(|s| s.starts_with("epoll_")),
        "{t}"
    );
    assert_eq!(t["wait_inodes"], serde_json::json!([inode]), "{t}");
    assert_eq!(t["wait_event_loop"], true, "{t}");
}

#[test]
fn tokio_client_waits_in_its_event_loops_epoll() {
    let _area = tests::area(module_path!());
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let mut peer = Peer::recv_peer(&["tokio-client", &addr]);
    let _side = l.accept().unwrap();
    let ready = peer.ready();
    peer.tell("go");
    let t = settled_wait(
        ready.pid,
        ready.tid,
        ready.inode,
        selfheal_core::proc::Detail::Full,
    );
    let w = t.wait.as_ref().unwrap();
    assert!(w.syscall.starts_with("epoll_"), "{w:?}");
    assert!(w.epoll_fd.is_some(), "{w:?}");
    assert!(w.sockets.iter().any(|(_, i)| *i == ready.inode), "{w:?}");
    assert!(t.recv.is_none(), "{t:?}");
}

/// A wait age is measured in the task clock of the CPU the waiting thread
/// last ran on: with the waiter pinned to one CPU and the reader to another
/// (every ordered pair this process may use), the age procfs gives equals
/// the waiter's own `CLOCK_MONOTONIC` wait within two ticks. CPUs' task
/// clocks differ (by 1.5 s on the machines here), so an age taken across
/// CPUs is off by that much; where they agree the pairs still check the
/// arithmetic. The offsets seen are printed.
#[test]
fn wait_ages_are_right_whichever_cpus_the_waiter_and_the_reader_ran_on() {
    let _area = tests::area(module_path!());
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use std::io::Read as _;
    let me = nix::unistd::Pid::from_raw(0);
    let allowed = sched_getaffinity(me).unwrap();
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    let clocks = proc::task_clocks();
    for (cpu, offset) in clocks.cpus.iter().enumerate() {
        eprintln!("cpu {cpu}: task clock - CLOCK_MONOTONIC = {offset:?} ms");
    }
    fn pin(cpu: usize) {
        let mut one = CpuSet::new();
        one.set(cpu).unwrap();
        sched_setaffinity(nix::unistd::Pid::from_raw(0), &one).unwrap();
    }
    fn mono_ms() -> f64 {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
        t.tv_sec() as f64 * 1e3 + t.tv_nsec() as f64 / 1e6
    }
    // Two ticks at the coarsest HZ a kernel builds with (100).
    const TOLERANCE_MS: f64 = 20.0;
    let pairs: Vec<(usize, usize)> = if cpus.len() < 2 {
        eprintln!("only cpu {cpus:?} is usable: reader and waiter share it");
        cpus.iter().map(|&c| (c, c)).collect()
    } else {
        cpus.iter()
            .flat_map(|&r| cpus.iter().filter(move |&&w| w != r).map(move |&w| (r, w)))
            .collect()
    };
    for (reader, waiter) in pairs {
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::spawn(move || {
            pin(waiter);
            let mut theirs = theirs;
            let tid = nix::unistd::gettid().as_raw() as u32;
            tx.send((tid, mono_ms())).unwrap();
            let mut byte = [0u8; 1];
            let _ = theirs.read(&mut byte);
        });
        let (tid, since) = rx.recv_timeout(10 * SEC).unwrap();
        sched_setaffinity(me, &allowed).unwrap();
        let clocks = proc::task_clocks();
        pin(reader);
        std::thread::sleep(Duration::from_millis(1200));
        let before = mono_ms();
        let p = proc::process_at(
            std::process::id(),
            selfheal_core::proc::Detail::Full,
            &clocks,
        )
        .unwrap();
        let after = mono_ms();
        let t = p.threads.iter().find(|t| t.tid == tid).expect("the waiter");
        let age = t.idle_ms.unwrap_or_else(|| panic!("no age: {:?}", p.gaps)) as f64;
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        let ran_on = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split(' ')
            .nth(37)
            .unwrap()
            .to_string();
        eprintln!(
            "reader on cpu {reader}, waiter on cpu {ran_on} (pinned {waiter}): age {age} ms, true {:.1}-{:.1} ms",
            before - since,
            after - since
        );
        assert_eq!(
            ran_on,
            waiter.to_string(),
            "the waiter ran where it was pinned"
        );
        assert!(
            age >= before - since - TOLERANCE_MS && age <= after - since + TOLERANCE_MS,
            "reader on cpu {reader}, waiter on cpu {waiter}: age {age} ms, true {:.1}-{:.1} ms",
            before - since,
            after - since
        );
        // A reader that may not run on the waiter's CPU cannot take that
        // CPU's clock: the age is a gap naming the CPU, not a number.
        if reader != waiter {
            let pinned = proc::task_clocks();
            let p = proc::process_at(
                std::process::id(),
                selfheal_core::proc::Detail::Full,
                &pinned,
            )
            .unwrap();
            let t = p.threads.iter().find(|t| t.tid == tid).expect("the waiter");
            assert_eq!(t.idle_ms, None, "{:?}", pinned.cpus);
            let gap = format!(
                "tid {tid}: how long it has waited is unknown: it last ran on cpu {waiter}"
            );
            assert!(p.gaps.iter().any(|g| g.starts_with(&gap)), "{:?}", p.gaps);
        }
        std::io::Write::write_all(&mut ours, b"x").unwrap();
        handle.join().unwrap();
        sched_setaffinity(me, &allowed).unwrap();
    }
}
