//! What `check` reads of the process table (`agents::for_check`: only what
//! its rules need), seen from outside: a check run by an unprivileged
//! user, and what a check opens of a process no rule can pick.

use std::{collections::BTreeSet, os::unix::process::CommandExt as _, time::Duration};

use tests::{Scratch, as_uid, fixtures::Places, need_root, run_check_at};

const NOBODY: u32 = 65534;
/// A uid no other process here runs as.
const AGENT_UID: u32 = 4243;

/// A unit rule checked by an unprivileged user, whose unit's cgroup lists
/// root's process: the check finds it (in the unit's `cgroup.procs`) and,
/// as a check that reads every process does, is refused its fds and says
/// so as a gap naming it; nothing else is said of it.
#[test]
fn a_users_unit_check_finds_roots_process_and_is_refused_its_fds() {
    let _area = tests::area(module_path!());
    if !need_root("check_walk_unit_as_user") {
        return;
    }
    // Root's sleeper, in a unit's cgroup made for it.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    let unit = format!("selfheal-walk-user-{}.service", std::process::id());
    let v2 = tests::runtimes::cgroup2_root().expect("a cgroup v2 hierarchy");
    let cgroup = v2.join(&unit);
    let moved = std::fs::create_dir(&cgroup)
        .and_then(|()| std::fs::write(cgroup.join("cgroup.procs"), sleeper.id().to_string()));
    let dir = Scratch::new("check-walk-unit");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!("[[agent]]\nname = \"u\"\nmatch = {{ unit = \"{unit}\" }}\n"),
    )
    .expect("config");
    for d in ["state", "snaps"] {
        std::fs::create_dir_all(dir.join(d)).expect("dir");
        std::os::unix::fs::chown(dir.join(d), Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    // Built (by cargo, as root) before the user runs it.
    tests::selfheal_bin();
    let run = moved.is_ok().then(|| {
        as_uid(NOBODY, || {
            run_check_at(&config, &Places::without_helper(&dir.0), &[])
        })
    });
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // Empty once the sleeper is reaped.
    let removed = tests::wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        std::fs::remove_dir(&cgroup).ok()
    });
    moved.expect("move the sleeper into the unit");
    let run = run.expect("the check ran");
    let u = run.agent("u");
    let refused = format!("pid {}: cannot list fds: EACCES", sleeper.id());
    assert!(
        u["gaps"].as_array().is_some_and(|g| g
            .iter()
            .any(|g| g.as_str().is_some_and(|g| g.starts_with(&refused)))),
        "{refused} in the gaps: {}",
        run.stdout
    );
    assert_eq!(u["verdict"], "healthy", "{}", run.stdout);
    assert!(removed.is_some(), "{} left behind", cgroup.display());
}

/// What a check opens of a process no rule can pick, traced (`strace -f`,
/// the check and its command-line reader): nobody's `sleep`, beside a
/// shell of uid 4243 with a child, matched by pid, by pidfile and by a
/// `cmdline` rule of uid 4243's processes. Of it the check may look up
/// its `/proc/PID` (whose owner says the cmdline rule cannot match it)
/// and, on a kernel without `/proc/PID/task/TID/children`, read its
/// `stat` for the parent tree; never its command line, executable,
/// cgroup or namespaces, and on a kernel with `children` (this one) not
/// its `stat` either. The agents are found as before: the shell and its
/// child.
#[test]
fn a_check_opens_nothing_of_a_process_no_rule_can_pick_but_its_stat() {
    let _area = tests::area(module_path!());
    if !need_root("check_walk_foreign") {
        return;
    }
    if !std::path::Path::new("/usr/bin/strace").exists() {
        tests::skip_tool_missing("check_walk_foreign", "strace", "apt-get install strace");
        return;
    }
    let dir = Scratch::new("check-walk-foreign");
    let token = format!("selfheal-walk-agent-{}", std::process::id());
    let mut agent = std::process::Command::new("sh")
        .args(["-c", "sleep 60 & wait", &token])
        .uid(AGENT_UID)
        .gid(AGENT_UID)
        .spawn()
        .expect("sh");
    let mut foreign = std::process::Command::new("sleep")
        .arg("61")
        .uid(NOBODY)
        .gid(NOBODY)
        .spawn()
        .expect("sleep as nobody");
    let pidfile = dir.join("agent.pid");
    std::fs::write(&pidfile, agent.id().to_string()).expect("pidfile");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"pid\"\nmatch = {{ pid = {} }}\n\
             [[agent]]\nname = \"pidfile\"\nmatch = {{ pidfile = \"{}\" }}\n\
             [[agent]]\nname = \"cmdline\"\nmatch = {{ cmdline = \"{token}\", uid = {AGENT_UID} }}\n",
            agent.id(),
            pidfile.display()
        ),
    )
    .expect("config");
    // The shell's child started: at most 5 s, in 20 ms steps.
    let started = tests::wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        std::fs::read_to_string(format!("/proc/{}/task/{}/children", agent.id(), agent.id()))
            .ok()
            .filter(|k| !k.trim().is_empty())
            .or_else(|| children_by_stat(agent.id()))
    });
    let trace = dir.join("trace");
    let out = std::process::Command::new("/usr/bin/strace")
        .args(["-f", "-qq", "-e", "trace=%file", "-o"])
        .arg(&trace)
        .arg(tests::selfheal_bin())
        .args(["check", "--json", "--config"])
        .arg(&config)
        .args(Places::without_helper(&dir.0).args())
        .output()
        .expect("strace selfheal check");
    let traced = std::fs::read_to_string(&trace).unwrap_or_default();
    let _ = foreign.kill();
    let _ = foreign.wait();
    let _ = agent.kill();
    let _ = agent.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(started.is_some(), "the agent's child did not start");
    // What was named under the foreign process's directory.
    let prefix = format!("\"/proc/{}", foreign.id());
    let opened: BTreeSet<String> = traced
        .lines()
        .filter_map(|l| {
            let at = l.find(&prefix)? + prefix.len();
            let rest = &l[at..];
            let name = rest.split('"').next().unwrap_or_default();
            (name.is_empty() || name.starts_with('/'))
                .then(|| name.trim_start_matches('/').to_string())
        })
        .collect();
    let children =
        std::path::Path::new(&format!("/proc/self/task/{}/children", std::process::id())).exists();
    let allowed: BTreeSet<String> = if children {
        BTreeSet::from([String::new()])
    } else {
        BTreeSet::from([String::new(), "stat".to_string()])
    };
    assert!(
        opened.is_subset(&allowed),
        "of nobody's pid {} the check named {opened:?}, only {allowed:?} allowed \
         (children files: {children})",
        foreign.id()
    );
    assert!(
        !traced.is_empty(),
        "no trace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["pid", "pidfile", "cmdline"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!("\"agent\":\"{name}\"")))
            .unwrap_or_else(|| panic!("no {name} in {stdout}"));
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        assert_ne!(v["verdict"], "down", "{line}");
    }
}

/// The children of `pid` by every process's `stat` (a kernel without
/// `children` files), as a space-separated list; `None` when it has none.
fn children_by_stat(pid: u32) -> Option<String> {
    let kids: Vec<String> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|d| {
            let stat = std::fs::read_to_string(d.path().join("stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then(|| d.file_name().to_string_lossy().into_owned())
        })
        .collect();
    (!kids.is_empty()).then(|| kids.join(" "))
}
