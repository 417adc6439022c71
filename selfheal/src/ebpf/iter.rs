//! The kernel's task iterators from user space: loads the `iter/task` and
//! `iter/task_file` programs of the object built from `selfheal-ebpf` once
//! ([`TaskIter::load`]), or opens them where a helper pinned them
//! ([`TaskIter::open_pinned`]); then each pass ([`TaskIter::process`])
//! links both to one process (by pidfd, so a reused pid cannot be walked
//! instead), reads each iterator's file to its end and parses the records:
//! the process's threads
//! ([`IterThread`](selfheal_core::ebpf::iter::IterThread)) and the sockets it holds. No aya
//! type leaves this module.
//!
//! A process that is gone by the time it is linked has nothing to walk:
//! linking fails ([`IterError::Gone`]), or the walk is empty.

use std::{
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

use selfheal_core::ebpf::iter::{HostPass, IterParseError, IterProcess};

use super::layout::LayoutError;

/// Why the task iterator cannot run.
#[derive(Debug, thiserror::Error)]
pub enum IterError {
    /// The binary was built without the eBPF toolchain.
    #[error(
        "eBPF was not built into this binary (build with the eBPF toolchain: `cargo xtask setup`)"
    )]
    NotBuiltIn,
    /// The kernel layout could not be read.
    #[error("cannot read the kernel's struct layout")]
    Layout(#[from] LayoutError),
    /// The kernel's BTF lacks a `task_struct` field the program reads.
    #[error("the task iterator cannot run on this kernel: {0}")]
    TaskLayout(#[source] LayoutError),
    /// The object or the program could not be loaded (no iterator support,
    /// refused by the verifier, no permission).
    #[error("cannot load the task iterator: {reason}")]
    Load { reason: String },
    /// A pinned program is not what this version pinned.
    #[error("pinned iterator {path}: {reason}")]
    Pinned { path: String, reason: String },
    /// No pins of this build where they are looked for.
    #[error("no task iterators pinned in {looked}")]
    NotPinned { looked: String },
    /// The pins' directory could not be made ready.
    #[error("cannot prepare {path} for the pins: {reason}")]
    Publish { path: String, reason: String },
    /// The process is gone: there is nothing to walk.
    #[error("the process is gone")]
    Gone,
    /// Linking a program or reading the iterator's file failed.
    #[error("cannot run the task iterator: {reason}")]
    Run { reason: String },
    /// The iterator's output is not whole records.
    #[error(transparent)]
    Parse(#[from] IterParseError),
}

/// The system's bpffs (systemd mounts it at boot): where the system has
/// one, the helper pins under `selfheal/` in it.
pub const SYSTEM_BPFFS: &str = "/sys/fs/bpf";

/// The bpffs the helper mounts itself (root mode 0700) where the system
/// has none, or where its `selfheal/` is not root's alone (any user may
/// make it in a bpffs mounted without `mode=`, whose root is 1777).
pub const OWN_BPFFS: &str = "/run/selfheal/bpf";

/// The directory of this build's pins under the bpffs directory `base`:
/// named by a hash of the eBPF object (FNV-1a, computed when it was
/// built), so the pins of another build of selfheal (other programs,
/// other records) are never opened as this one's.
fn pins_under(base: &Path) -> PathBuf {
    base.join(format!("iter-{OBJECT_HASH}"))
}

/// The eBPF object's hash, in hex (`build.rs`); zeros where eBPF is not
/// built in.
#[cfg(selfheal_ebpf)]
const OBJECT_HASH: &str = env!("SELFHEAL_EBPF_OBJECT_HASH");
#[cfg(not(selfheal_ebpf))]
const OBJECT_HASH: &str = "0000000000000000";

/// Where this build's pins are looked for, in order: in the system's
/// bpffs (`/sys/fs/bpf/selfheal/iter-…`), then in selfheal's own
/// (`/run/selfheal/bpf/iter-…`).
pub fn pin_dirs() -> [PathBuf; 2] {
    [
        pins_under(&Path::new(SYSTEM_BPFFS).join("selfheal")),
        pins_under(Path::new(OWN_BPFFS)),
    ]
}

/// The programs in the object.
pub const TASK_PROGRAM: &str = "iter_task";
pub const FILE_PROGRAM: &str = "iter_task_file";

#[cfg(selfheal_ebpf)]
pub use self::kernel::TaskIter;

#[cfg(selfheal_ebpf)]
mod kernel {
    use std::{
        io::Read as _,
        os::fd::{AsFd as _, BorrowedFd, OwnedFd},
        path::Path,
    };

    use aya::{Btf, Ebpf, EbpfLoader, programs::Iter};
    use selfheal_common::{IterSockRecord, TCP_WINDOWS};
    use selfheal_core::ebpf::iter::{
        IterThread, one_per_fd, parse_sock_records, parse_task_records, tcp_pass,
    };

    use super::{FILE_PROGRAM, HostPass, IterError, IterProcess, TASK_PROGRAM, TcpReads};
    use crate::{
        ebpf::{
            chain,
            layout::{KernelLayout, LayoutError},
            loader::{OBJECT, condense},
        },
        sys::bpf,
    };

    /// The tracer's maps, which the object declares and the iterators
    /// never use: made as small as the kernel allows.
    const UNUSED_MAPS: [&str; 7] = [
        "WATCHED",
        "IN_RECV",
        "SOCKS",
        "OWNER_OF",
        "OWNER_SOCKS",
        "IN_SEND",
        "COUNTERS",
    ];

    /// Where the programs come from.
    enum Programs {
        /// Loaded by this process: dropping the object unloads them.
        Loaded(Box<Ebpf>),
        /// Opened from pins: `(task, file)`.
        Pinned(OwnedFd, OwnedFd),
    }

    /// The newest kernel whose verifier is known to refuse the file
    /// iterator's TCP part: measured on Debian's 6.1 ("BPF program is too
    /// large" after 1,000,000 instructions, tens of seconds under qemu);
    /// 6.18 loads it. Newer kernels try it, and a refusal falls back too.
    const REFUSES_TCP_PART: (u8, u8) = (6, 1);

    /// Loads the object's two iterator programs with `task`'s offsets and,
    /// where `tcp` is given, the offsets that let the file iterator read
    /// each TCP socket's fields (`TCP_ON` set: left at 0, the verifier
    /// drops that part of the program as dead code).
    fn load_programs(
        btf: &Btf,
        layout: &KernelLayout,
        task: &crate::ebpf::layout::TaskLayout,
        tcp: Option<(&crate::ebpf::layout::TcpLayout, TcpReads)>,
    ) -> Result<Ebpf, IterError> {
        let mut loader = EbpfLoader::new();
        loader.btf(Some(btf));
        for map in UNUSED_MAPS {
            loader.map_max_entries(map, 1);
        }
        loader
            .override_global("OFF_TASK_TGID", &task.tgid, true)
            .override_global("OFF_TASK_PID", &task.pid, true)
            .override_global("OFF_TASK_STATE", &task.state, true)
            .override_global("OFF_TASK_EXIT_STATE", &task.exit_state, true)
            .override_global("OFF_TASK_RUNTIME", &task.runtime, true)
            .override_global("OFF_TASK_EXEC_START", &task.exec_start, true)
            .override_global("OFF_TASK_CPU", &task.cpu, true)
            .override_global("OFF_TASK_COMM", &task.comm, true)
            .override_global("OFF_FILE_INODE", &task.file_inode, true)
            .override_global("OFF_INODE_MODE", &task.inode_mode, true)
            .override_global("OFF_INODE_INO", &task.inode_ino, true)
            .override_global("OFF_REGS_SYSCALL", &layout.regs_syscall, true)
            .override_global("OFF_REGS_ARG0", &layout.regs_arg0, true)
            .override_global("OFF_REGS_ARG1", &layout.regs_arg1, true);
        if let Some(h) = &task.head {
            loader
                .override_global("HEAD_ON", &1u64, true)
                .override_global("OFF_HEAD_REAL_PARENT", &h.real_parent, true)
                .override_global("OFF_HEAD_REAL_CRED", &h.real_cred, true)
                .override_global("OFF_HEAD_CRED_UID", &h.cred_uid, true)
                .override_global("OFF_HEAD_START", &h.start, true)
                .override_global("OFF_HEAD_THREAD_PID", &h.thread_pid, true)
                .override_global("OFF_HEAD_PID_LEVEL", &h.pid_level, true)
                .override_global("OFF_HEAD_PID_NR", &h.pid_nr, true)
                .override_global("HEAD_UPID_SIZE", &h.upid_size, true);
        }
        // Kept alive for the loader's borrows below.
        let (mut starts, mut lens) = ([0u64; TCP_WINDOWS], [0u64; TCP_WINDOWS]);
        if let Some((t, reads)) = tcp {
            let windows = match reads {
                TcpReads::Windows => t.windows().unwrap_or_default(),
                TcpReads::Alone => Vec::new(),
            };
            for (i, (start, len)) in windows.into_iter().enumerate() {
                (starts[i], lens[i]) = (start, len);
            }
            loader
                .override_global("TCP_ON", &1u64, true)
                .override_global("TCP_WINDOW_START", &starts, true)
                .override_global("TCP_WINDOW_LEN", &lens, true)
                .override_global("OFF_SOCKET_SK", &t.socket_sk, true)
                .override_global("OFF_TCP_FAMILY", &t.family, true)
                .override_global("OFF_TCP_STATE", &t.state, true)
                .override_global("OFF_TCP_NUM", &t.num, true)
                .override_global("OFF_TCP_DPORT", &t.dport, true)
                .override_global("OFF_TCP_RCV_SADDR", &t.rcv_saddr, true)
                .override_global("OFF_TCP_DADDR", &t.daddr, true)
                .override_global("OFF_TCP_V6_RCV_SADDR", &t.v6_rcv_saddr, true)
                .override_global("OFF_TCP_V6_DADDR", &t.v6_daddr, true)
                .override_global("OFF_TCP_COOKIE", &t.cookie, true)
                .override_global("OFF_TCP_NET", &t.net, true)
                .override_global("OFF_NET_INUM", &t.net_inum, true)
                .override_global("OFF_TCP_TYPE", &t.sk_type, true)
                .override_global("OFF_TCP_PROTOCOL", &t.protocol, true)
                .override_global("OFF_TCP_UID", &t.uid, true)
                .override_global("OFF_TCP_RTO", &t.rto, true)
                .override_global("OFF_TCP_RETRANSMITS", &t.retransmits, true)
                .override_global("OFF_TCP_BACKOFF", &t.backoff, true)
                .override_global("OFF_TCP_PROBES", &t.probes, true)
                .override_global("OFF_TCP_LRCVTIME", &t.lrcvtime, true)
                .override_global("OFF_TCP_LSNDTIME", &t.lsndtime, true)
                .override_global("OFF_TCP_RCV_TSTAMP", &t.rcv_tstamp, true)
                .override_global("OFF_TCP_SRTT", &t.srtt_us, true)
                .override_global("OFF_TCP_PACKETS_OUT", &t.packets_out, true)
                .override_global("OFF_TCP_RCV_NXT", &t.rcv_nxt, true)
                .override_global("OFF_TCP_COPIED_SEQ", &t.copied_seq, true)
                .override_global("OFF_TCP_WRITE_SEQ", &t.write_seq, true)
                .override_global("OFF_TCP_SND_UNA", &t.snd_una, true)
                .override_global("OFF_TCP_BYTES_RECEIVED", &t.bytes_received, true)
                .override_global("OFF_TCP_BYTES_ACKED", &t.bytes_acked, true)
                .override_global("OFF_TCP_SEGS_IN", &t.data_segs_in, true)
                .override_global("OFF_TCP_SEGS_OUT", &t.data_segs_out, true);
        }
        let mut ebpf = loader
            .load(OBJECT)
            .map_err(|e| IterError::Load { reason: chain(&e) })?;
        for (name, kind) in [(TASK_PROGRAM, "task"), (FILE_PROGRAM, "task_file")] {
            iter_mut(&mut ebpf, name)?
                .load(kind, btf)
                .map_err(|e| IterError::Load {
                    reason: condense(&chain(&e)),
                })?;
        }
        Ok(ebpf)
    }

    /// The loaded task iterators.
    pub struct TaskIter {
        programs: Programs,
        /// The last pass's output, kept for its capacity.
        buf: Vec<u8>,
        /// The kernel's tick rate, read on the first pass (0: unknown).
        hz: Option<u32>,
        /// Why the file iterator does not read sockets' TCP fields, where
        /// this process loaded it without them (unknown for pins).
        tcp_off: Option<String>,
    }

    impl TaskIter {
        /// Loads the object's iterator programs, with the struct offsets of
        /// the kernel whose BTF is at `btf_path`.
        pub fn load(btf_path: &Path) -> Result<Self, IterError> {
            Self::load_reading(btf_path, TcpReads::Windows)
        }

        /// [`TaskIter::load`], the `tcp_sock` fields read as `reads` says.
        pub fn load_reading(btf_path: &Path, reads: TcpReads) -> Result<Self, IterError> {
            // The layout through btf-rs's mmap backend (no index of every
            // type), then aya's own parse; the file's bytes are dropped
            // before the load.
            let layout = KernelLayout::from_btf_file(btf_path)?;
            let task = layout.task.clone().map_err(IterError::TaskLayout)?;
            let btf = {
                let bytes = std::fs::read(btf_path).map_err(|e| LayoutError::NoBtf {
                    path: btf_path.display().to_string(),
                    reason: e.to_string(),
                })?;
                Btf::parse(&bytes, aya::Endianness::default()).map_err(|e| IterError::Load {
                    reason: format!(
                        "cannot parse kernel BTF {}: {}",
                        btf_path.display(),
                        chain(&e)
                    ),
                })?
            };
            // Reading sockets' TCP fields makes the file iterator larger
            // than an older verifier explores (Linux 6.1: "BPF program is
            // too large"): refused, the programs are loaded without them
            // and sock_diag reads those fields, as where the kernel's BTF
            // lacks one.
            let old_verifier = crate::sys::procfs::kernel_version()
                .filter(|v| *v <= REFUSES_TCP_PART)
                .map(|(major, minor)| {
                    format!(
                        "Linux {major}.{minor}'s verifier refuses the program that reads them \
                         (too large: Debian's 6.1 stops at 1,000,000 instructions), so it is not \
                         tried"
                    )
                });
            let tcp = match (&layout.tcp, old_verifier) {
                (Err(why), _) => Err(why.to_string()),
                (Ok(_), Some(why)) => Err(why),
                (Ok(t), None) => Ok(t),
            };
            // A verifier that refuses the windows' program (none known)
            // is given each field alone before none at all.
            let with_tcp = |t| {
                load_programs(&btf, &layout, &task, Some((t, reads))).or_else(|refused| {
                    if reads == TcpReads::Alone || t.windows().is_none() {
                        return Err(refused);
                    }
                    tracing::warn!(
                        "task iterators: the program that reads tcp_sock a window at a time \
                         was refused ({refused}); reading each field alone"
                    );
                    load_programs(&btf, &layout, &task, Some((t, TcpReads::Alone)))
                })
            };
            let (ebpf, tcp_off) = match tcp {
                Ok(t) => match with_tcp(t) {
                    Ok(ebpf) => (ebpf, None),
                    Err(refused) => (
                        load_programs(&btf, &layout, &task, None)?,
                        Some(format!(
                            "the program that reads them was refused: {refused}"
                        )),
                    ),
                },
                Err(why) => (load_programs(&btf, &layout, &task, None)?, Some(why)),
            };
            if let Some(why) = &tcp_off {
                tracing::warn!(
                    "task iterators: sockets' TCP fields are not read on this kernel \
                     (sock_diag reads them): {why}"
                );
            }
            Ok(Self {
                programs: Programs::Loaded(Box::new(ebpf)),
                buf: Vec::new(),
                hz: None,
                tcp_off,
            })
        }

        /// Why this process loaded the file iterator without reading
        /// sockets' TCP fields (the kernel's BTF lacks one, or its verifier
        /// refused that program), or `None` where it reads them or the
        /// programs came from pins.
        pub fn tcp_off(&self) -> Option<&str> {
            self.tcp_off.as_deref()
        }

        /// Pins both programs in `dir` (a bpffs directory), as
        /// `iter_task` and `iter_task_file`.
        pub fn pin(&mut self, dir: &Path) -> Result<(), IterError> {
            let Programs::Loaded(ebpf) = &mut self.programs else {
                return Ok(()); // pinned already
            };
            for name in [TASK_PROGRAM, FILE_PROGRAM] {
                let path = dir.join(name);
                iter_mut(ebpf, name)?
                    .pin(&path)
                    .map_err(|e| IterError::Pinned {
                        path: path.display().to_string(),
                        reason: chain(&e),
                    })?;
            }
            Ok(())
        }

        /// Opens the programs pinned in `dir` by [`TaskIter::pin`], after
        /// checking that each is an iterator program of the expected name.
        pub fn open_pinned(dir: &Path) -> Result<Self, IterError> {
            let open = |name: &str| {
                let path = dir.join(name);
                let pinned = |reason: String| IterError::Pinned {
                    path: path.display().to_string(),
                    reason,
                };
                let fd = bpf::obj_get(&path).map_err(|e| pinned(e.to_string()))?;
                let info = bpf::prog_info(fd.as_fd()).map_err(|e| pinned(e.to_string()))?;
                if info.prog_type != bpf::BPF_PROG_TYPE_TRACING || info.name != name {
                    return Err(pinned(format!(
                        "holds program {:?} of type {}, not the iterator {name}",
                        info.name, info.prog_type
                    )));
                }
                Ok(fd)
            };
            Ok(Self {
                programs: Programs::Pinned(open(TASK_PROGRAM)?, open(FILE_PROGRAM)?),
                buf: Vec::new(),
                hz: None,
                tcp_off: None,
            })
        }

        /// The threads and sockets of the process `pidfd` names, in one
        /// walk of each iterator; [`IterError::Gone`] or nothing when it
        /// is gone.
        pub fn process(&mut self, pidfd: BorrowedFd<'_>) -> Result<IterProcess, IterError> {
            let (threads, records, hz) = self.walk_both(Some(pidfd))?;
            let mut sockets: Vec<(i32, u64)> =
                records.iter().map(|s| (s.fd as i32, s.inode)).collect();
            one_per_fd(&mut sockets);
            Ok(IterProcess {
                threads,
                sockets,
                tcp: tcp_pass(&records, hz),
            })
        }

        /// One pass over every task of this pid namespace: each walks once
        /// (the threads, then every process's files), cut by process. The
        /// pids are the initial pid namespace's (what the programs read):
        /// run only there ([`super::in_initial_pid_namespace`]).
        pub fn host(&mut self) -> Result<HostPass, IterError> {
            let (threads, records, hz) = self.walk_both(None)?;
            Ok(HostPass::of(threads, &records, hz))
        }

        /// One walk of each iterator over the process `pidfd` names (or
        /// the whole pid namespace): the threads, the socket records and
        /// the kernel's tick rate (read on the first pass; 0: unknown).
        fn walk_both(
            &mut self,
            pidfd: Option<BorrowedFd<'_>>,
        ) -> Result<(Vec<IterThread>, Vec<IterSockRecord>, u32), IterError> {
            let (task, file) = match &self.programs {
                Programs::Loaded(ebpf) => {
                    (prog_fd(ebpf, TASK_PROGRAM)?, prog_fd(ebpf, FILE_PROGRAM)?)
                }
                Programs::Pinned(task, file) => (task.as_fd(), file.as_fd()),
            };
            let mut threads = parse_task_records(walk(task, pidfd, &mut self.buf)?)?;
            // Where the kernel's numbers are not procfs's, a process's
            // head is read from procfs.
            if !super::heads_are_procfs() {
                threads.iter_mut().for_each(|t| t.head = None);
            }
            let records = parse_sock_records(walk(file, pidfd, &mut self.buf)?)?;
            let hz = *self.hz.get_or_insert_with(|| bpf::kernel_hz().unwrap_or(0));
            Ok((threads, records, hz))
        }
    }

    /// One walk of `prog` over the process `pidfd` names, or over every
    /// task of this pid namespace: its output.
    fn walk<'b>(
        prog: BorrowedFd<'_>,
        pidfd: Option<BorrowedFd<'_>>,
        buf: &'b mut Vec<u8>,
    ) -> Result<&'b [u8], IterError> {
        let run = |what: &str, e: std::io::Error| IterError::Run {
            reason: format!("{what}: {e}"),
        };
        let link = match pidfd {
            Some(pidfd) => bpf::link_iter_to_process(prog, pidfd),
            None => bpf::link_iter_to_host(prog),
        }
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ESRCH) {
                IterError::Gone
            } else {
                run("link", e)
            }
        })?;
        let mut file = bpf::iter_file(link.as_fd()).map_err(|e| run("iterator file", e))?;
        let len = read_all(&mut file, buf).map_err(|e| run("read", e))?;
        Ok(&buf[..len])
    }

    /// The first bytes a walk's output is read into: a process of a few
    /// hundred threads, or a thousand sockets, in one `read`.
    const WALK_BUF: usize = 64 << 10;

    /// Reads `file` to its end into `buf` (kept from walk to walk, grown
    /// as needed, never shrunk), `WALK_BUF` bytes at least per `read`;
    /// the length read. Not `read_to_end`, whose size probe (`statx`,
    /// `lseek`) and small first reads cost a dozen syscalls a walk where
    /// two do.
    fn read_all(file: &mut std::fs::File, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        let mut len = 0;
        loop {
            if buf.len() - len < WALK_BUF {
                buf.resize(len + WALK_BUF.max(buf.len()), 0);
            }
            match file.read(&mut buf[len..]) {
                Ok(0) => return Ok(len),
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn iter_mut<'e>(ebpf: &'e mut Ebpf, name: &str) -> Result<&'e mut Iter, IterError> {
        let load = |reason: String| IterError::Load { reason };
        ebpf.program_mut(name)
            .ok_or_else(|| load(format!("program {name} missing from the object")))?
            .try_into()
            .map_err(|e| load(chain(&e)))
    }

    fn prog_fd<'e>(ebpf: &'e Ebpf, name: &str) -> Result<BorrowedFd<'e>, IterError> {
        let run = |reason: String| IterError::Run { reason };
        let prog: &Iter = ebpf
            .program(name)
            .ok_or_else(|| run(format!("program {name} missing from the object")))?
            .try_into()
            .map_err(|e| run(chain(&e)))?;
        Ok(prog.fd().map_err(|e| run(chain(&e)))?.as_fd())
    }
}

