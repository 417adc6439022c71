//! Which processes are an agent: a snapshot of the process table from procfs
//! (the I/O edge, [`ProcessTable::read`]) and the pure rules that pick an
//! agent's processes, and their descendants, out of it ([`find`]).
//!
//! A process that exits while the table is read, or whose fields cannot be
//! read (another user's `exe`), is normal: it is skipped or its field is
//! `None`, never an error.

use selfheal_core::cgroup::cgroup_path;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    io::Read as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use selfheal_core::{
    cgroup::{self, CgroupContainer, containers_for, in_unit},
    config::{AgentConfig, MatchRule, UnitOwner},
    proc::parse_pidfile,
    runtime::{ContainerRule, Identity},
    text,
};

use crate::{
    runtime::{Inventory, Sources},
    sys::procfs::ProcRoot,
};

pub mod auto;
mod cmdline;
mod for_check;
mod matching;

use self::cmdline::CmdlineReader;
pub use self::cmdline::{CMDLINE_DEADLINE, CMDLINE_STALLS, MAX_CMDLINE_BYTES, split_argv};
pub use self::matching::{
    Matched, NotInUnit, enrich, enrich_for, find, find_for, find_of, read_pidfile, still_in_unit,
};

/// One process as the snapshot saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: u32,
    /// 0 for the kernel's own (pid 1, kthreadd).
    pub ppid: u32,
    /// The command name (`/proc/PID/comm`, at most 15 bytes).
    pub comm: String,
    /// argv, its first [`MAX_CMDLINE_BYTES`] bytes; empty for kernel
    /// threads and zombies, and (in a table read by
    /// [`ProcessTable::read_for`]) for every process no cmdline rule picks.
    pub cmdline: Vec<String>,
    /// Whether it has a command line at all (not a kernel thread, not a
    /// zombie), whether or not that was read.
    pub has_argv: bool,
    /// The target of `/proc/PID/exe`, where readable (needs ptrace access).
    pub exe: Option<PathBuf>,
    /// The cgroup v2 path (the `0::` line of `/proc/PID/cgroup`; on a
    /// cgroup v1 host, the `name=systemd` hierarchy's path).
    pub cgroup: Option<String>,
    pub uid: Option<u32>,
    /// The containers its cgroup names, outermost first (empty on the host).
    pub containers: Vec<CgroupContainer>,
    /// Its pid namespace (the inode of `/proc/PID/ns/pid`), where readable.
    pub pidns: Option<u64>,
}

impl ProcEntry {
    /// An entry with `argv` as its command line (and its base name as
    /// `comm`), no exe, cgroup or uid: for fixtures.
    pub fn new(pid: u32, ppid: u32, argv: &[&str]) -> ProcEntry {
        let comm = argv
            .first()
            .map(|a| a.rsplit('/').next().unwrap_or(a).chars().take(15).collect())
            .unwrap_or_default();
        ProcEntry {
            pid,
            ppid,
            comm,
            cmdline: argv.iter().map(|a| a.to_string()).collect(),
            has_argv: !argv.is_empty(),
            exe: None,
            cgroup: None,
            uid: None,
            containers: Vec::new(),
            pidns: None,
        }
    }
}

/// A snapshot of the processes on the host (in selfheal's pid namespace).
#[derive(Clone, Debug, Default)]
pub struct ProcessTable {
    entries: BTreeMap<u32, ProcEntry>,
    children: HashMap<u32, Vec<u32>>,
    own_pid: Option<u32>,
    /// `own_pid` and its ancestors.
    own_lineage: BTreeSet<u32>,
    /// What the container runtimes said ([`ProcessTable::with_inventory`]).
    inventory: Inventory,
    /// Each containerized process's identity under `inventory`, made once
    /// (container rules look at every one of them).
    identities: HashMap<u32, Identity>,
    /// The processes whose cgroup names a container its runtime does not
    /// confirm holds them, and why (no identity is given them).
    refused: BTreeMap<u32, String>,
    /// The system manager's root cgroup (from PID 1's, [`cgroup::manager_root`]):
    /// where system units and system containers are anchored.
    manager_root: String,
    /// Processes whose command line was to be read and was not, in time
    /// ([`CMDLINE_DEADLINE`]): a cmdline rule cannot match them.
    unread_cmdlines: Vec<UnreadCmdline>,
    /// Set when only what `check` needs was read
    /// ([`ProcessTable::read_check`]): how to read more.
    partial: Option<for_check::Partial>,
}

