//! The prove stage: the judge's proof work (arming a proof keepalive on a
//! silent connection, putting a socket's own options back) carried out
//! through the executor and recorded in the agent's history.

use selfheal_core::{
    config::AgentConfig,
    inspect::Report,
    judge::{AgentHistory, Judgement},
    ladder::Decision,
    outcome::HealReport,
    protocol::Act,
    prove::{MAX_RESTORE_FAILURES, Proof, ProofEvent, ProofTarget, ProofWork},
};

use crate::heal::Executor;
use crate::prove;

/// The prove stage: carries out the judge's proof work for one agent
/// through `executor` (the helper, or this process for its own uid), and
/// records it in the agent's history. Returns what was done, and what could
/// not be (as gaps: a proof that could not be armed is evidence not seen).
/// With `dry_run` nothing is touched: the work is only reported.
pub(super) fn prove_stage(
    agent: &AgentConfig,
    work: &[ProofWork],
    hist: &mut AgentHistory,
    executor: Option<&dyn Executor>,
    dry_run: bool,
    now_ms: u64,
) -> (Vec<ProofEvent>, Vec<String>) {
    let mut events = Vec::new();
    let mut gaps = Vec::new();
    let ka = prove::keepalive(&agent.proof);
    for w in work {
        match w {
            ProofWork::Arm {
                cookie,
                target,
                silent_ms,
                remote,
            } => {
                let what = format!(
                    "a proof keepalive on the connection to {remote} (fd {} of pid {})",
                    target.fd, target.pid
                );
                let result = match executor {
                    _ if dry_run => {
                        events.push(ProofEvent {
                            action: "arm",
                            inode: target.inode,
                            remote: remote.clone(),
                            ok: false,
                            detail: "not armed: --dry-run".into(),
                        });
                        continue;
                    }
                    Some(h) => h
                        .arm_proof(&agent.name, target, &ka)
                        .map_err(|e| e.to_string()),
                    None => Err("no helper and no permission to act directly".into()),
                };
                match result {
                    Ok(out) => {
                        tracing::info!(
                            agent = %agent.name, pid = target.pid, fd = target.fd,
                            inode = target.inode, remote = %remote,
                            "proof keepalive armed: idle {} s, interval {} s, {} probes (options before: {:?})",
                            ka.idle_s, ka.interval_s, ka.count, out.previous
                        );
                        // Timed from this check's start, before anything
                        // was armed, and from the silence the kernel's
                        // keepalive timer counts (data or ACK). A later
                        // check counts its tcp_info ages back from its
                        // own read of them (`Proof::answer`): any ACK after
                        // this check's start proves the peer there.
                        let armed_at_ms = now_ms;
                        let kernel_silent = out.silent_ms.map_or(*silent_ms, u64::from);
                        hist.proofs.insert(
                            *cookie,
                            Proof::armed(
                                target,
                                &ka,
                                kernel_silent,
                                out.previous.clone(),
                                armed_at_ms,
                            ),
                        );
                        events.push(ProofEvent {
                            action: "arm",
                            inode: target.inode,
                            remote: remote.clone(),
                            ok: true,
                            detail: format!(
                                "armed: {} probes {} s apart (user timeout {} ms); the socket's own options were {}",
                                ka.count,
                                ka.interval_s,
                                out.applied.user_timeout_ms,
                                out.previous.words()
                            ),
                        });
                    }
                    Err(e) => {
                        gaps.push(format!("could not arm {what}: {e}"));
                        events.push(ProofEvent {
                            action: "arm",
                            inode: target.inode,
                            remote: remote.clone(),
                            ok: false,
                            detail: e,
                        });
                    }
                }
            }
            ProofWork::Restore {
                cookie,
                target,
                remote,
                answered,
            } => {
                let Some(p) = hist.proofs.get(cookie).cloned() else {
                    continue;
                };
                let result = match executor {
                    _ if dry_run => continue,
                    Some(h) => h
                        .restore_proof(&agent.name, target, &p.previous)
                        .map_err(|e| e.to_string()),
                    None => Err("no helper and no permission to act directly".into()),
                };
                // Read back and compared: a live call keeps no trace.
                let result = result.and_then(|back| {
                    if back == p.previous {
                        Ok(back)
                    } else {
                        Err(format!(
                            "put back {}, but read back {}",
                            p.previous.words(),
                            back.words()
                        ))
                    }
                });
                match result {
                    Ok(back) => {
                        hist.proofs.remove(cookie);
                        let why = if *answered {
                            let a = hist.answered.entry(*cookie).or_default();
                            a.at_ms = now_ms;
                            a.rounds = a.rounds.saturating_add(1);
                            "the peer answered"
                        } else {
                            "the proof is withdrawn (proofs off, or the ladder does not end this connection)"
                        };
                        tracing::info!(
                            agent = %agent.name, pid = p.pid, fd = p.fd, inode = p.inode,
                            remote = %remote,
                            "proof keepalive: {why}; options put back and read back: {}",
                            back.words()
                        );
                        events.push(ProofEvent {
                            action: "restore",
                            inode: p.inode,
                            remote: remote.clone(),
                            ok: true,
                            detail: format!(
                                "{why}; options put back and read back: {}",
                                back.words()
                            ),
                        });
                    }
                    Err(e) => {
                        let failures = p.restore_failures.saturating_add(1);
                        if let Some(q) = hist.proofs.get_mut(cookie) {
                            q.restore_failures = failures;
                            q.restore_error = Some(e.clone());
                        }
                        // Given up, the record stays (never retried, never
                        // re-armed: a new proof would read these options as
                        // the socket's own).
                        let gap = if failures >= MAX_RESTORE_FAILURES {
                            format!(
                                "gave up putting back the keepalive options of the connection to {remote} (fd {} of pid {}) after {failures} attempts, {}: {e}",
                                p.fd,
                                p.pid,
                                p.previous.words()
                            )
                        } else {
                            format!(
                                "could not put back the keepalive options of the connection to {remote} (fd {} of pid {}; attempt {failures}, tried again next check): {e}",
                                p.fd, p.pid
                            )
                        };
                        tracing::warn!(agent = %agent.name, "{gap}");
                        gaps.push(gap);
                        events.push(ProofEvent {
                            action: "restore",
                            inode: p.inode,
                            remote: remote.clone(),
                            ok: false,
                            detail: e,
                        });
                    }
                }
            }
        }
    }
    (events, gaps)
}

