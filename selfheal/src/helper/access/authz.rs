//! Who asks, and what a request may touch: the connecting process pinned
//! at accept and checked on every request ([`Connector`]), the pid
//! namespace a caller's pids are read in, each pid a request names pinned
//! by a pidfd and checked against the policy (one answer for every pid a
//! caller may not reach), the fds an act may duplicate (sockets only),
//! and who a target is ([`Identity`]) before and after its grace.

use std::{
    io,
    os::{
        fd::{AsFd as _, AsRawFd as _, OwnedFd},
        unix::{fs::MetadataExt as _, net::UnixStream},
    },
    path::PathBuf,
};

use selfheal_core::{
    access::policy::TargetProcess,
    protocol::{Caller, ErrorCode, WireError},
};

use crate::helper::server::{Shared, refusal};
use crate::{
    helper::access::{authority::Authority, policy::read_target},
    sys::pidfd::{Pidfd, PidfdError, pidfd_open, start_ticks},
};

/// What the policy and the audit need to know of a target, read again
/// before every escalation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::helper) struct Identity {
    pub(in crate::helper) target: TargetProcess,
    pub(in crate::helper) start_ticks: u64,
    pub(in crate::helper) exe: Option<PathBuf>,
}

/// Opens a pidfd on `pid` (checked against `start` when given) and reads
/// the process's identity through it: the identity is of the process the
/// pidfd holds, since it was still alive after the read.
pub(in crate::helper) fn pin(
    pid: u32,
    start: Option<u64>,
) -> Result<(Pidfd, TargetProcess), WireError> {
    let gone = |m: String| refusal(ErrorCode::Gone, m);
    let fd = Pidfd::open(pid, start).map_err(|e| match &e {
        PidfdError::Gone { .. } => gone(format!("pid {pid} is not running")),
        PidfdError::Reused { .. } => gone(e.to_string()),
        PidfdError::Open { source, .. }
            if matches!(source.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) =>
        {
            refusal(
                ErrorCode::BadRequest,
                format!("pid {pid} is not a process (a thread id?)"),
            )
        }
        PidfdError::Open { .. } => refusal(ErrorCode::Failed, e.to_string()),
    })?;
    let target = read_target(pid).ok_or_else(|| gone(format!("pid {pid} is not running")))?;
    if !fd.is_alive() {
        return Err(gone(format!("pid {pid} exited")));
    }
    Ok((fd, target))
}

/// The pid namespace of process `pid` (`"self"` for ours).
pub(in crate::helper) fn pid_namespace(pid: &str) -> Option<(u64, u64)> {
    std::fs::metadata(crate::sys::procfs::ProcRoot::default().file(&format!("{pid}/ns/pid")))
        .ok()
        .map(|md| (md.dev(), md.ino()))
}

/// `(gone, refused)` as a caller may be told them: a caller that may not
/// see every process (any but root) is not told which of its pids are
/// gone, only that they are refused, like one it may not query.
pub(in crate::helper) fn masked(
    caller: &Caller,
    gone: Vec<u32>,
    refused: Vec<u32>,
) -> (Vec<u32>, Vec<u32>) {
    if caller.uid == 0 {
        return (gone, refused);
    }
    let mut r = refused;
    r.extend(gone);
    r.sort_unstable();
    (Vec::new(), r)
}

/// What `/proc/self/fdinfo/N` of a pidfd says of its process (pure): its
/// pid in our pid namespace (`Pid:`; -1 once reaped, 0 when not visible
/// here) and how many pid namespaces deep it is, counted from ours
/// (`NSpid:` has one number per level: 1 means ours).
pub fn parse_pidfd_fdinfo(text: &str) -> (Option<i64>, Option<usize>) {
    let mut pid = None;
    let mut levels = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Pid:") {
            pid = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("NSpid:") {
            let n: Vec<&str> = v.split_whitespace().collect();
            if !n.is_empty() && n.iter().all(|x| x.parse::<i64>().is_ok()) {
                levels = Some(n.len());
            }
        }
    }
    (pid, levels)
}

