//! The acts on a fake kernel (`sys/fake.rs`): the races and refusals that
//! until now only root could stage against real processes — a pid reused
//! between the decision and the act, a process gone mid-act, an fd closed,
//! swapped for a file or for another socket, an option set failing half
//! way, `SOCK_DESTROY` refused, a signal to a process that is no longer
//! the one judged, a caller the kernel gives no authority. Each test says
//! what must not have been touched by the calls the fake recorded.

use std::time::Duration;

use selfheal_core::{
    keepalive::{KeepaliveSettings, ProofKeepalive},
    protocol::{Act, SocketRef},
};

use super::{
    ActOutcome, ActionError, Hand, Signalling, act_on,
    destroy::{DestroyMethod, destroy_socket_gated},
    dup::{SocketSeen, open_gate},
    guard::{guard_on, open_target_on},
    keepalive::{
        Keepalive, arm_keepalive_gated, expire_keepalive_gated, read_keepalive_on,
        restore_keepalive_chosen,
    },
    signal::{KILL_WAIT, Signal, signal_escalate_on},
};
use crate::sys::{
    fake::{
        CLOSE, COOKIE, FD, FakeKernel, Fd, INODE, KERNEL_KEEPALIVE, PID, Proc, START, Socket, UID,
    },
    system::System,
};

/// A hand that acts for itself: every socket let through, the signal
/// carried out to its end (or SIGTERM only, for the helper's way).
struct Plain {
    keepalive: Keepalive,
    signalling: Signalling,
}

impl Plain {
    fn new() -> Plain {
        Plain {
            keepalive: Keepalive::default(),
            signalling: Signalling::Escalate,
        }
    }
}

impl Hand<FakeKernel> for Plain {
    fn keepalive(&self) -> &Keepalive {
        &self.keepalive
    }

    fn signalling(&self) -> Signalling {
        self.signalling
    }
}

/// A hand whose gate refuses every socket.
struct Refusing(Keepalive);

impl Hand<FakeKernel> for Refusing {
    fn keepalive(&self) -> &Keepalive {
        &self.0
    }

    fn gate(&self, _: &Act, _: &SocketSeen<'_, FakeKernel>) -> Result<(), ActionError> {
        Err(ActionError::Refused {
            why: "the caller may no longer act on it".into(),
        })
    }
}

fn socket() -> SocketRef {
    SocketRef {
        fd: FD,
        inode: INODE,
    }
}

fn arm() -> Act {
    Act::ArmKeepalive {
        pid: PID,
        start_ticks: START,
        socket: socket(),
    }
}

fn destroy() -> Act {
    Act::DestroySocket {
        pid: PID,
        start_ticks: START,
        socket: socket(),
    }
}

fn signal(grace: Duration) -> Act {
    Act::Signal {
        pid: PID,
        start_ticks: START,
        grace_ms: Some(grace.as_millis() as u64),
    }
}

fn proof() -> ProofKeepalive {
    ProofKeepalive {
        idle_s: 1,
        interval_s: 1,
        count: 3,
        hold_ms: 1000,
    }
}

/// The keepalive options of socket `inode` as the kernel holds them.
fn options(k: &FakeKernel, inode: u64) -> KeepaliveSettings {
    k.socket(inode).keepalive()
}

/// The kernel's defaults, which the fake's sockets start with.
fn defaults() -> KeepaliveSettings {
    KERNEL_KEEPALIVE
}

/// Nothing of the agent's sockets was changed, shut or destroyed.
fn untouched(k: &FakeKernel) {
    let changes = [
        k.calls_of("setsockopt"),
        k.calls_of("shutdown"),
        k.calls_of("sock_destroy"),
    ]
    .concat();
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(options(k, INODE), defaults());
}

/// Not even a duplicate of the agent's fd was taken, so nothing changed.
fn never_duplicated(k: &FakeKernel) {
    assert!(k.calls_of("get_fd").is_empty(), "{:?}", k.calls());
    untouched(k);
}

/// The pid names another process (same fds) than the one judged.
fn reuse(w: &mut crate::sys::fake::World) {
    if let Some(p) = w.processes.get_mut(&PID) {
        p.start_ticks = START + 1;
    }
}

