//! Whom the helper counts a connection against, read at the edge: the
//! caller's user namespace (through the pidfd pinned at accept) walked up
//! to the helper's own, and `/etc/subuid` (read bounded, from a file only
//! root could have written, cached until it changes) with names from the
//! passwd database. The rules that decide are
//! [`selfheal_core::access::owner`]'s; [`ConnSet`] holds the open connections and
//! admits, or closes one to admit, by them.

use std::{
    collections::BTreeMap,
    io::Read as _,
    os::{
        fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
        unix::{fs::MetadataExt as _, net::UnixStream},
    },
    path::PathBuf,
    sync::{Arc, Mutex},
};

use selfheal_core::access::owner::{
    Account, Admission, ConnLimits, MAX_SUBUID_BYTES, Namespace, OpenConn, Subuids, account, admit,
};

/// The subordinate uid file read when no `--subuid` is given.
pub const DEFAULT_SUBUID: &str = "/etc/subuid";

/// User namespaces nest at most 32 deep.
const MAX_DEPTH: usize = 40;

/// Reads callers' owners: the subuid file (cached) and the helper's own
/// user namespace.
pub struct Owners {
    path: PathBuf,
    cache: Mutex<Cache>,
    /// Device and inode of the helper's user namespace.
    own_userns: Option<(u64, u64)>,
}

#[derive(Default)]
struct Cache {
    /// What the file was when it was read (`None`: missing or unreadable).
    key: Option<FileKey>,
    loaded: bool,
    subuids: Arc<Subuids>,
}

/// Device, inode, size, mtime and ctime: the file changed when any did.
type FileKey = (u64, u64, u64, i64, i64, i64, i64);

impl Owners {
    /// Reads `path` (`/etc/subuid` in production) when first needed, and
    /// again whenever it changes.
    pub fn new(path: PathBuf) -> Owners {
        let own_userns =
            std::fs::File::open(crate::sys::procfs::ProcRoot::default().of_self("ns/user"))
                .ok()
                .and_then(|f| f.metadata().ok())
                .map(|md| (md.dev(), md.ino()));
        Owners {
            path,
            cache: Mutex::default(),
            own_userns,
        }
    }

    /// Whom a caller of `uid` (as `SO_PEERCRED` says) counts against;
    /// `pidfd` is the process that connected, `pid` its pid (0 when not
    /// visible here).
    pub fn account(&self, uid: u32, pidfd: Option<BorrowedFd<'_>>, pid: u32) -> Account {
        let ns = if uid == 0 {
            Namespace::Initial
        } else {
            self.namespace(pidfd, pid)
        };
        let a = account(uid, &ns, &self.subuids());
        if let Some(why) = &a.unreadable {
            tracing::debug!(
                uid,
                pid,
                "helper: the caller's user namespace cannot be read ({why}); counted by its uid"
            );
        }
        a
    }

    /// Whom the watched process `pid` counts against (its share of the
    /// eBPF socket map): the owner of its real uid, by the same rules as a
    /// caller's. A process gone, or whose uid cannot be read, counts as
    /// root's: it makes no entries, and root's share is never a user's.
    pub fn of_process(&self, pid: u32) -> Account {
        let Ok(status) = crate::sys::procfs::ProcRoot::default()
            .process(pid)
            .and_then(|p| p.status())
        else {
            return Account::own(0);
        };
        let pidfd = crate::sys::pidfd::pidfd_open(pid).ok();
        self.account(status.ruid, pidfd.as_ref().map(|f| f.as_fd()), pid)
    }

    /// The ranges of the subuid file, read again when it changed.
    pub fn subuids(&self) -> Arc<Subuids> {
        let key = std::fs::metadata(&self.path).ok().map(|md| {
            (
                md.dev(),
                md.ino(),
                md.size(),
                md.mtime(),
                md.mtime_nsec(),
                md.ctime(),
                md.ctime_nsec(),
            )
        });
        let mut c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if !c.loaded || c.key != key {
            c.subuids = Arc::new(self.load());
            c.key = key;
            c.loaded = true;
        }
        c.subuids.clone()
    }

