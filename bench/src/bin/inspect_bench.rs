//! `selfheal inspect --json` of a big agent, against the tools a person
//! would reach for over the same process, in the same run:
//! `ps -L -o pid,tid,stat,wchan -p PID` plus `ss -tinpe`.
//!
//! The agent has `--threads` threads blocked in reads and `--sockets` TCP
//! connections (to a listener in this process, so the host holds twice as
//! many). Prints medians of `--runs` runs, the ratio, and selfheal's peak RSS
//! (from `wait4`). Needs root for the kernel stacks and eBPF.

use std::{io::Write as _, process::Command};

use bench::{Bins, accept_n, fat_agent, set_nofile};
use tests::timed;

/// `inspect` of one agent with many threads and connections, against
/// `ps` + `ss`.
#[derive(clap::Parser)]
#[command(name = "inspect-bench")]
struct Args {
    /// Threads of the agent.
    #[arg(long, default_value_t = 200)]
    threads: usize,
    /// Connections of the agent.
    #[arg(long, default_value_t = 2000)]
    sockets: usize,
    /// Timed runs of each command (the median is printed).
    #[arg(long, default_value_t = 7)]
    runs: usize,
}

fn main() {
    let Args {
        threads,
        sockets,
        runs,
    } = clap::Parser::parse();
    let Bins { selfheal, peer } = Bins::find();

    let _ = set_nofile(sockets as u64 + 256);
    let (addr, accepter) = accept_n(sockets);
    let mut agent = fat_agent(&peer, &addr.to_string(), threads, sockets);
    let _server_ends = accepter.join().expect("accepter");
    let pid = agent.id().to_string();
    std::thread::sleep(std::time::Duration::from_millis(500));

    println!(
        "inspect-bench: agent pid {pid} with {threads} blocked threads and {sockets} TCP connections; medians of {runs} runs"
    );
    let time = |cmd: &mut Command| {
        let mut v: Vec<(f64, i64)> = (0..runs).map(|_| timed(cmd)).collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    };
    let (with_ebpf, rss_ebpf) =
        time(Command::new(&selfheal).args(["inspect", "--json", "--pid", &pid]));
    let (no_ebpf, rss_plain) =
        time(Command::new(&selfheal).args(["inspect", "--json", "--no-ebpf", "--pid", &pid]));
    let (ps, _) = time(Command::new("ps").args(["-L", "-o", "pid,tid,stat,wchan", "-p", &pid]));
    let (ss, _) = time(Command::new("ss").args(["-tinpe"]));
    let peer_total = ps + ss;
    println!(
        "  ps -L -o pid,tid,stat,wchan -p PID   {:>8.1} ms",
        ps * 1e3
    );
    println!(
        "  ss -tinpe                            {:>8.1} ms",
        ss * 1e3
    );
    println!(
        "  both together                        {:>8.1} ms",
        peer_total * 1e3
    );
    println!(
        "  selfheal inspect --json --no-ebpf    {:>8.1} ms  ratio {:.2} (goal <= 0.5)  peak RSS {} KiB",
        no_ebpf * 1e3,
        no_ebpf / peer_total,
        rss_plain
    );
    println!(
        "  selfheal inspect --json (eBPF too)   {:>8.1} ms  ratio {:.2}  peak RSS {} KiB",
        with_ebpf * 1e3,
        with_ebpf / peer_total,
        rss_ebpf
    );
    let _ = agent.stdin.take().map(|mut s| s.write_all(b""));
    let _ = agent.kill();
    let _ = agent.wait();
}
