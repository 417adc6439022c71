//! Reading another process's memory where a read that blocks can be
//! abandoned: in a reader child forked for the purpose.
//!
//! `process_vm_readv` faults the target's pages in as the target would. A
//! page of a file on a FUSE mount the target serves itself is read from its
//! server, and a server that never answers leaves the reading thread in
//! uninterruptible sleep for good (`request_wait_answer`: SIGKILL does not
//! end it). A thread in D state keeps its whole process from exiting, so
//! the read is not done by a thread of this process but by a child: it is
//! asked over a socket pair and given until a deadline; a child that has
//! not answered by then is sent SIGKILL and left (reaped later, once it
//! can exit), and the next read forks a fresh one. This process never
//! waits on it.
//!
//! [`crate::proc`] reads only private anonymous memory (checked against
//! `/proc/PID/maps` on both sides of the read), so a stuck child takes a
//! mapping replaced between that check and the read. The map itself is
//! read here too ([`Reader::read_maps`]): on kernels that read it under
//! the process's `mmap_lock`, a process holding that lock for writing
//! (an `mmap` of its own waiting on its FUSE server) makes the read wait,
//! killably: the child is then sent SIGKILL and exits.
//!
//! The child is forked from a process that may have other threads: after
//! `fork` it makes raw system calls only (no allocation, no locks): it
//! moves its socket to fd 0, closes every other fd (a stuck child must not
//! keep this process's locks, sockets or eBPF maps open), and serves
//! requests into a buffer allocated before the fork until its socket
//! closes.

use std::{
    io::{Read as _, Write as _},
    os::{fd::AsRawFd as _, unix::net::UnixStream},
    sync::Mutex,
    time::Instant,
};

use nix::{
    sys::{
        signal::{Signal, kill},
        wait::{WaitPidFlag, waitpid},
    },
    unistd::Pid,
};

/// The largest read one request may ask for (a poll set of `MAX_POLLFDS`).
pub const MAX_READ: usize = 32 << 10;

/// The largest `/proc/PID/maps` read (about 150,000 mappings).
pub const MAX_MAPS: usize = 16 << 20;

/// A request's kind (bytes 4..8): memory, the memory map, or the command
/// line (its first `len` bytes).
const KIND_MEMORY: u32 = 0;
const KIND_MAPS: u32 = 1;
const KIND_CMDLINE: u32 = 2;

/// Children sent SIGKILL while blocked, not yet reaped.
static ABANDONED: Mutex<Vec<Pid>> = Mutex::new(Vec::new());

/// Why a read gave nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadError {
    /// `process_vm_readv` failed (or read less than asked: `EFAULT`).
    Errno(nix::errno::Errno),
    /// The reader did not answer by the deadline: it was abandoned.
    Timeout,
    /// No reader could be started, or it broke off.
    Reader(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Errno(e) => write!(f, "{e}"),
            ReadError::Timeout => f.write_str("the read did not finish in time"),
            ReadError::Reader(why) => write!(f, "reader process: {why}"),
        }
    }
}

/// A reader child, started on the first read.
#[derive(Default)]
pub struct Reader {
    child: Option<(Pid, UnixStream)>,
}