/// Restores for the proven-dead sockets the ladder neither ended in this
/// check nor is waiting to (its decision is to do nothing, or it gave up, or
/// its step failed, e.g. for want of a snapshot).
pub(super) fn unended_proofs(
    j: &Judgement,
    report: &Report,
    heal: Option<&HealReport>,
) -> Vec<ProofWork> {
    if heal.is_some_and(|h| matches!(h.decision, Decision::Wait { .. })) {
        return Vec::new();
    }
    let ended = |inode: u64| {
        heal.is_some_and(|h| {
            h.actions.iter().any(|a| {
                a.ok && matches!(a.step, Act::ExpireKeepalive { socket, .. } | Act::DestroySocket { socket, .. } if socket.inode == inode)
            })
        })
    };
    j.dead
        .iter()
        .filter(|d| d.by_proof && !ended(d.inode))
        .filter_map(|d| {
            let inode = d.inode;
            let s = report.sockets.iter().find(|s| s.inode == inode)?;
            let start_ticks = report
                .processes
                .iter()
                .find(|p| p.pid == s.pid)?
                .start_ticks?;
            Some(ProofWork::Restore {
                cookie: s.cookie,
                target: ProofTarget {
                    pid: s.pid,
                    start_ticks,
                    fd: s.fd?,
                    inode,
                },
                remote: s.remote.clone(),
                answered: false,
            })
        })
        .collect()
}

/// The prove stage through the direct executor on a fake kernel: what it
/// arms and puts back, and what it refuses, without root.
#[cfg(test)]
mod tests {
    use std::path::Path;

    use selfheal_core::{
        config::{AgentConfig, Config},
        judge::AgentHistory,
        keepalive::KeepaliveSettings,
        prove::{ProofTarget, ProofWork},
    };

    use super::prove_stage;
    use crate::{
        actions::keepalive::Keepalive,
        heal::direct::DirectExecutor,
        sys::fake::{COOKIE, FD, FakeKernel, Fd, INODE, PID, START, Socket},
    };

    fn agent() -> AgentConfig {
        let text = format!("[[agent]]\nname = \"sol\"\nmatch = {{ pid = {PID} }}\n");
        Config::parse(&text, Path::new("/etc/selfheal/test.toml"))
            .expect("config")
            .agents
            .remove(0)
    }

    fn direct(k: FakeKernel) -> DirectExecutor<FakeKernel> {
        DirectExecutor {
            keepalive: Keepalive::default(),
            system: k,
        }
    }

    fn target() -> ProofTarget {
        ProofTarget {
            pid: PID,
            start_ticks: START,
            fd: FD,
            inode: INODE,
        }
    }

    fn arm() -> ProofWork {
        ProofWork::Arm {
            cookie: COOKIE,
            target: target(),
            silent_ms: 30_000,
            remote: "10.0.0.2:443".into(),
        }
    }

    fn restore(answered: bool) -> ProofWork {
        ProofWork::Restore {
            cookie: COOKIE,
            target: target(),
            remote: "10.0.0.2:443".into(),
            answered,
        }
    }

    /// The keepalive options socket `inode` holds.
    fn options(k: &FakeKernel, inode: u64) -> KeepaliveSettings {
        k.socket(inode).keepalive()
    }

