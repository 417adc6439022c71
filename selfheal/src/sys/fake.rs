//! A kernel made of plain data, for unit tests: processes (pid, start time,
//! parent, uid, fds, what a signal does to them), sockets (family, cookie,
//! options, `tcp_info`, namespace, whether `SOCK_DESTROY` is allowed) and a
//! clock that moves only when slept on. Every call is recorded, in words
//! ([`FakeKernel::calls`]), and a test can script a race: a change made to
//! the kernel right before a given call ([`FakeKernel::before`]), as
//! another process would make it in the middle of an act. The kernel's
//! rules it keeps: only root or the process's own uid may duplicate its fds
//! or signal it (`EPERM`), a dead process has no fds (`ESRCH`), a
//! keepalive re-armed with a 1 ms user timeout and a probe out ends the
//! connection.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use selfheal_core::keepalive::KeepaliveSettings;

use super::{
    pidfd::PidfdError,
    sockdiag::SockDiagError,
    system::{Addrs, FdLink, Handle, ProcStat, ShutdownError, System, TcpInfoSeen},
};

/// The keepalive options of a new socket: the kernel's defaults.
pub const KERNEL_KEEPALIVE: KeepaliveSettings = KeepaliveSettings {
    enabled: false,
    idle_s: 7200,
    interval_s: 75,
    count: 9,
    user_timeout_ms: 0,
};

/// `TCP_ESTABLISHED` and `TCP_CLOSE`.
pub const ESTABLISHED: u8 = 1;
pub const CLOSE: u8 = 7;

/// What a fake process's fd holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fd {
    /// The socket with this inode.
    Socket(u64),
    /// A file.
    File,
}

/// A fake process.
#[derive(Clone, Debug)]
pub struct Proc {
    pub start_ticks: u64,
    pub ppid: i32,
    /// `PF_*` flags (`PF_KTHREAD` for a kernel thread).
    pub flags: u32,
    pub uid: u32,
    pub alive: bool,
    /// Its network namespace; 0: one this process may not open.
    pub netns: u64,
    pub fds: BTreeMap<i32, Fd>,
    /// How long after SIGTERM it exits; `None`: it ignores SIGTERM.
    pub exits_after_term: Option<Duration>,
    /// Whether SIGKILL ends it (not while in uninterruptible sleep).
    pub killable: bool,
    /// When it is to exit, on the fake clock.
    exit_at: Option<Duration>,
}

impl Proc {
    /// A running process of `uid` started at `start_ticks`, child of pid 1,
    /// that exits at once on SIGTERM.
    pub fn new(start_ticks: u64, uid: u32) -> Proc {
        Proc {
            start_ticks,
            ppid: 1,
            flags: 0,
            uid,
            alive: true,
            netns: 1,
            fds: BTreeMap::new(),
            exits_after_term: Some(Duration::ZERO),
            killable: true,
            exit_at: None,
        }
    }
}

/// A fake TCP socket.
#[derive(Clone, Debug)]
pub struct Socket {
    pub domain: i32,
    pub protocol: i32,
    pub cookie: Option<u64>,
    pub netns: u64,
    /// Whether `SIOCGSKNS` answers for it.
    pub netns_readable: bool,
    /// `(level, name)` → value; unset options read as the kernel's
    /// defaults.
    pub opts: BTreeMap<(i32, i32), i32>,
    pub info: Option<TcpInfoSeen>,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// `SOCK_DESTROY` refused with this errno.
    pub destroy_refused: Option<i32>,
    /// The next sets of option `name` fail with errno, one entry each.
    pub failing_sets: Vec<(i32, i32)>,
    pub destroyed: bool,
    pub shut_down: bool,
}

