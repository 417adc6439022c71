//! A test peer: a TCP client that waits in a blocking `read` (as a worker
//! thread would), a tokio client that waits in epoll (as an event loop
//! would), or a server the test drives over stdin. It reports on stdout, one
//! line per event, so the test knows its pid, tid and socket.
//!
//! ```text
//! recv-peer client ADDR [--once]   blocking reads; --once: read once, then sleep (not in a read)
//! recv-peer tokio-client ADDR      event-loop reads
//! recv-peer connect ADDR           one blocking connect: `connecting at_ms=M`, then
//!                                  `connected at_ms=M` or `failed at_ms=M error=E`
//!                                  (M: CLOCK_MONOTONIC ms); then waits for stdin to close
//!
//! Clients connect, print `ready`, then wait for one line on stdin before
//! their first read, so the test can start watching them first.
//! recv-peer server ADDR            accept one; stdin "send N" writes N bytes, "close" exits
//! recv-peer threads ADDR           one thread blocked in a read, one in futex, one spinning
//! recv-peer zombies N              N children that exit and are never reaped
//! recv-peer sink ADDR              accept one and never read (the sender's data piles up)
//! recv-peer beat ADDR MS           accept one, send a byte every MS milliseconds until stdin closes
//! recv-peer fat ADDR THREADS SOCKETS  THREADS threads blocked in reads, SOCKETS connections in all
//! recv-peer forks N [PAD…]         N children sharing its argv (PAD: any size), waiting on stdin
//!                                  (child K exits K ms after it closes)
//! recv-peer rusage CMD [ARG…]     runs CMD (output discarded), prints `rusage wall=S user=S sys=S maxrss=KIB`
//!                                  (a child of this small process: its peak RSS is CMD's own)
//! recv-peer limits CONNS EPOLL ZOMBIES NFDS  CONNS loopback connections (both ends held), EPOLL
//!                                  of their fds in one thread's epoll_wait, one thread in
//!                                  poll(NFDS), ZOMBIES children never reaped
//! ```
//! Lines: `ready pid=P tid=T inode=I local=A remote=B`, `got N`, `listening A`, `sent N`.

use std::{
    io::{BufRead as _, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::fd::{AsRawFd as _, FromRawFd as _},
    process::ExitCode,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["client", addr] => client(addr, false),
        ["client", addr, "--once"] => client(addr, true),
        ["tokio-client", addr] => tokio_client(addr),
        ["connect", addr] => connect(addr),
        ["server", addr] => server(addr),
        ["threads", addr] => threads(addr),
        ["zombies", n] => zombies(n),
        ["headless"] => headless(),
        ["sink", addr] => sink(addr),
        ["beat", addr, ms] => beat(addr, ms),
        ["beats", addr, ms] => beats(addr, ms),
        ["fat", addr, threads, sockets] => fat(addr, threads, sockets),
        ["reconnecting", addr] => reconnecting(addr),
        ["acceptor", addr] => acceptor(addr),
        ["forks", n, ..] => forks(n),
        ["rusage", cmd @ ..] if !cmd.is_empty() => rusage(cmd),
        ["limits", conns, epoll, zombies, nfds] => limits(conns, epoll, zombies, nfds),
        _ => Err("usage: recv-peer client ADDR [--once] | tokio-client ADDR | server ADDR | threads ADDR | zombies N | headless | sink ADDR".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("recv-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, String>;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn inode_of(fd: i32) -> u64 {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .and_then(|t| {
            t.to_string_lossy()
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Announces the connection, then waits for the test's go-ahead on stdin
/// (a line `go`; other lines are read and ignored, so a test can make the
/// thread block in a pipe read more than once first).
fn ready(
    fd: i32,
    local: std::io::Result<std::net::SocketAddr>,
    remote: std::io::Result<std::net::SocketAddr>,
) -> Result<()> {
    let local = local.map_err(|e| e.to_string())?;
    let remote = remote.map_err(|e| e.to_string())?;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    say(&format!(
        "ready pid={} tid={tid} inode={} local={local} remote={remote}",
        std::process::id(),
        inode_of(fd)
    ));
    let mut stdin = std::io::stdin().lock();
    loop {
        let mut line = String::new();
        match stdin.read_line(&mut line) {
            Ok(n) if n > 0 && line.trim() != "go" => continue,
            _ => return Ok(()),
        }
    }
}

/// One blocking connect, timed on both ends; then held until stdin closes.
fn connect(addr: &str) -> Result<()> {
    say(&format!("connecting at_ms={}", tests::monotonic_ms()));
    let held = match TcpStream::connect(addr) {
        Ok(s) => {
            say(&format!("connected at_ms={}", tests::monotonic_ms()));
            Some(s)
        }
        Err(e) => {
            say(&format!("failed at_ms={} error={e}", tests::monotonic_ms()));
            None
        }
    };
    let mut line = String::new();
    while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
        line.clear();
    }
    drop(held);
    Ok(())
}

/// Says a read's byte count: whether it was the end (0).
fn got(n: usize) -> bool {
    say(&format!("got {n}"));
    n == 0
}

fn client(addr: &str, once: bool) -> Result<()> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    ready(s.as_raw_fd(), s.local_addr(), s.peer_addr())?;
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).map_err(|e| format!("read: {e}"))?;
        if got(n) {
            return Ok(());
        }
        if once {
            // Stay alive, out of any receive, until the test closes stdin.
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            return Ok(());
        }
    }
}

