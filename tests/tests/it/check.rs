//! `selfheal check` end to end, run repeatedly as a timer would, against
//! real processes and a real half-open connection: a runner whose control
//! server vanishes without a FIN turns `wedged` within the bound (3 × its
//! heartbeat), while a runner reading a slow stream and a runner waiting on
//! a silent-but-alive peer stay `busy`. Also: snapshots readable back,
//! metrics written, concurrent runs leave a sound state file.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use tests::fixtures::{Places, check_cmd, control_runner};
use tests::{NetnsPair, Peer, Scratch, need_root, selfheal_bin};

const SEC: Duration = Duration::from_secs(1);

/// A config in `dirs` with one agent, "me": this test process.
fn own_agent_config(dirs: &Scratch) -> PathBuf {
    let config = dirs.join("config.toml");
    tests::own_agent_config(&config);
    config
}

/// `selfheal check --json` with the test's state and snapshot dirs: exit
/// code and one JSON value per agent.
fn check(dirs: &Path, config: &Path) -> (i32, Vec<serde_json::Value>) {
    // The test's own helper socket (there is one only where a test starts a
    // helper): never whatever runs on the machine.
    let places = Places::under(dirs)
        .metrics(dirs.join("selfheal.prom"))
        .helper(dirs.join("helper.sock"));
    let out = check_cmd(config, &places)
        .output()
        .expect("run selfheal check");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect();
    (out.status.code().unwrap_or(-1), lines)
}

fn verdict_of<'a>(results: &'a [serde_json::Value], agent: &str) -> &'a serde_json::Value {
    results
        .iter()
        .find(|r| r["agent"] == agent)
        .unwrap_or_else(|| panic!("no {agent} in {results:?}"))
}

