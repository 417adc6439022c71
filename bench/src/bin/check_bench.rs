//! `selfheal check` (one shot, as the timer runs it) over many agents,
//! against the tools a person would run over the same host in the same run:
//! `ps -eLo pid,tid,stat,wchan` plus `ss -tinp` (which see less). Then the
//! same agents with one local HTTP probe each, run concurrently by selfheal,
//! against a shell loop with one `curl` per probe.
//!
//! Agents: `--agents` processes of `--threads` threads blocked in reads and
//! `--sockets` TCP connections each, at 10 and then the full count, so the
//! growth shows. Prints medians of `--runs`, ratios and selfheal's peak RSS.
//!
//! The progress evidence: the same agents with their connections as a
//! provider upstream, `check` with `stall_after` at its default against
//! `"off"` (no progress records), alternating; the added time and the
//! state file's size. Last, the same with calls in flight: a third of the
//! agents streaming (their peers send a ping or a word on every
//! connection every 250 ms), a third talking with nothing arriving, a
//! third idle, compared on and off in the same run, with the ratio.
//!
//! The census: `selfheal scan --json` over the whole host (every process,
//! every network namespace, the threads of each process holding a TCP
//! connection), on the pinned task iterators and with `--no-iterators`,
//! against `ps -eLo pid,tid,stat,wchan` + `ss -tinp`, in alternation, with
//! their peak RSS.
//!
//! Beside `check`, in alternation with it, `check --no-iterators` (every
//! thread from procfs) and the C floor (`bench/src/diag_floor.c`, compiled
//! here with `cc`): each agent thread's `stat` and `wchan` and one
//! sock_diag dump with `tcp_info`, the least that sees what `check` sees
//! through procfs. `check` reads the threads through the kernel's task
//! iterators, which the bench pins first as the helper does. Prints each
//! one's ratio to the floor and its user and system CPU time (the child's
//! rusage). `--baseline BIN` times another build's `check` in the same
//! alternation and prints the ratio; `--check-only` stops after these.
//! That build's `check` opens only its own pins (their directory is named
//! by its object's hash, and pinning removes other builds' beside it), so
//! pin them where a check looks second (`BIN helper --pin-iterators` with
//! no bpffs at `/sys/fs/bpf`: in `/run/selfheal/bpf`) and run the bench
//! with one at `/sys/fs/bpf`, in a mount namespace of the run's own
//! (RELIABILITY.md, "A check against a C floor").

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
};

use bench::{Bins, accept_n, fat_agent, set_nofile, status_server};
use tests::{Usage, timed, timed_usage};

/// `check` over agents that each hold threads blocked in `recvfrom` and
/// connections, against the C floor and `ps` + `ss`.
#[derive(clap::Parser)]
#[command(name = "check-bench")]
struct Args {
    /// Agents to start.
    #[arg(long, default_value_t = 100)]
    agents: usize,
    /// Threads per agent.
    #[arg(long, default_value_t = 50)]
    threads: usize,
    /// Connections per agent.
    #[arg(long, default_value_t = 20)]
    sockets: usize,
    /// Timed runs of each command (the median is printed).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Another `selfheal` binary (another build) whose `check` is timed
    /// beside this one's, in the same alternation, and compared.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Only `check` against the C floor (and the baseline): no census,
    /// progress evidence, probes or calls in flight.
    #[arg(long)]
    check_only: bool,
    /// Time nothing: start the agents, pin the iterators, print the
    /// `check` command over all of them, and keep them up this many
    /// seconds (at most 3,600) for a profiler or `strace` run by hand.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    hold: Option<u64>,
}

