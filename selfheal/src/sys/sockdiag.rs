//! The kernel's sock_diag netlink interface, all of it: TCP sockets with
//! `tcp_info` (as `ss` reads them), and `SOCK_DESTROY` (as `ss -K`). Both go
//! through one request/response loop (`Diag`). Queries run in the
//! caller's network namespace or, with [`dump_tcp_in_netns_of`] and
//! [`destroy_by_inode_in`], in another one (through [`super::netns`]).

use selfheal_core::sockdiag::{TcpInfo, TcpSocket, TimerInfo};
use std::{net::SocketAddr, os::fd::AsFd, time::Duration};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};
use netlink_packet_sock_diag::{
    SockDiagDestroy, SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags, Timer, nlas::Nla},
};
use netlink_sys::{Socket, SocketAddr as NlAddr, protocols::NETLINK_SOCK_DIAG};

use super::netns;

/// Why a dump failed.
#[derive(Debug, thiserror::Error)]
pub enum SockDiagError {
    #[error("sock_diag: {op}: {source}")]
    Io {
        op: &'static str,
        source: std::io::Error,
    },
    #[error("sock_diag: malformed reply: {0}")]
    Malformed(String),
    /// The kernel refused the request (`ENOENT`: no TCP sock_diag, e.g. the
    /// `tcp_diag` module is not loaded).
    #[error("sock_diag: the kernel refused the dump: {}", std::io::Error::from_raw_os_error(-.0))]
    Kernel(i32),
    #[error("cannot enter the network namespace of pid {pid}: {reason}")]
    Netns { pid: u32, reason: String },
    /// The kernel refused `SOCK_DESTROY` (`EOPNOTSUPP` without
    /// `CONFIG_INET_DIAG_DESTROY`, `EPERM` without `CAP_NET_ADMIN`).
    #[error("the kernel refused SOCK_DESTROY: {}", std::io::Error::from_raw_os_error(-.0))]
    DestroyRefused(i32),
    #[error("no TCP socket with inode {0} in the socket's network namespace")]
    NoSuchInode(u64),
    #[error("cannot enter the socket's network namespace: {0}")]
    SocketNetns(String),
}

/// The TCP states worth reading: everything but LISTEN, TIME_WAIT and CLOSE.
/// Asking only for these keeps the kernel's walk short.
fn wanted_states() -> StateFlags {
    StateFlags::all() - StateFlags::LISTEN - StateFlags::TIME_WAIT - StateFlags::CLOSE
}

/// Every connected TCP socket (IPv4 and IPv6) of the caller's network namespace.
pub fn dump_tcp() -> Result<Vec<TcpSocket>, SockDiagError> {
    let mut diag = Diag::open()?;
    let mut out = Vec::new();
    for family in [AF_INET, AF_INET6] {
        diag.dump(family, ExtensionFlags::INFO, wanted_states(), |r| {
            out.push(convert(r))
        })?;
    }
    Ok(out)
}

/// [`dump_tcp`] inside the network namespace of `pid` (through
/// [`netns::run_in`], so the caller's namespace never changes).
pub fn dump_tcp_in_netns_of(pid: u32) -> Result<Vec<TcpSocket>, SockDiagError> {
    let netns_err = |reason: String| SockDiagError::Netns { pid, reason };
    let target = netns::of_pid(pid).map_err(|e| netns_err(e.to_string()))?;
    netns::run_in(&target, dump_tcp).map_err(|e| netns_err(e.to_string()))?
}

/// The local addresses of every listening TCP socket (IPv4 and IPv6) in
/// the network namespace of `pid`: what tells a connection that was
/// accepted from one that was made.
pub fn listening_in_netns_of(pid: u32) -> Result<Vec<SocketAddr>, SockDiagError> {
    let netns_err = |reason: String| SockDiagError::Netns { pid, reason };
    let target = netns::of_pid(pid).map_err(|e| netns_err(e.to_string()))?;
    netns::run_in(&target, || {
        let mut diag = Diag::open()?;
        let mut out = Vec::new();
        for family in [AF_INET, AF_INET6] {
            diag.dump(family, ExtensionFlags::empty(), StateFlags::LISTEN, |r| {
                let id = &r.header.socket_id;
                out.push(SocketAddr::new(id.source_address, id.source_port));
            })?;
        }
        Ok(out)
    })
    .map_err(|e| netns_err(e.to_string()))?
}

