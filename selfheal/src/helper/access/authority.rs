//! The helper's authority is the kernel's: for a caller other than root,
//! an act on a process needs what the kernel would demand of that caller
//! acting itself (ptrace access: the rules are
//! [`selfheal_core::access::authority`]'s), checked once before anything of the
//! target is read for the caller and again right before the act — after
//! `pidfd_getfd`, on the duplicate, for a socket act. This module owns
//! reading what the rules need (the target's credentials, through the
//! process its pidfd pins; the caller's capabilities; the socket's state).
//! The proofs the helper armed are kept by its server
//! ([`crate::helper::server::proofs`]).
//!
//! # Reading a process through its pidfd
//!
//! `/proc/PID` is opened after the pidfd, and the pidfd is then checked
//! alive: the pid was the pidfd's process's all along, so the directory is
//! that process's, and every file opened under it is (or fails `ESRCH`
//! once it has exited). `status` is opened afresh each time: the kernel
//! recomputes a /proc file's owner — root's when the process is not
//! dumpable — on lookup, not on `fstat` of an fd opened before.

use std::{
    ffi::CString,
    fs::File,
    io::Read as _,
    os::{
        fd::{AsRawFd as _, BorrowedFd, OwnedFd},
        unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    },
};

use selfheal_core::{
    access::authority::{self as rules, CallerCreds, Seen, TaskCreds, UserNs},
    access::policy::Policy,
};

use crate::sys::pidfd::Pidfd;
use selfheal_core::protocol::{Action, Caller};

/// Why the helper will not act for a caller on a process or its socket.
/// Every message is a whole sentence naming only what the caller may read
/// itself (no fd, no inode).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthorityError {
    /// The process exited before or while it was read.
    #[error("pid {pid} has exited: nothing was done")]
    Exited { pid: u32 },
    /// The kernel would not let the caller ptrace the process (`why`).
    #[error(
        "uid {uid} may not act on pid {pid}: {why}; the kernel would not let uid {uid} \
         ptrace it, and the helper lends no more than the kernel would"
    )]
    Refused { uid: u32, pid: u32, why: String },
    /// The socket's TCP state could not be read on its duplicate.
    #[error("uid {uid} may not act on this socket of pid {pid}: its TCP state cannot be read")]
    SocketUnread { uid: u32, pid: u32 },
    /// The socket is not in a state the act is for (`why`).
    #[error("uid {uid} may not act on this socket of pid {pid}: {why}")]
    SocketState { uid: u32, pid: u32, why: String },
}

/// What the first check found, so that the re-check holds the target to
/// the same principal; root's holds nothing and allows everything.
#[derive(Clone, Debug)]
pub struct Authority {
    uid: u32,
    checked: Option<Checked>,
}

#[derive(Clone, Debug)]
struct Checked {
    caller: CallerCreds,
    caller_ns: Option<(u64, u64)>,
    principal: u32,
}

impl Authority {
    /// Root's: everything (tests, and root callers).
    pub fn root() -> Authority {
        Authority {
            uid: 0,
            checked: None,
        }
    }

    /// Checks that `caller` may act on `target` as the kernel would let it
    /// act itself, for its own uid or one `policy` grants it; the refusal
    /// is a whole sentence naming only what the caller may read itself (no
    /// fd, no inode).
    pub fn check(
        caller: &Caller,
        target: &Pidfd,
        policy: &Policy,
    ) -> Result<Authority, AuthorityError> {
        Authority::check_seen(caller, target, policy).map(|(a, _)| a)
    }

    /// [`Authority::check`], and what it saw of `target` (`None` for
    /// root's, which holds nothing): the process a read made under this
    /// authority is held to ([`Authority::reauthorize`]).
    pub fn check_seen(
        caller: &Caller,
        target: &Pidfd,
        policy: &Policy,
    ) -> Result<(Authority, Option<Seen>), AuthorityError> {
        if caller.uid == 0 {
            return Ok((Authority::root(), None));
        }
        let (caller_creds, caller_ns) = read_caller(caller);
        let t = read_task(target).map_err(|why| why.refused(caller.uid, target.pid()))?;
        let principal = rules::principal(caller.uid, &t.creds);
        if !policy.may_reach(caller.uid, principal) {
            return Err(AuthorityError::Refused {
                uid: caller.uid,
                pid: target.pid(),
                why: format!("it is a process of uid {principal}"),
            });
        }
        let a = Authority {
            uid: caller.uid,
            checked: Some(Checked {
                caller: caller_creds,
                caller_ns,
                principal,
            }),
        };
        a.judge(target.pid(), &t)?;
        Ok((a, Some(t.seen())))
    }

