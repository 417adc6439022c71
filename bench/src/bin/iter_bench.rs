//! The kernel's task iterators (`selfheal::ebpf::iter`) against procfs, in
//! one run: for `--agents` processes of `--threads` threads blocked in
//! reads, one iterator pass per process (link, read, parse; threads and
//! socket fds) against reading every thread's `/proc/PID/task/TID/stat`
//! and `syscall` and every fd link (one open, read, close each, as the C
//! floor `bench/src/diag_floor.c` reads its files); beside them the same
//! passes with each `tcp_sock` field read alone (one helper call a field,
//! not a window at a time), and one pass over the whole host. Each agent
//! holds `--sockets` connections; its threads all read the first. They
//! alternate, `--runs` times each; prints their medians, their ratios,
//! and the one-time cost of loading the programs. Needs root.

use std::{
    io::Read as _,
    os::fd::{AsFd as _, OwnedFd},
    process::Child,
    time::Instant,
};

use bench::{Bins, accept_n, fat_agent};
use selfheal::ebpf::iter;

/// One task-iterator pass against each thread's procfs reads, over agents
/// whose threads are blocked in `recvfrom`. Needs root.
#[derive(clap::Parser)]
#[command(name = "iter-bench")]
struct Args {
    /// Agents to start.
    #[arg(long, default_value_t = 100)]
    agents: usize,
    /// Threads per agent.
    #[arg(long, default_value_t = 50)]
    threads: usize,
    /// Connections per agent (its threads all read the first).
    #[arg(long, default_value_t = 1)]
    sockets: usize,
    /// Timed runs of each way (the median is printed).
    #[arg(long, default_value_t = 11)]
    runs: usize,
}

fn main() {
    let Args {
        agents,
        threads,
        sockets,
        runs,
    } = clap::Parser::parse();
    let Bins { peer, .. } = Bins::find();

    let (addr, accepter) = accept_n(agents * sockets);
    let addr = addr.to_string();
    let mut children: Vec<Child> = (0..agents)
        .map(|_| fat_agent(&peer, &addr, threads, sockets))
        .collect();
    let _server_ends = accepter.join().expect("accepter");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let pids: Vec<u32> = children.iter().map(Child::id).collect();

    let start = Instant::now();
    let mut task_iter = iter::load().unwrap_or_else(|e| {
        eprintln!("iter-bench: {e}");
        std::process::exit(1);
    });
    let load = start.elapsed().as_secs_f64();

    let mut alone = iter::load_reading(iter::TcpReads::Alone).unwrap_or_else(|e| {
        eprintln!("iter-bench: {e}");
        std::process::exit(1);
    });
    let pidfds: Vec<OwnedFd> = pids
        .iter()
        .map(|&p| selfheal::sys::pidfd::pidfd_open(p).expect("pidfd"))
        .collect();
    let mut passes = Vec::new();
    let mut reads = Vec::new();
    let mut hosts = Vec::new();
    let mut alones = Vec::new();
    let (mut seen_iter, mut seen_proc, mut seen_host) = (0, 0, 0);
    for _ in 0..runs {
        let start = Instant::now();
        seen_iter = pidfds
            .iter()
            .map(|fd| task_iter.process(fd.as_fd()).expect("an iterator pass"))
            .map(|p| p.threads.len())
            .sum();
        passes.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        for fd in &pidfds {
            alone.process(fd.as_fd()).expect("an iterator pass");
        }
        alones.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        seen_proc = procfs_reads(&pids);
        reads.push(start.elapsed().as_secs_f64());
        if iter::in_initial_pid_namespace() {
            let start = Instant::now();
            seen_host = task_iter
                .host()
                .expect("a host pass")
                .processes
                .values()
                .map(|p| p.threads.len())
                .sum();
            hosts.push(start.elapsed().as_secs_f64());
        }
    }
    let (pass, read) = (median(&mut passes), median(&mut reads));
    println!(
        "iter-bench: {agents} agents of {threads} threads blocked in reads; medians of {runs} runs"
    );
    println!(
        "  loading the iterator programs (once): {:.1} ms",
        load * 1e3
    );
    println!(
        "  iterator passes (link, read, parse; threads and sockets): {:.2} ms, {seen_iter} threads",
        pass * 1e3
    );
    println!(
        "  each thread's /proc stat + syscall, each fd link: {:.2} ms, {seen_proc} threads",
        read * 1e3
    );
    println!("  iterator / procfs: {:.3}", pass / read);
    let each = median(&mut alones);
    println!(
        "  the same passes, each tcp_sock field read alone (not a window at a time): {:.2} ms; windows / alone: {:.3}",
        each * 1e3,
        pass / each
    );
    if !hosts.is_empty() {
        let host = median(&mut hosts);
        println!(
            "  one pass over the whole host (link each once, read, cut by process): {:.2} ms, {seen_host} threads; host / per-process passes: {:.3}",
            host * 1e3,
            host / pass
        );
    }
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Reads every thread's `stat` and `syscall` of `pids`, one open, read and
/// close each, and every fd link; returns how many threads it read.
fn procfs_reads(pids: &[u32]) -> usize {
    let mut buf = [0u8; 1024];
    let mut read_small = |path: &str| {
        std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut buf))
            .unwrap_or(0)
    };
    let mut threads = 0;
    let mut bytes = 0;
    for pid in pids {
        if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            for fd in fds.flatten() {
                bytes += std::fs::read_link(fd.path()).map_or(0, |l| l.as_os_str().len());
            }
        }
        let dir = format!("/proc/{pid}/task");
        let Ok(tasks) = std::fs::read_dir(&dir) else {
            continue;
        };
        for t in tasks.flatten() {
            let tid = t.file_name();
            let tid = tid.to_string_lossy();
            bytes += read_small(&format!("{dir}/{tid}/stat"));
            bytes += read_small(&format!("{dir}/{tid}/syscall"));
            threads += 1;
        }
    }
    std::hint::black_box(bytes);
    threads
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
