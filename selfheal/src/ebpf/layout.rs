//! Kernel struct layout the eBPF programs need, read from the running
//! kernel's BTF (`/sys/kernel/btf/vmlinux`).
//!
//! Rust eBPF programs get no CO-RE field relocations, so instead of compiling
//! one kernel's offsets in, the loader looks up the handful it needs here and
//! hands them to the programs as read-only globals before loading.

use std::path::Path;

use btf_rs::{Btf, Type};

/// Offsets and signatures the programs depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLayout {
    /// `offsetof(struct sock, sk_socket)`.
    pub sk_socket: u64,
    /// From `struct socket *` to `i_ino` of the inode allocated with it
    /// (`struct socket_alloc`).
    pub socket_ino: u64,
    /// `offsetof(struct sock, sk_protocol)`, when it is a whole `u16`
    /// (Linux 5.6+); `None` when it is a bitfield.
    pub sk_protocol: Option<u64>,
    /// Index of `flags` among `tcp_recvmsg`'s parameters.
    pub recvmsg_flags_arg: u64,
    /// Index of `nonblock` among `tcp_recvmsg`'s parameters (before 5.19).
    pub recvmsg_nonblock_arg: Option<u64>,
    /// `offsetof(struct pt_regs, orig_ax)` and `offsetof(struct pt_regs, di)`:
    /// where a sleeping thread's syscall number and first argument are saved
    /// (x86_64).
    pub regs_syscall: u64,
    pub regs_arg0: u64,
    /// `offsetof(struct pt_regs, si)`: the second argument.
    pub regs_arg1: u64,
    /// The `task_struct` fields the task iterator reads, or why this
    /// kernel's BTF lacks one (the tracer needs none of them).
    pub task: Result<TaskLayout, LayoutError>,
    /// The socket and `tcp_sock` fields the file iterator reads, or why
    /// this kernel's BTF lacks one (then sock_diag reads the sockets).
    pub tcp: Result<TcpLayout, LayoutError>,
}

/// Offsets of what the file iterator reads of a TCP socket (the kernel's
/// `bpf_sock_from_file` finds a file's `struct socket`): from it to the
/// `struct sock`, and within that (a `tcp_sock` begins with its `inet_connection_sock`,
/// which begins with its `sock`, which begins with its `sock_common`, so
/// every offset here is from the `struct sock *`). What the kernel's
/// `tcp_get_info` and `inet_sk_diag_fill` read for sock_diag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpLayout {
    /// `socket.sk`.
    pub socket_sk: u64,
    /// `sock_common`: `skc_family`, `skc_state`, `skc_num` (local port,
    /// host order), `skc_dport` (network order), `skc_rcv_saddr`,
    /// `skc_daddr`, `skc_v6_rcv_saddr`, `skc_v6_daddr`, `skc_cookie`,
    /// and `skc_net` → `net.ns.inum`.
    pub family: u64,
    pub state: u64,
    pub num: u64,
    pub dport: u64,
    pub rcv_saddr: u64,
    pub daddr: u64,
    pub v6_rcv_saddr: u64,
    pub v6_daddr: u64,
    pub cookie: u64,
    pub net: u64,
    pub net_inum: u64,
    /// `sock.sk_type`, `sock.sk_protocol`, `sock.sk_uid`.
    pub sk_type: u64,
    pub protocol: u64,
    pub uid: u64,
    /// `inet_connection_sock`: `icsk_rto`, `icsk_retransmits`,
    /// `icsk_backoff`, `icsk_probes_out`, `icsk_ack.lrcvtime`.
    pub rto: u64,
    pub retransmits: u64,
    pub backoff: u64,
    pub probes: u64,
    pub lrcvtime: u64,
    /// `tcp_sock`: `lsndtime`, `rcv_tstamp`, `srtt_us`, `packets_out`,
    /// `rcv_nxt`, `copied_seq`, `write_seq`, `snd_una`, `bytes_received`,
    /// `bytes_acked`, `data_segs_in`, `data_segs_out`.
    pub lsndtime: u64,
    pub rcv_tstamp: u64,
    pub srtt_us: u64,
    pub packets_out: u64,
    pub rcv_nxt: u64,
    pub copied_seq: u64,
    pub write_seq: u64,
    pub snd_una: u64,
    pub bytes_received: u64,
    pub bytes_acked: u64,
    pub data_segs_in: u64,
    pub data_segs_out: u64,
}