/// Destroys (`SOCK_DESTROY`, as `ss -K`) the TCP socket with `inode` in the
/// network namespace `ns` (the socket's own, from `SIOCGSKNS`): finds it in
/// a dump of `families`, then sends back its 4-tuple, interface and cookie
/// (the cookie makes sure it is this socket and no other) and checks the
/// kernel's ack. Returns its addresses and cookie.
pub fn destroy_by_inode_in(
    ns: &(impl AsFd + Sync),
    families: &[u8],
    inode: u64,
) -> Result<(SocketAddr, SocketAddr, u64), SockDiagError> {
    netns::run_in(ns, || destroy_by_inode(families, inode))
        .map_err(|e| SockDiagError::SocketNetns(e.to_string()))?
}

/// [`destroy_by_inode_in`] in the calling thread's network namespace.
fn destroy_by_inode(
    families: &[u8],
    inode: u64,
) -> Result<(SocketAddr, SocketAddr, u64), SockDiagError> {
    let mut diag = Diag::open()?;
    for &family in families {
        // Every state: a socket to destroy may be in any (CLOSE-WAIT, ...).
        let mut found = None;
        diag.dump(family, ExtensionFlags::empty(), StateFlags::all(), |r| {
            if found.is_none() && u64::from(r.header.inode) == inode {
                found = Some((r.header.family, r.header.socket_id.clone()));
            }
        })?;
        let Some((family, id)) = found else {
            continue;
        };
        let local = SocketAddr::new(id.source_address, id.source_port);
        let remote = SocketAddr::new(id.destination_address, id.destination_port);
        let cookie = u64::from_ne_bytes(id.cookie);
        diag.destroy(family, id)?;
        return Ok((local, remote, cookie));
    }
    Err(SockDiagError::NoSuchInode(inode))
}

/// Replies are read with this timeout, so a kernel that never answers
/// cannot hang a check or the helper.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// A `NETLINK_SOCK_DIAG` socket of the calling thread's network namespace,
/// and the one request/response loop ([`Diag::recv_until`]) that both the
/// dump and `SOCK_DESTROY` use.
struct Diag {
    socket: Socket,
    seq: u32,
    rx: Vec<u8>,
}

impl Diag {
    fn open() -> Result<Diag, SockDiagError> {
        let io = |op| move |source| SockDiagError::Io { op, source };
        let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(io("socket"))?;
        socket.bind_auto().map_err(io("bind"))?;
        socket.connect(&NlAddr::new(0, 0)).map_err(io("connect"))?;
        socket.set_rx_buf_sz(1 << 20).map_err(io("setsockopt"))?;
        super::socket::set_receive_timeout(socket.as_fd(), REPLY_TIMEOUT.as_secs())
            .map_err(io("setsockopt"))?;
        Ok(Diag {
            socket,
            seq: 0,
            rx: vec![0u8; 1 << 16],
        })
    }

    /// Sends one request with the next sequence number, which it returns.
    fn send<M: NetlinkSerializable>(
        &mut self,
        flags: u16,
        payload: NetlinkPayload<M>,
    ) -> Result<u32, SockDiagError> {
        self.seq += 1;
        let buf = request(flags, self.seq, payload);
        self.socket
            .send(&buf, 0)
            .map_err(|source| SockDiagError::Io { op: "send", source })?;
        Ok(self.seq)
    }