impl Socket {
    /// An established, silent IPv4 TCP connection with the kernel's default
    /// options.
    pub fn tcp(cookie: u64) -> Socket {
        Socket {
            domain: libc::AF_INET,
            protocol: libc::IPPROTO_TCP,
            cookie: Some(cookie),
            netns: 1,
            netns_readable: true,
            opts: BTreeMap::new(),
            info: Some(TcpInfoSeen {
                state: ESTABLISHED,
                probes: 0,
                unacked: 0,
                last_data_recv_ms: 30_000,
                last_ack_recv_ms: 30_000,
            }),
            local: "10.0.0.1:40000"
                .parse()
                .unwrap_or(SocketAddr::from(([0; 4], 0))),
            remote: "10.0.0.2:443"
                .parse()
                .unwrap_or(SocketAddr::from(([0; 4], 0))),
            destroy_refused: None,
            failing_sets: Vec::new(),
            destroyed: false,
            shut_down: false,
        }
    }

    /// Option `(level, name)` as `getsockopt` reads it.
    pub fn opt(&self, level: i32, name: i32) -> i32 {
        self.opts
            .get(&(level, name))
            .copied()
            .unwrap_or(match (level, name) {
                (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => KERNEL_KEEPALIVE.idle_s as i32,
                (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => KERNEL_KEEPALIVE.interval_s as i32,
                (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => KERNEL_KEEPALIVE.count as i32,
                _ => 0,
            })
    }

    /// Its keepalive options, as `getsockopt` reads them.
    pub fn keepalive(&self) -> KeepaliveSettings {
        let tcp = |name| self.opt(libc::IPPROTO_TCP, name) as u32;
        KeepaliveSettings {
            enabled: self.opt(libc::SOL_SOCKET, libc::SO_KEEPALIVE) != 0,
            idle_s: tcp(libc::TCP_KEEPIDLE),
            interval_s: tcp(libc::TCP_KEEPINTVL),
            count: tcp(libc::TCP_KEEPCNT),
            user_timeout_ms: tcp(libc::TCP_USER_TIMEOUT),
        }
    }
}

type Trigger = Box<dyn FnOnce(&mut World) + Send>;

/// Everything the fake kernel holds.
pub struct World {
    pub own_pid: u32,
    /// The uid this process runs as.
    pub euid: u32,
    pub processes: BTreeMap<u32, Proc>,
    /// By inode.
    pub sockets: BTreeMap<u64, Socket>,
    /// Every call, in words, in order.
    pub calls: Vec<String>,
    /// Time on the fake clock since it was made.
    pub elapsed: Duration,
    triggers: Vec<(String, Trigger)>,
}

impl World {
    /// Runs `f` on the agent [`FakeKernel::agent`] made.
    pub fn on_agent<T>(&mut self, f: impl FnOnce(&mut Proc) -> T) -> Option<T> {
        self.processes.get_mut(&PID).map(f)
    }

    /// Runs `f` on the agent's socket.
    pub fn on_agent_socket<T>(&mut self, f: impl FnOnce(&mut Socket) -> T) -> Option<T> {
        self.sockets.get_mut(&INODE).map(f)
    }

    /// Records `call`, first running the changes scripted to happen before
    /// it.
    fn call(&mut self, call: String) {
        let (due, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.triggers)
            .into_iter()
            .partition(|(prefix, _)| call.starts_with(prefix.as_str()));
        self.triggers = rest;
        for (_, change) in due {
            change(self);
        }
        self.calls.push(call);
    }

    /// Marks processes whose exit time has come as exited.
    fn settle(&mut self) {
        let now = self.elapsed;
        for p in self.processes.values_mut() {
            if p.exit_at.is_some_and(|at| at <= now) {
                p.alive = false;
                p.fds.clear();
            }
        }
    }

    fn live(&self, h: &Pinned) -> Option<&Proc> {
        self.processes
            .get(&h.pid)
            .filter(|p| p.alive && p.start_ticks == h.start_ticks)
    }

    fn socket(&mut self, s: &Dup) -> std::io::Result<&mut Socket> {
        s.inode
            .and_then(|i| self.sockets.get_mut(&i))
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOTSOCK))
    }

    /// Whether this process may act on `p` as the kernel would let it.
    fn may(&self, p: &Proc) -> bool {
        self.euid == 0 || self.euid == p.uid
    }
}

/// A handle on a fake process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pinned {
    pub pid: u32,
    pub start_ticks: u64,
}