/// Stand-in when eBPF is not built in: loading always fails with
/// [`IterError::NotBuiltIn`].
#[cfg(not(selfheal_ebpf))]
pub struct TaskIter(std::convert::Infallible);

#[cfg(not(selfheal_ebpf))]
impl TaskIter {
    pub fn load(_btf_path: &Path) -> Result<Self, IterError> {
        Err(IterError::NotBuiltIn)
    }
    pub fn load_reading(_btf_path: &Path, _reads: TcpReads) -> Result<Self, IterError> {
        Err(IterError::NotBuiltIn)
    }
    pub fn open_pinned(_dir: &Path) -> Result<Self, IterError> {
        Err(IterError::NotBuiltIn)
    }
    pub fn pin(&mut self, _dir: &Path) -> Result<(), IterError> {
        match self.0 {}
    }
    pub fn tcp_off(&self) -> Option<&str> {
        match self.0 {}
    }
    pub fn process(
        &mut self,
        _pidfd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<IterProcess, IterError> {
        match self.0 {}
    }
    pub fn host(&mut self) -> Result<HostPass, IterError> {
        match self.0 {}
    }
}

/// Whether this process is in the initial pid namespace, where the pids
/// the iterators read (the kernel's own, `task->tgid`) are the ones
/// procfs names. `/proc/self/ns/pid` of the initial namespace has the
/// kernel's fixed inode number (`PROC_PID_INIT_INO`).
pub fn in_initial_pid_namespace() -> bool {
    const PROC_PID_INIT_INO: u64 = 0xEFFF_FFFC;
    crate::sys::procfs::ProcRoot::default()
        .own_namespace("pid")
        .is_ok_and(|ino| ino == PROC_PID_INIT_INO)
}

/// Whether what the task iterator reads of a process from its leader
/// (`IterThread::head`: the kernel's pids, uid and start time) is what
/// procfs shows this process: in the initial pid and user namespaces
/// (procfs maps pids and uids into the reader's) and the initial time
/// namespace (procfs shifts start times by the reader's boot-time
/// offset), or on a kernel without time namespaces. Asked once: selfheal
/// changes none of these namespaces of its own.
pub fn heads_are_procfs() -> bool {
    static HEADS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HEADS.get_or_init(heads_read_are_procfs)
}

fn heads_read_are_procfs() -> bool {
    const PROC_USER_INIT_INO: u64 = 0xEFFF_FFFD;
    const PROC_TIME_INIT_INO: u64 = 0xEFFF_FFFA;
    let root = crate::sys::procfs::ProcRoot::default();
    let time = match root.own_namespace("time") {
        Ok(ino) => ino == PROC_TIME_INIT_INO,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    };
    time && in_initial_pid_namespace()
        && root
            .own_namespace("user")
            .is_ok_and(|ino| ino == PROC_USER_INIT_INO)
}

/// Loads the task iterator for the running kernel
/// ([`super::layout::VMLINUX_BTF`]).
pub fn load() -> Result<TaskIter, IterError> {
    TaskIter::load(Path::new(super::layout::VMLINUX_BTF))
}

/// How the file iterator reads a TCP socket's `inet_connection_sock` and
/// `tcp_sock` fields (behind a pointer the verifier types as a `struct
/// sock` only, so through `bpf_probe_read_kernel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpReads {
    /// A window at a time onto the program's stack, where the fields fit
    /// the windows (`TcpLayout::windows`), else each alone: what
    /// [`load`] loads.
    Windows,
    /// Each field alone: the same values, one helper call a field (for
    /// the tests and the benchmark, which compare the two).
    Alone,
}