    /// Receives netlink messages, handing each to `f` until it returns
    /// `Some(result)`. Bounded by the receive timeout and a read count.
    fn recv_until<T>(
        &mut self,
        mut f: impl FnMut(NetlinkMessage<SockDiagMessage>) -> Option<Result<T, SockDiagError>>,
    ) -> Result<T, SockDiagError> {
        // A 64 KiB read holds hundreds of sockets: this allows millions.
        for _ in 0..100_000 {
            let n = self
                .socket
                .recv(&mut &mut self.rx[..], 0)
                .map_err(|source| SockDiagError::Io { op: "recv", source })?;
            let mut offset = 0;
            while offset < n {
                let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&self.rx[offset..n])
                    .map_err(|e| SockDiagError::Malformed(e.to_string()))?;
                let len = msg.header.length as usize;
                if let Some(done) = f(msg) {
                    return done;
                }
                if len == 0 {
                    return Err(SockDiagError::Malformed("zero-length message".into()));
                }
                offset += len;
            }
        }
        Err(SockDiagError::Malformed("dump did not end".into()))
    }

    /// Dumps `family`'s TCP sockets in `states`, handing each to `each`, and
    /// reads the dump to its end (`NLMSG_DONE`), so the socket is clean for
    /// the next request.
    fn dump(
        &mut self,
        family: u8,
        extensions: ExtensionFlags,
        states: StateFlags,
        mut each: impl FnMut(&InetResponse),
    ) -> Result<(), SockDiagError> {
        self.send(
            NLM_F_REQUEST | NLM_F_DUMP,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions,
                states,
                socket_id: any_socket(family),
            })
            .into(),
        )?;
        self.recv_until(|msg| match msg.payload {
            NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                each(&r);
                None
            }
            NetlinkPayload::Done(_) => Some(Ok(())),
            NetlinkPayload::Error(e) => {
                Some(Err(SockDiagError::Kernel(e.code.map_or(0, |c| c.get()))))
            }
            _ => None,
        })
    }

    /// `SOCK_DESTROY` of the socket `id` (as a dump reported it, cookie
    /// included), waiting for the kernel's ack.
    fn destroy(&mut self, family: u8, id: SocketId) -> Result<(), SockDiagError> {
        let seq = self.send(NLM_F_REQUEST | NLM_F_ACK, destroy_payload(family, id))?;
        self.recv_until(|msg| match msg.payload {
            NetlinkPayload::Error(e) if msg.header.sequence_number == seq => Some(match e.code {
                None => Ok(()),
                Some(c) => Err(SockDiagError::DestroyRefused(c.get())),
            }),
            _ => None,
        })
    }
}

/// The wildcard socket id of a dump.
fn any_socket(family: u8) -> SocketId {
    if family == AF_INET {
        SocketId::new_v4()
    } else {
        SocketId::new_v6()
    }
}

/// One netlink request, serialized.
fn request<M: NetlinkSerializable>(flags: u16, seq: u32, payload: NetlinkPayload<M>) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(header, payload);
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

/// The `SOCK_DESTROY` request's body: the same `struct inet_diag_req_v2` a
/// dump sends (family, `IPPROTO_TCP`, the socket id with its cookie), under
/// netlink message type 21 (`SOCK_DESTROY`, set by the crate's
/// [`SockDiagDestroy`] wrapper). Only the message type differs from a query.
fn destroy_payload(family: u8, id: SocketId) -> NetlinkPayload<SockDiagDestroy> {
    NetlinkPayload::InnerMessage(SockDiagDestroy::new(SockDiagMessage::InetRequest(
        InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id: id,
        },
    )))
}

