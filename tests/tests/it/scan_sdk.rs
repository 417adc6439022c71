//! `selfheal scan` against clients nobody here wrote, as root: the
//! official SDKs (Python `openai` and `anthropic`, sync and async, and
//! Node's `openai`) calling the testbed's provider over TLS through its
//! TLS edge (a CA made for the bed, trusted through the clients' own
//! `SSL_CERT_FILE` and `NODE_EXTRA_CA_CERTS`), from the runners' network
//! namespace; and grpcio streams over TLS (`tests/py/grpc_control.py`) in
//! the provider's. Of each, one call is cut mid-call (its flow dropped
//! both ways in the provider's namespace, without a FIN or RST) and one
//! thinks (the provider alive and silent, answering later).
//!
//! All of them at once: `scan --json` lists every call `suspect` and none
//! `dead`; one `scan --prove --pid …` over all of them proves each cut
//! call `dead` within the bound it states and each thinking call `alive`,
//! and puts every socket's own options back; then every thinking call
//! completes, same pid, and every cut one still waits, same pid. One scan
//! proves them all: their sockets are distinct, so no proof reads
//! another's options (the `proving()` lock of `scan.rs` keeps its tests'
//! proofs from running beside each other; this area runs alone).

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use selfheal_testbed::scenario::{self, Bed, FAST_MODEL, NEVER_MODEL, Options};
use serde_json::Value;
use tests::{need_root, selfheal_bin, testbed_bin};

use super::scan::{PROOF_SLACK, fd_of, on, options_of, proof_of, run_scan, scan};

/// How long a thinking call thinks before it answers: past the time the
/// callers take to start, be `suspect` and be proven (one proof's bound).
const THINK: Duration = Duration::from_secs(60);

/// Where the grpcio server listens, on loopback of the provider's
/// namespace.
const GRPC_PORT: u16 = 9555;

/// One client's call: its program (`cut-SDK` or `think-SDK`), its process,
/// when its call started, and the connection it waits on.
struct Call {
    name: String,
    cut: bool,
    pid: u32,
    started: Instant,
    /// The line that says the thinking call completed.
    done: &'static str,
    inode: u64,
    local: SocketAddr,
    remote: SocketAddr,
}

/// An SDK client: the runner's `--sdk`, and whether Node runs it.
struct Sdk {
    sdk: &'static str,
    node: bool,
}

const SDKS: &[Sdk] = &[
    Sdk {
        sdk: "openai",
        node: false,
    },
    Sdk {
        sdk: "anthropic",
        node: false,
    },
    Sdk {
        sdk: "openai-async",
        node: false,
    },
    Sdk {
        sdk: "anthropic-async",
        node: false,
    },
    Sdk {
        sdk: "openai",
        node: true,
    },
];

/// Starts `name` in `bed` and waits (within `limit`) for `line`: when.
fn start(bed: &mut Bed, name: &str, cmd: Command, line: &str, limit: Duration) -> Instant {
    bed.spawn(name, cmd, None)
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    bed.expect_line(name, line, limit)
        .unwrap_or_else(|e| panic!("{name}: {e:#}"));
    Instant::now()
}