#[test]
fn a_pid_reused_before_the_act_is_refused_with_nothing_touched() {
    let k = FakeKernel::agent();
    k.with(reuse);
    let e = act_on(&k, &arm(), &Plain::new()).unwrap_err();
    assert!(
        matches!(e, ActionError::Reused { pid: PID, expected: START, found } if found == START + 1),
        "{e}"
    );
    never_duplicated(&k);
}

#[test]
fn a_pid_reused_after_the_handle_was_pinned_is_refused_by_the_guard() {
    let k = FakeKernel::agent();
    let pinned = k.pin(PID);
    k.with(reuse);
    let e = arm_keepalive_gated(
        &k,
        &pinned,
        FD,
        Some(INODE),
        &Keepalive::default(),
        &open_gate,
    )
    .unwrap_err();
    assert!(matches!(e, ActionError::Reused { .. }), "{e}");
    never_duplicated(&k);
}

#[test]
fn a_pid_reused_mid_act_is_never_reached_through_the_old_handle() {
    let k = FakeKernel::agent();
    // Between the guard's look and pidfd_getfd, the process exits and its
    // pid is taken by another holding the same fd.
    k.before("get_fd", reuse);
    let e = act_on(&k, &arm(), &Plain::new()).unwrap_err();
    assert!(matches!(e, ActionError::Gone { pid: PID }), "{e}");
    untouched(&k);
}

#[test]
fn a_process_that_exits_mid_act_is_gone_with_nothing_set() {
    let k = FakeKernel::agent();
    k.before("get_fd", |w| {
        if let Some(p) = w.processes.get_mut(&PID) {
            p.alive = false;
        }
    });
    let e = act_on(&k, &destroy(), &Plain::new()).unwrap_err();
    assert!(matches!(e, ActionError::Gone { pid: PID }), "{e}");
    untouched(&k);
}

#[test]
fn a_closed_fd_is_no_such_fd_and_is_never_duplicated() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent(|p| p.fds.clear()));
    let e = act_on(&k, &arm(), &Plain::new()).unwrap_err();
    assert!(
        matches!(e, ActionError::NoSuchFd { pid: PID, fd: FD }),
        "{e}"
    );
    never_duplicated(&k);
}

#[test]
fn an_fd_holding_a_file_is_never_duplicated() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent(|p| p.fds.insert(FD, Fd::File)));
    let e = act_on(&k, &arm(), &Plain::new()).unwrap_err();
    assert!(matches!(e, ActionError::NotASocket { .. }), "{e}");
    assert!(k.calls_of("get_fd").is_empty(), "{:?}", k.calls());
}

#[test]
fn an_fd_swapped_for_a_file_mid_act_is_closed_aside_untouched() {
    let k = FakeKernel::agent();
    k.before("get_fd", |w| {
        w.on_agent(|p| p.fds.insert(FD, Fd::File));
    });
    let e = act_on(&k, &arm(), &Plain::new()).unwrap_err();
    assert!(matches!(e, ActionError::NotASocket { .. }), "{e}");
    assert_eq!(k.calls_of("close_aside"), ["close_aside None"]);
    assert!(k.calls_of("getsockopt").is_empty(), "{:?}", k.calls());
    untouched(&k);
}

/// The fd now holds socket 43, not the judged 42.
fn swap_socket(w: &mut crate::sys::fake::World) {
    w.sockets.insert(43, Socket::tcp(0x43));
    w.on_agent(|p| p.fds.insert(FD, Fd::Socket(43)));
}

#[test]
fn a_socket_replaced_before_the_act_is_left_alone() {
    for act in [arm(), destroy()] {
        let k = FakeKernel::agent();
        k.with(swap_socket);
        let e = act_on(&k, &act, &Plain::new()).unwrap_err();
        assert!(
            matches!(
                e,
                ActionError::Replaced {
                    expected: INODE,
                    found: 43,
                    ..
                }
            ),
            "{e}"
        );
        // The caller learns only the inode it gave.
        assert!(!e.to_string().contains("43"), "{e}");
        untouched(&k);
        assert_eq!(options(&k, 43), defaults());
    }
}

#[test]
fn a_socket_replaced_between_the_link_and_the_dup_is_left_alone() {
    let k = FakeKernel::agent();
    k.before("get_fd", swap_socket);
    let e = act_on(&k, &destroy(), &Plain::new()).unwrap_err();
    assert!(matches!(e, ActionError::Replaced { found: 43, .. }), "{e}");
    untouched(&k);
    assert!(!k.socket(43).destroyed && !k.socket(43).shut_down);
}