impl TcpLayout {
    /// The `inet_connection_sock` and `tcp_sock` fields the file iterator
    /// reads behind a `struct sock`: each one's offset and size (the size
    /// of the record field it fills).
    fn sock_fields(&self) -> [(u64, u64); 17] {
        [
            (self.rto, 4),
            (self.retransmits, 1),
            (self.backoff, 1),
            (self.probes, 1),
            (self.lrcvtime, 4),
            (self.lsndtime, 4),
            (self.rcv_tstamp, 4),
            (self.srtt_us, 4),
            (self.packets_out, 4),
            (self.rcv_nxt, 4),
            (self.copied_seq, 4),
            (self.write_seq, 4),
            (self.snd_una, 4),
            (self.bytes_received, 8),
            (self.bytes_acked, 8),
            (self.data_segs_in, 4),
            (self.data_segs_out, 4),
        ]
    }

    /// The windows the file iterator reads those fields in: `(start,
    /// length)`, each start 8-aligned, each at most `TCP_WINDOW` bytes,
    /// every field inside one; `None` where they take more than
    /// `TCP_WINDOWS` windows or a field is not aligned to its size (the
    /// program's stack reads must be), and each field is then read alone.
    pub fn windows(&self) -> Option<Vec<(u64, u64)>> {
        use selfheal_common::{TCP_WINDOW, TCP_WINDOWS};
        let mut fields = self.sock_fields();
        fields.sort_unstable();
        let mut windows: Vec<(u64, u64)> = Vec::new();
        for (off, size) in fields {
            if off % size != 0 {
                return None;
            }
            let end = off + size;
            match windows.last_mut() {
                Some((start, len)) if end - *start <= TCP_WINDOW as u64 => {
                    *len = (*len).max(end - *start);
                }
                _ => windows.push((off & !7, end - (off & !7))),
            }
        }
        (windows.len() <= TCP_WINDOWS).then_some(windows)
    }

    fn from_btf(btf: &Btf) -> Result<Self, LayoutError> {
        let at = |s: &str, path: &[&str]| member_path(btf, s, path);
        let common = |m: &str| at("sock", &["__sk_common", m]);
        let icsk = |path: &[&str]| at("inet_connection_sock", path);
        let tcp = |m: &str| at("tcp_sock", &[m]);
        Ok(Self {
            socket_sk: at("socket", &["sk"])?,
            family: common("skc_family")?,
            state: common("skc_state")?,
            num: common("skc_num")?,
            dport: common("skc_dport")?,
            rcv_saddr: common("skc_rcv_saddr")?,
            daddr: common("skc_daddr")?,
            v6_rcv_saddr: common("skc_v6_rcv_saddr")?,
            v6_daddr: common("skc_v6_daddr")?,
            cookie: common("skc_cookie")?,
            net: common("skc_net")?,
            net_inum: at("net", &["ns", "inum"])?,
            sk_type: at("sock", &["sk_type"])?,
            protocol: at("sock", &["sk_protocol"])?,
            uid: at("sock", &["sk_uid"])?,
            rto: icsk(&["icsk_rto"])?,
            retransmits: icsk(&["icsk_retransmits"])?,
            backoff: icsk(&["icsk_backoff"])?,
            probes: icsk(&["icsk_probes_out"])?,
            lrcvtime: icsk(&["icsk_ack", "lrcvtime"])?,
            lsndtime: tcp("lsndtime")?,
            rcv_tstamp: tcp("rcv_tstamp")?,
            srtt_us: tcp("srtt_us")?,
            packets_out: tcp("packets_out")?,
            rcv_nxt: tcp("rcv_nxt")?,
            copied_seq: tcp("copied_seq")?,
            write_seq: tcp("write_seq")?,
            snd_una: tcp("snd_una")?,
            bytes_received: tcp("bytes_received")?,
            bytes_acked: tcp("bytes_acked")?,
            data_segs_in: tcp("data_segs_in")?,
            data_segs_out: tcp("data_segs_out")?,
        })
    }
}

