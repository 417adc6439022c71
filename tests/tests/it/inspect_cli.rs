//! `selfheal inspect` as a script sees it: the `--json` contract, exit codes,
//! and clear errors for bad input (a missing process, bad flags, no
//! privilege for eBPF).

use std::{process::Command, time::Duration};

use tests::fixtures::{Places, Reaped, check_cmd};
use tests::{Peer, listener, need_ebpf, selfheal_bin};

fn inspect(args: &[&str]) -> std::process::Output {
    Command::new(selfheal_bin())
        .arg("inspect")
        .args(args)
        .output()
        .expect("run selfheal")
}

/// `selfheal ARGS…` run as `nobody`, with no capabilities to inherit.
fn selfheal_as_nobody(args: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(selfheal_bin())
        .args(args)
        .output()
        .expect("run selfheal as nobody")
}

/// `selfheal inspect ARGS… --json --pid PID` as nobody on `target`, which
/// is killed once it answered; the command succeeds: its report.
fn inspect_as_nobody(target: Reaped, args: &[&str]) -> serde_json::Value {
    let pid = target.pid().to_string();
    let mut all = vec!["inspect"];
    all.extend_from_slice(args);
    all.extend(["--json", "--pid", &pid]);
    let out = selfheal_as_nobody(&all);
    drop(target);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn json_report_has_the_contract_fields() {
    let _area = tests::area(module_path!());
    if !need_ebpf("json_report") {
        return;
    }
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let mut peer = Peer::recv_peer(&["client", &addr]);
    let _side = l.accept().unwrap();
    let ready = peer.ready();
    peer.tell("go");
    std::thread::sleep(Duration::from_millis(1500));

    let out = inspect(&["--pid", &ready.pid.to_string(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(v["roots"][0], ready.pid);
    assert!(v["agent"].is_null(), "--pid inspects no named agent");
    assert!(v["ebpf"]["strategy"].is_string(), "{}", v["ebpf"]);
    assert!(
        v["ebpf"]["attempts"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    );
    for key in ["processes", "sockets", "zombies", "ebpf"] {
        assert!(v.get(key).is_some(), "report lacks {key}");
    }
    let process = v["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == ready.pid)
        .expect("the client");
    let t = process["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .find(|t| t["tid"] == ready.tid)
        .expect("its thread");
    for key in ["tid", "state", "wchan", "recv_blocked_ms"] {
        assert!(t.get(key).is_some(), "thread lacks {key}: {t}");
    }
    // The receive began before inspect attached: procfs times it, and says so.
    assert!(
        t["recv_blocked_ms"].as_u64().is_some_and(|ms| ms >= 1000),
        "{t}"
    );
    assert_eq!(t["recv_inode"], ready.inode);
    assert_eq!(t["recv_source"], "procfs");
    assert!(
        v["gaps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g.as_str().unwrap().contains("before the tracer"))
    );
    let s = v["sockets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["inode"] == ready.inode)
        .expect("socket");
    for key in ["inode", "local", "remote", "state", "role"] {
        assert!(s.get(key).is_some(), "socket lacks {key}: {s}");
    }
    assert!(
        s["tcp_info"]["last_data_recv_ms"].is_u64() && s["tcp_info"]["last_ack_recv_ms"].is_u64(),
        "{s}"
    );
}

#[test]
fn a_person_sees_nothing_but_the_answer() {
    let _area = tests::area(module_path!());
    let me = std::process::id().to_string();
    let out = Command::new(selfheal_bin())
        .args(["inspect", "--pid", &me])
        .env_remove("RUST_LOG")
        .output()
        .expect("run selfheal");
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    // No INFO lines (an owner lookup's note on /etc/subuid, say): only a
    // warning would be said beside the answer.
    assert!(!err.contains(" INFO "), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("pid {me}")),
        "the answer is on stdout"
    );
}

#[test]
fn missing_process_is_exit_1_with_the_pid_named() {
    let _area = tests::area(module_path!());
    let out = inspect(&["--pid", "4194303", "--no-ebpf"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("4194303"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn usage_errors_are_exit_3() {
    let _area = tests::area(module_path!());
    for args in [
        &["--pid", "nope"][..],
        &["--pid", "1", "--ebpf-strategy", "uprobe"],
        &["--pid", "1", "--wait", "soon"],
        &[],
    ] {
        let out = inspect(args);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn without_privilege_ebpf_fails_with_a_reason_and_procfs_still_answers() {
    let _area = tests::area(module_path!());
    if !need_ebpf("unprivileged") {
        return;
    }
    // Drop to nobody for the run; inspect a process of nobody's own.
    let sleeper = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            "30",
        ])
        .spawn()
        .expect("setpriv");
    std::thread::sleep(Duration::from_millis(200));
    let v = inspect_as_nobody(Reaped(sleeper), &[]);
    assert!(v["ebpf"]["strategy"].is_null());
    let why = v["ebpf"]["error"].as_str().expect("a reason");
    assert!(
        why.contains("ermission") || why.contains("not permitted"),
        "{why}"
    );
    assert!(!v["processes"][0]["threads"].as_array().unwrap().is_empty());
}

#[test]
fn another_users_process_is_a_gap_not_an_error() {
    let _area = tests::area(module_path!());
    if !tests::need_root("other_user") {
        return;
    }
    // A root-owned process inspected by nobody: stat is readable, its fds,
    // syscalls and stacks are not. The report says so and still prints.
    let sleeper = Reaped(Command::new("sleep").arg("30").spawn().expect("sleep"));
    let pid = sleeper.pid();
    let v = inspect_as_nobody(sleeper, &["--no-ebpf"]);
    assert_eq!(v["processes"][0]["pid"], pid);
    let gaps: Vec<&str> = v["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g.as_str())
        .collect();
    assert!(
        gaps.iter().any(|g| g.contains("cannot list fds")),
        "{gaps:?}"
    );
}

/// `inspect NAME` judges the configured agent against `check`'s history:
/// `--json` carries `verdict` and `reasons` (the design's contract), and a
/// proof keepalive that `check` armed on a silent call shows as the socket's
/// proof state, in JSON and in the text, which says what the thread waits
/// in. Inspecting changes nothing: the history file is not written.
#[test]
fn inspect_name_shows_the_verdict_reasons_and_the_proof() {
    let _area = tests::area(module_path!());
    if !tests::need_root("inspect_name_verdict") {
        return;
    }
    let l = listener();
    let addr = l.local_addr().unwrap();
    // A Python client with a timeout (as every SDK has) sends a request
    // and waits in poll for an answer that the listener never sends.
    let script = format!(
        "import socket,time\ns=socket.create_connection(('127.0.0.1',{}))\ns.settimeout(600)\ns.sendall(b'POST /v1 HTTP/1.1\\r\\n\\r\\n')\ns.recv(1)\n",
        addr.port()
    );
    let Ok(mut child) = Command::new("python3")
        .args(["-c", &script, "inspect-name-proof-client"])
        .spawn()
    else {
        return tests::skip("inspect_name_verdict", "no python3 here");
    };
    let (mut server_side, _) = l.accept().unwrap();
    let mut buf = [0u8; 64];
    let _ = std::io::Read::read(&mut server_side, &mut buf);
    let dir = std::env::temp_dir().join(format!("selfheal-inspect-name-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = tests::config_in(
        &dir,
        format!(
            "[[agent]]\nname = \"caller\"\nmatch = {{ pid = {} }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{addr}\"\n\
             [agent.thresholds]\nsuspect_after = \"1s\"\n\
             [agent.proof]\nidle = \"1s\"\ninterval = \"1s\"\ncount = 3\n",
            child.id()
        ),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let state = dir.join("state");
    let check = check_cmd(&config, &Places::under(&dir)).output().unwrap();
    let o: serde_json::Value = serde_json::from_slice(&check.stdout).expect("check's line");
    assert_eq!(o["proofs"][0]["action"], "arm", "{o:#}");
    assert_eq!(o["proofs"][0]["ok"], true, "{o:#}");
    let saved = std::fs::read(state.join("state.json")).unwrap();

    let args = |json: bool| {
        let mut a = vec![
            "caller".to_string(),
            "--config".into(),
            config.display().to_string(),
            "--state-dir".into(),
            state.display().to_string(),
            "--no-ebpf".into(),
        ];
        if json {
            a.push("--json".into());
        }
        a
    };
    let out = inspect(&args(true).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(v["verdict"], "busy", "{:#}", v["reasons"]);
    assert!(
        v["reasons"]
            .as_array()
            .is_some_and(|r| !r.is_empty() && r[0]["code"].is_string()),
        "{:#}",
        v["reasons"]
    );
    let proof = &v["proofs"][0];
    assert_eq!(proof["state"], "armed", "{:#}", v["proofs"]);
    assert!(
        proof["detail"]
            .as_str()
            .unwrap()
            .contains("keepalive armed"),
        "{proof}"
    );
    let thread_waits = v["processes"][0]["threads"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["wait_syscall"] == "poll" && t["wait_inodes"][0] == proof["inode"]);
    assert!(thread_waits, "{:#}", v["processes"]);

    let out = inspect(&args(false).iter().map(String::as_str).collect::<Vec<_>>());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verdict: busy"), "{text}");
    assert!(text.contains("waits in poll on socket"), "{text}");
    assert!(text.contains("proof:"), "{text}");
    // Read only: the history is as check left it.
    assert_eq!(std::fs::read(state.join("state.json")).unwrap(), saved);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
