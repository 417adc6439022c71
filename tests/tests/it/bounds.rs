//! What one user's processes can make a root `selfheal check` hold, read
//! and write, attacked with real processes and files: a multi-MiB argv
//! shared by 100 processes, an agent at its own limits (thousands of
//! sockets, a big epoll set, `poll` on a million entries, thousands of
//! zombies), one agent's snapshots flooding a log another agent's wedge
//! snapshot is in, a full snapshot disk, and an agent that exits while it
//! is read. Each prints the check's time and peak RSS with the load and
//! without it.
//!
//! They need root (network namespaces, mounts, other users' processes);
//! they skip, saying why, otherwise.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use selfheal::snapshots::{self, SnapshotLog};
use tests::fixtures::{Places, check_cmd};
use tests::{Netns, Peer, Scratch, Usage, need_root, run_check_at, selfheal_bin};

const SEC: Duration = Duration::from_secs(1);
/// The check's peak RSS must stay under this, whatever the load.
const MAX_RSS_KIB: i64 = 64 * 1024;

/// `selfheal check` on `config`, with its own state and snapshot dirs in
/// `dir`, timed (output discarded). It runs as the child of a small
/// process (`recv-peer rusage`), so its peak RSS is its own: the kernel
/// carries the forked copy's peak across `exec`, and this test process is
/// large.
fn timed_check(config: &Path, dir: &Scratch) -> Usage {
    tests::timed_usage(
        Command::new(selfheal_bin())
            .args(["check", "--json", "--config"])
            .arg(config)
            .args(Places::without_helper(dir).args()),
    )
}

fn check(config: &Path, dir: &Scratch) -> tests::CheckRun {
    run_check_at(config, &Places::without_helper(dir), &[])
}

fn print_usage(what: &str, u: &Usage) {
    println!(
        "{what}: {:.3} s wall, {:.3} s user, {:.3} s sys, peak RSS {:.1} MiB",
        u.wall,
        u.user,
        u.sys,
        u.max_rss as f64 / 1024.0
    );
}

/// Stops a peer: closes its stdin (its children, waiting on it, exit too).
fn stop(mut p: Peer) {
    p.close_stdin();
    drop(p);
}

/// One user execs with a 5.5 MiB argv and forks 100 children that share
/// it copy-on-write; the agent's cmdline rule matches them all (the worst
/// case: every one is kept). The check reads at most
/// `MAX_CMDLINE_BYTES` of each command line, so its peak RSS stays under
/// 64 MiB.
#[test]
fn a_shared_multi_mib_argv_does_not_amplify_the_checks_memory() {
    let _area = tests::area(module_path!());
    if !need_root("argv_amplification") {
        return;
    }
    let dir = Scratch::new("bounds-argv");
    let config = tests::config_in(
        &dir,
        "[[agent]]\nname = \"argv\"\nmatch = { cmdline = \"selfheal-bounds-argv\", uid = \"any\" }\n",
    );
    let peer = tests::helper_bin("recv-peer");
    let agent = Peer::spawn({
        let mut c = Command::new(&peer);
        c.args(["forks", "0", "selfheal-bounds-argv"]);
        c
    });
    agent.expect("ready", 10 * SEC);
    let _ = timed_check(&config, &dir);
    let quiet = timed_check(&config, &dir);
    print_usage("check, one small agent", &quiet);

    // 44 arguments of 128 KiB - 1 (the kernel's longest): 5.5 MiB of argv,
    // which needs a stack limit of 4 × that.
    let pad = "x".repeat(128 * 1024 - 1);
    let mut cmd = Command::new(&peer);
    cmd.args(["forks", "100", "selfheal-bounds-argv"]);
    cmd.args(std::iter::repeat_n(&pad, 44));
    // SAFETY: setrlimit is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 64 << 20,
                rlim_max: 64 << 20,
            };
            libc::setrlimit(libc::RLIMIT_STACK, &lim);
            Ok(())
        });
    }
    let attacker = Peer::spawn(cmd);
    let ready = attacker.expect("ready", 30 * SEC);
    let pid: u32 = ready
        .trim_start_matches("ready pid=")
        .trim()
        .parse()
        .unwrap();
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).expect("read the attacker's argv");
    println!(
        "attacker: pid {pid}, argv {:.1} MiB, 100 children sharing it",
        argv.len() as f64 / (1 << 20) as f64
    );
    assert!(argv.len() > 5 << 20, "the attacker's argv is 5+ MiB");

    let loaded = timed_check(&config, &dir);
    print_usage("check, with the 100 processes' 5.5 MiB argv", &loaded);
    let r = check(&config, &dir);
    let out = r.agent("argv");
    println!("the agent's verdict: {}", out["verdict"]);
    assert_ne!(out["verdict"], "down", "the rule matched: {out}");
    stop(attacker);
    stop(agent);
    assert!(
        loaded.max_rss <= MAX_RSS_KIB,
        "the check's peak RSS is {} KiB with the shared argv (cap {MAX_RSS_KIB} KiB)",
        loaded.max_rss
    );
}