fn main() {
    let Args {
        agents,
        threads,
        sockets,
        runs,
        baseline,
        check_only,
        hold,
    } = clap::Parser::parse();
    let Bins { selfheal, peer } = Bins::find();
    let work = std::env::temp_dir().join(format!("selfheal-check-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");

    let total_sockets = agents * sockets;
    // The accepted ends, two pipes to each agent, and room for the rest.
    let nofile = (total_sockets + 2 * agents) as u64 + 512;
    if let Err(e) = set_nofile(nofile) {
        eprintln!("check-bench: cannot set the open-file limit to {nofile}: {e}");
    }
    let (addr, accepter) = accept_n(total_sockets);
    let addr = addr.to_string();
    let mut children: Vec<Child> = (0..agents)
        .map(|_| fat_agent(&peer, &addr, threads, sockets))
        .collect();
    let server_ends = accepter.join().expect("accepter");
    let status = status_server();
    std::thread::sleep(std::time::Duration::from_millis(500));

    println!(
        "check-bench: {agents} agents of {threads} threads and {sockets} TCP connections; medians of {runs} runs"
    );
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let ps = median(runs, || {
        timed(Command::new("ps").args(["-eLo", "pid,tid,stat,wchan"])).0
    });
    let ss = median(runs, || timed(Command::new("ss").args(["-tinp"])).0);
    println!(
        "  ps -eLo pid,tid,stat,wchan + ss -tinp (whole host): {:.1} + {:.1} = {:.1} ms",
        ps * 1e3,
        ss * 1e3,
        (ps + ss) * 1e3
    );
    let floor = build_floor(&work);
    // The task iterators pinned as the helper pins them; a check opens them.
    match selfheal::ebpf::iter::publish()
        .and_then(|_| selfheal::ebpf::iter::open_published().map(|(_, from)| from))
    {
        Ok(from) => println!("  task iterators pinned in {}", from.display()),
        Err(e) => println!(
            "  no task iterators ({}): `check` reads procfs as `--no-iterators` does",
            selfheal::ebpf::chain(&e)
        ),
    }
    if !check_only && hold.is_none() {
        census(&selfheal, runs, agents);
    }
    if let Some(seconds) = hold {
        let config = write_config(&work, &pids, None);
        println!(
            "  holding {agents} agents for {seconds} s; one check over them:\n    {:?}",
            check_in(&selfheal, &config, &work)
        );
        std::thread::sleep(std::time::Duration::from_secs(seconds));
        stop(&mut children, &work);
        return;
    }
    let mut grows = Vec::new();
    for n in [10.min(agents), agents] {
        let config = write_config(&work, &pids[..n], None);
        // The checks and the C floor alternate, so all see the same machine.
        let (mut iterated, mut procfs, mut floors) = (Vec::new(), Vec::new(), Vec::new());
        let mut based = Vec::new();
        for _ in 0..runs {
            iterated.push(timed_usage(&mut check_in(&selfheal, &config, &work)));
            if let Some(b) = &baseline {
                based.push(timed_usage(&mut check_in(b, &config, &work)));
            }
            procfs.push(timed_usage(
                check_in(&selfheal, &config, &work).arg("--no-iterators"),
            ));
            if let Some(bin) = &floor {
                let mut cmd = Command::new(bin);
                cmd.args(pids[..n].iter().map(u32::to_string));
                floors.push(timed_usage(&mut cmd));
            }
        }
        let f = (!floors.is_empty()).then(|| medians(&floors));
        if let Some((f, fuser, fsys)) = f {
            println!(
                "  C floor (each thread's stat + wchan, one sock_diag dump), {n:>4} agents: {:>7.1} ms (user {:.1} ms, sys {:.1} ms)",
                f * 1e3,
                fuser * 1e3,
                fsys * 1e3,
            );
        }
        for (what, runs, goal) in [
            ("selfheal check", &iterated, "goal <= 0.25, user < 10 ms"),
            (
                "selfheal check --no-iterators",
                &procfs,
                "procfs, for comparison",
            ),
            ("baseline check", &based, "the --baseline binary"),
        ] {
            if runs.is_empty() {
                continue;
            }
            let (t, user, sys) = medians(runs);
            let rss = runs.iter().map(|u| u.max_rss).max().unwrap_or(0);
            let to_floor = f.map_or_else(
                || "no C floor".into(),
                |(f, ..)| format!("{:.2} x the C floor", t / f),
            );
            println!(
                "  {what}, {n:>4} agents: {:>7.1} ms (user {:.1} ms, sys {:.1} ms)  {to_floor} ({goal} at {agents}); {:.2} x ps + ss; peak RSS {:.1} MiB",
                t * 1e3,
                user * 1e3,
                sys * 1e3,
                t / (ps + ss),
                rss as f64 / 1024.0
            );
        }
        let (ti, ..) = medians(&iterated);
        let (tp, ..) = medians(&procfs);
        println!("  iterators / procfs, {n:>4} agents: {:.2}", ti / tp);
        if !based.is_empty() {
            let (tb, ub, _) = medians(&based);
            let (_, ui, _) = medians(&iterated);
            // User time is counted in ticks: under one, a ratio means nothing.
            let user = if ub > 0.0 {
                format!("{:.2}", ui / ub)
            } else {
                format!("{ui:.1} against {ub:.1} ms")
            };
            println!(
                "  check / baseline check, {n:>4} agents: {:.2} (user {user})",
                ti / tb
            );
        }
        grows.push((n, ti, tp, f.map(|(f, ..)| f)));
    }
    if let [(n0, i0, p0, f0), (n1, i1, p1, f1)] = grows[..]
        && n1 > n0
    {
        let per = |a: f64, b: f64| (b - a) / (n1 - n0) as f64 * 1e3;
        let floor = f0.zip(f1).map_or_else(String::new, |(a, b)| {
            format!(", C floor {:.2} ms", per(a, b))
        });
        println!(
            "  growth per agent from {n0} to {n1}: check {:.2} ms, --no-iterators {:.2} ms{floor}",
            per(i0, i1),
            per(p0, p1),
        );
    }
    if check_only {
        stop(&mut children, &work);
        return;
    }
    progress(&selfheal, &work, &pids, &addr, runs);
    // One HTTP probe per agent, concurrently, against curl one at a time.
    for n in [10.min(agents), agents] {
        let config = write_config(&work, &pids[..n], Some(status));
        let (t, rss) = median_rss(runs, || timed(&mut check_in(&selfheal, &config, &work)));
        let script = format!(
            "for i in $(seq 1 {n}); do curl -s -m 2 -o /dev/null http://{status}/status/$i; done"
        );
        let curl = median(runs, || timed(Command::new("sh").args(["-c", &script])).0);
        println!(
            "  with a probe each, {n:>3} agents: selfheal check {:>7.1} ms (peak RSS {:.1} MiB); curl loop {:>7.1} ms; ratio {:.2}",
            t * 1e3,
            rss as f64 / 1024.0,
            curl * 1e3,
            t / curl
        );
    }
    // Last: the peers' writes wake the agents' readers, which then exit.
    in_flight(&selfheal, &work, &pids, &addr, &server_ends, sockets, runs);
    stop(&mut children, &work);
}

/// Kills the agents (started here) and removes the work directory.
fn stop(children: &mut [Child], work: &Path) {
    for c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = std::fs::remove_dir_all(work);
}

/// A config in `dir` of every agent in `pids` with its connections as a
/// provider upstream at `addr`, agent `i`'s table ending with `tail(i)`.
fn provider_config(
    dir: &Path,
    pids: &[u32],
    addr: &str,
    tail: impl Fn(usize) -> String,
) -> PathBuf {
    let mut text = String::new();
    for (i, pid) in pids.iter().enumerate() {
        text.push_str(&format!("[[agent]]\nname = \"a{i}\"\nmatch = {{ pid = {pid} }}\n[[agent.upstream]]\nrole = \"provider\"\naddr = \"{addr}\"\n{}", tail(i)));
    }
    std::fs::create_dir_all(dir).expect("progress dir");
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// `check` with `c_on` in `on` against `c_off` in `off`, alternating, each
/// warmed by one check first: the medians (wall, user, sys) of `runs` each.
fn on_off(
    selfheal: &Path,
    (c_on, on): (&Path, &Path),
    (c_off, off): (&Path, &Path),
    runs: usize,
) -> ((f64, f64, f64), (f64, f64, f64)) {
    let (mut t_on, mut t_off) = (Vec::new(), Vec::new());
    for i in 0..=runs {
        let a = timed_usage(&mut check_in(selfheal, c_on, on));
        let b = timed_usage(&mut check_in(selfheal, c_off, off));
        if i > 0 {
            t_on.push(a);
            t_off.push(b);
        }
    }
    (medians(&t_on), medians(&t_off))
}

/// Agent `i`'s part in [`in_flight`].
#[derive(Clone, Copy, PartialEq)]
enum Call {
    /// Its peer sends on every connection every 250 ms: a 42-byte ping on
    /// even ones (a stream stalled behind pings), a 300-byte word on odd
    /// ones (a stream making progress).
    Streaming,
    /// Nothing arrives, quiet for less than `suspect_after` (10 minutes).
    Talking,
    /// Nothing arrives, quiet past `suspect_after` (1 s): no record.
    Idle,
}

fn call_of(i: usize) -> Call {
    [Call::Streaming, Call::Talking, Call::Idle][i % 3]
}

/// What the progress evidence costs with calls in flight, compared in one
/// run: a third of the agents streaming, a third talking with nothing
/// arriving, a third idle ([`Call`]), `check` with `stall_after` at its
/// default against `"off"`, alternating, the prove stage off in both.
/// `ends` are the server ends of the agents' connections, `sockets` per
/// agent in `pids`' order (each agent connects all of its own before the
/// next starts).
fn in_flight(
    selfheal: &Path,
    work: &Path,
    pids: &[u32],
    addr: &str,
    ends: &[std::net::TcpStream],
    sockets: usize,
    runs: usize,
) {
    use std::{
        io::Write as _,
        sync::atomic::{AtomicBool, Ordering},
    };
    let streams: Vec<(&std::net::TcpStream, usize)> = ends
        .iter()
        .enumerate()
        .filter(|(k, _)| sockets > 0 && call_of(k / sockets) == Call::Streaming)
        .map(|(k, s)| (s, if k % 2 == 0 { 42 } else { 300 }))
        .collect();
    for (s, _) in &streams {
        let _ = s.set_nonblocking(true);
    }
    let n = streams.len();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                for (mut s, size) in streams.iter().copied() {
                    let _ = s.write(&[b'.'; 300][..size]);
                }
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
        });
        let result = measure_in_flight(selfheal, work, pids, addr, runs);
        stop.store(true, Ordering::Relaxed);
        let ((a, au, asys), (b, bu, bsys)) = result;
        // The records kept, and those that counted pings.
        let state = |dir: &str| {
            std::fs::read_to_string(work.join(dir).join("state").join("state.json"))
                .unwrap_or_default()
        };
        let on = state("in-flight-on");
        println!(
            "  progress evidence with calls in flight, {} agents x {sockets} connections (a third streaming: {n} connections sent a ping or a word every 250 ms; a third talking, nothing arriving; a third idle): stall_after on {:.1} ms (user {:.1}, sys {:.1}; state file {} bytes, {} records counting keepalive) against off {:.1} ms (user {:.1}, sys {:.1}; state file {} bytes): ratio {:.2} ({:+.1} %)",
            pids.len(),
            a * 1e3,
            au * 1e3,
            asys * 1e3,
            on.len(),
            on.matches("\"keepalives\"").count(),
            b * 1e3,
            bu * 1e3,
            bsys * 1e3,
            state("in-flight-off").len(),
            a / b,
            (a / b - 1.0) * 100.0
        );
    });
}