#[test]
fn a_half_open_control_connection_turns_wedged_while_busy_runners_stay_busy() {
    let _area = tests::area(module_path!());
    if !need_root("check_e2e") {
        return;
    }
    let pair = NetnsPair::new("chk").expect("netns pair");
    let b = pair.b_addr.clone();
    // Servers in b: heartbeats every 300 ms on 7443; a slow stream (a byte
    // every 2 s) on 8443; a peer that accepts and never sends on 9443.
    let _servers: Vec<Peer> = [
        vec!["beat".to_string(), format!("{b}:7443"), "300".into()],
        vec!["beat".into(), format!("{b}:8443"), "2000".into()],
        vec!["sink".into(), format!("{b}:9443")],
    ]
    .iter()
    .map(|args| pair.listening_in_b(args))
    .collect();
    // Three runners in a, each a blocking client of one server.
    let _clients: Vec<Peer> = [7443, 8443, 9443]
        .into_iter()
        .map(|port| {
            let (mut c, _) = pair.client_in_a(port);
            c.tell("go");
            c
        })
        .collect();
    // The wedging runner's own status endpoint keeps saying it is connected,
    // as the incident's did.
    let status = tests::status_server(r#"{"status": "connected", "current_task": "WI-7"}"#, 200);
    let dirs = Scratch::new("check-e2e");
    let config = tests::config_in(
        &dirs.0,
        format!(
            "[[agent]]\nname = \"wedging\"\nmatch = {{ cmdline = \"recv-peer client {b}:7443$\" }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"{b}:7443\"\nheartbeat = \"1s\"\n\
             [[agent.probe]]\nurl = \"http://{status}/status\"\ntimeout = \"1s\"\n\
             fields = {{ server_status = \"/status\", current_task = \"/current_task\" }}\n\
             expect = {{ server_status = \"connected\" }}\n\
             [agent.thresholds]\nsuspect_after = \"2s\"\n\
             [[agent]]\nname = \"streaming\"\nmatch = {{ cmdline = \"recv-peer client {b}:8443$\" }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{b}:8443\"\n\
             [agent.thresholds]\nsuspect_after = \"5s\"\n\
             [[agent]]\nname = \"thinking\"\nmatch = {{ cmdline = \"recv-peer client {b}:9443$\" }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{b}:9443\"\n\
             [agent.thresholds]\nsuspect_after = \"2s\"\n"
        ),
    );

    // Warm up: everyone is fine while the control server beats.
    std::thread::sleep(SEC);
    let (code, r) = check(&dirs.0, &config);
    assert_eq!(verdict_of(&r, "wedging")["verdict"], "idle", "{r:#?}");
    assert_eq!(code, 0, "{r:#?}");

    // The control server vanishes without a FIN.
    pair.drop_port_into_b(7443).expect("nft");
    let dropped = Instant::now();
    let mut wedged_after = None;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(500));
        let (code, r) = check(&dirs.0, &config);
        for busy in ["streaming", "thinking"] {
            assert_eq!(
                verdict_of(&r, busy)["verdict"],
                "busy",
                "{busy} after {:?}: {r:#?}",
                dropped.elapsed()
            );
        }
        let w = verdict_of(&r, "wedging");
        if w["verdict"] == "wedged" {
            // Healed at once (keepalive armed on the dead connection): exit 1.
            assert_eq!(
                w["heal"]["actions"][0]["step"]["action"], "arm_keepalive",
                "{w:#}"
            );
            assert_eq!(code, 1, "wedged, and a healing step was taken");
            let codes: Vec<&str> = w["reasons"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|r| r["code"].as_str())
                .collect();
            assert!(codes.contains(&"control_silent"), "{w:#}");
            // The agent's story (connected) against the kernel (dead control).
            assert!(codes.contains(&"status_contradicts_kernel"), "{w:#}");
            assert_eq!(w["probes"][0]["fields"]["server_status"], "connected");
            let id = w["snapshot"].as_str().expect("a snapshot id").to_string();
            wedged_after = Some((dropped.elapsed(), id));
            break;
        }
        assert_ne!(code, 2, "nothing is wedged yet: {r:#?}");
    }
    let (after, id) = wedged_after.expect("the runner turned wedged within 10 s");
    // Bound: 3 × heartbeat of silence, plus one check interval and slack.
    assert!(after < 6 * SEC, "wedged only after {after:?}");
    eprintln!("detected the half-open control connection {after:?} after the peer vanished");

    // The snapshot reads back, with the evidence.
    let shown = tests::show_snapshot(&id, &dirs.join("snapshots"));
    let snap: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(snap["agent"], "wedging");
    assert_eq!(snap["snapshot"]["verdict"], "wedged");
    assert!(
        snap["snapshot"]["evidence"]["sockets"]
            .as_array()
            .is_some_and(|s| !s.is_empty()),
        "{snap:#}"
    );

    // Metrics, written by the last check.
    let prom = std::fs::read_to_string(dirs.0.join("selfheal.prom")).unwrap();
    assert!(
        prom.contains("selfheal_agent_verdict{agent=\"wedging\",verdict=\"wedged\"} 1"),
        "{prom}"
    );
    assert!(
        prom.contains("selfheal_agent_wedges_total{agent=\"wedging\"} 1"),
        "{prom}"
    );
    assert!(prom.contains("selfheal_last_check_timestamp_seconds"));
}

