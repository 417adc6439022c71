use super::matching::{by_exe, find_owned};
use super::*;

fn table(entries: &[(u32, u32, &str)]) -> ProcessTable {
    ProcessTable::from_entries(
        entries
            .iter()
            .map(|(pid, ppid, cmd)| {
                let argv: Vec<&str> = cmd.split(' ').filter(|a| !a.is_empty()).collect();
                ProcEntry::new(*pid, *ppid, &argv)
            })
            .collect(),
    )
}

/// A table of `(pid, ppid, argv0, cgroup)`.
fn table_in_cgroups(entries: &[(u32, u32, &str, &str)]) -> ProcessTable {
    ProcessTable::from_entries(
        entries
            .iter()
            .map(|&(pid, ppid, argv0, cgroup)| {
                let mut e = ProcEntry::new(pid, ppid, &[argv0]);
                e.cgroup = Some(cgroup.into());
                e
            })
            .collect(),
    )
}

fn cmdline(re: &str) -> MatchRule {
    MatchRule::Cmdline(regex::Regex::new(re).unwrap())
}

/// 1 init ─┬─ 10 sol-runner ─┬─ 11 python worker ── 12 git
///         │                 └─ 13 sol-runner --child
///         ├─ 20 other
///         └─ 2 [kthreadd] (no cmdline) ── 3 [kworker]
fn fixture() -> ProcessTable {
    table(&[
        (1, 0, "/sbin/init"),
        (2, 0, ""),
        (3, 2, ""),
        (10, 1, "/usr/bin/sol-runner --attach wss://x"),
        (11, 10, "python worker.py"),
        (12, 11, "git fetch"),
        (13, 10, "/usr/bin/sol-runner --child"),
        (20, 1, "other --flag sol"),
    ])
}

#[test]
fn pid_rule_takes_the_subtree() {
    let t = fixture();
    let m = find(&MatchRule::Pid(10), &t);
    assert_eq!(m.roots, [10]);
    assert_eq!(m.all, [10, 11, 12, 13]);
    assert_eq!(m.problem, None);
    let m = find(&MatchRule::Pid(12), &t);
    assert_eq!((m.roots, m.all), (vec![12], vec![12]));
    let m = find(&MatchRule::Pid(99), &t);
    assert!(m.roots.is_empty() && m.all.is_empty());
    assert_eq!(m.problem.as_deref(), Some("pid 99 is not running"));
}

#[test]
fn argv_splits_at_nuls_and_reads_are_capped() {
    for (bytes, argv) in [
        (&b"sol\0--attach\0"[..], vec!["sol", "--attach"]),
        (b"sol\0\0x\0", vec!["sol", "", "x"]),
        (b"setproctitle style", vec!["setproctitle style"]),
        (b"cut-at-the-ca", vec!["cut-at-the-ca"]),
        (b"", vec![]),
        (b"\0", vec![]),
    ] {
        assert_eq!(split_argv(bytes), argv, "{bytes:?}");
    }
    // This process's own command line, read through the reader child;
    // no process: empty, and nothing noted as unread.
    let mut r = CmdlineReader::default();
    let mine = r.read(std::process::id(), Some(0));
    assert!(!mine.is_empty());
    assert!(mine.iter().map(|a| a.len() + 1).sum::<usize>() <= MAX_CMDLINE_BYTES + 1);
    assert!(r.read(u32::MAX, Some(0)).is_empty());
    assert!(r.unread.is_empty(), "{:?}", r.unread);
}

#[test]
fn cmdline_searches_the_joined_argv() {
    let t = fixture();
    // Spans two arguments: only the joined argv has it.
    let m = find(&cmdline("sol-runner --attach"), &t);
    assert_eq!(m.roots, [10]);
    assert_eq!(m.all, [10, 11, 12, 13]);
    // Unanchored search; the child that matches too is not a second root.
    let m = find(&cmdline("sol-runner"), &t);
    assert_eq!(m.roots, [10]);
    assert_eq!(m.all, [10, 11, 12, 13]);
    // Two unrelated matches are two roots.
    let m = find(&cmdline("(^| )sol($| )"), &t);
    assert_eq!(m.roots, [20]);
    let m = find(&cmdline("sol"), &t);
    assert_eq!(m.roots, [10, 20]);
    assert_eq!(m.all, [10, 11, 12, 13, 20]);
    // Anchors apply to the joined string.
    let m = find(&cmdline("^python worker"), &t);
    assert_eq!(m.roots, [11]);
    // Kernel threads (empty cmdline) never match, even `^$` or `.*`.
    let m = find(&cmdline("^$"), &t);
    assert!(m.roots.is_empty());
    assert!(m.problem.unwrap().contains("^$"));
    let m = find(&cmdline(".*"), &t);
    assert_eq!(m.roots, [1]);
    assert!(!m.all.contains(&2) && !m.all.contains(&3));
}

