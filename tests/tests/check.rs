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

use tests::{NetnsPair, Peer, need_root, selfheal_bin};

const SEC: Duration = Duration::from_secs(1);

struct Dirs(PathBuf);

impl Dirs {
    fn new(tag: &str) -> Dirs {
        let d = std::env::temp_dir().join(format!("selfheal-check-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dirs(d)
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `selfheal check --json` with the test's state and snapshot dirs: exit
/// code and one JSON value per agent.
fn check(dirs: &Path, config: &Path) -> (i32, Vec<serde_json::Value>) {
    let out = Command::new(selfheal_bin())
        .args(["check", "--json", "--config"])
        .arg(config)
        .arg("--state-dir")
        .arg(dirs.join("state"))
        .arg("--snapshot-dir")
        .arg(dirs.join("snapshots"))
        .arg("--metrics-file")
        .arg(dirs.join("selfheal.prom"))
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
    if !need_root("check_e2e") {
        return;
    }
    let pair = NetnsPair::new("chk").expect("netns pair");
    let peer = tests::helper_bin("recv-peer");
    let b = pair.b_addr.clone();
    // Servers in b: heartbeats every 300 ms on 7443; a slow stream (a byte
    // every 2 s) on 8443; a peer that accepts and never sends on 9443.
    let mut servers = Vec::new();
    for args in [
        vec!["beat".to_string(), format!("{b}:7443"), "300".into()],
        vec!["beat".into(), format!("{b}:8443"), "2000".into()],
        vec!["sink".into(), format!("{b}:9443")],
    ] {
        let mut cmd = pair.b.command(&peer);
        cmd.args(&args);
        let s = Peer::spawn(cmd);
        s.expect("listening", 10 * SEC);
        servers.push(s);
    }
    // Three runners in a, each a blocking client of one server.
    let mut clients = Vec::new();
    for port in [7443, 8443, 9443] {
        let mut cmd = pair.a.command(&peer);
        cmd.args(["client", &format!("{b}:{port}")]);
        let mut c = Peer::spawn(cmd);
        c.ready();
        c.tell("go");
        clients.push(c);
    }
    let dirs = Dirs::new("e2e");
    let config = dirs.0.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"wedging\"\nmatch = {{ cmdline = \"recv-peer client {b}:7443$\" }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"{b}:7443\"\nheartbeat = \"1s\"\n\
             [agent.thresholds]\nsuspect_after = \"2s\"\n\
             [[agent]]\nname = \"streaming\"\nmatch = {{ cmdline = \"recv-peer client {b}:8443$\" }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{b}:8443\"\n\
             [agent.thresholds]\nsuspect_after = \"5s\"\n\
             [[agent]]\nname = \"thinking\"\nmatch = {{ cmdline = \"recv-peer client {b}:9443$\" }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{b}:9443\"\n\
             [agent.thresholds]\nsuspect_after = \"2s\"\n"
        ),
    )
    .unwrap();

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
            assert_eq!(code, 2);
            assert_eq!(w["reasons"][0]["code"], "control_silent", "{w:#}");
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
    let out = Command::new(selfheal_bin())
        .args(["snapshots", "show", &id, "--json", "--dir"])
        .arg(dirs.0.join("snapshots"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
    let dirs = Dirs::new("concurrent");
    let config = dirs.0.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"me\"\nmatch = {{ pid = {} }}\n",
            std::process::id()
        ),
    )
    .unwrap();
    let runs: Vec<_> = (0..4)
        .map(|_| {
            Command::new(selfheal_bin())
                .args(["check", "--json", "--config"])
                .arg(&config)
                .arg("--state-dir")
                .arg(dirs.0.join("state"))
                .arg("--snapshot-dir")
                .arg(dirs.0.join("snapshots"))
                .output()
        })
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

#[test]
fn a_garbage_state_file_is_replaced_and_reported() {
    let dirs = Dirs::new("garbage");
    let config = dirs.0.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"me\"\nmatch = {{ pid = {} }}\n",
            std::process::id()
        ),
    )
    .unwrap();
    std::fs::create_dir_all(dirs.0.join("state")).unwrap();
    std::fs::write(
        dirs.0.join("state/state.json"),
        b"{\"version\": 99, \"data\": 7}",
    )
    .unwrap();
    let out = Command::new(selfheal_bin())
        .args(["check", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dirs.0.join("state"))
        .arg("--snapshot-dir")
        .arg(dirs.0.join("snapshots"))
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
