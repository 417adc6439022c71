//! The report as text for a person at a terminal: [`render`] (every
//! outside string escaped), and the words for waits and ages.

use super::*;

/// Milliseconds as people read them: `850ms`, `3.2s`, `12m05s`, `4h31m`, `2d3h`.
pub fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", s, (ms % 1000) / 100),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A thread's readiness wait, in words: `waits in poll on socket inode 1234
/// (fd 5, provider) for 3.2s`, or `event loop waits in epoll_wait on 3
/// sockets (inodes 1, 2, 3) for 3.2s`. Only static names and numbers.
pub(super) fn wait_line(
    t: &ThreadReport,
    pid: u32,
    sockets: &BTreeMap<u64, &SocketReport>,
) -> String {
    let sc = t.wait_syscall.as_deref().unwrap_or("?");
    let what = if t.wait_event_loop {
        format!("event loop waits in {sc}")
    } else {
        format!("waits in {sc}")
    };
    let on = match t.wait_inodes.as_slice() {
        [inode] => {
            let s = sockets.get(inode);
            let fd = s
                .filter(|s| s.pid == pid)
                .and_then(|s| s.fd)
                .map(|fd| format!("fd {fd}"));
            let about: Vec<String> = fd
                .into_iter()
                .chain(s.map(|s| s.role.to_string()))
                .collect();
            if about.is_empty() {
                format!("socket inode {inode}")
            } else {
                format!("socket inode {inode} ({})", about.join(", "))
            }
        }
        many => {
            let shown: Vec<String> = many.iter().take(8).map(u64::to_string).collect();
            let more = if many.len() > 8 { ", …" } else { "" };
            format!("{} sockets (inodes {}{more})", many.len(), shown.join(", "))
        }
    };
    match t.idle_ms {
        Some(ms) => format!("{what} on {on} for {}", human_ms(ms)),
        None => format!("{what} on {on}"),
    }
}

/// The report for a person at a terminal: a tree, anomalies marked `!`.
pub fn render(r: &Report) -> String {
    escape_lines(&render_raw(r))
}

