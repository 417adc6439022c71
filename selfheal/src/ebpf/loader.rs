//! The aya side of the tracer: load, attach, pid filter, map reads.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData},
    programs::{BtfTracePoint, FEntry, FExit, KProbe, Program, TracePoint},
};
use selfheal_common::{InRecv, MAX_OWNED, OwnerShare, SockActivity, WATCHED_WORDS, counter};

use super::{
    Attempt, FdKind, Overflow, PRUNE_SOCKS_AT, SocketActivity, Strategy, TracerError,
    TracerOptions, TracerSnapshot, chain,
    layout::{self, KernelLayout},
    snapshot::{ShareUse, blocked_recv, closed_sockets, over_share, socket_activity, socks_share},
    strategy::{Hook, ProgramSpec},
    tracefs,
};
use crate::sys::clock::boot_ns;

pub(super) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/selfheal"));

/// The attached tracer. Dropping it detaches every program and frees the maps.
pub struct Tracer {
    ebpf: Ebpf,
    strategy: Strategy,
    attempts: Vec<Attempt>,
    attached_at_ns: u64,
    /// tgid → when it was added to the pid filter (`CLOCK_BOOTTIME` ns).
    watched: BTreeMap<u32, u64>,
    /// tgid → its owner, as given to [`Self::watch`]: the owners that share
    /// `SOCKS` ([`socks_share`]), mirrored in the kernel's `OWNER_OF`.
    owners: BTreeMap<u32, u32>,
    /// owner → entries evicted from `SOCKS` because it was above its share.
    evicted: BTreeMap<u32, u64>,
}

impl Tracer {
    /// Loads the object and attaches the first strategy of `opts` that the
    /// kernel accepts.
    pub fn attach(opts: &TracerOptions) -> Result<Self, TracerError> {
        // The kernel's BTF is read once: for the struct layout, for aya's
        // relocations, and for loading fentry/fexit/tp_btf programs.
        let no_btf = |reason: String| layout::LayoutError::NoBtf {
            path: opts.btf_path.display().to_string(),
            reason,
        };
        let bytes = std::fs::read(&opts.btf_path).map_err(|e| no_btf(e.to_string()))?;
        let layout = KernelLayout::from_btf_file(&opts.btf_path)?;
        let btf = Btf::parse(&bytes, aya::Endianness::default()).map_err(|source| BtfParseError {
            path: opts.btf_path.clone(),
            source,
        });
        let mut loader = EbpfLoader::new();
        loader.btf(btf.as_ref().ok());
        let nonblock_arg = layout.recvmsg_nonblock_arg.unwrap_or(u64::MAX);
        let sk_protocol = layout.sk_protocol.unwrap_or(0);
        loader
            .override_global("OFF_SK_SOCKET", &layout.sk_socket, true)
            .override_global("OFF_SOCKET_INO", &layout.socket_ino, true)
            .override_global("OFF_SK_PROTOCOL", &sk_protocol, true)
            .override_global("RECVMSG_FLAGS_ARG", &layout.recvmsg_flags_arg, true)
            .override_global("RECVMSG_NONBLOCK_ARG", &nonblock_arg, true)
            .override_global("OFF_REGS_SYSCALL", &layout.regs_syscall, true)
            .override_global("OFF_REGS_ARG0", &layout.regs_arg0, true);
        let mut ebpf = loader
            .load(OBJECT)
            .map_err(|e| TracerError::Load(chain(&e)))?;

        let mut attempts = Vec::new();
        for &strategy in &opts.strategies {
            let result = precheck(strategy, &layout)
                .map_err(StrategyError::Precheck)
                .and_then(|()| attach_all(&mut ebpf, strategy, btf.as_ref()));
            match result {
                Ok(()) => {
                    attempts.push(Attempt {
                        strategy,
                        error: None,
                    });
                    return Ok(Self {
                        ebpf,
                        strategy,
                        attempts,
                        attached_at_ns: boot_ns(),
                        watched: BTreeMap::new(),
                        owners: BTreeMap::new(),
                        evicted: BTreeMap::new(),
                    });
                }
                Err(error) => attempts.push(Attempt {
                    strategy,
                    error: Some(error.to_string()),
                }),
            }
        }
        Err(TracerError::NoStrategy { attempts })
    }