/// Offsets of what the task iterators read: in `struct task_struct`, and
/// from a `struct file` to its inode's mode and number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLayout {
    /// `tgid`.
    pub tgid: u64,
    /// `pid`: the thread id.
    pub pid: u64,
    /// `__state` (`state` before Linux 5.14, a `long` whose low 32 bits are
    /// read).
    pub state: u64,
    /// `exit_state`.
    pub exit_state: u64,
    /// `se.sum_exec_runtime`.
    pub runtime: u64,
    /// `se.exec_start`.
    pub exec_start: u64,
    /// What `task_cpu()` reads: `thread_info.cpu` (or `cpu` where the
    /// thread_info has none).
    pub cpu: u64,
    /// `comm`.
    pub comm: u64,
    /// `file.f_inode`, `inode.i_mode`, `inode.i_ino`.
    pub file_inode: u64,
    pub inode_mode: u64,
    pub inode_ino: u64,
    /// What the task iterator reads of a process from its leader, where
    /// the kernel's BTF has every field (`None`: procfs is read instead).
    pub head: Option<HeadLayout>,
}

/// Offsets of what procfs's `stat` and `status` say of a process that the
/// task iterator reads from its leader's `task_struct`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadLayout {
    /// `task_struct.real_parent`, `task_struct.real_cred`, `cred.uid`.
    pub real_parent: u64,
    pub real_cred: u64,
    pub cred_uid: u64,
    /// `task_struct.start_boottime`.
    pub start: u64,
    /// `task_struct.thread_pid`, `pid.level`.
    pub thread_pid: u64,
    pub pid_level: u64,
    /// `pid.numbers[0].nr`, and the size of each of `numbers`.
    pub pid_nr: u64,
    pub upid_size: u64,
}

impl HeadLayout {
    fn from_btf(btf: &Btf) -> Result<Self, LayoutError> {
        let whole = |s: &str, m: &str| member_offset(btf, s, m)?.whole(&format!("{s}.{m}"));
        let upid_size = named_struct(btf, "upid")?.size() as u64;
        if upid_size == 0 {
            return Err(LayoutError::Unexpected {
                what: "struct upid has no size".into(),
            });
        }
        Ok(Self {
            real_parent: whole("task_struct", "real_parent")?,
            real_cred: whole("task_struct", "real_cred")?,
            cred_uid: whole("cred", "uid")?,
            start: whole("task_struct", "start_boottime")?,
            thread_pid: whole("task_struct", "thread_pid")?,
            pid_level: whole("pid", "level")?,
            pid_nr: whole("pid", "numbers")? + whole("upid", "nr")?,
            upid_size,
        })
    }
}

impl TaskLayout {
    fn from_btf(btf: &Btf) -> Result<Self, LayoutError> {
        let whole = |s: &str, m: &str| member_offset(btf, s, m)?.whole(&format!("{s}.{m}"));
        let task = |member: &str| whole("task_struct", member);
        let entity = |member: &str| whole("sched_entity", member);
        let state = task("__state").or_else(|_| task("state"))?;
        let se = task("se")?;
        let cpu = match whole("thread_info", "cpu") {
            Ok(cpu) => task("thread_info")? + cpu,
            Err(_) => task("cpu")?,
        };
        Ok(Self {
            tgid: task("tgid")?,
            pid: task("pid")?,
            state,
            exit_state: task("exit_state")?,
            runtime: se + entity("sum_exec_runtime")?,
            exec_start: se + entity("exec_start")?,
            cpu,
            comm: task("comm")?,
            file_inode: whole("file", "f_inode")?,
            inode_mode: whole("inode", "i_mode")?,
            inode_ino: whole("inode", "i_ino")?,
            head: HeadLayout::from_btf(btf).ok(),
        })
    }
}

/// Why the layout could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The kernel exposes no BTF (CONFIG_DEBUG_INFO_BTF off) or it is unreadable.
    #[error("cannot read kernel BTF at {path}: {reason}")]
    NoBtf { path: String, reason: String },
    /// A type, member or function the programs need is missing.
    #[error("kernel BTF has no {what}")]
    Missing { what: String },
    /// A member has an unexpected shape.
    #[error("kernel BTF: {what}")]
    Unexpected { what: String },
}

/// The running kernel's BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

impl KernelLayout {
    /// Reads the layout from the BTF file at `path`.
    pub fn from_btf_file(path: &Path) -> Result<Self, LayoutError> {
        let no_btf = |reason: String| LayoutError::NoBtf {
            path: path.display().to_string(),
            reason,
        };
        // A handful of lookups: the mmap backend skips indexing all ~100k
        // types up front. Where the file cannot be mapped, read it.
        match Btf::from_file_with_backend(path, btf_rs::Backend::Mmap) {
            Ok(btf) => Self::from_btf(&btf),
            Err(_) => {
                let bytes = std::fs::read(path).map_err(|e| no_btf(e.to_string()))?;
                Self::from_btf_bytes(&bytes).map_err(|e| match e {
                    LayoutError::NoBtf { reason, .. } => no_btf(reason),
                    other => other,
                })
            }
        }
    }