/// [`load`], the `tcp_sock` fields read as `reads` says.
pub fn load_reading(reads: TcpReads) -> Result<TaskIter, IterError> {
    TaskIter::load_reading(Path::new(super::layout::VMLINUX_BTF), reads)
}

/// Opens this build's pinned iterators from the first of [`pin_dirs`]
/// that exists, after checking that it is a bpffs directory only root
/// can write (as is its parent); and where they came from.
pub fn open_published() -> Result<(TaskIter, PathBuf), IterError> {
    open_first(&pin_dirs())
}

/// Opens the pinned iterators in the first of `dirs` that exists, after
/// checking that it is a bpffs directory only root can write (as is its
/// parent): the rule [`open_published`] applies to [`pin_dirs`]. A first
/// directory that exists but is not trusted is refused, never skipped
/// for the next.
pub fn open_first(dirs: &[PathBuf]) -> Result<(TaskIter, PathBuf), IterError> {
    for dir in dirs {
        if std::fs::symlink_metadata(dir).is_err() {
            continue;
        }
        trusted(dir)?;
        return TaskIter::open_pinned(dir).map(|it| (it, dir.clone()));
    }
    Err(IterError::NotPinned {
        looked: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" or "),
    })
}

/// Refuses a pins directory (or its parent) that is not a root-owned
/// directory on a bpffs, writable by root only.
fn trusted(dir: &Path) -> Result<(), IterError> {
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        let refuse = |reason: String| IterError::Pinned {
            path: d.display().to_string(),
            reason,
        };
        let m = std::fs::symlink_metadata(d).map_err(|e| refuse(e.to_string()))?;
        root_only_dir(&m).map_err(|e| refuse(e.to_string()))?;
        if !crate::sys::bpf::is_bpffs(d).map_err(|e| refuse(e.to_string()))? {
            return Err(refuse("not on a bpffs".into()));
        }
    }
    Ok(())
}

