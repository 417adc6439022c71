//! The process table `check` reads ([`ProcessTable::read_check`]): what
//! its rules need (the core's `discovery::Reads`), no more. `scan`,
//! `inspect` and `config` read the whole table.
//!
//! Where the kernel lists each task's children
//! (`/proc/PID/task/TID/children`, `CONFIG_PROC_CHILDREN`), the table is
//! the processes the rules name and their descendants
//! (`ProcessTable::read_named`): the pids of `pid` and `pidfile` rules,
//! the processes their units' `cgroup.procs` list, the processes of the
//! uids a `cmdline` or `exe` rule admits (by the owner of `/proc/PID`,
//! looked up without opening it), PID 1 and selfheal's lineage, then
//! the descendants of what the rules pick from each of their threads'
//! `children`. That is one read per thread of the agents' processes
//! against one `stat` per process of the host, so it is done only while
//! it is fewer reads (`discovery::descent`, and counted as it goes).
//!
//! Otherwise, every process's `stat` (one open by path: its parent and
//! start time, the tree descendants and the rules' roots are found in),
//! and the rest only where its rules need it. Uid, executable, cgroup and
//! pid namespace are read for the processes a rule picks and their
//! descendants; the uid of every process under a `cmdline` or `exe` rule,
//! and its command line or executable only where the rule's `match.uid`
//! admits it; under a `unit` rule, the cgroup of the processes its units'
//! `cgroup.procs` list; and the container inits the runtimes name.
//!
//! What a check says is what the whole table would say: when an agent's
//! `cmdline`, `exe` or `unit` rule finds nothing here, the check reads the
//! whole table instead (its problem counts processes of the whole host);
//! a config with a `container` rule reads it from the start (a container
//! rule looks at every container).
//!
//! Measured (`check-bench --check-only --baseline`, release): see
//! RELIABILITY.md, "A check against a C floor".

use selfheal_core::discovery::{Descent, Reads, descent};

use super::{matching::in_owned_unit, *};

/// How a table read by [`ProcessTable::read_check`] fills in more of its
/// processes later: where it read, and each process's start time then,
/// so a pid reused since is not taken for it.
#[derive(Clone, Debug, Default)]
pub(super) struct Partial {
    root: ProcRoot,
    starts: HashMap<u32, u64>,
    filled: BTreeSet<u32>,
}

/// The `cmdline` rules of some agents, as `runner`: which uids' command
/// lines to read, and which of them to keep.
pub(super) struct CmdlineRules<'a>(Vec<(&'a regex::Regex, Option<u32>)>);

/// Whether a rule limited to `filter` may match a process of `uid`.
fn admits(filter: Option<u32>, uid: Option<u32>) -> bool {
    filter.is_none_or(|f| uid == Some(f))
}