#[test]
fn concurrent_checks_leave_a_sound_state_file() {
    let _area = tests::area(module_path!());
    let dirs = Scratch::new("check-concurrent");
    let config = own_agent_config(&dirs);
    let runs: Vec<_> = (0..4)
        .map(|_| check_cmd(&config, &Places::under(&dirs.0)).output())
        .collect();
    for r in runs {
        let r = r.unwrap();
        assert!(
            r.status.code().is_some_and(|c| c < 3),
            "{}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
    let text = std::fs::read_to_string(dirs.0.join("state/state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).expect("the state file is whole JSON");
    assert!(v["data"]["agents"]["me"].is_object(), "{v:#}");
}

/// Durations at the edges of what the config takes: a `collect_budget`
/// past what a deadline on the monotonic clock holds (it panicked adding
/// it to an `Instant`), thresholds past what ms can count (they wrapped to
/// 5.4 s): the check runs and judges this test process `healthy`, twice.
#[test]
fn durations_too_long_for_ms_neither_panic_nor_judge_early() {
    let _area = tests::area(module_path!());
    let dirs = Scratch::new("check-huge-durations");
    let config = dirs.join("config.toml");
    let huge = "18446744073709557s";
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"me\"\nmatch = {{ pid = {} }}\n\
             [agent.thresholds]\ncollect_budget = \"500000000000y\"\nsuspect_after = \"{huge}\"\n\
             recv_blocked = \"{huge}\"\nd_state = \"{huge}\"\n\
             [agent.heal]\nstep_window = \"{huge}\"\nbackoff = \"{huge}\"\ngrace = \"{huge}\"\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \":443\"\n\
             stall_after = \"{huge}\"\nmax_silence = \"{huge}\"\nconnect_timeout = \"{huge}\"\n",
            std::process::id()
        ),
    )
    .expect("write the config");
    for _ in 0..2 {
        let (code, results) = check(&dirs.0, &config);
        let me = verdict_of(&results, "me");
        assert_eq!(code, 0, "{me:#}");
        assert_eq!(me["verdict"], "healthy", "{me:#}");
    }
}

#[test]
fn a_garbage_state_file_is_replaced_and_reported() {
    let _area = tests::area(module_path!());
    let dirs = Scratch::new("check-garbage");
    let config = own_agent_config(&dirs);
    std::fs::create_dir_all(dirs.0.join("state")).unwrap();
    std::fs::write(
        dirs.0.join("state/state.json"),
        b"{\"version\": 99, \"data\": 7}",
    )
    .unwrap();
    let out = Command::new(selfheal_bin())
        .args(["check", "--config"])
        .arg(&config)
        .args(Places::under(&dirs.0).args())
        .output()
        .unwrap();
    assert!(out.status.code().is_some_and(|c| c < 3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("state"), "the replacement is reported: {err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dirs.0.join("state/state.json")).unwrap())
            .unwrap();
    assert_eq!(v["version"], 1);
}

#[test]
fn watch_logs_transitions_not_every_check() {
    let _area = tests::area(module_path!());
    let dirs = Scratch::new("check-watch");
    let config = own_agent_config(&dirs);
    let out = Command::new(selfheal_bin())
        .args(["watch", "--interval", "100ms", "--count", "10", "--config"])
        .arg(&config)
        .args(Places::under(&dirs.0).args())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.lines().count(),
        10,
        "one summary line per check: {stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let transitions: Vec<&str> = stderr.lines().filter(|l| l.contains("agent me:")).collect();
    assert_eq!(
        transitions.len(),
        1,
        "ten checks of an unchanged agent log one transition: {stderr}"
    );
    assert!(
        transitions[0].contains("(first check) -> healthy"),
        "{stderr}"
    );
}

#[test]
fn an_unwritable_snapshot_dir_is_reported_and_the_check_still_runs() {
    let _area = tests::area(module_path!());
    let dirs = Scratch::new("check-nosnap");
    let config = dirs.0.join("config.toml");
    // A down agent needs a snapshot; its directory is a plain file.
    std::fs::write(
        &config,
        "[[agent]]\nname = \"ghost\"\nmatch = { pid = 4194000 }\n",
    )
    .unwrap();
    let not_a_dir = dirs.0.join("snapshots");
    std::fs::write(&not_a_dir, b"not a directory").unwrap();
    let out = check_cmd(&config, &Places::under(&dirs.0).snapshots(&not_a_dir))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "down, and said so");
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the check still reports");
    assert_eq!(v["verdict"], "down");
    assert!(v["snapshot"].is_null());
    assert!(v["snapshot_error"].is_string(), "{v}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NOT written"), "{err}");
}

#[test]
fn watch_serves_metrics() {
    let _area = tests::area(module_path!());
    let dirs = Scratch::new("check-metrics");
    let config = own_agent_config(&dirs);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = Command::new(selfheal_bin())
        .args([
            "watch",
            "--interval",
            "100ms",
            "--count",
            "50",
            "--metrics-public",
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
            "--config",
        ])
        .arg(&config)
        .args(Places::under(&dirs.0).args())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let body = tests::wait_for(5 * SEC, Duration::from_millis(100), || {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        text.contains("selfheal_agent_verdict{agent=\"me\",verdict=\"healthy\"} 1")
            .then_some(text)
    });
    let _ = child.kill();
    let _ = child.wait();
    let body = body.expect("metrics served");
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
}

/// The timer flow with healing: a runner's dispatch server vanishes without
/// a FIN (its traffic cut both ways, the old server killed, a new one
/// started: a replaced pod). `check` finds the runner wedged and heals it
/// gently (arm keepalive on the dead connection); once the new server is
/// reachable, the probe draws a reset, the runner's own reconnect logic runs,
/// and a later `check` sees it recovered. No signal, same pid.
#[test]
fn check_heals_a_half_open_control_connection_and_sees_the_runner_recover() {
    let _area = tests::area(module_path!());
    heal_flow("check_heals", "direct", false);
}

/// The same timer flow, healing through a running `selfheal helper`: the
/// helper performs the step and audits it.
#[test]
fn check_heals_through_the_helper() {
    let _area = tests::area(module_path!());
    heal_flow("check_heals_helper", "helper", true);
}

/// The timer flow of the two tests above (`test` says which, when it is
/// skipped: it needs root).
fn heal_flow(test: &str, tag: &str, through_helper: bool) {
    if !need_root(test) {
        return;
    }
    let pair = NetnsPair::new(&format!("h{}", &tag[..1])).expect("netns pair");
    let peer = tests::helper_bin("recv-peer");
    let b = pair.b_addr.clone();
    let server = |pair: &NetnsPair| pair.listening_in_b(&["beats", &format!("{b}:7443"), "300"]);
    let old_server = server(&pair);
    let mut cmd = pair.a.command(&peer);
    cmd.args(["reconnecting", &format!("{b}:7443")]);
    let runner = Peer::spawn(cmd);
    let first = runner.ready();
    let dirs = Scratch::new(&format!("check-{tag}"));
    let config = dirs.0.join("config.toml");
    let helper = through_helper.then(|| {
        let mut h = Command::new(selfheal_bin())
            .args(["helper", "--tracer", "--socket"])
            .arg(dirs.0.join("helper.sock"))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the helper");
        let up = tests::wait_for(10 * SEC, Duration::from_millis(50), || {
            dirs.0.join("helper.sock").exists().then_some(())
        });
        if up.is_none() {
            let _ = h.kill();
            panic!("the helper did not come up");
        }
        h
    });
    std::fs::write(
        &config,
        format!(
            "{}[agent.heal]\nstep_window = \"20s\"\nbackoff = \"1s\"\n",
            control_runner("reconnecting", &b)
        ),
    )
    .unwrap();
    std::thread::sleep(SEC);
    let (_, r) = check(&dirs.0, &config);
    assert_eq!(verdict_of(&r, "runner")["verdict"], "idle", "{r:#?}");

    // The server vanishes without a FIN, and a new one takes its place.
    pair.cut_port_in_b(7443).expect("nft");
    drop(old_server);
    let _new_server = server(&pair);

    let mut healed = None;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(500));
        let (code, r) = check(&dirs.0, &config);
        let o = verdict_of(&r, "runner");
        if o["verdict"] == "wedged" {
            let actions = o["heal"]["actions"].as_array().cloned().unwrap_or_default();
            assert_eq!(actions.len(), 1, "one gentle step: {o:#}");
            assert_eq!(actions[0]["step"]["action"], "arm_keepalive", "{o:#}");
            assert_eq!(actions[0]["ok"], true, "{o:#}");
            assert!(
                o["snapshot"].is_string(),
                "no action without a snapshot: {o:#}"
            );
            if through_helper {
                // The evidence includes the helper's eBPF picture.
                let out = Command::new(selfheal_bin())
                    .args([
                        "snapshots",
                        "show",
                        o["snapshot"].as_str().unwrap(),
                        "--json",
                        "--dir",
                    ])
                    .arg(dirs.0.join("snapshots"))
                    .output()
                    .unwrap();
                let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let ebpf = &snap["snapshot"]["evidence"]["ebpf"];
                assert!(
                    ebpf["strategy"].is_string(),
                    "eBPF evidence from the helper: {ebpf:#}"
                );
            }
            assert_eq!(code, 1, "wedged and healed");
            healed = Some(Instant::now());
            break;
        }
    }
    let healed = healed.expect("check found the runner wedged and healed it");
    // The new server is reachable: the old connection's keepalive probe draws
    // a reset, the runner reconnects by itself.
    pair.restore_port_in_b(7443).expect("nft");
    let again = runner.ready();
    assert_ne!(again.inode, first.inode, "a new connection");
    assert_eq!(again.pid, first.pid, "same process: no signal, no restart");
    let recovered = tests::wait_for(10 * SEC, Duration::from_millis(500), || {
        let (code, r) = check(&dirs.0, &config);
        (verdict_of(&r, "runner")["verdict"] == "idle").then_some(code)
    });
    assert_eq!(
        recovered,
        Some(0),
        "a later check sees the runner recovered"
    );
    eprintln!(
        "[{tag}] healed by keepalive; recovered {:?} after the heal",
        healed.elapsed()
    );
    if let Some(h) = helper {
        // SAFETY: a plain kill(2) of our own child.
        unsafe { libc::kill(h.id() as libc::pid_t, libc::SIGTERM) };
        let out = h.wait_with_output().expect("helper output");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(
            log.contains("act performed") && log.contains("arm_keepalive"),
            "the helper audited the action: {log}"
        );
    }
}