/// A process whose command line could not be read (in time, or because the
/// reader failed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnreadCmdline {
    pub pid: u32,
    pub uid: Option<u32>,
    /// Why: its own read timed out, or one of its uid's did, or the
    /// table's time for such waits ran out.
    pub why: &'static str,
}

impl ProcessTable {
    /// Reads every process from `/proc`. Processes that vanish mid-read are
    /// left out; fields that cannot be read are `None` (or empty). Never
    /// fails: an unreadable `/proc` gives an empty table.
    /// Every command line is read, its first [`MAX_CMDLINE_BYTES`] bytes
    /// only (a user's multi-MiB argv costs a few KiB).
    pub fn read() -> ProcessTable {
        ProcessTable::read_with(&ProcRoot::default(), &|_| true, &|_, _| true)
    }

    /// [`ProcessTable::read`] for checking `agents` as `runner`: a
    /// process's command line is read only when one of their cmdline rules
    /// may pick it (its uid passes that rule's `match.uid`), and kept only
    /// when one of them matches it. The table then holds the command lines
    /// of the processes those rules pick, and no others (so the hint that
    /// other uids' processes would match is `selfheal config check`'s).
    pub fn read_for(agents: &[&AgentConfig], runner: u32) -> ProcessTable {
        ProcessTable::read_for_in(&ProcRoot::default(), agents, runner)
    }

    /// [`ProcessTable::read_for`] under `root`.
    fn read_for_in(root: &ProcRoot, agents: &[&AgentConfig], runner: u32) -> ProcessTable {
        let rules = for_check::CmdlineRules::of(agents, runner);
        let reads = selfheal_core::discovery::Reads::of(agents.iter().copied(), runner);
        ProcessTable::read_with(root, &|uid| reads.cmdline_of(uid), &|uid, joined| {
            rules.keep(uid, joined)
        })
    }

    /// Reads every process under `root`; `read_cmdline(uid)` says whether
    /// to read its command line, `keep(uid, joined argv)` whether to keep
    /// what was read.
    fn read_with(
        root: &ProcRoot,
        read_cmdline: &dyn Fn(Option<u32>) -> bool,
        keep: &dyn Fn(Option<u32>, &str) -> bool,
    ) -> ProcessTable {
        let mut entries = Vec::new();
        let mut cmdlines = CmdlineReader::default();
        if let Ok(all) = root.all_processes() {
            for process in all.flatten() {
                if let Some(mut e) = read_entry(root, &process) {
                    if e.has_argv && read_cmdline(e.uid) {
                        let argv = cmdlines.read(e.pid, e.uid);
                        if keep(e.uid, &argv.join(" ")) {
                            e.cmdline = argv;
                        }
                    }
                    entries.push(e);
                }
            }
        }
        let mut table = ProcessTable::from_entries(entries).with_own_pid(std::process::id());
        table.unread_cmdlines = cmdlines.unread;
        table
    }

    /// The processes whose command line could not be read in time.
    pub fn unread_cmdlines(&self) -> &[UnreadCmdline] {
        &self.unread_cmdlines
    }

