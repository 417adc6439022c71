//! Reading other processes' memory without waiting on them: an agent
//! whose poll set lies on a page of a FUSE file it serves itself (the
//! server answers the first read and holds every later one), an agent
//! whose collection outlasts its budget, and a reader stuck in the kernel
//! on such a page, abandoned at its deadline. Every FUSE connection is
//! aborted at the end (`/sys/fs/fuse/connections/N/abort`), so nothing is
//! left in D state.
//!
//! The FUSE server is `tests/src/pollfs.c`, built with the system's C
//! compiler: it speaks the protocol on `/dev/fuse` itself after `mount(2)`
//! as root (no libfuse, no `fusermount3` here), like `hangfs.c`.

use std::{
    io::{BufRead as _, BufReader},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{Receiver, channel},
    time::{Duration, Instant},
};

use tests::fixtures::{Places, check_cmd};
use tests::{Netns, Peer, Scratch, need_root, skip};

const SEC: Duration = Duration::from_secs(1);

/// `tests/src/pollfs.c` mounted on `DIR/mnt`, answering `answer` reads.
/// Dropping it aborts the connection (whatever waits on it fails at once),
/// stops the server and detaches the mount.
struct PollFs {
    server: Child,
    lines: Receiver<String>,
    mnt: PathBuf,
    abort: PathBuf,
}

impl PollFs {
    /// `direct`: every open after the first is answered
    /// `FOPEN_DIRECT_IO` (an `mmap` of it waits on a held page holding its
    /// process's `mmap_lock`).
    fn mount_as(dir: &Scratch, answer: u32, direct: bool) -> Result<PollFs, String> {
        let (bin, mnt) = tests::compile_fuse_server(dir, "pollfs")?;
        let mut server = Command::new(&bin)
            .arg(&mnt)
            .arg(answer.to_string())
            .args(direct.then_some("direct"))
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let out = server.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let abort = PathBuf::new();
        let mut fs = PollFs {
            server,
            lines,
            mnt,
            abort,
        };
        if fs.said("mounted", 5 * SEC).is_none() {
            return Err("cannot mount a FUSE filesystem here".into());
        }
        let dev = std::fs::metadata(&fs.mnt).map_err(|e| e.to_string())?.dev();
        fs.abort = PathBuf::from(format!(
            "/sys/fs/fuse/connections/{}/abort",
            nix::sys::stat::minor(dev)
        ));
        if !fs.abort.exists() {
            // The connections' control files (fusectl), mounted if they
            // are not: they stay mounted (others may use them).
            let _ = Command::new("mount")
                .args(["-t", "fusectl", "fusectl", "/sys/fs/fuse/connections"])
                .status();
        }
        if !fs.abort.exists() {
            return Err(format!("no {} (no fusectl)", fs.abort.display()));
        }
        Ok(fs)
    }

    fn file(&self) -> PathBuf {
        self.mnt.join("p")
    }

    /// The server's next line starting with `prefix`, within `timeout`.
    fn said(&self, prefix: &str, timeout: Duration) -> Option<String> {
        let end = Instant::now() + timeout;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Some(l),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }

    fn abort(&self) {
        let _ = std::fs::write(&self.abort, "1");
    }
}

