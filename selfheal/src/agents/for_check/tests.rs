use super::*;
use selfheal_core::config::Config;

/// `(pid, ppid, start)` processes in a made-up procfs tree at a fresh
/// directory: each with its `stat`, `cgroup`, `exe` link and `ns/pid`.
fn fake(name: &str, procs: &[(u32, u32, u64)]) -> (PathBuf, ProcRoot) {
    let dir =
        std::env::temp_dir().join(format!("selfheal-fake-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for &(pid, ppid, start) in procs {
        write_stat(&dir, pid, ppid, start);
        let p = dir.join(pid.to_string());
        std::fs::create_dir_all(p.join("ns")).expect("fixture dir");
        std::fs::write(p.join("ns/pid"), "").expect("ns");
        std::fs::write(
            p.join("cgroup"),
            format!("0::/system.slice/p{pid}.service\n"),
        )
        .expect("cgroup");
        std::os::unix::fs::symlink(format!("/usr/bin/p{pid}"), p.join("exe")).expect("exe");
    }
    (dir.clone(), ProcRoot::at(dir))
}

/// `PID/stat` of a sleeping process with this parent and start time.
fn write_stat(dir: &Path, pid: u32, ppid: u32, start: u64) {
    let p = dir.join(pid.to_string());
    std::fs::create_dir_all(&p).expect("fixture dir");
    let zeros = |n: usize| vec!["0"; n].join(" ");
    let line = format!(
        "{pid} (p{pid}) S {ppid} {} {start} {}\n",
        zeros(17),
        zeros(30)
    );
    std::fs::write(p.join("stat"), line).expect("stat");
}

fn config(text: &str) -> Config {
    Config::parse(text, Path::new("/etc/selfheal/test.toml")).expect("config")
}

/// 1 ─┬─ 10 ── 11 ── 12
///    └─ 20
const TREE: &[(u32, u32, u64)] = &[
    (1, 0, 5),
    (10, 1, 50),
    (11, 10, 60),
    (12, 11, 70),
    (20, 1, 80),
];

/// [`TREE`] in a fake procfs, and a config of one agent by pid 10.
fn pid_10_in(name: &str) -> (PathBuf, ProcRoot, Config) {
    let (dir, root) = fake(name, TREE);
    (
        dir,
        root,
        config("[[agent]]\nname = \"a\"\nmatch = { pid = 10 }\n"),
    )
}

/// A pid rule's check reads every process's `stat` (the tree) and the
/// rest of its own processes only: another process's cgroup, executable
/// and namespace, there to be read, are not. It finds what the whole
/// table finds.
#[test]
fn a_pid_rules_check_reads_only_its_processes_in_full() {
    let (dir, root, c) = pid_10_in("pid");
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    let lean = ProcessTable::read_check_in(&root, &agents, 0);
    let whole = ProcessTable::read_for_in(&root, &agents, 0);
    let _ = std::fs::remove_dir_all(&dir);
    let m = find_for(agents[0], 0, &lean);
    assert_eq!((&m.roots, &m.all), (&vec![10], &vec![10, 11, 12]));
    assert_eq!(m, find_for(agents[0], 0, &whole));
    assert_eq!(lean.len(), 5);
    for pid in [1, 10, 11, 12] {
        let e = lean.get(pid).unwrap();
        assert_eq!(e, whole.get(pid).unwrap());
        assert!(
            e.cgroup.is_some() && e.exe.is_some() && e.pidns.is_some(),
            "{e:?}"
        );
    }
    let other = lean.get(20).unwrap();
    assert_eq!(
        (&other.cgroup, &other.exe, other.pidns, other.uid),
        (&None, &None, None, None)
    );
    assert!(whole.get(20).unwrap().cgroup.is_some());
}

/// Gives `dir`'s processes (`procs`) the `task/TID/children` files of a
/// kernel that has them: each process one thread listing its children,
/// and this process's own main thread's file (how the kernel is told
/// to have them).
fn with_children(dir: &Path, procs: &[(u32, u32, u64)]) {
    for &(pid, _, _) in procs {
        let kids: Vec<String> = procs
            .iter()
            .filter(|(p, ppid, _)| *ppid == pid && *p != pid)
            .map(|(p, _, _)| p.to_string())
            .collect();
        write_children(dir, pid, pid, &kids.join(" "));
    }
    // A host of more processes than the agent's tree costs in reads.
    for pid in 1000..1040 {
        write_stat(dir, pid, 1, 100);
    }
    let own = std::process::id();
    let task = dir.join(format!("self/task/{own}"));
    std::fs::create_dir_all(&task).expect("self");
    std::fs::write(task.join("children"), "").expect("own children");
}

/// `PID/task/TID/children` under `dir`.
fn write_children(dir: &Path, pid: u32, tid: u32, kids: &str) {
    let task = dir.join(format!("{pid}/task/{tid}"));
    std::fs::create_dir_all(&task).expect("task");
    std::fs::write(task.join("children"), format!("{kids} ")).expect("children");
}

/// On a kernel with `children` files, a pid rule's check reads no
/// process outside its tree (PID 1 aside): not even the `stat` of
/// another, which is not in the table. Descendants forked by any
/// thread are found. It finds what the whole table finds, and reads
/// its processes as the whole table does.
#[test]
fn with_children_files_a_pid_rules_check_reads_only_its_tree() {
    let (dir, root, c) = pid_10_in("children");
    with_children(&dir, TREE);
    // 11 was forked by 10's second thread.
    write_children(&dir, 10, 10, "");
    write_children(&dir, 10, 15, "11");
    only_the_tree_of_10(&dir, &root, &c);
}

/// `c`'s one agent, checked under `root` (at `dir`, removed after),
/// is 10 and its descendants, and the check's table holds those and
/// PID 1 only, each as the whole table has it.
fn only_the_tree_of_10(dir: &Path, root: &ProcRoot, c: &Config) {
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    let lean = ProcessTable::read_check_in(root, &agents, 0);
    let whole = ProcessTable::read_for_in(root, &agents, 0);
    let _ = std::fs::remove_dir_all(dir);
    let m = find_for(agents[0], 0, &lean);
    assert_eq!((&m.roots, &m.all), (&vec![10], &vec![10, 11, 12]));
    assert_eq!(m, find_for(agents[0], 0, &whole));
    let read: Vec<u32> = lean.entries().map(|e| e.pid).collect();
    assert_eq!(read, [1, 10, 11, 12]);
    for pid in read {
        assert_eq!(lean.get(pid), whole.get(pid), "{pid}");
    }
    assert!(whole.get(20).is_some());
}

/// The walk where children files are the dearer read (the agent's
/// threads outnumber the host's processes) or the kernel has none.
#[test]
fn the_walk_stays_where_children_files_cost_more_or_are_missing() {
    let (dir, root, c) = pid_10_in("many-threads");
    with_children(&dir, TREE);
    for tid in 100..150 {
        write_children(&dir, 10, tid, "");
    }
    let stat = dir.join("10/stat");
    let line = std::fs::read_to_string(&stat).expect("stat");
    // num_threads, the 20th field.
    let mut fields: Vec<&str> = line.split(' ').collect();
    fields[19] = "51";
    std::fs::write(&stat, fields.join(" ")).expect("stat");
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    let many = ProcessTable::read_check_in(&root, &agents, 0);
    std::fs::remove_dir_all(dir.join("self")).expect("self");
    let none = ProcessTable::read_check_in(&root, &agents, 0);
    let _ = std::fs::remove_dir_all(&dir);
    for t in [many, none] {
        assert_eq!(t.len(), 45);
        assert_eq!(find_for(agents[0], 0, &t).all, [10, 11, 12]);
    }
}

/// A `children` file that cannot be read (here a directory in its
/// place) leaves the walk to find the descendants; a thread gone since
/// its listing (no file) has none.
#[test]
fn an_unreadable_children_file_leaves_it_to_the_walk() {
    let (dir, root, c) = pid_10_in("unreadable-children");
    with_children(&dir, TREE);
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    std::fs::create_dir_all(dir.join("10/task/16")).expect("a thread gone");
    let lean = ProcessTable::read_check_in(&root, &agents, 0);
    let file = dir.join("11/task/11/children");
    std::fs::remove_file(&file).expect("children");
    std::fs::create_dir(&file).expect("a directory in its place");
    let walked = ProcessTable::read_check_in(&root, &agents, 0);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(lean.len(), 4);
    assert_eq!(walked.len(), 45);
    for t in [lean, walked] {
        assert_eq!(find_for(agents[0], 0, &t).all, [10, 11, 12]);
    }
}

/// A pid rule whose process is not running is told so from the walk,
/// as before, not from the whole table (its problem counts nothing of
/// the host): no other process is read in full.
#[test]
fn a_missing_pid_is_walked_for_not_read_in_full() {
    let (dir, root) = fake("missing-pid", TREE);
    with_children(&dir, TREE);
    let c = config("[[agent]]\nname = \"a\"\nmatch = { pid = 99 }\n");
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    let lean = ProcessTable::read_check_in(&root, &agents, 0);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        find_for(agents[0], 0, &lean).problem.as_deref(),
        Some("pid 99 is not running")
    );
    assert_eq!(lean.len(), 45);
    let full: Vec<u32> = lean
        .entries()
        .filter(|e| e.cgroup.is_some())
        .map(|e| e.pid)
        .collect();
    assert_eq!(full, [1]);
}