/// An agent at its own limits: 9,968 loopback connections (19,936 socket
/// fds), 9,968 of them in one thread's epoll set, a thread in `poll` on
/// 1,000,000 entries, and 5,000 zombies (this machine's pid space is
/// 32,768, shared: not 20,000). The check's peak RSS stays under 64 MiB; its report and
/// snapshot are capped and say how much they left out, while every zombie
/// is counted.
#[test]
fn an_agent_at_its_limits_gets_a_capped_report_and_snapshot() {
    let _area = tests::area(module_path!());
    if !need_root("agent_at_limits") {
        return;
    }
    let ns = match Netns::new("bounds-limits") {
        Ok(ns) => ns,
        Err(e) => {
            tests::skip("agent_at_limits", &format!("no network namespace: {e}"));
            return;
        }
    };
    let dir = Scratch::new("bounds-limits");
    let peer = tests::helper_bin("recv-peer");
    let config = dir.join("config.toml");
    let write_config = |pid: u32| {
        std::fs::write(
            &config,
            format!("[[agent]]\nname = \"limits\"\nmatch = {{ pid = {pid} }}\n"),
        )
        .unwrap();
    };
    let small = Peer::spawn({
        let mut c = ns.command(&peer);
        c.args(["limits", "2", "2", "2", "2"]);
        c
    });
    let pid = |p: &Peer| -> u32 {
        p.expect("ready", 120 * SEC)
            .trim_start_matches("ready pid=")
            .trim()
            .parse()
            .unwrap()
    };
    write_config(pid(&small));
    let _ = timed_check(&config, &dir);
    let quiet = timed_check(&config, &dir);
    print_usage("check, agent with 4 sockets, 2 zombies, poll(2)", &quiet);
    stop(small);

    let (conns, zombies) = (9968, 5000);
    let big = Peer::spawn({
        let mut c = ns.command(&peer);
        c.args([
            "limits",
            &conns.to_string(),
            &conns.to_string(),
            &zombies.to_string(),
            "1000000",
        ]);
        c
    });
    write_config(pid(&big));
    std::thread::sleep(SEC);
    let loaded = timed_check(&config, &dir);
    print_usage(
        &format!(
            "check, agent with {} socket fds, {conns} in one epoll set, {zombies} zombies, \
             poll(1,000,000)",
            2 * conns
        ),
        &loaded,
    );
    let r = check(&config, &dir);
    let out = r.agent("limits").clone();
    stop(big);
    println!("verdict {}, snapshot {}", out["verdict"], out["snapshot"]);
    let id = out["snapshot"]
        .as_str()
        .expect("a snapshot of the degraded agent");
    let shown = tests::show_snapshot(id, &dir.join("snaps"));
    let record: serde_json::Value = serde_json::from_str(&shown).expect("the snapshot as JSON");
    let bytes = shown.len();
    let ev = &record["snapshot"]["evidence"];
    let n = |v: &serde_json::Value| v.as_array().map_or(0, Vec::len);
    println!(
        "snapshot {id}: {bytes} bytes; sockets {} (left out {}), zombies listed {} (left out {}, \
         counted {}), processes {}",
        n(&ev["sockets"]),
        ev["left_out"]["sockets"],
        n(&ev["zombies"]),
        ev["left_out"]["zombies"],
        ev["init"]["zombies"],
        n(&ev["processes"])
    );
    assert_eq!(ev["init"]["zombies"], zombies, "every zombie is counted");
    assert!(n(&ev["sockets"]) <= 1024, "sockets capped");
    assert_eq!(
        n(&ev["sockets"]) as u64 + ev["left_out"]["sockets"].as_u64().unwrap_or(0),
        2 * conns as u64,
        "kept and left-out sockets add up"
    );
    assert!(n(&ev["zombies"]) <= 256, "zombies capped");
    assert!(ev["left_out"]["zombies"].as_u64().unwrap_or(0) > 0);
    assert!(
        ev["gaps"].as_array().into_iter().flatten().any(|g| g
            .as_str()
            .is_some_and(|g| g.contains("the report is capped"))),
        "a gap says the report is capped: {}",
        ev["gaps"]
    );
    assert!(bytes < 2 << 20, "the snapshot is {bytes} bytes");
    assert!(
        loaded.max_rss <= MAX_RSS_KIB,
        "the check's peak RSS is {} KiB at the agent's limits (cap {MAX_RSS_KIB} KiB)",
        loaded.max_rss
    );
}

