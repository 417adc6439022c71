//! `selfheal inspect` as a script sees it: the `--json` contract, exit codes,
//! and clear errors for bad input (a missing process, bad flags, no
//! privilege for eBPF).

use std::{process::Command, time::Duration};

use tests::{Peer, listener, need_ebpf, selfheal_bin};

fn inspect(args: &[&str]) -> std::process::Output {
    Command::new(selfheal_bin())
        .arg("inspect")
        .args(args)
        .output()
        .expect("run selfheal")
}

#[test]
fn json_report_has_the_contract_fields() {
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
fn missing_process_is_exit_1_with_the_pid_named() {
    let out = inspect(&["--pid", "4194303", "--no-ebpf"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("4194303"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn usage_errors_are_exit_3() {
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
    if !need_ebpf("unprivileged") {
        return;
    }
    // Drop to nobody for the run; inspect a process of nobody's own.
    let mut sleeper = Command::new("setpriv")
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
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(selfheal_bin())
        .args(["inspect", "--pid", &sleeper.id().to_string(), "--json"])
        .output()
        .expect("run selfheal as nobody");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
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
    if !tests::need_root("other_user") {
        return;
    }
    // A root-owned process inspected by nobody: stat is readable, its fds,
    // syscalls and stacks are not. The report says so and still prints.
    let mut sleeper = Command::new("sleep").arg("30").spawn().expect("sleep");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(selfheal_bin())
        .args([
            "inspect",
            "--no-ebpf",
            "--json",
            "--pid",
            &sleeper.id().to_string(),
        ])
        .output()
        .expect("run selfheal as nobody");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["processes"][0]["pid"], sleeper.id());
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
