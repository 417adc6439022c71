//! The per-process readers: the helper's reads, the kernel's task
//! iterators (one walk per process, opened from the helper's pins or
//! loaded), and a process's `stat` for the walk's caps.

use super::{sockets::ByNamespace, *};

/// Reads `target`'s processes through `source` (the helper): which pids
/// to read is decided here, by the caps and each process's `stat` (which
/// anyone may read); the processes, their waits and their sockets are
/// read by the helper, within what is left of `budget`. Pids the helper
/// refused, or all of a request that failed, are read by procfs here,
/// with the reason (for another user's process, a gap).
pub(super) fn read_through(
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
                let why = why.to_string();
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

/// Why one process was not walked by the iterators.
pub(super) enum Walk {
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
pub(super) enum Iterators {
    /// Open, and where they came from (`pinned` or `loaded`).
    Open(ebpf::iter::TaskIter, &'static str),
    /// None pinned, and not loaded (not asked to): why.
    NotPinned(String),
    /// Loading them failed: why.
    Failed(String),
}

/// One walk of the task iterators over `pid`, where they came from, and
/// whether the process walked has exited since (asked of its pidfd);
/// `load` loads them where none are pinned.
pub(super) fn iterate(pid: u32, load: bool) -> Result<super::kernel::Walked, Walk> {
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
        Ok(pass) => Ok(super::kernel::Walked {
            pass,
            from,
            exited: Box::new(move || crate::sys::pidfd::exited(pidfd.as_fd())),
        }),
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
pub(super) fn open_iterators(load: bool) -> std::sync::MutexGuard<'static, Option<Iterators>> {
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
pub(super) fn state_and_ppid(root: &ProcRoot, pid: u32) -> Option<(char, u32)> {
    let (mut buf, mut more) = ([0u8; 2048], Vec::new());
    let stat =
        crate::sys::procfs::read_whole(&root.of_pid(pid, "stat"), &mut buf, &mut more).ok()?;
    // `PID (COMM) STATE PPID …`; COMM may hold anything, so split at the last `)`.
    let close = stat.iter().rposition(|b| *b == b')')?;
    let mut rest = std::str::from_utf8(stat.get(close + 1..)?)
        .ok()?
        .split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((state, ppid))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A procfs of one process whose `stat` is `stat`, under a directory
    /// of its own.
    fn procfs(name: &str, stat: &[u8]) -> (std::path::PathBuf, ProcRoot) {
        let dir =
            std::env::temp_dir().join(format!("selfheal-readers-{name}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("42")).unwrap();
        std::fs::write(dir.join("42/stat"), stat).unwrap();
        let root = ProcRoot::at(&dir);
        (dir, root)
    }

    /// A command name holding `) Z 1 (` and spaces does not fool the
    /// split: state and parent come after the last `)`.
    #[test]
    fn state_and_parent_come_after_the_last_parenthesis() {
        let (dir, root) = procfs("comm", b"42 (evil) Z 1 (x y) S 7 42 42 0 -1");
        assert_eq!(state_and_ppid(&root, 42), Some(('S', 7)));
        assert_eq!(state_and_ppid(&root, 43), None, "a gone process");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A short, cut or non-UTF-8 `stat` is `None`, never a panic.
    #[test]
    fn a_bad_stat_is_none() {
        for (i, bad) in [
            &b""[..],
            b"42 (sol",
            b"42 (sol)",
            b"42 (sol) S",
            b"42 (sol) S x",
            b"42 (sol) \xff 1",
        ]
        .iter()
        .enumerate()
        {
            let (dir, root) = procfs(&format!("bad{i}"), bad);
            assert_eq!(
                state_and_ppid(&root, 42),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
}