    /// The gap line of `agent`'s cmdline rule, as `runner`, for the
    /// processes its `match.uid` admits whose command line could not be
    /// read in time; `None` for other rules or when every one was read.
    pub fn cmdline_gap(&self, agent: &AgentConfig, runner: u32) -> Option<String> {
        if !matches!(agent.rule, MatchRule::Cmdline(_)) {
            return None;
        }
        let filter = agent.uid_filter(runner);
        let unread: Vec<&UnreadCmdline> = self
            .unread_cmdlines
            .iter()
            .filter(|u| filter.is_none_or(|f| u.uid == Some(f)))
            .collect();
        let first = unread.first()?;
        let uid = first
            .uid
            .map_or("an unknown uid".to_string(), |u| format!("uid {u}"));
        Some(format!(
            "the command line of {} process(es) could not be read, so this rule cannot \
             tell whether they match: pid {} of {uid} ({}){}",
            unread.len(),
            first.pid,
            first.why,
            if unread.len() > 1 {
                format!(" and {} more", unread.len() - 1)
            } else {
                String::new()
            }
        ))
    }

    /// A table of the given entries (for fixtures). A pid given twice keeps
    /// the last entry.
    pub fn from_entries(entries: Vec<ProcEntry>) -> ProcessTable {
        let entries: BTreeMap<u32, ProcEntry> = entries.into_iter().map(|e| (e.pid, e)).collect();
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for e in entries.values() {
            if e.ppid != e.pid {
                children.entry(e.ppid).or_default().push(e.pid);
            }
        }
        let manager_root = cgroup::manager_root(entries.get(&1).and_then(|e| e.cgroup.as_deref()));
        ProcessTable {
            entries,
            children,
            own_pid: None,
            own_lineage: BTreeSet::new(),
            inventory: Inventory::default(),
            identities: HashMap::new(),
            refused: BTreeMap::new(),
            manager_root,
            unread_cmdlines: Vec::new(),
            partial: None,
        }
        .index_identities()
    }

    /// Each process's container: the one its anchored cgroup names, when
    /// no runtime answers for it (only its id is then known); when one does,
    /// only if that runtime confirms it ([`ProcessTable::verify`]).
    fn index_identities(mut self) -> ProcessTable {
        let mut identities = HashMap::new();
        let mut refused = BTreeMap::new();
        for e in self.entries.values() {
            let Some(i) = self.inventory.identity(&e.containers) else {
                continue;
            };
            if !i.resolved {
                identities.insert(e.pid, i);
                continue;
            }
            match self.verify(e, &i) {
                Ok(()) => {
                    identities.insert(e.pid, i);
                }
                Err(why) => {
                    refused.insert(
                        e.pid,
                        format!(
                            "pid {} is not taken for container {} ({}): {why}",
                            e.pid,
                            i.short_id(),
                            i.runtime
                        ),
                    );
                }
            }
        }
        self.identities = identities;
        self.refused = refused;
        self
    }

    /// Whether the runtime confirms that process `e` is in container `i`:
    /// the container's init, as the runtime reports it, is a process here
    /// whose cgroup is that container's, and `e` is in its pid namespace.
    fn verify(&self, e: &ProcEntry, i: &Identity) -> Result<(), String> {
        let init = self
            .inventory
            .init_pid(&i.id)
            .flatten()
            .ok_or("its runtime reports no init pid for it")?;
        let Some(ie) = self.entries.get(&init) else {
            return Err(format!(
                "its init pid {init}, as its runtime reports it, is no process here \
                 (the runtime's pid namespace is another)"
            ));
        };
        if !ie.containers.iter().any(|c| c.id == i.id) {
            return Err(format!(
                "pid {init}, its init as its runtime reports it, is not in its cgroup \
                 (the runtime's pid namespace is another)"
            ));
        }
        match (e.pidns, ie.pidns) {
            (Some(a), Some(b)) if a == b => Ok(()),
            (Some(_), Some(_)) => Err(format!(
                "it is not in the pid namespace of the container's init (pid {init})"
            )),
            _ => Err(format!(
                "the pid namespaces of pid {} and of the container's init (pid {init}) cannot be read",
                e.pid
            )),
        }
    }

