//! The collector's TCP connections: each network namespace's sock_diag
//! dump (made once, whoever needs it), the connections of the iterators'
//! passes, grouped by namespace, and the listening addresses that tell an
//! `[auto]` agent's accepted connections from the ones it made.

use super::*;

/// Why the listening addresses of a process's network namespace are
/// unread.
#[derive(Debug, thiserror::Error)]
pub(super) enum ListeningError {
    /// Its namespace could not be read (the process is gone).
    #[error("{}: {source}", path.display())]
    Netns {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The namespace's dump failed (once per namespace, shared by its
    /// processes).
    #[error(transparent)]
    Dump(std::sync::Arc<sockdiag::SockDiagError>),
}

impl Collector {
    /// The network namespace of `pid` (its inode, where it could be read)
    /// and its listening addresses (cached per namespace), or why they
    /// cannot be read.
    pub(super) fn listening_of(
        &mut self,
        pid: u32,
    ) -> (Option<u64>, Result<&[SocketAddr], ListeningError>) {
        use std::os::unix::fs::MetadataExt as _;
        let path = self.proc.of_pid(pid, "ns/net");
        let m = match std::fs::metadata(&path) {
            Ok(m) => m,
            Err(source) => return (None, Err(ListeningError::Netns { path, source })),
        };
        let kernel = &mut self.kernel;
        let l = self
            .listening
            .entry((m.dev(), m.ino()))
            .or_insert_with(|| kernel.listening(pid).map_err(std::sync::Arc::new));
        (
            Some(m.ino()),
            l.as_deref()
                .map_err(|e| ListeningError::Dump(std::sync::Arc::clone(e))),
        )
    }

    /// The TCP connections of `processes` by network namespace: from the
    /// task iterators' pass of each process whose pass read them (every
    /// namespace in that one pass, no dump), else from the (cached)
    /// sock_diag dump of its namespace, noting why in `collection`. A
    /// socket two processes hold is listed once.
    pub(super) fn sockets(
        &mut self,
        processes: &[ProcessInfo],
        passes: &BTreeMap<u32, TcpPass>,
        collection: &mut Collection,
    ) -> Vec<NetnsSockets> {
        let mut groups: Vec<(u32, u32, Vec<TcpSocket>)> = Vec::new();
        let mut seen = HashSet::new();
        let mut rest = Vec::new();
        for p in processes.iter().filter(|p| !p.sockets.is_empty()) {
            match passes.get(&p.pid) {
                Some(TcpPass::Read(conns)) => {
                    for c in conns.iter().filter(|c| seen.insert(c.socket.inode)) {
                        match groups.iter_mut().find(|(ns, _, _)| *ns == c.netns) {
                            Some((_, _, all)) => all.push(c.socket.clone()),
                            None => groups.push((c.netns, p.pid, vec![c.socket.clone()])),
                        }
                    }
                }
                Some(TcpPass::Unread(why)) => {
                    collection.sock_diag_for(why);
                    rest.push(p);
                }
                None => {
                    collection.sock_diag_for("procfs read the process");
                    rest.push(p);
                }
            }
        }
        let mut tcp: Vec<NetnsSockets> = groups
            .into_iter()
            .map(|(_, pid, all)| (pid, Ok(all)))
            .collect();
        if !rest.is_empty() {
            tcp.extend(self.dumped_sockets(&rest).into_iter().map(|(pid, found)| {
                let found = found.map(|all| {
                    all.into_iter()
                        .filter(|s| !seen.contains(&s.inode))
                        .collect()
                });
                (pid, found)
            }));
        }
        tcp
    }