impl Drop for PollFs {
    fn drop(&mut self) {
        self.abort();
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// A python3 agent of uid 65534 with a TCP connection to a listener of its
/// own (port announced), blocked in `poll()` on four pollfds for fd 100
/// (its connected socket) that live, in `fuse` mode, on a `MAP_PRIVATE`
/// mapping of the FUSE file `argv[2]` (faulted in by poll itself, then
/// dropped: `MADV_DONTNEED` and `POSIX_FADV_DONTNEED`, so the next touch
/// reads the file again) and, in `anon` mode, in anonymous memory. Once
/// set it says `ready pid=… addr=… port=… resident=…` (resident: whether
/// the page is still in memory, `mincore`). `threads=N` more threads each
/// sit in a poll of their own on anonymous memory.
const PY_AGENT: &str = r#"
import ctypes, os, socket, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 9)
mode, path, extra = sys.argv[1], sys.argv[2], int(sys.argv[3])
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
c = socket.create_connection(l.getsockname()); a, _ = l.accept()
os.dup2(c.fileno(), 100)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.poll.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
class PollFd(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("events", ctypes.c_short), ("revents", ctypes.c_short)]
if mode == "fuse":
    fd = os.open(path, os.O_RDONLY)
    addr = libc.mmap(None, 4096, 1, 2, fd, 0)
else:
    fd = None
    sets = (PollFd * 4)(*[PollFd(100, 1, 0)] * 4)
    addr = ctypes.addressof(sets)
def waiter():
    s = (PollFd * 1)(PollFd(100, 1, 0))
    libc.poll(ctypes.addressof(s), 1, -1)
for _ in range(extra):
    threading.Thread(target=waiter, daemon=True).start()
def drop():
    time.sleep(0.5)
    if fd is not None:
        libc.madvise(addr, 4096, 4)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    v = ctypes.create_string_buffer(1)
    libc.mincore(addr, 4096, v)
    print(f"ready pid={os.getpid()} addr={addr} port={l.getsockname()[1]} resident={v.raw[0] & 1}", flush=True)
threading.Thread(target=drop, daemon=True).start()
libc.poll(addr, 4, -1)
"#;

fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// One agent: the python3 process, its pid, the poll set's address, its
/// upstream port.
struct Agent {
    _peer: Peer,
    pid: u32,
    addr: u64,
    port: u16,
}

fn agent(ns: &Netns, mode: &str, file: &Path, threads: u32) -> Agent {
    // `ip netns exec` as root, then python3 as nobody.
    let mut cmd = ns.command(Path::new("/usr/bin/setpriv"));
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["/usr/bin/python3", "-c", PY_AGENT, mode])
        .arg(file)
        .arg(threads.to_string());
    let peer = Peer::spawn(cmd);
    let line = peer.expect("ready ", 20 * SEC);
    assert!(line.starts_with("ready "), "{mode} agent: {line:?}");
    Agent {
        pid: field(&line, "pid") as u32,
        addr: field(&line, "addr"),
        port: field(&line, "port") as u16,
        _peer: peer,
    }
}

/// An agent config entry: `name` matched by pid, its connection an
/// upstream suspect after 1 s (so the check reads its threads' waits).
fn entry(name: &str, a: &Agent, extra: &str) -> String {
    format!(
        "[[agent]]\nname = \"{name}\"\nmatch = {{ pid = {} }}\n\
         [agent.thresholds]\nsuspect_after = \"1s\"\n{extra}\
         [agent.proof]\nkeepalive = false\n\
         [[agent.upstream]]\nrole = \"provider\"\naddr = \"127.0.0.1:{}\"\n",
        a.pid, a.port
    )
}

/// `selfheal check --json` on `config`, bounded: `None` when it has not
/// exited within `limit` (then `on_hang` runs, to release what it waits
/// on, and it is killed and reaped). Its wall time in ms.
fn check(
    dir: &Scratch,
    config: &str,
    limit: Duration,
    on_hang: impl FnOnce(),
) -> Option<(f64, i32, Vec<serde_json::Value>)> {
    let path = dir.join("config.toml");
    std::fs::write(&path, config).unwrap();
    let cmd = check_cmd(
        &path,
        &Places::under(dir)
            .metrics(dir.join("selfheal.prom"))
            .helper(dir.join("helper.sock")),
    );
    bounded(cmd, limit, on_hang)
}

