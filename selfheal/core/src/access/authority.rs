//! The helper's authority, as pure rules: what the kernel would demand of a
//! caller acting on a process itself, and which socket states an act is
//! for. The helper (`selfheal::helper::access::authority`) reads the credentials
//! and the socket; these functions decide, and do no I/O.
//!
//! # The rule
//!
//! Root may do everything. Any other caller may act on a process only
//! where the kernel would let that caller `ptrace` it
//! (`PTRACE_MODE_ATTACH_REALCREDS`, the check `pidfd_getfd` makes):
//!
//! - the process's real, effective and saved uids are all the caller's (or
//!   all one uid the helper's policy grants it), and so are its real,
//!   effective and saved gids (the caller's gid; under a grant, one gid
//!   throughout) — a setuid or setgid transition fails this;
//! - it is dumpable: the kernel makes a non-dumpable process's
//!   `/proc/PID/status` root's (or its user namespace's root's), so that
//!   file's owner must be the uid acted for;
//! - it holds no capability the caller lacks: in the caller's user
//!   namespace its permitted set is a subset of the caller's (under a
//!   grant, the granted uid's processes' capabilities are what the policy
//!   lends); in another one, that namespace must be one the caller owns
//!   (below the caller's).
//!
//! The kernel's relationship policy (Yama's `ptrace_scope`: descendants
//! only) is not applied: it restricts *who may trace whom among equals*,
//! and bridging that for a user's own processes is what the helper is for.
//!
//! # A read, checked again after it
//!
//! Exec keeps a process's pid and start time, so what the helper reads for
//! a caller is held to the process it authorized by [`reread_refusal`]:
//! its credentials, dumpable flag, capabilities, executable and address
//! space seen before the read must be what they are after it, and neither
//! side may be in the middle of an exec. An exec back to the same program
//! with the same credentials inside one read shows only in the address
//! space's layout, which the kernel randomizes where address randomization
//! is on.
//!
//! # Sockets
//!
//! For a caller other than root, a socket act needs a connection in the
//! state the act is for: `ESTAB` for a proof, `ESTAB` or `CLOSE-WAIT` (a
//! peer that sent its FIN) for the dead-peer rungs. A listener is never
//! one: options set on it are inherited by every connection it accepts,
//! and destroying it ends a service, not a wedged call.

use crate::{model::TcpState, protocol::Action};

/// Who a process is, as `/proc/PID/status` and the file's owner say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskCreds {
    /// Real, effective and saved uid.
    pub uids: [u32; 3],
    /// Real, effective and saved gid.
    pub gids: [u32; 3],
    /// The permitted capability set (`CapPrm`).
    pub cap_permitted: u64,
    /// The owner of `/proc/PID/status`: the effective uid when the process
    /// is dumpable, root (of its user namespace) when not.
    pub dump_owner: u32,
}

/// The caller, as the helper knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerCreds {
    pub uid: u32,
    pub gid: u32,
    /// Its permitted capability set; empty when it could not be read.
    pub cap_permitted: u64,
}

/// Where the target's user namespace is, seen from the caller's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserNs {
    /// The caller's own.
    Same,
    /// Below the caller's, in a namespace the caller owns (a rootless
    /// container of its own): the caller holds every capability there.
    OwnedByCaller,
    /// Anywhere else, or unknown.
    Other,
}

/// The uid whose authority `caller` acts with on a process of `target`'s
/// uids: its own, or (when the policy grants it) the target's.
pub fn principal(caller_uid: u32, target: &TaskCreds) -> u32 {
    if target.uids.contains(&caller_uid) {
        caller_uid
    } else {
        target.uids[0]
    }
}