/// Loads the iterators and pins them where checks look first
/// ([`pin_dirs`]): in the system's bpffs where it is mounted and its
/// `selfheal/` is root's alone, else in a bpffs mounted (mode 0700) at
/// [`OWN_BPFFS`] (a `selfheal/` another user made is never used: the log
/// says so, and where the pins went instead). Other builds' pins there
/// are removed (they would never be opened, only keep their programs
/// loaded); this build's, when they open, are kept as they are. The
/// programs stay loaded while pinned, past the caller's exit. Root only.
pub fn publish() -> Result<PathBuf, IterError> {
    let system = Path::new(SYSTEM_BPFFS);
    if !crate::sys::bpf::is_bpffs(system).unwrap_or(false) {
        return pin_in(&own_bpffs()?);
    }
    let base = system.join("selfheal");
    let refused = match private_dir(&base, 0o700) {
        Ok(()) => return pin_in(&base),
        Err(e) => publish_err(&base, &e),
    };
    let own = own_bpffs().map_err(|e| IterError::Publish {
        path: OWN_BPFFS.into(),
        reason: format!("{e} (and {refused})"),
    })?;
    tracing::warn!(
        "task iterators: not pinned in the system's bpffs: {refused}; pinned in selfheal's own \
         bpffs at {} instead (root mode 0700)",
        own.display()
    );
    pin_in(&own)
}

