//! TCP sockets from the kernel's sock_diag netlink interface (as `ss` reads
//! them), with `tcp_info`. Queries run in the caller's network namespace or,
//! with [`dump_tcp_in_netns_of`], in another process's.

use std::net::SocketAddr;

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags, Timer, nlas::Nla},
};
use netlink_sys::{Socket, SocketAddr as NlAddr, protocols::NETLINK_SOCK_DIAG};
pub use selfheal_core::sockdiag::*;

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
}

/// The TCP states worth reading: everything but LISTEN, TIME_WAIT and CLOSE.
/// Asking only for these keeps the kernel's walk short.
fn wanted_states() -> StateFlags {
    StateFlags::all() - StateFlags::LISTEN - StateFlags::TIME_WAIT - StateFlags::CLOSE
}

/// Every connected TCP socket (IPv4 and IPv6) of the caller's network namespace.
pub fn dump_tcp() -> Result<Vec<TcpSocket>, SockDiagError> {
    let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(|source| SockDiagError::Io {
        op: "socket",
        source,
    })?;
    socket
        .bind_auto()
        .map_err(|source| SockDiagError::Io { op: "bind", source })?;
    socket
        .connect(&NlAddr::new(0, 0))
        .map_err(|source| SockDiagError::Io {
            op: "connect",
            source,
        })?;
    socket
        .set_rx_buf_sz(1 << 20)
        .map_err(|source| SockDiagError::Io {
            op: "setsockopt",
            source,
        })?;
    let mut out = Vec::new();
    for (family, id) in [
        (AF_INET, SocketId::new_v4()),
        (AF_INET6, SocketId::new_v6()),
    ] {
        dump_family(&socket, family, id, &mut out)?;
    }
    Ok(out)
}

/// [`dump_tcp`] inside the network namespace of `pid`, from a short-lived
/// thread so the caller's namespace never changes.
pub fn dump_tcp_in_netns_of(pid: u32) -> Result<Vec<TcpSocket>, SockDiagError> {
    let netns_err = |reason: String| SockDiagError::Netns { pid, reason };
    let target =
        std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(|e| netns_err(e.to_string()))?;
    let ours =
        std::fs::metadata("/proc/thread-self/ns/net").map_err(|e| netns_err(e.to_string()))?;
    let theirs = target.metadata().map_err(|e| netns_err(e.to_string()))?;
    use std::os::unix::fs::MetadataExt as _;
    if (ours.dev(), ours.ino()) == (theirs.dev(), theirs.ino()) {
        return dump_tcp();
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&target, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| netns_err(e.to_string()))?;
            dump_tcp()
        })
        .join()
        .unwrap_or_else(|_| Err(netns_err("the query thread panicked".into())))
    })
}

fn dump_family(
    socket: &Socket,
    family: u8,
    id: SocketId,
    out: &mut Vec<TcpSocket>,
) -> Result<(), SockDiagError> {
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut packet = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::INFO,
            states: wanted_states(),
            socket_id: id,
        })
        .into(),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    socket
        .send(&buf, 0)
        .map_err(|source| SockDiagError::Io { op: "send", source })?;

    let mut rx = vec![0u8; 1 << 16];
    // A dump ends with NLMSG_DONE; bound the loop anyway (a 64 KiB read holds
    // hundreds of sockets, so this allows millions).
    for _ in 0..100_000 {
        let n = socket
            .recv(&mut &mut rx[..], 0)
            .map_err(|source| SockDiagError::Io { op: "recv", source })?;
        let mut offset = 0;
        while offset < n {
            let msg = NetlinkMessage::<SockDiagMessage>::deserialize(&rx[offset..n])
                .map_err(|e| SockDiagError::Malformed(e.to_string()))?;
            let len = msg.header.length as usize;
            match msg.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                    out.push(convert(&r))
                }
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return Err(SockDiagError::Kernel(e.code.map_or(0, |c| c.get())));
                }
                _ => {}
            }
            if len == 0 {
                return Err(SockDiagError::Malformed("zero-length message".into()));
            }
            offset += len;
        }
    }
    Err(SockDiagError::Malformed("dump did not end".into()))
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
        state: crate::model::TcpState::from_kernel(h.state),
        uid: h.uid,
        recv_queue: h.recv_queue,
        send_queue: h.send_queue,
        tcp_info,
    }
}