/// A child listed by its parent whose `stat` names another parent
/// (its pid reused since the listing) is not a descendant, and what it
/// lists is not read.
#[test]
fn a_listed_child_of_another_parent_is_not_a_descendant() {
    let (dir, root, c) = pid_10_in("reused-child");
    with_children(&dir, TREE);
    // 10 lists 20, whose stat says 1 is its parent; 20 lists 21.
    write_children(&dir, 10, 10, "11 20");
    write_stat(&dir, 21, 20, 90);
    write_children(&dir, 20, 20, "21");
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    let lean = ProcessTable::read_check_in(&root, &agents, 0);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(find_for(agents[0], 0, &lean).all, [10, 11, 12]);
    assert!(lean.get(21).is_none());
}

/// An `exe` rule limited to a uid reads, of the processes of other
/// uids, only the owner of their `/proc/PID` (no `stat`): here 10 is
/// uid 4242's, and 20 not in the table.
#[test]
fn with_children_files_an_exe_rule_reads_only_its_uids_processes() {
    let (dir, root) = fake("exe-uid", TREE);
    with_children(&dir, TREE);
    std::os::unix::fs::chown(dir.join("10"), Some(4242), None).expect("chown");
    let c = config("[[agent]]\nname = \"a\"\nmatch = { exe = \"/usr/bin/p10\", uid = 4242 }\n");
    only_the_tree_of_10(&dir, &root, &c);
}