impl Handle for Pinned {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn start_ticks(&self) -> u64 {
        self.start_ticks
    }
}

/// A duplicated fd: the socket it holds, if it is one.
#[derive(Debug)]
pub struct Dup {
    pub inode: Option<u64>,
}

/// The fake kernel.
pub struct FakeKernel {
    world: Mutex<World>,
    base: Instant,
}

/// The agent [`FakeKernel::agent`] makes: pid, start time, uid, its fd
/// and that socket's inode and cookie.
pub const PID: u32 = 100;
pub const START: u64 = 5_000;
pub const UID: u32 = 1000;
pub const FD: i32 = 7;
pub const INODE: u64 = 42;
pub const COOKIE: u64 = 0x4242;

impl FakeKernel {
    /// A kernel with only this process (pid 50, child of 40, child of 1),
    /// run by `euid`.
    pub fn new(euid: u32) -> FakeKernel {
        let mut processes = BTreeMap::new();
        processes.insert(
            50,
            Proc {
                ppid: 40,
                ..Proc::new(10, euid)
            },
        );
        processes.insert(40, Proc::new(5, euid));
        FakeKernel {
            world: Mutex::new(World {
                own_pid: 50,
                euid,
                processes,
                sockets: BTreeMap::new(),
                calls: Vec::new(),
                elapsed: Duration::ZERO,
                triggers: Vec::new(),
            }),
            base: Instant::now(),
        }
    }

    /// This process run by [`UID`], and one agent of that uid ([`PID`],
    /// started at [`START`]) holding at fd [`FD`] an established TCP
    /// connection ([`INODE`], cookie [`COOKIE`]).
    pub fn agent() -> FakeKernel {
        let k = FakeKernel::new(UID);
        k.with(|w| {
            let mut p = Proc::new(START, UID);
            p.fds.insert(FD, Fd::Socket(INODE));
            w.processes.insert(PID, p);
            w.sockets.insert(INODE, Socket::tcp(COOKIE));
        });
        k
    }

    /// The world, to read or change.
    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the world.
    pub fn with<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        f(&mut self.world())
    }

    /// Scripts `change` to happen right before the first call whose words
    /// start with `call` (another process's doing, mid-act).
    pub fn before(&self, call: &str, change: impl FnOnce(&mut World) + Send + 'static) {
        self.world()
            .triggers
            .push((call.to_string(), Box::new(change)));
    }

    /// The calls so far, in words.
    pub fn calls(&self) -> Vec<String> {
        self.world().calls.clone()
    }

    /// The calls so far that start with `prefix`.
    pub fn calls_of(&self, prefix: &str) -> Vec<String> {
        self.world()
            .calls
            .iter()
            .filter(|c| c.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Socket `inode` as it is now.
    pub fn socket(&self, inode: u64) -> Socket {
        self.world().sockets[&inode].clone()
    }

    /// A handle on `pid` as it is now (as if opened by the caller).
    pub fn pin(&self, pid: u32) -> Pinned {
        Pinned {
            pid,
            start_ticks: self.world().processes[&pid].start_ticks,
        }
    }

    fn call(&self, call: String) -> MutexGuard<'_, World> {
        let mut w = self.world();
        w.call(call);
        w.settle();
        w
    }
}

/// The name of an option, for the call log.
fn opt_name(level: i32, name: i32) -> String {
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_DOMAIN) => "SO_DOMAIN".into(),
        (libc::SOL_SOCKET, libc::SO_PROTOCOL) => "SO_PROTOCOL".into(),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => "SO_KEEPALIVE".into(),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => "TCP_KEEPIDLE".into(),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) => "TCP_KEEPINTVL".into(),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT) => "TCP_KEEPCNT".into(),
        (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) => "TCP_USER_TIMEOUT".into(),
        _ => format!("{level}/{name}"),
    }
}