    /// Reads and parses the file; every problem is logged and leaves the
    /// ranges it could not give out (each uid then counts as its own).
    fn load(&self) -> Subuids {
        let path = self.path.display();
        let file = match crate::trust::open_trusted(
            &self.path,
            crate::sys::creds::euid(),
            crate::trust::Sticky::AboveItsOwn,
        ) {
            Ok(f) => f,
            Err(crate::trust::TrustError::Read { error, .. })
                if error.kind() == std::io::ErrorKind::NotFound =>
            {
                tracing::info!(
                    "helper: no {path}: no subordinate uid ranges, each uid outside a user namespace counts as its own"
                );
                return Subuids::default();
            }
            Err(crate::trust::TrustError::Read { path: p, error }) => {
                tracing::warn!(
                    "helper: cannot read {} ({error}): no subordinate uid ranges",
                    p.display()
                );
                return Subuids::default();
            }
            Err(crate::trust::TrustError::Untrusted { reason }) => {
                tracing::warn!("helper: ignoring {path}: {reason}; no subordinate uid ranges");
                return Subuids::default();
            }
        };
        let mut bytes = Vec::new();
        if let Err(e) = file
            .take(MAX_SUBUID_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
        {
            tracing::warn!("helper: cannot read {path} ({e}): no subordinate uid ranges");
            return Subuids::default();
        }
        if bytes.len() > MAX_SUBUID_BYTES {
            // Only whole lines of the first MiB.
            bytes.truncate(MAX_SUBUID_BYTES);
            let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            bytes.truncate(end);
            tracing::warn!(
                "helper: {path} is larger than {} MiB: only its first MiB is read",
                MAX_SUBUID_BYTES >> 20
            );
        }
        let text = String::from_utf8_lossy(&bytes);
        let parsed = Subuids::parse(&text, uid_of_name);
        if parsed.skipped_count > 0 || parsed.truncated {
            tracing::warn!("helper: {path}: {}", parsed.describe());
        } else {
            tracing::info!("helper: {path}: {}", parsed.describe());
        }
        parsed.subuids
    }

    /// The caller's user namespace, as far as it can be read.
    fn namespace(&self, pidfd: Option<BorrowedFd<'_>>, pid: u32) -> Namespace {
        let Some(own) = self.own_userns else {
            return Namespace::Unreadable("the helper cannot read its own user namespace".into());
        };
        let Some(pidfd) = pidfd else {
            return Namespace::Unreadable("no pidfd of the connecting process".into());
        };
        let ns = match userns_of(pidfd, pid) {
            Ok(fd) => fd,
            Err(e) => return Namespace::Unreadable(e.to_string()),
        };
        let mut cur = ns;
        if ns_id(&cur) == Some(own) {
            return Namespace::Initial;
        }
        for _ in 0..MAX_DEPTH {
            let owner = match crate::sys::ns::owner_uid(cur.as_fd()) {
                Ok(owner) => owner,
                Err(e) => return Namespace::Unreadable(format!("NS_GET_OWNER_UID: {e}")),
            };
            let parent = match crate::sys::ns::parent(cur.as_fd()) {
                Ok(parent) => parent,
                Err(e) => {
                    return Namespace::Unreadable(if e.raw_os_error() == Some(libc::EPERM) {
                        "its user namespace is not below the helper's".into()
                    } else {
                        format!("NS_GET_PARENT: {e}")
                    });
                }
            };
            if ns_id(&parent) == Some(own) {
                return Namespace::OwnedBy(owner);
            }
            cur = parent;
        }
        Namespace::Unreadable(format!("more than {MAX_DEPTH} user namespaces deep"))
    }
}

/// Device and inode of a namespace fd: which namespace it is.
fn ns_id(fd: &OwnedFd) -> Option<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd).ok()?;
    Some((st.st_dev, st.st_ino))
}

/// Why a caller's user namespace could not be had.
#[derive(Debug, thiserror::Error)]
enum NamespaceError {
    /// `PIDFD_GET_USER_NAMESPACE` failed other than for want of support.
    #[error("PIDFD_GET_USER_NAMESPACE: {source}")]
    Ioctl { source: std::io::Error },
    /// The kernel cannot name a pidfd's namespace, and the pid is not
    /// visible in the helper's pid namespace.
    #[error("its pid is not visible here and the kernel cannot name its namespace")]
    NoPid,
    /// `/proc/PID/ns/user` could not be opened.
    #[error("{}: {source}", path.display())]
    Open {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The pidfd's own fdinfo could not be read.
    #[error("the pidfd's fdinfo: {source}")]
    Fdinfo { source: std::io::Error },
    /// The process left `pid` while its namespace was opened.
    #[error("pid {pid} exited while its namespace was read")]
    Exited { pid: u32 },
}

/// A connection not admitted: the rules' refusal, in their words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct Busy {
    /// Who holds what, and the limit it meets.
    pub why: String,
}

