//! Collecting an agent's evidence: the I/O edge of `inspect` (the kernel's
//! task iterators or procfs; TCP connections from the iterators' pass or
//! one sock_diag dump per network namespace; the eBPF tracer). The report's types, the pure join
//! ([`selfheal_core::inspect::build`]) and the text renderer
//! ([`selfheal_core::inspect::render`]) are the core's.
//!
//! Each process's threads and socket fds are read by the first reader
//! that can, at minimal or light detail: the kernel's task iterators (one
//! walk of each per process; [`crate::ebpf::iter`]), linked here for root,
//! run by the helper for anyone else ([`HelperReads`]: the pids the caller
//! may query); then procfs. A process's TCP connections come from the
//! same pass (every network namespace, no `setns`, no dump) where it read
//! them, else from the sock_diag dump of its namespace. The evidence is
//! the same either way; [`selfheal_core::inspect::Collection`] says which
//! read how many, why procfs did where it did, and why sock_diag did.

use selfheal_core::inspect::{
    Collection, EbpfEvidence, Evidence, FULL_IS_PROCFS, MAX_PROCESSES, MAX_ZOMBIES, NetnsSockets,
    UnreadListening,
};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::SocketAddr,
    time::Duration,
};

use selfheal_core::{
    config::Roles,
    ebpf::{
        TracerSnapshot,
        iter::{IterProcess, TcpPass},
        strategy::Strategy,
    },
    model::SocketRole,
    proc::{Detail, ProcessInfo, TaskClocks},
    protocol::{
        CollectRequest, CollectResult, IterateResult, MAX_COLLECT_BUDGET_MS, MAX_COLLECT_PIDS,
        MAX_PIDS, NamespacesResult,
    },
    runtime::Identity,
    sockdiag::TcpSocket,
};

use crate::{
    ebpf::{self, Tracer, TracerOptions},
    proc,
    sys::{procfs::ProcRoot, sockdiag},
};

/// Reads made elsewhere (by the helper), for a collector that may not
/// make them itself: passes of the task iterators, for a check that may
/// not link them; whole processes and their namespaces, for one that may
/// not read other users' processes.
pub trait HelperReads {
    /// One pass over each of `pids` that may be read, or why there is none.
    fn iterate(&mut self, pids: &[u32]) -> Result<IterateResult, String>;

    /// Each of `req.pids` that may be read, read as a check reads it.
    fn collect(&mut self, req: &CollectRequest) -> Result<CollectResult, String>;

    /// The namespaces of each of `pids` that may be read.
    fn namespaces(&mut self, pids: &[u32]) -> Result<NamespacesResult, String>;
}

/// What to inspect: an agent's processes, or one process and its descendants.
pub struct Target {
    /// The agent's name, `None` for `--pid`.
    pub agent: Option<String>,
    /// The match rule as written (`cmdline=…`, `pid=…`).
    pub rule: String,
    /// Matched processes (the rule's roots).
    pub roots: Vec<u32>,
    /// Roots and all their descendants.
    pub pids: Vec<u32>,
    /// Why the rule matched nothing, if it did not.
    pub problem: Option<String>,
    /// The upstream a remote address belongs to: its role and its index in
    /// the agent's upstream list.
    pub upstream_of: Box<dyn Fn(SocketAddr) -> Option<(SocketRole, usize)>>,
    /// Upstreams as configured, with what their host names resolved to.
    pub upstreams: Vec<String>,
    /// How its sockets get their roles: through `upstream_of` alone, or
    /// (an `[auto]` agent) only for the connections it made, never for one
    /// it accepted.
    pub roles: Roles,
    /// The containers its processes are in (empty on the host).
    pub containers: Vec<Identity>,
    /// What the container runtimes could not tell about them.
    pub container_gaps: Vec<String>,
    /// Why a `cmdline` rule could not tell whether some processes are the
    /// agent's (their command lines went unread), if so.
    pub unread_cmdlines: Option<String>,
}

/// How to collect.
#[derive(Clone, Debug, Default)]
pub struct CollectOptions {
    /// Skip eBPF entirely.
    pub no_ebpf: bool,
    /// Why eBPF is skipped, for the report (default: "disabled by --no-ebpf").
    pub no_ebpf_why: Option<String>,
    /// How much to read per thread.
    pub detail: Detail,
    /// Strategies to try; all when empty.
    pub strategies: Vec<Strategy>,
    /// Watch this long before reading the tracer, so receives that begin
    /// meanwhile are timed from their beginning.
    pub wait: Duration,
    /// Read every process from procfs, not the kernel's task iterators,
    /// for this reason.
    pub no_iterators: Option<String>,
    /// Load the task iterators where none are pinned (once per process:
    /// worth it for a `watch`, not for one check).
    pub load_iterators: bool,
}

/// Gathers evidence on `target`. Never fails: what cannot be read becomes
/// a gap in the report.
pub fn collect(target: &Target, opts: &CollectOptions) -> Evidence {
    Collector::new(opts, &target.pids).collect(target)
}