#[test]
fn a_uid_limits_cmdline_and_exe_rules_to_its_processes() {
    // 10 (uid 1000) and 20 (uid 65534, a look-alike) both run
    // "sol-runner"; 11, 10's child, runs as another uid.
    let mut entries = vec![
        ProcEntry::new(1, 0, &["init"]),
        ProcEntry::new(10, 1, &["sol-runner", "--attach"]),
        ProcEntry::new(11, 10, &["helper-tool"]),
        ProcEntry::new(20, 1, &["sol-runner", "--attach"]),
    ];
    for (e, uid) in entries.iter_mut().zip([0, 1000, 0, 65534]) {
        e.uid = Some(uid);
        e.exe = Some(PathBuf::from("/usr/bin/sol"));
    }
    let t = ProcessTable::from_entries(entries);
    let m = find_of(&cmdline("sol-runner"), Some(1000), &t);
    assert_eq!((m.roots, m.all, m.problem), (vec![10], vec![10, 11], None));
    assert_eq!(find_of(&cmdline("sol-runner"), None, &t).roots, [10, 20]);
    let exe = MatchRule::Exe(PathBuf::from("/usr/bin/sol"));
    assert_eq!(find_of(&exe, Some(65534), &t).roots, [20]);
    // Nothing of this uid: the problem says others would match.
    let m = find_of(&cmdline("sol-runner"), Some(4242), &t);
    assert!(m.roots.is_empty());
    let p = m.problem.unwrap();
    assert!(
        p.contains("uid 4242's processes only; 2 process(es) of other uids match: set match.uid"),
        "{p}"
    );
    // Rules that name their processes take no uid.
    let uid = selfheal_core::config::MatchUid::Runner;
    assert_eq!(uid.filter(&MatchRule::Pid(20), 1000), None);
    assert_eq!(uid.filter(&cmdline("x"), 1000), Some(1000));
    assert_eq!(
        selfheal_core::config::MatchUid::Any.filter(&cmdline("x"), 1000),
        None
    );
    assert_eq!(
        selfheal_core::config::MatchUid::Uid(7).filter(&MatchRule::Exe("/x".into()), 1000),
        Some(7)
    );
}

#[test]
fn rules_skip_selfheal_and_its_ancestors() {
    let mut entries = vec![
        ProcEntry::new(1, 0, &["/sbin/init"]),
        ProcEntry::new(4, 1, &["sudo", "selfheal", "inspect", "sol-runner"]),
        ProcEntry::new(5, 4, &["selfheal", "inspect", "sol-runner"]),
        ProcEntry::new(6, 1, &["sol-runner"]),
    ];
    for e in &mut entries {
        e.exe = Some("/usr/bin/x".into());
        e.cgroup = Some("/system.slice/x.service".into());
    }
    let t = ProcessTable::from_entries(entries).with_own_pid(5);
    assert_eq!(find(&cmdline("sol-runner"), &t).roots, [6]);
    assert_eq!(find(&cmdline("sol-runner"), &t).all, [6]);
    assert_eq!(by_exe(&t, &["/usr/bin/x".into()], &|_| true).roots, [6]);
    assert_eq!(find(&MatchRule::Unit("x.service".into()), &t).roots, [6]);
    // Asked for by pid, selfheal's own process is what was asked for.
    assert_eq!(find(&MatchRule::Pid(5), &t).roots, [5]);
}