/// `cmd` (a selfheal printing JSON lines), bounded as [`check`] is: its
/// wall time in ms, exit code and lines; `None` when it has not exited
/// within `limit`.
fn bounded(
    mut cmd: std::process::Command,
    limit: Duration,
    on_hang: impl FnOnce(),
) -> Option<(f64, i32, Vec<serde_json::Value>)> {
    let t = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run selfheal");
    let exited = loop {
        if child.try_wait().unwrap().is_some() {
            break true;
        }
        if t.elapsed() > limit {
            break false;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if !exited {
        // Where it waits, for the record.
        for task in std::fs::read_dir(format!("/proc/{}/task", child.id()))
            .into_iter()
            .flatten()
            .flatten()
        {
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            let stack = std::fs::read_to_string(task.path().join("stack")).unwrap_or_default();
            let top: Vec<&str> = stack
                .lines()
                .take(6)
                .map(|l| l.split_whitespace().nth(1).unwrap_or(l))
                .collect();
            println!(
                "selfheal still running after {ms:.0} ms: task {:?} state {:?}: {}",
                task.file_name(),
                stat.rsplit(") ").next().and_then(|s| s.chars().next()),
                top.join(" < ")
            );
        }
        on_hang();
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    if !exited {
        return None;
    }
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect();
    Some((ms, out.status.code().unwrap_or(-1), lines))
}

fn outcome<'a>(results: &'a [serde_json::Value], agent: &str) -> &'a serde_json::Value {
    results
        .iter()
        .find(|r| r["agent"] == agent)
        .unwrap_or_else(|| panic!("no {agent} in {results:#?}"))
}

fn gaps(o: &serde_json::Value) -> Vec<String> {
    o["gaps"]
        .as_array()
        .map(|g| {
            g.iter()
                .filter_map(|g| g.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// What every test here needs: root, python3, setpriv, a FUSE mount.
fn setup(test: &str, answer: u32) -> Option<(Scratch, PollFs, Netns)> {
    setup_as(test, answer, false)
}

fn setup_as(test: &str, answer: u32, direct: bool) -> Option<(Scratch, PollFs, Netns)> {
    if !need_root(test) {
        return None;
    }
    for tool in ["/usr/bin/python3", "/usr/bin/setpriv"] {
        if !Path::new(tool).exists() {
            skip(test, &format!("no {tool}"));
            return None;
        }
    }
    let dir = Scratch::new(test);
    let fs = match PollFs::mount_as(&dir, answer, direct) {
        Ok(fs) => fs,
        Err(why) => {
            skip(test, &why);
            return None;
        }
    };
    let ns = match Netns::new(&format!("reads-{}", &test[..test.len().min(6)])) {
        Ok(ns) => ns,
        Err(why) => {
            skip(test, &why);
            return None;
        }
    };
    Some((dir, fs, ns))
}

/// The attack: an agent blocks in `poll()` on a set that lies on a page of
/// a FUSE file it serves itself, answering the first read (poll's own)
/// and holding the next. The check does not read that page: the set is a
/// gap naming the file, the server sees no second read, the check exits
/// at once and the ordinary agent beside it is judged.
#[test]
fn a_poll_set_on_a_fuse_page_is_a_gap_and_the_check_goes_on() {
    let _area = tests::area(module_path!());
    let test = "fuse_poll_set";
    let Some((dir, fs, ns)) = setup(test, 1) else {
        return;
    };
    let attacker = agent(&ns, "fuse", &fs.file(), 0);
    let ordinary = agent(&ns, "anon", &fs.file(), 0);
    assert!(fs.said("read 1", 5 * SEC).is_some(), "poll read the page");
    let resident = std::fs::read_to_string(format!("/proc/{}/smaps", attacker.pid)).unwrap();
    // Past suspect_after: both connections are silent upstreams.
    std::thread::sleep(Duration::from_millis(1200));

    let only_ordinary = entry("ordinary", &ordinary, "");
    let both = format!("{}{}", entry("attacker", &attacker, ""), only_ordinary);
    // Twice: the second is the warm one printed.
    let mut alone = None;
    for _ in 0..2 {
        alone = check(&dir, &only_ordinary, 20 * SEC, || fs.abort());
    }
    let (alone_ms, _, alone) = alone.expect("the check of the ordinary agent alone exits");
    let (ms, code, results) = check(&dir, &both, 20 * SEC, || fs.abort()).unwrap_or_else(|| {
        panic!("the check did not exit within 20 s (the FUSE connection was aborted)")
    });
    let held = fs.said("held", Duration::from_millis(300));
    println!(
        "check of the ordinary agent alone: {alone_ms:.1} ms; with the attacker: {ms:.1} ms (exit {code}); \
         ordinary agent: {} alone, {} beside the attacker; the server {}",
        outcome(&alone, "ordinary")["verdict"],
        outcome(&results, "ordinary")["verdict"],
        if held.is_some() {
            "was asked for the page again"
        } else {
            "saw no second read"
        },
    );
    let a = outcome(&results, "attacker");
    let want = format!(
        "the poll set at {:#x} lies in a file-backed mapping ({}): not read",
        attacker.addr,
        fs.file().display()
    );
    assert!(
        gaps(a).iter().any(|g| g.ends_with(&want)),
        "{want:?} in {a:#}\nsmaps: {resident}"
    );
    assert_eq!(held, None, "the check faulted the FUSE page in");
    let o = outcome(&results, "ordinary");
    assert!(o["verdict"].is_string(), "{o:#}");
    assert!(
        !gaps(o)
            .iter()
            .any(|g| g.contains("not read") || g.contains("budget")),
        "{o:#}"
    );
    assert_eq!(
        o["verdict"],
        outcome(&alone, "ordinary")["verdict"],
        "{o:#}"
    );

    // The census over both: the attacker's process read with a gap, its
    // page not faulted in, the ordinary agent's connection listed with its
    // poll.
    let mut scan = std::process::Command::new(tests::selfheal_bin());
    scan.args(["scan", "--json", "--silent-for", "1s"])
        .args(["--pid", &attacker.pid.to_string()])
        .args(["--pid", &ordinary.pid.to_string()])
        .env_remove("RUST_LOG");
    let (ms, code, lines) = bounded(scan, 20 * SEC, || fs.abort()).unwrap_or_else(|| {
        panic!("the scan did not exit within 20 s (the FUSE connection was aborted)")
    });
    println!("scan of both: {ms:.1} ms (exit {code})");
    assert_eq!(
        fs.said("held", Duration::from_millis(300)),
        None,
        "the scan faulted the FUSE page in"
    );
    let coverage = lines.last().expect("a coverage line");
    assert_eq!(coverage["kind"], "coverage", "{lines:#?}");
    assert!(coverage["with_gaps"].as_u64() >= Some(1), "{coverage}");
    let listed = lines
        .iter()
        .find(|l| l["pid"] == ordinary.pid && l["remote"] == format!("127.0.0.1:{}", ordinary.port))
        .unwrap_or_else(|| panic!("the ordinary agent's connection is not listed: {lines:#?}"));
    assert_eq!(listed["waiting"][0]["syscall"], "poll", "{listed}");
}

/// The budget: an agent whose collection takes longer than its
/// `collect_budget` (hundreds of threads, each read; a budget of 1 ms) is
/// cut there and not judged (`unresponsive`, `over_budget`, the gap naming
/// it and its budget); the other agent is judged; the check exits.
#[test]
fn an_agent_over_its_collection_budget_is_cut_and_the_others_are_judged() {
    let _area = tests::area(module_path!());
    let test = "collect_budget";
    let Some((dir, fs, ns)) = setup(test, 1) else {
        return;
    };
    let big = agent(&ns, "anon", &fs.file(), 300);
    let ordinary = agent(&ns, "anon", &fs.file(), 0);
    std::thread::sleep(Duration::from_millis(1200));
    // First within the default budget: what reading 301 poll sets costs.
    let whole = format!(
        "{}{}",
        entry("big", &big, ""),
        entry("ordinary", &ordinary, "")
    );
    let mut within = None;
    for _ in 0..2 {
        within = check(&dir, &whole, 20 * SEC, || fs.abort());
    }
    let (within_ms, _, within) = within.expect("the check exits");
    println!(
        "check with the 301-thread agent within the default budget: {within_ms:.1} ms; big: {}, ordinary: {}",
        outcome(&within, "big")["verdict"],
        outcome(&within, "ordinary")["verdict"]
    );
    let config = format!(
        "{}{}",
        entry("big", &big, "collect_budget = \"1ms\"\n"),
        entry("ordinary", &ordinary, "")
    );
    let (ms, code, results) =
        check(&dir, &config, 20 * SEC, || fs.abort()).expect("the check exits");
    let b = outcome(&results, "big");
    let o = outcome(&results, "ordinary");
    println!(
        "check with a 301-thread agent over a 1 ms budget: {ms:.1} ms (exit {code}); big: {}, ordinary: {}",
        b["verdict"], o["verdict"]
    );
    assert_eq!(b["verdict"], "unresponsive", "{b:#}");
    assert_eq!(b["reasons"][0]["code"], "over_budget", "{b:#}");
    assert!(
        gaps(b)
            .iter()
            .any(|g| g.starts_with("big: collection exceeded its budget of 1 ms")),
        "{b:#}"
    );
    assert_ne!(o["verdict"], "unresponsive", "{o:#}");
    assert!(!gaps(o).iter().any(|g| g.contains("budget")), "{o:#}");
}

/// A read that waits on the FUSE server (the raw reader, with no map
/// check: what a mapping replaced between the check and the read would
/// do) is abandoned at its deadline: the reader child is left in D state,
/// the caller goes on, the next read gets a fresh child; and a process
/// whose reader is stuck exits (its child, not a thread of its own, is in
/// D state).
#[test]
fn a_read_stuck_on_a_fuse_page_is_abandoned_at_its_deadline() {
    let _area = tests::area(module_path!());
    if std::env::var_os("SELFHEAL_READS_STUCK_CHILD").is_some() {
        // The re-run below: read the page, give up after 300 ms, exit.
        let pid: u32 = std::env::var("READS_PID").unwrap().parse().unwrap();
        let addr: u64 = std::env::var("READS_ADDR").unwrap().parse().unwrap();
        let mut reader = selfheal::sys::memread::Reader::default();
        let mut buf = [0u8; 32];
        let r = reader.read(
            pid,
            addr,
            &mut buf,
            Instant::now() + Duration::from_millis(300),
        );
        println!("stuck-child read: {r:?}");
        return;
    }
    let test = "stuck_reader";
    let Some((_dir, fs, ns)) = setup(test, 1) else {
        return;
    };
    let attacker = agent(&ns, "fuse", &fs.file(), 0);
    let ordinary = agent(&ns, "anon", &fs.file(), 0);
    assert!(fs.said("read 1", 5 * SEC).is_some());

    let mut reader = selfheal::sys::memread::Reader::default();
    let mut buf = [0u8; 32];
    let t = Instant::now();
    let r = reader.read(
        attacker.pid,
        attacker.addr,
        &mut buf,
        t + Duration::from_millis(300),
    );
    let waited = t.elapsed();
    assert_eq!(r, Err(selfheal::sys::memread::ReadError::Timeout));
    assert!(
        fs.said("held", SEC).is_some(),
        "the read reached the server"
    );
    let stuck = selfheal::sys::memread::abandoned();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    // SIGKILL wakes it for a moment (FUSE then sends an INTERRUPT); it
    // goes back to waiting for the answer uninterruptibly.
    let state_of = || {
        std::fs::read_to_string(format!("/proc/{}/stat", stuck[0]))
            .ok()
            .and_then(|s| s.rsplit(") ").next()?.chars().next())
    };
    let state = tests::wait_for(SEC, Duration::from_millis(5), || {
        state_of().filter(|s| *s == 'D')
    })
    .or_else(state_of);
    // A fresh child serves the next read.
    let t2 = Instant::now();
    let set = reader
        .read(ordinary.pid, ordinary.addr, &mut buf, t2 + SEC)
        .expect("a fresh reader reads anonymous memory")
        .to_vec();
    let next = t2.elapsed();
    assert_eq!(&set[..8], &[100, 0, 0, 0, 1, 0, 0, 0]);
    // What a read through the child costs against one in this thread, and
    // a memory map read through it against a plain read (1,000 and 200).
    let t = Instant::now();
    for _ in 0..1000 {
        reader
            .read(ordinary.pid, ordinary.addr, &mut buf, Instant::now() + SEC)
            .unwrap();
    }
    let via_child = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    for _ in 0..1000 {
        nix::sys::uio::process_vm_readv(
            nix::unistd::Pid::from_raw(ordinary.pid as i32),
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &[nix::sys::uio::RemoteIoVec {
                base: ordinary.addr as usize,
                len: 32,
            }],
        )
        .unwrap();
    }
    let direct = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    for _ in 0..200 {
        reader
            .read_maps(ordinary.pid, Instant::now() + SEC)
            .unwrap();
    }
    let maps_child = t.elapsed().as_secs_f64() * 1e3 / 200.0;
    let t = Instant::now();
    for _ in 0..200 {
        std::fs::read(format!("/proc/{}/maps", ordinary.pid)).unwrap();
    }
    let maps_direct = t.elapsed().as_secs_f64() * 1e3 / 200.0;
    println!(
        "a 32-byte set read: {:.1} us through the reader child, {:.1} us in this thread; \
         /proc/PID/maps: {:.1} us through it, {:.1} us here",
        via_child,
        direct,
        maps_child * 1e3,
        maps_direct * 1e3
    );

    // A process whose reader is stuck exits: the test binary again, for
    // this test only, reading the held page.
    let t3 = Instant::now();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "foreign_memory::a_read_stuck_on_a_fuse_page_is_abandoned_at_its_deadline",
            "--nocapture",
        ])
        .env("SELFHEAL_READS_STUCK_CHILD", "1")
        .env("READS_PID", attacker.pid.to_string())
        .env("READS_ADDR", attacker.addr.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t3.elapsed() > 10 * SEC {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let exit_ms = t3.elapsed().as_secs_f64() * 1e3;
    if exited.is_none() {
        fs.abort();
    }
    let out = child.wait_with_output().unwrap();
    println!(
        "stuck read given up after {:.1} ms (deadline 300 ms), its child in state {state:?}; \
         next read by a fresh child {:.2} ms; a process with a stuck reader exited in {exit_ms:.1} ms: {}",
        waited.as_secs_f64() * 1e3,
        next.as_secs_f64() * 1e3,
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with("stuck-child"))
            .unwrap_or("?")
    );
    assert!(
        exited.is_some(),
        "the process with a stuck reader did not exit"
    );
    assert_eq!(state, Some('D'), "the abandoned reader waits in the kernel");
    // Once the connection is aborted, the abandoned children exit and are
    // reaped.
    fs.abort();
    let reaped = tests::wait_for(5 * SEC, Duration::from_millis(20), || {
        selfheal::sys::memread::abandoned().is_empty().then_some(())
    });
    assert!(
        reaped.is_some(),
        "{:?}",
        selfheal::sys::memread::abandoned()
    );
}

/// A process of uid 65534 that keeps its own `mmap_lock` taken for writing
/// for good: one thread `pread`s the FUSE file (the server holds the read,
/// the page stays locked), then the main thread opens it again (answered
/// `FOPEN_DIRECT_IO`) and `mmap`s it, which invalidates the file's pages
/// first and waits on the locked one with the lock held. Says `holding
/// pid=…` before the `mmap`.
const PY_LOCK_HOLDER: &str = r#"
import mmap, os, sys, threading, time
path = sys.argv[1]
f1 = os.open(path, os.O_RDONLY)
threading.Thread(target=lambda: os.pread(f1, 4096, 0), daemon=True).start()
time.sleep(0.5)
f2 = os.open(path, os.O_RDONLY)
print(f"holding pid={os.getpid()}", flush=True)
time.sleep(0.2)
mmap.mmap(f2, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
"#;

/// Whether reading `/proc/PID/cmdline` of `pid` has not finished within
/// `limit` (read on a thread left behind: the wait is killable, and this
/// process's exit ends it).
fn cmdline_blocks(pid: u32, limit: Duration) -> bool {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read(format!("/proc/{pid}/cmdline")).is_ok());
    });
    rx.recv_timeout(limit).is_err()
}

/// Discovery under a process that holds its own `mmap_lock`: reading its
/// command line waits for as long as it likes (`ps` and `pgrep` hang on
/// it). A root check with a cmdline rule for that uid, and an ordinary
/// agent beside it: the read is abandoned at its deadline, the rule's
/// agent gets a gap naming the process and is not judged (`unresponsive`,
/// `over_budget`: the holder may be its process, so never `down`), the
/// ordinary agent is judged, and the check exits.
#[test]
fn a_process_holding_its_memory_map_lock_does_not_stall_discovery() {
    let _area = tests::area(module_path!());
    let test = "cmdline_lock";
    let Some((dir, fs, ns)) = setup_as(test, 0, true) else {
        return;
    };
    let mut cmd = ns.command(Path::new("/usr/bin/setpriv"));
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["/usr/bin/python3", "-c", PY_LOCK_HOLDER])
        .arg(fs.file());
    let holder = Peer::spawn(cmd);
    let line = holder.expect("holding ", 20 * SEC);
    let pid = field(&line, "pid") as u32;
    assert!(
        fs.said("open direct", 5 * SEC).is_some(),
        "the second open was not answered FOPEN_DIRECT_IO"
    );
    std::thread::sleep(Duration::from_millis(500));
    if !cmdline_blocks(pid, SEC) {
        fs.abort();
        // CI's kernel (6.18) waits: there this is a failure, not a skip.
        return tests::skip_as(
            tests::Skip::Kernel,
            test,
            "this kernel reads /proc/PID/cmdline without waiting for the mmap_lock",
        );
    }
    let ordinary = agent(&ns, "anon", Path::new("-"), 0);
    let config = format!(
        "{}\n[[agent]]\nname = \"locked\"\nmatch = {{ cmdline = \"PY_LOCK|mmap.mmap\", uid = 65534 }}\n",
        entry("ordinary", &ordinary, "")
    );
    let result = check(&dir, &config, 20 * SEC, || fs.abort());
    let Some((ms, code, results)) = result else {
        panic!("the check did not exit within 20 s: discovery waited on the command line");
    };
    let o = outcome(&results, "ordinary");
    let l = outcome(&results, "locked");
    println!(
        "check with a process holding its mmap_lock: {ms:.0} ms, exit {code}; ordinary {}, locked {} {:?}",
        o["verdict"],
        l["verdict"],
        gaps(l)
    );
    assert_eq!(o["verdict"], "busy", "{o:#}");
    assert!(
        gaps(l).iter().any(|g| g.contains(&format!(
            "could not be read, so this rule cannot tell whether they match: pid {pid} of uid \
             65534 (its read did not finish in time)"
        ))),
        "{l:#}"
    );
    // The holder may be the rule's process: not `down`, not judged.
    assert_eq!(l["verdict"], "unresponsive", "{l:#}");
    assert_eq!(l["reasons"][0]["code"], "over_budget", "{l:#}");
    // A second run is as quick: the stuck reader was abandoned, not waited for.
    let again = check(&dir, &config, 20 * SEC, || fs.abort()).expect("the second check exited");
    println!("the second check: {:.0} ms", again.0);
    fs.abort();
    drop(holder);
}