/// Gathers evidence on several targets in one pass: the tracer is attached
/// once (watching every target's pids) and read once, and each network
/// namespace's sockets are dumped once, however many agents live in it.
pub struct Collector {
    /// The tracer's evidence, shared by every target.
    ebpf: EbpfEvidence,
    /// Socket dumps by network namespace, made on first need.
    dumps: BTreeMap<(u64, u64), NetnsSockets>,
    /// Each dump's positions by inode.
    index: BTreeMap<(u64, u64), HashMap<u64, usize>>,
    /// The listening addresses of each network namespace (for a target
    /// whose roles are [`Roles::Outbound`]), read on first need, or why
    /// they could not be read.
    listening: BTreeMap<(u64, u64), Result<Vec<SocketAddr>, String>>,
    /// How the listening addresses of a pid's network namespace are read
    /// (`sockdiag::listening_in_netns_of`; a test's failure otherwise).
    read_listening: fn(u32) -> Result<Vec<SocketAddr>, sockdiag::SockDiagError>,
    detail: Detail,
    /// The CPUs' task clocks, taken on the first read that measures waits:
    /// one reference per CPU per collector, not per process.
    clocks: Option<TaskClocks>,
    /// How long one collection may take ([`Collector::set_budget`]).
    budget: Duration,
    /// Reads other processes' memory, in a child that can be abandoned.
    reader: crate::sys::memread::Reader,
    /// The procfs the processes are read under.
    proc: ProcRoot,
    /// Why the task iterators are not linked here, if they are not.
    iterators_off: Option<String>,
    /// Whether that is because they were turned off (`--no-iterators`):
    /// then not even the helper's passes are asked for.
    iterators_asked_off: bool,
    /// The helper's passes, when they are not linked here: taken once
    /// for every pid of the check, or why there are none.
    passes: Option<Result<HelperPasses, String>>,
    /// Where whole processes are read, for a collector that may not read
    /// other users' processes itself ([`Collector::reads_from`]).
    reads: Option<Box<dyn HelperReads>>,
    /// Load them where none are pinned.
    load_iterators: bool,
}

impl Collector {
    /// Attaches the tracer (unless `opts.no_ebpf`), watches `pids`, waits
    /// `opts.wait`, and takes its snapshot.
    pub fn new(opts: &CollectOptions, pids: &[u32]) -> Collector {
        let (mut tracer, mut ebpf) = attach(pids, opts);
        if tracer.is_some() && !opts.wait.is_zero() {
            std::thread::sleep(opts.wait);
        }
        if let Some(t) = tracer.as_mut() {
            ebpf.attempts = t.attempts().to_vec();
            ebpf.watched_since_ns = pids.iter().filter_map(|p| t.watched_since(*p)).max();
            match t.snapshot() {
                Ok(s) => ebpf.snapshot = Some(s),
                Err(e) => ebpf.error = Some(ebpf::chain(&e)),
            }
        }
        Collector {
            ebpf,
            dumps: BTreeMap::new(),
            listening: BTreeMap::new(),
            read_listening: sockdiag::listening_in_netns_of,
            index: BTreeMap::new(),
            detail: opts.detail,
            clocks: None,
            budget: selfheal_core::config::DEFAULT_COLLECT_BUDGET,
            reader: crate::sys::memread::Reader::default(),
            proc: ProcRoot::default(),
            iterators_off: iterators_off(opts.no_iterators.clone()),
            iterators_asked_off: opts.no_iterators.is_some(),
            passes: None,
            reads: None,
            load_iterators: opts.load_iterators,
        }
    }

    /// A collector whose eBPF evidence comes from elsewhere (the helper's
    /// long-running tracer): its snapshot, since when the pids are watched,
    /// or why there is none.
    pub fn from_snapshot(
        snapshot: Result<(TracerSnapshot, Option<u64>), String>,
        detail: Detail,
    ) -> Collector {
        let ebpf = match snapshot {
            Ok((s, since)) => EbpfEvidence {
                built_in: ebpf::BUILT_IN,
                attempts: Vec::new(),
                error: None,
                watched_since_ns: since,
                snapshot: Some(s),
            },
            Err(e) => EbpfEvidence {
                built_in: ebpf::BUILT_IN,
                attempts: Vec::new(),
                error: Some(e),
                watched_since_ns: None,
                snapshot: None,
            },
        };
        Collector {
            ebpf,
            dumps: BTreeMap::new(),
            listening: BTreeMap::new(),
            read_listening: sockdiag::listening_in_netns_of,
            index: BTreeMap::new(),
            detail,
            clocks: None,
            budget: selfheal_core::config::DEFAULT_COLLECT_BUDGET,
            reader: crate::sys::memread::Reader::default(),
            proc: ProcRoot::default(),
            iterators_off: iterators_off(None),
            iterators_asked_off: false,
            passes: None,
            reads: None,
            load_iterators: false,
        }
    }