/// A quiet agent's wedge snapshot, then another agent's flood of large
/// snapshots, far past the quota (1 MiB files, 2 rotated): the quiet
/// agent's snapshot is still listed and shown by id, and the flooding
/// agent's own log holds no more than its quota.
#[test]
fn one_agents_flood_does_not_rotate_away_anothers_wedge_snapshot() {
    let _area = tests::area(module_path!());
    let dir = Scratch::new("bounds-flood");
    let snaps = dir.join("snaps");
    let (max, keep) = (1u64 << 20, 2);
    let log = SnapshotLog::open(&snaps, max, keep).expect("open the log");
    let wedge = serde_json::json!({"verdict": "wedged", "reasons": [{"code": "recv_blocked"}]});
    let victim = log
        .append("victim", "wedged", &wedge)
        .expect("the victim's snapshot");
    let sockets: Vec<serde_json::Value> = (0..2000)
        .map(|i| serde_json::json!({"inode": i, "local": "10.0.0.1:1", "remote": "10.0.0.2:2", "state": "established"}))
        .collect();
    let flood = serde_json::json!({"verdict": "degraded", "evidence": {"sockets": sockets}});
    let mut written = 0u64;
    let t = std::time::Instant::now();
    for _ in 0..60 {
        log.append("flood", "degraded", &flood)
            .expect("a flood snapshot");
        written += serde_json::to_vec(&flood).unwrap().len() as u64;
    }
    println!(
        "flood: 60 snapshots, {:.1} MiB, in {:.2} s",
        written as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    let reader = SnapshotLog::open_read(&snaps, keep);
    let shown = reader.show(&victim).expect("read the log");
    assert!(
        shown.is_some_and(|r| r["agent"] == "victim"),
        "the victim's wedge snapshot {victim} survives the flood"
    );
    let listed = reader.list(Some("victim"), None).expect("list");
    assert_eq!(
        listed.entries.iter().map(|e| &e.id).collect::<Vec<_>>(),
        [&victim]
    );
    let flood_bytes: u64 = std::fs::read_dir(&snaps)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("flood"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    println!(
        "the flood's log: {:.2} MiB on disk (quota {:.0} MiB)",
        flood_bytes as f64 / (1 << 20) as f64,
        (max * (keep as u64 + 1)) as f64 / (1 << 20) as f64
    );
    assert!(flood_bytes <= max * (keep as u64 + 1));
}

/// A shared log of the one-file layout (`snapshots.jsonl` and its oldest
/// rotated file `.5`, written by hand as that layout wrote them) stays readable beside
/// the agents' own logs: listed in time order with them, and shown by id;
/// appends never touch it.
#[test]
fn the_shared_log_stays_readable_beside_the_agents_logs() {
    let _area = tests::area(module_path!());
    let dir = Scratch::new("bounds-shared");
    let snaps = dir.join("snaps");
    let log = SnapshotLog::open(&snaps, 1 << 20, 2).expect("open the log");
    let line = |id: &str, ms: u64, agent: &str| {
        format!(
            "{{\"id\":\"{id}\",\"time\":\"2026-11-29T23:51:00Z\",\"unix_ms\":{ms},\
             \"agent\":\"{agent}\",\"verdict\":\"wedged\",\"snapshot\":{{\"n\":1}}}}\n"
        )
    };
    // Its oldest kept file is `.5` (it kept 5), past an agent log's 2.
    std::fs::write(
        snaps.join("snapshots.jsonl.5"),
        line("20261129T235100Z-sol-0001-0", 1_764_460_260_000, "sol"),
    )
    .unwrap();
    std::fs::write(
        snaps.join("snapshots.jsonl"),
        line("20261129T235200Z-luna-0001-1", 1_764_460_320_000, "luna"),
    )
    .unwrap();
    let shared_before = std::fs::read(snaps.join("snapshots.jsonl")).unwrap();
    let new = log
        .append("sol", "degraded", &serde_json::json!({"n": 2}))
        .expect("append");
    assert_eq!(
        std::fs::read(snaps.join("snapshots.jsonl")).unwrap(),
        shared_before,
        "appends go to the agent's own log"
    );
    let all = log.list(None, None).expect("list");
    let ids: Vec<&str> = all.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "20261129T235100Z-sol-0001-0",
            "20261129T235200Z-luna-0001-1",
            new.as_str()
        ]
    );
    let sol = log.list(Some("sol"), None).expect("list sol");
    assert_eq!(sol.entries.len(), 2, "{sol:?}");
    for id in [
        "20261129T235100Z-sol-0001-0",
        "20261129T235200Z-luna-0001-1",
    ] {
        assert!(log.show(id).expect("show").is_some(), "{id}");
    }
    let out = Command::new(selfheal_bin())
        .args(["snapshots", "list", "--dir"])
        .arg(&snaps)
        .output()
        .expect("snapshots list");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success() && text.lines().count() >= 3, "{text}");
}