/// The process that opened a connection, pinned at accept: a pidfd of it
/// (`SO_PEERPIDFD`, or `pidfd_open` of the `SO_PEERCRED` pid where the
/// kernel lacks it) and its start time. Every request is checked through
/// it: the connector must still run, under the same pid and start time.
/// A connection is not passed on: a process that received one from its
/// (exited) connector is refused, so the credentials of a dead process,
/// whose pid another process may hold by now, never authorize anything.
pub(in crate::helper) struct Connector {
    /// `SO_PEERCRED` at accept.
    pub(in crate::helper) caller: Caller,
    /// `None` when the connector was gone already, or its pid is not
    /// visible in our pid namespace (then no pid it names is ours).
    pub(in crate::helper) pidfd: Option<OwnedFd>,
    pub(in crate::helper) start_ticks: Option<u64>,
    /// How the pidfd was had (`SO_PEERPIDFD`, `pidfd_open`), for messages.
    pub(in crate::helper) how: &'static str,
}

impl Connector {
    pub(in crate::helper) fn pin(
        stream: &UnixStream,
        caller: Caller,
        peer_pidfd: bool,
    ) -> Connector {
        let kernel = if peer_pidfd {
            match crate::sys::socket::peer_pidfd(stream.as_fd()) {
                Ok(fd) => Some(Ok(fd)),
                Err(e) => match e.raw_os_error() {
                    // The kernel does not know the option: the fallback.
                    Some(libc::ENOPROTOOPT) => None,
                    // The connector is gone (no task to make a pidfd of).
                    _ => Some(Err(e)),
                },
            }
        } else {
            None
        };
        let (pidfd, how) = match kernel {
            Some(Ok(fd)) => (Some(fd), "SO_PEERPIDFD"),
            Some(Err(_)) => (None, "SO_PEERPIDFD"),
            None if caller.pid == 0 => (None, "pidfd_open"),
            None => (pidfd_open(caller.pid).ok(), "pidfd_open"),
        };
        let start_ticks = pidfd.as_ref().and_then(|fd| {
            let st = start_ticks(caller.pid)?;
            // Read while it lived: the start time is its own.
            (!crate::sys::pidfd::exited(fd.as_fd())).then_some(st)
        });
        Connector {
            caller,
            pidfd,
            start_ticks,
            how,
        }
    }

    /// The caller of a request on this connection, and whether it is in
    /// the helper's pid namespace; refused when the process that connected
    /// has exited (or its pid names another process now).
    pub(in crate::helper) fn verify(&self) -> Result<(Caller, bool), WireError> {
        let gone = || {
            refusal(
                ErrorCode::Forbidden,
                format!(
                    "the process that opened this connection has exited (checked by {}): \
                     a connection is not passed on; connect again",
                    self.how
                ),
            )
        };
        if self.caller.pid == 0 {
            // Not visible here: another pid namespace. Its pids are not
            // ours; queries that name none are still answered.
            return Ok((self.caller, false));
        }
        let (Some(fd), Some(start)) = (&self.pidfd, self.start_ticks) else {
            return Err(gone());
        };
        if crate::sys::pidfd::exited(fd.as_fd()) {
            return Err(gone());
        }
        let info = std::fs::read_to_string(
            crate::sys::procfs::ProcRoot::default().of_self(&format!("fdinfo/{}", fd.as_raw_fd())),
        )
        .map_err(|e| {
            refusal(
                ErrorCode::Failed,
                format!("cannot read the connecting process's pidfd: {e}"),
            )
        })?;
        let (pid, levels) = parse_pidfd_fdinfo(&info);
        if pid != Some(i64::from(self.caller.pid)) {
            return Err(gone());
        }
        // The pid is the connector's while it lives (checked last): what
        // is read under it is the connector's.
        let same_ns = match levels {
            Some(n) => n == 1,
            None => {
                pid_namespace(&self.caller.pid.to_string()) == pid_namespace("self")
                    && pid_namespace("self").is_some()
            }
        };
        if start_ticks(self.caller.pid) != Some(start) || crate::sys::pidfd::exited(fd.as_fd()) {
            return Err(gone());
        }
        Ok((self.caller, same_ns))
    }
}

