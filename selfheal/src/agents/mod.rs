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
    Matched, NotInUnit, PidfileError, enrich, enrich_for, find, find_for, find_of, read_pidfile,
    still_in_unit,
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
    /// When it started, in clock ticks after boot (`stat`'s `starttime`):
    /// with the pid, which process this is. `None` in fixtures.
    pub start_ticks: Option<u64>,
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
            start_ticks: None,
        }
    }
}

/// Why a process whose cgroup names a container is not taken for it: the
/// runtime's word could not be confirmed here (`ProcessTable::verify`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum NotConfirmed {
    #[error("its runtime reports no init pid for it")]
    NoInit,
    #[error(
        "its init pid {init}, as its runtime reports it, is no process here \
         (the runtime's pid namespace is another)"
    )]
    InitNotHere { init: u32 },
    #[error(
        "pid {init}, its init as its runtime reports it, is not in its cgroup \
         (the runtime's pid namespace is another)"
    )]
    InitNotInCgroup { init: u32 },
    #[error("it is not in the pid namespace of the container's init (pid {init})")]
    OtherPidNamespace { init: u32 },
    #[error(
        "the pid namespaces of pid {pid} and of the container's init (pid {init}) cannot be read"
    )]
    PidNamespacesUnread { pid: u32, init: u32 },
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
    pub(crate) fn read_for_in(
        root: &ProcRoot,
        agents: &[&AgentConfig],
        runner: u32,
    ) -> ProcessTable {
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
    fn verify(&self, e: &ProcEntry, i: &Identity) -> Result<(), NotConfirmed> {
        let init = self
            .inventory
            .init_pid(&i.id)
            .flatten()
            .ok_or(NotConfirmed::NoInit)?;
        let Some(ie) = self.entries.get(&init) else {
            return Err(NotConfirmed::InitNotHere { init });
        };
        if !ie.containers.iter().any(|c| c.id == i.id) {
            return Err(NotConfirmed::InitNotInCgroup { init });
        }
        match (e.pidns, ie.pidns) {
            (Some(a), Some(b)) if a == b => Ok(()),
            (Some(_), Some(_)) => Err(NotConfirmed::OtherPidNamespace { init }),
            _ => Err(NotConfirmed::PidNamespacesUnread { pid: e.pid, init }),
        }
    }

    /// The pid namespaces this process could not read itself, of the
    /// processes whose cgroup names a container, as `ask` (the helper)
    /// tells them; then each process's container confirmed again
    /// (as `ProcessTable::verify` does). Where `ask` fails they stay unread (and
    /// such a process is not taken for its container).
    pub fn with_pid_namespaces<E: std::fmt::Display>(
        mut self,
        ask: &mut dyn FnMut(&[u32]) -> Result<selfheal_core::protocol::NamespacesResult, E>,
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
    let mut e = entry_of(pid, process.stat().ok()?);
    fill(root, &mut e);
    Some(e)
}

/// `pid`'s entry as its `stat` says (parent, command name, whether it has
/// a command line, its start time in clock ticks after boot), nothing else
/// read.
fn entry_of(pid: u32, stat: procfs::process::Stat) -> ProcEntry {
    // Kernel threads have no user memory, zombies none left.
    const PF_KTHREAD: u32 = 0x0020_0000;
    let has_argv = stat.flags & PF_KTHREAD == 0 && !matches!(stat.state, 'Z' | 'X');
    ProcEntry {
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
        start_ticks: Some(stat.starttime),
    }
}

/// The fields of `e` beyond its `stat`: uid, executable, cgroup (and the
/// containers it names), pid namespace. What cannot be read stays `None`.
fn fill(root: &ProcRoot, e: &mut ProcEntry) {
    let cgroup_text = cgroup_text(root, e.pid);
    e.cgroup = cgroup_text.as_deref().and_then(cgroup_path);
    e.containers = cgroup_text
        .as_deref()
        .map(|t| containers_for(t, crate::sys::creds::euid()))
        .unwrap_or_default();
    e.pidns = root.namespace(e.pid, "pid").ok();
    e.exe = std::fs::read_link(root.of_pid(e.pid, "exe")).ok();
    e.uid = uid_of(root, e.pid);
}

/// The text of `ROOT/PID/cgroup`, in one `read` where it fits 4 KiB;
/// `None` when it cannot be read.
fn cgroup_text(root: &ProcRoot, pid: u32) -> Option<String> {
    let (mut buf, mut more) = ([0u8; 4096], Vec::new());
    crate::sys::procfs::read_whole(&root.of_pid(pid, "cgroup"), &mut buf, &mut more)
        .ok()
        .map(|t| String::from_utf8_lossy(t).into_owned())
}

/// The owner of `ROOT/PID`: the process's effective uid.
fn uid_of(root: &ProcRoot, pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(root.pid(pid)).map(|m| m.uid()).ok()
}

/// The cgroup path of `pid` as its `/proc/PID/cgroup` says now
/// ([`cgroup_path`]); `None` when it cannot be read.
pub fn cgroup_of(pid: u32) -> Option<String> {
    cgroup_of_in(&ProcRoot::default(), pid)
}

/// [`cgroup_of`] under `root`.
fn cgroup_of_in(root: &ProcRoot, pid: u32) -> Option<String> {
    cgroup_text(root, pid).and_then(|t| cgroup_path(&t))
}

#[cfg(test)]
mod tests;