/// Agent names come partly from runtimes: whatever the name, its log's
/// file stays a plain name in the snapshot directory, and two names that
/// read the same once made safe get logs of their own.
#[test]
fn agent_log_names_are_safe_file_names() {
    let _area = tests::area(module_path!());
    let dir = Scratch::new("bounds-names");
    let snaps = dir.join("snaps");
    let log = SnapshotLog::open(&snaps, 1 << 20, 1).expect("open the log");
    let names = [
        "../../etc/passwd",
        "a/b",
        "a_b",
        "..",
        "",
        "\u{1b}[31mred\n",
        &"long".repeat(100),
    ];
    let mut files = std::collections::BTreeSet::new();
    for name in names {
        let file = snapshots::agent_file(name);
        assert!(
            !file.contains('/') && file != "." && file != ".." && file.len() <= 64,
            "{name:?} → {file:?}"
        );
        assert!(files.insert(file.clone()), "{name:?} has a log of its own");
        let id = log
            .append(name, "wedged", &serde_json::json!({}))
            .expect("append");
        let shown = log.show(&id).expect("show").expect("the record");
        assert_eq!(shown["agent"], name);
    }
    let on_disk: Vec<String> = std::fs::read_dir(&snaps)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for f in &files {
        assert!(on_disk.contains(f), "{f} is in the snapshot dir");
    }
    println!("{} agent logs: {files:?}", files.len());
}

