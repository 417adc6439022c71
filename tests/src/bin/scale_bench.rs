//! `scale-bench`: how `selfheal check` grows with the host's sockets and an
//! agent's threads, against `ps` + `ss` over the same processes in the same
//! run. Prints, per size, check's median time, its ratio to the peers and
//! its peak RSS, then the growth between sizes (the exponent of a power law
//! through the smallest and largest size, and the marginal cost per socket
//! or thread).
//!
//! - sockets: 100 agents (`recv-peer fat`, 2 blocked threads each) holding
//!   `--sockets` TCP connections in all (default 1000, 5000, 10000) to a
//!   listener in this process, so the host holds twice as many sockets;
//!   peers `ps -eLo pid,tid,stat,wchan` + `ss -tinp` (the whole host).
//! - threads: one agent with `--threads` threads blocked in reads (default
//!   200, 1000, 2000) on 20 connections; peers
//!   `ps -L -o pid,tid,stat,wchan -p PID` + `ss -tinp`.
//!
//! Each size is checked two ways: *quiet* (the agents' sockets match no
//! upstream: the timer's common case, minimal thread evidence) and
//! *suspect* (every socket is a provider connection silent past
//! `suspect_after`: the judge reads every thread's syscall and wait).
//! Needs root only to raise the open-file limit past its hard limit.