#[test]
fn descendants_survive_cycles() {
    // 5 → 6 → 7 → 5: a torn read; and 8 is its own parent.
    let t = table(&[
        (5, 7, "a"),
        (6, 5, "b"),
        (7, 6, "c"),
        (8, 8, "d"),
        (9, 8, "e"),
    ]);
    assert_eq!(t.with_descendants(&[5]), [5, 6, 7]);
    assert_eq!(t.with_descendants(&[6, 7]), [5, 6, 7]);
    assert_eq!(t.with_descendants(&[8]), [8, 9]);
    assert_eq!(t.with_descendants(&[42]), Vec::<u32>::new());
    // In a cycle every member has a matched parent: the lowest pid stands in.
    let m = find(&cmdline("^[abc]$"), &t);
    assert_eq!((m.roots, m.all), (vec![5], vec![5, 6, 7]));
    let m = find(&cmdline("^[de]$"), &t);
    assert_eq!((m.roots, m.all), (vec![8], vec![8, 9]));
}

#[test]
fn deep_chains_do_not_overflow() {
    let entries: Vec<_> = (1..=100_000u32)
        .map(|p| ProcEntry::new(p, p - 1, &["x"]))
        .collect();
    let t = ProcessTable::from_entries(entries);
    assert_eq!(t.with_descendants(&[1]).len(), 100_000);
}

#[test]
fn exe_rule_matches_the_link_target() {
    let mut entries = vec![
        ProcEntry::new(1, 0, &["/sbin/init"]),
        ProcEntry::new(10, 1, &["sol"]),
        ProcEntry::new(11, 10, &["sol", "--child"]),
        ProcEntry::new(12, 1, &["sol"]),
        ProcEntry::new(13, 1, &["other"]),
    ];
    entries[1].exe = Some("/usr/bin/sol".into());
    entries[2].exe = Some("/usr/bin/sol".into());
    entries[3].exe = Some("/usr/bin/sol (deleted)".into());
    entries[4].exe = Some("/usr/bin/solar".into());
    let t = ProcessTable::from_entries(entries);
    let m = by_exe(&t, &["/usr/bin/sol".into()], &|_| true);
    assert_eq!(m.roots, [10, 12]);
    assert_eq!(m.all, [10, 11, 12]);
    let m = by_exe(&t, &["/bin/sol".into()], &|_| true);
    let p = m.problem.unwrap();
    assert!(
        p.contains("/bin/sol") && p.contains("(1 process whose executable"),
        "{p}"
    );
}

#[test]
fn unit_rule_uses_the_cgroup() {
    let t = table_in_cgroups(&[
        (1, 0, "/sbin/init", "/init.scope"),
        (10, 1, "sol", "/system.slice/sol.service"),
        (11, 10, "sol-worker", "/system.slice/sol.service"),
        (12, 10, "moved-out", "/system.slice/sol-helper.service"),
        (13, 12, "grandchild", "/system.slice/sol.service"),
        (14, 1, "delegated", "/system.slice/sol.service/payload"),
        (15, 1, "other", "/system.slice/sol.service.other"),
    ]);
    let m = find(&MatchRule::Unit("sol.service".into()), &t);
    // 13's parent (12) is in another unit: it is a root of its own.
    assert_eq!(m.roots, [10, 13, 14]);
    // Descendants come along whatever their cgroup.
    assert_eq!(m.all, [10, 11, 12, 13, 14]);
    let m = find(&MatchRule::Unit("nope.service".into()), &t);
    assert_eq!(
        m.problem.as_deref(),
        Some("a system unit nope.service has no processes")
    );
    let bare = table(&[(1, 0, "init")]);
    let m = find(&MatchRule::Unit("x.service".into()), &bare);
    assert!(
        m.problem
            .unwrap()
            .contains("no process's cgroup could be read")
    );
}