    /// Reads the layout from BTF already in memory (parsing from a slice is
    /// several times faster than btf-rs's seeking file reader).
    pub fn from_btf_bytes(bytes: &[u8]) -> Result<Self, LayoutError> {
        let btf = Btf::from_bytes(bytes).map_err(|e| LayoutError::NoBtf {
            path: "(memory)".into(),
            reason: e.to_string(),
        })?;
        Self::from_btf(&btf)
    }

    fn from_btf(btf: &Btf) -> Result<Self, LayoutError> {
        let sk_socket = member_offset(btf, "sock", "sk_socket")?.whole("sock.sk_socket")?;
        let socket = member_offset(btf, "socket_alloc", "socket")?.whole("socket_alloc.socket")?;
        let vfs_inode =
            member_offset(btf, "socket_alloc", "vfs_inode")?.whole("socket_alloc.vfs_inode")?;
        let i_ino = member_offset(btf, "inode", "i_ino")?.whole("inode.i_ino")?;
        let sk_protocol = member_offset(btf, "sock", "sk_protocol")?
            .whole("sock.sk_protocol")
            .ok();
        let params = func_params(btf, "tcp_recvmsg")?;
        let index = |name: &str| params.iter().position(|p| p == name).map(|i| i as u64);
        let recvmsg_flags_arg = index("flags").ok_or_else(|| LayoutError::Missing {
            what: format!("parameter `flags` of tcp_recvmsg (has {params:?})"),
        })?;
        let regs_syscall = member_offset(btf, "pt_regs", "orig_ax")?.whole("pt_regs.orig_ax")?;
        let regs_arg0 = member_offset(btf, "pt_regs", "di")?.whole("pt_regs.di")?;
        let regs_arg1 = member_offset(btf, "pt_regs", "si")?.whole("pt_regs.si")?;
        Ok(Self {
            regs_syscall,
            regs_arg0,
            regs_arg1,
            sk_socket,
            socket_ino: vfs_inode - socket + i_ino,
            sk_protocol,
            recvmsg_flags_arg,
            recvmsg_nonblock_arg: index("nonblock"),
            task: TaskLayout::from_btf(btf),
            tcp: TcpLayout::from_btf(btf),
        })
    }
}

/// A member's position: byte offset, and bit size when it is a bitfield.
struct Position {
    bits: u64,
    bitfield: Option<u32>,
}

impl Position {
    fn whole(&self, what: &str) -> Result<u64, LayoutError> {
        match self.bitfield {
            Some(size) if size != 0 => Err(LayoutError::Unexpected {
                what: format!("{what} is a {size}-bit bitfield"),
            }),
            _ if !self.bits.is_multiple_of(8) => Err(LayoutError::Unexpected {
                what: format!("{what} is not byte-aligned"),
            }),
            _ => Ok(self.bits / 8),
        }
    }
}

/// Strips typedefs and qualifiers.
fn resolve(btf: &Btf, mut ty: Type) -> Type {
    for _ in 0..32 {
        match &ty {
            Type::Typedef(_)
            | Type::Const(_)
            | Type::Volatile(_)
            | Type::Restrict(_)
            | Type::TypeTag(_) => match ty.as_btf_type().map(|t| btf.resolve_chained_type(t)) {
                Some(Ok(next)) => ty = next,
                _ => return ty,
            },
            _ => return ty,
        }
    }
    ty
}

fn named_struct(btf: &Btf, name: &str) -> Result<btf_rs::Struct, LayoutError> {
    btf.resolve_types_by_name(name)
        .ok()
        .into_iter()
        .flatten()
        .find_map(|t| match t {
            Type::Struct(s) if !s.members.is_empty() => Some(s),
            _ => None,
        })
        .ok_or_else(|| LayoutError::Missing {
            what: format!("struct {name}"),
        })
}

fn member_offset(btf: &Btf, struct_name: &str, member: &str) -> Result<Position, LayoutError> {
    let s = named_struct(btf, struct_name)?;
    find_member(btf, &s, member, 0, 0).ok_or_else(|| LayoutError::Missing {
        what: format!("member {struct_name}.{member}"),
    })
}