    /// The time budget of each following collection (one call of
    /// [`Collector::collect`] or [`Collector::collect_with`]): when it is
    /// spent the collection stops where it is, a read of another process's
    /// memory still waiting is abandoned, and the evidence says so
    /// ([`Evidence::over_budget`]). Default `DEFAULT_COLLECT_BUDGET`. A
    /// budget too long to count in ms (`collect_budget =
    /// "500000000000y"`) is `u64::MAX` ms, which a deadline on the
    /// monotonic clock still holds: no budget, not a panic.
    pub fn set_budget(&mut self, budget: Duration) {
        self.budget = Duration::from_millis(selfheal_core::clock::ms(budget));
    }

    /// Reads every process from procfs, not the kernel's task iterators,
    /// for `why`.
    pub fn without_iterators(&mut self, why: &str) {
        self.iterators_off = Some(why.to_string());
        self.iterators_asked_off = true;
    }

    /// Where this process may not link the task iterators itself (not
    /// root) and they are not turned off: asks `source` for a pass over
    /// each of `pids` (every pid of the check), once, in requests of at
    /// most [`MAX_PIDS`] pids; every collection then reads from them.
    pub fn passes_from(&mut self, source: &mut dyn HelperReads, pids: &[u32]) {
        if self.iterators_off.is_none() || self.iterators_asked_off {
            return;
        }
        let mut all = HelperPasses::default();
        for chunk in pids.chunks(MAX_PIDS) {
            match source.iterate(chunk) {
                Ok(r) => all.add(r),
                Err(why) => {
                    self.passes = Some(Err(why));
                    return;
                }
            }
        }
        self.passes = Some(Ok(all));
    }

    /// Has `source` (the helper) read every process and its sockets, in
    /// one `collect` request per collection (of at most
    /// [`MAX_COLLECT_PIDS`] pids), within the collection's budget: for a
    /// check that may not read other users' processes itself
    /// ([`crate::sys::creds::reads_others`]). A request that fails leaves
    /// its pids to procfs here, with the reason.
    pub fn reads_from(&mut self, source: Box<dyn HelperReads>) {
        self.reads = Some(source);
    }

    /// Loads the task iterators where none are pinned
    /// ([`CollectOptions::load_iterators`]).
    pub fn load_iterators(&mut self, load: bool) {
        self.load_iterators = load;
    }

    /// Reads `target`'s processes, and its sockets from the (cached) dump of
    /// each network namespace they live in.
    pub fn collect(&mut self, target: &Target) -> Evidence {
        self.collect_with(target, self.detail)
    }

    /// [`Collector::collect`] with another level of thread detail (a full
    /// re-read for a forensic snapshot after a light check).
    pub fn collect_with(&mut self, target: &Target, detail: Detail) -> Evidence {
        if let Some(source) = self.reads.as_mut() {
            let clocks = if detail == Detail::Minimal {
                &TaskClocks::default()
            } else {
                &*self.clocks.get_or_insert_with(proc::task_clocks)
            };
            let read = read_through(
                source.as_mut(),
                &self.proc,
                target,
                detail,
                clocks,
                self.budget,
            );
            return self.evidence(target, read);
        }
        let mut processes = Vec::new();
        let mut gone = Vec::new();
        let clocks = if detail == Detail::Minimal {
            &TaskClocks::default()
        } else {
            &*self.clocks.get_or_insert_with(proc::task_clocks)
        };
        // Opening or loading the iterators is not the agent's collection:
        // done before its budget starts.
        if self.iterators_off.is_none() && detail != Detail::Full {
            drop(open_iterators(self.load_iterators));
        }
        let started = std::time::Instant::now();
        let mut access = proc::MemAccess {
            reader: &mut self.reader,
            deadline: started + self.budget,
            over: false,
        };
        let mut unread = 0;
        let (mut unread_processes, mut unread_zombies) = (0, BTreeMap::new());
        let mut zombies = 0;
        let mut collection = Collection::default();
        // The TCP connections each pass read, by pid.
        let mut passes_tcp = BTreeMap::new();
        // Not linked here (and not turned off): the helper's passes.
        let passes = self.passes.as_ref().filter(|_| {
            self.iterators_off.is_some() && !self.iterators_asked_off && detail != Detail::Full
        });
        for &pid in &target.pids {
            if access.over || std::time::Instant::now() >= access.deadline {
                access.over = true;
                unread += 1;
                continue;
            }
            // Past the caps only the state is read: a zombie is counted
            // under its parent, anything else counted as unread.
            let full = processes.len() - zombies >= MAX_PROCESSES;
            if full || zombies >= MAX_ZOMBIES {
                match state_and_ppid(&self.proc, pid) {
                    Some(('Z', ppid)) if zombies >= MAX_ZOMBIES => {
                        *unread_zombies.entry(ppid).or_insert(0) += 1;
                        continue;
                    }
                    Some(('Z', _)) => {}
                    Some(_) if full => {
                        unread_processes += 1;
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        gone.push(pid);
                        continue;
                    }
                }
            }
            let read = if detail == Detail::Full {
                collection.procfs_for(FULL_IS_PROCFS);
                proc::process_in(&self.proc, pid, detail, clocks, &mut access)
            } else if let Some(passes) = passes {
                match passes.as_ref().map(|p| p.of(pid)) {
                    Ok(HelperPass::Read(start, pass)) => {
                        // The pass is of the process the helper pinned; a
                        // pid reused since is another process: gone.
                        match proc::process_iterated(
                            &self.proc,
                            pid,
                            pass,
                            detail,
                            clocks,
                            &mut access,
                        ) {
                            Ok(p) if p.start_ticks != *start => {
                                gone.push(pid);
                                continue;
                            }
                            read => {
                                collection.iterators += 1;
                                collection.iterators_from = Some("helper".into());
                                passes_tcp.insert(pid, pass.tcp.clone());
                                read
                            }
                        }
                    }
                    Ok(HelperPass::Gone) => {
                        gone.push(pid);
                        continue;
                    }
                    Ok(HelperPass::Refused) => {
                        collection.procfs_for(
                            "the helper ran no task iterators on it (this user may not query it)",
                        );
                        proc::process_in(&self.proc, pid, detail, clocks, &mut access)
                    }
                    Err(why) => {
                        collection.procfs_for(why);
                        proc::process_in(&self.proc, pid, detail, clocks, &mut access)
                    }
                }
            } else if let Some(why) = &self.iterators_off {
                collection.procfs_for(why);
                proc::process_in(&self.proc, pid, detail, clocks, &mut access)
            } else {
                match iterate(pid, self.load_iterators) {
                    Ok((pass, from)) => {
                        collection.iterators += 1;
                        collection.iterators_from = Some(from.to_string());
                        let read = proc::process_iterated(
                            &self.proc,
                            pid,
                            &pass,
                            detail,
                            clocks,
                            &mut access,
                        );
                        passes_tcp.insert(pid, pass.tcp);
                        read
                    }
                    Err(Walk::Gone) => {
                        gone.push(pid);
                        continue;
                    }
                    Err(Walk::Failed(why)) => {
                        collection.procfs_for(&why);
                        proc::process_in(&self.proc, pid, detail, clocks, &mut access)
                    }
                }
            };
            match read {
                Ok(p) => {
                    zombies += usize::from(p.state == 'Z');
                    processes.push(p);
                }
                Err(_) => gone.push(pid),
            }
        }
        let read = Read {
            processes,
            gone,
            over: access.over,
            unread,
            unread_processes,
            unread_zombies,
            tcp: None,
            passes_tcp,
            collection,
        };
        self.evidence(target, read)
    }