/// Why the kernel would not let `caller`, acting as `principal` (its own
/// uid, or one the policy grants it), ptrace a process of `target`'s
/// credentials in user namespace `ns`; `None` when it would. Root may
/// always. Whether the caller may reach the target's uids at all is the
/// policy's to say first ([`crate::access::policy`]). The reason names
/// only what the caller may read itself.
pub fn ptrace_refusal(
    caller: &CallerCreds,
    principal: u32,
    target: &TaskCreds,
    ns: UserNs,
) -> Option<String> {
    if caller.uid == 0 {
        return None;
    }
    if target.uids.iter().any(|u| *u != principal) {
        let [r, e, s] = target.uids;
        return Some(format!(
            "its uids (real {r}, effective {e}, saved {s}) are not all uid {principal}'s"
        ));
    }
    let gid_ok = if principal == caller.uid {
        target.gids.iter().all(|g| *g == caller.gid)
    } else {
        target.gids.iter().all(|g| *g == target.gids[0])
    };
    if !gid_ok {
        let [r, e, s] = target.gids;
        return Some(format!(
            "its gids (real {r}, effective {e}, saved {s}) are not all gid {}",
            if principal == caller.uid {
                caller.gid
            } else {
                target.gids[0]
            }
        ));
    }
    if target.dump_owner != principal {
        return Some("it is not dumpable (its /proc files are root's)".into());
    }
    // A grant lends the granted uid's standing, which its processes'
    // capabilities are part of: only the caller's own are compared.
    let own = principal == caller.uid;
    match ns {
        UserNs::Same if own && target.cap_permitted & !caller.cap_permitted != 0 => Some(format!(
            "it holds capabilities the caller lacks (permitted {:#x}, the caller's {:#x})",
            target.cap_permitted, caller.cap_permitted
        )),
        UserNs::Same | UserNs::OwnedByCaller => None,
        UserNs::Other => Some("it is in a user namespace the caller does not own".into()),
    }
}

/// Where a process's address space lies, from `/proc/PID/stat`: the
/// kernel makes a new one on every exec (at randomized addresses, where
/// address randomization is on), and fills these in only once the new
/// program is loaded — all zero in the middle of an exec, or with no
/// address space at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `startcode`, `endcode`, `startstack`, `start_data`, `end_data`,
    /// `start_brk`, `arg_start`, `arg_end`, `env_start`, `env_end`.
    pub fields: [u64; 10],
}

/// The fields of `/proc/PID/stat` (1-based) that make a [`Layout`].
const LAYOUT_FIELDS: [usize; 10] = [26, 27, 28, 45, 46, 47, 48, 49, 50, 51];

/// The [`Layout`] in a `/proc/PID/stat` line; `None` when it is too short
/// or a field is bad.
pub fn parse_layout(stat: &str) -> Option<Layout> {
    // Field 3 on, after the command name (which may hold ") ").
    let (_, rest) = stat.rsplit_once(") ")?;
    let rest: Vec<&str> = rest.split_whitespace().collect();
    let mut fields = [0u64; 10];
    for (f, n) in fields.iter_mut().zip(LAYOUT_FIELDS) {
        *f = rest.get(n - 3)?.parse().ok()?;
    }
    Some(Layout { fields })
}

/// What the helper sees of a process, before a read it answers for a
/// caller and again after it: who it is, which program it runs (the
/// executable's device and inode) and its address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub creds: TaskCreds,
    pub exe: Option<(u64, u64)>,
    pub layout: Option<Layout>,
}

/// Why a read made between `before` and `after` may not be answered: the
/// process changed (credentials, dumpable, capabilities, executable, or
/// address space: an exec, of a setuid program or any other), or either
/// side cannot tell (no executable, no address space, an exec under way).
/// `None` when it is the same process running the same program.
pub fn reread_refusal(before: &Seen, after: &Seen) -> Option<String> {
    for (side, s) in [("before", before), ("after", after)] {
        if s.exe.is_none() {
            return Some(format!(
                "its executable could not be identified {side} the read"
            ));
        }
        match s.layout {
            None => {
                return Some(format!(
                    "its address space could not be read {side} the read"
                ));
            }
            Some(l) if l.fields[6] == 0 => {
                return Some(format!("an exec was under way {side} the read"));
            }
            Some(_) => {}
        }
    }
    let (b, a) = (&before.creds, &after.creds);
    if b.uids != a.uids || b.gids != a.gids {
        return Some("its credentials changed during the read".into());
    }
    if b.dump_owner != a.dump_owner {
        return Some("its dumpable flag changed during the read".into());
    }
    if b.cap_permitted != a.cap_permitted {
        return Some("its capabilities changed during the read".into());
    }
    if before.exe != after.exe {
        return Some("it runs another program than before the read".into());
    }
    if before.layout != after.layout {
        return Some("it exec'd during the read (a new address space)".into());
    }
    None
}