/// The user namespace of the process behind `pidfd`: asked of the pidfd
/// itself, or where the kernel lacks that, opened under `/proc/PID` and
/// kept only when the pidfd says the process still lives under `pid`.
fn userns_of(pidfd: BorrowedFd<'_>, pid: u32) -> Result<OwnedFd, NamespaceError> {
    let e = match crate::sys::ns::userns_of_pidfd(pidfd) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    if !matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) {
        return Err(NamespaceError::Ioctl { source: e });
    }
    userns_by_proc(pidfd, pid)
}

/// [`userns_of`] where the kernel cannot name a pidfd's namespace: opened
/// under `/proc/PID`, kept only when the pidfd says the process still
/// lives under `pid`.
fn userns_by_proc(pidfd: BorrowedFd<'_>, pid: u32) -> Result<OwnedFd, NamespaceError> {
    if pid == 0 {
        return Err(NamespaceError::NoPid);
    }
    let path = crate::sys::procfs::ProcRoot::default().of_pid(pid, "ns/user");
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(source) => return Err(NamespaceError::Open { path, source }),
    };
    // The pid was the connector's while it lived: what was opened under
    // it is the connector's when it still lives under that pid now.
    let info = std::fs::read_to_string(
        crate::sys::procfs::ProcRoot::default().of_self(&format!("fdinfo/{}", pidfd.as_raw_fd())),
    )
    .map_err(|source| NamespaceError::Fdinfo { source })?;
    let (now, _) = super::authz::parse_pidfd_fdinfo(&info);
    if now != Some(i64::from(pid)) {
        return Err(NamespaceError::Exited { pid });
    }
    Ok(OwnedFd::from(f))
}

/// A user name's uid, from the passwd database.
fn uid_of_name(name: &str) -> Option<u32> {
    nix::unistd::User::from_name(name)
        .ok()
        .flatten()
        .map(|u| u.uid.as_raw())
}

/// The open connections: whom each counts against, whether it is idle,
/// and a way to close it.
#[derive(Default)]
pub struct ConnSet {
    open: BTreeMap<u64, Open>,
    next_id: u64,
    /// The idle clock: grows on every change, orders "idle the longest".
    seq: u64,
}

struct Open {
    owner: u32,
    idle_since: Option<u64>,
    /// The same socket, to shut down when evicted.
    closer: Option<UnixStream>,
}

