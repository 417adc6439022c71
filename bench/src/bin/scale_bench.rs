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
//! `suspect_after`: the judge reads every thread's syscall and wait). Both
//! run with `[agent.proof] keepalive = false`: they measure judging, not
//! the prove stage (with proof on, every suspect check would arm or restore
//! a proof keepalive on each socket a thread waits on).
//!
//! - proof: the prove stage's added cost, measured on its own. 100 agents
//!   hold `--proof` suspect sockets in all (default 1000) with a reader
//!   blocked on each (a call in flight, nothing unacknowledged). Peer: the
//!   same check with `keepalive = false` (median of `--runs` runs). Then
//!   `--runs` rounds (after one not counted), each from a fresh state dir:
//!   the *arming* check (every socket gets a proof keepalive: idle 1 s,
//!   interval 1 s, 3 probes), a wait until the kernel has sent the probes
//!   (this process's ends ACK them), and the *restoring* check (every
//!   socket's options put back and read back); both are timed, and `--json`
//!   must show every socket armed and restored ok or the bench fails.
//!   Packets: the namespace's TCP MIB counters (`TcpExt: TCPKeepAlive`,
//!   `Tcp: OutSegs`/`InSegs`) over each arming + restoring pair against
//!   the same time with proof off (two proof-off checks as far apart),
//!   per socket. The section runs in a network namespace of its own when
//!   it can (root), so other traffic on the host does not count. Here the
//!   restoring check follows as soon as the probes are out; under the
//!   timer a proof keeps probing every `idle` until the next check.
//!
//! - idle: the cost of proving idle pooled connections over time. 100
//!   agents hold `--idle` connections in all (default 1000) that nobody
//!   reads or writes, with a live peer (this process), checked once a
//!   second for `--idle-seconds` (default 120; 600 by hand) with
//!   `suspect_after = "10s"`, proof off, then as long with proof on (idle
//!   1 s, interval 1 s, 3 probes). Prints keepalive probes and segments per
//!   minute (the namespace's TCP MIB counters) and the median check time of
//!   each, and the ratios: each socket is to be asked at most once per
//!   `suspect_after`, never flooded.
//!
//! Needs root to raise the open-file limit past its hard limit, and for the
//! proof sections (`pidfd_getfd` on the agents' sockets).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use bench::{Bins, accept_n, fat_agent, set_nofile};
use tests::timed;

/// Agents of the socket series.
const AGENTS: usize = 100;
/// Blocked threads per agent in the socket series.
const THREADS_PER_AGENT: usize = 2;
/// Connections of the one agent of the thread series.
const THREAD_AGENT_SOCKETS: usize = 20;

/// `check` at growing socket and thread counts against `ps` + `ss`, then
/// the prove stage's and the idle pool's cost.
#[derive(clap::Parser)]
#[command(name = "scale-bench")]
struct Args {
    /// Sockets over the 100 agents of the socket series (multiples of 100).
    #[arg(long, value_delimiter = ',', num_args = 1.., default_values_t = [1000, 5000, 10000])]
    sockets: Vec<usize>,
    /// Threads of the one agent of the thread series.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_values_t = [200, 1000, 2000])]
    threads: Vec<usize>,
    /// Suspect sockets of the proof section (0: skip it).
    #[arg(long, default_value_t = 1000)]
    proof: usize,
    /// Idle pooled sockets of the idle section (0: skip it).
    #[arg(long, default_value_t = 1000)]
    idle: usize,
    /// How long each way of the idle section runs.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(10..=3600))]
    idle_seconds: u64,
    /// Timed runs of each command (the median is printed).
    #[arg(long, default_value_t = 7)]
    runs: usize,
}

