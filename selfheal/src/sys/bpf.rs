//! The `bpf(2)` commands aya 0.14 does not offer: a task iterator linked to
//! one process (`BPF_LINK_CREATE` with the iterator's `task.pid_fd`), the
//! iterator's file (`BPF_ITER_CREATE`), a pinned object by path
//! (`BPF_OBJ_GET`), and a program's name and type
//! (`BPF_OBJ_GET_INFO_BY_FD`), to check what a pin holds before it is run.

use std::{
    ffi::CString,
    fs::File,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    path::Path,
};

/// `enum bpf_cmd` values used here.
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
/// `enum bpf_attach_type`: `BPF_TRACE_ITER`.
const BPF_TRACE_ITER: u32 = 28;
/// `enum bpf_prog_type`: `BPF_PROG_TYPE_TRACING` (iterators are tracing
/// programs).
pub const BPF_PROG_TYPE_TRACING: u32 = 26;

/// `union bpf_attr`, as far as the commands here fill it: zeroed words
/// (the kernel refuses non-zero bytes past what a command reads).
#[repr(C, align(8))]
struct Attr([u32; 32]);

impl Attr {
    fn new() -> Self {
        Attr([0; 32])
    }
    fn u64_at(&mut self, word: usize, v: u64) {
        self.0[word] = v as u32;
        self.0[word + 1] = (v >> 32) as u32;
    }
}

/// `bpf(cmd, attr)` returning a new fd.
fn bpf_fd(cmd: libc::c_long, attr: &mut Attr) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a zero-initialised buffer as large as the kernel
    // reads for these commands, and stays alive for the call; its size is
    // passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut Attr,
            std::mem::size_of::<Attr>() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Links the iterator program `prog` to no process: its walk reaches
/// every task (or every task's files) of the caller's pid namespace.
pub fn link_iter_to_host(prog: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    let mut attr = Attr::new();
    attr.0[0] = prog.as_raw_fd() as u32; // prog_fd
    attr.0[1] = 0; // target_fd
    attr.0[2] = BPF_TRACE_ITER; // attach_type
    attr.0[3] = 0; // flags; no iter_info: the whole namespace
    bpf_fd(BPF_LINK_CREATE, &mut attr)
}

/// Links the iterator program `prog` to the process `pidfd` names: its
/// walk reaches that process's threads (or files) only. Linux 6.1+.
pub fn link_iter_to_process(
    prog: BorrowedFd<'_>,
    pidfd: BorrowedFd<'_>,
) -> std::io::Result<OwnedFd> {
    // `union bpf_iter_link_info`'s task member: tid, pid, pid_fd.
    let info: [u32; 3] = [0, 0, pidfd.as_raw_fd() as u32];
    let mut attr = Attr::new();
    attr.0[0] = prog.as_raw_fd() as u32; // prog_fd
    attr.0[1] = 0; // target_fd
    attr.0[2] = BPF_TRACE_ITER; // attach_type
    attr.0[3] = 0; // flags
    attr.u64_at(4, info.as_ptr() as u64); // iter_info
    attr.0[6] = std::mem::size_of_val(&info) as u32; // iter_info_len
    bpf_fd(BPF_LINK_CREATE, &mut attr)
}

/// A new file of the iterator link `link`: reading it to its end runs one
/// walk.
pub fn iter_file(link: BorrowedFd<'_>) -> std::io::Result<File> {
    let mut attr = Attr::new();
    attr.0[0] = link.as_raw_fd() as u32; // link_fd
    bpf_fd(BPF_ITER_CREATE, &mut attr).map(File::from)
}

/// The object pinned at `path` (a bpffs file), opened read-only.
pub fn obj_get(path: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut attr = Attr::new();
    attr.u64_at(0, path.as_ptr() as u64); // pathname
    attr.0[2] = 0; // bpf_fd
    attr.0[3] = 0; // file_flags (BPF_F_RDONLY is for maps)
    bpf_fd(BPF_OBJ_GET, &mut attr)
}

/// What a program fd says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgInfo {
    /// `enum bpf_prog_type`.
    pub prog_type: u32,
    /// The name it was loaded with (at most 15 bytes).
    pub name: String,
    /// The kernel's tag: a hash of its instructions.
    pub tag: [u8; 8],
}