    /// The check again after a read made for the caller: the process must
    /// be what it was when `before` was seen (the same credentials,
    /// dumpable flag, capabilities, executable and address space: no exec
    /// between), and still one the caller could read itself. Root's
    /// authority holds nothing.
    pub fn reauthorize(&self, target: &Pidfd, before: Option<&Seen>) -> Result<(), AuthorityError> {
        if self.checked.is_none() {
            return Ok(());
        }
        let Some(before) = before else {
            return Err(AuthorityError::Refused {
                uid: self.uid,
                pid: target.pid(),
                why: "nothing was seen of it before the read".into(),
            });
        };
        let t = read_task(target).map_err(|why| why.refused(self.uid, target.pid()))?;
        if let Some(why) = rules::reread_refusal(before, &t.seen()) {
            return Err(AuthorityError::Refused {
                uid: self.uid,
                pid: target.pid(),
                why,
            });
        }
        self.judge(target.pid(), &t)
    }

    /// Whether this is root's authority (nothing is checked).
    pub fn is_root(&self) -> bool {
        self.checked.is_none()
    }

    /// The check again, right before the act: the target must still be one
    /// the caller could act on itself, for the same principal.
    pub fn recheck(&self, target: &Pidfd) -> Result<(), AuthorityError> {
        if self.checked.is_none() {
            return Ok(());
        }
        let t = read_task(target).map_err(|why| why.refused(self.uid, target.pid()))?;
        self.judge(target.pid(), &t)
    }

    /// [`Authority::recheck`], and the socket's state on its duplicate
    /// (`dup`), right before `action` changes it.
    pub fn check_socket(
        &self,
        action: Action,
        target: &Pidfd,
        dup: BorrowedFd<'_>,
    ) -> Result<(), AuthorityError> {
        if self.checked.is_none() {
            return Ok(());
        }
        self.recheck(target)?;
        let state = tcp_state(dup).ok_or(AuthorityError::SocketUnread {
            uid: self.uid,
            pid: target.pid(),
        })?;
        match rules::socket_refusal(action, state) {
            None => Ok(()),
            Some(why) => Err(AuthorityError::SocketState {
                uid: self.uid,
                pid: target.pid(),
                why,
            }),
        }
    }

    fn judge(&self, pid: u32, t: &Task) -> Result<(), AuthorityError> {
        let Some(c) = &self.checked else {
            return Ok(());
        };
        let ns = match (c.caller_ns, t.user_ns) {
            (Some(a), Some(b)) if a == b => UserNs::Same,
            (Some(a), Some(_)) if owned_below(&t.user_ns_fd, a, c.caller.uid) => {
                UserNs::OwnedByCaller
            }
            _ => UserNs::Other,
        };
        match rules::ptrace_refusal(&c.caller, c.principal, &t.creds, ns) {
            None => Ok(()),
            Some(why) => Err(AuthorityError::Refused {
                uid: self.uid,
                pid,
                why,
            }),
        }
    }
}

/// Why [`read_task`] could not read a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unread {
    /// It has exited.
    Exited,
    /// Its `/proc/PID/status` has no credentials in it.
    Status,
}

impl Unread {
    /// The refusal it makes for `uid` acting on `pid`.
    fn refused(self, uid: u32, pid: u32) -> AuthorityError {
        match self {
            Unread::Exited => AuthorityError::Exited { pid },
            Unread::Status => AuthorityError::Refused {
                uid,
                pid,
                why: "its /proc/PID/status cannot be read".into(),
            },
        }
    }
}

/// A target as read through its pidfd.
struct Task {
    creds: TaskCreds,
    /// Device and inode of its user namespace, and that namespace as an fd.
    user_ns: Option<(u64, u64)>,
    user_ns_fd: Option<OwnedFd>,
    /// Device and inode of its executable.
    exe: Option<(u64, u64)>,
    /// Its address space's layout (`/proc/PID/stat`).
    layout: Option<rules::Layout>,
}

impl Task {
    fn seen(&self) -> Seen {
        Seen {
            creds: self.creds,
            exe: self.exe,
            layout: self.layout,
        }
    }
}

/// Most bytes of `/proc/PID/status` read (it is a few KiB).
const MAX_STATUS: u64 = 64 * 1024;

fn read_task(target: &Pidfd) -> Result<Task, Unread> {
    let pid = target.pid();
    let gone = || Unread::Exited;
    let dir = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(crate::sys::procfs::ProcRoot::default().pid(pid))
        .map_err(|_| gone())?;
    // Opened while the pidfd's process held the pid: the directory is its.
    if !target.is_alive() {
        return Err(gone());
    }
    let status = open_at(&dir, "status").map_err(|_| gone())?;
    let dump_owner = status.metadata().map_err(|_| gone())?.uid();
    let mut text = String::new();
    status
        .take(MAX_STATUS)
        .read_to_string(&mut text)
        .map_err(|_| gone())?;
    let (uids, gids, cap_permitted) = rules::parse_status(&text).ok_or(Unread::Status)?;
    let user_ns_fd = open_at(&dir, "ns/user").ok().map(OwnedFd::from);
    let user_ns = user_ns_fd.as_ref().and_then(ns_id);
    let exe = crate::sys::fs::dev_ino_at(dir.as_raw_fd(), c"exe").ok();
    let layout = open_at(&dir, "stat").ok().and_then(|f| {
        let mut text = String::new();
        f.take(MAX_STATUS).read_to_string(&mut text).ok()?;
        rules::parse_layout(&text)
    });
    if !target.is_alive() {
        return Err(gone());
    }
    Ok(Task {
        creds: TaskCreds {
            uids,
            gids,
            cap_permitted,
            dump_owner,
        },
        user_ns,
        user_ns_fd,
        exe,
        layout,
    })
}

