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
    for cap in &needed {
        assert!(
            doc.contains(&format!("| `watch` | `{cap}` |")),
            "docs/capabilities.md has no `watch` row for {cap}"
        );
    }
    assert_eq!(
        needed,
        ["DAC_READ_SEARCH", "KILL", "SYS_ADMIN", "SYS_PTRACE"]
            .map(String::from)
            .into(),
    );
}