    /// The strategy that attached.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Every strategy tried, with why the ones before the winner failed.
    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }

    /// When the programs were attached (`CLOCK_BOOTTIME` ns).
    pub fn attached_at_ns(&self) -> u64 {
        self.attached_at_ns
    }

    /// Since when `tgid`'s receives are seen: receives it began earlier are
    /// invisible to the entry hooks.
    pub fn watched_since(&self, tgid: u32) -> Option<u64> {
        self.watched.get(&tgid).copied()
    }

    /// Adds `tgid` to the pid filter, counting its socket entries against
    /// `owner` ([`crate::helper::access::owner::Owners::of_process`]: the uid that
    /// owns the process's uid), one of those that share the socket map.
    /// Refused when [`MAX_OWNED`] processes are watched already.
    pub fn watch(&mut self, tgid: u32, owner: u32) -> Result<(), TracerError> {
        if !self.owners.contains_key(&tgid) && self.owners.len() >= MAX_OWNED as usize {
            return Err(TracerError::Map {
                map: "OWNER_OF",
                reason: format!("{MAX_OWNED} processes are watched already"),
            });
        }
        // The owner first: the pid filter lets the process's events in,
        // and each new entry then counts against the right share.
        {
            let mut of: HashMap<&mut MapData, u32, u32> = map_mut(&mut self.ebpf, "OWNER_OF")?;
            of.insert(tgid, owner, 0)
                .map_err(|e| map_err("OWNER_OF", &e))?;
        }
        self.owners.insert(tgid, owner);
        if let Err(e) = self.set_watched(tgid, true) {
            self.forget_owner(tgid);
            return Err(e);
        }
        self.watched.entry(tgid).or_insert_with(boot_ns);
        self.set_share()
    }

    /// Removes `tgid`'s owner, here and in the kernel's `OWNER_OF`.
    fn forget_owner(&mut self, tgid: u32) {
        self.owners.remove(&tgid);
        if let Ok(mut of) = map_mut::<u32, u32>(&mut self.ebpf, "OWNER_OF") {
            let _ = of.remove(&tgid);
        }
    }

    /// The share of `SOCKS` each watched owner may hold now.
    fn share(&self) -> u64 {
        let owners: BTreeSet<u32> = self.owners.values().copied().collect();
        socks_share(owners.len())
    }

    /// Tells the kernel side [`Self::share`]: 0 (no limit) when it is the
    /// whole map, so that a full map is counted as full (`SOCKS_FULL`).
    fn set_share(&mut self) -> Result<(), TracerError> {
        let share = self.share();
        let share = if share >= u64::from(selfheal_common::MAX_SOCKS) {
            0
        } else {
            share
        };
        let mut map: Array<&mut MapData, u64> = array_mut(&mut self.ebpf, "SOCKS_SHARE")?;
        map.set(0, share, 0).map_err(|e| map_err("SOCKS_SHARE", &e))
    }

    /// Sets or clears `tgid`'s bit in the `WATCHED` bitmap.
    fn set_watched(&mut self, tgid: u32, on: bool) -> Result<(), TracerError> {
        if tgid >= WATCHED_WORDS * 64 {
            return Err(TracerError::Map {
                map: "WATCHED",
                reason: format!("pid {tgid} is above the largest pid_max"),
            });
        }
        let mut bits: Array<&mut MapData, u64> = array_mut(&mut self.ebpf, "WATCHED")?;
        let (index, bit) = (tgid / 64, 1u64 << (tgid % 64));
        let word = bits.get(&index, 0).map_err(|e| map_err("WATCHED", &e))?;
        let word = if on { word | bit } else { word & !bit };
        bits.set(index, word, 0).map_err(|e| map_err("WATCHED", &e))
    }

    /// Removes `tgid` from the pid filter and forgets what it left in the maps.
    pub fn unwatch(&mut self, tgid: u32) -> Result<(), TracerError> {
        self.set_watched(tgid, false)?;
        self.watched.remove(&tgid);
        self.forget_owner(tgid);
        self.set_share()?;
        let mut recv: HashMap<&mut MapData, u32, InRecv> = map_mut(&mut self.ebpf, "IN_RECV")?;
        remove_where(&mut recv, |r| r.tgid == tgid);
        let mut socks: HashMap<&mut MapData, u64, SockActivity> = map_mut(&mut self.ebpf, "SOCKS")?;
        remove_where(&mut socks, |a| a.tgid == tgid);
        Ok(())
    }

    /// Reads the maps. Entries of threads that no longer exist are dropped
    /// from the map (a thread killed inside a receive leaves one behind only
    /// if its exit hook never ran); so are entries of closed sockets, once
    /// the socket map is half full ([`PRUNE_SOCKS_AT`]), and the oldest
    /// entries of an owner above its share of the map ([`socks_share`]).
    pub fn snapshot(&mut self) -> Result<TracerSnapshot, TracerError> {
        let now = boot_ns();
        let mut resolve = resolve_fd;
        let mut blocked = Vec::new();
        let mut gone = Vec::new();
        {
            let recv: HashMap<&MapData, u32, InRecv> = map_ref(&self.ebpf, "IN_RECV")?;
            for (tid, rec) in recv.iter().flatten() {
                if !crate::sys::procfs::ProcRoot::default()
                    .of_pid(rec.tgid, &format!("task/{tid}"))
                    .exists()
                {
                    gone.push(tid);
                } else if let Some(b) = blocked_recv(now, tid, &rec, &mut resolve) {
                    blocked.push(b);
                }
            }
        }
        if !gone.is_empty() {
            let mut recv: HashMap<&mut MapData, u32, InRecv> = map_mut(&mut self.ebpf, "IN_RECV")?;
            for tid in gone {
                let _ = recv.remove(&tid);
            }
        }
        blocked.sort_by_key(|b| (b.tgid, b.tid));
        let (mut sockets, shares) = self.socket_entries(now)?;
        sockets.sort_by_key(|s| (s.tgid, s.inode));
        let counters: Array<&MapData, u64> = self
            .ebpf
            .map("COUNTERS")
            .ok_or_else(|| missing("COUNTERS"))
            .and_then(|m| Array::try_from(m).map_err(|e| map_err("COUNTERS", &e)))?;
        let c = |i| counters.get(&i, 0).unwrap_or(0);
        Ok(TracerSnapshot {
            strategy: self.strategy,
            taken_at_ns: now,
            blocked,
            sockets,
            overflow: Overflow {
                in_recv_full: c(counter::IN_RECV_FULL),
                socks_full: c(counter::SOCKS_FULL),
                read_failed: c(counter::READ_FAILED),
                in_send_full: c(counter::IN_SEND_FULL),
                over_share: shares.values().map(|u| u.lost).sum(),
            },
            shares,
            refused: Vec::new(),
        })
    }
}