/// `watch --metrics-addr` on a free loopback port; the child and the port.
fn watch_with_metrics(dirs: &Scratch, addr_ip: &str, count: &str) -> (std::process::Child, u16) {
    let config = own_agent_config(dirs);
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = Command::new(selfheal_bin())
        .args([
            "watch",
            "--interval",
            "200ms",
            "--count",
            count,
            "--metrics-public",
            "--metrics-addr",
            &format!("{addr_ip}:{port}"),
            "--config",
        ])
        .arg(&config)
        .args(
            Places::under(&dirs.0)
                .helper(dirs.0.join("helper.sock"))
                .args(),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    (child, port)
}

/// One scrape of `/metrics` on `port`, given at most `limit`: the response,
/// or why none came.
fn scrape(port: u16, limit: Duration) -> Result<String, String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), limit)
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(limit)).unwrap();
    s.set_write_timeout(Some(limit)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .map_err(|e| format!("send: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("read: {e}"))?;
    Ok(text)
}

/// Idle connections (opened, never a byte sent) do not hold up
/// a real scrape: it is served at once, well inside Prometheus's default
/// 10 s scrape timeout (the old endpoint served one connection at a time,
/// giving each 2 s: 6 idle connections made a scrape wait 12 s).
#[test]
fn a_scrape_is_not_delayed_by_idle_connections() {
    let _area = tests::area(module_path!());
    let dirs = Scratch::new("check-idle-scrape");
    let (mut child, port) = watch_with_metrics(&dirs, "127.0.0.1", "200");
    let first = tests::wait_for(10 * SEC, Duration::from_millis(100), || {
        scrape(port, SEC)
            .ok()
            .filter(|t| t.contains("selfheal_agent_verdict{agent=\"me\""))
    });
    assert!(first.is_some(), "metrics served at all");
    let mut results = Vec::new();
    for idle_n in [8usize, 32] {
        let idle: Vec<std::net::TcpStream> = (0..idle_n)
            .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("idle connection"))
            .collect();
        // Let the server accept them all before the real scrape.
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let got = scrape(port, 9 * SEC);
        let took = started.elapsed();
        println!(
            "scrape behind {idle_n} idle connections: {:.3} s ({})",
            took.as_secs_f64(),
            got.as_ref().map_or_else(
                |e| e.clone(),
                |b| b.lines().next().unwrap_or("").to_string()
            )
        );
        drop(idle);
        results.push((idle_n, took, got));
        if results.last().is_some_and(|r| r.2.is_err()) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    for (idle_n, took, got) in results {
        let body = got.unwrap_or_else(|e| panic!("behind {idle_n} idle: no answer: {e}"));
        assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
        assert!(
            took < 5 * SEC,
            "a scrape behind {idle_n} idle connections took {took:?}: past half of Prometheus's 10 s"
        );
    }
}

/// An endpoint reachable from other hosts is said in the log,
/// with the warning that it has no authentication.
#[test]
fn a_metrics_endpoint_on_all_addresses_is_said_in_the_log() {
    let _area = tests::area(module_path!());
    use std::io::Read as _;
    let dirs = Scratch::new("check-any-addr");
    let (mut child, _) = watch_with_metrics(&dirs, "0.0.0.0", "1");
    let done = tests::wait_for(20 * SEC, Duration::from_millis(50), || {
        child.try_wait().ok().flatten()
    });
    if done.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        err.contains("reachable from other hosts") && err.contains("no authentication"),
        "binding 0.0.0.0 is said in the log: {err}"
    );
}

/// The metrics file is 0640 (owner and the directory's group),
/// not 0644: probe URLs and agent names are not for every local user.
#[test]
fn the_metrics_file_is_not_world_readable() {
    let _area = tests::area(module_path!());
    use std::os::unix::fs::MetadataExt as _;
    let dirs = Scratch::new("check-prom-mode");
    let config = own_agent_config(&dirs);
    let (code, _) = check(&dirs.0, &config);
    assert_eq!(code, 0);
    let md = std::fs::metadata(dirs.0.join("selfheal.prom")).expect("metrics written");
    let dir_gid = std::fs::metadata(&dirs.0).unwrap().gid();
    println!("metrics file mode {:04o}", md.mode() & 0o7777);
    assert_eq!(md.mode() & 0o7777, 0o640, "mode");
    assert_eq!(md.gid(), dir_gid, "the directory's group reads it");
}

/// With no snapshot directory there is no healing, and every
/// check says so as a gap (not only the first, not only in the log).
#[test]
fn no_snapshot_dir_is_a_gap_on_every_check() {
    let _area = tests::area(module_path!());
    let dirs = Scratch::new("check-nosnap-gap");
    let config = own_agent_config(&dirs);
    let not_a_dir = dirs.0.join("snapshots");
    std::fs::write(&not_a_dir, b"not a directory").unwrap();
    let out = Command::new(selfheal_bin())
        .args(["watch", "--json", "--interval", "50ms", "--count", "3"])
        .arg("--config")
        .arg(&config)
        .args(
            Places::under(&dirs.0)
                .snapshots(&not_a_dir)
                .helper(dirs.0.join("helper.sock"))
                .args(),
        )
        .output()
        .unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{}", String::from_utf8_lossy(&out.stderr));
    for (n, l) in lines.iter().enumerate() {
        let gaps = l["gaps"].as_array().cloned().unwrap_or_default();
        assert!(
            gaps.iter().any(|g| g
                .as_str()
                .is_some_and(|g| g.contains("healing disabled: no snapshot dir")
                    && g.contains("--snapshot-dir"))),
            "check {n}: {l}"
        );
    }
}

/// The `at_ms=` of a `recv-peer connect` line.
fn at_ms(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("at_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no at_ms in {line:?}"))
}