use std::{
    io::{BufRead as _, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use tests::timed;

/// Agents of the socket series.
const AGENTS: usize = 100;
/// Blocked threads per agent in the socket series.
const THREADS_PER_AGENT: usize = 2;
/// Connections of the one agent of the thread series.
const THREAD_AGENT_SOCKETS: usize = 20;

struct Args {
    sockets: Vec<usize>,
    threads: Vec<usize>,
    runs: usize,
}

fn main() {
    let mut args = Args {
        sockets: vec![1000, 5000, 10000],
        threads: vec![200, 1000, 2000],
        runs: 7,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let list = |v: Option<&String>| -> Vec<usize> {
            v.map(|v| {
                v.split(',')
                    .map(|n| n.parse().unwrap_or_else(|_| usage(a)))
                    .collect()
            })
            .filter(|l: &Vec<usize>| !l.is_empty() && l.iter().all(|n| *n > 0))
            .unwrap_or_else(|| usage(a))
        };
        match a.as_str() {
            "--sockets" => args.sockets = list(it.next()),
            "--threads" => args.threads = list(it.next()),
            "--runs" => {
                args.runs = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| usage(a))
            }
            other => usage(other),
        }
    }
    if args.sockets.iter().any(|s| s % AGENTS != 0 || *s > 50_000)
        || args.threads.iter().any(|t| *t > 10_000)
    {
        eprintln!(
            "scale-bench: --sockets must be multiples of {AGENTS} up to 50000, --threads up to 10000"
        );
        std::process::exit(3);
    }
    let bin_dir = std::env::current_exe()
        .expect("current_exe")
        .parent()
        .expect("dir")
        .to_path_buf();
    let selfheal: PathBuf =
        std::env::var("SELFHEAL_BIN").map_or_else(|_| bin_dir.join("selfheal"), Into::into);
    let peer = bin_dir.join("recv-peer");
    let work = std::env::temp_dir().join(format!("selfheal-scale-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");
    let most = args.sockets.iter().max().copied().unwrap_or(0);
    raise_nofile(most as u64 + THREAD_AGENT_SOCKETS as u64 + 1024);
    let bench = Bench {
        selfheal,
        peer,
        work: work.clone(),
        runs: args.runs,
    };

    println!(
        "scale-bench: selfheal check against ps + ss over the same processes; medians of {} runs",
        args.runs
    );
    println!(
        "\n  sockets: {AGENTS} agents of {THREADS_PER_AGENT} blocked threads; agent sockets (host sockets: twice as many)"
    );
    header();
    let mut rows = Vec::new();
    for &n in &args.sockets {
        rows.push(bench.sockets(n));
    }
    growth(&rows, "socket");

    println!("\n  threads: one agent with {THREAD_AGENT_SOCKETS} connections; blocked threads");
    header();
    let mut rows = Vec::new();
    for &n in &args.threads {
        rows.push(bench.threads(n));
    }
    growth(&rows, "thread");
    let _ = std::fs::remove_dir_all(&work);
}

fn usage(arg: &str) -> ! {
    eprintln!("usage: scale-bench [--sockets N,N,…] [--threads N,N,…] [--runs N] (bad {arg})");
    std::process::exit(3)
}

fn raise_nofile(n: u64) {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        eprintln!(
            "scale-bench: cannot raise the open-file limit to {n}: {} (run as root)",
            std::io::Error::last_os_error()
        );
        std::process::exit(2);
    }
}

struct Bench {
    selfheal: PathBuf,
    peer: PathBuf,
    work: PathBuf,
    runs: usize,
}

/// One size's measurements (seconds, KiB).
struct Row {
    n: usize,
    quiet: f64,
    suspect: f64,
    peers: f64,
}

/// Agents started for one size; killed on drop.
struct Agents {
    children: Vec<Child>,
    /// This process's ends of their connections.
    _ends: Vec<std::net::TcpStream>,
    listen: std::net::SocketAddr,
}

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Bench {
    /// Starts `agents` × `recv-peer fat` with `threads` blocked threads and
    /// `sockets` connections each, all to one listener here.
    fn agents(&self, agents: usize, threads: usize, sockets: usize) -> Agents {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let listen = l.local_addr().expect("addr");
        let total = agents * sockets;
        let accepter = std::thread::spawn(move || {
            (0..total)
                .map(|_| l.accept().expect("accept").0)
                .collect::<Vec<_>>()
        });
        let children = (0..agents)
            .map(|_| {
                let mut c = Command::new(&self.peer)
                    .args([
                        "fat",
                        &listen.to_string(),
                        &threads.to_string(),
                        &sockets.to_string(),
                    ])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("spawn an agent");
                let mut line = String::new();
                BufReader::new(c.stdout.take().expect("stdout"))
                    .read_line(&mut line)
                    .expect("ready");
                assert!(line.starts_with("ready"), "agent: {line:?}");
                c
            })
            .collect();
        let ends = accepter.join().expect("accepter");
        // Let every reader reach its read.
        std::thread::sleep(std::time::Duration::from_millis(300));
        Agents {
            children,
            _ends: ends,
            listen,
        }
    }

    fn sockets(&self, n: usize) -> Row {
        let agents = self.agents(AGENTS, THREADS_PER_AGENT, n / AGENTS);
        let pids: Vec<u32> = agents.children.iter().map(Child::id).collect();
        let ps = self.median(Command::new("ps").args(["-eLo", "pid,tid,stat,wchan"]));
        let ss = self.median(Command::new("ss").args(["-tinp"]));
        self.row(n, &pids, agents.listen, ps.0 + ss.0)
    }

    fn threads(&self, n: usize) -> Row {
        let agents = self.agents(1, n, THREAD_AGENT_SOCKETS);
        let pids: Vec<u32> = agents.children.iter().map(Child::id).collect();
        let pid = pids[0].to_string();
        let ps =
            self.median(Command::new("ps").args(["-L", "-o", "pid,tid,stat,wchan", "-p", &pid]));
        let ss = self.median(Command::new("ss").args(["-tinp"]));
        self.row(n, &pids, agents.listen, ps.0 + ss.0)
    }

    /// Checks `pids` quiet and suspect, prints the row.
    fn row(&self, n: usize, pids: &[u32], listen: std::net::SocketAddr, peers: f64) -> Row {
        let quiet_cfg = self.config(pids, None);
        let suspect_cfg = self.config(pids, Some(listen));
        self.verify(&quiet_cfg, pids.len(), None);
        self.verify(&suspect_cfg, pids.len(), Some("suspect"));
        let (quiet, quiet_rss) = self.median(&mut self.check(&quiet_cfg));
        let (suspect, suspect_rss) = self.median(&mut self.check(&suspect_cfg));
        println!(
            "  {n:>9}  {:>9.1} ms  {:>8.1} ms  {:>6.2}  {:>8.1} MiB  {:>8.1} ms  {:>6.2}  {:>8.1} MiB",
            peers * 1e3,
            quiet * 1e3,
            quiet / peers,
            quiet_rss as f64 / 1024.0,
            suspect * 1e3,
            suspect / peers,
            suspect_rss as f64 / 1024.0,
        );
        Row {
            n,
            quiet,
            suspect,
            peers,
        }
    }

    /// Runs one check and makes sure it judged every agent (and, with
    /// `reason`, gave each that reason): a bench of a check that failed
    /// early would measure nothing.
    fn verify(&self, config: &Path, agents: usize, reason: Option<&str>) {
        let out = self.check(config).output().expect("run selfheal check");
        let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert_eq!(
            lines.len(),
            agents,
            "check judged {} of {agents} agents (exit {:?}): {}",
            lines.len(),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(code) = reason {
            let without = lines
                .iter()
                .filter(|o| {
                    !o["reasons"]
                        .as_array()
                        .is_some_and(|r| r.iter().any(|r| r["code"] == code))
                })
                .count();
            assert_eq!(
                without, 0,
                "{without} agents without reason {code}: {:?}",
                lines[0]
            );
        }
    }

    fn check(&self, config: &Path) -> Command {
        let mut c = Command::new(&self.selfheal);
        c.args(["check", "--json", "--config"])
            .arg(config)
            .arg("--state-dir")
            .arg(self.work.join("state"))
            .arg("--snapshot-dir")
            .arg(self.work.join("snap"))
            // No helper: this measures check itself.
            .arg("--helper")
            .arg(self.work.join("no-helper.sock"));
        c
    }

    /// One agent per pid; with `suspect`, every connection to that address is
    /// a provider call already silent past `suspect_after`.
    fn config(&self, pids: &[u32], suspect: Option<std::net::SocketAddr>) -> PathBuf {
        let mut text = String::new();
        for (i, pid) in pids.iter().enumerate() {
            let (addr, thresholds) = match suspect {
                Some(a) => (
                    a.to_string(),
                    "[agent.thresholds]\nsuspect_after = \"1ms\"\n",
                ),
                None => (":1".to_string(), ""),
            };
            text.push_str(&format!(
                "[[agent]]\nname = \"a{i}\"\nmatch = {{ pid = {pid} }}\n\
                 [[agent.upstream]]\nrole = \"provider\"\naddr = \"{addr}\"\n{thresholds}"
            ));
        }
        let path = self.work.join(format!(
            "config-{}.toml",
            if suspect.is_some() {
                "suspect"
            } else {
                "quiet"
            }
        ));
        std::fs::write(&path, text).expect("write config");
        // A fresh history per size and way: no state carried between them.
        let _ = std::fs::remove_dir_all(self.work.join("state"));
        path
    }

    /// Median time and that run's peak RSS (KiB) over `runs` runs, after one
    /// run not counted (caches, the first state file).
    fn median(&self, cmd: &mut Command) -> (f64, i64) {
        let _ = timed(cmd);
        let mut v: Vec<(f64, i64)> = (0..self.runs).map(|_| timed(cmd)).collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2]
    }
}

fn header() {
    println!(
        "  {:>9}  {:>12}  {:>11}  {:>6}  {:>12}  {:>11}  {:>6}  {:>12}",
        "size", "ps + ss", "check quiet", "ratio", "peak RSS", "check suspect", "ratio", "peak RSS"
    );
}

/// How time grows: the exponent between the two largest sizes (where a
/// fixed start-up cost weighs least: 1 is linear, 2 quadratic), and the
/// marginal cost per item from the smallest size to the largest.
fn growth(rows: &[Row], item: &str) {
    let [first, .., prev, last] = rows else {
        return;
    };
    if last.n <= prev.n || last.n <= first.n {
        return;
    }
    let of = |f: fn(&Row) -> f64| {
        let k = (f(last) / f(prev)).ln() / (last.n as f64 / prev.n as f64).ln();
        let per = (f(last) - f(first)) / (last.n - first.n) as f64 * 1e6;
        format!("n^{k:.2}, {per:.1} µs per {item}")
    };
    println!(
        "  growth ({} -> {}: exponent; {} -> {}: marginal cost): check quiet {}; check suspect {}; ps + ss {}",
        prev.n,
        last.n,
        first.n,
        last.n,
        of(|r| r.quiet),
        of(|r| r.suspect),
        of(|r| r.peers),
    );
}