/// A process whose pid is another's by the time the rest of it is read
/// (its start time changed) keeps only what its `stat` said; one gone
/// by then is read as it was. Neither is an error.
#[test]
fn a_pid_reused_or_gone_before_its_fill_is_not_taken_for_it() {
    let (dir, root, c) = pid_10_in("reuse");
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    let table = ProcessTable::read_stats(&root, &agents, 0, Seeds::default());
    write_stat(&dir, 11, 1, 999);
    std::fs::remove_dir_all(dir.join("12")).expect("remove 12");
    let table = table.fill_in(&[10, 11, 12]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(table.get(10).unwrap().cgroup.is_some());
    for pid in [11, 12] {
        let e = table.get(pid).unwrap();
        assert_eq!((&e.cgroup, &e.exe), (&None, &None), "{pid}");
    }
    // The tree stays the one the stats gave.
    assert_eq!(table.with_descendants(&[10]), [10, 11, 12]);
}

/// The walk that follows a named read reads neither the listing nor a
/// `stat` the named read read: what they said then is what the table
/// holds (a `stat` changed since, or a process listed since, is not read).
#[test]
fn the_walk_reads_no_stat_the_named_read_read() {
    let (dir, root, c) = pid_10_in("seeded");
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    let mut seeds = Seeds::default();
    assert_eq!(seeds.host(&root).len(), TREE.len());
    assert!(seeds.stat(&root, 10));
    write_stat(&dir, 10, 20, 50);
    write_stat(&dir, 11, 20, 60);
    write_stat(&dir, 30, 1, 90);
    let table = ProcessTable::read_stats(&root, &agents, 0, seeds);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        table.get(10).map(|e| e.ppid),
        Some(1),
        "10's stat as the named read read it"
    );
    assert_eq!(
        table.get(11).map(|e| e.ppid),
        Some(20),
        "11's stat read by the walk"
    );
    assert!(
        table.get(30).is_none(),
        "listed after the named read's listing"
    );
}

