//! The census as a table a person reads at 3 a.m.

use serde::Serialize;

use super::{Finding, ProcessFinding, ProofVerdict, Verdict, Waiter, process::process_text};
use crate::text::escape;

/// What the census could not see, for the line under the table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// Processes read.
    pub processes: usize,
    /// Processes left out because the caller may not read them (not root:
    /// other users'), counted only.
    pub not_yours: usize,
    /// Processes of the caller's whose fds it may not read (not dumpable,
    /// or read refused), counted only.
    pub unreadable: usize,
    /// Processes that ended during the scan.
    pub gone: usize,
    /// Processes whose read ran past its budget (their threads are partly
    /// read).
    pub over_budget: usize,
    /// Processes read with a gap (a wait set read only in part or not at
    /// all, …): `selfheal inspect --pid` lists each.
    pub with_gaps: usize,
    /// Network namespaces whose sockets could not be dumped, with why.
    pub netns_errors: Vec<String>,
    /// Why a scan as root read procfs and sock_diag instead of one pass of
    /// the kernel's task iterators (it sees the same, more slowly).
    pub procfs_because: Option<String>,
}

pub(super) fn age(ms: Option<u64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 10_000 => format!("{:.1}s", ms as f64 / 1000.0),
        Some(ms) if ms < 3_600_000 => format!("{}s", ms / 1000),
        Some(ms) => format!("{}h{}m", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

fn waiting_text(w: &[Waiter]) -> String {
    match w {
        [] => "-".into(),
        [one] => format!(
            "{}{} tid {}",
            one.syscall,
            if one.event_loop { " (event loop)" } else { "" },
            one.tid
        ),
        [one, rest @ ..] => format!("{} tid {} +{}", one.syscall, one.tid, rest.len()),
    }
}

/// The census as a table for a person, most severe first, each row with
/// the `inspect` command to run next; every name a process controls
/// (comm, unit, container) escaped.
pub fn render(
    findings: &[Finding],
    processes: &[ProcessFinding],
    coverage: &Coverage,
    silent_for_ms: u64,
) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let rows: Vec<[String; 9]> = findings
        .iter()
        .map(|f| {
            let who = match (&f.owner.container, &f.owner.unit) {
                (Some(c), _) => format!("container {}", escape(c)),
                (None, Some(u)) => escape(u),
                (None, None) => "-".into(),
            };
            [
                f.verdict.to_string(),
                f.owner.pid.to_string(),
                escape(&f.owner.comm),
                who,
                format!("{} -> {}", f.local, f.remote),
                f.state.to_string(),
                age(f.silent_ms),
                waiting_text(&f.waiting),
                format!("selfheal inspect --pid {}", f.owner.pid),
            ]
        })
        .collect();
    let head = [
        "VERDICT",
        "PID",
        "COMM",
        "UNIT",
        "CONNECTION",
        "STATE",
        "SILENT",
        "WAITING",
        "NEXT",
    ];
    let mut width = head.map(|h| h.chars().count());
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |o: &mut String, cells: &[&str]| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                let _ = write!(s, "{c:<w$}  ", w = width[i]);
            }
        }
        let _ = writeln!(o, "{}", s.trim_end());
    };
    if rows.is_empty() {
        let _ = writeln!(
            o,
            "no connection waited on, connecting or peer-closed (silent-for {})",
            age(Some(silent_for_ms))
        );
    } else {
        line(&mut o, &head);
        for r in &rows {
            let cells: Vec<&str> = r.iter().map(String::as_str).collect();
            line(&mut o, &cells);
        }
    }
    let proved: Vec<&Finding> = findings.iter().filter(|f| f.proof.is_some()).collect();
    if !proved.is_empty() {
        let _ = writeln!(o, "\nproofs:");
    }
    for f in proved {
        let Some(p) = &f.proof else { continue };
        let when = match (p.after_ms, p.bound_ms) {
            (Some(a), Some(b)) => format!(" after {} (bound {})", age(Some(a)), age(Some(b))),
            _ => String::new(),
        };
        let back = match (p.after_ms, p.restored) {
            (None, _) => "",
            (Some(_), true) => "; its own options put back",
            (Some(_), false) => "; its own options NOT put back",
        };
        let _ = writeln!(
            o,
            "  pid {} fd {} -> {}: {}{when}: {}{back}",
            f.owner.pid,
            f.fd,
            f.remote,
            match p.result {
                ProofVerdict::Dead => "dead",
                ProofVerdict::Alive => "alive",
                ProofVerdict::Unproven => "unproven",
            },
            escape(&p.detail)
        );
    }
    if !processes.is_empty() {
        let _ = writeln!(o, "\nprocesses:");
    }
    for f in processes {
        let _ = writeln!(o, "{}", process_text(f));
    }
    let count = |v: Verdict| findings.iter().filter(|f| f.verdict == v).count();
    let dead = match count(Verdict::Dead) {
        0 => String::new(),
        n => format!("{n} dead, "),
    };
    let _ = write!(
        o,
        "\n{dead}{} suspect, {} connecting, {} peer_closed, {} alive; {} processes read",
        count(Verdict::Suspect),
        count(Verdict::Connecting),
        count(Verdict::PeerClosed),
        count(Verdict::Alive),
        coverage.processes
    );
    let zombies = processes.iter().filter(|f| f.zombie_count > 0).count();
    let d_state = processes.iter().filter(|f| f.d_state_count > 0).count();
    if zombies > 0 {
        let _ = write!(o, ", {zombies} with unreaped zombies");
    }
    if d_state > 0 {
        let _ = write!(o, ", {d_state} with threads in D state");
    }
    if coverage.not_yours > 0 {
        let _ = write!(
            o,
            ", {} of other users not read (run as root to see them)",
            coverage.not_yours
        );
    }
    if coverage.unreadable > 0 {
        let _ = write!(o, ", {} not readable", coverage.unreadable);
    }
    if coverage.gone > 0 {
        let _ = write!(o, ", {} ended during the scan", coverage.gone);
    }
    if coverage.over_budget > 0 {
        let _ = write!(
            o,
            ", {} read only in part (past their budget)",
            coverage.over_budget
        );
    }
    if coverage.with_gaps > 0 {
        let _ = write!(
            o,
            ", {} read with gaps (`selfheal inspect --pid PID` says what it did not see)",
            coverage.with_gaps
        );
    }
    let _ = writeln!(o);
    for e in &coverage.netns_errors {
        let _ = writeln!(o, "sockets not read: {}", escape(e));
    }
    if let Some(why) = &coverage.procfs_because {
        let _ = writeln!(o, "read through procfs and sock_diag: {}", escape(why));
    }
    o
}