/// The states a non-root caller's `action` is for, or `None` when the
/// action is not a socket act.
pub fn states_for(action: Action) -> Option<&'static [TcpState]> {
    match action {
        Action::ProveKeepalive => Some(&[TcpState::Established]),
        // A connect past its `connect_timeout` is ended while still an
        // attempt (SYN sent): the caller's own, and never a listener.
        Action::DestroySocket => Some(&[
            TcpState::Established,
            TcpState::CloseWait,
            TcpState::SynSent,
        ]),
        Action::ArmKeepalive | Action::ExpireKeepalive | Action::RestoreKeepalive => {
            Some(&[TcpState::Established, TcpState::CloseWait])
        }
        Action::Signal | Action::Restart => None,
    }
}

/// Why a non-root caller's `action` may not touch a socket in `state`
/// (the kernel's `tcpi_state`), if it may not.
pub fn socket_refusal(action: Action, state: u8) -> Option<String> {
    let allowed = states_for(action)?;
    let state = TcpState::from_kernel(state);
    if allowed.contains(&state) {
        return None;
    }
    let names: Vec<&str> = allowed.iter().map(|s| s.as_str()).collect();
    Some(if state == TcpState::Listen {
        format!(
            "it is a listening socket: {action} is only for a connection ({})",
            names.join(" or ")
        )
    } else {
        format!(
            "the connection is {state}: {action} is only for one in {}",
            names.join(" or ")
        )
    })
}