fn tokio_client(addr: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        use tokio::io::AsyncReadExt as _;
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        ready(s.as_raw_fd(), s.local_addr(), s.peer_addr())?;
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
            if got(n) {
                return Ok(());
            }
        }
    })
}

fn server(addr: &str) -> Result<()> {
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    say(&format!(
        "listening {}",
        l.local_addr().map_err(|e| e.to_string())?
    ));
    let (mut s, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["send", n] => {
                let n: usize = n.parse().map_err(|_| format!("bad count {n}"))?;
                s.write_all(&vec![b'x'; n])
                    .map_err(|e| format!("write: {e}"))?;
                say(&format!("sent {n}"));
            }
            ["close"] => return Ok(()),
            other => return Err(format!("unknown command {other:?}")),
        }
    }
    Ok(())
}

/// A process with three threads in three different waits: `recv-wait`
/// blocked in a read on a connection to ADDR, `futex-wait` parked on a
/// condition variable, `spin` burning CPU. Prints
/// `ready pid=P recv=T futex=T spin=T inode=I`, then runs until stdin closes.
fn threads(addr: &str) -> Result<()> {
    use std::sync::{Arc, Condvar, Mutex, mpsc};
    let s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    let inode = inode_of(s.as_raw_fd());
    let (tx, rx) = mpsc::channel();
    let tid = || {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    };
    let t1 = tx.clone();
    std::thread::Builder::new()
        .name("recv-wait".into())
        .spawn(move || {
            let _ = t1.send(("recv", tid()));
            let mut s = s;
            let _ = s.read(&mut [0u8; 64]);
        })
        .map_err(|e| e.to_string())?;
    let t2 = tx.clone();
    let pair = Arc::new((Mutex::new(()), Condvar::new()));
    std::thread::Builder::new()
        .name("futex-wait".into())
        .spawn(move || {
            let _ = t2.send(("futex", tid()));
            let (lock, cv) = &*pair;
            let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
            let _unused = cv.wait(guard);
        })
        .map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("spin".into())
        .spawn(move || {
            let _ = tx.send(("spin", tid()));
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        })
        .map_err(|e| e.to_string())?;
    let mut tids = std::collections::BTreeMap::new();
    for _ in 0..3 {
        let (k, v) = rx.recv().map_err(|e| e.to_string())?;
        tids.insert(k, v);
    }
    say(&format!(
        "ready pid={} recv={} futex={} spin={} inode={inode}",
        std::process::id(),
        tids["recv"],
        tids["futex"],
        tids["spin"]
    ));
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(0);
}