/// `cmdline` and `exe` rules read the uid of every process and the
/// executable only of those whose uid they may match; a `unit` rule
/// reads every cgroup; a pid rule neither.
#[test]
fn exe_and_unit_rules_read_what_they_pick_by() {
    let (dir, root) = fake("exe", TREE);
    let read = |text: &str| {
        let c = config(text);
        let agents: Vec<&AgentConfig> = c.agents.iter().collect();
        ProcessTable::read_stats(&root, &agents, 0, Seeds::default())
    };
    let pid = read("[[agent]]\nname = \"a\"\nmatch = { pid = 10 }\n");
    let mine = read("[[agent]]\nname = \"a\"\nmatch = { exe = \"/usr/bin/p20\" }\n");
    let others = read("[[agent]]\nname = \"a\"\nmatch = { exe = \"/usr/bin/p20\", uid = 4242 }\n");
    let unit = read("[[agent]]\nname = \"a\"\nmatch = { unit = \"p20.service\" }\n");
    let _ = std::fs::remove_dir_all(&dir);
    // The fixture's files are root's, as the runner is.
    for e in mine.entries() {
        assert_eq!((e.uid, e.exe.is_some()), (Some(0), true), "{e:?}");
    }
    for e in others.entries() {
        assert_eq!((e.uid, &e.exe), (Some(0), &None), "{e:?}");
    }
    for e in pid.entries() {
        assert_eq!((e.uid, &e.exe, &e.cgroup), (None, &None, &None), "{e:?}");
    }
    assert!(
        unit.entries()
            .all(|e| e.cgroup.is_some() && e.exe.is_none())
    );
    assert_eq!(
        find(&MatchRule::Unit("p20.service".into()), &unit).roots,
        [20]
    );
}

