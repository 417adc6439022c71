//! Receive-path overhead of the eBPF tracer, measured against itself
//! detached in the same run.
//!
//! One sender (this process) streams `--bytes` over loopback TCP to one
//! receiver process that reads in 4 KiB `read`s. Three modes, interleaved
//! over `--rounds` rounds, medians reported:
//!
//! - `detached`: no tracer;
//! - `watched`: tracer attached, the receiver in its pid filter;
//! - `unwatched`: tracer attached, watching another (idle) process.
//!
//! Prints throughput per mode, the ratios to `detached`, and the added cost
//! per receive in nanoseconds — from wall time, and from the receiver's own
//! CPU time, which is where the programs run and which is far less noisy —
//! for every strategy this kernel attaches. The sender and the receiver are
//! pinned to different CPUs where there are two.
//!
//! A second benchmark, ping-pong, sends one byte back and forth with an echo
//! process whose every receive blocks: each round trip is two sleeps in a
//! receive and two context switches, the path the blocked-receive hooks
//! (and `sched_switch`, for the tp_btf strategy) pay on. It runs first
//! against `selfheal helper` as it ships (task iterators pinned, no
//! tracer), started anew for each round, alternated with no helper. Needs
//! root.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Command, Stdio},
    time::Instant,
};

use selfheal::ebpf::{Tracer, TracerOptions};
use selfheal_core::ebpf::strategy::Strategy;

const READ_SIZE: usize = 4096;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("receiver") => return receiver(&args[2], args[3].parse().expect("bytes")),
        Some("echo") => return echo(&args[2]),
        _ => {}
    }
    let mut bytes: u64 = 1 << 30;
    let mut rounds = 7;
    let mut strategies: Vec<Strategy> = Strategy::ALL.to_vec();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bytes" => bytes = it.next().and_then(|v| v.parse().ok()).expect("--bytes N"),
            "--rounds" => rounds = it.next().and_then(|v| v.parse().ok()).expect("--rounds N"),
            "--strategy" => {
                strategies = vec![
                    it.next()
                        .and_then(|v| Strategy::from_name(v))
                        .expect("--strategy NAME"),
                ]
            }
            other => {
                eprintln!(
                    "usage: recv-bench [--bytes N] [--rounds N] [--strategy NAME] (unknown {other})"
                );
                std::process::exit(3);
            }
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("recv-bench: needs root to load eBPF");
        std::process::exit(1);
    }
    println!(
        "recv-bench: {} MiB over loopback TCP in {} B reads, {rounds} rounds per mode, medians",
        bytes >> 20,
        READ_SIZE
    );
    bench_shipped_helper(rounds);
    // Keep an idle process around for the `unwatched` mode's pid filter.
    let mut idle = Command::new("sleep")
        .arg("3600")
        .spawn()
        .expect("spawn sleep");
    for strategy in strategies {
        match Tracer::attach(&TracerOptions {
            strategies: vec![strategy],
            ..TracerOptions::default()
        }) {
            Ok(t) => drop(t),
            Err(e) => {
                println!("\n{strategy}: not available here ({e})");
                continue;
            }
        }
        bench_strategy(strategy, bytes, rounds, idle.id());
        bench_pingpong(strategy, rounds, idle.id());
    }
    let _ = idle.kill();
    let _ = idle.wait();
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Detached,
    Watched,
    Unwatched,
}