pub(super) fn render_raw(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let title = match &r.agent {
        Some(name) => format!("agent {} ({})", escape(name), escape(&r.rule)),
        None => format!("process tree of {}", escape(&r.rule)),
    };
    let _ = writeln!(
        o,
        "{title}: {} process(es), {} zombie(s)",
        r.processes.len(),
        r.zombies.len()
    );
    for u in &r.upstreams {
        let _ = writeln!(o, "  upstream {}", escape(u));
    }
    // Container identity: `describe` escapes what a runtime said.
    for c in &r.containers {
        let _ = writeln!(o, "  container {}", c.describe());
    }
    let sockets: BTreeMap<u64, &SocketReport> = r.sockets.iter().map(|s| (s.inode, s)).collect();
    let live: Vec<&ProcessReport> = r.processes.iter().filter(|p| p.state != 'Z').collect();
    for (i, p) in live.iter().enumerate() {
        let last = i + 1 == live.len() && r.zombies.is_empty();
        let (branch, indent) = if last {
            ("└─", "   ")
        } else {
            ("├─", "│  ")
        };
        let init = if p.pid_ns_init {
            ", PID 1 of its pid namespace"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "{branch} pid {} {} [{}] (parent {}{init})",
            p.pid,
            escape(&p.name),
            p.state,
            p.ppid
        );
        for t in &p.threads {
            let mark = if t.anomalies.is_empty() { ' ' } else { '!' };
            let what = match (t.recv_blocked_ms, t.recv_inode) {
                (Some(ms), inode) => format!(
                    "blocked {} in {} on socket {}{} [{}]",
                    human_ms(ms),
                    t.recv_syscall.as_deref().unwrap_or("?"),
                    inode.map_or("?".into(), |i| i.to_string()),
                    inode
                        .and_then(|i| sockets.get(&i))
                        .map_or(String::new(), |s| format!(" ({})", s.role)),
                    t.recv_source.map_or("?", |s| s.as_str())
                ),
                _ if t.wait_syscall.is_some() => wait_line(t, p.pid, &sockets),
                _ => match (&t.syscall, t.idle_ms) {
                    (Some(sc), Some(ms)) => format!("in {sc} for {}", human_ms(ms)),
                    (Some(sc), None) => format!("in {sc}"),
                    (None, _) => "running".into(),
                },
            };
            let _ = writeln!(
                o,
                "{indent}{mark} thread {:>7} {:<15} {} {:<18} {what}",
                t.tid,
                escape(&t.name),
                t.state,
                t.wchan.as_deref().unwrap_or("-")
            );
            if !t.kstack.is_empty() {
                let _ = writeln!(o, "{indent}    kernel: {}", t.kstack.join(" < "));
            }
        }
        for inode in &p.sockets {
            let Some(s) = sockets.get(inode) else {
                continue;
            };
            let mark = if s.anomalies.is_empty() { ' ' } else { '!' };
            let _ = writeln!(
                o,
                "{indent}{mark} socket {} {:<8} {} -> {} {}",
                s.inode, s.role, s.local, s.remote, s.state
            );
            if let Some(t) = &s.tcp_info {
                let keepalive = match &s.timer {
                    Some(timer) if timer.kind == "keepalive" => "keepalive on".to_string(),
                    Some(timer) => {
                        format!("{} timer in {}", timer.kind, human_ms(timer.expires_ms))
                    }
                    None => "no timer".to_string(),
                };
                let _ = writeln!(
                    o,
                    "{indent}    data in {} ago, out {} ago, ack {} ago; unacked {}, retrans {}, probes {}; {keepalive}",
                    human_ms(u64::from(t.last_data_recv_ms)),
                    human_ms(u64::from(t.last_data_sent_ms)),
                    human_ms(u64::from(t.last_ack_recv_ms)),
                    t.unacked,
                    t.retransmits,
                    t.probes
                );
            }
            if let Some(a) = &s.ebpf {
                let age = |v: Option<u64>| {
                    v.map_or("never".to_string(), |ms| format!("{} ago", human_ms(ms)))
                };
                let _ = writeln!(
                    o,
                    "{indent}    eBPF: app read {} ({} B), wrote {} ({} B); reads {} with data, {} empty",
                    age(a.last_recv_ms),
                    a.last_recv_bytes,
                    age(a.last_send_ms),
                    a.last_send_bytes,
                    a.recv_data,
                    a.recv_empty
                );
            }
            for an in &s.anomalies {
                let _ = writeln!(o, "{indent}    ! {an}");
            }
        }
    }
    if !r.zombies.is_empty() {
        let pids: Vec<String> = r
            .zombies
            .iter()
            .take(8)
            .map(|z| z.pid.to_string())
            .collect();
        let more = if r.zombies.len() > 8 { ", …" } else { "" };
        let _ = writeln!(
            o,
            "└─ ! zombies: {} (pids {}{more})",
            r.zombies.len(),
            pids.join(", ")
        );
    }
    if let Some(d) = &r.init.diagnosis {
        let _ = writeln!(o, "   ! missing init: {}", escape(d));
    }
    let _ = writeln!(
        o,
        "\neBPF: {}",
        r.ebpf.strategy.map_or("none".to_string(), |s| {
            format!(
                "{s} (watched for {})",
                human_ms(r.ebpf.watched_ms.unwrap_or(0))
            )
        })
    );
    for a in &r.ebpf.attempts {
        if let Some(e) = &a.error {
            let _ = writeln!(o, "  {:<10} failed: {e}", a.strategy.name());
        }
    }
    if let Some(e) = &r.ebpf.error {
        let _ = writeln!(o, "  error: {e}");
    }
    let c = &r.collection;
    let iterators = format!(
        "the kernel's task iterators ({})",
        c.iterators_from.as_deref().unwrap_or("?")
    );
    let why = escape(&c.why_procfs.join("; "));
    let _ = match (c.iterators, c.procfs) {
        (0, 0) => Ok(()),
        (i, 0) => writeln!(o, "read by: {iterators}, {i} process(es)"),
        (0, p) => writeln!(o, "read by: procfs, {p} process(es) ({why})"),
        (i, p) => writeln!(
            o,
            "read by: {iterators} for {i} process(es), procfs for {p} ({why})"
        ),
    };
    if !c.why_sock_diag.is_empty() {
        let why = escape(&c.why_sock_diag.join("; "));
        let _ = writeln!(o, "connections read by: sock_diag ({why})");
    }
    if !r.gaps.is_empty() {
        let _ = writeln!(o, "\nnot seen");
        for g in &r.gaps {
            let _ = writeln!(o, "  - {}", escape(&g.text));
        }
    }
    o
}

#[cfg(test)]
mod collection_tests {
    use super::render;
    use crate::{fixture, inspect::Collection};

    fn line(c: Collection) -> Option<String> {
        let mut r = fixture::report();
        r.collection = c;
        render(&r)
            .lines()
            .find(|l| l.starts_with("read by:"))
            .map(str::to_string)
    }

    #[test]
    fn the_report_says_which_reader_read_how_many_processes_and_why_procfs() {
        assert_eq!(line(Collection::default()), None);
        let iterated = Collection {
            iterators: 3,
            iterators_from: Some("pinned".into()),
            ..Collection::default()
        };
        assert_eq!(
            line(iterated.clone()).as_deref(),
            Some("read by: the kernel's task iterators (pinned), 3 process(es)")
        );
        let mut both = iterated;
        both.procfs_for("not root");
        both.procfs_for("not root");
        both.procfs_for("link: \u{1b}[31m");
        assert_eq!(both.procfs, 3);
        assert_eq!(both.why_procfs.len(), 2, "each reason once");
        assert_eq!(
            line(both).as_deref(),
            Some(
                "read by: the kernel's task iterators (pinned) for 3 process(es), procfs for 3 \
                 (not root; link: \\u{1b}[31m)"
            )
        );
        let mut procfs = Collection::default();
        procfs.procfs_for("disabled by --no-iterators");
        assert_eq!(
            line(procfs).as_deref(),
            Some("read by: procfs, 1 process(es) (disabled by --no-iterators)")
        );
        let json = serde_json::to_value(fixture::report()).unwrap();
        assert_eq!(
            json["collection"],
            serde_json::json!({"iterators": 0, "procfs": 0, "why_procfs": []})
        );
    }
}