/// Refuses an fd that is not a socket before anything duplicates it: a
/// file (on a FUSE mount its owner serves, say) could block `fstat` or
/// `close` of the duplicate forever. Reading the link names the file
/// without calling into its filesystem.
pub(in crate::helper) fn check_socket_fd(pid: u32, fd: i32) -> Result<(), WireError> {
    match std::fs::read_link(
        crate::sys::procfs::ProcRoot::default().of_pid(pid, &format!("fd/{fd}")),
    ) {
        Ok(link) if crate::proc::socket_inode_of_target(&link.to_string_lossy()).is_some() => {
            Ok(())
        }
        Ok(_) => Err(refusal(
            ErrorCode::Failed,
            format!("fd {fd} of pid {pid} is not a socket: left alone"),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(refusal(
            ErrorCode::Failed,
            format!("pid {pid} has no fd {fd}"),
        )),
        Err(e) => Err(refusal(
            ErrorCode::Failed,
            format!("cannot read fd {fd} of pid {pid}: {e}"),
        )),
    }
}

/// Who `target` is now: its uids, start time and executable, read while
/// the pidfd says it lives.
pub(in crate::helper) fn identity(target: &Pidfd) -> Option<Identity> {
    let pid = target.pid();
    let t = read_target(pid)?;
    let start = start_ticks(pid)?;
    let exe = std::fs::read_link(crate::sys::procfs::ProcRoot::default().of_pid(pid, "exe")).ok();
    target.is_alive().then_some(Identity {
        target: t,
        start_ticks: start,
        exe,
    })
}

/// A process a query may read: pinned by its pidfd, with the authority
/// that allowed it and what that authority saw of it. What is read of it
/// is answered only once [`Pinned::still_readable`] says so.
pub(in crate::helper) struct Pinned {
    pub(in crate::helper) fd: Pidfd,
    authority: Authority,
    before: Option<selfheal_core::access::authority::Seen>,
}

impl Pinned {
    /// Whether what was read of the process since it was authorized may
    /// be answered: it still lives, and is the process that was
    /// authorized, running the same program (an exec keeps the pid and
    /// the start time: a setuid program's state read after its exec is
    /// not the caller's to see), and the caller may still read it.
    pub(in crate::helper) fn still_readable(&self) -> bool {
        self.fd.is_alive()
            && self
                .authority
                .reauthorize(&self.fd, self.before.as_ref())
                .is_ok()
            && self.fd.is_alive()
    }
}

/// Pids a query may name: (pid, start ticks) of those it may, those that
/// do not exist (told apart only to callers that may see every process),
/// and those it may not.
pub(in crate::helper) struct Authorized<T = (u32, u64)> {
    pub(in crate::helper) ok: Vec<T>,
    pub(in crate::helper) gone: Vec<u32>,
    pub(in crate::helper) refused: Vec<u32>,
}

impl Shared {
    /// Pids in requests are read in the helper's pid namespace: a caller in
    /// another one (a container) would name other processes than it means.
    pub(in crate::helper) fn check_pid_namespace(
        &self,
        caller: &Caller,
        same_ns: bool,
    ) -> Result<(), WireError> {
        let forbidden = |m: String| refusal(ErrorCode::Forbidden, m);
        if caller.pid == 0 {
            return Err(forbidden(
                "the caller's pid is not visible to the helper (another pid namespace): \
                 the pids it names are not the helper's"
                    .into(),
            ));
        }
        if !same_ns || self.pid_ns.is_none() {
            return Err(forbidden(format!(
                "the caller (pid {}) is not in the helper's pid namespace: \
                 the pids it names are not the helper's",
                caller.pid
            )));
        }
        Ok(())
    }

    /// The one answer a caller gets for a pid it may not reach, whether the
    /// pid exists or not and whatever its start time: nothing in it tells
    /// one case from another.
    pub(in crate::helper) fn out_of_reach(caller: &Caller, verb: &str, pid: u32) -> WireError {
        refusal(
            ErrorCode::Forbidden,
            format!(
                "uid {} may not {verb} pid {pid}: no process it may reach has that pid and start time",
                caller.uid
            ),
        )
    }

    /// Pins `pid` for `caller` and checks that the caller may reach it.
    /// For a caller that may not reach every process, every case it may
    /// not know of (no such pid, another uid's process, a start time that
    /// is not its process's) is [`Shared::out_of_reach`]; and nothing is
    /// opened before the policy allows it.
    pub(in crate::helper) fn pin_for(
        &self,
        caller: &Caller,
        verb: &str,
        pid: u32,
        start: Option<u64>,
    ) -> Result<(Pidfd, TargetProcess), WireError> {
        if caller.uid == 0 {
            return pin(pid, start);
        }
        let hidden = || Self::out_of_reach(caller, verb, pid);
        let reachable =
            |t: &TargetProcess| t.uids.iter().all(|u| self.policy.may_reach(caller.uid, *u));
        let before = read_target(pid).ok_or_else(hidden)?;
        if !reachable(&before) {
            return Err(hidden());
        }
        let (fd, after) = match pin(pid, start) {
            Ok(v) => v,
            // The pid names another process than the one asked for: say so
            // only when that one is the caller's too.
            Err(e) if e.code == ErrorCode::Gone => {
                return Err(match read_target(pid) {
                    Some(t) if reachable(&t) && start_ticks(pid).is_some() => refusal(
                        ErrorCode::Gone,
                        format!("pid {pid} is no longer the process that was judged"),
                    ),
                    _ => hidden(),
                });
            }
            Err(e) if e.code == ErrorCode::BadRequest => return Err(e),
            Err(_) => return Err(hidden()),
        };
        if !reachable(&after) {
            return Err(hidden());
        }
        Ok((fd, after))
    }

    /// Pins and authorizes `pids` for a query, pid by pid.
    pub(in crate::helper) fn authorize_query(
        &self,
        caller: &Caller,
        same_ns: bool,
        pids: &[u32],
    ) -> Result<Authorized, WireError> {
        let Authorized { ok, gone, refused } =
            self.authorize_query_pinned(caller, same_ns, pids)?;
        Ok(Authorized {
            ok: ok
                .iter()
                .map(|p| (p.fd.pid(), p.fd.start_ticks()))
                .collect(),
            gone,
            refused,
        })
    }

    /// [`Shared::authorize_query`], with each authorized process pinned by
    /// its pidfd, for a query that reads the process itself.
    pub(in crate::helper) fn authorize_query_pinned(
        &self,
        caller: &Caller,
        same_ns: bool,
        pids: &[u32],
    ) -> Result<Authorized<Pinned>, WireError> {
        self.check_pid_namespace(caller, same_ns)?;
        let mut out = Authorized {
            ok: Vec::new(),
            gone: Vec::new(),
            refused: Vec::new(),
        };
        for &pid in pids {
            let pinned = self
                .pin_for(caller, "query", pid, None)
                .and_then(|(fd, t)| {
                    self.policy
                        .check_query(caller, &t)
                        .map_err(|_| Self::out_of_reach(caller, "query", pid))?;
                    // Which thread waits on which socket is what the
                    // process's /proc/PID/fd tells: only for a caller the
                    // kernel would let read it (ptrace access).
                    let (authority, before) = Authority::check_seen(caller, &fd, &self.policy)
                        .map_err(|_| Self::out_of_reach(caller, "query", pid))?;
                    Ok(Pinned {
                        fd,
                        authority,
                        before,
                    })
                });
            match pinned {
                Ok(fd) => out.ok.push(fd),
                Err(e) if e.code == ErrorCode::Gone => out.gone.push(pid),
                Err(e) if e.code == ErrorCode::Forbidden => out.refused.push(pid),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfd_fdinfo_gives_the_pid_and_its_depth() {
        let ours = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1060\nPid:\t4242\nNSpid:\t4242\n";
        assert_eq!(parse_pidfd_fdinfo(ours), (Some(4242), Some(1)));
        let nested = "Pid:\t5000\nNSpid:\t5000\t2\n";
        assert_eq!(parse_pidfd_fdinfo(nested), (Some(5000), Some(2)));
        // Reaped: -1, and no NSpid numbers to count.
        assert_eq!(
            parse_pidfd_fdinfo("Pid:\t-1\nNSpid:\t-1\n"),
            (Some(-1), Some(1))
        );
        assert_eq!(parse_pidfd_fdinfo("Pid:\t0\n"), (Some(0), None));
        assert_eq!(parse_pidfd_fdinfo(""), (None, None));
        assert_eq!(parse_pidfd_fdinfo("Pid:\tx\nNSpid:\t1 y\n"), (None, None));
    }
}