impl<'a> CmdlineRules<'a> {
    pub(super) fn of(agents: &[&'a AgentConfig], runner: u32) -> CmdlineRules<'a> {
        CmdlineRules(
            agents
                .iter()
                .filter_map(|a| match &a.rule {
                    MatchRule::Cmdline(re) => Some((re, a.uid_filter(runner))),
                    _ => None,
                })
                .collect(),
        )
    }

    /// Whether some rule that may match a process of `uid` matches `joined`.
    pub(super) fn keep(&self, uid: Option<u32>, joined: &str) -> bool {
        self.0
            .iter()
            .any(|(re, f)| admits(*f, uid) && re.is_match(joined))
    }
}

/// What a check's unit rules need of cgroups.
enum Units {
    /// No unit rule.
    None,
    /// The processes in the cgroups of their units, as the cgroup
    /// hierarchy lists them.
    Listed(BTreeSet<u32>),
    /// The hierarchy cannot be listed: every process's cgroup is read.
    Unlisted,
}

/// The most cgroup directories one check lists; past it, every process's
/// cgroup is read instead.
const MAX_CGROUP_DIRS: usize = 100_000;

/// The processes in the units `agents`' unit rules name as `runner`
/// (by [`in_owned_unit`], the rule `find` applies to each process's own
/// cgroup): the `cgroup.procs` of every directory, in the hierarchy
/// `/proc/PID/cgroup`'s paths are of (the unified one where the process
/// has a `0::` line, else v1's `name=systemd`), whose path is in one.
fn unit_members(root: &ProcRoot, agents: &[&AgentConfig], runner: u32) -> Units {
    let units: Vec<(&str, UnitOwner)> = agents
        .iter()
        .filter_map(|a| match &a.rule {
            MatchRule::Unit(u) => Some((u.as_str(), a.unit_owner(runner))),
            _ => None,
        })
        .collect();
    if units.is_empty() {
        return Units::None;
    }
    let Some((dir, path)) = hierarchy(root) else {
        return Units::Unlisted;
    };
    let manager = cgroup::manager_root(
        std::fs::read_to_string(root.of_pid(1, "cgroup"))
            .ok()
            .as_deref()
            .and_then(cgroup_path)
            .as_deref(),
    );
    let mut pids = BTreeSet::new();
    let mut stack = vec![(dir, path)];
    let mut listed = 0;
    while let Some((dir, path)) = stack.pop() {
        listed += 1;
        if listed > MAX_CGROUP_DIRS {
            return Units::Unlisted;
        }
        if cgroup::unit_of(&path, &manager)
            .is_some_and(|p| units.iter().any(|(u, o)| in_owned_unit(p, u, *o)))
        {
            // A cgroup gone since its listing lists nothing.
            let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        let Ok(subs) = std::fs::read_dir(&dir) else {
            continue;
        };
        for sub in subs.flatten() {
            if sub.file_type().is_ok_and(|t| t.is_dir())
                && let Some(name) = sub.file_name().to_str()
            {
                let path = format!("{}/{name}", path.trim_end_matches('/'));
                stack.push((sub.path(), path));
            }
        }
    }
    Units::Listed(pids)
}

/// Where the cgroup hierarchy of `/proc/PID/cgroup`'s paths is mounted
/// here, and the cgroup path of that mount's root; `None` when this
/// process's cgroup or mounts cannot be read or it is not mounted.
fn hierarchy(root: &ProcRoot) -> Option<(PathBuf, String)> {
    let own = std::fs::read_to_string(root.of_self("cgroup")).ok()?;
    let v2 = own.lines().any(|l| l.starts_with("0::"));
    let mounts = root.process(std::process::id()).ok()?.mountinfo().ok()?;
    let m = mounts.into_iter().find(|m| {
        if v2 {
            m.fs_type == "cgroup2"
        } else {
            m.fs_type == "cgroup"
                && m.super_options.get("name").and_then(Option::as_deref) == Some("systemd")
        }
    })?;
    Some((m.mount_point, m.root))
}

/// `pid`'s entry as `ROOT/PID/stat` says, and its start time; `None`
/// when it is gone.
fn stat_of(root: &ProcRoot, pid: u32) -> Option<(ProcEntry, u64)> {
    stat_threads(root, pid).map(|(e, start, _)| (e, start))
}

/// [`stat_of`], and how many threads the process has.
fn stat_threads(root: &ProcRoot, pid: u32) -> Option<(ProcEntry, u64, u64)> {
    let stat = root.stat(pid).ok()?;
    let threads = u64::try_from(stat.num_threads).unwrap_or(0);
    let start = stat.starttime;
    let e = entry_of(pid, stat);
    Some((e, start, threads))
}

/// The pids under `root`, as its directory lists them (names only: no
/// process is opened).
fn host_pids(root: &ProcRoot) -> Vec<u32> {
    std::fs::read_dir(root.path())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|d| d.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

/// Reads of `e` (its uid read) what a `cmdline` or `exe` rule picks it
/// by, where `reads` admits its uid: its executable, and its command line
/// (kept only where a rule of `cmdlines` matches it).
fn read_picking(
    root: &ProcRoot,
    reads: &Reads,
    cmdlines: &CmdlineRules<'_>,
    reader: &mut CmdlineReader,
    e: &mut ProcEntry,
) {
    if reads.exe_of(e.uid) {
        e.exe = std::fs::read_link(root.of_pid(e.pid, "exe")).ok();
    }
    if e.has_argv && reads.cmdline_of(e.uid) {
        let argv = reader.read(e.pid, e.uid);
        if cmdlines.keep(e.uid, &argv.join(" ")) {
            e.cmdline = argv;
        }
    }
}

/// Whether the kernel lists each task's children
/// (`/proc/PID/task/TID/children`, `CONFIG_PROC_CHILDREN`), as this
/// process's own main thread under `root` shows.
fn lists_children(root: &ProcRoot) -> bool {
    root.of_self(&format!("task/{}/children", std::process::id()))
        .is_file()
}

/// The children of process `pid`: every one of its threads' `children`
/// (a process forked by any thread is that thread's child); none when it
/// is gone, and a thread gone since the listing has none. `None` when a
/// listing cannot be read otherwise (the walk is then asked instead), or
/// when that would take more than `budget` reads (each counted in
/// `used`).
fn children_of(root: &ProcRoot, pid: u32, budget: usize, used: &mut usize) -> Option<Vec<u32>> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    *used += 1;
    let tasks = match std::fs::read_dir(root.of_pid(pid, "task")) {
        Ok(tasks) => tasks,
        Err(e) if gone(&e) => return Some(Vec::new()),
        Err(_) => return None,
    };
    let mut kids = Vec::new();
    for tid in tasks.flatten() {
        *used += 1;
        if *used > budget {
            return None;
        }
        match std::fs::read_to_string(tid.path().join("children")) {
            Ok(text) => kids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            ),
            Err(e) if gone(&e) => {}
            Err(_) => return None,
        }
    }
    Some(kids)
}

/// The processes read so far by a table built from the processes its
/// rules name ([`ProcessTable::read_named`]), and what that cost.
#[derive(Default)]
struct Seeds {
    entries: BTreeMap<u32, ProcEntry>,
    starts: HashMap<u32, u64>,
    threads: HashMap<u32, u64>,
    /// Processes opened (a `stat`, a `task` listing, a `children` file).
    used: usize,
    /// The pids procfs listed, once listed.
    host: Option<Vec<u32>>,
    /// Each `stat` read, as it was read (the entry before any other field
    /// of it), for the walk that may follow, which reads them no more.
    stats: HashMap<u32, (ProcEntry, u64)>,
}

impl Seeds {
    /// Reads `pid`'s `stat` once; whether it is there.
    fn stat(&mut self, root: &ProcRoot, pid: u32) -> bool {
        if self.entries.contains_key(&pid) {
            return true;
        }
        self.used += 1;
        let Some((e, start, threads)) = stat_threads(root, pid) else {
            return false;
        };
        self.starts.insert(pid, start);
        self.threads.insert(pid, threads);
        self.stats.insert(pid, (e.clone(), start));
        self.entries.insert(pid, e);
        true
    }

    /// The pids under `root`, listed once.
    fn host(&mut self, root: &ProcRoot) -> &[u32] {
        self.host.get_or_insert_with(|| host_pids(root))
    }
}

/// What a check reads when the processes its rules name will not do.
enum Instead {
    /// Every process's `stat` ([`ProcessTable::read_stats`]).
    Walk,
    /// The whole table ([`ProcessTable::read_for`]).
    Whole,
}

/// The most ancestors of selfheal read for its lineage (rules other than
/// `pid` and `pidfile` never pick them).
const MAX_LINEAGE: usize = 4096;

impl ProcessTable {
    /// The table `check` needs for `agents` as `runner` (see the module
    /// doc): what it finds is what [`ProcessTable::read_for`] finds, for
    /// less read.
    pub fn read_check(agents: &[&AgentConfig], runner: u32) -> ProcessTable {
        ProcessTable::read_check_in(&ProcRoot::default(), agents, runner)
    }

    /// [`ProcessTable::read_check`] under `root`.
    pub(super) fn read_check_in(
        root: &ProcRoot,
        agents: &[&AgentConfig],
        runner: u32,
    ) -> ProcessTable {
        if agents
            .iter()
            .any(|a| matches!(a.rule, MatchRule::Container(_)))
        {
            return ProcessTable::read_for_in(root, agents, runner);
        }
        let mut seeds = Seeds::default();
        let table = match ProcessTable::read_named(root, agents, runner, &mut seeds) {
            Ok(table) => table,
            Err(Instead::Walk) => ProcessTable::read_stats(root, agents, runner, seeds),
            Err(Instead::Whole) => return ProcessTable::read_for_in(root, agents, runner),
        };
        let mut wanted = vec![1];
        for agent in agents {
            let m = find_for(agent, runner, &table);
            if m.problem.is_some()
                && !matches!(agent.rule, MatchRule::Pid(_) | MatchRule::Pidfile(_))
            {
                return ProcessTable::read_for_in(root, agents, runner);
            }
            wanted.extend(m.all);
        }
        table.fill_in(&wanted)
    }

    /// The table of the processes `agents`' rules name and their
    /// descendants, read without a `stat` of every process: the pids of
    /// `pid` and `pidfile` rules, the processes their units' `cgroup.procs`
    /// list, the processes of the uids a `cmdline` or `exe` rule admits
    /// (by the owner of `/proc/PID`), PID 1 and selfheal's lineage; then
    /// the descendants of what the rules pick, from their threads'
    /// `children`. What to read instead where that is not the cheaper
    /// read or cannot say what the whole table would: the walk for a
    /// kernel without `children` files, a container rule (which reads the
    /// whole table anyway), units whose cgroups cannot be listed, or more
    /// reads than one per process of the host, or a pid or pidfile rule
    /// that finds nothing (as the walk would); the whole table for another
    /// rule that finds nothing (whose problem counts the host's processes).
    /// What it reads on the way (`seeds`: the pids listed, the `stat`s)
    /// the walk reads no more.
    fn read_named(
        root: &ProcRoot,
        agents: &[&AgentConfig],
        runner: u32,
        seeds: &mut Seeds,
    ) -> Result<ProcessTable, Instead> {
        let reads = Reads::of(agents.iter().copied(), runner);
        if reads.containers || !lists_children(root) {
            return Err(Instead::Walk);
        }
        let host = seeds.host(root).to_vec();
        let budget = host.len();
        let mut cgroups = BTreeSet::from([1]);
        match unit_members(root, agents, runner) {
            Units::None => {}
            Units::Listed(pids) => cgroups.extend(pids),
            Units::Unlisted => return Err(Instead::Walk),
        }
        let mut named: Vec<u32> = cgroups.iter().copied().collect();
        for agent in agents {
            match &agent.rule {
                MatchRule::Pid(pid) => named.push(*pid),
                MatchRule::Pidfile(path) => named.extend(read_pidfile(path).ok()),
                _ => {}
            }
        }
        // Selfheal and its ancestors, which rules by what a process runs
        // or where never pick.
        let mut cur = std::process::id();
        for _ in 0..MAX_LINEAGE {
            if cur == 0 || !seeds.stat(root, cur) {
                break;
            }
            cur = seeds.entries[&cur].ppid;
        }
        let mut uids = BTreeMap::new();
        if reads.uids() {
            for &pid in &host {
                uids.insert(pid, uid_of(root, pid));
            }
            let picked = uids.values().filter(|u| reads.picks(**u)).count();
            if named.len() + picked >= budget {
                return Err(Instead::Walk);
            }
        }
        if named.len() >= budget {
            return Err(Instead::Walk);
        }
        for pid in named {
            seeds.stat(root, pid);
        }
        let cmdlines = CmdlineRules::of(agents, runner);
        let mut reader = CmdlineReader::default();
        for (&pid, &uid) in &uids {
            if reads.picks(uid) && seeds.stat(root, pid) {
                let e = seeds.entries.get_mut(&pid).expect("read just now");
                e.uid = uid;
                read_picking(root, &reads, &cmdlines, &mut reader, e);
            }
        }
        for (pid, e) in seeds.entries.iter_mut() {
            if reads.uids() && e.uid.is_none() {
                e.uid = uid_of(root, *pid);
            }
            if cgroups.contains(pid) {
                e.cgroup = cgroup_of_in(root, *pid);
            }
        }
        let found = ProcessTable::from_entries(seeds.entries.values().cloned().collect())
            .with_own_pid(std::process::id());
        let mut roots = BTreeSet::new();
        for agent in agents {
            let m = find_for(agent, runner, &found);
            if m.problem.is_some() {
                // A pid's or pidfile's problem counts nothing of the host.
                return Err(match agent.rule {
                    MatchRule::Pid(_) | MatchRule::Pidfile(_) => Instead::Walk,
                    _ => Instead::Whole,
                });
            }
            roots.extend(m.roots);
        }
        let threads: u64 = roots.iter().filter_map(|p| seeds.threads.get(p)).sum();
        if descent(true, threads, budget.saturating_sub(seeds.used)) == Descent::Walk {
            return Err(Instead::Walk);
        }
        // Each process once; a child whose `stat` names another parent is
        // a pid reused since its listing, not a descendant.
        let mut stack: Vec<u32> = roots.iter().copied().collect();
        let mut seen: BTreeSet<u32> = roots;
        while let Some(pid) = stack.pop() {
            for kid in children_of(root, pid, budget, &mut seeds.used).ok_or(Instead::Walk)? {
                if seen.insert(kid)
                    && seeds.stat(root, kid)
                    && seeds.entries.get(&kid).is_some_and(|e| e.ppid == pid)
                {
                    stack.push(kid);
                }
            }
            if seeds.used > budget {
                return Err(Instead::Walk);
            }
        }
        Ok(ProcessTable::partial_of(
            root,
            std::mem::take(&mut seeds.entries).into_values().collect(),
            std::mem::take(&mut seeds.starts),
            reader,
        ))
    }

    /// Every process's `stat` (from `seeds` where read there); the uid,
    /// executable, cgroup and command line only where a rule of `agents`
    /// needs them to pick.
    fn read_stats(
        root: &ProcRoot,
        agents: &[&AgentConfig],
        runner: u32,
        mut seeds: Seeds,
    ) -> ProcessTable {
        let cmdlines = CmdlineRules::of(agents, runner);
        let reads = Reads::of(agents.iter().copied(), runner);
        // Under a unit rule, the cgroups of the processes its units list
        // and PID 1's (where units are anchored); every process's where
        // those cannot be listed.
        let units = unit_members(root, agents, runner);
        let cgroups = |pid: u32| match &units {
            Units::None => false,
            Units::Listed(pids) => pid == 1 || pids.contains(&pid),
            Units::Unlisted => true,
        };
        let mut entries = Vec::new();
        let mut starts = HashMap::new();
        let mut reader = CmdlineReader::default();
        let host = seeds.host.take().unwrap_or_else(|| host_pids(root));
        for pid in host {
            let Some((mut e, start)) = seeds.stats.remove(&pid).or_else(|| stat_of(root, pid))
            else {
                continue;
            };
            if reads.uids() {
                e.uid = uid_of(root, pid);
            }
            read_picking(root, &reads, &cmdlines, &mut reader, &mut e);
            if cgroups(e.pid) {
                e.cgroup = cgroup_of_in(root, e.pid);
            }
            starts.insert(e.pid, start);
            entries.push(e);
        }
        ProcessTable::partial_of(root, entries, starts, reader)
    }

    /// A table read by [`ProcessTable::read_check`] of `entries`, their
    /// start times and the command lines `reader` left unread.
    fn partial_of(
        root: &ProcRoot,
        entries: Vec<ProcEntry>,
        starts: HashMap<u32, u64>,
        reader: CmdlineReader,
    ) -> ProcessTable {
        let mut table = ProcessTable::from_entries(entries).with_own_pid(std::process::id());
        table.unread_cmdlines = reader.unread;
        table.partial = Some(Partial {
            root: root.clone(),
            starts,
            filled: BTreeSet::new(),
        });
        table
    }

    /// Reads every field of the processes `pids` not yet read in full, in a
    /// table read by [`ProcessTable::read_check`] (a whole table has them);
    /// one the table has not read yet (a container's init, in a table of
    /// the processes its rules name) is read first. One whose start time
    /// is no longer the one its `stat` gave (gone, its pid reused) keeps
    /// what was read of it.
    pub(super) fn fill_in(mut self, pids: &[u32]) -> ProcessTable {
        let Some(mut partial) = self.partial.take() else {
            return self;
        };
        for &pid in pids {
            if !partial.filled.insert(pid) {
                continue;
            }
            if !self.entries.contains_key(&pid)
                && let Some((e, start)) = stat_of(&partial.root, pid)
            {
                partial.starts.insert(pid, start);
                if e.ppid != pid {
                    self.children.entry(e.ppid).or_default().push(pid);
                }
                self.entries.insert(pid, e);
            }
            let Some(e) = self.entries.get_mut(&pid) else {
                continue;
            };
            let before = e.clone();
            fill(&partial.root, e);
            // Read after the rest: the process of that start time, alive
            // now, lived through its reads, so they were its own.
            if stat_of(&partial.root, pid).map(|(_, start)| start)
                != partial.starts.get(&pid).copied()
            {
                *e = before;
            }
        }
        self.manager_root =
            cgroup::manager_root(self.entries.get(&1).and_then(|e| e.cgroup.as_deref()));
        self.partial = Some(partial);
        self.index_identities()
    }

    /// The container inits the runtimes name for the containers of the
    /// table's processes, read in full (their cgroup and pid namespace
    /// confirm a container's processes, `ProcessTable::verify`).
    pub(super) fn with_inits_filled(self) -> ProcessTable {
        if self.partial.is_none() {
            return self;
        }
        let inits: Vec<u32> = self
            .entries
            .values()
            .filter_map(|e| self.inventory.identity(&e.containers))
            .filter(|i| i.resolved)
            .filter_map(|i| self.inventory.init_pid(&i.id).flatten())
            .collect();
        self.fill_in(&inits)
    }
}

#[cfg(test)]
mod tests;