#[test]
fn a_socket_that_is_not_tcp_is_refused() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent_socket(|s| s.protocol = libc::IPPROTO_UDP));
    let e = act_on(&k, &destroy(), &Plain::new()).unwrap_err();
    assert!(matches!(e, ActionError::NotTcp { .. }), "{e}");
    untouched(&k);
}

#[test]
fn a_gate_that_refuses_leaves_the_socket_as_it_was() {
    let prove = Act::ProveKeepalive {
        pid: PID,
        start_ticks: START,
        socket: socket(),
        keepalive: proof(),
    };
    for act in [arm(), destroy(), prove] {
        let k = FakeKernel::agent();
        let e = act_on(&k, &act, &Refusing(Keepalive::default())).unwrap_err();
        assert!(matches!(e, ActionError::Refused { .. }), "{e}");
        untouched(&k);
    }
}

#[test]
fn an_option_set_failing_half_way_puts_every_option_back() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent_socket(|s| s.failing_sets.push((libc::TCP_KEEPCNT, libc::EPERM))));
    let e = act_on(&k, &arm(), &Plain::new()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("setsockopt TCP_KEEPCNT=4 on fd 7 of pid 100:"),
        "{e}"
    );
    // Two options were set before the failure, then all five put back.
    let sets = k.calls_of("setsockopt");
    assert_eq!(sets.len(), 3 + 5, "{sets:?}");
    assert_eq!(options(&k, INODE), defaults());
}

#[test]
fn an_option_that_keeps_failing_leaves_the_ones_before_it_put_back() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent_socket(|s| s.failing_sets.extend([(libc::TCP_KEEPCNT, libc::EPERM); 2])));
    assert!(act_on(&k, &arm(), &Plain::new()).is_err());
    // The put-back stops where the arming did: what it changed is back,
    // what it never reached was never touched.
    assert_eq!(options(&k, INODE), defaults());
    assert!(
        k.calls_of("setsockopt 42 TCP_KEEPIDLE").is_empty(),
        "{:?}",
        k.calls()
    );
}

#[test]
fn keepalive_arm_and_restore_round_trip() {
    let k = FakeKernel::agent();
    let out = match act_on(&k, &arm(), &Plain::new()).unwrap() {
        ActOutcome::Keepalive(out) => out,
        other => panic!("{other}"),
    };
    assert_eq!(out.previous, defaults());
    assert_eq!(options(&k, INODE), out.applied);
    // The user timeout covers the 30 s already silent plus the probes.
    assert_eq!(out.silent_ms, Some(30_000));
    assert_eq!(out.applied.user_timeout_ms, 30_000 + 1_000 + 4_000);
    // TCP_KEEPIDLE is set last: it re-arms the timer with all else in place.
    let last = k.calls_of("setsockopt").pop().unwrap_or_default();
    assert!(last.starts_with("setsockopt 42 TCP_KEEPIDLE"), "{last}");
    let restore = Act::RestoreKeepalive {
        pid: PID,
        start_ticks: START,
        socket: socket(),
        previous: Some(out.previous.clone()),
    };
    match act_on(&k, &restore, &Plain::new()).unwrap() {
        ActOutcome::Restored(back) => assert_eq!(back, defaults()),
        other => panic!("{other}"),
    }
    assert_eq!(options(&k, INODE), defaults());
    let pinned = k.pin(PID);
    assert_eq!(read_keepalive_on(&k, &pinned, FD).unwrap(), defaults());
}

#[test]
fn a_restore_that_names_no_options_changes_nothing() {
    let k = FakeKernel::agent();
    let restore = Act::RestoreKeepalive {
        pid: PID,
        start_ticks: START,
        socket: socket(),
        previous: None,
    };
    let e = act_on(&k, &restore, &Plain::new()).unwrap_err();
    assert!(matches!(e, ActionError::NoOptions), "{e}");
    untouched(&k);
}

#[test]
fn a_restore_chooses_from_the_socket_it_sees() {
    let k = FakeKernel::agent();
    let pinned = k.pin(PID);
    let wanted = KeepaliveSettings {
        enabled: true,
        idle_s: 60,
        interval_s: 10,
        count: 5,
        user_timeout_ms: 0,
    };
    let chosen = wanted.clone();
    let back = restore_keepalive_chosen(&k, &pinned, FD, Some(INODE), &|seen| {
        assert_eq!((seen.inode, seen.cookie), (INODE, Some(COOKIE)));
        Ok(chosen.clone())
    })
    .unwrap();
    assert_eq!(back, wanted);
    assert_eq!(options(&k, INODE), wanted);
}

