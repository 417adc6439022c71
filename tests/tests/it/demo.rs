//! The demo (`selfheal-testbed demo`, what `cargo xtask demo` runs) end to
//! end: its machine-readable run shows the incident healed beside a busy
//! runner, by the real `selfheal` binary's helper and checks; Ctrl-C in the
//! middle leaves no namespace and no process behind; without root it says
//! so plainly.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tests::{need_root, selfheal_bin, testbed_bin};

/// Testbed namespaces of process `pid` (`selfheal-tb<pid>-…`).
fn namespaces_of(pid: u32) -> Vec<String> {
    let prefix = format!("{}{pid}-", selfheal_testbed::topology::PREFIX);
    std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn cmdline(pid: u32) -> Option<String> {
    let c = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(String::from_utf8_lossy(&c).replace('\0', " "))
}

/// Children of `parent` that are selfheal processes (testbed programs, the
/// helper, checks).
fn selfheal_children(parent: u32) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
                st.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .filter_map(|pid| Some((pid, cmdline(pid)?)))
        .filter(|(_, c)| c.contains("selfheal"))
        .collect()
}

#[test]
fn the_json_demo_heals_the_incident_and_leaves_the_busy_runner_alone() {
    let _area = tests::area(module_path!());
    if !need_root("demo_json") {
        return;
    }
    let keep = std::env::temp_dir().join(format!("selfheal-demo-keep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&keep);
    // Built, so that the demo finds it beside itself.
    selfheal_bin();
    let child = Command::new(testbed_bin())
        .args(["demo", "--json", "--keep-snapshots"])
        .arg(&keep)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run selfheal demo");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    for k in ["setup", "story", "fault", "verdict", "recovered", "summary"] {
        assert!(kinds.contains(&k), "no {k} event: {kinds:?}");
    }
    let summary = events.last().unwrap();
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["ok"], true, "{summary:#}");
    // The incident scenario's bound with the demo's defaults (1 s
    // heartbeat and checks) and the longest check this run measured.
    let bound = tests::wedge_bound_ms(
        Duration::from_secs(1),
        Duration::from_secs(1),
        summary["facts"]["check_ms_max"]
            .as_u64()
            .expect("the checks' time"),
    );
    assert!(
        summary["detect_ms"].as_u64().unwrap() <= bound,
        "bound {bound} ms: {summary:#}"
    );
    assert!(summary["recover_ms"].is_u64(), "{summary:#}");
    // The second scene: the asyncio agent whose head came first, proven.
    assert!(
        summary["event_loop_scene"]["detect_ms"].is_u64(),
        "{summary:#}"
    );
    // A wedged verdict carried a snapshot id, and the kept snapshot reads
    // back with the kernel's evidence of the dead control connection.
    let id = events
        .iter()
        .find(|e| e["verdict"] == "wedged" && e["snapshot"].is_string())
        .and_then(|e| e["snapshot"].as_str())
        .unwrap_or_else(|| panic!("no wedged verdict with a snapshot: {stdout}"));
    let shown = tests::show_snapshot(id, &keep);
    let snap: serde_json::Value = serde_json::from_str(&shown).expect("snapshot JSON");
    assert_eq!(snap["agent"], "runner");
    assert_eq!(snap["snapshot"]["verdict"], "wedged");
    let control = tests::control_socket(&snap);
    assert!(
        control["tcp_info"]["unacked"].as_u64() > Some(0),
        "{control:#}"
    );
    let _ = std::fs::remove_dir_all(&keep);
    assert_eq!(
        namespaces_of(pid),
        Vec::<String>::new(),
        "namespaces left behind"
    );
}

#[test]
fn ctrl_c_in_the_middle_of_the_demo_removes_every_namespace_and_process() {
    let _area = tests::area(module_path!());
    if !need_root("demo_ctrl_c") {
        return;
    }
    let selfheal = selfheal_bin();
    let mut child = Command::new(testbed_bin())
        .args(["demo", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start selfheal demo");
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait for the fault: the bed is complete, the runner is wedging.
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let line = lines.next().expect("demo output").expect("read");
        if line.contains("\"event\":\"fault\"") {
            break;
        }
        assert!(Instant::now() < end, "no fault event within 60 s");
    }
    assert_eq!(namespaces_of(pid).len(), 3, "the demo's namespaces exist");
    // Dispatch server, provider, two runners, the helper (and maybe a check).
    let children = selfheal_children(pid);
    assert!(children.len() >= 5, "{children:?}");
    // The helper is the product binary, the testbed's programs are not.
    let helper = format!("{} helper ", selfheal.display());
    assert!(
        children.iter().any(|(_, c)| c.starts_with(&helper)),
        "no {helper}…: {children:?}"
    );
    let testbed = testbed_bin();
    for role in ["dispatch", "provider", "runner"] {
        let program = format!("{} {role} ", testbed.display());
        assert!(
            children.iter().any(|(_, c)| c.starts_with(&program)),
            "no {program}…: {children:?}"
        );
    }
    // SAFETY: signals our own child.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "an interrupted demo does not claim success"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("interrupted"), "{err}");
    assert_eq!(
        namespaces_of(pid),
        Vec::<String>::new(),
        "namespaces left behind"
    );
    // Its testbed programs and helper are gone (a pid still alive with the
    // same command line is one of them: pids are not reused that fast).
    let left: Vec<_> = children
        .iter()
        .filter(|(p, c)| cmdline(*p).as_ref() == Some(c))
        .collect();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    let needle = format!("selfheal-tb{pid}-");
    assert!(
        !std::env::temp_dir()
            .join(format!("selfheal-tb{pid}-inc"))
            .exists()
            && std::fs::read_dir(std::env::temp_dir())
                .unwrap()
                .flatten()
                .all(|e| !e.file_name().to_string_lossy().starts_with(&needle)),
        "temporary files left behind"
    );
}

#[test]
fn without_root_the_demo_says_what_it_needs() {
    let _area = tests::area(module_path!());
    if !need_root("demo_unprivileged") {
        return;
    }
    let Ok(out) = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(testbed_bin())
        .arg("demo")
        .output()
    else {
        tests::skip("demo_unprivileged", "setpriv (util-linux) is missing");
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("needs root") && err.contains("sudo"), "{err}");
}

#[test]
fn a_demo_with_an_absurd_pace_is_refused_before_it_builds_anything() {
    let _area = tests::area(module_path!());
    if !need_root("demo_bad_pace") {
        return;
    }
    for args in [["--heartbeat", "0s"], ["--check-every", "2h"]] {
        let out = Command::new(testbed_bin())
            .arg("demo")
            .args(args)
            .output()
            .expect("run selfheal demo");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(args[0]) && err.contains("100ms to 60s"),
            "{err}"
        );
    }
}