    /// The evidence of `target` from what was read of it.
    fn evidence(&mut self, target: &Target, read: Read) -> Evidence {
        let over_budget = read.over.then(|| {
            format!(
                "{}: collection exceeded its budget of {} ms and stopped ({} of {} processes \
                 reached): the evidence is partial",
                target.agent.as_deref().unwrap_or(&target.rule),
                self.budget.as_millis(),
                target.pids.len() - read.unread,
                target.pids.len(),
            )
        });
        let mut collection = read.collection;
        let tcp = match read.tcp {
            Some(tcp) => tcp,
            None => self.sockets(&read.processes, &read.passes_tcp, &mut collection),
        };
        let mut roles = BTreeMap::new();
        let mut unread_listening: Vec<UnreadListening> = Vec::new();
        for (pid, r) in &tcp {
            let Ok(sockets) = r else { continue };
            let listening = match target.roles {
                Roles::ByAddress => None,
                // Where the listeners cannot be read, no connection can be
                // told made: none gets a role, and the evidence says why.
                Roles::Outbound => match self.listening_of(*pid) {
                    (_, Ok(l)) => Some(l),
                    (netns, Err(error)) => {
                        let seen = unread_listening
                            .iter()
                            .any(|u| netns.is_some() && u.netns == netns);
                        if !sockets.is_empty() && !seen {
                            unread_listening.push(UnreadListening {
                                pid: *pid,
                                netns,
                                error: error.to_string(),
                            });
                        }
                        continue;
                    }
                },
            };
            for s in sockets {
                if listening.is_some_and(|l| selfheal_core::auto::accepted(s.local, l)) {
                    continue;
                }
                if let Some(role) = (target.upstream_of)(s.remote) {
                    roles.insert(s.inode, role);
                }
            }
        }
        let snapshot = self.ebpf.snapshot.as_ref().map(|s| {
            let mut pids = target.pids.clone();
            pids.sort_unstable();
            selfheal_core::protocol::filter_snapshot(s.clone(), &pids)
        });
        Evidence {
            agent: target.agent.clone(),
            rule: target.rule.clone(),
            roots: target.roots.clone(),
            problem: target.problem.clone(),
            upstreams: target.upstreams.clone(),
            containers: target.containers.clone(),
            container_gaps: target.container_gaps.clone(),
            unread_cmdlines: target.unread_cmdlines.clone(),
            unread_listening,
            processes: read.processes,
            gone: read.gone,
            over_budget,
            unread_processes: read.unread_processes,
            unread_zombies: read.unread_zombies,
            tcp,
            roles,
            ebpf: EbpfEvidence {
                built_in: ebpf::BUILT_IN,
                attempts: self.ebpf.attempts.clone(),
                error: self.ebpf.error.clone(),
                watched_since_ns: self.ebpf.watched_since_ns,
                snapshot,
            },
            collection,
        }
    }