fn errno(e: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

impl System for FakeKernel {
    type Process = Pinned;
    type Sock = Dup;
    type Netns = u64;

    fn own_pid(&self) -> u32 {
        self.world().own_pid
    }

    fn stat(&self, pid: u32) -> Option<ProcStat> {
        let w = self.call(format!("stat {pid}"));
        w.processes.get(&pid).filter(|p| p.alive).map(|p| ProcStat {
            start_ticks: p.start_ticks,
            ppid: p.ppid,
            flags: p.flags,
        })
    }

    fn open(&self, pid: u32, expect_start: Option<u64>) -> Result<Pinned, PidfdError> {
        let w = self.call(format!("open {pid}"));
        let p = w
            .processes
            .get(&pid)
            .filter(|p| p.alive)
            .ok_or(PidfdError::Gone { pid })?;
        match expect_start {
            Some(expected) if expected != p.start_ticks => Err(PidfdError::Reused {
                pid,
                expected,
                found: p.start_ticks,
            }),
            _ => Ok(Pinned {
                pid,
                start_ticks: p.start_ticks,
            }),
        }
    }

    fn is_alive(&self, h: &Pinned) -> bool {
        let w = self.call(format!("is_alive {}", h.pid));
        w.live(h).is_some()
    }

    fn wait_exit(&self, h: &Pinned, timeout: Duration) -> bool {
        let mut w = self.call(format!("wait_exit {}", h.pid));
        let Some(p) = w.live(h) else {
            return true;
        };
        match p.exit_at {
            Some(at) if at <= w.elapsed + timeout => {
                w.elapsed = w.elapsed.max(at);
                w.settle();
                true
            }
            _ => {
                w.elapsed += timeout;
                false
            }
        }
    }

    fn send_signal(&self, h: &Pinned, signal: libc::c_int) -> std::io::Result<()> {
        let name = match signal {
            libc::SIGTERM => "SIGTERM".to_string(),
            libc::SIGKILL => "SIGKILL".to_string(),
            n => n.to_string(),
        };
        let mut w = self.call(format!("signal {} {name}", h.pid));
        let now = w.elapsed;
        let p = w.live(h).ok_or_else(|| errno(libc::ESRCH))?;
        if !w.may(p) {
            return Err(errno(libc::EPERM));
        }
        let after = match signal {
            libc::SIGTERM => p.exits_after_term,
            libc::SIGKILL => p.killable.then_some(Duration::ZERO),
            _ => None,
        };
        if let (Some(after), Some(p)) = (after, w.processes.get_mut(&h.pid)) {
            let at = now + after;
            p.exit_at = Some(p.exit_at.map_or(at, |was| was.min(at)));
        }
        w.settle();
        Ok(())
    }

    fn fd_link(&self, pid: u32, fd: i32) -> FdLink {
        let w = self.call(format!("fd_link {pid} {fd}"));
        match w
            .processes
            .get(&pid)
            .filter(|p| p.alive)
            .and_then(|p| p.fds.get(&fd))
        {
            Some(Fd::Socket(inode)) => FdLink::Socket(*inode),
            Some(Fd::File) => FdLink::Other,
            None => FdLink::Missing,
        }
    }

    fn get_fd(&self, h: &Pinned, fd: i32) -> std::io::Result<Dup> {
        let w = self.call(format!("get_fd {} {fd}", h.pid));
        let p = w.live(h).ok_or_else(|| errno(libc::ESRCH))?;
        if !w.may(p) {
            return Err(errno(libc::EPERM));
        }
        match p.fds.get(&fd) {
            Some(Fd::Socket(inode)) => Ok(Dup {
                inode: Some(*inode),
            }),
            Some(Fd::File) => Ok(Dup { inode: None }),
            None => Err(errno(libc::EBADF)),
        }
    }

    fn sock_inode(&self, s: &Dup) -> Option<u64> {
        s.inode
    }

    fn close_aside(&self, s: Dup) {
        let _logged = self.call(format!("close_aside {:?}", s.inode));
    }

    fn get_int(&self, s: &Dup, level: libc::c_int, name: libc::c_int) -> std::io::Result<i32> {
        let mut w = self.call(format!(
            "getsockopt {} {}",
            fmt_inode(s),
            opt_name(level, name)
        ));
        let sock = w.socket(s)?;
        Ok(match (level, name) {
            (libc::SOL_SOCKET, libc::SO_DOMAIN) => sock.domain,
            (libc::SOL_SOCKET, libc::SO_PROTOCOL) => sock.protocol,
            _ => sock.opt(level, name),
        })
    }

    fn set_int(
        &self,
        s: &Dup,
        level: libc::c_int,
        name: libc::c_int,
        value: libc::c_int,
    ) -> std::io::Result<()> {
        let mut w = self.call(format!(
            "setsockopt {} {}={value}",
            fmt_inode(s),
            opt_name(level, name)
        ));
        let sock = w.socket(s)?;
        if let Some(i) = sock.failing_sets.iter().position(|(n, _)| *n == name) {
            let (_, e) = sock.failing_sets.remove(i);
            return Err(errno(e));
        }
        sock.opts.insert((level, name), value);
        // The keepalive timer re-armed with a probe out past a 1 ms user
        // timeout: the kernel gives the connection up.
        let expired = (level, name) == (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE)
            && sock.opt(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) == 1;
        if let Some(i) = sock.info.as_mut().filter(|i| expired && i.probes > 0) {
            i.state = CLOSE;
        }
        Ok(())
    }

    fn cookie(&self, s: &Dup) -> Option<u64> {
        let mut w = self.call(format!("cookie {}", fmt_inode(s)));
        w.socket(s).ok()?.cookie
    }

    fn tcp_info(&self, s: &Dup) -> Option<TcpInfoSeen> {
        let mut w = self.call(format!("tcp_info {}", fmt_inode(s)));
        w.socket(s).ok()?.info
    }

    fn shutdown(&self, s: &Dup) -> Result<Addrs, ShutdownError> {
        let mut w = self.call(format!("shutdown {}", fmt_inode(s)));
        let sock = w.socket(s).map_err(ShutdownError::Dup)?;
        sock.shut_down = true;
        Ok((Some(sock.local), Some(sock.remote)))
    }

    fn socket_netns(&self, s: &Dup) -> std::io::Result<u64> {
        let mut w = self.call(format!("socket_netns {}", fmt_inode(s)));
        let sock = w.socket(s)?;
        if sock.netns_readable {
            Ok(sock.netns)
        } else {
            Err(errno(libc::ENOTTY))
        }
    }

    fn netns_of_pid(&self, pid: u32) -> std::io::Result<u64> {
        let w = self.call(format!("netns_of_pid {pid}"));
        match w.processes.get(&pid).filter(|p| p.alive) {
            None => Err(errno(libc::ENOENT)),
            // Namespace 0: one this process may not open.
            Some(p) if p.netns == 0 => Err(errno(libc::EACCES)),
            Some(p) => Ok(p.netns),
        }
    }

    fn destroy_by_inode_in(
        &self,
        ns: &u64,
        families: &[u8],
        inode: u64,
    ) -> Result<(SocketAddr, SocketAddr, u64), SockDiagError> {
        let mut w = self.call(format!("sock_destroy {inode} in netns {ns}"));
        let sock = w
            .sockets
            .get_mut(&inode)
            .filter(|s| s.netns == *ns && !s.destroyed)
            .filter(|s| families.iter().any(|f| i32::from(*f) == s.domain))
            .ok_or(SockDiagError::NoSuchInode(inode))?;
        if let Some(e) = sock.destroy_refused {
            return Err(SockDiagError::DestroyRefused(-e));
        }
        sock.destroyed = true;
        Ok((sock.local, sock.remote, sock.cookie.unwrap_or(0)))
    }

    fn now(&self) -> Instant {
        self.base + self.world().elapsed
    }

    fn sleep(&self, d: Duration) {
        let mut w = self.call(format!("sleep {}", d.as_millis()));
        w.elapsed += d;
        w.settle();
    }
}

fn fmt_inode(s: &Dup) -> String {
    s.inode.map_or("-".to_string(), |i| i.to_string())
}