/// selfheal's own bpffs at [`OWN_BPFFS`], mounted (root mode 0700) where
/// it is not yet. Its parent (`/run/selfheal`) is made 0755 where missing
/// and may be a directory others can write (a Kubernetes `emptyDir` is
/// 0777): the mount point is made, opened without following a symlink,
/// checked (root's, writable by root alone) and mounted on through that
/// descriptor, so a directory or symlink another user puts in its place
/// meanwhile is never mounted on; the path must then lead to a root-only
/// bpffs.
fn own_bpffs() -> Result<PathBuf, IterError> {
    use crate::sys::bpf;
    let own = Path::new(OWN_BPFFS);
    if let Some(run) = own.parent() {
        match std::fs::DirBuilder::new().mode(0o755).create(run) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(publish_err(run, &e)),
        }
    }
    let err = |e: &dyn std::fmt::Display| publish_err(own, e);
    match std::fs::DirBuilder::new().mode(0o700).create(own) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(&e)),
    }
    let fd = bpf::open_dir_nofollow(own).map_err(|e| err(&e))?;
    let (uid, mode) = bpf::dir_fd_metadata(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| err(&e))?;
    root_only(uid, mode).map_err(|why| err(&format!("exists, but {why}")))?;
    if !bpf::is_bpffs_fd(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| err(&e))? {
        bpf::mount_bpffs_on(std::os::fd::AsFd::as_fd(&fd)).map_err(|e| err(&e))?;
    }
    let m = std::fs::symlink_metadata(own).map_err(|e| err(&e))?;
    root_only_dir(&m).map_err(|why| err(&why))?;
    if !bpf::is_bpffs(own).map_err(|e| err(&e))? {
        return Err(err(&"not on a bpffs after mounting one there"));
    }
    Ok(own.to_path_buf())
}