    /// The pid namespaces this process could not read itself, of the
    /// processes whose cgroup names a container, as `ask` (the helper)
    /// tells them; then each process's container confirmed again
    /// (as `ProcessTable::verify` does). Where `ask` fails they stay unread (and
    /// such a process is not taken for its container).
    pub fn with_pid_namespaces(
        mut self,
        ask: &mut dyn FnMut(&[u32]) -> Result<selfheal_core::protocol::NamespacesResult, String>,
    ) -> ProcessTable {
        let unread: Vec<u32> = self
            .entries
            .values()
            .filter(|e| e.pidns.is_none() && !e.containers.is_empty())
            .map(|e| e.pid)
            .collect();
        for chunk in unread.chunks(selfheal_core::protocol::MAX_PIDS) {
            match ask(chunk) {
                Ok(r) => {
                    for p in r.processes {
                        if let Some(e) = self.entries.get_mut(&p.pid) {
                            e.pidns = p.pid_ns;
                        }
                    }
                }
                Err(why) => {
                    tracing::warn!("pid namespaces of containers' processes unread: {why}");
                    break;
                }
            }
        }
        self.index_identities()
    }

    /// Why the processes among `pids` whose cgroup names a container were
    /// not taken for it (see `ProcessTable::verify`).
    pub fn refusals(&self, pids: &[u32]) -> Vec<String> {
        pids.iter()
            .filter_map(|p| self.refused.get(p).cloned())
            .collect()
    }

    /// Marks `pid` as selfheal itself: rules other than `pid`/`pidfile`
    /// never pick it or one of its ancestors (`sudo selfheal inspect sol`
    /// must not be the agent `sol`, nor take selfheal along as its
    /// descendant). [`ProcessTable::read`] marks the current process.
    pub fn with_own_pid(mut self, pid: u32) -> ProcessTable {
        self.own_pid = Some(pid);
        let mut lineage = BTreeSet::new();
        let mut cur = Some(pid);
        while let Some(p) = cur {
            if !lineage.insert(p) {
                break;
            }
            cur = self.entries.get(&p).map(|e| e.ppid);
        }
        self.own_lineage = lineage;
        self
    }

    /// Attaches what the container runtimes said (names, images, labels),
    /// for container rules and identities.
    pub fn with_inventory(mut self, inventory: Inventory) -> ProcessTable {
        self.inventory = inventory;
        self.with_inits_filled().index_identities()
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// The system manager's root cgroup (`/` on a host).
    pub fn manager_root(&self) -> &str {
        &self.manager_root
    }

    /// The unit `pid`'s cgroup anchors, and whose manager runs it.
    pub fn unit_of(&self, pid: u32) -> Option<cgroup::UnitPlace<'_>> {
        let path = self.entries.get(&pid)?.cgroup.as_deref()?;
        cgroup::unit_of(path, &self.manager_root)
    }

    /// The container `pid` is in, as far as its cgroup and the runtimes
    /// tell; `None` on the host (or for a pid not in the table).
    pub fn identity(&self, pid: u32) -> Option<&Identity> {
        self.identities.get(&pid)
    }

    /// The distinct containers of `pids`, in pid order of first sight.
    pub fn identities(&self, pids: &[u32]) -> Vec<Identity> {
        let mut out: Vec<Identity> = Vec::new();
        for pid in pids {
            if let Some(i) = self.identity(*pid)
                && !out.iter().any(|o| o.id == i.id)
            {
                out.push(i.clone());
            }
        }
        out
    }

    /// Every container some process of the table is in (for asking the
    /// runtimes about them), deduplicated.
    pub fn containers(&self) -> Vec<CgroupContainer> {
        let set: BTreeSet<&CgroupContainer> =
            self.entries.values().flat_map(|e| &e.containers).collect();
        set.into_iter().cloned().collect()
    }

    pub fn get(&self, pid: u32) -> Option<&ProcEntry> {
        self.entries.get(&pid)
    }