/// [`in_flight`]'s checks, on and off, while the streams send.
fn measure_in_flight(
    selfheal: &Path,
    work: &Path,
    pids: &[u32],
    addr: &str,
    runs: usize,
) -> ((f64, f64, f64), (f64, f64, f64)) {
    let (on, off) = (work.join("in-flight-on"), work.join("in-flight-off"));
    let tail = |i: usize| {
        let suspect_after = if call_of(i) == Call::Idle {
            "1s"
        } else {
            "10m"
        };
        format!(
            "[agent.thresholds]\nsuspect_after = \"{suspect_after}\"\n[agent.proof]\nkeepalive = false\n"
        )
    };
    let c_on = provider_config(&on, pids, addr, tail);
    let c_off = provider_config(&off, pids, addr, |i| {
        format!("stall_after = \"off\"\n{}", tail(i))
    });
    // The streams' first writes arrive before the first check.
    std::thread::sleep(std::time::Duration::from_millis(600));
    on_off(selfheal, (&c_on, &on), (&c_off, &off), runs)
}

/// What the progress evidence (a record per talking provider connection,
/// kept in the state file from check to check) costs: the same agents
/// with their connections as a provider upstream, `stall_after` at its
/// default against `"off"` (no record), alternating, each with its own
/// state directory warmed by one check first. Twice: the connections
/// quiet for less than `suspect_after` (each keeps a record, as a talking
/// one does), then past it (idle, as pooled connections mostly are: none
/// does); the prove stage off in both, so that only the records differ.
fn progress(selfheal: &Path, work: &Path, pids: &[u32], addr: &str, runs: usize) {
    let (on, off) = (work.join("progress-on"), work.join("progress-off"));
    let config = |dir: &Path, extra: &str| provider_config(dir, pids, addr, |_| extra.to_string());
    let size =
        |dir: &Path| std::fs::metadata(dir.join("state").join("state.json")).map_or(0, |m| m.len());
    for (quiet, suspect_after) in [("talking", "10m"), ("idle", "1s")] {
        let tail = format!(
            "[agent.thresholds]\nsuspect_after = \"{suspect_after}\"\n[agent.proof]\nkeepalive = false\n"
        );
        let c_on = config(&on, &tail);
        let c_off = config(&off, &format!("stall_after = \"off\"\n{tail}"));
        let ((a, au, asys), (b, bu, bsys)) = on_off(selfheal, (&c_on, &on), (&c_off, &off), runs);
        println!(
            "  progress evidence, {} agents x their connections as provider, {quiet} (suspect_after {suspect_after}): stall_after on {:.1} ms (user {:.1}, sys {:.1}; state file {} bytes) against off {:.1} ms (user {:.1}, sys {:.1}; state file {} bytes): {:+.1} %",
            pids.len(),
            a * 1e3,
            au * 1e3,
            asys * 1e3,
            size(&on),
            b * 1e3,
            bu * 1e3,
            bsys * 1e3,
            size(&off),
            (a / b - 1.0) * 100.0
        );
    }
}