#[test]
fn a_proof_keepalive_round_trips_and_leaves_no_trace() {
    let k = FakeKernel::agent();
    let prove = Act::ProveKeepalive {
        pid: PID,
        start_ticks: START,
        socket: socket(),
        keepalive: proof(),
    };
    let out = match act_on(&k, &prove, &Plain::new()).unwrap() {
        ActOutcome::Keepalive(out) => out,
        other => panic!("{other}"),
    };
    assert_eq!(out.previous, defaults());
    assert_eq!(out.applied, proof().settings(Some(30_000)).unwrap());
    let restore = Act::RestoreKeepalive {
        pid: PID,
        start_ticks: START,
        socket: socket(),
        previous: Some(out.previous),
    };
    act_on(&k, &restore, &Plain::new()).unwrap();
    assert_eq!(options(&k, INODE), defaults());
}

#[test]
fn a_proof_is_refused_with_data_in_flight_or_off_established() {
    for (unacked, state, words) in [(2, 1, "2 segment(s) unacknowledged"), (0, 8, "TCP state 8")] {
        let k = FakeKernel::agent();
        k.with(|w| {
            let s = w.sockets.get_mut(&INODE).and_then(|s| s.info.as_mut());
            if let Some(i) = s {
                (i.unacked, i.state) = (unacked, state);
            }
        });
        let prove = Act::ProveKeepalive {
            pid: PID,
            start_ticks: START,
            socket: socket(),
            keepalive: proof(),
        };
        let e = act_on(&k, &prove, &Plain::new()).unwrap_err();
        assert!(
            matches!(&e, ActionError::NotApplicable { why, .. } if why.contains(words)),
            "{e}"
        );
        untouched(&k);
    }
}

fn destroyed(k: &FakeKernel) -> super::destroy::DestroyOutcome {
    match act_on(k, &destroy(), &Plain::new()).unwrap() {
        ActOutcome::Destroyed(out) => out,
        other => panic!("{other}"),
    }
}

#[test]
fn sock_destroy_ends_the_socket_in_its_own_namespace() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent_socket(|s| s.netns = 7));
    let out = destroyed(&k);
    assert_eq!(out.method, DestroyMethod::SockDestroy);
    assert!(out.detail.contains("cookie 0x4242"), "{}", out.detail);
    assert_eq!(k.calls_of("sock_destroy"), ["sock_destroy 42 in netns 7"]);
    assert!(k.socket(INODE).destroyed && !k.socket(INODE).shut_down);
}

#[test]
fn where_the_sockets_namespace_cannot_be_read_the_processs_is_entered() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent_socket(|s| s.netns_readable = false));
    assert_eq!(destroyed(&k).method, DestroyMethod::SockDestroy);
    assert_eq!(k.calls_of("netns_of_pid"), ["netns_of_pid 100"]);
}

#[test]
fn sock_destroy_refused_falls_back_to_shutdown_and_the_outcome_says_which_ran() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent_socket(|s| s.destroy_refused = Some(libc::EOPNOTSUPP)));
    let out = destroyed(&k);
    assert_eq!(out.method, DestroyMethod::Shutdown);
    assert!(
        out.detail.starts_with(
            "SOCK_DESTROY failed (sock_diag for fd 7 of pid 100: the kernel refused SOCK_DESTROY:"
        ) && out
            .detail
            .ends_with("shut down (SHUT_RDWR) through a duplicate of the fd"),
        "{}",
        out.detail
    );
    assert_eq!(
        (out.local, out.remote),
        (Some(k.socket(INODE).local), Some(k.socket(INODE).remote))
    );
    assert!(k.socket(INODE).shut_down && !k.socket(INODE).destroyed);
}

#[test]
fn a_socket_missing_from_its_namespace_is_shut_down_instead() {
    let k = FakeKernel::agent();
    // SIOCGSKNS unanswered, and the process's namespace is not the socket's.
    k.with(|w| {
        w.on_agent_socket(|s| {
            s.netns_readable = false;
            s.netns = 9;
        })
    });
    let out = destroyed(&k);
    assert_eq!(out.method, DestroyMethod::Shutdown);
    assert!(
        out.detail
            .contains("no TCP socket with inode 42 in the socket's network namespace"),
        "{}",
        out.detail
    );
}