/// A snapshot directory on a full disk (a 192 KiB tmpfs) while quotas are
/// enforced: appends fail with an error naming the file and the OS error,
/// never a panic; no half line is left; the other agent's snapshot is
/// still there, and once space is back the flood writes again.
#[test]
fn a_full_snapshot_disk_is_an_error_and_loses_nothing() {
    let _area = tests::area(module_path!());
    if !need_root("snapshots_full_disk") {
        return;
    }
    let dir = Scratch::new("bounds-full");
    let snaps = dir.join("snaps");
    std::fs::create_dir_all(&snaps).unwrap();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=192k,mode=0700", "tmpfs"])
        .arg(&snaps)
        .output()
        .expect("run mount");
    if !out.status.success() {
        tests::skip(
            "snapshots_full_disk",
            &format!(
                "cannot mount a tmpfs: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        );
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&snaps);
    let log = SnapshotLog::open(&snaps, 64 << 10, 2).expect("open the log");
    let victim = log
        .append(
            "victim",
            "wedged",
            &serde_json::json!({"verdict": "wedged"}),
        )
        .expect("the victim's snapshot");
    let body = serde_json::json!({"evidence": "y".repeat(20 << 10)});
    let mut errors = Vec::new();
    let mut ok = 0;
    for _ in 0..40 {
        match log.append("flood", "degraded", &body) {
            Ok(_) => ok += 1,
            Err(e) => errors.push(e.to_string()),
        }
    }
    println!(
        "{ok} flood snapshots written, {} refused; first error: {:?}",
        errors.len(),
        errors.first()
    );
    assert!(!errors.is_empty(), "the 192 KiB disk fills up");
    assert!(
        errors
            .iter()
            .all(|e| e.contains("No space left") && e.contains("snapshots.flood")),
        "each error names the flood's file and the OS error: {errors:?}"
    );
    let reader = SnapshotLog::open_read(&snaps, 2);
    assert!(
        reader.show(&victim).expect("read").is_some(),
        "the victim's snapshot is still there"
    );
    let listed = reader.list(None, None).expect("list");
    assert_eq!(listed.skipped, 0, "no half line is left behind");
    assert_eq!(
        listed.entries.len(),
        1 + listed.entries.iter().filter(|e| e.agent == "flood").count()
    );
}

/// An agent of 1,000 processes that exit one by one, reaped at once by
/// their parent, while the check reads them (one a millisecond from their
/// stdin's closing, up to 200 ms after the check starts; tried at several
/// delays, as the race is the kernel's): each check finishes with
/// a verdict and JSON, its vanished processes are a bounded list of gaps
/// (the rest counted), never a panic.
#[test]
fn an_agent_exiting_mid_collection_is_reported_not_a_crash() {
    let _area = tests::area(module_path!());
    if !need_root("agent_exits_mid_collection") {
        return;
    }
    let dir = Scratch::new("bounds-exit");
    let config = tests::config_in(
        &dir,
        "[[agent]]\nname = \"exiting\"\nmatch = { cmdline = \"selfheal-bounds-exit\", uid = \"any\" }\n",
    );
    let peer = tests::helper_bin("recv-peer");
    let mut seen_vanish = 0;
    for delay_ms in [0, 20, 50, 100, 200] {
        let mut agent = Peer::spawn({
            let mut c = Command::new(&peer);
            c.args(["forks", "1000", "selfheal-bounds-exit"]);
            c
        });
        agent.expect("ready", 60 * SEC);
        let child = check_cmd(&config, &Places::without_helper(&dir))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start check");
        std::thread::sleep(Duration::from_millis(delay_ms));
        agent.close_stdin();
        let out = child.wait_with_output().expect("the check ends");
        drop(agent);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let code = out.status.code().unwrap_or(-1);
        assert!(
            (0..=2).contains(&code),
            "check exits with a verdict's code, not a crash: {code}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap_or(""))
            .unwrap_or_else(|e| panic!("a JSON line: {e}: {stdout}"));
        assert_eq!(v["agent"], "exiting");
        let gaps: Vec<&str> = v["gaps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str())
            .collect();
        let vanished = gaps.iter().filter(|g| g.contains("exited before")).count();
        let more = gaps.iter().find(|g| g.contains("more like these"));
        println!(
            "stdin closed {delay_ms} ms after the check started: exit {code}, verdict {} ({}), \
             {vanished} vanished-process gaps listed, {more:?}, {} gaps in all",
            v["verdict"],
            v["reasons"][0]["message"],
            gaps.len()
        );
        // Each kind of gap is capped (then "… and N more like these"); the
        // vanished processes are one kind, the rest are the check's few.
        let others: Vec<&&str> = gaps
            .iter()
            .filter(|g| !g.contains("exited before") && !g.contains("more like these"))
            .collect();
        assert!(
            vanished <= selfheal_core::inspect::MAX_GAPS_PER_KIND,
            "the vanished-process gaps are capped: {vanished}"
        );
        assert!(others.len() <= 12, "the other gaps are few: {others:?}");
        seen_vanish += usize::from(vanished > 0);
    }
    assert!(
        seen_vanish > 0,
        "in five tries, some process vanished between the table and its read"
    );
}

/// An agent stuck degraded (30 zombies) through five checks: one snapshot,
/// written when it turned degraded; every later check names that one.
#[test]
fn an_agent_stuck_not_ok_writes_one_snapshot_then_rate_limited_repeats() {
    let _area = tests::area(module_path!());
    if !need_root("stuck_not_ok_snapshots") {
        return;
    }
    let dir = Scratch::new("bounds-stuck");
    let peer = tests::helper_bin("recv-peer");
    let agent = Peer::spawn({
        let mut c = Command::new(&peer);
        c.args(["zombies", "30"]);
        c
    });
    let pid: u32 = agent
        .expect("ready", 30 * SEC)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pid="))
        .and_then(|p| p.parse().ok())
        .expect("the agent's pid");
    let config = tests::config_in(
        &dir,
        format!("[[agent]]\nname = \"stuck\"\nmatch = {{ pid = {pid} }}\n"),
    );
    let mut ids = Vec::new();
    for _ in 0..5 {
        let r = check(&config, &dir);
        let o = r.agent("stuck");
        assert_eq!(o["verdict"], "degraded", "{o}");
        ids.push(o["snapshot"].as_str().expect("a snapshot id").to_string());
    }
    stop(agent);
    let listed = SnapshotLog::open_read(&dir.join("snaps"), 3)
        .list(Some("stuck"), None)
        .expect("list");
    println!(
        "5 degraded checks: {} snapshot(s) written, ids named {:?}",
        listed.entries.len(),
        ids
    );
    assert_eq!(listed.entries.len(), 1, "one snapshot for the episode");
    assert!(ids.iter().all(|id| *id == listed.entries[0].id));
}
