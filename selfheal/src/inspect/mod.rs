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

#[cfg(test)]
mod fake;
/// The collector's reads of the kernel beyond procfs, and the real ones.
mod kernel;
/// Reads made elsewhere (by the helper), for a collector that may not
/// make them itself: passes of the task iterators, for a check that may
/// not link them; whole processes and their namespaces, for one that may
/// not read other users' processes.
mod readers;
mod sockets;
mod tracer;

use kernel::{CollectKernel, Live, Walked};
use readers::{Walk, read_through, state_and_ppid};
use tracer::attach;

pub trait HelperReads {
    /// One pass over each of `pids` that may be read, or why there is none.
    fn iterate(&mut self, pids: &[u32]) -> Result<IterateResult, HelperReadError>;

    /// Each of `req.pids` that may be read, read as a check reads it.
    fn collect(&mut self, req: &CollectRequest) -> Result<CollectResult, HelperReadError>;

    /// The namespaces of each of `pids` that may be read.
    fn namespaces(&mut self, pids: &[u32]) -> Result<NamespacesResult, HelperReadError>;
}

/// Why a read made through the helper ([`HelperReads`]) got no answer:
/// which read, and the client's error.
#[derive(Debug, thiserror::Error)]
pub enum HelperReadError {
    /// The shared connection's lock was poisoned (a thread panicked
    /// holding it).
    #[error("helper client poisoned")]
    Poisoned,
    /// The passes of the task iterators ([`HelperReads::iterate`]).
    #[error("the helper's task iterators: {0}")]
    Iterate(#[source] crate::helper::ClientError),
    /// Whole processes ([`HelperReads::collect`]).
    #[error("the helper's collection: {0}")]
    Collect(#[source] crate::helper::ClientError),
    /// The processes' namespaces ([`HelperReads::namespaces`]).
    #[error("the helper's namespace reads: {0}")]
    Namespaces(#[source] crate::helper::ClientError),
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
    listening:
        BTreeMap<(u64, u64), Result<Vec<SocketAddr>, std::sync::Arc<sockdiag::SockDiagError>>>,
    /// The task iterators' walks, the namespaces' dumps and listening
    /// addresses: the kernel's ([`Live`]), or a test's script.
    kernel: Box<dyn CollectKernel>,
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
    passes: Option<Result<HelperPasses, HelperReadError>>,
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
        Collector::with(
            ebpf,
            opts.detail,
            opts.no_iterators.clone(),
            opts.load_iterators,
        )
    }

    /// A collector of `ebpf`'s evidence, at `detail`, its task iterators
    /// turned off for `no_iterators` if given, loaded where none are
    /// pinned with `load_iterators`.
    fn with(
        ebpf: EbpfEvidence,
        detail: Detail,
        no_iterators: Option<String>,
        load_iterators: bool,
    ) -> Collector {
        Collector {
            ebpf,
            dumps: BTreeMap::new(),
            listening: BTreeMap::new(),
            kernel: Box::new(Live),
            index: BTreeMap::new(),
            detail,
            clocks: None,
            budget: selfheal_core::config::DEFAULT_COLLECT_BUDGET,
            reader: crate::sys::memread::Reader::default(),
            proc: ProcRoot::default(),
            iterators_asked_off: no_iterators.is_some(),
            iterators_off: iterators_off(no_iterators),
            passes: None,
            reads: None,
            load_iterators,
        }
    }

    /// A collector whose eBPF evidence comes from elsewhere (the helper's
    /// long-running tracer): its snapshot, since when the pids are watched,
    /// or why there is none.
    pub fn from_snapshot(
        // The error is the report's gap text ([`EbpfEvidence::error`]).
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
        Collector::with(ebpf, detail, None, false)
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
            self.kernel.ready_iterators(self.load_iterators);
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
                            &pass.threads,
                            &pass.sockets,
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
                        collection.procfs_for(&why.to_string());
                        proc::process_in(&self.proc, pid, detail, clocks, &mut access)
                    }
                }
            } else if let Some(why) = &self.iterators_off {
                collection.procfs_for(why);
                proc::process_in(&self.proc, pid, detail, clocks, &mut access)
            } else {
                match self.kernel.walk(pid, self.load_iterators) {
                    Ok(Walked { pass, from, exited }) => {
                        // The walk was of the process its pidfd pinned.
                        // Exited by the time its `stat` was read, its pid
                        // may name another process: gone, unless the
                        // `stat` is a zombie's (a zombie keeps its pid
                        // until reaped; another process that took the pid,
                        // lived and died since would need pid allocation
                        // to go round the whole pid space in between).
                        match proc::process_iterated(
                            &self.proc,
                            pid,
                            &pass.threads,
                            &pass.sockets,
                            detail,
                            clocks,
                            &mut access,
                        ) {
                            Ok(p) if p.state != 'Z' && exited() => {
                                gone.push(pid);
                                continue;
                            }
                            read => {
                                collection.iterators += 1;
                                collection.iterators_from = Some(from.to_string());
                                passes_tcp.insert(pid, pass.tcp);
                                read
                            }
                        }
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

/// Why the task iterators are not tried: `off` if given, else when this
/// process is not root (they need CAP_BPF and CAP_PERFMON), eBPF is not
/// built in, or this process runs in a pid namespace of its own (where a
/// pid procfs names is not the pid `pidfd_open` takes, nor the kernel's
/// the programs read); `None` when they are to be tried.
fn iterators_off(off: Option<String>) -> Option<String> {
    off.or_else(|| {
        if !ebpf::BUILT_IN {
            Some("eBPF is not built into this binary".into())
        } else if crate::sys::creds::euid() != 0 {
            Some("not root: the kernel's task iterators need CAP_BPF and CAP_PERFMON".into())
        } else if !ebpf::iter::in_initial_pid_namespace() {
            Some(
                "this check runs in a pid namespace of its own, where the task iterators' pids \
                 are not procfs's"
                    .into(),
            )
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