    /// The network namespace of `pid` (its inode, where it could be read)
    /// and its listening addresses (cached per namespace), or why they
    /// cannot be read.
    fn listening_of(&mut self, pid: u32) -> (Option<u64>, Result<&[SocketAddr], String>) {
        use std::os::unix::fs::MetadataExt as _;
        let path = self.proc.of_pid(pid, "ns/net");
        let m = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(e) => return (None, Err(format!("{}: {e}", path.display()))),
        };
        let read = self.read_listening;
        let l = self
            .listening
            .entry((m.dev(), m.ino()))
            .or_insert_with(|| read(pid).map_err(|e| e.to_string()));
        (Some(m.ino()), l.as_deref().map_err(Clone::clone))
    }

    /// The TCP connections of `processes` by network namespace: from the
    /// task iterators' pass of each process whose pass read them (every
    /// namespace in that one pass, no dump), else from the (cached)
    /// sock_diag dump of its namespace, noting why in `collection`. A
    /// socket two processes hold is listed once.
    fn sockets(
        &mut self,
        processes: &[ProcessInfo],
        passes: &BTreeMap<u32, TcpPass>,
        collection: &mut Collection,
    ) -> Vec<NetnsSockets> {
        let mut groups: Vec<(u32, u32, Vec<TcpSocket>)> = Vec::new();
        let mut seen = HashSet::new();
        let mut rest = Vec::new();
        for p in processes.iter().filter(|p| !p.sockets.is_empty()) {
            match passes.get(&p.pid) {
                Some(TcpPass::Read(conns)) => {
                    for c in conns.iter().filter(|c| seen.insert(c.socket.inode)) {
                        match groups.iter_mut().find(|(ns, _, _)| *ns == c.netns) {
                            Some((_, _, all)) => all.push(c.socket.clone()),
                            None => groups.push((c.netns, p.pid, vec![c.socket.clone()])),
                        }
                    }
                }
                Some(TcpPass::Unread(why)) => {
                    collection.sock_diag_for(why);
                    rest.push(p);
                }
                None => {
                    collection.sock_diag_for("procfs read the process");
                    rest.push(p);
                }
            }
        }
        let mut tcp: Vec<NetnsSockets> = groups
            .into_iter()
            .map(|(_, pid, all)| (pid, Ok(all)))
            .collect();
        if !rest.is_empty() {
            tcp.extend(self.dumped_sockets(&rest).into_iter().map(|(pid, found)| {
                let found = found.map(|all| {
                    all.into_iter()
                        .filter(|s| !seen.contains(&s.inode))
                        .collect()
                });
                (pid, found)
            }));
        }
        tcp
    }

    /// The sockets of `processes`, from the (cached) sock_diag dump of
    /// each network namespace they live in.
    fn dumped_sockets(&mut self, processes: &[&ProcessInfo]) -> Vec<NetnsSockets> {
        let owned: BTreeSet<u64> = processes
            .iter()
            .flat_map(|p| p.sockets.iter().map(|(_, ino)| *ino))
            .collect();
        let mut tcp: Vec<NetnsSockets> = Vec::new();
        let mut seen_ns = BTreeSet::new();
        for p in processes.iter().filter(|p| !p.sockets.is_empty()) {
            let ns = match std::fs::metadata(self.proc.of_pid(p.pid, "ns/net")) {
                Ok(m) => {
                    use std::os::unix::fs::MetadataExt as _;
                    (m.dev(), m.ino())
                }
                // Its sockets are unread, and the report says why.
                Err(e) => {
                    tcp.push((p.pid, Err(format!("cannot read it ({e})"))));
                    continue;
                }
            };
            if !seen_ns.insert(ns) {
                continue;
            }
            let (via, dump) = self.dumps.entry(ns).or_insert_with(|| {
                (
                    p.pid,
                    sockdiag::dump_tcp_in_netns_of(p.pid).map_err(|e| e.to_string()),
                )
            });
            // The agent's sockets, looked up by inode in the namespace's
            // index rather than by scanning its whole table for each agent,
            // and kept in the dump's order.
            let index = self.index.entry(ns).or_insert_with(|| {
                dump.as_ref().map_or_else(
                    |_| HashMap::new(),
                    |all| all.iter().enumerate().map(|(i, s)| (s.inode, i)).collect(),
                )
            });
            let mine = dump
                .as_ref()
                .map(|all| {
                    let mut at: Vec<usize> = owned
                        .iter()
                        .filter_map(|ino| index.get(ino).copied())
                        .collect();
                    at.sort_unstable();
                    at.into_iter().map(|i| all[i].clone()).collect()
                })
                .map_err(Clone::clone);
            tcp.push((*via, mine));
        }
        tcp
    }
}