impl Tracer {
    /// Reads `SOCKS`, keeping it within bounds on the way: entries of closed
    /// sockets go once the map is half full ([`PRUNE_SOCKS_AT`]) or an owner
    /// is above its share; then the least recently active entries of an
    /// owner still above its share ([`over_share`]: the share shrinks when
    /// another owner is watched). Recounts each owner's entries for the
    /// kernel side.
    fn socket_entries(
        &mut self,
        now: u64,
    ) -> Result<(Vec<SocketActivity>, BTreeMap<u32, ShareUse>), TracerError> {
        let share = self.share();
        let mut entries: Vec<(u64, SockActivity)> = {
            let socks: HashMap<&MapData, u64, SockActivity> = map_ref(&self.ebpf, "SOCKS")?;
            socks.iter().flatten().collect()
        };
        let count = |entries: &[(u64, SockActivity)]| {
            let mut by_owner: BTreeMap<u32, u64> = BTreeMap::new();
            for (_, a) in entries {
                *by_owner.entry(a.owner).or_default() += 1;
            }
            by_owner
        };
        let above = |by_owner: &BTreeMap<u32, u64>| by_owner.values().any(|&n| n > share);
        let mut gone: BTreeSet<u64> = BTreeSet::new();
        if entries.len() >= PRUNE_SOCKS_AT || above(&count(&entries)) {
            let keys: Vec<(u64, u32)> = entries.iter().map(|(i, a)| (*i, a.tgid)).collect();
            gone.extend(closed_sockets(&keys, &mut open_sockets));
        }
        entries.retain(|(i, _)| !gone.contains(i));
        if above(&count(&entries)) {
            let keyed: Vec<(u64, u32, u64)> = entries
                .iter()
                .map(|(i, a)| (*i, a.owner, a.last_recv_ns.max(a.last_send_ns)))
                .collect();
            let evict: BTreeSet<u64> = over_share(&keyed, share).into_iter().collect();
            for (i, a) in &entries {
                if evict.contains(i) {
                    *self.evicted.entry(a.owner).or_default() += 1;
                }
            }
            entries.retain(|(i, _)| !evict.contains(i));
            gone.extend(evict);
        }
        if !gone.is_empty() {
            let mut socks: HashMap<&mut MapData, u64, SockActivity> =
                map_mut(&mut self.ebpf, "SOCKS")?;
            for inode in &gone {
                let _ = socks.remove(inode);
            }
        }
        // The kernel's counts are plain adds (an increment can be lost
        // between CPUs) and know nothing of removals: recount them.
        let held = count(&entries);
        let mut shares: BTreeMap<u32, ShareUse> = BTreeMap::new();
        {
            let mut owners: HashMap<&mut MapData, u32, OwnerShare> =
                map_mut(&mut self.ebpf, "OWNER_SOCKS")?;
            let known: Vec<(u32, OwnerShare)> = owners.iter().flatten().collect();
            for (owner, mut u) in known {
                u.socks = held.get(&owner).copied().unwrap_or(0);
                let _ = owners.insert(owner, u, 0);
                let s = shares.entry(owner).or_default();
                s.socks = u.socks;
                s.lost = u.over_share;
            }
        }
        for (owner, n) in &self.evicted {
            shares.entry(*owner).or_default().lost += n;
        }
        for (tgid, owner) in &self.owners {
            shares.entry(*owner).or_default().tgids.insert(*tgid);
        }
        let sockets = entries
            .iter()
            .map(|(inode, a)| socket_activity(now, *inode, a))
            .collect();
        Ok((sockets, shares))
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // Detach explicitly (aya would on drop too) so the order is plain:
        // programs first, then the maps they used.
        for spec in self.strategy.programs() {
            if let Some(prog) = self.ebpf.program_mut(spec.program) {
                let _ = unload(prog);
            }
        }
    }
}