/// `selfheal check --json` with `config`, its state and snapshots in `dir`.
fn check_in(selfheal: &Path, config: &Path, dir: &Path) -> Command {
    let mut c = Command::new(selfheal);
    c.args(["check", "--json", "--config"])
        .arg(config)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--snapshot-dir")
        .arg(dir.join("snap"));
    c
}

fn write_config(work: &Path, pids: &[u32], status: Option<std::net::SocketAddr>) -> PathBuf {
    let mut text = String::new();
    for (i, pid) in pids.iter().enumerate() {
        text.push_str(&format!("[[agent]]\nname = \"a{i}\"\nmatch = {{ pid = {pid} }}\n[[agent.upstream]]\nrole = \"provider\"\naddr = \":1\"\n"));
        if let Some(s) = status {
            text.push_str(&format!("[[agent.probe]]\nurl = \"http://{s}/status/{i}\"\nfields = {{ current_task = \"/current_task\" }}\n"));
        }
    }
    let path = work.join(format!("config-{}-{}.toml", pids.len(), status.is_some()));
    std::fs::write(&path, text).expect("write config");
    path
}

/// The C floor (`bench/src/diag_floor.c`), compiled into `work`; `None`
/// (and why, printed) where there is no C compiler.
fn build_floor(work: &Path) -> Option<PathBuf> {
    let src = work.join("diag_floor.c");
    let bin = work.join("diag-floor");
    std::fs::write(&src, include_str!("../diag_floor.c")).expect("write diag_floor.c");
    match Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
    {
        Ok(out) if out.status.success() => Some(bin),
        Ok(out) => {
            println!(
                "  (no C floor: cc failed: {})",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(e) => {
            println!("  (no C floor: cannot run cc: {e})");
            None
        }
    }
}

/// The medians of wall, user and system time, each on its own.
fn medians(runs: &[Usage]) -> (f64, f64, f64) {
    let med = |f: fn(&Usage) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (med(|u| u.wall), med(|u| u.user), med(|u| u.sys))
}

fn median(runs: usize, mut f: impl FnMut() -> f64) -> f64 {
    let mut v: Vec<f64> = (0..runs).map(|_| f()).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn median_rss(runs: usize, mut f: impl FnMut() -> (f64, i64)) -> (f64, i64) {
    let mut v: Vec<(f64, i64)> = (0..runs).map(|_| f()).collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v[v.len() / 2]
}

/// `selfheal scan --json` over the whole host (this fleet and everything
/// else the machine runs), on the pinned task iterators and with
/// `--no-iterators` (procfs and sock_diag), against `ps -eLo
/// pid,tid,stat,wchan` + `ss -tinp`, which together show less (no wait per
/// socket, no verdict); alternating, medians of `runs`.
fn census(selfheal: &Path, runs: usize, agents: usize) {
    let (mut pass, mut procfs, mut tools) = (Vec::new(), Vec::new(), Vec::new());
    let scan = |extra: &[&str]| {
        timed_usage(
            Command::new(selfheal)
                .args(["scan", "--json", "--silent-for", "30s"])
                .args(extra),
        )
    };
    for _ in 0..runs {
        pass.push(scan(&[]));
        procfs.push(scan(&["--no-iterators"]));
        let ps = timed(Command::new("ps").args(["-eLo", "pid,tid,stat,wchan"])).0;
        let ss = timed(Command::new("ss").args(["-tinp"])).0;
        tools.push(ps + ss);
    }
    tools.sort_by(f64::total_cmp);
    let both = tools[tools.len() / 2];
    println!(
        "  ps -eLo pid,tid,stat,wchan + ss -tinp, alternating with the scans: {:.1} ms",
        both * 1e3
    );
    for (what, runs) in [
        ("selfheal scan (task iterators)", &pass),
        ("selfheal scan --no-iterators", &procfs),
    ] {
        let (t, user, sys) = medians(runs);
        let rss = runs.iter().map(|u| u.max_rss).max().unwrap_or(0);
        println!(
            "  {what}, whole host ({agents} agents among it): {:.1} ms (user {:.1} ms, sys {:.1} ms), peak RSS {:.1} MiB; {:.2} x ps + ss (goal <= 0.25)",
            t * 1e3,
            user * 1e3,
            sys * 1e3,
            rss as f64 / 1024.0,
            t / both
        );
    }
}