/// What one collection read of a target.
struct Read {
    processes: Vec<ProcessInfo>,
    gone: Vec<u32>,
    /// The budget ran out before everything was read.
    over: bool,
    /// Pids not reached for want of budget.
    unread: usize,
    unread_processes: usize,
    unread_zombies: BTreeMap<u32, usize>,
    /// Their sockets by network namespace, where read with them (else
    /// from the task iterators' passes and this collector's dumps).
    tcp: Option<Vec<NetnsSockets>>,
    /// The TCP connections the task iterators' pass of each process read,
    /// or why it read none.
    passes_tcp: BTreeMap<u32, TcpPass>,
    collection: Collection,
}

/// Reads `target`'s processes through `source` (the helper): which pids
/// to read is decided here, by the caps and each process's `stat` (which
/// anyone may read); the processes, their waits and their sockets are
/// read by the helper, within what is left of `budget`. Pids the helper
/// refused, or all of a request that failed, are read by procfs here,
/// with the reason (for another user's process, a gap).
fn read_through(
    source: &mut dyn HelperReads,
    root: &ProcRoot,
    target: &Target,
    detail: Detail,
    clocks: &TaskClocks,
    budget: Duration,
) -> Read {
    let deadline = std::time::Instant::now() + budget;
    let mut read = Read {
        processes: Vec::new(),
        gone: Vec::new(),
        over: false,
        unread: 0,
        unread_processes: 0,
        unread_zombies: BTreeMap::new(),
        tcp: None,
        passes_tcp: BTreeMap::new(),
        collection: Collection::default(),
    };
    let (mut wanted, mut zombies) = (Vec::new(), 0);
    for &pid in &target.pids {
        match state_and_ppid(root, pid) {
            None => read.gone.push(pid),
            Some(('Z', ppid)) if zombies >= MAX_ZOMBIES => {
                *read.unread_zombies.entry(ppid).or_insert(0) += 1;
            }
            Some(('Z', _)) => {
                zombies += 1;
                wanted.push(pid);
            }
            Some(_) if wanted.len() - zombies >= MAX_PROCESSES => read.unread_processes += 1,
            Some(_) => wanted.push(pid),
        }
    }
    let mut reader = crate::sys::memread::Reader::default();
    let mut here = |pid: u32, why: &str, read: &mut Read| {
        let mut access = proc::MemAccess {
            reader: &mut reader,
            deadline,
            over: false,
        };
        read.collection.procfs_for(why);
        match proc::process_in(root, pid, detail, clocks, &mut access) {
            Ok(p) => read.processes.push(p),
            Err(_) => read.gone.push(pid),
        }
        read.over |= access.over;
    };
    let mut tcp = ByNamespace::default();
    for (i, chunk) in wanted.chunks(MAX_COLLECT_PIDS).enumerate() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            let rest = wanted.len() - i * MAX_COLLECT_PIDS;
            read.over = true;
            read.unread += rest;
            break;
        }
        let req = CollectRequest {
            pids: chunk.to_vec(),
            detail,
            budget_ms: (left.as_millis() as u64).clamp(1, MAX_COLLECT_BUDGET_MS),
        };
        let answer = match source.collect(&req) {
            Ok(a) => a,
            Err(why) => {
                for &pid in chunk {
                    here(pid, &why, &mut read);
                }
                continue;
            }
        };
        read.gone.extend(&answer.gone);
        for &pid in &answer.refused {
            here(
                pid,
                "the helper did not read it (this user may not query it)",
                &mut read,
            );
        }
        let reached: BTreeSet<u32> = answer.processes.iter().map(|c| c.pid).collect();
        read.unread += answer
            .over_budget
            .iter()
            .filter(|p| !reached.contains(p))
            .count();
        read.over |= !answer.over_budget.is_empty();
        for c in answer.processes {
            if c.read_by == selfheal_core::protocol::READ_BY_ITERATORS {
                read.collection.iterators += 1;
                read.collection.iterators_from = Some("helper".into());
            } else {
                read.collection
                    .procfs_for(&format!("the helper read procfs: {}", c.read_by));
            }
            if !c.process.sockets.is_empty() {
                let found = match (c.tcp, c.tcp_error) {
                    (Some(tcp), _) => Ok(tcp),
                    (None, why) => Err(why.unwrap_or_else(|| "no sockets".into())),
                };
                tcp.add(c.net_ns, c.pid, found);
            }
            read.processes.push(c.process);
        }
    }
    read.tcp = Some(tcp.sockets.into_iter().map(|(_, t, _)| t).collect());
    read
}

/// Sockets by network namespace, in the order the namespaces are met
/// (one unreadable namespace, `None`, apiece); in each, every process's
/// in its dump's order, a socket two processes share once.
#[derive(Default)]
struct ByNamespace {
    sockets: Vec<(Option<u64>, NetnsSockets, HashSet<u64>)>,
}