/// The fields of `/proc/PID/status` the rule reads: `Uid:`, `Gid:` (real,
/// effective, saved) and `CapPrm:`. `None` when one is missing or bad.
pub fn parse_status(text: &str) -> Option<([u32; 3], [u32; 3], u64)> {
    let ids = |v: &str| -> Option<[u32; 3]> {
        let mut it = v.split_whitespace().map(|x| x.parse::<u32>().ok());
        Some([it.next()??, it.next()??, it.next()??])
    };
    let (mut uids, mut gids, mut caps) = (None, None, None);
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("Uid:") {
            uids = ids(v);
        } else if let Some(v) = line.strip_prefix("Gid:") {
            gids = ids(v);
        } else if let Some(v) = line.strip_prefix("CapPrm:") {
            caps = u64::from_str_radix(v.trim(), 16).ok();
        }
    }
    Some((uids?, gids?, caps?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: CallerCreds = CallerCreds {
        uid: 1000,
        gid: 1000,
        cap_permitted: 0,
    };

    fn task(uid: u32, gid: u32) -> TaskCreds {
        TaskCreds {
            uids: [uid; 3],
            gids: [gid; 3],
            cap_permitted: 0,
            dump_owner: uid,
        }
    }

    #[test]
    fn the_kernels_ptrace_rule() {
        let check = |caller: &CallerCreds, t: TaskCreds, ns: UserNs| {
            ptrace_refusal(caller, principal(caller.uid, &t), &t, ns)
        };
        // Its own dumpable process: allowed.
        assert_eq!(check(&USER, task(1000, 1000), UserNs::Same), None);
        // Root: everything.
        let root = CallerCreds {
            uid: 0,
            gid: 0,
            cap_permitted: !0,
        };
        let worker = TaskCreds {
            dump_owner: 0,
            ..task(65534, 65534)
        };
        assert_eq!(check(&root, worker, UserNs::Other), None);
        let cases: [(&str, TaskCreds, UserNs, &str); 6] = [
            (
                "a setuid transition",
                TaskCreds {
                    uids: [1000, 0, 0],
                    ..task(1000, 1000)
                },
                UserNs::Same,
                "are not all uid 1000's",
            ),
            (
                "a setgid transition",
                TaskCreds {
                    gids: [1000, 5, 5],
                    ..task(1000, 1000)
                },
                UserNs::Same,
                "gids (real 1000, effective 5, saved 5)",
            ),
            (
                "another primary gid",
                task(1000, 27),
                UserNs::Same,
                "are not all gid 1000",
            ),
            (
                "not dumpable (the nginx worker)",
                TaskCreds {
                    dump_owner: 0,
                    ..task(1000, 1000)
                },
                UserNs::Same,
                "not dumpable",
            ),
            (
                "capabilities the caller lacks",
                TaskCreds {
                    cap_permitted: 1 << 10,
                    ..task(1000, 1000)
                },
                UserNs::Same,
                "capabilities the caller lacks (permitted 0x400, the caller's 0x0)",
            ),
            (
                "a user namespace it does not own",
                task(1000, 1000),
                UserNs::Other,
                "does not own",
            ),
        ];
        for (what, t, ns, needle) in cases {
            let r = check(&USER, t, ns).unwrap_or_else(|| panic!("{what}: allowed"));
            assert!(r.contains(needle), "{what}: {r}");
        }
        // Capabilities the caller holds too; any in a namespace it owns.
        let capable = CallerCreds {
            cap_permitted: 1 << 10,
            ..USER
        };
        let t = TaskCreds {
            cap_permitted: 1 << 10,
            ..task(1000, 1000)
        };
        assert_eq!(check(&capable, t, UserNs::Same), None);
        let t = TaskCreds {
            cap_permitted: !0 >> 23,
            ..task(1000, 1000)
        };
        assert_eq!(check(&USER, t, UserNs::OwnedByCaller), None);
        // A granted uid: its own consistent gid, dumpable.
        let t = task(1001, 1001);
        assert_eq!(ptrace_refusal(&USER, 1001, &t, UserNs::Same), None);
        let t = TaskCreds {
            dump_owner: 0,
            ..task(1001, 1001)
        };
        assert!(ptrace_refusal(&USER, 1001, &t, UserNs::Same).is_some());
        // A grant of root's processes: their capabilities come with it.
        let t = TaskCreds {
            cap_permitted: !0 >> 23,
            ..task(0, 0)
        };
        assert_eq!(ptrace_refusal(&USER, 0, &t, UserNs::Same), None);
    }

    /// A `/proc/PID/stat` line of `comm` whose layout fields are `base`,
    /// `base + 1`, … (all 0 for a `base` of 0; the other fields 0).
    fn stat_line(comm: &str, base: u64) -> String {
        let mut f: Vec<String> = (3..=52).map(|_| "0".to_string()).collect();
        for (i, n) in LAYOUT_FIELDS.iter().enumerate() {
            let v = if base == 0 { 0 } else { base + i as u64 };
            f[n - 3] = v.to_string();
        }
        format!("4242 ({comm}) {}", f.join(" "))
    }

    #[test]
    fn the_layout_is_parsed_from_stat() {
        let l = parse_layout(&stat_line("a) b", 100)).unwrap();
        assert_eq!(l.fields[0], 100);
        assert_eq!(l.fields[6], 106);
        assert_eq!(l.fields[9], 109);
        // Short (an old kernel's) or bad: none.
        assert_eq!(parse_layout("4242 (x) S 1 2 3"), None);
        let bad = stat_line("x", 100).replace(" 106 ", " y ");
        assert_eq!(parse_layout(&bad), None);
        assert_eq!(parse_layout("no parenthesis"), None);
    }

    #[test]
    fn a_read_across_a_change_is_refused() {
        let seen = |creds: TaskCreds, exe: u64, base: u64| Seen {
            creds,
            exe: Some((8, exe)),
            layout: parse_layout(&stat_line("p", base)),
        };
        let before = seen(task(1000, 1000), 77, 0x5000);
        assert_eq!(reread_refusal(&before, &before), None);
        let cases: [(&str, Seen, &str); 9] = [
            (
                "exec of a setuid-root program",
                seen(
                    TaskCreds {
                        uids: [1000, 0, 0],
                        dump_owner: 0,
                        ..task(1000, 1000)
                    },
                    78,
                    0x9000,
                ),
                "credentials changed",
            ),
            (
                "a setgid exec",
                seen(
                    TaskCreds {
                        gids: [1000, 5, 5],
                        ..task(1000, 1000)
                    },
                    77,
                    0x5000,
                ),
                "credentials changed",
            ),
            (
                "made non-dumpable",
                seen(
                    TaskCreds {
                        dump_owner: 0,
                        ..task(1000, 1000)
                    },
                    77,
                    0x5000,
                ),
                "dumpable",
            ),
            (
                "file capabilities",
                seen(
                    TaskCreds {
                        cap_permitted: 1 << 12,
                        ..task(1000, 1000)
                    },
                    77,
                    0x5000,
                ),
                "capabilities changed",
            ),
            (
                "another program, same credentials",
                seen(task(1000, 1000), 78, 0x5000),
                "another program",
            ),
            (
                "an exec of the same program",
                seen(task(1000, 1000), 77, 0x7000),
                "new address space",
            ),
            (
                "an exec under way",
                seen(task(1000, 1000), 77, 0),
                "exec was under way after",
            ),
            (
                "no executable",
                Seen {
                    exe: None,
                    ..before
                },
                "executable could not be identified after",
            ),
            (
                "no address space",
                Seen {
                    layout: None,
                    ..before
                },
                "address space could not be read after",
            ),
        ];
        for (what, after, needle) in cases {
            let r = reread_refusal(&before, &after).unwrap_or_else(|| panic!("{what}: answered"));
            assert!(r.contains(needle), "{what}: {r}");
        }
        // Seen mid-exec before the read: refused, whatever after says.
        let mid = seen(task(1000, 1000), 78, 0);
        let r = reread_refusal(&mid, &seen(task(1000, 1000), 78, 0x5000)).unwrap();
        assert!(r.contains("under way before"), "{r}");
    }

    #[test]
    fn socket_states_by_action() {
        const ESTAB: u8 = 1;
        const CLOSE_WAIT: u8 = 8;
        const LISTEN: u8 = 10;
        const SYN_SENT: u8 = 2;
        assert_eq!(socket_refusal(Action::ProveKeepalive, ESTAB), None);
        assert_eq!(socket_refusal(Action::DestroySocket, CLOSE_WAIT), None);
        assert_eq!(socket_refusal(Action::ExpireKeepalive, CLOSE_WAIT), None);
        assert_eq!(socket_refusal(Action::Signal, LISTEN), None);
        let e = socket_refusal(Action::DestroySocket, LISTEN).unwrap();
        assert_eq!(
            e,
            "it is a listening socket: destroy_socket is only for a connection (ESTAB or CLOSE-WAIT or SYN-SENT)"
        );
        assert_eq!(socket_refusal(Action::DestroySocket, SYN_SENT), None);
        let e = socket_refusal(Action::ProveKeepalive, CLOSE_WAIT).unwrap();
        assert_eq!(
            e,
            "the connection is CLOSE-WAIT: prove_keepalive is only for one in ESTAB"
        );
        assert!(socket_refusal(Action::ArmKeepalive, SYN_SENT).is_some());
        assert!(socket_refusal(Action::RestoreKeepalive, 200).is_some());
    }

    #[test]
    fn status_is_parsed() {
        let text = "Name:\tsleep\nUid:\t1000\t1000\t0\t1000\nGid:\t100\t100\t100\t100\n\
                    CapInh:\t0000000000000000\nCapPrm:\t0000000000000400\n";
        assert_eq!(parse_status(text), Some(([1000, 1000, 0], [100; 3], 0x400)));
        assert_eq!(parse_status("Uid:\t1\t1\t1\t1\nGid:\t1\t1\t1\t1\n"), None);
        assert_eq!(
            parse_status("Uid:\t1\t1\nGid:\t1\t1\t1\t1\nCapPrm:\t0\n"),
            None
        );
        assert_eq!(
            parse_status("Uid:\tx\t1\t1\nGid:\t1\t1\t1\nCapPrm:\t0\n"),
            None
        );
        assert_eq!(parse_status(""), None);
    }
}