impl Reader {
    /// Reads `buf.len()` bytes (at most [`MAX_READ`]) at `addr` of process
    /// `pid`, or fails by `deadline`. A short read is `EFAULT`.
    pub fn read<'b>(
        &mut self,
        pid: u32,
        addr: u64,
        buf: &'b mut [u8],
        deadline: Instant,
    ) -> Result<&'b [u8], ReadError> {
        if buf.is_empty() {
            return Ok(buf);
        }
        if buf.len() > MAX_READ {
            return Err(ReadError::Reader(format!(
                "{} bytes asked, at most {MAX_READ} read",
                buf.len()
            )));
        }
        if self.child.is_none() {
            self.child = Some(spawn().map_err(|e| ReadError::Reader(e.to_string()))?);
        }
        let (child, sock) = self.child.as_mut().expect("just started");
        let mut req = [0u8; 24];
        req[..4].copy_from_slice(&pid.to_le_bytes());
        req[4..8].copy_from_slice(&KIND_MEMORY.to_le_bytes());
        req[8..16].copy_from_slice(&addr.to_le_bytes());
        req[16..].copy_from_slice(&(buf.len() as u64).to_le_bytes());
        let child = *child;
        let answer = sock
            .write_all(&req)
            .map_err(|e| ReadError::Reader(e.to_string()))
            .and_then(|()| {
                let mut head = [0u8; 8];
                read_by(sock, &mut head, deadline)?;
                let n = i64::from_le_bytes(head);
                if n < 0 {
                    return Ok(Err(nix::errno::Errno::from_raw((-n) as i32)));
                }
                let n = (n as usize).min(buf.len());
                read_by(sock, &mut buf[..n], deadline)?;
                Ok(Ok(n))
            });
        match answer {
            Ok(Ok(n)) if n == buf.len() => Ok(&buf[..n]),
            Ok(Ok(_)) => Err(ReadError::Errno(nix::errno::Errno::EFAULT)),
            Ok(Err(e)) => Err(ReadError::Errno(e)),
            Err(e) => {
                // Stuck or broken: never asked again.
                self.child = None;
                abandon(child);
                Err(e)
            }
        }
    }

    /// `/proc/PID/maps` of `pid`, read by the reader child by `deadline`
    /// (reading it takes the process's `mmap_lock`, which a process can
    /// keep taken for writing: one `mmap` waiting on a page its FUSE
    /// server holds). At most [`MAX_MAPS`] bytes.
    pub fn read_maps(&mut self, pid: u32, deadline: Instant) -> Result<Vec<u8>, ReadError> {
        // One byte past the cap tells a map too large from one that fits.
        let text = self.read_proc_file(pid, KIND_MAPS, MAX_MAPS + 1, deadline)?;
        if text.len() > MAX_MAPS {
            return Err(ReadError::Reader(format!(
                "the memory map is larger than {} MiB",
                MAX_MAPS >> 20
            )));
        }
        Ok(text)
    }

    /// The first `cap` bytes (at most [`MAX_MAPS`]) of `/proc/PID/cmdline`
    /// of `pid`, read by the reader child by `deadline`. Reading it takes
    /// the process's `mmap_lock` as the maps do (`access_remote_vm`): a
    /// process that keeps it taken for writing makes the read wait for as
    /// long as it likes.
    pub fn read_cmdline(
        &mut self,
        pid: u32,
        cap: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, ReadError> {
        self.read_proc_file(pid, KIND_CMDLINE, cap.min(MAX_MAPS), deadline)
    }

    /// A file of `/proc/PID/` (`kind`), at most `cap` bytes of it, read by
    /// the reader child by `deadline`.
    fn read_proc_file(
        &mut self,
        pid: u32,
        kind: u32,
        cap: usize,
        deadline: Instant,
    ) -> Result<Vec<u8>, ReadError> {
        if self.child.is_none() {
            self.child = Some(spawn().map_err(|e| ReadError::Reader(e.to_string()))?);
        }
        let (child, sock) = self.child.as_mut().expect("just started");
        let child = *child;
        let mut req = [0u8; 24];
        req[..4].copy_from_slice(&pid.to_le_bytes());
        req[4..8].copy_from_slice(&kind.to_le_bytes());
        req[16..].copy_from_slice(&(cap as u64).to_le_bytes());
        let answer = sock
            .write_all(&req)
            .map_err(|e| ReadError::Reader(e.to_string()))
            .and_then(|()| {
                let mut text = Vec::new();
                loop {
                    let mut head = [0u8; 8];
                    read_by(sock, &mut head, deadline)?;
                    let n = i64::from_le_bytes(head);
                    if n < 0 {
                        return Ok(Err(nix::errno::Errno::from_raw((-n) as i32)));
                    }
                    if n == 0 {
                        return Ok(Ok(text));
                    }
                    let n = n as usize;
                    if text.len() + n > cap {
                        return Err(ReadError::Reader(format!(
                            "the file is larger than the {cap} bytes asked for"
                        )));
                    }
                    let at = text.len();
                    text.resize(at + n, 0);
                    read_by(sock, &mut text[at..], deadline)?;
                }
            });
        match answer {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(e)) => Err(ReadError::Errno(e)),
            Err(e) => {
                self.child = None;
                abandon(child);
                Err(e)
            }
        }
    }

    /// Whether a reader child is running (for tests and metrics).
    pub fn child(&self) -> Option<u32> {
        self.child.as_ref().map(|(p, _)| p.as_raw() as u32)
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        if let Some((child, sock)) = self.child.take() {
            // Its socket closes: an idle child exits at once.
            drop(sock);
            abandon(child);
        }
    }
}

