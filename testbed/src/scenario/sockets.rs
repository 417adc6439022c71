//! A process's sockets and waits, read from procfs: its TCP connections
//! (from its own network namespace's table) and the syscall each thread
//! waits in.

use std::{collections::BTreeMap, net::SocketAddr};

use anyhow::Context as _;
use serde::Serialize;

/// A TCP socket of a process: its fd, and its row of the process's own
/// namespace's `/proc/PID/net/tcp`.
#[derive(Clone, Debug, Serialize)]
pub struct TcpSocket {
    pub fd: i32,
    pub inode: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The kernel's TCP state (1: established).
    pub state: u8,
}

/// The IPv4 TCP sockets process `pid` holds.
pub fn tcp_sockets(pid: u32) -> anyhow::Result<Vec<TcpSocket>> {
    let mut fds = BTreeMap::new();
    let dir = format!("/proc/{pid}/fd");
    for e in std::fs::read_dir(&dir)
        .with_context(|| format!("cannot read {dir}"))?
        .flatten()
    {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let inode = selfheal::proc::socket_inode_of_target(&target.to_string_lossy());
        if let (Some(inode), Ok(fd)) = (inode, e.file_name().to_string_lossy().parse::<i32>()) {
            fds.insert(inode, fd);
        }
    }
    let path = format!("/proc/{pid}/net/tcp");
    let table = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let hex = |s: &str| -> Option<SocketAddr> {
        let (ip, port) = s.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?;
        let port = u16::from_str_radix(port, 16).ok()?;
        Some(SocketAddr::from((
            std::net::Ipv4Addr::from(ip.to_ne_bytes()),
            port,
        )))
    };
    let mut out = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let Some(&fd) = f[9].parse::<u64>().ok().as_ref().and_then(|i| fds.get(i)) else {
            continue;
        };
        if let (Some(local), Some(remote)) = (hex(f[1]), hex(f[2])) {
            out.push(TcpSocket {
                fd,
                inode: f[9].parse().unwrap_or(0),
                local,
                remote,
                state: u8::from_str_radix(f[3], 16).unwrap_or(0),
            });
        }
    }
    Ok(out)
}

/// Process `pid`'s established connections to `remote`.
pub(super) fn connections_to(pid: u32, remote: SocketAddr) -> Vec<TcpSocket> {
    tcp_sockets(pid)
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.remote == remote && s.state == 1)
        .collect()
}

/// What each thread of `pid` waits in: `tid: syscall` (with `on fd N` for
/// a receive whose first argument is a socket in `fds`).
pub fn waits(pid: u32, fds: &[i32]) -> Vec<String> {
    let name = |nr: u64| match nr {
        0 => "read",
        7 => "poll",
        23 => "select",
        35 => "nanosleep",
        45 => "recvfrom",
        47 => "recvmsg",
        202 => "futex",
        230 => "clock_nanosleep",
        232 => "epoll_wait",
        270 => "pselect6",
        271 => "ppoll",
        281 => "epoll_pwait",
        288 => "accept4",
        441 => "epoll_pwait2",
        _ => "other",
    };
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(t.path().join("syscall")) else {
            continue;
        };
        let f: Vec<&str> = text.split_whitespace().collect();
        let Some(nr) = f.first().and_then(|n| n.parse::<u64>().ok()) else {
            out.push(format!(
                "{}: {}",
                t.file_name().to_string_lossy(),
                text.trim()
            ));
            continue;
        };
        let arg0 = f
            .get(1)
            .and_then(|a| i64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
        let on = match arg0 {
            Some(fd) if matches!(nr, 0 | 45 | 47) && fds.contains(&(fd as i32)) => {
                format!(" on the provider socket (fd {fd})")
            }
            _ => String::new(),
        };
        out.push(format!(
            "{}: {}{on}",
            t.file_name().to_string_lossy(),
            name(nr)
        ));
    }
    out.sort();
    out
}