/// A connect whose SYNs are dropped, on this kernel's own SYN schedule
/// (since Linux 6.5 the first resends are 1 s apart: 5 resent 5 s in),
/// with `connect_timeout = "8s"` and `check` run every second: the attempt
/// is ended no earlier than 8 s after the connect began, within a check of
/// that, and the age its reason claims is never more than the connect's
/// real age when the check ended. (Read as 1, 2, 4 … s apart, 5 resends
/// were called 31 s and the connect ended about 5 s in.)
#[test]
fn a_connect_is_ended_no_earlier_than_its_connect_timeout() {
    let _area = tests::area(module_path!());
    if !need_root("connect_timeout") {
        return;
    }
    const TIMEOUT_MS: u64 = 8_000;
    let pair = NetnsPair::new("ct").expect("netns pair");
    let b = pair.b_addr.clone();
    let port = 7450;
    pair.drop_port_into_b(port).expect("nft");
    let dirs = Scratch::new("check-connect-timeout");
    let config = dirs.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"connector\"\nmatch = {{ cmdline = \"recv-peer connect {b}:{port}$\" }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{b}:{port}\"\nconnect_timeout = \"{}s\"\n",
            TIMEOUT_MS / 1000
        ),
    )
    .expect("write config");
    let mut cmd = pair.a.command(&tests::helper_bin("recv-peer"));
    cmd.args(["connect", &format!("{b}:{port}")]);
    let client = Peer::spawn(cmd);
    let began = at_ms(&client.expect("connecting ", 10 * SEC));
    let places = Places::without_helper(&dirs);
    let (mut first_check, mut longest, mut failed) = (None, 0u64, None);
    let mut claims: Vec<(u64, u64, String)> = Vec::new();
    // Bounded: 40 checks, 60 s (the kernel itself gives up after ~130 s).
    let deadline = Instant::now() + 60 * SEC;
    for _ in 0..40 {
        if Instant::now() > deadline {
            break;
        }
        let start = tests::monotonic_ms();
        first_check.get_or_insert(start);
        let run = tests::run_check_at(&config, &places, &[]);
        let end = tests::monotonic_ms();
        longest = longest.max(end - start);
        for r in run.agent("connector")["reasons"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if r["code"] == "connect_timeout" {
                let waited = r["evidence"]["waited_ms"].as_u64().expect("waited_ms");
                let message = r["message"].as_str().unwrap_or_default().to_string();
                claims.push((waited, end - began, message));
            }
        }
        if let Some(line) = client.try_expect("failed ", SEC) {
            failed = Some(line);
            break;
        }
    }
    let failed = failed.unwrap_or_else(|| panic!("the connect was never ended: {claims:?}"));
    let ended = at_ms(&failed) - began;
    let first = first_check.expect("a check ran") - began;
    eprintln!(
        "connect_timeout: ended {ended} ms after the connect began (first check at {first} ms, longest check {longest} ms): {failed}; claims {claims:?}"
    );
    assert!(
        ended >= TIMEOUT_MS,
        "ended {ended} ms in, before its connect_timeout of {TIMEOUT_MS} ms: {claims:?}"
    );
    // The check after the first sight's timeout starts within one interval
    // (1 s between checks) and a check's time, and then runs one.
    let bound = first + TIMEOUT_MS + 1_000 + 2 * longest;
    assert!(ended <= bound, "ended {ended} ms in (bound {bound} ms)");
    assert!(!claims.is_empty(), "no connect_timeout reason");
    for (waited, real, message) in &claims {
        assert!(
            waited <= real,
            "claimed {waited} ms at a real age of {real} ms: {message}"
        );
    }
}