/// Fills `buf` from `sock` by `deadline`.
fn read_by(sock: &mut UnixStream, buf: &mut [u8], deadline: Instant) -> Result<(), ReadError> {
    let mut got = 0;
    let mut first = true;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Timeout);
        }
        // The whole answer usually arrives at once: one timeout set per
        // request, reset only for a second read.
        if std::mem::take(&mut first) || got > 0 {
            sock.set_read_timeout(Some(left))
                .map_err(|e| ReadError::Reader(e.to_string()))?;
        }
        match sock.read(&mut buf[got..]) {
            Ok(0) => return Err(ReadError::Reader("it exited".into())),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ReadError::Timeout);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Reader(e.to_string())),
        }
    }
    Ok(())
}

/// Sends `child` SIGKILL and reaps it if it has exited; one still blocked
/// is kept to be reaped by a later call (with those abandoned before).
fn abandon(child: Pid) {
    let _ = kill(child, Signal::SIGKILL);
    let mut left = ABANDONED.lock().unwrap_or_else(|e| e.into_inner());
    left.push(child);
    left.retain(|&p| {
        !matches!(
            waitpid(p, Some(WaitPidFlag::WNOHANG)),
            Ok(nix::sys::wait::WaitStatus::Signaled(..) | nix::sys::wait::WaitStatus::Exited(..))
                | Err(_)
        )
    });
}

/// Children abandoned and not yet reaped (still blocked, most likely).
pub fn abandoned() -> Vec<u32> {
    let mut left = ABANDONED.lock().unwrap_or_else(|e| e.into_inner());
    left.retain(|&p| {
        !matches!(
            waitpid(p, Some(WaitPidFlag::WNOHANG)),
            Ok(nix::sys::wait::WaitStatus::Signaled(..) | nix::sys::wait::WaitStatus::Exited(..))
                | Err(_)
        )
    });
    left.iter().map(|p| p.as_raw() as u32).collect()
}

/// Why no reader child could be started.
#[derive(Debug, thiserror::Error)]
enum SpawnError {
    /// The socket pair to the child could not be made.
    #[error("socketpair: {source}")]
    SocketPair { source: std::io::Error },
    /// The child could not be forked.
    #[error("fork: {errno}")]
    Fork { errno: nix::errno::Errno },
}

fn spawn() -> Result<(Pid, UnixStream), SpawnError> {
    let (mine, theirs) = UnixStream::pair().map_err(|source| SpawnError::SocketPair { source })?;
    // Everything the child touches is allocated here, before the fork.
    let mut buf = vec![0u8; 8 + MAX_READ].into_boxed_slice();
    let fd = theirs.as_raw_fd();
    // SAFETY: the child makes raw system calls only (see `serve`) and
    // leaves with `_exit`; it never returns into Rust code that may take a
    // lock another thread held at the fork.
    match unsafe { nix::unistd::fork() }.map_err(|errno| SpawnError::Fork { errno })? {
        nix::unistd::ForkResult::Child => unsafe { serve(fd, &mut buf) },
        nix::unistd::ForkResult::Parent { child } => {
            drop(theirs);
            Ok((child, mine))
        }
    }
}

