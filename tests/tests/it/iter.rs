//! The kernel's task iterator (`selfheal::ebpf::iter`) against procfs on a
//! real process: the same threads, each in the same state and the same
//! syscall on the same fd, and a spinning thread with its CPU time; a pid
//! that is gone and an empty list yield nothing, and no error.
//!
//! Needs root and the eBPF object.

use std::{collections::BTreeMap, time::Duration};

use selfheal::ebpf::iter::{self, IterThread};
use tests::{Peer, listener, need_ebpf, wait_for};

/// x86_64 `recvfrom`: what a blocking `recv` on a socket waits in.
const RECVFROM: u64 = 45;

/// What procfs says of one thread: its state letter and, when it is in a
/// syscall, the syscall's number and first argument.
#[derive(Debug, PartialEq, Eq)]
struct ProcThread {
    state: char,
    syscall: Option<(u64, u64)>,
}

/// Every thread of `pid` from `/proc/PID/task/TID/{stat,syscall}`.
fn proc_threads(pid: u32) -> BTreeMap<u32, ProcThread> {
    let dir = format!("/proc/{pid}/task");
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(&dir)
        .expect("list the task dir")
        .flatten()
    {
        let tid: u32 = e.file_name().to_string_lossy().parse().expect("a tid");
        let stat = std::fs::read_to_string(format!("{dir}/{tid}/stat")).expect("stat");
        let after = &stat[stat.rfind(')').expect("comm") + 2..];
        let state = after.chars().next().expect("state");
        let syscall = std::fs::read_to_string(format!("{dir}/{tid}/syscall")).expect("syscall");
        let mut f = syscall.split_whitespace();
        let nr = f.next().and_then(|n| n.parse::<u64>().ok());
        let arg0 = f
            .next()
            .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
        out.insert(
            tid,
            ProcThread {
                state,
                syscall: nr.zip(arg0),
            },
        );
    }
    out
}

fn as_proc(t: &IterThread) -> ProcThread {
    ProcThread {
        state: t.state_letter(),
        syscall: t.syscall.map(|nr| (nr, t.arg0)),
    }
}

#[test]
fn threads_match_procfs() {
    let _area = tests::area(module_path!());
    if !need_ebpf("iter::threads_match_procfs") {
        return;
    }
    const READERS: usize = 6;
    let l = listener();
    let addr = l.local_addr().unwrap().to_string();
    let peer = Peer::recv_peer(&["fat", &addr, &READERS.to_string(), "3"]);
    peer.expect("ready ", Duration::from_secs(10));
    let pid = peer.pid();
    // The readers and the main thread (reading stdin) all asleep in their reads.
    let settled = wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
        let threads = proc_threads(pid);
        let in_recv = threads
            .values()
            .filter(|t| t.state == 'S' && t.syscall.is_some_and(|(nr, _)| nr == RECVFROM))
            .count();
        (in_recv == READERS && threads.values().all(|t| t.state == 'S')).then_some(())
    });
    assert!(
        settled.is_some(),
        "threads never settled: {:?}",
        proc_threads(pid)
    );

    let mut it = iter::load().expect("load the task iterator");
    let threads = it.threads(&[pid]).expect("a pass");
    let procfs = proc_threads(pid);
    assert!(threads.iter().all(|t| t.tgid == pid), "{threads:?}");
    let seen: BTreeMap<u32, ProcThread> = threads.iter().map(|t| (t.tid, as_proc(t))).collect();
    assert_eq!(seen, procfs, "iterator (left) against procfs (right)");
    let in_recv = threads
        .iter()
        .filter(|t| t.syscall == Some(RECVFROM))
        .count();
    assert_eq!(in_recv, READERS, "{threads:?}");

    // A second pass (a new link) sees the same threads.
    let again = it.threads(&[pid]).expect("a second pass");
    assert_eq!(
        again.iter().map(|t| t.tid).collect::<Vec<_>>(),
        threads.iter().map(|t| t.tid).collect::<Vec<_>>()
    );
}

#[test]
fn gone_pids_and_no_pids_yield_nothing() {
    let _area = tests::area(module_path!());
    if !need_ebpf("iter::gone_pids_and_no_pids_yield_nothing") {
        return;
    }
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let gone = child.id();
    child.wait().expect("reap");
    let mut it = iter::load().expect("load the task iterator");
    assert_eq!(it.threads(&[gone]).expect("a pass"), Vec::new());
    assert_eq!(it.threads(&[]).expect("a pass"), Vec::new());

    // Beside a live pid, the gone one adds nothing; the pids of one pass do
    // not linger into the next.
    let me = std::process::id();
    let mine = it.threads(&[gone, me]).expect("a pass");
    assert!(
        !mine.is_empty() && mine.iter().all(|t| t.tgid == me),
        "{mine:?}"
    );
    assert_eq!(it.threads(&[]).expect("a pass"), Vec::new());
}

/// This thread's id and CPU time so far (ns, `/proc/thread-self/schedstat`).
fn own_tid_and_runtime() -> (u32, u64) {
    let link = std::fs::read_link("/proc/thread-self").expect("thread-self");
    let tid = link
        .file_name()
        .and_then(|n| n.to_str()?.parse().ok())
        .expect("a tid");
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ran = schedstat
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("runtime");
    (tid, ran)
}

/// CPU time is the thread's `utime + stime`: a thread that spun for 200 ms
/// of CPU has about that much (sampled at the tick, so not exactly).
#[test]
fn cpu_time_is_the_threads() {
    let _area = tests::area(module_path!());
    if !need_ebpf("iter::cpu_time_is_the_threads") {
        return;
    }
    const SPIN_NS: u64 = 200_000_000;
    let mut it = iter::load().expect("load the task iterator");
    let (tid, ran) = loop {
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let (tid, ran) = own_tid_and_runtime();
        if ran >= SPIN_NS {
            break (tid, ran);
        }
    };
    let threads = it.threads(&[std::process::id()]).expect("a pass");
    let me = threads
        .iter()
        .find(|t| t.tid == tid)
        .unwrap_or_else(|| panic!("no record of thread {tid}: {threads:?}"));
    assert_eq!(me.state_letter(), 'R', "{me:?}");
    assert!(
        me.cpu_ns >= SPIN_NS / 2 && me.cpu_ns <= ran + 100_000_000,
        "cpu {} ns against a runtime of {ran} ns",
        me.cpu_ns
    );
}