fn main() {
    let args: Args = clap::Parser::parse();
    if args.runs == 0 || args.threads.contains(&0) || args.sockets.contains(&0) {
        eprintln!("scale-bench: --runs, --sockets and --threads must be above 0");
        std::process::exit(3);
    }
    if args.sockets.iter().any(|s| s % AGENTS != 0 || *s > 50_000)
        || args.threads.iter().any(|t| *t > 10_000)
        || !args.proof.is_multiple_of(AGENTS)
        || args.proof > 10_000
        || !args.idle.is_multiple_of(AGENTS)
        || args.idle > 10_000
    {
        eprintln!(
            "scale-bench: --sockets must be multiples of {AGENTS} up to 50000, --proof and --idle up to 10000 (0: none), --threads up to 10000"
        );
        std::process::exit(3);
    }
    let Bins { selfheal, peer } = Bins::find();
    let work = std::env::temp_dir().join(format!("selfheal-scale-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");
    let most = args
        .sockets
        .iter()
        .max()
        .copied()
        .unwrap_or(0)
        .max(args.proof)
        .max(args.idle);
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
        "\n  sockets: {AGENTS} agents of {THREADS_PER_AGENT} blocked threads; agent sockets (host sockets: twice as many); proof keepalives off (see proof below)"
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

    if args.proof > 0 {
        bench.proof(args.proof);
    }
    if args.idle > 0 {
        bench.idle(args.idle, Duration::from_secs(args.idle_seconds));
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn raise_nofile(n: u64) {
    if let Err(e) = set_nofile(n) {
        eprintln!("scale-bench: cannot raise the open-file limit to {n}: {e} (run as root)");
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
        let (listen, accepter) = accept_n(agents * sockets);
        let children = (0..agents)
            .map(|_| fat_agent(&self.peer, &listen.to_string(), threads, sockets))
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
        let quiet_cfg = self.config(pids, None, false);
        let suspect_cfg = self.config(pids, Some(listen), false);
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
        self.check_in(config, &self.work.join("state"))
    }

    /// `check` with its history in `state`.
    fn check_in(&self, config: &Path, state: &Path) -> Command {
        let mut c = Command::new(&self.selfheal);
        c.args(["check", "--json", "--config"])
            .arg(config)
            .arg("--state-dir")
            .arg(state)
            .arg("--snapshot-dir")
            .arg(self.work.join("snap"))
            // No helper: this measures check itself.
            .arg("--helper")
            .arg(self.work.join("no-helper.sock"));
        c
    }

    /// One agent per pid; with `suspect`, every connection to that address is
    /// a provider call already silent past `suspect_after`. Proof keepalives
    /// only with `proof` (idle 1 s, interval 1 s, 3 probes).
    fn config(&self, pids: &[u32], suspect: Option<std::net::SocketAddr>, proof: bool) -> PathBuf {
        let mut text = String::new();
        for (i, pid) in pids.iter().enumerate() {
            let (addr, thresholds) = match suspect {
                Some(a) => (
                    a.to_string(),
                    "[agent.thresholds]\nsuspect_after = \"1ms\"\n",
                ),
                None => (":1".to_string(), ""),
            };
            let proof = if proof {
                "[agent.proof]\nkeepalive = true\nidle = \"1s\"\ninterval = \"1s\"\ncount = 3\n"
            } else {
                "[agent.proof]\nkeepalive = false\n"
            };
            text.push_str(&format!(
                "[[agent]]\nname = \"a{i}\"\nmatch = {{ pid = {pid} }}\n\
                 [[agent.upstream]]\nrole = \"provider\"\naddr = \"{addr}\"\n{thresholds}{proof}"
            ));
        }
        let path = self.work.join(format!(
            "config-{}{}.toml",
            if suspect.is_some() {
                "suspect"
            } else {
                "quiet"
            },
            if proof { "-proof" } else { "" }
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

    /// The prove stage's cost on `n` suspect sockets with calls in flight:
    /// the arming and the restoring check against the check with proof off,
    /// and the packets the proofs cost. Times are printed, not asserted; the
    /// proof events are asserted (every socket armed, then restored, ok).
    fn proof(&self, n: usize) {
        let ns = own_netns();
        let per_agent = n / AGENTS;
        // One reader blocked on each socket: every socket carries a call.
        let agents = self.agents(AGENTS, per_agent, per_agent);
        let pids: Vec<u32> = agents.children.iter().map(Child::id).collect();
        let off_cfg = self.config(&pids, Some(agents.listen), false);
        let on_cfg = self.config(&pids, Some(agents.listen), true);
        let off_state = self.work.join("state-off");
        let on_state = self.work.join("state-proof");
        let _ = std::fs::remove_dir_all(&off_state);
        println!(
            "\n  proof: {AGENTS} agents, {n} suspect sockets with a reader blocked on each ({}); proof keepalive idle 1 s, interval 1 s, 3 probes; medians of {} runs",
            match &ns {
                Ok(()) => "a network namespace of its own".to_string(),
                Err(e) => format!(
                    "the host's network namespace ({e}): its counters include other traffic"
                ),
            },
            self.runs
        );
        // Proof off: judged suspect, no proof work at all.
        let (_, lines) = self.run_json(&off_cfg, &off_state);
        assert_eq!(
            lines.len(),
            pids.len(),
            "the proof-off check judged {} of {} agents",
            lines.len(),
            pids.len()
        );
        let (armed, _) = proof_events(&lines, "arm");
        assert_eq!(
            armed, 0,
            "the proof-off check armed {armed} proof keepalives"
        );
        let (off, _) = self.median(&mut self.check_in(&off_cfg, &off_state));

        let mut arm_times = Vec::new();
        let mut restore_times = Vec::new();
        let (mut on_pkts, mut off_pkts) = (Mib::default(), Mib::default());
        let mut on_window = Duration::ZERO;
        let mut last_restore: Option<Instant> = None;
        // One round not counted (caches, the first state files).
        for round in 0..=self.runs {
            // The last ACK (the previous round's) more than `idle` ago, so
            // the first probe goes as soon as a socket is armed.
            if let Some(t) = last_restore {
                std::thread::sleep(Duration::from_millis(1200).saturating_sub(t.elapsed()));
            } else {
                std::thread::sleep(Duration::from_millis(1200));
            }
            let _ = std::fs::remove_dir_all(&on_state);
            let before = Mib::read();
            let start = Instant::now();
            let (arm, lines) = self.run_json(&on_cfg, &on_state);
            let (ok, failed) = proof_events(&lines, "arm");
            assert_eq!(
                ok,
                n,
                "round {round}: the arming check armed {ok} of {n} proof keepalives ok ({} agents judged); first failure: {failed:?}",
                lines.len()
            );
            // Wait for the probes (sent at once; ACKed at once over
            // loopback), bounded by the proof's whole length.
            let deadline = Instant::now() + Duration::from_secs(5);
            while Mib::read().keepalive.saturating_sub(before.keepalive) < n as u64
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(50));
            let (restore, lines) = self.run_json(&on_cfg, &on_state);
            let (ok, failed) = proof_events(&lines, "restore");
            // An agent with fewer sockets put back than it holds: what the
            // check said of it.
            let short = lines.iter().find(|l| {
                l["proofs"].as_array().map_or(0, |p| {
                    p.iter()
                        .filter(|e| e["action"] == "restore" && e["ok"] == true)
                        .count()
                }) < per_agent
            });
            assert_eq!(
                ok,
                n,
                "round {round}: the restoring check put back {ok} of {n} sockets' options ok ({} agents judged, {} probes sent since arming); first failure: {failed:?}; the first agent not all put back: verdict {}, reasons {}",
                lines.len(),
                Mib::read().keepalive.saturating_sub(before.keepalive),
                short.map_or("-".into(), |l| l["verdict"].to_string()),
                short.map_or("-".into(), |l| {
                    let r = l["reasons"].to_string();
                    r.chars().take(600).collect::<String>()
                })
            );
            let window = start.elapsed();
            let on = Mib::read().minus(&before);
            last_restore = Some(Instant::now());
            // Proof off over the same time: two checks as far apart.
            let before = Mib::read();
            let start = Instant::now();
            let _ = self.run_json(&off_cfg, &off_state);
            std::thread::sleep(
                window.saturating_sub(start.elapsed() + Duration::from_secs_f64(off)),
            );
            let _ = self.run_json(&off_cfg, &off_state);
            let off_mib = Mib::read().minus(&before);
            if round > 0 {
                arm_times.push(arm);
                restore_times.push(restore);
                on_pkts.add(&on);
                off_pkts.add(&off_mib);
                on_window += window;
            }
        }
        drop(agents);
        let arm = median_of(&mut arm_times);
        let restore = median_of(&mut restore_times);
        let per_socket = |t: f64| (t - off) / n as f64 * 1e6;
        println!(
            "    {:<46} {:>8.1} ms",
            "check, proof off (keepalive = false)",
            off * 1e3
        );
        println!(
            "    {:<46} {:>8.1} ms  {:>5.2} x proof off  {:>+7.1} µs per socket",
            format!("check arming {n} proof keepalives"),
            arm * 1e3,
            arm / off,
            per_socket(arm)
        );
        println!(
            "    {:<46} {:>8.1} ms  {:>5.2} x proof off  {:>+7.1} µs per socket",
            format!("check restoring {n} after the peers answered"),
            restore * 1e3,
            restore / off,
            per_socket(restore)
        );
        let rounds = (self.runs * n) as f64;
        let per = |m: &Mib| {
            format!(
                "{:.2} keepalive probes, {:.2} segments out, {:.2} in",
                m.keepalive as f64 / rounds,
                m.out_segs as f64 / rounds,
                m.in_segs as f64 / rounds
            )
        };
        println!(
            "    packets per socket, arming + restoring check ({:.2} s a round): {}; proof off over the same time: {}",
            on_window.as_secs_f64() / self.runs as f64,
            per(&on_pkts),
            per(&off_pkts)
        );
        println!(
            "    (over loopback both ends are counted: a probe and its ACK are each one segment out and one in)"
        );
    }

    /// Idle pooled connections proven over time: `n` connections nobody
    /// uses, a check a second for `length` with proof off, then as long
    /// with proof on; probes and segments per minute and check times, printed.
    /// Asserted: the proof-on run armed and the peers answered (no socket
    /// judged dead), and no socket was asked more than once per
    /// `suspect_after` plus the proof's length (a round trip over
    /// loopback).
    fn idle(&self, n: usize, length: Duration) {
        const SUSPECT_S: u64 = 10;
        let ns = own_netns();
        let agents = self.agents(AGENTS, 0, n / AGENTS);
        let pids: Vec<u32> = agents.children.iter().map(Child::id).collect();
        let config = |proof: bool| {
            let mut text = String::new();
            for (i, pid) in pids.iter().enumerate() {
                text.push_str(&format!(
                    "[[agent]]\nname = \"a{i}\"\nmatch = {{ pid = {pid} }}\n\
                     [[agent.upstream]]\nrole = \"provider\"\naddr = \"{}\"\n\
                     [agent.thresholds]\nsuspect_after = \"{SUSPECT_S}s\"\n\
                     [agent.proof]\nkeepalive = {proof}\nidle = \"1s\"\ninterval = \"1s\"\ncount = 3\n",
                    agents.listen
                ));
            }
            let path = self.work.join(format!("config-idle-{proof}.toml"));
            std::fs::write(&path, text).expect("write config");
            path
        };
        println!(
            "\n  idle: {AGENTS} agents, {n} idle pooled connections (live peer, nobody reads or writes), a check a second for {} s each way; suspect_after {SUSPECT_S} s, proof idle 1 s, interval 1 s, 3 probes ({})",
            length.as_secs(),
            match &ns {
                Ok(()) => "a network namespace of its own".to_string(),
                Err(e) => format!("the host's network namespace ({e})"),
            }
        );
        let run = |proof: bool| {
            let cfg = config(proof);
            let state = self.work.join(format!("state-idle-{proof}"));
            let _ = std::fs::remove_dir_all(&state);
            let before = Mib::read();
            let start = Instant::now();
            let (mut times, mut armed, mut dead) = (Vec::new(), 0usize, 0usize);
            while start.elapsed() < length {
                let tick = Instant::now();
                let (t, lines) = self.run_json(&cfg, &state);
                times.push(t);
                armed += proof_events(&lines, "arm").0;
                dead += lines
                    .iter()
                    .filter(|o| {
                        o["verdict"] != "healthy"
                            && o["verdict"] != "idle"
                            && o["verdict"] != "busy"
                    })
                    .count();
                std::thread::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed()));
            }
            let minutes = start.elapsed().as_secs_f64() / 60.0;
            let m = Mib::read().minus(&before);
            (median_of(&mut times), m, minutes, armed, dead)
        };
        // Off first: proofs the last proof-on checks armed keep probing
        // until a check puts them back, and would be counted against off.
        let (off_t, off, off_min, _, _) = run(false);
        let (on_t, on, on_min, armed, on_dead) = run(true);
        drop(agents);
        assert_eq!(
            on_dead, 0,
            "idle connections with a live peer judged not ok"
        );
        assert!(
            armed >= n,
            "only {armed} proof keepalives armed on {n} idle sockets"
        );
        let rounds_per_socket = armed as f64 / n as f64;
        // At most one round per suspect_after plus the proof's own length:
        // a socket is suspect again once its last ACK, the answer to the
        // round before, is older than suspect_after. Over loopback the
        // answer comes a round trip after arming, so the rounds are at
        // least suspect_after apart, the first at the start (the sockets
        // were silent through the proof-off run).
        let most = on_min * 60.0 / SUSPECT_S as f64 + 1.0;
        assert!(
            rounds_per_socket <= most,
            "{rounds_per_socket:.2} proof rounds per socket in {:.1} min (at most {most:.1})",
            on_min
        );
        let per_min = |v: u64, min: f64| v as f64 / min;
        println!(
            "    {:<34} {:>9} {:>16} {:>14} {:>14}",
            "", "check", "probes/min", "segs out/min", "segs in/min"
        );
        for (name, t, m, min) in [
            ("proof on", on_t, &on, on_min),
            ("proof off", off_t, &off, off_min),
        ] {
            println!(
                "    {:<34} {:>6.1} ms {:>16.0} {:>14.0} {:>14.0}",
                name,
                t * 1e3,
                per_min(m.keepalive, min),
                per_min(m.out_segs, min),
                per_min(m.in_segs, min)
            );
        }
        println!(
            "    proof on / off: check {:.2} x; {:+.1} segments out a minute per socket; {rounds_per_socket:.2} proof rounds per socket in {on_min:.1} min ({:.2} a minute; at most one per suspect_after: {:.2})",
            on_t / off_t,
            (per_min(on.out_segs, on_min) - per_min(off.out_segs, off_min)) / n as f64,
            rounds_per_socket / on_min,
            60.0 / SUSPECT_S as f64
        );
    }

    /// Runs one check, timed like [`timed`] (spawn to exit), its `--json`
    /// lines parsed.
    fn run_json(&self, config: &Path, state: &Path) -> (f64, Vec<serde_json::Value>) {
        let path = self.work.join("check.json");
        let file = std::fs::File::create(&path).expect("create check output");
        let start = Instant::now();
        let status = self
            .check_in(config, state)
            .stdout(file)
            .stderr(Stdio::null())
            .status()
            .expect("run selfheal check");
        let t = start.elapsed().as_secs_f64();
        let out = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = out
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert!(
            !lines.is_empty(),
            "check printed nothing (exit {:?})",
            status.code()
        );
        (t, lines)
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

/// Proof events of `action` that were ok, over all agents' lines, and the
/// first that was not.
fn proof_events(lines: &[serde_json::Value], action: &str) -> (usize, Option<serde_json::Value>) {
    let events = lines
        .iter()
        .filter_map(|l| l["proofs"].as_array())
        .flatten()
        .filter(|e| e["action"] == action);
    let mut ok = 0;
    let mut failed = None;
    for e in events {
        if e["ok"] == true {
            ok += 1;
        } else if failed.is_none() {
            failed = Some(e.clone());
        }
    }
    (ok, failed)
}

fn median_of(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Moves this thread (the main one: the agents and checks it starts
/// follow) into a network namespace of its own with loopback up, so the
/// TCP counters count only this bench's packets.
fn own_netns() -> Result<(), String> {
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    let st = Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .map_err(|e| format!("ip: {e}"))?;
    if !st.success() {
        // Loopback down: nothing can connect. Fatal for the section.
        eprintln!("scale-bench: cannot bring loopback up in a new network namespace ({st})");
        std::process::exit(2);
    }
    Ok(())
}

/// The namespace's TCP MIB counters the proof section compares.
#[derive(Clone, Copy, Default)]
struct Mib {
    /// `TcpExt: TCPKeepAlive`: keepalive probes sent.
    keepalive: u64,
    /// `Tcp: OutSegs`, `Tcp: InSegs`.
    out_segs: u64,
    in_segs: u64,
}

impl Mib {
    /// Reads them for this thread's namespace.
    fn read() -> Mib {
        let field = |file: &str, table: &str, name: &str| -> u64 {
            let text = std::fs::read_to_string(format!("/proc/thread-self/net/{file}"))
                .unwrap_or_else(|e| panic!("read /proc/thread-self/net/{file}: {e}"));
            let mut rows = text.lines().filter(|l| l.starts_with(&format!("{table}:")));
            let (Some(names), Some(values)) = (rows.next(), rows.next()) else {
                panic!("no {table} in /proc/thread-self/net/{file}");
            };
            names
                .split_whitespace()
                .zip(values.split_whitespace())
                .find(|(n, _)| *n == name)
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or_else(|| panic!("no {table} {name} in /proc/thread-self/net/{file}"))
        };
        Mib {
            keepalive: field("netstat", "TcpExt", "TCPKeepAlive"),
            out_segs: field("snmp", "Tcp", "OutSegs"),
            in_segs: field("snmp", "Tcp", "InSegs"),
        }
    }

    fn minus(&self, earlier: &Mib) -> Mib {
        Mib {
            keepalive: self.keepalive.saturating_sub(earlier.keepalive),
            out_segs: self.out_segs.saturating_sub(earlier.out_segs),
            in_segs: self.in_segs.saturating_sub(earlier.in_segs),
        }
    }

    fn add(&mut self, m: &Mib) {
        self.keepalive += m.keepalive;
        self.out_segs += m.out_segs;
        self.in_segs += m.in_segs;
    }
}