    #[test]
    fn a_proof_is_armed_recorded_and_put_back_read_back_when_the_peer_answers() {
        let ex = direct(FakeKernel::agent());
        let before = options(&ex.system, INODE);
        let (a, cfg) = (agent(), agent().proof);
        let mut hist = AgentHistory::default();
        let (events, gaps) = prove_stage(&a, &[arm()], &mut hist, Some(&ex), false, 1_000);
        assert!(gaps.is_empty(), "{gaps:?}");
        assert!(events[0].ok, "{events:?}");
        let proof = &hist.proofs[&COOKIE];
        assert_eq!(
            (proof.pid, proof.fd, proof.previous.clone()),
            (PID, FD, before.clone())
        );
        let armed = options(&ex.system, INODE);
        assert!(armed.enabled && armed.count == cfg.count, "{armed:?}");
        let (events, gaps) = prove_stage(&a, &[restore(true)], &mut hist, Some(&ex), false, 9_000);
        assert!(gaps.is_empty() && events[0].ok, "{events:?} {gaps:?}");
        assert!(
            events[0].detail.starts_with("the peer answered"),
            "{events:?}"
        );
        assert_eq!(options(&ex.system, INODE), before);
        assert!(hist.proofs.is_empty());
        assert_eq!(hist.answered[&COOKIE].at_ms, 9_000);
    }

    #[test]
    fn a_proof_on_a_reused_pid_is_a_gap_and_nothing_is_armed() {
        let k = FakeKernel::agent();
        k.with(|w| w.on_agent(|p| p.start_ticks = START + 7));
        let ex = direct(k);
        let mut hist = AgentHistory::default();
        let (events, gaps) = prove_stage(&agent(), &[arm()], &mut hist, Some(&ex), false, 1);
        assert!(!events[0].ok);
        assert!(
            gaps[0]
                .starts_with("could not arm a proof keepalive on the connection to 10.0.0.2:443")
                && gaps[0].contains("is no longer the process that was judged"),
            "{gaps:?}"
        );
        assert!(hist.proofs.is_empty());
        assert!(ex.system.calls_of("setsockopt").is_empty());
    }

    #[test]
    fn a_proof_is_never_armed_on_a_socket_the_agent_no_longer_holds() {
        let k = FakeKernel::agent();
        k.with(|w| {
            w.sockets.insert(43, Socket::tcp(0x43));
            w.on_agent(|p| p.fds.insert(FD, Fd::Socket(43)))
        });
        let ex = direct(k);
        let mut hist = AgentHistory::default();
        let (events, gaps) = prove_stage(&agent(), &[arm()], &mut hist, Some(&ex), false, 1);
        assert!(!events[0].ok);
        assert!(
            gaps[0].contains("no longer holds the judged socket"),
            "{gaps:?}"
        );
        assert!(ex.system.calls_of("setsockopt").is_empty());
        assert_eq!(options(&ex.system, 43), options(&ex.system, INODE));
        assert!(hist.proofs.is_empty());
    }

    #[test]
    fn a_restore_read_back_changed_is_a_failure_kept_for_the_next_check() {
        let ex = direct(FakeKernel::agent());
        let a = agent();
        let mut hist = AgentHistory::default();
        prove_stage(&a, &[arm()], &mut hist, Some(&ex), false, 1);
        // Someone sets the idle time between the put-back and its reading.
        ex.system.before("getsockopt 42 TCP_KEEPIDLE", |w| {
            w.on_agent_socket(|s| s.opts.insert((libc::IPPROTO_TCP, libc::TCP_KEEPIDLE), 99));
        });
        let (events, gaps) = prove_stage(&a, &[restore(true)], &mut hist, Some(&ex), false, 2);
        assert!(!events[0].ok);
        assert!(events[0].detail.contains("but read back"), "{events:?}");
        assert!(
            gaps[0].contains("attempt 1, tried again next check"),
            "{gaps:?}"
        );
        assert_eq!(hist.proofs[&COOKIE].restore_failures, 1);
        assert!(hist.answered.is_empty());
    }

    #[test]
    fn a_dry_run_or_no_executor_touches_nothing() {
        let ex = direct(FakeKernel::agent());
        let a = agent();
        let mut hist = AgentHistory::default();
        let (events, gaps) = prove_stage(&a, &[arm()], &mut hist, Some(&ex), true, 1);
        assert_eq!(events[0].detail, "not armed: --dry-run");
        assert!(gaps.is_empty());
        let (events, gaps) = prove_stage(&a, &[arm()], &mut hist, None, false, 1);
        assert!(!events[0].ok);
        assert!(
            gaps[0].ends_with("no helper and no permission to act directly"),
            "{gaps:?}"
        );
        assert!(ex.system.calls().is_empty(), "{:?}", ex.system.calls());
        assert!(hist.proofs.is_empty());
    }
}