/// Pins this build's iterators in `base/iter-<object hash>` and returns
/// that directory; `base` must be a root-only directory on a bpffs. Other
/// builds' `iter-*` there are removed; this build's, when trusted and
/// they open, are kept. Root only.
pub fn pin_in(base: &Path) -> Result<PathBuf, IterError> {
    let m = std::fs::symlink_metadata(base).map_err(|e| publish_err(base, &e))?;
    root_only_dir(&m).map_err(|why| publish_err(base, &why))?;
    if !crate::sys::bpf::is_bpffs(base).map_err(|e| publish_err(base, &e))? {
        return Err(publish_err(base, &"not on a bpffs"));
    }
    let dir = pins_under(base);
    let entries = std::fs::read_dir(base).map_err(|e| publish_err(base, &e))?;
    for e in entries.flatten() {
        let path = e.path();
        if path != dir && e.file_name().to_string_lossy().starts_with("iter-") {
            std::fs::remove_dir_all(&path).map_err(|e| publish_err(&path, &e))?;
        }
    }
    if std::fs::symlink_metadata(&dir).is_ok() {
        if trusted(&dir).is_ok() && TaskIter::open_pinned(&dir).is_ok() {
            return Ok(dir);
        }
        std::fs::remove_dir_all(&dir).map_err(|e| publish_err(&dir, &e))?;
    }
    let mut it = load()?;
    private_dir(&dir, 0o700).map_err(|e| publish_err(&dir, &e))?;
    it.pin(&dir)?;
    Ok(dir)
}