/// `pid`'s established connection to `remote`, once it has one (polled
/// every 100 ms, at most `polls` times): its inode and local address.
fn connection_of(pid: u32, remote: SocketAddr, polls: u32) -> (u64, SocketAddr) {
    for _ in 0..polls {
        let found = scenario::tcp_sockets(pid)
            .unwrap_or_default()
            .into_iter()
            .find(|s| s.remote == remote && s.state == 1);
        if let Some(s) = found {
            return (s.inode, s.local);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("pid {pid}: no connection to {remote} after {polls} polls");
}

/// An address a finding names (`local`, `remote`), an IPv4-mapped one as
/// the IPv4 address it is (grpcio's sockets are dual-stack).
fn addr(v: &Value) -> SocketAddr {
    let a: SocketAddr = v
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an address: {v}"));
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// `pid`'s connection to `remote` as the census lists it (an IPv6 socket
/// too, which `/proc/PID/net/tcp` leaves out): its inode and local
/// address.
fn listed(pid: u32, remote: SocketAddr) -> (u64, SocketAddr) {
    let (f, _) = super::scan::until_in(
        |run| {
            run.findings
                .iter()
                .find(|f| f["pid"] == pid && f.get("remote").is_some_and(|r| addr(r) == remote))
        },
        40,
        |_| true,
    );
    (f["inode"].as_u64().expect("inode"), addr(&f["local"]))
}

#[test]
fn scan_proves_the_official_sdks_cut_calls_dead_and_their_thinking_calls_alive() {
    let _area = tests::area(module_path!());
    if !need_root("scan_sdk") {
        return;
    }
    let opts = Options {
        selfheal: selfheal_bin(),
        testbed: testbed_bin(),
        heartbeat: Duration::from_secs(1),
        check_every: Duration::from_secs(1),
        net: tests::subnet_251(),
        keep_snapshots: None,
        env: Vec::new(),
        check_args: Vec::new(),
    };
    let mut bed = Bed::new(&opts, "scsdk", Duration::from_secs(1)).expect("the bed");
    let edge = scenario::tls_edge(&mut bed).expect("the TLS edge");
    let ca: PathBuf = bed.tls_ca().expect("the edge's CA").to_path_buf();
    let (python, py_runner) = scenario::sdk_runner().expect("the Python SDKs");
    let (node, node_runner) = scenario::node_sdk_runner().expect("the Node SDKs");
    // Slow starts (ten SDK clients at once on a loaded machine) are no
    // finding: a generous limit on each program's first words.
    let starting = Duration::from_secs(120);
    let thinking = format!("think-{}-gap-100-tokens-5-first-early", THINK.as_millis());
    let never = format!("{NEVER_MODEL}-first-early");

    let mut calls = Vec::new();
    for s in SDKS {
        let (program, script) = if s.node {
            (&node, &node_runner)
        } else {
            (&python, &py_runner)
        };
        let base = if s.sdk.starts_with("anthropic") {
            format!("https://{edge}")
        } else {
            format!("https://{edge}/v1")
        };
        for cut in [true, false] {
            let name = format!(
                "{}-{}{}",
                if cut { "cut" } else { "think" },
                if s.node { "node-" } else { "" },
                s.sdk
            );
            let mut cmd = bed.topo.runners.command(program);
            cmd.env("SSL_CERT_FILE", &ca)
                .env("NODE_EXTRA_CA_CERTS", &ca)
                .arg(script)
                .args(["--name", &name, "--sdk", s.sdk, "--base-url", &base])
                .args(["--model", if cut { &never } else { &thinking }])
                .args(["--then-model", FAST_MODEL]);
            // Started all at once; each is waited for below.
            bed.spawn(&name, cmd, None)
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            calls.push((name, cut, "call 1 done"));
        }
    }
    // grpcio on both ends, over TLS, on the provider's loopback: a server
    // whose stream sends one message, thinks, sends another, then stops.
    let dir = tests::Scratch::new("scan-sdk-grpc");
    let (grpc_ca, cert, key) =
        scenario::make_certs(&dir.join("ca"), &[std::net::Ipv4Addr::LOCALHOST.into()])
            .expect("a CA and a certificate for 127.0.0.1");
    let grpc = concat!(env!("CARGO_MANIFEST_DIR"), "/py/grpc_control.py");
    let mut cmd = bed.topo.provider.command(&python);
    cmd.args([grpc, "server", &GRPC_PORT.to_string()])
        .args([THINK.as_millis().to_string(), "2".into()])
        .args([&cert, &key]);
    start(&mut bed, "grpc-server", cmd, "listening", starting);
    let grpc_remote = SocketAddr::from(([127, 0, 0, 1], GRPC_PORT));
    let mut grpc_calls = Vec::new();
    for cut in [true, false] {
        let name = if cut { "cut-grpc" } else { "think-grpc" };
        // Channel keepalive an hour apart: the stream is silent.
        let mut cmd = bed.topo.provider.command(&python);
        cmd.args([grpc, "client", &GRPC_PORT.to_string(), "3600000"])
            .arg(&grpc_ca);
        let started = start(&mut bed, name, cmd, "beat 1", starting);
        let pid = bed.pid(name).expect("its pid");
        let (inode, local) = listed(pid, grpc_remote);
        grpc_calls.push(Call {
            name: name.into(),
            cut,
            pid,
            started,
            done: "beat 2",
            inode,
            local,
            remote: grpc_remote,
        });
    }
    for (name, cut, done) in calls.drain(..) {
        let started = bed
            .expect_line(&name, "call 1 start", starting)
            .map(|_| Instant::now())
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let pid = bed.pid(&name).expect("its pid");
        let (inode, local) = connection_of(pid, edge, 300);
        grpc_calls.push(Call {
            name,
            cut,
            pid,
            started,
            done,
            inode,
            local,
            remote: edge,
        });
    }
    let calls = grpc_calls;

    // Every call silent past --silent-for, waited on: suspect, cut or not.
    for c in &calls {
        let (f, _) = super::scan::until(c.inode, 80, |f| f["verdict"] == "suspect");
        assert_eq!(f["pid"], c.pid, "{}: {f}", c.name);
        assert_eq!(addr(&f["remote"]), c.remote, "{}: {f}", c.name);
    }
    let before: Vec<_> = {
        let run = scan();
        calls
            .iter()
            .map(|c| {
                let f = on(&run, c.inode).unwrap_or_else(|| panic!("{}: not listed", c.name));
                let fd = fd_of(f);
                let own = options_of(c.pid, fd);
                eprintln!("{}: its own keepalive options {own:?}", c.name);
                (fd, own)
            })
            .collect()
    };
    for c in calls.iter().filter(|c| c.cut) {
        bed.topo
            .drop_provider_flow(c.local)
            .unwrap_or_else(|e| panic!("{}: cut: {e:#}", c.name));
    }
    let cut_at = Instant::now();
    let run = scan();
    for c in &calls {
        let f = on(&run, c.inode).unwrap_or_else(|| panic!("{}: not listed", c.name));
        assert_eq!(f["verdict"], "suspect", "{}: {f}", c.name);
    }
    assert!(
        run.findings.iter().all(|f| f["verdict"] != "dead"),
        "a scan without --prove proves nothing dead"
    );
    // Each thinking call still thinks: none has answered yet.
    let oldest = calls.iter().map(|c| c.started.elapsed()).max();
    eprintln!("the oldest call began {oldest:?} before the cut");
    for c in calls.iter().filter(|c| !c.cut) {
        assert!(
            c.started.elapsed() < THINK,
            "{}: set-up took past its thinking ({:?})",
            c.name,
            c.started.elapsed()
        );
    }

    let pids: Vec<String> = calls.iter().map(|c| c.pid.to_string()).collect();
    let mut args = vec!["--prove"];
    for p in &pids {
        args.extend(["--pid", p.as_str()]);
    }
    let proving_at = Instant::now();
    let run = run_scan(None, &args);
    eprintln!("scan --prove took {:?}: {:?}", run.took, run.findings);
    assert_eq!(run.stderr, "", "nothing but the answer");
    let mut longest = 0;
    for c in &calls {
        let f = on(&run, c.inode).unwrap_or_else(|| panic!("{}: not listed", c.name));
        let (result, after, bound) = proof_of(f);
        longest = longest.max(bound);
        assert_eq!(f["proof"]["restored"], true, "{}: {f}", c.name);
        if c.cut {
            assert_eq!(f["verdict"], "dead", "{}: {f}", c.name);
            assert_eq!(result, "dead", "{}: {f}", c.name);
            // Never before its bound, at most the slack past it.
            assert!(after >= bound, "{}: proven dead early: {f}", c.name);
            assert!(
                after <= bound + PROOF_SLACK.as_millis() as u64,
                "{}: proven dead late: {f}",
                c.name
            );
            let cut_to_dead = proving_at.duration_since(cut_at).as_millis() as u64 + after;
            eprintln!(
                "SCAN_SDK {}: cut -> proven dead {cut_to_dead} ms (proof {after} ms of its bound {bound} ms + {} ms slack)",
                c.name,
                PROOF_SLACK.as_millis()
            );
        } else {
            assert_eq!(f["verdict"], "alive", "{}: {f}", c.name);
            assert_eq!(result, "alive", "{}: {f}", c.name);
            assert!(after < bound, "{}: {f}", c.name);
            eprintln!(
                "SCAN_SDK {}: thinking -> proven alive after {after} ms (bound {bound} ms)",
                c.name
            );
        }
    }
    // The whole run within the longest stated bound, the slack and a
    // plain scan's own time (ten of them: the proofs' reads and the puts
    // back).
    let plain = scan();
    let limit = Duration::from_millis(longest) + PROOF_SLACK + 10 * plain.took;
    assert!(run.took <= limit, "{:?} > {limit:?}", run.took);
    assert_eq!(run.code, 2, "a dead connection exits 2");

    // Nothing else was done: every socket has its own options back, and
    // every call is where it was.
    for (c, (fd, options)) in calls.iter().zip(&before) {
        assert_eq!(options_of(c.pid, *fd), *options, "{}", c.name);
    }
    for c in calls.iter().filter(|c| !c.cut) {
        // It answers when its thinking is over; the scans' own time is
        // the slack on a loaded machine.
        let left = (THINK + run.took).saturating_sub(c.started.elapsed());
        bed.expect_line(&c.name, c.done, left)
            .unwrap_or_else(|e| panic!("{}: the thinking call did not complete: {e:#}", c.name));
    }
    for c in &calls {
        assert!(bed.running(&c.name).expect("its state"), "{} ended", c.name);
        assert_eq!(bed.pid(&c.name).expect("its pid"), c.pid, "{}", c.name);
    }
    // Each cut call still waits, or its client's own keepalive (the
    // options put back: Node's probes 1 s apart after 60 s idle) ended it,
    // in the client's own error path.
    let after = scan();
    for c in calls.iter().filter(|c| c.cut) {
        match on(&after, c.inode) {
            Some(f) => assert_eq!(f["pid"], c.pid, "{}: {f}", c.name),
            None => {
                let lines = bed.lines(&c.name).expect("its lines");
                let failed = lines.iter().find(|l| l.starts_with("call 1 failed"));
                eprintln!("{}: its own call ended: {failed:?}", c.name);
                assert!(
                    failed.is_some(),
                    "{}: gone without its call failing: {lines:?}",
                    c.name
                );
            }
        }
    }
}
