//! Which capability each of `watch`'s reads and acts needs, measured: uid 0
//! with only the capabilities under test (`setpriv`, as the DaemonSet's
//! `drop: [ALL]` plus `add` makes it) does what `watch` does to an agent
//! of another uid and to a uid-0 agent with a full capability set (a pod's
//! root process): list and read `/proc/PID/fd`, `fdinfo`, `exe`,
//! `ns/net`, `syscall`, `setns` into its network namespace, signal it.
//! The matrix is printed and checked, and every capability it shows
//! needed is in docs/capabilities.md's table for `watch`.

use std::{
    collections::BTreeSet,
    path::Path,
    process::{Child, Command, Stdio},
};

use tests::{is_root, runtimes::have, skip};

/// A process killed on drop.
struct Target(Child);

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sleep 60` in its own network namespace, as uid 65534 (`nobody`) or
/// as root with every capability.
fn target(nobody: bool) -> Target {
    let mut cmd = Command::new("unshare");
    cmd.arg("-n");
    if nobody {
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
    }
    cmd.args(["sleep", "60"]);
    let child = cmd.stdin(Stdio::null()).spawn().expect("start the target");
    // The exec chain (unshare, setpriv, sleep) keeps the pid.
    let pid = child.id();
    let ok = tests::wait_for(
        std::time::Duration::from_secs(5),
        std::time::Duration::from_millis(20),
        || {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .ok()
                .filter(|c| c.trim() == "sleep")
        },
    );
    assert!(ok.is_some(), "the target runs sleep");
    Target(child)
}

/// The probes: (name, shell command on `$T`, exits 0 when it worked).
const PROBES: [(&str, &str); 8] = [
    ("list /proc/PID/fd", "ls /proc/$T/fd"),
    ("readlink /proc/PID/fd/N", "readlink /proc/$T/fd/0"),
    ("list /proc/PID/fdinfo", "ls /proc/$T/fdinfo"),
    ("readlink /proc/PID/exe", "readlink /proc/$T/exe"),
    ("readlink /proc/PID/ns/net", "readlink /proc/$T/ns/net"),
    ("read /proc/PID/syscall", "cat /proc/$T/syscall"),
    ("setns into its netns", "nsenter --net=/proc/$T/ns/net true"),
    ("signal it (kill -0)", "kill -0 $T"),
];

/// Which probes uid 0 with only `caps` passes on `pid`.
fn passes(pid: u32, caps: &[&str]) -> BTreeSet<&'static str> {
    let set: String = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut out = BTreeSet::new();
    for (name, probe) in PROBES {
        let ok = Command::new("setpriv")
            .arg(format!("--inh-caps={set}"))
            .arg(format!("--ambient-caps={set}"))
            .arg(format!("--bounding-set={set}"))
            .args(["--", "sh", "-c", probe])
            .env("T", pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run setpriv")
            .success();
        if ok {
            out.insert(name);
        }
    }
    out
}

#[test]
fn each_read_and_act_of_watch_needs_the_documented_capability() {
    let _area = tests::area(module_path!());
    const TEST: &str = "each_read_and_act_of_watch_needs_the_documented_capability";
    if !is_root() {
        return skip(TEST, "needs root (uid 0 with chosen capabilities)");
    }
    for tool in ["setpriv", "unshare", "nsenter"] {
        if !have(tool) {
            return skip(TEST, &format!("no {tool} (util-linux)"));
        }
    }
    let sets: [&[&str]; 7] = [
        &[],
        &["sys_ptrace"],
        &["dac_read_search"],
        &["sys_ptrace", "dac_read_search"],
        &["kill"],
        &["sys_ptrace", "sys_admin"],
        &["sys_ptrace", "dac_read_search", "sys_admin", "kill"],
    ];
    // (target, probe) → the smallest capability sets it passed with.
    let mut needed: BTreeSet<String> = BTreeSet::new();
    for nobody in [true, false] {
        let t = target(nobody);
        let who = if nobody {
            "uid 65534"
        } else {
            "uid 0, all capabilities"
        };
        let results: Vec<BTreeSet<&str>> = sets.iter().map(|c| passes(t.0.id(), c)).collect();
        eprintln!("target {who} (pid {}):", t.0.id());
        for (name, _) in PROBES {
            let row: Vec<String> = sets
                .iter()
                .zip(&results)
                .map(|(c, r)| {
                    format!(
                        "{}={}",
                        if c.is_empty() {
                            "none".into()
                        } else {
                            c.join("+")
                        },
                        if r.contains(name) { "ok" } else { "denied" }
                    )
                })
                .collect();
            eprintln!("  {name:28} {}", row.join("  "));
            // The first (smallest) set it passed with.
            let Some(first) = sets.iter().zip(&results).find(|(_, r)| r.contains(name)) else {
                panic!("{who}: {name} denied even with every capability watch holds");
            };
            needed.extend(first.0.iter().map(|c| c.to_ascii_uppercase()));
        }
        let all = &results[6];
        assert_eq!(all.len(), PROBES.len(), "{who}: {all:?}");
        let (none, ptrace, dac, both) = (&results[0], &results[1], &results[2], &results[3]);
        let (kill, ptrace_admin) = (&results[4], &results[5]);
        assert!(
            ptrace_admin.contains("setns into its netns"),
            "{ptrace_admin:?}"
        );
        assert!(kill.contains("signal it (kill -0)"), "{kill:?}");
        if nobody {
            // Another uid: the fd table needs both (the directory is 0500,
            // its links ask the ptrace check), as does `syscall` (0400 and
            // the ptrace check); fdinfo, the namespaces and exe the ptrace
            // check alone; setns CAP_SYS_ADMIN; signals CAP_KILL.
            assert!(!none.contains("list /proc/PID/fd"), "{none:?}");
            assert!(!ptrace.contains("list /proc/PID/fd"), "{ptrace:?}");
            assert!(dac.contains("list /proc/PID/fd"), "{dac:?}");
            assert!(!dac.contains("readlink /proc/PID/fd/N"), "{dac:?}");
            assert!(both.contains("readlink /proc/PID/fd/N"), "{both:?}");
            assert!(ptrace.contains("readlink /proc/PID/ns/net"), "{ptrace:?}");
            assert!(!dac.contains("readlink /proc/PID/ns/net"), "{dac:?}");
            assert!(!both.contains("setns into its netns"), "{both:?}");
            assert!(!both.contains("signal it (kill -0)"), "{both:?}");
        } else {
            // uid 0 with capabilities this process lacks: the ptrace check.
            assert!(none.contains("list /proc/PID/fd"), "{none:?}");
            assert!(!none.contains("readlink /proc/PID/fd/N"), "{none:?}");
            assert!(ptrace.contains("readlink /proc/PID/fd/N"), "{ptrace:?}");
            assert!(!dac.contains("readlink /proc/PID/ns/net"), "{dac:?}");
        }
    }
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/capabilities.md"),
    )
    .unwrap();
    eprintln!("capabilities these reads and acts need: {needed:?}");
    // The reads are the helper's (`watch` asks it), the signal `watch`'s
    // own: each capability is in the table for the one that uses it.
    for cap in &needed {
        let user = if cap == "KILL" { "watch" } else { "helper" };
        assert!(
            doc.contains(&format!("| `{user}` | `{cap}` |")),
            "docs/capabilities.md has no `{user}` row for {cap}"
        );
    }
    assert_eq!(
        needed,
        ["DAC_READ_SEARCH", "KILL", "SYS_ADMIN", "SYS_PTRACE"]
            .map(String::from)
            .into(),
    );
}

/// The system's Python (a pyenv shim under /root is not for uid 65534).
const PYTHON: &str = "/usr/bin/python3";

/// The network namespace of `pid` (`readlink /proc/PID/ns/net`).
fn namespace(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
}

/// Every other process in the network namespace of the process `.0`,
/// killed on drop (the agent's provider).
struct NamespaceOf(u32, Option<std::path::PathBuf>);

impl Drop for NamespaceOf {
    fn drop(&mut self) {
        let Some(ns) = &self.1 else { return };
        if namespace(std::process::id()).as_ref() == Some(ns) {
            return; // never this test's own namespace
        }
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            if pid as u32 != self.0 && namespace(pid as u32).as_ref() == Some(ns) {
                // SAFETY: a plain syscall.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// `selfheal check` as uid 0 holding only `CAP_KILL` (the DaemonSet's
/// `watch`), with `places`' arguments.
fn check_with_kill_only(config: &Path, places: &tests::fixtures::Places) -> serde_json::Value {
    let set = "-all,+kill";
    let started = std::time::Instant::now();
    let out = Command::new("setpriv")
        .arg(format!("--inh-caps={set}"))
        .arg(format!("--ambient-caps={set}"))
        .arg(format!("--bounding-set={set}"))
        .arg("--")
        .arg(tests::selfheal_bin())
        .args(["check", "--json", "--config"])
        .arg(config)
        .args(places.args())
        .output()
        .expect("run check under setpriv");
    eprintln!("check holding only CAP_KILL: {:?}", started.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().next().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "check's line ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// What `check --json` says of the agent's call: the socket its first
/// reason names, whether that reason has a thread waiting on it, and
/// whether a proof was armed on it.
fn seen(o: &serde_json::Value) -> (Option<u64>, bool, bool) {
    let reason = &o["reasons"][0];
    let inode = reason["evidence"]["inode"].as_u64();
    let waiting = reason["message"]
        .as_str()
        .is_some_and(|m| m.contains("waiting") && m.contains("in poll/select"));
    let armed = o["proofs"][0]["action"] == "arm"
        && o["proofs"][0]["ok"] == true
        && o["proofs"][0]["inode"].as_u64() == inode;
    (inode, waiting, armed)
}

/// A `watch` holding no capability to read other users' processes (only
/// `CAP_KILL`, as the DaemonSet's) has the helper read them: an agent of
/// uid 65534 in its own network namespace, waiting in `poll` on a call its
/// provider never answers, is seen waiting on that socket, and the proof
/// is armed on it; a check holding every capability sees the same socket
/// and gives the same verdict; without the helper the same check sees no
/// socket at all.
#[test]
fn a_watch_holding_only_kill_reads_other_users_agents_through_the_helper() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_watch_holding_only_kill_reads_other_users_agents_through_the_helper";
    if !is_root() {
        return skip(
            TEST,
            "needs root (the helper, setpriv, a network namespace)",
        );
    }
    for tool in ["setpriv", "unshare", "ip"] {
        if !have(tool) {
            return skip(TEST, &format!("no {tool}"));
        }
    }
    // The system's Python: one any uid may run.
    if !Path::new(PYTHON).exists() {
        return skip(TEST, &format!("no {PYTHON}"));
    }
    let dir = tests::Scratch::new("watch-kill-only");
    let sock = dir.join("helper.sock");
    let mut helper = Command::new(tests::selfheal_bin());
    helper.args(["helper", "--socket"]).arg(&sock);
    if !selfheal::ebpf::BUILT_IN {
        helper.arg("--no-ebpf");
    }
    let _helper = Target(
        helper
            .stderr(Stdio::null())
            .spawn()
            .expect("start selfheal helper"),
    );
    tests::fixtures::wait_answering(&sock);

    // The provider (root) and the agent (uid 65534) in a network namespace
    // of their own; the agent is the shell's pid after its `exec`.
    const PORT: u16 = 47_001;
    let server = format!(
        "import socket,time\nl=socket.socket()\nl.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
         l.bind(('127.0.0.1',{PORT}))\nl.listen(1)\nc,_=l.accept()\nc.recv(64)\ntime.sleep(120)\n"
    );
    let client = format!(
        "import socket,time\nfor _ in range(100):\n    try:\n        s=socket.create_connection(('127.0.0.1',{PORT}))\n        break\n    except OSError:\n        time.sleep(0.05)\n\
         s.settimeout(600)\ns.sendall(b'POST /v1 HTTP/1.1\\r\\n\\r\\n')\ns.recv(1)\n"
    );
    let agent = Target(
        Command::new("unshare")
            .args(["-n", "sh", "-c"])
            .arg(
                "ip link set lo up && { \"$PY\" -c \"$SERVER\" & } && \
                 exec setpriv --reuid=65534 --regid=65534 --clear-groups \"$PY\" -c \"$CLIENT\"",
            )
            .env("PY", PYTHON)
            .env("SERVER", &server)
            .env("CLIENT", &client)
            .stdin(Stdio::null())
            .spawn()
            .expect("start the agent"),
    );
    let pid = agent.0.id();
    let connected = tests::wait_for(
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(50),
        || {
            let net = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
            let uid = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            // An established connection (state 01) and the agent's uid.
            (net.lines()
                .skip(1)
                .any(|l| l.split_whitespace().nth(3) == Some("01"))
                && uid
                    .lines()
                    .any(|l| l.starts_with("Uid:") && l.contains("65534")))
            .then_some(())
        },
    );
    assert!(connected.is_some(), "the agent connected as uid 65534");
    // Its namespace now, not this test's (which must never be swept).
    let ns = namespace(pid).filter(|ns| Some(ns) != namespace(std::process::id()).as_ref());
    assert!(
        ns.is_some(),
        "the agent is in a network namespace of its own"
    );
    let _provider = NamespaceOf(pid, ns);
    std::thread::sleep(std::time::Duration::from_millis(1500));

    let config = tests::config_in(
        &dir,
        format!(
            "[[agent]]\nname = \"caller\"\nmatch = {{ pid = {pid} }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"127.0.0.1:{PORT}\"\n\
             [agent.thresholds]\nsuspect_after = \"1s\"\n\
             [agent.proof]\nidle = \"1s\"\ninterval = \"1s\"\ncount = 3\n"
        ),
    );
    use tests::fixtures::Places;
    // Without a helper: the agent's sockets are out of this check's reach.
    let alone = check_with_kill_only(&config, &Places::without_helper(dir.join("alone")));
    eprintln!("alone: {:#} gaps {:#}", alone["reasons"], alone["gaps"]);
    let (inode, waiting, armed) = seen(&alone);
    assert!(inode.is_none() && !waiting && !armed, "{alone:#}");
    // It says what it could not see.
    assert!(
        alone["gaps"].as_array().is_some_and(|g| g.iter().any(|g| g
            .as_str()
            .is_some_and(|g| g.contains("network namespace unavailable")))),
        "{alone:#}"
    );

    let through = check_with_kill_only(&config, &Places::under(dir.join("through")).helper(&sock));
    eprintln!("through the helper: {:#}", through["reasons"]);
    let (inode, waiting, armed) = seen(&through);
    assert!(inode.is_some(), "the call's socket is seen: {through:#}");
    assert!(waiting, "a thread waits on it: {through:#}");
    assert!(armed, "the proof is armed on it: {through:#}");

    // Every capability: the same socket, the same verdict.
    let started = std::time::Instant::now();
    let full = tests::fixtures::check_cmd(&config, &Places::under(dir.join("full")).helper(&sock))
        .output()
        .expect("run check");
    eprintln!("check holding every capability: {:?}", started.elapsed());
    let full: serde_json::Value = serde_json::from_slice(
        full.stdout
            .split(|b| *b == b'\n')
            .next()
            .unwrap_or_default(),
    )
    .expect("check's line");
    // (It sees the proof the check before it armed: the peer acknowledges.)
    let (full_inode, _, _) = seen(&full);
    assert_eq!(full_inode, inode, "{full:#}");
    assert_eq!(full["verdict"], through["verdict"], "{full:#}\n{through:#}");
}
