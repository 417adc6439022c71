//! A test peer: a TCP client that waits in a blocking `read` (as a worker
//! thread would), a tokio client that waits in epoll (as an event loop
//! would), or a server the test drives over stdin. It reports on stdout, one
//! line per event, so the test knows its pid, tid and socket.
//!
//! ```text
//! recv-peer client ADDR [--once]   blocking reads; --once: read once, then sleep (not in a read)
//! recv-peer tokio-client ADDR      event-loop reads
//!
//! Clients connect, print `ready`, then wait for one line on stdin before
//! their first read, so the test can start watching them first.
//! recv-peer server ADDR            accept one; stdin "send N" writes N bytes, "close" exits
//! ```
//! Lines: `ready pid=P tid=T inode=I local=A remote=B`, `got N`, `listening A`, `sent N`.

use std::{
    io::{BufRead as _, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    process::ExitCode,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["client", addr] => client(addr, false),
        ["client", addr, "--once"] => client(addr, true),
        ["tokio-client", addr] => tokio_client(addr),
        ["server", addr] => server(addr),
        _ => Err("usage: recv-peer client ADDR [--once] | tokio-client ADDR | server ADDR".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("recv-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, String>;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn inode_of(fd: i32) -> u64 {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .and_then(|t| {
            t.to_string_lossy()
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Announces the connection, then waits for the test's go-ahead on stdin.
fn ready(fd: i32, local: std::net::SocketAddr, remote: std::net::SocketAddr) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    say(&format!(
        "ready pid={} tid={tid} inode={} local={local} remote={remote}",
        std::process::id(),
        inode_of(fd)
    ));
    let _ = std::io::stdin().lock().read_line(&mut String::new());
}

fn client(addr: &str, once: bool) -> Result<()> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    ready(
        s.as_raw_fd(),
        s.local_addr().map_err(|e| e.to_string())?,
        s.peer_addr().map_err(|e| e.to_string())?,
    );
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).map_err(|e| format!("read: {e}"))?;
        say(&format!("got {n}"));
        if n == 0 {
            return Ok(());
        }
        if once {
            // Stay alive, out of any receive, until the test closes stdin.
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            return Ok(());
        }
    }
}

fn tokio_client(addr: &str) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        use tokio::io::AsyncReadExt as _;
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        ready(
            s.as_raw_fd(),
            s.local_addr().map_err(|e| e.to_string())?,
            s.peer_addr().map_err(|e| e.to_string())?,
        );
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
            say(&format!("got {n}"));
            if n == 0 {
                return Ok(());
            }
        }
    })
}

fn server(addr: &str) -> Result<()> {
    let l = TcpListener::bind(addr).map_err(|e| format!("bind {addr}: {e}"))?;
    say(&format!(
        "listening {}",
        l.local_addr().map_err(|e| e.to_string())?
    ));
    let (mut s, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["send", n] => {
                let n: usize = n.parse().map_err(|_| format!("bad count {n}"))?;
                s.write_all(&vec![b'x'; n])
                    .map_err(|e| format!("write: {e}"))?;
                say(&format!("sent {n}"));
            }
            ["close"] => return Ok(()),
            other => return Err(format!("unknown command {other:?}")),
        }
    }
    Ok(())
}