/// A unit is its manager's: root's `unit = "runner.service"` is the
/// system's runner.service, never a cgroup of that name a user made in
/// their own tree; `uid` names a user's; a user's check names both the
/// system's and its own, never another user's.
#[test]
fn a_unit_is_its_managers() {
    let user = |uid: u32| format!("/user.slice/user-{uid}.slice/user@{uid}.service");
    let cg = [
        "/init.scope".to_string(),
        "/system.slice/runner.service".into(),
        format!("{}/app.slice/runner.service", user(1000)),
        format!("{}/app.slice/runner.service", user(1001)),
        format!("{}/app.slice/x.service/runner.service", user(1000)),
        "/system.slice/other.service/runner.service".into(),
    ];
    let entries = cg
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let pid = i as u32 + 1;
            let mut e = ProcEntry::new(pid, if pid == 1 { 0 } else { 1 }, &["x"]);
            e.cgroup = Some(c.clone());
            e
        })
        .collect();
    let t = ProcessTable::from_entries(entries);
    let rule = MatchRule::Unit("runner.service".into());
    let roots = |owner| find_owned(&rule, None, owner, &t).roots;
    assert_eq!(roots(UnitOwner::System), [2]);
    assert_eq!(roots(UnitOwner::User(1000)), [3]);
    assert_eq!(roots(UnitOwner::SystemOr(1000)), [2, 3]);
    assert_eq!(roots(UnitOwner::SystemOr(1001)), [2, 4]);
    assert_eq!(roots(UnitOwner::User(4242)), Vec::<u32>::new());
    let p = find_owned(&rule, None, UnitOwner::User(4242), &t)
        .problem
        .unwrap();
    assert_eq!(
        p,
        "uid 4242's user unit runner.service has no processes \
         (5 process(es) in cgroups named runner.service elsewhere: not that manager's unit)"
    );
    assert_eq!(
        t.unit_of(3).map(|p| p.manager),
        Some(cgroup::Manager::User(1000))
    );
    // The system's user@1000.service holds all of user 1000's units.
    let rule = MatchRule::Unit("user@1000.service".into());
    assert_eq!(find_owned(&rule, None, UnitOwner::System, &t).roots, [3, 5]);
    assert!(
        find_owned(&rule, None, UnitOwner::User(1000), &t)
            .roots
            .is_empty()
    );
}

/// Under a systemd in a container (its `init.scope` below the
/// container's cgroup), units are anchored there.
#[test]
fn units_under_a_contained_systemd() {
    let t = table_in_cgroups(&[
        (1, 0, "/sbin/init", "/docker/abc/init.scope"),
        (2, 1, "runner", "/docker/abc/system.slice/runner.service"),
        (3, 1, "runner", "/system.slice/runner.service"),
    ]);
    assert_eq!(t.manager_root(), "/docker/abc");
    assert_eq!(
        find(&MatchRule::Unit("runner.service".into()), &t).roots,
        [2]
    );
}

/// A pidfile's error says which kind it is, in the words the problem
/// shows (naming the file).
#[test]
fn pidfile_errors_are_kinds_with_the_problems_words() {
    let dir = std::env::temp_dir().join(format!("selfheal-pidfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.pid");
    let empty = dir.join("empty.pid");
    std::fs::write(&empty, "").unwrap();
    let e = read_pidfile(&missing).unwrap_err();
    assert!(matches!(e, PidfileError::Read { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "cannot read pidfile {}: No such file or directory (os error 2)",
            missing.display()
        )
    );
    let e = read_pidfile(&dir).unwrap_err();
    assert!(matches!(e, PidfileError::NotAFile { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("pidfile {} is not a regular file", dir.display())
    );
    let e = read_pidfile(&empty).unwrap_err();
    assert!(matches!(e, PidfileError::NoPid { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("pidfile {}: empty (no pid)", empty.display())
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Why a container's process is not taken for it, in the refusal's words.
#[test]
fn unconfirmed_containers_read_as_refusals() {
    for (e, text) in [
        (
            NotConfirmed::NoInit,
            "its runtime reports no init pid for it",
        ),
        (
            NotConfirmed::InitNotHere { init: 7 },
            "its init pid 7, as its runtime reports it, is no process here (the runtime's pid \
             namespace is another)",
        ),
        (
            NotConfirmed::InitNotInCgroup { init: 7 },
            "pid 7, its init as its runtime reports it, is not in its cgroup (the runtime's pid \
             namespace is another)",
        ),
        (
            NotConfirmed::OtherPidNamespace { init: 7 },
            "it is not in the pid namespace of the container's init (pid 7)",
        ),
        (
            NotConfirmed::PidNamespacesUnread { pid: 9, init: 7 },
            "the pid namespaces of pid 9 and of the container's init (pid 7) cannot be read",
        ),
    ] {
        assert_eq!(e.to_string(), text);
    }
}