impl ConnSet {
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Admits a connection of `who` (closing the oldest idle one of the
    /// largest holder above its share, if that is what it takes) and
    /// returns its id, or why not.
    pub fn admit(
        &mut self,
        who: &Account,
        limits: &ConnLimits,
        stream: &UnixStream,
    ) -> Result<u64, Busy> {
        let ids: Vec<u64> = self.open.keys().copied().collect();
        let view: Vec<OpenConn> = self
            .open
            .values()
            .map(|o| OpenConn {
                owner: o.owner,
                idle_since: o.idle_since,
            })
            .collect();
        match admit(&view, who, limits) {
            Admission::Admit => {}
            Admission::Busy(why) => return Err(Busy { why }),
            Admission::Evict {
                index,
                owner,
                held,
                share,
            } => {
                if let Some(o) = self.open.remove(&ids[index]) {
                    tracing::info!(
                        evicted_owner = owner,
                        held,
                        share,
                        admitted = %who,
                        "helper: closed an idle connection of the largest holder to admit another owner"
                    );
                    if let Some(s) = o.closer {
                        let msg = selfheal_core::protocol::Response::error(
                            None,
                            selfheal_core::protocol::ErrorCode::Busy,
                            format!(
                                "closed while idle: uid {owner} holds {held} connections, more than \
                                 its share ({share}), and another owner needed one; connect again later"
                            ),
                        )
                        .to_line();
                        // A send on a socket we hold; never blocks.
                        let _ = nix::sys::socket::send(
                            s.as_raw_fd(),
                            &msg,
                            nix::sys::socket::MsgFlags::MSG_DONTWAIT
                                | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
                        );
                        let _ = s.shutdown(std::net::Shutdown::Both);
                    }
                }
            }
        }
        self.seq += 1;
        self.next_id += 1;
        self.open.insert(
            self.next_id,
            Open {
                owner: who.owner,
                idle_since: Some(self.seq),
                closer: stream.try_clone().ok(),
            },
        );
        Ok(self.next_id)
    }

    /// Marks `id` as serving a request; `false` when it was closed to
    /// admit another owner (the request is then not served).
    pub fn start_request(&mut self, id: u64) -> bool {
        match self.open.get_mut(&id) {
            Some(o) => {
                o.idle_since = None;
                true
            }
            None => false,
        }
    }

    /// Marks `id` idle again.
    pub fn end_request(&mut self, id: u64) {
        self.seq += 1;
        if let Some(o) = self.open.get_mut(&id) {
            o.idle_since = Some(self.seq);
        }
    }

    /// Forgets `id` (its thread ended).
    pub fn remove(&mut self, id: u64) {
        self.open.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use std::os::{fd::AsFd as _, unix::fs::PermissionsExt as _};

    use super::*;

    #[test]
    fn the_helpers_own_namespace_is_initial() {
        let owners = Owners::new(PathBuf::from("/nonexistent/subuid"));
        let me = crate::sys::pidfd::Pidfd::open(std::process::id(), None).unwrap();
        assert_eq!(
            owners.namespace(Some(me.as_fd()), std::process::id()),
            Namespace::Initial
        );
        assert!(matches!(
            owners.namespace(None, 0),
            Namespace::Unreadable(_)
        ));
        assert!(owners.subuids().is_empty());
        // A plain uid, no file: its own owner.
        assert_eq!(owners.account(4242, None, 0).owner, 4242);
    }

    #[test]
    fn both_ways_to_the_namespace_agree() {
        let me = crate::sys::pidfd::Pidfd::open(std::process::id(), None).unwrap();
        let own = std::fs::File::open(crate::sys::procfs::ProcRoot::default().of_self("ns/user"))
            .unwrap();
        let own = ns_id(&OwnedFd::from(own));
        let by_proc = userns_by_proc(me.as_fd(), std::process::id()).unwrap();
        assert_eq!(ns_id(&by_proc), own);
        // Another pid than the pidfd's: refused, nothing opened.
        assert!(userns_by_proc(me.as_fd(), 1).is_err());
        assert!(userns_by_proc(me.as_fd(), 0).is_err());
        match userns_of(me.as_fd(), 0) {
            Ok(fd) => assert_eq!(ns_id(&fd), own),
            // A kernel before 6.11, and our pid not given: no way to it.
            Err(e) => assert!(e.to_string().contains("cannot name"), "{e}"),
        }
    }

    #[test]
    fn the_subuid_file_is_cached_until_it_changes() {
        let dir =
            std::env::temp_dir().join(format!("selfheal-limits-subuid-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = dir.join("subuid");
        std::fs::write(&file, "1000:100000:65536\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let owners = Owners::new(file.clone());
        assert_eq!(owners.account(100005, None, 0).owner, 1000);
        let first = owners.subuids();
        assert!(Arc::ptr_eq(&first, &owners.subuids()), "cached");
        std::fs::write(&file, "1001:100000:10\ngarbage\n").unwrap();
        assert_eq!(owners.account(100005, None, 0).owner, 1001);
        // Larger than the bound: only whole lines of the first MiB.
        let mut big = String::from("1002:100000:10\n");
        while big.len() <= MAX_SUBUID_BYTES {
            big.push_str("# padding padding padding padding padding padding\n");
        }
        big.push_str("1003:200000:10\n");
        std::fs::write(&file, &big).unwrap();
        assert_eq!(owners.account(100005, None, 0).owner, 1002);
        assert_eq!(owners.account(200005, None, 0).owner, 200005);
        // Writable by others: ignored, every uid its own.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(owners.account(100005, None, 0).owner, 100005);
        // Gone: every uid its own.
        std::fs::remove_file(&file).unwrap();
        assert_eq!(owners.account(100005, None, 0).owner, 100005);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_evicted_connection_serves_nothing_more() {
        let (a, _peer) = UnixStream::pair().unwrap();
        let limits = ConnLimits {
            max: 3,
            per_owner: 2,
            root_reserve: 1,
        };
        let mut set = ConnSet::default();
        let first = set.admit(&Account::own(7), &limits, &a).unwrap();
        let second = set.admit(&Account::own(7), &limits, &a).unwrap();
        assert!(set.start_request(second));
        // A second owner: 7 holds 2 of the 2 others may hold, above its
        // share of 1; its idle connection goes.
        let third = set.admit(&Account::own(8), &limits, &a).unwrap();
        assert!(!set.start_request(first), "evicted");
        assert!(set.start_request(third));
        set.end_request(second);
        assert_eq!(set.len(), 2);
        // Root: its reserve.
        assert!(set.admit(&Account::own(0), &limits, &a).is_ok());
        assert!(set.admit(&Account::own(9), &limits, &a).is_err());
        set.remove(second);
        set.remove(second);
        assert_eq!(set.len(), 2);
    }
}