fn map_err(map: &'static str, e: &dyn std::error::Error) -> TracerError {
    TracerError::Map {
        map,
        reason: chain(e),
    }
}

/// The map `name` is not in the object.
fn missing(name: &'static str) -> TracerError {
    TracerError::Map {
        map: name,
        reason: "missing from the object".into(),
    }
}

fn map_ref<'a, K: aya::Pod, V: aya::Pod>(
    ebpf: &'a Ebpf,
    name: &'static str,
) -> Result<HashMap<&'a MapData, K, V>, TracerError> {
    let map = ebpf.map(name).ok_or_else(|| missing(name))?;
    HashMap::try_from(map).map_err(|e| map_err(name, &e))
}

fn map_mut<'a, K: aya::Pod, V: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<HashMap<&'a mut MapData, K, V>, TracerError> {
    let map = ebpf.map_mut(name).ok_or_else(|| missing(name))?;
    HashMap::try_from(map).map_err(|e| map_err(name, &e))
}

fn array_mut<'a, V: aya::Pod>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<Array<&'a mut MapData, V>, TracerError> {
    let map = ebpf.map_mut(name).ok_or_else(|| missing(name))?;
    Array::try_from(map).map_err(|e| map_err(name, &e))
}

/// Removes the entries of `map` whose value `stale` picks.
fn remove_where<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<&mut MapData, K, V>,
    stale: impl Fn(&V) -> bool,
) {
    let keys: Vec<K> = map
        .iter()
        .flatten()
        .filter(|(_, v)| stale(v))
        .map(|(k, _)| k)
        .collect();
    for k in keys {
        let _ = map.remove(&k);
    }
}

/// The socket inodes `tgid` holds open now (`/proc/PID/fd`), or `None` when
/// it is gone.
fn open_sockets(tgid: u32) -> Option<BTreeSet<u64>> {
    let fds = std::fs::read_dir(crate::sys::procfs::ProcRoot::default().of_pid(tgid, "fd")).ok()?;
    Some(
        fds.flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|t| crate::proc::socket_inode_of_target(&t.to_string_lossy()))
            .collect(),
    )
}