    /// The entries, by pid.
    pub fn entries(&self) -> impl Iterator<Item = &ProcEntry> {
        self.entries.values()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `roots` and all their descendants present in the table, sorted and
    /// deduplicated. Each pid is visited once, so a ppid cycle (impossible in
    /// a real table, possible in a torn read or a fixture) ends.
    pub fn with_descendants(&self, roots: &[u32]) -> Vec<u32> {
        let mut seen: BTreeSet<u32> = BTreeSet::new();
        let mut stack: Vec<u32> = roots
            .iter()
            .copied()
            .filter(|p| self.entries.contains_key(p))
            .collect();
        while let Some(pid) = stack.pop() {
            if !seen.insert(pid) {
                continue;
            }
            if let Some(kids) = self.children.get(&pid) {
                stack.extend(kids.iter().copied().filter(|k| !seen.contains(k)));
            }
        }
        seen.into_iter().collect()
    }

    /// The matched processes whose parent is not matched too: the tops of
    /// the matched subtrees. Matched processes in a ppid cycle (no top) get
    /// their lowest pid as a root, so none is lost.
    fn tops(&self, matched: &BTreeSet<u32>) -> Vec<u32> {
        let mut roots: Vec<u32> = matched
            .iter()
            .copied()
            .filter(|pid| {
                self.entries
                    .get(pid)
                    .is_none_or(|e| e.ppid == e.pid || !matched.contains(&e.ppid))
            })
            .collect();
        loop {
            let covered = self.with_descendants(&roots);
            match matched.iter().find(|p| covered.binary_search(p).is_err()) {
                Some(p) => roots.push(*p),
                None => break,
            }
        }
        roots.sort_unstable();
        roots
    }

    /// Whether `pid` is selfheal or one of its ancestors.
    fn is_own(&self, pid: u32) -> bool {
        self.own_lineage.contains(&pid)
    }
}

/// One process, every field read.
fn read_entry(root: &ProcRoot, process: &procfs::process::Process) -> Option<ProcEntry> {
    let pid = u32::try_from(process.pid).ok()?;
    let (mut e, _) = entry_of(pid, process.stat().ok()?);
    fill(root, &mut e);
    Some(e)
}

/// `pid`'s entry as its `stat` says (parent, command name, whether it has
/// a command line) and its start time (clock ticks after boot), nothing
/// else read.
fn entry_of(pid: u32, stat: procfs::process::Stat) -> (ProcEntry, u64) {
    // Kernel threads have no user memory, zombies none left.
    const PF_KTHREAD: u32 = 0x0020_0000;
    let has_argv = stat.flags & PF_KTHREAD == 0 && !matches!(stat.state, 'Z' | 'X');
    let entry = ProcEntry {
        pid,
        ppid: u32::try_from(stat.ppid).unwrap_or(0),
        comm: stat.comm,
        cmdline: Vec::new(),
        has_argv,
        exe: None,
        cgroup: None,
        uid: None,
        containers: Vec::new(),
        pidns: None,
    };
    (entry, stat.starttime)
}

/// The fields of `e` beyond its `stat`: uid, executable, cgroup (and the
/// containers it names), pid namespace. What cannot be read stays `None`.
fn fill(root: &ProcRoot, e: &mut ProcEntry) {
    let cgroup_text = std::fs::read_to_string(root.of_pid(e.pid, "cgroup")).ok();
    e.cgroup = cgroup_text.as_deref().and_then(cgroup_path);
    e.containers = cgroup_text
        .as_deref()
        .map(|t| containers_for(t, crate::sys::creds::euid()))
        .unwrap_or_default();
    e.pidns = root.namespace(e.pid, "pid").ok();
    e.exe = std::fs::read_link(root.of_pid(e.pid, "exe")).ok();
    e.uid = uid_of(root, e.pid);
}

/// The owner of `ROOT/PID`: the process's effective uid.
fn uid_of(root: &ProcRoot, pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(root.pid(pid)).map(|m| m.uid()).ok()
}

/// The cgroup path of `pid` as its `/proc/PID/cgroup` says now
/// ([`cgroup_path`]); `None` when it cannot be read.
pub fn cgroup_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(crate::sys::procfs::ProcRoot::default().of_pid(pid, "cgroup"))
        .ok()
        .and_then(|t| cgroup_path(&t))
}

#[cfg(test)]
mod tests {
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
            p.contains(
                "uid 4242's processes only; 2 process(es) of other uids match: set match.uid"
            ),
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
}