    /// The sockets of `processes`, from the (cached) sock_diag dump of
    /// each network namespace they live in.
    pub(super) fn dumped_sockets(&mut self, processes: &[&ProcessInfo]) -> Vec<NetnsSockets> {
        let owned: BTreeSet<u64> = processes
            .iter()
            .flat_map(|p| p.sockets.iter().map(|(_, ino)| *ino))
            .collect();
        let mut tcp: Vec<NetnsSockets> = Vec::new();
        let mut seen_ns = BTreeSet::new();
        for p in processes.iter().filter(|p| !p.sockets.is_empty()) {
            let ns = match std::fs::metadata(self.proc.of_pid(p.pid, "ns/net")) {
                Ok(m) => {
                    use std::os::unix::fs::MetadataExt as _;
                    (m.dev(), m.ino())
                }
                // Its sockets are unread, and the report says why.
                Err(e) => {
                    tcp.push((p.pid, Err(format!("cannot read it ({e})"))));
                    continue;
                }
            };
            if !seen_ns.insert(ns) {
                continue;
            }
            let kernel = &mut self.kernel;
            let (via, dump) = self
                .dumps
                .entry(ns)
                .or_insert_with(|| (p.pid, kernel.dump_tcp(p.pid).map_err(|e| e.to_string())));
            // The agent's sockets, looked up by inode in the namespace's
            // index rather than by scanning its whole table for each agent,
            // and kept in the dump's order.
            let index = self.index.entry(ns).or_insert_with(|| {
                dump.as_ref().map_or_else(
                    |_| HashMap::new(),
                    |all| all.iter().enumerate().map(|(i, s)| (s.inode, i)).collect(),
                )
            });
            let mine = dump
                .as_ref()
                .map(|all| {
                    let mut at: Vec<usize> = owned
                        .iter()
                        .filter_map(|ino| index.get(ino).copied())
                        .collect();
                    at.sort_unstable();
                    at.into_iter().map(|i| all[i].clone()).collect()
                })
                .map_err(Clone::clone);
            tcp.push((*via, mine));
        }
        tcp
    }
}

/// Sockets by network namespace, in the order the namespaces are met
/// (one unreadable namespace, `None`, apiece); in each, every process's
/// in its dump's order, a socket two processes share once.
#[derive(Default)]
pub(super) struct ByNamespace {
    pub(super) sockets: Vec<(Option<u64>, NetnsSockets, HashSet<u64>)>,
}

impl ByNamespace {
    /// Adds process `pid`'s sockets in namespace `ns`, or why they could
    /// not be read (kept only while nothing of that namespace was read).
    // A `String` error: the helper's words as the wire and the core's
    // `NetnsSockets` carry them.
    pub(super) fn add(&mut self, ns: Option<u64>, pid: u32, found: Result<Vec<TcpSocket>, String>) {
        let slot = self
            .sockets
            .iter_mut()
            .find(|(n, _, _)| ns.is_some() && *n == ns);
        match (slot, found) {
            (Some((_, (_, Ok(all)), seen)), Ok(mine)) => {
                all.extend(mine.into_iter().filter(|s| seen.insert(s.inode)));
            }
            (Some((_, got @ (_, Err(_)), seen)), Ok(mine)) => {
                seen.extend(mine.iter().map(|s| s.inode));
                *got = (pid, Ok(mine));
            }
            (Some(_), Err(_)) => {}
            (None, found) => {
                let seen = found.iter().flatten().map(|s| s.inode).collect();
                self.sockets.push((ns, (pid, found), seen));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// This process as an `[auto]` agent whose upstream is `provider`.
    fn outbound(provider: SocketAddr) -> Target {
        let pid = std::process::id();
        Target {
            agent: Some("auto.me".into()),
            rule: format!("pid={pid}"),
            roots: vec![pid],
            pids: vec![pid],
            problem: None,
            upstream_of: Box::new(move |a| (a == provider).then_some((SocketRole::Provider, 0))),
            upstreams: vec![provider.to_string()],
            roles: Roles::Outbound,
            containers: Vec::new(),
            container_gaps: Vec::new(),
            unread_cmdlines: None,
        }
    }

    /// The kernel, but one whose namespaces' listeners cannot be read.
    struct NoListeners;

    impl super::super::kernel::CollectKernel for NoListeners {
        fn ready_iterators(&mut self, load: bool) {
            super::super::kernel::Live.ready_iterators(load);
        }

        fn walk(&mut self, pid: u32, load: bool) -> Result<super::super::kernel::Walked, Walk> {
            super::super::kernel::Live.walk(pid, load)
        }

        fn dump_tcp(&mut self, pid: u32) -> Result<Vec<TcpSocket>, sockdiag::SockDiagError> {
            super::super::kernel::Live.dump_tcp(pid)
        }

        fn listening(&mut self, pid: u32) -> Result<Vec<SocketAddr>, sockdiag::SockDiagError> {
            Err(sockdiag::SockDiagError::Netns {
                pid,
                reason: "EPERM: Operation not permitted".into(),
            })
        }
    }

    fn collector() -> Collector {
        let opts = CollectOptions {
            no_ebpf: true,
            no_iterators: Some("a unit test".into()),
            ..CollectOptions::default()
        };
        Collector::new(&opts, &[std::process::id()])
    }

    fn inode(fd: &impl std::os::fd::AsRawFd) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap()
            .ino()
    }

    /// A connection this process made to its own listener, and the one it
    /// accepted: the made one is the provider's, the accepted one has no
    /// role; where the listeners cannot be read, neither has one and the
    /// evidence names the pid, the namespace and the error.
    fn socket(inode: u64) -> TcpSocket {
        TcpSocket {
            inode,
            cookie: inode,
            local: "127.0.0.1:1000".parse().unwrap(),
            remote: "127.0.0.1:2000".parse().unwrap(),
            state: selfheal_core::model::TcpState::Established,
            uid: 0,
            recv_queue: 0,
            send_queue: 0,
            timer: None,
            tcp_info: None,
        }
    }

    /// A namespace's group as inodes: namespace, pid, the inodes or why not.
    type Group = (Option<u64>, u32, Result<Vec<u64>, String>);

    fn inodes(b: &ByNamespace) -> Vec<Group> {
        b.sockets
            .iter()
            .map(|(ns, (pid, found), _)| {
                let found = found
                    .as_ref()
                    .map(|all| all.iter().map(|s| s.inode).collect())
                    .map_err(Clone::clone);
                (*ns, *pid, found)
            })
            .collect()
    }

    /// Two processes of one namespace sharing a socket: listed once, in
    /// the order met; a namespace first unreadable through one process
    /// is taken from the next that reads it, and an error after a read is
    /// dropped; unknown namespaces (`None`) are one apiece.
    #[test]
    fn sockets_are_grouped_by_namespace_once_each() {
        let mut b = ByNamespace::default();
        b.add(Some(1), 10, Ok(vec![socket(5), socket(6)]));
        b.add(Some(1), 11, Ok(vec![socket(6), socket(7)]));
        b.add(Some(1), 12, Err("gone".into()));
        b.add(Some(2), 20, Err("EPERM".into()));
        b.add(Some(2), 21, Ok(vec![socket(8)]));
        b.add(Some(2), 22, Ok(vec![socket(8), socket(9)]));
        b.add(None, 30, Err("no ns".into()));
        b.add(None, 31, Ok(vec![socket(5)]));
        assert_eq!(
            inodes(&b),
            [
                (Some(1), 10, Ok(vec![5, 6, 7])),
                (Some(2), 21, Ok(vec![8, 9])),
                (None, 30, Err("no ns".into())),
                (None, 31, Ok(vec![5])),
            ]
        );
    }

    /// A process gone before its namespace is read: no namespace, and the
    /// error names the file that could not be read (on the real procfs).
    #[test]
    fn the_listeners_of_a_gone_process_are_an_error_naming_the_file() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let mut c = collector();
        let (netns, read) = c.listening_of(pid);
        assert_eq!(netns, None);
        let error = read.unwrap_err();
        assert!(matches!(error, ListeningError::Netns { .. }), "{error:?}");
        let error = error.to_string();
        assert!(
            error.starts_with(&format!("/proc/{pid}/ns/net: ")),
            "{error}"
        );
    }

    #[test]
    fn unread_listeners_leave_no_role_and_are_said() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let made = TcpStream::connect(at).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (made, accepted) = (inode(&made), inode(&accepted));
        let target = outbound(at);

        let ev = collector().collect(&target);
        assert!(ev.unread_listening.is_empty());
        assert_eq!(
            ev.roles.get(&made),
            Some(&(SocketRole::Provider, 0)),
            "{:?}",
            ev.roles
        );
        assert!(!ev.roles.contains_key(&accepted));

        let mut c = collector();
        c.kernel = Box::new(NoListeners);
        let ev = c.collect(&target);
        assert!(ev.roles.is_empty(), "{:?}", ev.roles);
        let pid = std::process::id();
        use std::os::unix::fs::MetadataExt as _;
        let netns = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        assert_eq!(
            ev.unread_listening,
            [UnreadListening {
                pid,
                netns: Some(netns),
                error: format!(
                    "cannot enter the network namespace of pid {pid}: EPERM: Operation not \
                     permitted"
                ),
            }]
        );
        let report = selfheal_core::inspect::build(&ev);
        assert_eq!(
            selfheal_core::judge::unjudgeable(&report).as_deref(),
            Some(
                format!(
                    "listening sockets of pid {pid}'s network namespace (net:[{netns}]) \
                     unreadable: cannot enter the network namespace of pid {pid}: EPERM: \
                     Operation not permitted; its connections cannot be told accepted from \
                     made, none was judged"
                )
                .as_str()
            )
        );
    }
}