/// The type, name and tag of the program `prog`.
pub fn prog_info(prog: BorrowedFd<'_>) -> std::io::Result<ProgInfo> {
    // `struct bpf_prog_info` up to and including `name` (offset 64, 16
    // bytes): type at 0, id at 4, tag at 8..16.
    let mut info = [0u8; 80];
    let mut attr = Attr::new();
    attr.0[0] = prog.as_raw_fd() as u32; // bpf_fd
    attr.0[1] = info.len() as u32; // info_len
    attr.u64_at(2, info.as_mut_ptr() as u64); // info
    // SAFETY: as in `bpf_fd`; the kernel writes at most `info_len` bytes
    // into `info`, which outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut Attr,
            std::mem::size_of::<Attr>() as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let name = &info[64..80];
    let name = name.split(|&b| b == 0).next().unwrap_or_default();
    let mut tag = [0u8; 8];
    tag.copy_from_slice(&info[8..16]);
    Ok(ProgInfo {
        prog_type: u32::from_ne_bytes([info[0], info[1], info[2], info[3]]),
        name: String::from_utf8_lossy(name).into_owned(),
        tag,
    })
}

/// Whether `path` is the root of (or lies in) a bpffs mount.
pub fn is_bpffs(path: &Path) -> std::io::Result<bool> {
    let s = nix::sys::statfs::statfs(path).map_err(std::io::Error::from)?;
    Ok(s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Mounts a bpffs at `path` (a directory), its root mode 0700: only root
/// reaches what is pinned there.
pub fn mount_bpffs(path: &Path) -> std::io::Result<()> {
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some("bpf"),
        path,
        Some("bpf"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0700"),
    )
    .map_err(std::io::Error::from)
}

/// The directory at `path` itself, opened `O_PATH` (its last component
/// never followed as a symlink: a symlink there is `ENOTDIR`), for
/// [`dir_fd_metadata`], [`is_bpffs_fd`] and [`mount_bpffs_on`]: what is
/// checked is what is mounted on, whatever `path` leads to later.
pub fn open_dir_nofollow(path: &Path) -> std::io::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_PATH
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// The owner and mode bits of the file `fd` is open on.
pub fn dir_fd_metadata(fd: BorrowedFd<'_>) -> std::io::Result<(u32, u32)> {
    let st = nix::sys::stat::fstat(fd).map_err(std::io::Error::from)?;
    Ok((st.st_uid, st.st_mode))
}

/// Whether the file `fd` is open on lies in a bpffs.
pub fn is_bpffs_fd(fd: BorrowedFd<'_>) -> std::io::Result<bool> {
    let s = nix::sys::statfs::fstatfs(fd).map_err(std::io::Error::from)?;
    Ok(s.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Mounts a bpffs (root mode 0700) on the directory `dir` is open on,
/// through `/proc/self/fd/N`: on that very directory, even where another
/// user may rename it or put a symlink in its place.
pub fn mount_bpffs_on(dir: BorrowedFd<'_>) -> std::io::Result<()> {
    mount_bpffs(Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())))
}

/// The kernel's tick rate (`HZ`): the jiffies the file iterator's TCP
/// stamps count in. The coarse clocks tick once a jiffy, so their
/// resolution (`clock_getres(CLOCK_MONOTONIC_COARSE)`) is `TICK_NSEC`,
/// `1 s / HZ` rounded; `None` where it is not a plausible tick (1 µs to
/// 100 ms).
pub fn kernel_hz() -> Option<u32> {
    use nix::time::{ClockId, clock_getres};
    let res = clock_getres(ClockId::CLOCK_MONOTONIC_COARSE).ok()?;
    let ns = u64::try_from(res.tv_sec())
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(u64::try_from(res.tv_nsec()).ok()?)?;
    if !(1_000..=100_000_000).contains(&ns) {
        return None;
    }
    u32::try_from((1_000_000_000 + ns / 2) / ns).ok()
}

#[cfg(test)]
mod tests {
    /// The tick rate is one the kernel can be built with: 100, 250, 300
    /// or 1000 (what `CONFIG_HZ` offers).
    #[test]
    fn the_tick_rate_is_a_kernel_config_value() {
        let hz = super::kernel_hz().expect("coarse clock resolution");
        assert!([100, 250, 300, 1000].contains(&hz), "{hz}");
    }
}
