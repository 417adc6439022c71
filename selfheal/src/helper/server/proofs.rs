//! The proofs the helper armed ([`ProofBook`], by socket cookie):
//! `restore_keepalive` puts back only what the helper itself recorded,
//! `expire_keepalive` ends only a proof it armed, and a proof nobody put
//! back in time ([`PROOF_RECORD_TTL`]) is put back by the helper itself
//! ([`put_back`]).

use std::collections::HashMap;

use selfheal_core::keepalive::KeepaliveSettings;

use crate::{
    actions::{ActionError, dup::SocketSeen, keepalive::restore_keepalive_chosen},
    sys::{
        pidfd::PidfdError,
        system::{Kernel, System},
    },
};

/// A proof keepalive the helper armed: the socket's own options before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The process, fd and inode it was armed through: the record is
    /// forgotten once that fd no longer holds that socket.
    pub pid: u32,
    pub start_ticks: u64,
    pub fd: i32,
    pub inode: u64,
    /// Who asked.
    pub uid: u32,
    pub previous: KeepaliveSettings,
    /// When it was armed: after [`PROOF_RECORD_TTL`] the helper puts the
    /// options back itself.
    pub at: std::time::Instant,
}

/// How long a proof may stay armed before the helper puts the socket's
/// options back on its own: a check comes back within a minute or two (a
/// proof holds a dead connection for two); one that has not in a quarter
/// of an hour is not coming, and a live connection must not keep the
/// proof's options.
pub const PROOF_RECORD_TTL: std::time::Duration = std::time::Duration::from_secs(900);

impl Recorded {
    /// Whether the socket is still where it was armed.
    fn live(&self) -> bool {
        crate::sys::pidfd::start_ticks(self.pid) == Some(self.start_ticks)
            && std::fs::read_link(
                crate::sys::procfs::ProcRoot::default()
                    .of_pid(self.pid, &format!("fd/{}", self.fd)),
            )
            .is_ok_and(|l| {
                l.as_os_str().as_encoded_bytes() == format!("socket:[{}]", self.inode).as_bytes()
            })
    }
}

/// The proofs the helper armed, by socket cookie, until they are put back
/// or expired (or their process is gone). Bounded: [`MAX_PROOFS`] in all,
/// [`MAX_PROOFS_PER_UID`] for one uid.
#[derive(Debug)]
pub struct ProofBook {
    entries: HashMap<u64, Recorded>,
    /// How long a proof may stay armed ([`PROOF_RECORD_TTL`]).
    ttl: std::time::Duration,
}

impl Default for ProofBook {
    fn default() -> ProofBook {
        ProofBook::new(PROOF_RECORD_TTL)
    }
}

/// Most proofs recorded at once.
pub const MAX_PROOFS: usize = 65_536;

/// Most proofs one uid may have recorded at once.
pub const MAX_PROOFS_PER_UID: usize = 4096;

impl ProofBook {
    /// A book whose proofs the helper puts back itself after `ttl`.
    pub fn new(ttl: std::time::Duration) -> ProofBook {
        ProofBook {
            entries: HashMap::new(),
            ttl,
        }
    }

    /// Whether `uid` may arm one more (after forgetting proofs whose
    /// process is gone); why not.
    pub fn room(&mut self, uid: u32) -> Result<(), NoRoom> {
        let mine = self.entries.values().filter(|r| r.uid == uid).count();
        if mine < MAX_PROOFS_PER_UID && self.entries.len() < MAX_PROOFS {
            return Ok(());
        }
        self.prune();
        let mine = self.entries.values().filter(|r| r.uid == uid).count();
        if mine >= MAX_PROOFS_PER_UID {
            return Err(NoRoom::Uid { uid, armed: mine });
        }
        if self.entries.len() >= MAX_PROOFS {
            return Err(NoRoom::Full);
        }
        Ok(())
    }

    /// Records a proof armed on socket `cookie`. A socket already recorded
    /// keeps its first record: a proof armed over another reads the first
    /// proof's options, not the socket's own.
    pub fn record(&mut self, cookie: u64, r: Recorded) {
        self.entries.entry(cookie).or_insert(r);
    }

    /// Forgets records whose socket is gone from where it was armed.
    pub fn prune(&mut self) {
        self.entries.retain(|_, r| r.live());
    }

    /// When the next record's time is up.
    pub fn next_due(&self) -> Option<std::time::Instant> {
        self.entries.values().map(|r| r.at + self.ttl).min()
    }

    /// Takes out the records whose time is up, for the helper to put back.
    pub fn due(&mut self) -> Vec<(u64, Recorded)> {
        let cookies: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, r)| r.at.elapsed() >= self.ttl)
            .map(|(c, _)| *c)
            .collect();
        cookies
            .into_iter()
            .filter_map(|c| self.entries.remove(&c).map(|r| (c, r)))
            .collect()
    }

    pub fn get(&self, cookie: u64) -> Option<&Recorded> {
        self.entries.get(&cookie)
    }

    pub fn take(&mut self, cookie: u64) -> Option<Recorded> {
        self.entries.remove(&cookie)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Why a caller may arm no more proof keepalives now.
#[derive(Debug, thiserror::Error)]
pub enum NoRoom {
    /// The caller's uid holds its share of the book.
    #[error(
        "uid {uid} has {armed} proof keepalives armed (at most {max}): put some back first",
        max = MAX_PROOFS_PER_UID
    )]
    Uid { uid: u32, armed: usize },
    /// The book is full.
    #[error("{max} proof keepalives are armed: try again later", max = MAX_PROOFS)]
    Full,
}