impl ByNamespace {
    /// Adds process `pid`'s sockets in namespace `ns`, or why they could
    /// not be read (kept only while nothing of that namespace was read).
    fn add(&mut self, ns: Option<u64>, pid: u32, found: Result<Vec<TcpSocket>, String>) {
        let slot = self
            .sockets
            .iter_mut()
            .find(|(n, _, _)| ns.is_some() && *n == ns);
        match (slot, found) {
            (Some((_, (_, Ok(all)), seen)), Ok(mine)) => {
                all.extend(mine.into_iter().filter(|s| seen.insert(s.inode)));
            }
            (Some((_, got @ (_, Err(_)), seen)), Ok(mine)) => {
                seen.extend(mine.iter().map(|s| s.inode));
                *got = (pid, Ok(mine));
            }
            (Some(_), Err(_)) => {}
            (None, found) => {
                let seen = found.iter().flatten().map(|s| s.inode).collect();
                self.sockets.push((ns, (pid, found), seen));
            }
        }
    }
}

/// Why the task iterators are not tried: `off` if given, else when this
/// process is not root (they need CAP_BPF and CAP_PERFMON) or eBPF is not
/// built in; `None` when they are to be tried.
fn iterators_off(off: Option<String>) -> Option<String> {
    off.or_else(|| {
        if !ebpf::BUILT_IN {
            Some("eBPF is not built into this binary".into())
        } else if crate::sys::creds::euid() != 0 {
            Some("not root: the kernel's task iterators need CAP_BPF and CAP_PERFMON".into())
        } else {
            None
        }
    })
}

/// The helper's passes, by pid.
#[derive(Default)]
struct HelperPasses {
    passes: BTreeMap<u32, (u64, IterProcess)>,
    gone: BTreeSet<u32>,
}

impl HelperPasses {
    fn add(&mut self, r: IterateResult) {
        self.passes.extend(
            r.processes
                .into_iter()
                .map(|p| (p.pid, (p.start_ticks, p.pass))),
        );
        self.gone.extend(r.gone);
    }

    fn of(&self, pid: u32) -> HelperPass<'_> {
        match self.passes.get(&pid) {
            Some((start, pass)) => HelperPass::Read(start, pass),
            None if self.gone.contains(&pid) => HelperPass::Gone,
            None => HelperPass::Refused,
        }
    }
}

/// What the helper's passes hold of one pid.
enum HelperPass<'a> {
    Read(&'a u64, &'a IterProcess),
    Gone,
    /// Refused, or not in the answer.
    Refused,
}

/// Why one process was not walked by the iterators.
enum Walk {
    /// It is gone.
    Gone,
    /// They could not run: why (procfs reads it instead).
    Failed(String),
}

/// The task iterators of this process: opened from the helper's pins, or
/// loaded where asked, on first use, and kept, so a `watch` pays for them
/// once; or why they cannot run (kept once loading failed: a kernel that
/// refused them once refuses them again).
static ITERATORS: std::sync::Mutex<Option<Iterators>> = std::sync::Mutex::new(None);

/// What this process has of the task iterators.
enum Iterators {
    /// Open, and where they came from (`pinned` or `loaded`).
    Open(ebpf::iter::TaskIter, &'static str),
    /// None pinned, and not loaded (not asked to): why.
    NotPinned(String),
    /// Loading them failed: why.
    Failed(String),
}

/// One walk of the task iterators over `pid`, and where they came from;
/// `load` loads them where none are pinned.
fn iterate(pid: u32, load: bool) -> Result<(IterProcess, &'static str), Walk> {
    use std::os::fd::AsFd as _;
    let pidfd = crate::sys::pidfd::pidfd_open(pid).map_err(|_| Walk::Gone)?;
    let mut slot = open_iterators(load);
    let (it, from) = match slot.as_mut() {
        Some(Iterators::Open(it, from)) => (it, *from),
        Some(Iterators::NotPinned(why) | Iterators::Failed(why)) => {
            return Err(Walk::Failed(why.clone()));
        }
        None => return Err(Walk::Failed("the task iterators are not open".into())),
    };
    match it.process(pidfd.as_fd()) {
        Ok(pass) => Ok((pass, from)),
        Err(ebpf::iter::IterError::Gone) => Err(Walk::Gone),
        Err(e) => Err(Walk::Failed(format!(
            "the kernel's task iterators: {}",
            ebpf::chain(&e)
        ))),
    }
}

/// This process's task iterators, opened from the helper's pins on first
/// use or, with `load`, loaded where none are pinned; or why not. A miss
/// of the pins is kept (each process is not asked again), until a caller
/// asks to load.
fn open_iterators(load: bool) -> std::sync::MutexGuard<'static, Option<Iterators>> {
    let mut slot = ITERATORS.lock().unwrap_or_else(|e| e.into_inner());
    let retry = matches!(*slot, Some(Iterators::NotPinned(_))) && load;
    if slot.is_none() || retry {
        *slot = Some(match ebpf::iter::open_published() {
            Ok((it, _)) => Iterators::Open(it, "pinned"),
            Err(pinned) if !load => Iterators::NotPinned(format!(
                "{} (the helper pins them), and one check does not load them (`watch` does)",
                ebpf::chain(&pinned)
            )),
            Err(pinned) => match ebpf::iter::load() {
                Ok(it) => Iterators::Open(it, "loaded"),
                Err(e) => Iterators::Failed(format!(
                    "the kernel's task iterators: {} (and {})",
                    ebpf::chain(&e),
                    ebpf::chain(&pinned)
                )),
            },
        });
    }
    slot
}