/// Starts N children that exit at once and never reaps them. Prints
/// `ready pid=P zombies=N` once all N are zombies, then waits for stdin to
/// close.
/// Says `ready PID`, then its main thread ends while another sleeps on:
/// the process's leader a zombie, the process alive.
fn headless() -> Result<()> {
    std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(600)));
    println!("ready {}", std::process::id());
    std::io::stdout()
        .flush()
        .map_err(|e| format!("stdout: {e}"))?;
    // The thread's own `exit` (not `exit_group`, not `pthread_exit`, whose
    // unwinding through Rust's frames aborts the process).
    // SAFETY: ends this thread only; the other keeps the process alive.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    Err("the main thread's exit returned".into())
}

fn zombies(n: &str) -> Result<()> {
    let n: usize = n.parse().map_err(|_| format!("bad count {n}"))?;
    let mut children = Vec::new();
    for _ in 0..n {
        let child = std::process::Command::new("true")
            .spawn()
            .map_err(|e| format!("spawn: {e}"))?;
        children.push(child.id());
    }
    // Wait (bounded) until every child has exited and become a zombie.
    for _ in 0..500 {
        let zombies = children
            .iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.rsplit(") ").next().is_some_and(|r| r.starts_with('Z')))
            })
            .count();
        if zombies == n {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    say(&format!("ready pid={} zombies={n}", std::process::id()));
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    // `children` are never waited for: that is the point.
    std::mem::forget(children);
    Ok(())
}

/// Accepts one connection and never reads from it.
fn sink(addr: &str) -> Result<()> {
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    say(&format!(
        "listening {}",
        l.local_addr().map_err(|e| e.to_string())?
    ));
    let (_s, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
    say("accepted");
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    Ok(())
}

/// A big agent: `sockets` connections to ADDR and `threads` threads blocked
/// in reads on them (round robin). Prints `ready pid=P`, then runs
/// until stdin closes.
fn fat(addr: &str, threads: &str, sockets: &str) -> Result<()> {
    let threads: usize = threads
        .parse()
        .map_err(|_| format!("bad count {threads}"))?;
    let sockets: usize = sockets
        .parse()
        .map_err(|_| format!("bad count {sockets}"))?;
    // Every reader thread holds a duplicate of its socket.
    raise_nofile((sockets + threads) as u64 + 256);
    let mut conns = Vec::with_capacity(sockets);
    for _ in 0..sockets {
        conns.push(TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?);
    }
    let mut readers = Vec::new();
    for s in conns
        .iter()
        .cycle()
        .take(if conns.is_empty() { 0 } else { threads })
    {
        let mut s = s.try_clone().map_err(|e| e.to_string())?;
        readers.push(std::thread::spawn(move || {
            let _ = s.read(&mut [0u8; 64]);
        }));
    }
    say(&format!("ready pid={}", std::process::id()));
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(0);
}

/// Runs `cmd` with its output discarded and prints its wall time, CPU
/// time and peak RSS. Run from this small process, so the peak RSS the
/// kernel keeps across `exec` (the forked copy's) is not a big parent's.
fn rusage(cmd: &[&str]) -> Result<()> {
    let start = std::time::Instant::now();
    let status = std::process::Command::new(cmd[0])
        .args(&cmd[1..])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("run {}: {e}", cmd[0]))?;
    let wall = start.elapsed().as_secs_f64();
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: fills a valid struct.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    say(&format!(
        "rusage wall={wall:.6} user={:.6} sys={:.6} maxrss={} code={}",
        secs(u.ru_utime),
        secs(u.ru_stime),
        u.ru_maxrss,
        status.code().unwrap_or(-1)
    ));
    Ok(())
}