/// The byte offset of `path` (a member, then members of its type in
/// turn) from the start of `struct_name`: `["icsk_ack", "lrcvtime"]` is
/// `offsetof(struct inet_connection_sock, icsk_ack.lrcvtime)`. Every step
/// must be a whole, byte-aligned member.
fn member_path(btf: &Btf, struct_name: &str, path: &[&str]) -> Result<u64, LayoutError> {
    let mut s = named_struct(btf, struct_name)?;
    let mut off = 0;
    let mut walked = struct_name.to_string();
    for (i, name) in path.iter().enumerate() {
        walked = format!("{walked}.{name}");
        let missing = || LayoutError::Missing {
            what: format!("member {walked}"),
        };
        let (pos, ty) = find_member_typed(btf, &s, name, 0, 0).ok_or_else(missing)?;
        off += pos.whole(&walked)?;
        if i + 1 < path.len() {
            match ty.map(|t| resolve(btf, t)) {
                Some(Type::Struct(inner) | Type::Union(inner)) => s = inner,
                _ => {
                    return Err(LayoutError::Unexpected {
                        what: format!("{walked} is not a struct"),
                    });
                }
            }
        }
    }
    Ok(off)
}

/// [`find_member`], with the member's type.
fn find_member_typed(
    btf: &Btf,
    s: &btf_rs::Struct,
    name: &str,
    base: u64,
    depth: u32,
) -> Option<(Position, Option<Type>)> {
    if depth > 8 {
        return None;
    }
    for m in &s.members {
        let bits = base + u64::from(m.bit_offset());
        let member_name = btf.resolve_name(m).unwrap_or_default();
        let ty = btf.resolve_chained_type(m).ok();
        if member_name == name {
            let pos = Position {
                bits,
                bitfield: m.bitfield_size(),
            };
            return Some((pos, ty));
        }
        if member_name.is_empty()
            && let Some(Type::Struct(inner) | Type::Union(inner)) = ty.map(|t| resolve(btf, t))
            && let Some(found) = find_member_typed(btf, &inner, name, bits, depth + 1)
        {
            return Some(found);
        }
    }
    None
}

/// Depth-first search through anonymous structs and unions.
fn find_member(
    btf: &Btf,
    s: &btf_rs::Struct,
    name: &str,
    base: u64,
    depth: u32,
) -> Option<Position> {
    if depth > 8 {
        return None;
    }
    for m in &s.members {
        let bits = base + u64::from(m.bit_offset());
        let member_name = btf.resolve_name(m).unwrap_or_default();
        if member_name == name {
            return Some(Position {
                bits,
                bitfield: m.bitfield_size(),
            });
        }
        if member_name.is_empty() {
            let inner = btf.resolve_chained_type(m).ok().map(|t| resolve(btf, t));
            if let Some(Type::Struct(inner) | Type::Union(inner)) = inner
                && let Some(p) = find_member(btf, &inner, name, bits, depth + 1)
            {
                return Some(p);
            }
        }
    }
    None
}

