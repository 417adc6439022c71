//! The procfs root every `/proc` path of the library is built from. The
//! system's is `/proc` ([`ProcRoot::default`]); a test points one at a
//! directory it made (a made-up `PID/stat`, `PID/fd/N` links, …) and runs a
//! real collector over it. Files the `procfs` crate parses are read through
//! [`ProcRoot::process`], which hands procfs this root.

use std::path::{Path, PathBuf};

/// Where procfs is mounted: `/proc`, or a fixture directory in tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcRoot {
    root: PathBuf,
}

impl Default for ProcRoot {
    /// The system's procfs, `/proc`.
    fn default() -> Self {
        Self::at("/proc")
    }
}

impl ProcRoot {
    /// A procfs root at `root` (a test's fixture tree).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root itself.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `ROOT/NAME`: a file of procfs itself (`sys/kernel/random/boot_id`).
    pub fn file(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// `ROOT/PID`: a process's directory.
    pub fn pid(&self, pid: u32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// `ROOT/PID/NAME`: a file of a process (`status`, `ns/net`, `fd/3`).
    pub fn of_pid(&self, pid: u32, name: &str) -> PathBuf {
        self.pid(pid).join(name)
    }

    /// The inode of `ROOT/PID/ns/KIND` (`pid`, `net`): which namespace of
    /// that kind the process is in. Another user's needs `CAP_SYS_PTRACE`.
    pub fn namespace(&self, pid: u32, kind: &str) -> std::io::Result<u64> {
        inode_of(&self.of_pid(pid, &format!("ns/{kind}")))
    }

    /// The inode of `ROOT/self/ns/KIND`: which namespace of that kind
    /// this process is in.
    pub fn own_namespace(&self, kind: &str) -> std::io::Result<u64> {
        inode_of(&self.of_self(&format!("ns/{kind}")))
    }

    /// `ROOT/self/NAME`: a file of this process.
    pub fn of_self(&self, name: &str) -> PathBuf {
        self.root.join("self").join(name)
    }

    /// `ROOT/thread-self/NAME`: a file of the calling thread.
    pub fn of_thread_self(&self, name: &str) -> PathBuf {
        self.root.join("thread-self").join(name)
    }

    /// The process `pid` as the `procfs` crate reads it, under this root.
    pub fn process(&self, pid: u32) -> procfs::ProcResult<procfs::process::Process> {
        procfs::process::Process::new_with_root(self.pid(pid))
    }

    /// `pid`'s `stat` as the `procfs` crate parses it, read from its main
    /// thread's file (`ROOT/PID/task/PID/stat`) in one `read`
    /// ([`read_whole`]). The fields a process table uses (parent, name,
    /// state, flags, start time, thread count) are the process's either
    /// way; the process's own file has the kernel sum every thread's times
    /// and faults first, which a process of many threads makes several
    /// times dearer. Times and faults here are the main thread's. Where
    /// the main thread's file is missing (a fixture that made only
    /// `PID/stat`), `ROOT/PID/stat`.
    pub fn stat(&self, pid: u32) -> procfs::ProcResult<procfs::process::Stat> {
        use procfs::FromRead as _;
        let mut buf = [0u8; 2048];
        let mut more = Vec::new();
        let text = match read_whole(
            &self.of_pid(pid, &format!("task/{pid}/stat")),
            &mut buf,
            &mut more,
        ) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                read_whole(&self.of_pid(pid, "stat"), &mut buf, &mut more)?
            }
            Err(e) => return Err(e.into()),
        };
        procfs::process::Stat::from_read(text)
    }

    /// Every process under this root, as the `procfs` crate lists them.
    pub fn all_processes(&self) -> procfs::ProcResult<procfs::process::ProcessesIter> {
        procfs::process::all_processes_with_root(&self.root)
    }
}

/// The whole of the small procfs file at `path`, read into `buf` in one
/// `read` where it fits (procfs's `stat`, `status` and `cgroup` hand over
/// their whole text in the first `read` whose buffer holds it, so a short
/// read is the end), into `more` past `buf`'s size. No size probe
/// (`statx`, `lseek`) and no second `read` for the end, which
/// `std::fs::read` spends on every file.
pub fn read_whole<'b>(
    path: &Path,
    buf: &'b mut [u8],
    more: &'b mut Vec<u8>,
) -> std::io::Result<&'b [u8]> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let len = read_short(&mut file, buf)?;
    if len < buf.len() {
        return Ok(&buf[..len]);
    }
    more.clear();
    more.extend_from_slice(buf);
    file.read_to_end(more)?;
    Ok(more)
}

/// The inode number of the file at `path` (a namespace file's names the
/// namespace).
fn inode_of(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map(|m| m.ino())
}