fn bench_strategy(strategy: Strategy, bytes: u64, rounds: usize, idle_pid: u32) {
    let modes = [Mode::Detached, Mode::Watched, Mode::Unwatched];
    let mut secs: [Vec<f64>; 3] = Default::default();
    let mut cpu_per_read: [Vec<f64>; 3] = Default::default();
    let mut reads = 0;
    for _ in 0..rounds {
        for (i, &mode) in modes.iter().enumerate() {
            let run = one_run(strategy, mode, bytes, idle_pid);
            secs[i].push(run.wall_secs);
            cpu_per_read[i].push(run.cpu_secs * 1e9 / run.reads as f64);
            reads = run.reads;
        }
    }
    let med: Vec<f64> = secs.iter_mut().map(|v| median(v)).collect();
    let cpu: Vec<f64> = cpu_per_read.iter_mut().map(|v| median(v)).collect();
    let gib = |s: f64| bytes as f64 / s / (1u64 << 30) as f64;
    println!("\nstrategy {strategy} ({reads} reads per run)");
    println!(
        "  {:<10} {:>8} {:>9} {:>14} {:>14} {:>14}",
        "mode", "GiB/s", "vs off", "wall +ns/recv", "cpu ns/recv", "cpu +ns/recv"
    );
    for (i, name) in ["detached", "watched", "unwatched"].iter().enumerate() {
        let ratio = med[0] / med[i];
        let added_ns = (med[i] - med[0]) * 1e9 / reads as f64;
        println!(
            "  {name:<10} {:>8.3} {:>8.1}% {:>14.0} {:>14.0} {:>14.0}",
            gib(med[i]),
            ratio * 100.0,
            added_ns,
            cpu[i],
            cpu[i] - cpu[0]
        );
    }
    let loss = |i: usize| (1.0 - med[0] / med[i]) * 100.0;
    println!(
        "  throughput loss: watched {:.2}% (goal <= 3%), unwatched {:.2}% (goal <= 1%)",
        loss(1),
        loss(2)
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Run {
    wall_secs: f64,
    cpu_secs: f64,
    reads: u64,
}

/// Pins the calling thread to `cpu` when the machine has more than one.
fn pin(cpu: usize) {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays in bounds (cpu < n).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu % n, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn cpu_time_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// One transfer, timed by the receiver.
fn one_run(strategy: Strategy, mode: Mode, bytes: u64, idle_pid: u32) -> Run {
    let mut tracer = (mode != Mode::Detached).then(|| {
        Tracer::attach(&TracerOptions {
            strategies: vec![strategy],
            ..TracerOptions::default()
        })
        .expect("attach")
    });
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap().to_string();
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["receiver", &addr, &bytes.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn receiver");
    if let Some(t) = tracer.as_mut() {
        let pid = if mode == Mode::Watched {
            child.id()
        } else {
            idle_pid
        };
        t.watch(pid, 0).expect("watch");
    }
    let (mut s, _) = l.accept().expect("accept");
    // Start the receiver's clock only now that the tracer is in place.
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("go");
    pin(0);
    let chunk = vec![0u8; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..n]).expect("send");
        left -= n as u64;
    }
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("receiver output");
    let _ = child.wait();
    let mut it = out.split_whitespace();
    let mut next = || {
        it.next()
            .and_then(|v| v.parse::<f64>().ok())
            .expect("receiver output")
    };
    Run {
        wall_secs: next(),
        cpu_secs: next(),
        reads: next() as u64,
    }
}

/// The receiving process: waits for "go", reads `bytes`, prints
/// `<wall seconds> <cpu seconds> <reads>`.
fn receiver(addr: &str, bytes: u64) {
    pin(1);
    let mut s = TcpStream::connect(addr).expect("connect");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("go");
    let mut buf = [0u8; READ_SIZE];
    let mut got = 0u64;
    let mut reads = 0u64;
    let start = Instant::now();
    let cpu0 = cpu_time_secs();
    while got < bytes {
        let n = s.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        got += n as u64;
        reads += 1;
    }
    let wall = start.elapsed().as_secs_f64();
    println!("{wall} {} {reads}", cpu_time_secs() - cpu0);
}

const PINGS: u32 = 20_000;

/// Round trips per second with an echo process, detached / echo watched /
/// another process watched.
fn bench_pingpong(strategy: Strategy, rounds: usize, idle_pid: u32) {
    let modes = [Mode::Detached, Mode::Watched, Mode::Unwatched];
    let mut us: [Vec<f64>; 3] = Default::default();
    for _ in 0..rounds {
        for (i, &mode) in modes.iter().enumerate() {
            us[i].push(pingpong_run(strategy, mode, idle_pid));
        }
    }
    let med: Vec<f64> = us.iter_mut().map(|v| median(v)).collect();
    println!("  ping-pong, {PINGS} one-byte round trips, every receive blocks:");
    for (i, name) in ["detached", "watched", "unwatched"].iter().enumerate() {
        println!(
            "  {name:<10} {:>8.2} us/round trip {:>8.1}% of detached rate  {:>+8.0} ns/round trip",
            med[i],
            med[0] / med[i] * 100.0,
            (med[i] - med[0]) * 1000.0
        );
    }
}

/// One ping-pong run; microseconds per round trip.
fn pingpong_run(strategy: Strategy, mode: Mode, idle_pid: u32) -> f64 {
    let mut tracer = (mode != Mode::Detached).then(|| {
        Tracer::attach(&TracerOptions {
            strategies: vec![strategy],
            ..TracerOptions::default()
        })
        .expect("attach")
    });
    round_trips(|echo| {
        if let Some(t) = tracer.as_mut() {
            let pid = if mode == Mode::Watched {
                echo
            } else {
                idle_pid
            };
            t.watch(pid, 0).expect("watch");
        }
    })
}

/// `PINGS` round trips with an echo process (`started` is given its pid
/// before the first); microseconds per round trip.
fn round_trips(started: impl FnOnce(u32)) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap().to_string();
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .args(["echo", &addr])
        .spawn()
        .expect("spawn echo");
    started(child.id());
    let (mut s, _) = l.accept().expect("accept");
    s.set_nodelay(true).expect("nodelay");
    pin(0);
    let mut b = [0u8; 1];
    let start = Instant::now();
    for _ in 0..PINGS {
        s.write_all(&b).expect("ping");
        s.read_exact(&mut b).expect("pong");
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / f64::from(PINGS);
    drop(s);
    let _ = child.wait();
    us
}

/// The tax of `selfheal helper` as it ships (task iterators pinned, no
/// tracer) on every process of the host: ping-pong with no helper and
/// with one running, alternated, each round a helper started anew.
fn bench_shipped_helper(rounds: usize) {
    let bench::Bins { selfheal, .. } = bench::Bins::find();
    let dir = std::env::temp_dir().join(format!("selfheal-recv-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work dir");
    let sock = dir.join("helper.sock");
    let mut us: [Vec<f64>; 2] = Default::default();
    for _ in 0..rounds {
        us[0].push(round_trips(|_| {}));
        let mut helper = Command::new(&selfheal)
            .args(["helper", "--socket"])
            .arg(&sock)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start selfheal helper");
        let up = (0..400).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(25));
            std::os::unix::net::UnixStream::connect(&sock).is_ok()
        });
        if !up {
            let _ = helper.kill();
            let _ = helper.wait();
            println!(
                "
selfheal helper (as shipped): did not answer in 10 s; not measured"
            );
            return;
        }
        us[1].push(round_trips(|_| {}));
        let _ = helper.kill();
        let _ = helper.wait();
        let _ = std::fs::remove_file(&sock);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let med: Vec<f64> = us.iter_mut().map(|v| median(v)).collect();
    println!(
        "
selfheal helper as shipped (task iterators, no tracer): ping-pong, {PINGS} one-byte round trips"
    );
    for (i, name) in ["no helper", "helper"].iter().enumerate() {
        println!("  {name:<10} {:>8.2} us/round trip", med[i]);
    }
    println!(
        "  tax of the helper: {:+.2}% per round trip, {:+.0} ns (goal <= 0.5%)",
        (med[1] / med[0] - 1.0) * 100.0,
        (med[1] - med[0]) * 1000.0
    );
}

/// The echo process: returns every byte until the peer closes.
fn echo(addr: &str) {
    pin(1);
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let mut b = [0u8; 1];
    while matches!(s.read(&mut b), Ok(1)) {
        if s.write_all(&b).is_err() {
            break;
        }
    }
}