/// `n` children that share this process's argv (copy-on-write), each
/// waiting for stdin to close, as the parent does; child `k` then exits
/// `k` ms later and the parent reaps it, so they vanish one by one over
/// `n` ms.
fn forks(n: &str) -> Result<()> {
    let n: usize = n.parse().map_err(|_| format!("bad count {n}"))?;
    for k in 0..n {
        // SAFETY: the child only reads stdin, sleeps and exits.
        match unsafe { libc::fork() } {
            -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
            0 => {
                let mut b = [0u8; 1];
                // SAFETY: reads into a valid buffer, then exits without unwinding.
                unsafe {
                    while libc::read(0, b.as_mut_ptr().cast(), 1) > 0 {}
                    // Staggered: child k exits k ms after stdin closes.
                    libc::usleep((k as u32).saturating_mul(1000));
                    libc::_exit(0);
                }
            }
            _ => {}
        }
    }
    say(&format!("ready pid={}", std::process::id()));
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    // Reap them as they exit (bounded: n of them), so they vanish rather
    // than linger as zombies.
    for _ in 0..n {
        // SAFETY: waits for our own children.
        if unsafe { libc::waitpid(-1, std::ptr::null_mut(), 0) } < 0 {
            break;
        }
    }
    Ok(())
}

/// An agent at its own limits: `conns` loopback connections whose both
/// ends it holds, `epoll` of those fds registered in one thread's
/// `epoll_wait`, one thread in `poll` on an `nfds`-entry array (its first
/// entry a socket, the rest -1), and `zombies` children that exit and are
/// never reaped. Runs until stdin closes.
fn limits(conns: &str, epoll: &str, zombies: &str, nfds: &str) -> Result<()> {
    let num = |s: &str| s.parse::<usize>().map_err(|_| format!("bad count {s}"));
    let (conns, epoll, zombies, nfds) = (num(conns)?, num(epoll)?, num(zombies)?, num(nfds)?);
    raise_nofile((2 * conns).max(nfds) as u64 + 256);
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let mut held = Vec::with_capacity(2 * conns);
    for _ in 0..conns {
        held.push(TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?);
        held.push(l.accept().map_err(|e| format!("accept: {e}"))?.0);
    }
    // SAFETY: epoll_create1 has no preconditions.
    let ep = unsafe { libc::epoll_create1(0) };
    if ep < 0 {
        return Err(format!(
            "epoll_create1: {}",
            std::io::Error::last_os_error()
        ));
    }
    for s in held.iter().take(epoll) {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: s.as_raw_fd() as u64,
        };
        // SAFETY: registers an open fd with a valid event.
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) };
    }
    std::thread::spawn(move || {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        loop {
            // SAFETY: waits into a valid array; nothing is ever ready.
            unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 8, -1) };
        }
    });
    let first = held.first().map_or(-1, |s| s.as_raw_fd());
    std::thread::spawn(move || {
        let mut fds = vec![
            libc::pollfd {
                fd: -1,
                events: libc::POLLIN,
                revents: 0
            };
            nfds.max(1)
        ];
        fds[0].fd = first;
        loop {
            // SAFETY: polls a valid array of `nfds` entries.
            unsafe { libc::poll(fds.as_mut_ptr(), nfds as libc::nfds_t, -1) };
        }
    });
    for _ in 0..zombies {
        // SAFETY: the child exits at once.
        match unsafe { libc::fork() } {
            -1 => return Err(format!("fork: {}", std::io::Error::last_os_error())),
            // SAFETY: exits without unwinding.
            0 => unsafe { libc::_exit(0) },
            _ => {}
        }
    }
    say(&format!("ready pid={}", std::process::id()));
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    std::process::exit(0);
}

/// Raises the open-file limit to at least `n` (root may raise the hard limit).
pub fn raise_nofile(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads a valid struct.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}