/// Why the helper could not put a proof's options back itself.
#[derive(Debug, thiserror::Error)]
pub enum PutBackError {
    /// The process it was armed through is gone, or its pid reused.
    #[error(transparent)]
    Process(#[from] PidfdError),
    /// The put-back was refused (the fd holds another socket) or failed.
    #[error(transparent)]
    Act(#[from] ActionError),
}

/// Puts back the options of a proof whose time is up (the helper on its
/// own): through a new pidfd of the process it was armed through, on that
/// fd, only while it still holds that socket (inode and cookie).
pub fn put_back(cookie: u64, r: &Recorded) -> Result<KeepaliveSettings, PutBackError> {
    put_back_on(&Kernel, cookie, r)
}

/// [`put_back`] on `sys`.
pub fn put_back_on<S: System>(
    sys: &S,
    cookie: u64,
    r: &Recorded,
) -> Result<KeepaliveSettings, PutBackError> {
    let target = sys.open(r.pid, Some(r.start_ticks))?;
    let choose = |seen: &SocketSeen<'_, S>| {
        if seen.cookie == Some(cookie) {
            Ok(r.previous.clone())
        } else {
            Err(ActionError::Refused {
                why: "the fd holds another socket now".into(),
            })
        }
    };
    Ok(restore_keepalive_chosen(
        sys,
        &target,
        r.fd,
        Some(r.inode),
        &choose,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's keepalive options on a new socket.
    fn kernel_defaults() -> KeepaliveSettings {
        crate::sys::fake::KERNEL_KEEPALIVE
    }

    #[test]
    fn the_book_is_bounded_per_uid() {
        let mut b = ProofBook::default();
        // A socket of ours, where the records say they were armed.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&l);
        let inode =
            crate::proc::socket_inode_of_link(std::path::Path::new(&format!("/proc/self/fd/{fd}")))
                .unwrap();
        let r = |uid| Recorded {
            pid: std::process::id(),
            start_ticks: crate::sys::pidfd::start_ticks(std::process::id()).unwrap(),
            fd,
            inode,
            at: std::time::Instant::now(),
            uid,
            previous: kernel_defaults(),
        };
        for c in 0..MAX_PROOFS_PER_UID as u64 {
            b.room(5).unwrap();
            b.record(c, r(5));
        }
        assert!(b.room(5).unwrap_err().to_string().contains("at most 4096"));
        assert!(b.room(6).is_ok());
        // The first record of a socket is kept.
        let mut later = r(6);
        later.previous.enabled = true;
        b.record(0, later);
        assert!(!b.get(0).unwrap().previous.enabled);
        assert!(b.take(0).is_some() && b.take(0).is_none());
        // Once the socket is gone from its fd, its records go.
        drop(l);
        b.prune();
        assert!(b.is_empty());
    }

    /// A proof on the fake kernel's agent: its socket's own options were
    /// the kernel's defaults, and the proof's are on it now.
    fn armed() -> (crate::sys::fake::FakeKernel, Recorded) {
        use crate::sys::fake::{FD, FakeKernel, INODE, PID, START};
        let k = FakeKernel::agent();
        k.with(|w| {
            w.on_agent_socket(|s| {
                s.opts.insert((libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
                s.opts.insert((libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 1)
            })
        });
        let r = Recorded {
            pid: PID,
            start_ticks: START,
            fd: FD,
            inode: INODE,
            uid: 1000,
            previous: kernel_defaults(),
            at: std::time::Instant::now(),
        };
        (k, r)
    }

    #[test]
    fn the_helper_puts_back_a_proof_itself_only_on_the_socket_it_armed() {
        use crate::sys::fake::{COOKIE, INODE};
        let (k, r) = armed();
        // The cookie differs: the fd holds another socket by that inode.
        let e = put_back_on(&k, COOKIE + 1, &r).unwrap_err();
        assert_eq!(e.to_string(), "the fd holds another socket now");
        assert!(k.calls_of("setsockopt").is_empty(), "{:?}", k.calls());
        assert_eq!(put_back_on(&k, COOKIE, &r).unwrap(), r.previous);
        let s = k.socket(INODE);
        assert_eq!(s.opt(libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
        assert_eq!(s.opt(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 7200);
    }

    #[test]
    fn a_proof_whose_process_is_gone_or_reused_is_left_alone() {
        use crate::sys::fake::{COOKIE, START};
        let (k, r) = armed();
        k.with(|w| w.on_agent(|p| p.start_ticks = START + 1));
        let e = put_back_on(&k, COOKIE, &r).unwrap_err();
        assert!(
            matches!(e, PutBackError::Process(PidfdError::Reused { .. })),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("no longer the process that was judged"),
            "{e}"
        );
        k.with(|w| w.on_agent(|p| p.alive = false));
        let e = put_back_on(&k, COOKIE, &r).unwrap_err();
        assert_eq!(e.to_string(), "pid 100 is not running");
        assert!(k.calls_of("get_fd").is_empty(), "{:?}", k.calls());
    }
}