/// What `fd` of `tgid` is: a socket (with inode and `O_NONBLOCK`), something
/// else, or gone. Reads `/proc/PID/fd/N` and `/proc/PID/fdinfo/N`.
fn resolve_fd(tgid: u32, fd: i32) -> FdKind {
    let Ok(target) = std::fs::read_link(
        crate::sys::procfs::ProcRoot::default().of_pid(tgid, &format!("fd/{fd}")),
    ) else {
        return FdKind::Gone;
    };
    let Some(inode) = crate::proc::socket_inode_of_target(&target.to_string_lossy()) else {
        return FdKind::NotSocket;
    };
    let nonblocking = std::fs::read_to_string(
        crate::sys::procfs::ProcRoot::default().of_pid(tgid, &format!("fdinfo/{fd}")),
    )
    .ok()
    .and_then(|info| fdinfo_flags(&info))
    .is_some_and(|flags| flags & libc::O_NONBLOCK as u32 != 0);
    FdKind::Socket { inode, nonblocking }
}

/// The octal `flags:` line of `/proc/PID/fdinfo/N`.
pub(crate) fn fdinfo_flags(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
}

/// Why a strategy cannot run on this kernel, found before touching it.
#[derive(Debug, thiserror::Error)]
enum PrecheckError {
    /// `tp_btf` reads `sk_protocol` as a whole `u16`.
    #[error("sock.sk_protocol is a bitfield on this kernel (before 5.6)")]
    SkProtocolBitfield,
    /// The classic tracepoints' formats are read from tracefs.
    #[error("tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")]
    NoTracefs,
    /// An event's format could not be read.
    #[error(transparent)]
    Format(#[from] tracefs::FormatError),
    /// A record field is not where the program reads it.
    #[error("{category}:{event} field {field} is at offset {got}, the program reads {want}")]
    Offset {
        category: &'static str,
        event: &'static str,
        field: &'static str,
        got: u64,
        want: u64,
    },
}

/// Checks what a strategy needs before touching the kernel.
fn precheck(strategy: Strategy, layout: &KernelLayout) -> Result<(), PrecheckError> {
    match strategy {
        Strategy::TpBtf if layout.sk_protocol.is_none() => Err(PrecheckError::SkProtocolBitfield),
        Strategy::TpBtf => Ok(()),
        Strategy::Tracepoint => check_tracepoint_layout(),
        Strategy::Kprobe | Strategy::Fentry => Ok(()),
    }
}

/// The classic tracepoints' record offsets the programs read must match this
/// kernel's format files.
fn check_tracepoint_layout() -> Result<(), PrecheckError> {
    let root = tracefs::root().ok_or(PrecheckError::NoTracefs)?;
    let mut expected: Vec<(&'static str, &'static str, &'static str, u64)> = vec![
        ("syscalls", "sys_enter_recvfrom", "fd", 16),
        ("syscalls", "sys_enter_recvfrom", "flags", 40),
        ("syscalls", "sys_enter_recvmsg", "fd", 16),
        ("syscalls", "sys_enter_recvmsg", "flags", 32),
        ("syscalls", "sys_enter_read", "fd", 16),
        ("syscalls", "sys_enter_readv", "fd", 16),
    ];
    for event in ["sock_recv_length", "sock_send_length"] {
        expected.extend([
            ("sock", event, "sk", 8),
            ("sock", event, "protocol", 18),
            ("sock", event, "ret", 20),
        ]);
    }
    for (category, event, field, want) in expected {
        let got = tracefs::field_offset(&root, category, event, field)?;
        if got != want {
            return Err(PrecheckError::Offset {
                category,
                event,
                field,
                got,
                want,
            });
        }
    }
    Ok(())
}

/// Why the kernel's BTF could not be parsed for aya (the fentry, fexit
/// and tp_btf programs load against it).
#[derive(Debug, thiserror::Error)]
#[error("cannot parse kernel BTF {}: {}", path.display(), chain(source))]
struct BtfParseError {
    path: std::path::PathBuf,
    source: aya::BtfError,
}

/// Why one program did not load or attach.
#[derive(Debug, thiserror::Error)]
enum AttachError<'b> {
    /// The object has no program of that name.
    #[error("program {0} missing from the object")]
    Missing(&'static str),
    /// It loads against the kernel's BTF, which could not be parsed.
    #[error(transparent)]
    Btf(&'b BtfParseError),
    /// The kernel refused it (its error chain, a verifier log in it).
    #[error("{}", chain(.0))]
    Program(#[source] aya::programs::ProgramError),
}

/// Why a strategy did not attach: the attempt's reason, as the report
/// shows it.
#[derive(Debug, thiserror::Error)]
enum StrategyError {
    /// Found before touching the kernel.
    #[error(transparent)]
    Precheck(PrecheckError),
    /// The kernel refused a program: which hook, its error condensed
    /// (the verifier log's last lines), and a hint where one helps.
    #[error("{hook}: {reason}{hint}")]
    Attach {
        hook: String,
        reason: String,
        hint: &'static str,
    },
}

/// Loads and attaches every program of `strategy`; on the first failure,
/// unloads what it loaded and returns the reason.
fn attach_all(
    ebpf: &mut Ebpf,
    strategy: Strategy,
    btf: Result<&Btf, &BtfParseError>,
) -> Result<(), StrategyError> {
    let specs = strategy.programs();
    for (i, spec) in specs.iter().enumerate() {
        if let Err(e) = attach_one(ebpf, spec, btf) {
            let e = e.to_string();
            for done in &specs[..=i] {
                if let Some(prog) = ebpf.program_mut(done.program) {
                    let _ = unload(prog);
                }
            }
            return Err(StrategyError::Attach {
                hook: describe(spec.hook),
                reason: condense(&e),
                hint: hint(spec.hook, &e),
            });
        }
    }
    Ok(())
}

fn attach_one<'b>(
    ebpf: &mut Ebpf,
    spec: &ProgramSpec,
    btf: Result<&Btf, &'b BtfParseError>,
) -> Result<(), AttachError<'b>> {
    let prog = ebpf
        .program_mut(spec.program)
        .ok_or(AttachError::Missing(spec.program))?;
    let e = AttachError::Program;
    let btf = btf.map_err(AttachError::Btf);
    match spec.hook {
        Hook::Kprobe(f) | Hook::Kretprobe(f) => {
            let p: &mut KProbe = prog.try_into().map_err(e)?;
            p.load().map_err(e)?;
            p.attach(f, 0).map_err(e)?;
        }
        Hook::Fentry(f) => {
            let p: &mut FEntry = prog.try_into().map_err(e)?;
            p.load(f, btf?).map_err(e)?;
            p.attach().map_err(e)?;
        }
        Hook::Fexit(f) => {
            let p: &mut FExit = prog.try_into().map_err(e)?;
            p.load(f, btf?).map_err(e)?;
            p.attach().map_err(e)?;
        }
        Hook::TpBtf(t) => {
            let p: &mut BtfTracePoint = prog.try_into().map_err(e)?;
            p.load(t, btf?).map_err(e)?;
            p.attach().map_err(e)?;
        }
        Hook::Tracepoint(category, name) => {
            let p: &mut TracePoint = prog.try_into().map_err(e)?;
            p.load().map_err(e)?;
            p.attach(category, name).map_err(e)?;
        }
    }
    Ok(())
}

fn unload(prog: &mut Program) -> Result<(), aya::programs::ProgramError> {
    match prog {
        Program::KProbe(p) => p.unload(),
        Program::FEntry(p) => p.unload(),
        Program::FExit(p) => p.unload(),
        Program::BtfTracePoint(p) => p.unload(),
        Program::TracePoint(p) => p.unload(),
        _ => Ok(()),
    }
}

fn describe(hook: Hook) -> String {
    match hook {
        Hook::Kprobe(f) => format!("kprobe {f}"),
        Hook::Kretprobe(f) => format!("kretprobe {f}"),
        Hook::Fentry(f) => format!("fentry {f}"),
        Hook::Fexit(f) => format!("fexit {f}"),
        Hook::TpBtf(t) => format!("tp_btf {t}"),
        Hook::Tracepoint(c, n) => format!("tracepoint {c}:{n}"),
    }
}

/// Keeps a verifier log's verdict and drops the listing: the line that says
/// why a program was rejected, not the hundreds before it.
pub(crate) fn condense(error: &str) -> String {
    let Some((head, log)) = error.split_once("Verifier output:") else {
        return error.trim().to_string();
    };
    let head = head.trim().trim_end_matches('.');
    let verdict = log.lines().map(str::trim).rfind(|l| {
        !l.is_empty()
            && !["verification time", "stack depth", "processed "]
                .iter()
                .any(|p| l.starts_with(p))
    });
    match verdict {
        Some(v) => format!("{head}; verifier: {v}"),
        None => head.to_string(),
    }
}

/// A likely cause, for failures that have a well-known one.
fn hint(hook: Hook, error: &str) -> &'static str {
    let no_kprobe_pmu = !Path::new("/sys/bus/event_source/devices/kprobe").exists();
    match hook {
        Hook::Kprobe(_) | Hook::Kretprobe(_) if no_kprobe_pmu => {
            " (this kernel has no kprobe PMU: CONFIG_KPROBES is off)"
        }
        Hook::Fentry(_) | Hook::Fexit(_)
            if error.contains("Operation not permitted") || error.contains("EPERM") =>
        {
            " (the kernel refuses BPF trampolines here: lockdown, or no trampoline support)"
        }
        Hook::TpBtf(_) if error.contains("unknown BTF type") => {
            " (this kernel has no such tracepoint: sock_{recv,send}_length need Linux 6.3+)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strategy's precheck fails by kind, in the words of its attempt.
    #[test]
    fn precheck_errors_read_as_the_attempts_reasons() {
        assert_eq!(
            PrecheckError::SkProtocolBitfield.to_string(),
            "sock.sk_protocol is a bitfield on this kernel (before 5.6)"
        );
        assert_eq!(
            PrecheckError::NoTracefs.to_string(),
            "tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)"
        );
        let offset = PrecheckError::Offset {
            category: "sock",
            event: "sock_recv_length",
            field: "ret",
            got: 24,
            want: 20,
        };
        assert_eq!(
            offset.to_string(),
            "sock:sock_recv_length field ret is at offset 24, the program reads 20"
        );
        let root = std::env::temp_dir().join(format!("selfheal-tracefs-{}", std::process::id()));
        let dir = root.join("events/sock/sock_recv_length");
        std::fs::create_dir_all(&dir).unwrap();
        let format = dir.join("format");
        let e = PrecheckError::from(
            tracefs::field_offset(&root, "sock", "sock_recv_length", "ret").unwrap_err(),
        );
        assert!(
            matches!(e, PrecheckError::Format(tracefs::FormatError::Read { .. })),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "cannot read {}: No such file or directory (os error 2)",
                format.display()
            )
        );
        std::fs::write(&format, "format:\n").unwrap();
        let e = tracefs::field_offset(&root, "sock", "sock_recv_length", "ret").unwrap_err();
        assert!(matches!(e, tracefs::FormatError::NoField { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("{} has no field `ret`", format.display())
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    /// A strategy's failure reads as its attempt's reason: a precheck's
    /// own words, or the hook, the kernel's error and the hint.
    #[test]
    fn strategy_errors_read_as_the_attempts_reasons() {
        assert_eq!(
            StrategyError::Precheck(PrecheckError::NoTracefs).to_string(),
            PrecheckError::NoTracefs.to_string()
        );
        let attach = StrategyError::Attach {
            hook: describe(Hook::Kprobe("tcp_recvmsg")),
            reason: condense("Invalid argument (os error 22)"),
            hint: " (no kprobe PMU)",
        };
        assert_eq!(
            attach.to_string(),
            "kprobe tcp_recvmsg: Invalid argument (os error 22) (no kprobe PMU)"
        );
    }

    #[test]
    fn verifier_logs_are_condensed_to_their_verdict() {
        let log = "the BPF_PROG_LOAD syscall returned Permission denied (os error 13). Verifier output: 0: R1=ctx()\n38: (79) r3 = *(u64 *)(r2 +0)\ndereference of modified ctx ptr R2 off=88 disallowed\nverification time 88 usec\nstack depth 40\nprocessed 22 insns\n";
        assert_eq!(
            condense(log),
            "the BPF_PROG_LOAD syscall returned Permission denied (os error 13); verifier: dereference of modified ctx ptr R2 off=88 disallowed"
        );
        assert_eq!(
            condense("returned Operation not permitted (os error 1). Verifier output: "),
            "returned Operation not permitted (os error 1)"
        );
        assert_eq!(condense("plain error"), "plain error");
    }

    #[test]
    fn fdinfo_flags_are_octal() {
        assert_eq!(
            fdinfo_flags("pos:\t0\nflags:\t04002\nmnt_id:\t9\n"),
            Some(0o4002)
        );
        assert_eq!(fdinfo_flags("pos:\t0\n"), None);
        assert_eq!(fdinfo_flags("flags:\tzz\n"), None);
    }
}
