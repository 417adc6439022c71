//! A process's sockets and waits, read from procfs: its TCP connections
//! (from its own network namespace's table) and the syscall each thread
//! waits in.

use std::{collections::BTreeMap, net::SocketAddr};

use anyhow::Context as _;
use procfs::process::{FDTarget, Process};
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

/// The IPv4 TCP sockets process `pid` holds: its socket fds, joined by
/// inode with its network namespace's TCP table.
pub fn tcp_sockets(pid: u32) -> anyhow::Result<Vec<TcpSocket>> {
    let process = Process::new(pid as i32).with_context(|| format!("cannot read /proc/{pid}"))?;
    let fds: BTreeMap<u64, i32> = process
        .fd()
        .with_context(|| format!("cannot read /proc/{pid}/fd"))?
        .flatten()
        .filter_map(|f| match f.target {
            FDTarget::Socket(inode) => Some((inode, f.fd)),
            _ => None,
        })
        .collect();
    let table = process
        .tcp()
        .with_context(|| format!("cannot read /proc/{pid}/net/tcp"))?;
    Ok(table
        .into_iter()
        .filter_map(|e| {
            Some(TcpSocket {
                fd: *fds.get(&e.inode)?,
                inode: e.inode,
                local: e.local_address,
                remote: e.remote_address,
                state: e.state.to_u8(),
            })
        })
        .collect())
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
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(t.path().join("syscall")) else {
            continue;
        };
        let f: Vec<&str> = text.split_whitespace().collect();
        let Some(nr) = f
            .first()
            .and_then(|n| n.parse::<u64>().ok())
            .and_then(|n| libc::c_long::try_from(n).ok())
        else {
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
            Some(fd)
                if matches!(nr, libc::SYS_read | libc::SYS_recvfrom | libc::SYS_recvmsg)
                    && fds.contains(&(fd as i32)) =>
            {
                format!(" on the provider socket (fd {fd})")
            }
            _ => String::new(),
        };
        out.push(format!(
            "{}: {}{on}",
            t.file_name().to_string_lossy(),
            syscall_name(nr)
        ));
    }
    out.sort();
    out
}

/// The name of syscall `nr` when it is one a waiting thread sits in,
/// else `other`. (`poll`, `select` and `epoll_wait` are x86_64's; other
/// architectures have only their `p` forms.)
fn syscall_name(nr: libc::c_long) -> &'static str {
    match nr {
        libc::SYS_read => "read",
        #[cfg(target_arch = "x86_64")]
        libc::SYS_poll => "poll",
        #[cfg(target_arch = "x86_64")]
        libc::SYS_select => "select",
        libc::SYS_nanosleep => "nanosleep",
        libc::SYS_recvfrom => "recvfrom",
        libc::SYS_recvmsg => "recvmsg",
        libc::SYS_futex => "futex",
        libc::SYS_clock_nanosleep => "clock_nanosleep",
        #[cfg(target_arch = "x86_64")]
        libc::SYS_epoll_wait => "epoll_wait",
        libc::SYS_pselect6 => "pselect6",
        libc::SYS_ppoll => "ppoll",
        libc::SYS_epoll_pwait => "epoll_pwait",
        libc::SYS_accept4 => "accept4",
        libc::SYS_epoll_pwait2 => "epoll_pwait2",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers the waits name, as libc has them, are the ones
    /// selfheal's own table (x86_64) names alike.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn syscall_names_are_the_kernels_numbers() {
        let mut named = 0;
        for nr in 0..512 {
            let ours = syscall_name(nr);
            if ours != "other" {
                assert_eq!(
                    selfheal_core::proc::syscall_name(nr),
                    Some(ours),
                    "syscall {nr}"
                );
                named += 1;
            }
        }
        assert_eq!(named, 14, "every wait the scenarios name");
        assert_eq!(syscall_name(9999), "other");
    }

    /// Our own loopback connection, found by fd in our namespace's table.
    #[test]
    fn tcp_sockets_finds_our_connection_with_its_fd() {
        use std::os::fd::AsRawFd as _;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(server).unwrap();
        let sockets = tcp_sockets(std::process::id()).unwrap();
        let ours = sockets
            .iter()
            .find(|s| s.local == client.local_addr().unwrap())
            .unwrap_or_else(|| panic!("not in {sockets:?}"));
        assert_eq!(ours.fd, client.as_raw_fd());
        assert_eq!(ours.remote, server);
        assert_eq!(ours.state, 1);
        let listening = sockets.iter().find(|s| s.local == server).unwrap();
        assert_eq!(listening.fd, listener.as_raw_fd());
        assert_eq!(listening.state, 10);
    }
}