/// Making or filling the pins directory `path` failed.
fn publish_err(path: &Path, e: &dyn std::fmt::Display) -> IterError {
    IterError::Publish {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// `path` as a root-owned directory no one else may write: made with
/// `mode` where missing; an existing one must already be such.
fn private_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(path)?;
            root_only_dir(&m).map_err(|why| std::io::Error::other(format!("exists, but {why}")))
        }
        Err(e) => Err(e),
    }
}

/// Why a directory is not one pins are made in or trusted from.
#[derive(Debug, thiserror::Error)]
enum NotRootOnly {
    /// A file, or a symlink.
    #[error("is not a directory")]
    NotADirectory,
    /// Another user owns it, or may write it.
    #[error("is owned by uid {uid} with mode {:04o}: only root may write where pins live", .mode & 0o7777)]
    Writable { uid: u32, mode: u32 },
}

/// Whether `m` is a directory (not a symlink) owned by root that no one
/// else may write: the only kind pins are made in or trusted from.
fn root_only_dir(m: &std::fs::Metadata) -> Result<(), NotRootOnly> {
    if !m.is_dir() {
        return Err(NotRootOnly::NotADirectory);
    }
    root_only(m.uid(), m.mode())
}

/// Whether a directory of owner `uid` and `mode` is root's alone to write.
fn root_only(uid: u32, mode: u32) -> Result<(), NotRootOnly> {
    if uid != 0 || mode & 0o022 != 0 {
        return Err(NotRootOnly::Writable { uid, mode });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pins directory another user may write is refused in the words
    /// the pin errors give.
    #[test]
    fn a_directory_others_may_write_is_refused_by_kind() {
        assert!(root_only(0, 0o40700).is_ok());
        let e = root_only(1000, 0o40700).unwrap_err();
        assert!(
            matches!(e, NotRootOnly::Writable { uid: 1000, .. }),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "is owned by uid 1000 with mode 0700: only root may write where pins live"
        );
        assert_eq!(
            root_only(0, 0o40777).unwrap_err().to_string(),
            "is owned by uid 0 with mode 0777: only root may write where pins live"
        );
        assert_eq!(NotRootOnly::NotADirectory.to_string(), "is not a directory");
    }

    /// The pins' directory is named by the hash of the object this binary
    /// holds (another object, another name), not of some other build's.
    #[cfg(selfheal_ebpf)]
    #[test]
    fn the_pins_are_named_by_this_object() {
        let fnv = |bytes: &[u8]| {
            bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
            })
        };
        let object = crate::ebpf::loader::OBJECT;
        assert_eq!(OBJECT_HASH, format!("{:016x}", fnv(object)));
        let mut other = object.to_vec();
        other[0] ^= 1;
        assert_ne!(fnv(&other), fnv(object));
        assert_eq!(
            pins_under(Path::new("/b")),
            Path::new(&format!("/b/iter-{:016x}", fnv(object)))
        );
    }
}