fn convert(r: &InetResponse) -> TcpSocket {
    let h = &r.header;
    let id = &h.socket_id;
    let tcp_info = r.nlas.iter().find_map(|nla| match nla {
        Nla::TcpInfo(i) => Some(TcpInfo {
            rtt_us: i.rtt,
            rto_us: i.rto,
            unacked: i.unacked,
            retransmits: i.retransmits,
            backoff: i.backoff,
            probes: i.probes,
            last_data_recv_ms: i.last_data_recv,
            last_data_sent_ms: i.last_data_sent,
            last_ack_recv_ms: i.last_ack_recv,
            bytes_received: i.bytes_received,
            bytes_acked: i.bytes_acked,
            data_segs_in: i.data_segs_in,
            data_segs_out: i.data_segs_out,
        }),
        _ => None,
    });
    let timer = h.timer.as_ref().map(|t| match t {
        Timer::Retransmit(d, n) => TimerInfo {
            kind: "retransmit",
            expires_ms: d.as_millis() as u64,
            retransmits: *n,
        },
        Timer::KeepAlive(d) => TimerInfo {
            kind: "keepalive",
            expires_ms: d.as_millis() as u64,
            retransmits: 0,
        },
        Timer::TimeWait => TimerInfo {
            kind: "time_wait",
            expires_ms: 0,
            retransmits: 0,
        },
        Timer::Probe(d) => TimerInfo {
            kind: "zero_window_probe",
            expires_ms: d.as_millis() as u64,
            retransmits: 0,
        },
    });
    TcpSocket {
        timer,
        inode: u64::from(h.inode),
        cookie: u64::from_ne_bytes(id.cookie),
        local: SocketAddr::new(id.source_address, id.source_port),
        remote: SocketAddr::new(id.destination_address, id.destination_port),
        state: selfheal_core::model::TcpState::from_kernel(h.state),
        uid: h.uid,
        recv_queue: h.recv_queue,
        send_queue: h.send_queue,
        tcp_info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_sock_diag::SOCK_DESTROY;

    #[test]
    fn destroy_request_is_an_inet_diag_req_v2_of_type_sock_destroy() {
        let id = SocketId {
            source_port: 0x1234,
            destination_port: 80,
            source_address: "10.0.0.1".parse().unwrap(),
            destination_address: "10.0.0.2".parse().unwrap(),
            interface_id: 7,
            cookie: 0xdead_beef_u64.to_ne_bytes(),
        };
        let buf = request(NLM_F_REQUEST | NLM_F_ACK, 9, destroy_payload(AF_INET, id));
        // nlmsghdr (16) + inet_diag_req_v2 (56).
        assert_eq!(buf.len(), 16 + 56);
        assert_eq!(u32::from_ne_bytes(buf[0..4].try_into().unwrap()), 72);
        assert_eq!(
            u16::from_ne_bytes(buf[4..6].try_into().unwrap()),
            SOCK_DESTROY
        );
        let flags = u16::from_ne_bytes(buf[6..8].try_into().unwrap());
        assert_eq!(flags, NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32::from_ne_bytes(buf[8..12].try_into().unwrap()), 9);
        let req = &buf[16..];
        assert_eq!((req[0], req[1]), (AF_INET, IPPROTO_TCP));
        // inet_diag_sockid: ports big-endian, then addresses, interface, cookie.
        assert_eq!(&req[8..10], &[0x12, 0x34]);
        assert_eq!(&req[10..12], &[0, 80]);
        assert_eq!(&req[12..16], &[10, 0, 0, 1]);
        assert_eq!(&req[28..32], &[10, 0, 0, 2]);
        assert_eq!(u32::from_ne_bytes(req[44..48].try_into().unwrap()), 7);
        assert_eq!(&req[48..56], &0xdead_beef_u64.to_ne_bytes());
    }

    /// Through the one loop on a real loopback connection of ours: the dump
    /// reports it with its addresses and `tcp_info`, and (as root: a refusal
    /// fails) destroying it by inode fails our read with `ECONNABORTED`,
    /// after which no socket has that inode.
    #[test]
    fn the_dump_reports_our_connection_and_destroy_ends_it() {
        use std::{io::Read as _, os::fd::AsRawFd as _, os::unix::fs::MetadataExt as _};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_server, _) = l.accept().unwrap();
        let inode = std::fs::metadata(format!("/proc/self/fd/{}", c.as_raw_fd()))
            .unwrap()
            .ino();
        let all = dump_tcp().unwrap();
        let mine = all.iter().find(|s| s.inode == inode).expect("our socket");
        assert_eq!(mine.local, c.local_addr().unwrap());
        assert_eq!(mine.remote, c.peer_addr().unwrap());
        assert_eq!(mine.state, selfheal_core::model::TcpState::Established);
        assert!(mine.tcp_info.is_some());
        // Another process's namespace (ours here) gives the same socket.
        let via_pid = dump_tcp_in_netns_of(std::process::id()).unwrap();
        assert!(
            via_pid
                .iter()
                .any(|s| s.inode == inode && s.cookie == mine.cookie)
        );

        let ns = netns::of_pid(std::process::id()).unwrap();
        match destroy_by_inode_in(&ns, &[AF_INET], inode) {
            Ok((local, remote, cookie)) => {
                assert_eq!(
                    (local, remote, cookie),
                    (mine.local, mine.remote, mine.cookie)
                );
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let e = c.read(&mut [0u8; 1]).unwrap_err();
                assert_eq!(e.raw_os_error(), Some(libc::ECONNABORTED), "{e}");
                let e = destroy_by_inode_in(&ns, &[AF_INET, AF_INET6], inode).unwrap_err();
                assert!(
                    matches!(e, SockDiagError::NoSuchInode(i) if i == inode),
                    "{e}"
                );
            }
            // Root is refused only by a kernel without
            // CONFIG_INET_DIAG_DESTROY, which the suite does not run on:
            // as root any refusal fails.
            Err(SockDiagError::DestroyRefused(e))
                // SAFETY: geteuid has no preconditions.
                if unsafe { libc::geteuid() } != 0
                    && (-e == libc::EPERM || -e == libc::EOPNOTSUPP) =>
            {
                eprintln!(
                    "SKIPPED destroy: not root, the kernel refused SOCK_DESTROY ({})",
                    std::io::Error::from_raw_os_error(-e)
                );
            }
            Err(e) => panic!("{e}"),
        }
    }
}