/// `openat(dir, name)`, read-only, close-on-exec.
fn open_at(dir: &File, name: &str) -> std::io::Result<File> {
    let c = CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    crate::sys::fs::openat(dir.as_raw_fd(), &c, libc::O_RDONLY, 0).map(File::from)
}

/// Device and inode of a namespace fd.
fn ns_id(fd: &OwnedFd) -> Option<(u64, u64)> {
    let f = File::from(fd.try_clone().ok()?);
    f.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// The caller's capabilities and user namespace, read under its pid (the
/// connection's process, verified on this request). A process there of
/// another effective uid (it changed, or the pid is another's) counts as
/// one with no capabilities: an error can only refuse more.
fn read_caller(caller: &Caller) -> (CallerCreds, Option<(u64, u64)>) {
    let mut creds = CallerCreds {
        uid: caller.uid,
        gid: caller.gid,
        cap_permitted: 0,
    };
    let status = std::fs::read_to_string(
        crate::sys::procfs::ProcRoot::default().of_pid(caller.pid, "status"),
    )
    .ok();
    if let Some((uids, _, caps)) = status.as_deref().and_then(rules::parse_status)
        && uids[1] == caller.uid
    {
        creds.cap_permitted = caps;
    }
    let ns =
        std::fs::metadata(crate::sys::procfs::ProcRoot::default().of_pid(caller.pid, "ns/user"))
            .ok()
            .map(|m| (m.dev(), m.ino()));
    (creds, ns)
}

/// Whether user namespace `ns` is below `caller_ns`, in a namespace the
/// caller's uid created (directly below the caller's): the kernel's rule
/// for holding every capability in it.
fn owned_below(ns: &Option<OwnedFd>, caller_ns: (u64, u64), uid: u32) -> bool {
    let Some(ns) = ns else {
        return false;
    };
    let mut cur = match ns.try_clone() {
        Ok(fd) => fd,
        Err(_) => return false,
    };
    // User namespaces nest at most 32 deep.
    for _ in 0..33 {
        let Ok(parent) = crate::sys::ns::parent(std::os::fd::AsFd::as_fd(&cur)) else {
            return false;
        };
        if ns_id(&parent) == Some(caller_ns) {
            return crate::sys::ns::owner_uid(std::os::fd::AsFd::as_fd(&cur))
                .is_ok_and(|owner| owner == uid);
        }
        cur = parent;
    }
    false
}

/// `tcpi_state` of a TCP socket.
fn tcp_state(fd: BorrowedFd<'_>) -> Option<u8> {
    let (info, len) = crate::sys::socket::tcp_info(fd)?;
    (len >= 1).then_some(info.tcpi_state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_is_ours_and_pid_1_is_roots() {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let me = Pidfd::open(std::process::id(), None).unwrap();
        let t = read_task(&me).unwrap();
        assert_eq!(t.creds.uids[0], uid);
        assert_eq!(t.creds.gids[0], gid);
        assert!(t.user_ns.is_some());
        let caller = Caller {
            uid,
            gid,
            pid: std::process::id(),
        };
        assert!(Authority::check(&caller, &me, &Policy::default()).is_ok());
        if uid == 0 {
            // As uid 65534, root's own process (this one) is refused.
            let nobody = Caller {
                uid: 65534,
                gid: 65534,
                pid: std::process::id(),
            };
            let e = Authority::check(&nobody, &me, &Policy::default()).unwrap_err();
            assert!(e.to_string().contains("it is a process of uid 0"), "{e}");
        }
    }

    #[test]
    fn a_refusal_names_the_uid_and_the_pid() {
        assert_eq!(
            Unread::Exited.refused(1000, 42).to_string(),
            "pid 42 has exited: nothing was done"
        );
        assert_eq!(
            Unread::Status.refused(1000, 42).to_string(),
            "uid 1000 may not act on pid 42: its /proc/PID/status cannot be read; the kernel \
             would not let uid 1000 ptrace it, and the helper lends no more than the kernel would"
        );
        let socket = AuthorityError::SocketState {
            uid: 1000,
            pid: 42,
            why: "it is a listener".into(),
        };
        assert_eq!(
            socket.to_string(),
            "uid 1000 may not act on this socket of pid 42: it is a listener"
        );
    }

    #[test]
    fn an_exited_process_is_refused() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let fd = Pidfd::open(child.id(), None).unwrap();
        child.wait().unwrap();
        let e = read_task(&fd).err().unwrap();
        assert_eq!(e, Unread::Exited);
    }
}