fn func_params(btf: &Btf, func: &str) -> Result<Vec<String>, LayoutError> {
    let missing = || LayoutError::Missing {
        what: format!("function {func}"),
    };
    let f = btf
        .resolve_types_by_name(func)
        .map_err(|_| missing())?
        .into_iter()
        .find_map(|t| match t {
            Type::Func(f) => Some(f),
            _ => None,
        })
        .ok_or_else(missing)?;
    match btf.resolve_chained_type(&f) {
        Ok(Type::FuncProto(proto)) => Ok(proto
            .parameters
            .iter()
            .map(|p| btf.resolve_name(p).unwrap_or_default())
            .collect()),
        _ => Err(LayoutError::Unexpected {
            what: format!("{func} has no prototype"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's layout, where it has BTF. Values are checked for
    /// plausibility only: they differ between kernels.
    #[test]
    fn reads_the_running_kernels_layout() {
        let path = Path::new(VMLINUX_BTF);
        if !path.exists() {
            eprintln!("skipped: {VMLINUX_BTF} is missing (kernel without BTF)");
            return;
        }
        let layout = KernelLayout::from_btf_file(path).expect("layout");
        assert!(
            layout.sk_socket > 0 && layout.sk_socket < 4096,
            "{layout:?}"
        );
        assert!(
            layout.socket_ino > 0 && layout.socket_ino < 4096,
            "{layout:?}"
        );
        assert!(layout.sk_protocol.is_some(), "{layout:?}");
        assert!(matches!(layout.recvmsg_flags_arg, 3 | 4), "{layout:?}");
        // x86_64's pt_regs is ABI: orig_ax at 120, di at 112.
        assert_eq!(
            (layout.regs_syscall, layout.regs_arg0, layout.regs_arg1),
            (120, 112, 104)
        );
        let task = layout.task.expect("task_struct layout");
        for off in [
            task.tgid,
            task.pid,
            task.state,
            task.exit_state,
            task.runtime,
            task.exec_start,
            task.cpu,
            task.comm,
        ] {
            assert!(off < 16384, "{task:?}");
        }
        // The process's head from its leader: every field found, and a
        // `struct upid` of a number and a namespace pointer.
        let head = task.head.expect("the head's fields");
        assert_eq!(head.upid_size, 16, "{head:?}");
        assert!(head.real_parent < 16384 && head.start < 16384, "{head:?}");
        let tcp = layout.tcp.expect("tcp_sock layout");
        // `struct sock` begins with its `sock_common`, whose first member
        // is the address pair: the v4 addresses are at its very start.
        assert_eq!((tcp.daddr, tcp.rcv_saddr), (0, 4), "{tcp:?}");
        assert!(
            tcp.lsndtime > tcp.rto && tcp.data_segs_out < 8192,
            "{tcp:?}"
        );
        // The file iterator reads the tcp_sock fields in a few windows.
        assert!(tcp.windows().is_some_and(|w| w.len() <= 3), "{tcp:?}");
    }

    #[test]
    fn missing_btf_is_an_error_not_a_panic() {
        let err = KernelLayout::from_btf_file(Path::new("/nonexistent/vmlinux")).unwrap_err();
        assert!(matches!(err, LayoutError::NoBtf { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/vmlinux"));
    }

    #[test]
    fn garbage_btf_is_an_error_not_a_panic() {
        let dir = std::env::temp_dir().join(format!("selfheal-btf-{}", std::process::id()));
        std::fs::write(&dir, b"\x9f\xeb\x01\x00garbage").unwrap();
        let err = KernelLayout::from_btf_file(&dir);
        let _ = std::fs::remove_file(&dir);
        assert!(err.is_err());
    }

    /// Linux 6.18's offsets (x86_64, as this kernel's BTF has them).
    fn linux_6_18() -> TcpLayout {
        TcpLayout {
            socket_sk: 24,
            family: 16,
            state: 18,
            num: 14,
            dport: 12,
            rcv_saddr: 4,
            daddr: 0,
            v6_rcv_saddr: 72,
            v6_daddr: 56,
            cookie: 88,
            net: 48,
            net_inum: 184,
            sk_type: 534,
            protocol: 532,
            uid: 528,
            rto: 1184,
            retransmits: 1249,
            backoff: 1251,
            probes: 1253,
            lrcvtime: 1264,
            lsndtime: 1584,
            rcv_tstamp: 1724,
            srtt_us: 1680,
            packets_out: 1684,
            rcv_nxt: 1664,
            copied_seq: 1464,
            write_seq: 1576,
            snd_una: 1672,
            bytes_received: 1752,
            bytes_acked: 1824,
            data_segs_in: 1764,
            data_segs_out: 1540,
        }
    }

    /// Every field in exactly the window that holds it, each window
    /// 8-aligned and within its bound: three reads for 17 fields here.
    #[test]
    fn the_tcp_fields_fit_three_windows_on_linux_6_18() {
        use selfheal_common::TCP_WINDOW;
        let t = linux_6_18();
        let w = t.windows().expect("windows");
        assert_eq!(w, [(1184, 84), (1464, 124), (1664, 168)]);
        for (off, size) in t.sock_fields() {
            let holding = w
                .iter()
                .filter(|(s, l)| off >= *s && off + size <= s + l)
                .count();
            assert!(holding >= 1, "field at {off} in no window: {w:?}");
        }
        assert!(
            w.iter()
                .all(|(s, l)| s % 8 == 0 && *l as usize <= TCP_WINDOW)
        );
    }

    /// Fields spread wider than the windows allow, or one not aligned to
    /// its size, leave each field to its own read.
    #[test]
    fn fields_that_do_not_fit_the_windows_are_read_one_by_one() {
        let mut t = linux_6_18();
        t.bytes_acked = 4000;
        assert_eq!(t.windows().map(|w| w.len()), Some(4));
        t.rcv_tstamp = 2500;
        assert_eq!(t.windows(), None, "five windows");
        let mut t = linux_6_18();
        t.rto = 1186;
        assert_eq!(t.windows(), None);
    }
}