#[test]
fn a_socket_whose_namespace_cannot_be_opened_is_shut_down_and_says_why() {
    let k = FakeKernel::agent();
    k.with(|w| {
        w.on_agent_socket(|s| s.netns_readable = false);
        w.on_agent(|p| p.netns = 0)
    });
    let out = destroyed(&k);
    assert_eq!(out.method, DestroyMethod::Shutdown);
    assert!(
        out.detail.starts_with(
            "SOCK_DESTROY failed (sock_diag for fd 7 of pid 100: cannot open the network \
             namespace of pid 100: Permission denied"
        ),
        "{}",
        out.detail
    );
    assert!(k.calls_of("sock_destroy").is_empty());
}

#[test]
fn a_caller_without_authority_is_refused_by_the_kernel_with_nothing_changed() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent(|p| p.uid = 0));
    let e = act_on(&k, &arm(), &Plain::new()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("pidfd_getfd fd 7 of pid 100: Operation not permitted"),
        "{e}"
    );
    untouched(&k);
    let e = act_on(&k, &signal(Duration::from_secs(1)), &Plain::new()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("pidfd_send_signal SIGTERM to pid 100: Operation not permitted"),
        "{e}"
    );
    assert!(k.with(|w| w.processes[&PID].alive));
}

#[test]
fn a_signal_to_a_pid_whose_start_time_changed_is_refused() {
    let k = FakeKernel::agent();
    let pinned = k.pin(PID);
    k.with(reuse);
    let e = signal_escalate_on(&k, &pinned, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, ActionError::Reused { .. }), "{e}");
    assert!(k.calls_of("signal").is_empty(), "{:?}", k.calls());
    // Opened from the judgement's start time, the same.
    let e = act_on(&k, &signal(Duration::from_secs(1)), &Plain::new()).unwrap_err();
    assert!(matches!(e, ActionError::Reused { .. }), "{e}");
    assert!(k.calls_of("signal").is_empty(), "{:?}", k.calls());
}

fn signalled(k: &FakeKernel, hand: &Plain, grace: Duration) -> super::signal::SignalOutcome {
    match act_on(k, &signal(grace), hand).unwrap() {
        ActOutcome::Signalled(out) => out,
        other => panic!("{other}"),
    }
}

#[test]
fn a_heeded_sigterm_needs_no_sigkill() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent(|p| p.exits_after_term = Some(Duration::from_millis(300))));
    let out = signalled(&k, &Plain::new(), Duration::from_secs(2));
    assert_eq!(out.sent, [Signal::Term]);
    assert!(out.exited);
    assert_eq!(out.exited_after_ms, Some(300));
}

#[test]
fn an_ignored_sigterm_is_followed_by_sigkill_after_the_grace() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent(|p| p.exits_after_term = None));
    let grace = Duration::from_millis(1500);
    let out = signalled(&k, &Plain::new(), grace);
    assert_eq!(out.sent, [Signal::Term, Signal::Kill]);
    assert!(out.exited);
    // SIGKILL went no earlier than the grace.
    assert_eq!(out.exited_after_ms, Some(1500));
}

#[test]
fn a_process_that_sigkill_cannot_end_is_reported_alive_after_bounded_waits() {
    let k = FakeKernel::agent();
    k.with(|w| {
        w.on_agent(|p| {
            p.exits_after_term = None;
            p.killable = false;
        })
    });
    let grace = Duration::from_secs(1);
    let out = signalled(&k, &Plain::new(), grace);
    assert_eq!(out.sent, [Signal::Term, Signal::Kill]);
    assert!(!out.exited && out.exited_after_ms.is_none());
    assert_eq!(k.world().elapsed, grace + KILL_WAIT);
    assert!(k.calls_of("wait_exit").len() <= 4, "{:?}", k.calls());
}

#[test]
fn a_process_gone_between_the_grace_and_sigkill_is_not_killed() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent(|p| p.exits_after_term = None));
    k.before("signal 100 SIGKILL", |w| {
        w.on_agent(|p| p.alive = false);
    });
    let out = signalled(&k, &Plain::new(), Duration::from_secs(1));
    assert_eq!(out.sent, [Signal::Term]);
    assert!(out.exited);
}