/// Reads `file` into `buf` until its end, a short read (procfs's seq
/// files hand over their whole text in one read when the buffer holds it,
/// so a short read is the end) or a full buffer: the length read.
pub fn read_short(file: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len < buf.len() {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(len)
}

/// The socket inode an fd link's target names (`socket:[inode]`, parsed by
/// procfs); `None` for anything else.
pub fn socket_inode_of_target(target: &str) -> Option<u64> {
    use std::str::FromStr as _;
    match procfs::process::FDTarget::from_str(target) {
        Ok(procfs::process::FDTarget::Socket(inode)) => Some(inode),
        _ => None,
    }
}

/// The socket inode the fd link at `link` (`/proc/PID/fd/N`) names; `None`
/// for anything else or a link gone. Reading the link calls nothing of the
/// file's own filesystem (no `fstat`, which a FUSE server could leave
/// unanswered).
pub fn socket_inode_of_link(link: &Path) -> Option<u64> {
    socket_inode_of_target(&std::fs::read_link(link).ok()?.to_string_lossy())
}

/// The running kernel's `(major, minor)` version (`/proc/sys/kernel/osrelease`
/// through the `procfs` crate), or `None` where it cannot be read.
pub fn kernel_version() -> Option<(u8, u8)> {
    procfs::sys::kernel::Version::current()
        .ok()
        .map(|v| (v.major, v.minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process's `stat` read from its main thread's file says what its
    /// own file says of the fields a table uses (this process, with a
    /// second thread running); a fixture with only `PID/stat` is read
    /// there; a gone process is an error.
    #[test]
    fn a_stat_from_the_main_thread_is_the_process_s() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || stopped.recv());
        let pid = std::process::id();
        let own = ProcRoot::default().process(pid).unwrap().stat().unwrap();
        let main = ProcRoot::default().stat(pid).unwrap();
        stop.send(()).unwrap();
        let _ = worker.join();
        assert!(own.num_threads >= 2, "{}", own.num_threads);
        assert_eq!(
            (
                main.pid,
                main.ppid,
                &main.comm,
                main.flags,
                main.starttime,
                main.num_threads
            ),
            (
                own.pid,
                own.ppid,
                &own.comm,
                own.flags,
                own.starttime,
                own.num_threads
            )
        );
        let dir = std::env::temp_dir().join(format!("selfheal-stat-fixture-{pid}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("42")).unwrap();
        let zeros = |n: usize| vec!["0"; n].join(" ");
        let line = format!("42 (a (b) c) S 7 {} 123 {}\n", zeros(17), zeros(30));
        std::fs::write(dir.join("42/stat"), line).unwrap();
        let root = ProcRoot::at(&dir);
        let fixture = root.stat(42);
        let gone = root.stat(43);
        let _ = std::fs::remove_dir_all(&dir);
        let fixture = fixture.unwrap();
        assert_eq!(
            (fixture.ppid, fixture.comm.as_str(), fixture.starttime),
            (7, "a (b) c", 123)
        );
        assert!(gone.is_err());
    }

    /// A file larger than the buffer is read whole; one smaller is read
    /// into the buffer.
    #[test]
    fn read_whole_reads_past_the_buffer() {
        let path = std::env::temp_dir().join(format!("selfheal-read-whole-{}", std::process::id()));
        let text: Vec<u8> = (0..10_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        std::fs::write(&path, &text).unwrap();
        let (mut buf, mut more) = ([0u8; 2048], Vec::new());
        let big = read_whole(&path, &mut buf, &mut more).map(<[u8]>::to_vec);
        std::fs::write(&path, &text[..100]).unwrap();
        let (mut buf, mut more) = ([0u8; 2048], Vec::new());
        let small = read_whole(&path, &mut buf, &mut more).map(<[u8]>::to_vec);
        let _ = std::fs::remove_file(&path);
        assert_eq!(big.unwrap(), text);
        assert_eq!(small.unwrap(), &text[..100]);
    }

    #[test]
    fn paths_are_built_under_the_root() {
        let sys = ProcRoot::default();
        assert_eq!(sys.of_pid(42, "ns/net"), Path::new("/proc/42/ns/net"));
        assert_eq!(sys.of_self("fdinfo/7"), Path::new("/proc/self/fdinfo/7"));
        assert_eq!(
            sys.of_thread_self("sched"),
            Path::new("/proc/thread-self/sched")
        );
        assert_eq!(
            sys.file("sys/kernel/random/boot_id"),
            Path::new("/proc/sys/kernel/random/boot_id")
        );
        let fake = ProcRoot::at("/tmp/fake");
        assert_eq!(fake.pid(7), Path::new("/tmp/fake/7"));
    }
}