/// The child: requests `[pid u32, 0 u32, addr u64, len u64]` in, answers
/// `[n i64]` (bytes read, or `-errno`) and the bytes out, until its
/// socket closes.
///
/// # Safety
/// Only in the child of a fork; raw system calls only.
unsafe fn serve(fd: i32, buf: &mut [u8]) -> ! {
    unsafe {
        if libc::dup2(fd, 0) < 0 {
            libc::_exit(1);
        }
        // Every fd but the socket (fd 0) closes; without close_range
        // (Linux < 5.9) the first 64 Ki are closed one by one.
        if libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32) != 0 {
            for f in 1..65536 {
                libc::close(f);
            }
        }
        // The answer is built in place: `[n i64]` then the bytes read.
        let out = buf.as_mut_ptr();
        let data = out.add(8);
        let room = buf.len() - 8;
        let mut req = [0u8; 24];
        loop {
            let mut got = 0;
            while got < req.len() {
                let n = libc::read(0, req[got..].as_mut_ptr().cast(), req.len() - got);
                if n <= 0 {
                    libc::_exit(0);
                }
                got += n as usize;
            }
            let pid = u32::from_le_bytes([req[0], req[1], req[2], req[3]]);
            let kind = u32::from_le_bytes([req[4], req[5], req[6], req[7]]);
            let cap = u64::from_le_bytes(req[16..].try_into().unwrap_or([0; 8])) as usize;
            if kind == KIND_MAPS || kind == KIND_CMDLINE {
                let name: &[u8] = if kind == KIND_MAPS {
                    b"/maps"
                } else {
                    b"/cmdline"
                };
                if !send_proc_file(pid, name, cap, out, room) {
                    libc::_exit(0);
                }
                continue;
            }
            let pid = pid as libc::pid_t;
            let addr = u64::from_le_bytes(req[8..16].try_into().unwrap_or([0; 8]));
            let len =
                (u64::from_le_bytes(req[16..].try_into().unwrap_or([0; 8])) as usize).min(room);
            let local = libc::iovec {
                iov_base: data.cast(),
                iov_len: len,
            };
            let remote = libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            };
            let n = libc::process_vm_readv(pid, &local, 1, &remote, 1, 0);
            let answer = if n < 0 {
                -(*libc::__errno_location() as i64)
            } else {
                n as i64
            };
            std::ptr::copy_nonoverlapping(answer.to_le_bytes().as_ptr(), out, 8);
            if !send_all(std::slice::from_raw_parts(out, 8 + n.max(0) as usize)) {
                libc::_exit(0);
            }
        }
    }
}

/// Sends the first `cap` bytes of `/proc/PID` + `name` in chunks read into
/// `out` (`8 + room` bytes): `[n i64]` and n bytes each, then `[0]`;
/// `[-errno]` on an error. `false` when the socket is gone.
///
/// # Safety
/// Only in the reader child; `out` holds `8 + room` bytes; `name` is at
/// most 16 bytes.
unsafe fn send_proc_file(pid: u32, name: &[u8], cap: usize, out: *mut u8, room: usize) -> bool {
    // "/proc/" + up to 10 digits + name + NUL, without allocating.
    let mut path = [0u8; 32];
    let mut at = 0;
    for b in b"/proc/" {
        path[at] = *b;
        at += 1;
    }
    let mut digits = [0u8; 10];
    let (mut n, mut d) = (pid, 0);
    loop {
        digits[d] = b'0' + (n % 10) as u8;
        d += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        path[at] = digits[d];
        at += 1;
    }
    for b in name.iter().take(15) {
        path[at] = *b;
        at += 1;
    }
    let errno = || -(unsafe { *libc::__errno_location() } as i64);
    let send_head = |n: i64| unsafe {
        std::ptr::copy_nonoverlapping(n.to_le_bytes().as_ptr(), out, 8);
        send_all(std::slice::from_raw_parts(out, 8))
    };
    let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return send_head(errno());
    }
    let mut left = cap;
    let ok = loop {
        let n = unsafe { libc::read(fd, out.add(8).cast(), room.min(left)) };
        if n < 0 {
            break send_head(errno());
        }
        left -= n as usize;
        unsafe { std::ptr::copy_nonoverlapping((n as i64).to_le_bytes().as_ptr(), out, 8) };
        if !unsafe { send_all(std::slice::from_raw_parts(out, 8 + n as usize)) } {
            break false;
        }
        if n == 0 {
            break true;
        }
    };
    unsafe { libc::close(fd) };
    ok
}

/// Writes all of `bytes` to fd 0 (the socket), without SIGPIPE.
unsafe fn send_all(bytes: &[u8]) -> bool {
    let mut sent = 0;
    while sent < bytes.len() {
        let n = unsafe {
            libc::send(
                0,
                bytes[sent..].as_ptr().cast(),
                bytes.len() - sent,
                libc::MSG_NOSIGNAL,
            )
        };
        if n <= 0 {
            return false;
        }
        sent += n as usize;
    }
    true
}