#[test]
fn the_helpers_sigterm_leaves_sigkill_to_its_timer() {
    let k = FakeKernel::agent();
    k.with(|w| w.on_agent(|p| p.exits_after_term = None));
    let hand = Plain {
        signalling: Signalling::TermOnly,
        ..Plain::new()
    };
    let out = signalled(&k, &hand, Duration::from_secs(30));
    assert_eq!(out.sent, [Signal::Term]);
    assert!(out.escalating && !out.exited);
    assert!(k.calls_of("signal 100 SIGKILL").is_empty());
    // It watched for a quick exit no longer than TERM_WATCH.
    assert_eq!(k.world().elapsed, super::signal::TERM_WATCH);
}

#[test]
fn the_guard_refuses_init_this_process_its_ancestors_and_kernel_threads() {
    let k = FakeKernel::agent();
    k.with(|w| {
        let mut kthread = Proc::new(3, 0);
        kthread.flags = 0x0020_0000;
        w.processes.insert(2, kthread);
    });
    for (pid, why) in [
        (0, "not a valid pid"),
        (1, "init"),
        (50, "this process"),
        (40, "an ancestor"),
        (2, "kernel thread"),
    ] {
        let e = guard_on(&k, pid).unwrap_err();
        assert!(
            matches!(&e, ActionError::Forbidden { why: w, .. } if w.contains(why)),
            "{pid}: {e}"
        );
    }
    assert!(guard_on(&k, PID).is_ok());
    assert!(matches!(
        guard_on(&k, 999),
        Err(ActionError::Gone { pid: 999 })
    ));
    assert!(open_target_on(&k, PID, START).is_ok());
}

/// The agent's socket with `probes` keepalive probes unanswered and
/// keepalive on.
fn probing(k: &FakeKernel, probes: u8) {
    k.with(|w| {
        if let Some(s) = w.sockets.get_mut(&INODE) {
            s.opts.insert((libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
            s.opts
                .insert((libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT), 9000);
            if let Some(i) = s.info.as_mut() {
                i.probes = probes;
            }
        }
    });
}

#[test]
fn expiring_a_connection_with_a_probe_out_ends_it() {
    let k = FakeKernel::agent();
    probing(&k, 2);
    let pinned = k.pin(PID);
    let out = expire_keepalive_gated(&k, &pinned, FD, INODE, &open_gate).unwrap();
    assert!(out.ended && out.probes == 2);
    assert_eq!(k.socket(INODE).info.map(|i| i.state), Some(CLOSE));
}

#[test]
fn a_peer_that_answers_mid_expiry_keeps_its_connection_and_its_user_timeout() {
    let k = FakeKernel::agent();
    probing(&k, 1);
    // The peer's ACK lands between the user timeout and the re-arm.
    k.before("setsockopt 42 TCP_KEEPIDLE", |w| {
        let i = w.sockets.get_mut(&INODE).and_then(|s| s.info.as_mut());
        if let Some(i) = i {
            i.probes = 0;
        }
    });
    let pinned = k.pin(PID);
    let out = expire_keepalive_gated(&k, &pinned, FD, INODE, &open_gate).unwrap();
    assert!(!out.ended);
    assert_eq!(
        k.socket(INODE)
            .opt(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
        9000
    );
    // The watch is bounded: 200 ms of 5 ms looks.
    assert!(k.world().elapsed >= Duration::from_millis(200));
    assert!(k.calls_of("sleep").len() <= 41, "{}", k.calls().len());
}

#[test]
fn expiry_with_no_probe_out_is_refused_untouched() {
    let k = FakeKernel::agent();
    probing(&k, 0);
    let pinned = k.pin(PID);
    let e = expire_keepalive_gated(&k, &pinned, FD, INODE, &open_gate).unwrap_err();
    assert!(
        matches!(&e, ActionError::NotApplicable { why, .. } if why.contains("peer answered")),
        "{e}"
    );
    assert!(k.calls_of("setsockopt").is_empty());
}

#[test]
fn a_destroy_through_a_pinned_handle_skips_the_open() {
    let k = FakeKernel::agent();
    let pinned = k.pin(PID);
    destroy_socket_gated(&k, &pinned, FD, Some(INODE), &open_gate).unwrap();
    assert!(k.calls_of("open").is_empty());
    assert_eq!(k.own_pid(), 50);
    assert_eq!(UID, k.world().euid);
}