/// On this host, a check's table finds for pid, pidfile, cmdline, exe
/// and unit rules what the whole table finds (a unit with no process
/// too, word for word): a shell running two copies of `sleep`.
#[test]
fn a_checks_table_finds_what_the_whole_table_finds() {
    let token = format!("selfheal-for-check-{}", std::process::id());
    let dir = std::env::temp_dir().join(&token);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let exe = dir.join("sleeper");
    std::fs::copy("/bin/sleep", &exe).expect("copy sleep");
    let script = format!("{0} 60 & {0} 61 & wait", exe.display());
    let mut sh = std::process::Command::new("sh")
        .args(["-c", &script, &token])
        .spawn()
        .expect("sh");
    let pidfile = dir.join("pid");
    std::fs::write(&pidfile, sh.id().to_string()).expect("pidfile");
    let c = config(&format!(
        "[[agent]]\nname = \"pid\"\nmatch = {{ pid = {} }}\n\
         [[agent]]\nname = \"pidfile\"\nmatch = {{ pidfile = \"{}\" }}\n\
         [[agent]]\nname = \"cmdline\"\nmatch = {{ cmdline = \"{token}\" }}\n\
         [[agent]]\nname = \"exe\"\nmatch = {{ exe = \"{}\" }}\n",
        sh.id(),
        pidfile.display(),
        exe.display(),
    ));
    let nothing = config(&format!(
        "[[agent]]\nname = \"unit\"\nmatch = {{ unit = \"{token}.service\" }}\n"
    ));
    let agents: Vec<&AgentConfig> = c.agents.iter().chain(&nothing.agents).collect();
    let runner = crate::sys::creds::euid();
    // The two sleepers started: at most 5 s, in 20 ms steps.
    for _ in 0..250 {
        let t = ProcessTable::read_for(&agents[..1], runner);
        if find_for(agents[0], runner, &t).all.len() == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let lean = ProcessTable::read_check(&agents, runner);
    let whole = ProcessTable::read_for(&agents, runner);
    let only = ProcessTable::read_check(&agents[..4], runner);
    // Found while the pidfile is there.
    let found: Vec<[Matched; 3]> = agents
        .iter()
        .map(|a| [&lean, &whole, &only].map(|t| find_for(a, runner, t)))
        .collect();
    // The sleepers by their pids, then the shell.
    let sleepers = whole.with_descendants(&[sh.id()]);
    let _ = std::process::Command::new("kill")
        .args(
            sleepers
                .iter()
                .filter(|p| **p != sh.id())
                .map(u32::to_string),
        )
        .status();
    let _ = sh.kill();
    let _ = sh.wait();
    let _ = std::fs::remove_dir_all(&dir);
    for (a, [l, w, o]) in agents.iter().zip(found) {
        assert_eq!(l, w, "{}", a.name);
        if a.name != "unit" {
            // The shell and its sleepers; the exe rule its sleepers.
            let (all, roots) = if a.name == "exe" { (2, 2) } else { (3, 1) };
            assert_eq!((l.all.len(), l.roots.len()), (all, roots), "{}", a.name);
            assert_eq!(o, l, "{}", a.name);
        }
    }
    // Found, the four read the rest only of their three processes
    // (and PID 1); with the unit that finds nothing, the whole table.
    let filled = only.entries().filter(|e| e.cgroup.is_some()).count();
    assert!(filled <= 4, "{filled} of {} read in full", only.len());
    assert!(lean.entries().filter(|e| e.cgroup.is_some()).count() > 4);
}

/// A unit rule's check lists its unit's cgroup (here a unit's cgroup
/// made below the manager's root in the hierarchy `/proc/PID/cgroup`
/// names) and reads the cgroup of the processes it lists, not every
/// process's; it finds what the whole table finds.
#[test]
fn a_unit_rules_check_reads_the_processes_its_cgroup_lists() {
    let (mount, mount_root) = hierarchy(&ProcRoot::default()).expect("a cgroup hierarchy");
    let manager = cgroup::manager_root(cgroup_of(1).as_deref());
    let unit = format!("selfheal-walk-{}.service", std::process::id());
    let rel = manager
        .strip_prefix(mount_root.trim_end_matches('/'))
        .expect("below the mount");
    let dir = mount.join(rel.trim_start_matches('/')).join(&unit);
    std::fs::create_dir(&dir).expect("make the unit's cgroup");
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    let moved = std::fs::write(dir.join("cgroup.procs"), sleeper.id().to_string());
    let c = config(&format!(
        "[[agent]]\nname = \"u\"\nmatch = {{ unit = \"{unit}\" }}\n"
    ));
    let agents: Vec<&AgentConfig> = c.agents.iter().collect();
    let runner = crate::sys::creds::euid();
    let lean = ProcessTable::read_check(&agents, runner);
    let whole = ProcessTable::read_for(&agents, runner);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    // Empty once the sleeper is reaped: at most 5 s, in 20 ms steps.
    for _ in 0..250 {
        if std::fs::remove_dir(&dir).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    moved.expect("move the sleeper into the unit");
    let m = find_for(agents[0], runner, &lean);
    assert_eq!((&m.roots, &m.problem), (&vec![sleeper.id()], &None));
    assert_eq!(m, find_for(agents[0], runner, &whole));
    // The sleeper and PID 1, of the host's processes.
    let read: Vec<u32> = lean
        .entries()
        .filter(|e| e.cgroup.is_some())
        .map(|e| e.pid)
        .collect();
    assert!(read.len() <= 2, "{read:?} of {}", lean.len());
    // Where the kernel lists children, no other process is even in
    // the table: the sleeper, PID 1 and this test's lineage.
    if lists_children(&ProcRoot::default()) {
        let lineage = std::iter::successors(Some(std::process::id()), |p| {
            whole.get(*p).map(|e| e.ppid).filter(|pp| *pp != 0)
        })
        .take(MAX_LINEAGE)
        .count();
        let listed: Vec<u32> = lean.entries().map(|e| e.pid).collect();
        assert!(
            listed.len() <= lineage + 2 && listed.len() < whole.len(),
            "{listed:?}: more than the sleeper, PID 1 and {lineage} of the lineage"
        );
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
}