/// A process's state and parent from `/proc/PID/stat` (one small read),
/// or `None` when it is gone.
fn state_and_ppid(root: &ProcRoot, pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read(root.of_pid(pid, "stat")).ok()?;
    // `PID (COMM) STATE PPID …`; COMM may hold anything, so split at the last `)`.
    let close = stat.iter().rposition(|b| *b == b')')?;
    let mut rest = std::str::from_utf8(stat.get(close + 1..)?)
        .ok()?
        .split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid))
}

fn attach(pids: &[u32], opts: &CollectOptions) -> (Option<Tracer>, EbpfEvidence) {
    let mut ev = EbpfEvidence {
        built_in: ebpf::BUILT_IN,
        attempts: Vec::new(),
        error: None,
        watched_since_ns: None,
        snapshot: None,
    };
    if opts.no_ebpf {
        ev.error = Some(
            opts.no_ebpf_why
                .clone()
                .unwrap_or_else(|| "disabled by --no-ebpf".into()),
        );
        return (None, ev);
    }
    let strategies = if opts.strategies.is_empty() {
        Strategy::ALL.to_vec()
    } else {
        opts.strategies.clone()
    };
    match Tracer::attach(&TracerOptions {
        strategies,
        ..TracerOptions::default()
    }) {
        Ok(mut t) => {
            let owners = crate::helper::access::owner::Owners::new(
                crate::helper::access::owner::DEFAULT_SUBUID.into(),
            );
            for &pid in pids {
                if let Err(e) = t.watch(pid, owners.of_process(pid).owner) {
                    ev.error = Some(ebpf::chain(&e));
                    return (None, ev);
                }
            }
            (Some(t), ev)
        }
        Err(e) => {
            if let ebpf::TracerError::NoStrategy { attempts } = &e {
                ev.attempts = attempts.clone();
            }
            ev.error = Some(ebpf::chain(&e));
            (None, ev)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// This process as an `[auto]` agent whose upstream is `provider`.
    fn outbound(provider: SocketAddr) -> Target {
        let pid = std::process::id();
        Target {
            agent: Some("auto.me".into()),
            rule: format!("pid={pid}"),
            roots: vec![pid],
            pids: vec![pid],
            problem: None,
            upstream_of: Box::new(move |a| (a == provider).then_some((SocketRole::Provider, 0))),
            upstreams: vec![provider.to_string()],
            roles: Roles::Outbound,
            containers: Vec::new(),
            container_gaps: Vec::new(),
            unread_cmdlines: None,
        }
    }

    fn collector() -> Collector {
        let opts = CollectOptions {
            no_ebpf: true,
            no_iterators: Some("a unit test".into()),
            ..CollectOptions::default()
        };
        Collector::new(&opts, &[std::process::id()])
    }

    fn inode(fd: &impl std::os::fd::AsRawFd) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .ino()
    }

    /// A connection this process made to its own listener, and the one it
    /// accepted: the made one is the provider's, the accepted one has no
    /// role; where the listeners cannot be read, neither has one and the
    /// evidence names the pid, the namespace and the error.
    #[test]
    fn unread_listeners_leave_no_role_and_are_said() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let made = TcpStream::connect(at).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (made, accepted) = (inode(&made), inode(&accepted));
        let target = outbound(at);

        let ev = collector().collect(&target);
        assert!(ev.unread_listening.is_empty());
        assert_eq!(
            ev.roles.get(&made),
            Some(&(SocketRole::Provider, 0)),
            "{:?}",
            ev.roles
        );
        assert!(!ev.roles.contains_key(&accepted));

        let mut c = collector();
        c.read_listening = |pid| {
            Err(sockdiag::SockDiagError::Netns {
                pid,
                reason: "EPERM: Operation not permitted".into(),
            })
        };
        let ev = c.collect(&target);
        assert!(ev.roles.is_empty(), "{:?}", ev.roles);
        let pid = std::process::id();
        use std::os::unix::fs::MetadataExt as _;
        let netns = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        assert_eq!(
            ev.unread_listening,
            [UnreadListening {
                pid,
                netns: Some(netns),
                error: format!(
                    "cannot enter the network namespace of pid {pid}: EPERM: Operation not \
                     permitted"
                ),
            }]
        );
        let report = selfheal_core::inspect::build(&ev);
        assert_eq!(
            selfheal_core::judge::unjudgeable(&report).as_deref(),
            Some(
                format!(
                    "listening sockets of pid {pid}'s network namespace (net:[{netns}]) \
                     unreadable: cannot enter the network namespace of pid {pid}: EPERM: \
                     Operation not permitted; its connections cannot be told accepted from \
                     made, none was judged"
                )
                .as_str()
            )
        );
    }
}