/// A silent call with a proof keepalive armed, whose server then closes
/// (FIN) and exits: its kernel's leftover FIN-WAIT-2 socket answers the
/// proof's probes for up to 60 s. The close is the evidence: `wedged`
/// (`peer_closed`) within its 2 s grace, one check interval and two
/// checks' time of the close, not when the lingering socket goes.
#[test]
fn a_peer_that_closes_under_a_proof_is_judged_within_its_grace() {
    let _area = tests::area(module_path!());
    if !need_root("close_under_proof") {
        return;
    }
    const GRACE_MS: u64 = 2_000;
    let pair = NetnsPair::new("cw").expect("netns pair");
    let b = pair.b_addr.clone();
    let addr = format!("{b}:7451");
    let mut server = pair.listening_in_b(&["server", &addr]);
    let mut cmd = pair.a.command(&tests::helper_bin("recv-peer"));
    cmd.args(["client", &addr, "--once"]);
    let mut client = Peer::spawn(cmd);
    let ready = client.ready();
    client.tell("go");
    server.tell("send 10");
    client.expect("got 10", 10 * SEC);
    let fd = tests::socket_fd_of(ready.pid, ready.inode).expect("the client's socket fd");
    let dirs = Scratch::new("check-close-under-proof");
    let config = dirs.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"closer\"\nmatch = {{ cmdline = \"recv-peer client {addr} --once$\" }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{addr}\"\n\
             [agent.thresholds]\nsuspect_after = \"2s\"\n\
             [agent.proof]\nidle = \"1s\"\ninterval = \"1s\"\ncount = 3\n"
        ),
    )
    .expect("write config");
    let places = Places::without_helper(&dirs);
    let mut longest = 0u64;
    let run = |longest: &mut u64| {
        let start = tests::monotonic_ms();
        let r = tests::run_check_at(&config, &places, &[]);
        let end = tests::monotonic_ms();
        *longest = (*longest).max(end - start);
        std::thread::sleep(SEC);
        (r, end)
    };
    // Checks until the silent call carries a proof keepalive (bounded).
    let mut armed = false;
    for _ in 0..15 {
        run(&mut longest);
        if tests::keepalive_enabled(ready.pid, fd).expect("read SO_KEEPALIVE") {
            armed = true;
            break;
        }
    }
    assert!(armed, "no proof keepalive was armed on the silent call");
    server.tell("close");
    let closed = tests::monotonic_ms();
    // The bound counts the checks after the close only.
    longest = 0;
    let mut found = None;
    let mut seen = Vec::new();
    for _ in 0..20 {
        let (r, end) = run(&mut longest);
        let a = r.agent("closer");
        let codes: Vec<String> = a["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["code"].as_str().map(String::from))
            .collect();
        seen.push((end - closed, a["verdict"].to_string(), codes.clone()));
        if a["verdict"] == "wedged" && codes.iter().any(|c| c == "peer_closed") {
            found = Some(end - closed);
            break;
        }
    }
    let found = found.unwrap_or_else(|| panic!("never peer_closed: {seen:?}"));
    let bound = GRACE_MS + 1_000 + 2 * longest;
    eprintln!(
        "close_under_proof: wedged (peer_closed) {found} ms after the close (bound {bound} ms, longest check {longest} ms): {seen:?}"
    );
    assert!(
        found <= bound,
        "wedged {found} ms after the close (bound {bound}): {seen:?}"
    );
}
