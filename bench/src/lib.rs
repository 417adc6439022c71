//! What the benchmarks and the soak share: where the programs they run
//! are, the open-file limit their agents need, starting agents, the
//! listener they connect to and a status endpoint.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::JoinHandle,
    time::Duration,
};

/// The programs a benchmark runs: `selfheal` (`SELFHEAL_BIN`, or the one
/// beside the benchmark's binary) and the testbed's `recv-peer`.
pub struct Bins {
    pub selfheal: PathBuf,
    pub peer: PathBuf,
}

impl Bins {
    /// Both programs; one that is not built ends the benchmark (exit 2)
    /// saying which, and the command that builds it.
    pub fn find() -> Bins {
        let dir = std::env::current_exe()
            .expect("current_exe")
            .parent()
            .expect("dir")
            .to_path_buf();
        let bins = Bins {
            selfheal: std::env::var("SELFHEAL_BIN")
                .map_or_else(|_| dir.join("selfheal"), Into::into),
            peer: dir.join("recv-peer"),
        };
        for (path, build) in [
            (&bins.selfheal, "cargo build --release -p selfheal"),
            (&bins.peer, "cargo build --release -p tests --bins"),
        ] {
            if !path.exists() {
                eprintln!(
                    "{} is not built: run `{build}` (or `cargo xtask bench`, which builds everything)",
                    path.display()
                );
                std::process::exit(2);
            }
        }
        bins
    }
}

/// Sets this process's open-file limit (soft and hard) to `n`, for the
/// agents it spawns; needs root to raise the hard limit.
pub fn set_nofile(n: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Starts one `recv-peer fat` agent at `peer`: `sockets` connections to
/// `addr` and `threads` threads blocked in reads on them. Returns once it
/// says it is ready; it runs until its stdin closes or it is killed.
pub fn fat_agent(peer: &Path, addr: &str, threads: usize, sockets: usize) -> Child {
    let mut c = Command::new(peer)
        .args(["fat", addr, &threads.to_string(), &sockets.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn an agent");
    let mut line = String::new();
    BufReader::new(c.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .expect("ready");
    assert!(line.starts_with("ready"), "agent: {line:?}");
    c
}

/// A listener on a free local port that accepts `n` connections, on a
/// thread: its address, and the thread that returns the server ends.
pub fn accept_n(n: usize) -> (SocketAddr, JoinHandle<Vec<TcpStream>>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let accepter = std::thread::spawn(move || {
        (0..n)
            .map(|_| l.accept().expect("accept").0)
            .collect::<Vec<_>>()
    });
    (addr, accepter)
}

/// A local status endpoint: `{"current_task": null}` for every request.
pub fn status_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 2048];
                let _ = s.read(&mut buf);
                let body = "{\"current_task\": null}";
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}