/// A server that sends one byte every `ms` milliseconds to the one client it
/// accepts (heartbeats, or a slow stream), until stdin closes or the client
/// goes away.
fn beat(addr: &str, ms: &str) -> Result<()> {
    let ms: u64 = ms.parse().map_err(|_| format!("bad interval {ms}"))?;
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    say(&format!(
        "listening {}",
        l.local_addr().map_err(|e| e.to_string())?
    ));
    let (mut s, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = std::sync::Arc::clone(&stop);
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stop2.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        // A write into a dead connection queues up; it never blocks for long
        // at one byte per beat.
        if s.write_all(b".").is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    Ok(())
}

/// A client with its own reconnect logic, as an agent would have: blocking
/// reads on a connection to ADDR; when a read fails it prints
/// `error os=ERRNO MESSAGE` (or `eof` when it returns 0), reconnects (up to
/// 50 attempts, 100 ms apart) and prints a new
/// `ready pid=P tid=T inode=I local=A remote=B` line. Every connection
/// holds the first one's fd number (moved there with `dup2` if the kernel
/// gave another), as an agent that reconnects in place does: the fd a
/// judgement named then holds a new socket. It does not wait for stdin.
/// Gives up after 100 reconnects.
fn reconnecting(addr: &str) -> Result<()> {
    let connect = || -> Result<TcpStream> {
        let mut last = String::new();
        for _ in 0..50 {
            match TcpStream::connect(addr) {
                Ok(s) => return Ok(s),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err(format!("connect {addr}: {last}"))
    };
    let announce = |s: &TcpStream| -> Result<()> {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        say(&format!(
            "ready pid={} tid={tid} inode={} local={} remote={}",
            std::process::id(),
            inode_of(s.as_raw_fd()),
            s.local_addr().map_err(|e| e.to_string())?,
            s.peer_addr().map_err(|e| e.to_string())?
        ));
        Ok(())
    };
    let mut buf = [0u8; 4096];
    let mut first_fd = None;
    for _ in 0..100 {
        let mut s = connect()?;
        let fd = s.as_raw_fd();
        match first_fd {
            None => first_fd = Some(fd),
            Some(first) if first != fd => {
                // SAFETY: `first` is closed (the previous connection was
                // dropped) and `fd` is ours: dup2 makes `first` a second
                // descriptor of this socket, which `s` then owns alone.
                s = unsafe {
                    if libc::dup2(fd, first) != first {
                        return Err(format!(
                            "dup2 {fd} onto {first}: {}",
                            std::io::Error::last_os_error()
                        ));
                    }
                    drop(s);
                    TcpStream::from_raw_fd(first)
                };
            }
            Some(_) => {}
        }
        announce(&s)?;
        loop {
            match s.read(&mut buf) {
                Ok(0) => {
                    say("eof");
                    break;
                }
                Ok(n) => say(&format!("got {n}")),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    say(&format!("error os={} {e}", e.raw_os_error().unwrap_or(0)));
                    break;
                }
            }
        }
    }
    Err("gave up after 100 reconnects".into())
}

/// A server that accepts every connection (up to 1000), prints
/// `accepted REMOTE` for each, and never sends or reads: a live but silent
/// peer.
fn acceptor(addr: &str) -> Result<()> {
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    say(&format!(
        "listening {}",
        l.local_addr().map_err(|e| e.to_string())?
    ));
    let mut held = Vec::new();
    for _ in 0..1000 {
        let (s, remote) = l.accept().map_err(|e| format!("accept: {e}"))?;
        say(&format!("accepted {remote}"));
        held.push(s);
    }
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    Ok(())
}

/// Like `beat`, for every client it accepts (up to 100): a dispatch server
/// whose runners reconnect. Runs until stdin closes.
fn beats(addr: &str, ms: &str) -> Result<()> {
    let ms: u64 = ms.parse().map_err(|_| format!("bad interval {ms}"))?;
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    say(&format!(
        "listening {}",
        l.local_addr().map_err(|e| e.to_string())?
    ));
    std::thread::spawn(move || {
        for s in l.incoming().take(100).flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                while s.write_all(b".").is_ok() {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                }
            });
        }
    });
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    Ok(())
}
