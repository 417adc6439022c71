//! What the collector asks of the kernel beyond procfs (which a
//! [`ProcRoot`] points at): the task iterators' walk of a process, the
//! sock_diag dump of a network namespace, and its listening addresses.
//! [`Live`] is the kernel itself; the tests' `FakeKernel` (`fake.rs`)
//! scripts each answer, so the collector's races (a process that exits
//! and whose pid is reused after its walk, a process gone at it, a
//! namespace gone before its dump, a refused dump) are tested without
//! root.

use super::{
    readers::{self, Walk},
    *,
};

/// A walk of the task iterators over one process.
pub(super) struct Walked {
    pub(super) pass: IterProcess,
    /// Where the iterators came from (`pinned` or `loaded`).
    pub(super) from: &'static str,
    /// Whether the process walked (the one its pidfd pinned) has exited
    /// by now. Still running after its `stat` was read, that `stat` was
    /// its own; exited, its pid may name another process since.
    pub(super) exited: Box<dyn Fn() -> bool + Send>,
}

/// The collector's reads of the kernel beyond procfs.
pub(super) trait CollectKernel: Send {
    /// Opens (or, with `load`, loads) the task iterators, ahead of a
    /// collection's budget; a failure is kept for [`CollectKernel::walk`]
    /// to report.
    fn ready_iterators(&mut self, load: bool);
    /// One walk of the task iterators over `pid`.
    fn walk(&mut self, pid: u32, load: bool) -> Result<Walked, Walk>;
    /// The TCP sockets of `pid`'s network namespace (sock_diag).
    fn dump_tcp(&mut self, pid: u32) -> Result<Vec<TcpSocket>, sockdiag::SockDiagError>;
    /// The listening addresses of `pid`'s network namespace.
    fn listening(&mut self, pid: u32) -> Result<Vec<SocketAddr>, sockdiag::SockDiagError>;
}

/// The kernel itself.
pub(super) struct Live;

impl CollectKernel for Live {
    fn ready_iterators(&mut self, load: bool) {
        drop(readers::open_iterators(load));
    }

    fn walk(&mut self, pid: u32, load: bool) -> Result<Walked, Walk> {
        readers::iterate(pid, load)
    }

    fn dump_tcp(&mut self, pid: u32) -> Result<Vec<TcpSocket>, sockdiag::SockDiagError> {
        sockdiag::dump_tcp_in_netns_of(pid)
    }

    fn listening(&mut self, pid: u32) -> Result<Vec<SocketAddr>, sockdiag::SockDiagError> {
        sockdiag::listening_in_netns_of(pid)
    }
}
