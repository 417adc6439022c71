//! Who may do what through the helper, as pure rules: the policy (who may
//! reach whose processes, [`policy`]), the kernel's own authority (what a
//! caller could do itself, [`authority`]) and whom a caller's use counts
//! against ([`owner`]). They decide and do no I/O; the helper reads what
//! they need (`selfheal::helper::access`).
//!
//! # Which check guards which act
//!
//! For a caller other than root (root passes every check but the
//! first two of an act):
//!
//! | request | checks, in order |
//! | --- | --- |
//! | every request | the caller pinned at accept is still the connected process; its limits are counted against its owner ([`owner::account`]; connections by [`owner::admit`]) |
//! | `watch`, `ebpf_snapshot`, `iterate`, `collect`, `namespaces` | the caller is in the helper's pid namespace; each pid is reachable ([`policy::Policy::may_reach`] on every uid, before and after pinning it by pidfd), may be queried ([`policy::Policy::check_query`]) and read as the kernel would let the caller read it ([`authority::ptrace_refusal`]); what was read is answered only if the process is still the one authorized ([`authority::reread_refusal`]) |
//! | `act`: any | the pid is never one acted on ([`policy::never_acted_on`]: pid 1, the helper, kernel threads) and reachable ([`policy::Policy::check_act`]); the kernel would let the caller ptrace it ([`authority::ptrace_refusal`], for the [`authority::principal`] it acts for) |
//! | `act` on a socket (proof, keepalive, destroy, expire) | the fd names a socket before it is duplicated; after `pidfd_getfd`, the ptrace rule again and the socket's state on the duplicate ([`authority::socket_refusal`]: a connection in the state the act is for, never a listener) |
//! | `act`: a signal | the ptrace rule again right before the signal; a SIGKILL escalation re-reads the target's identity and checks it all again when its grace is up, within its owner's share of the table ([`owner::escalation_room`]) |
//! | `restore_keepalive`, `expire_keepalive` | only a proof the helper armed itself, by socket cookie: the options it read before arming are put back, never a caller's |

pub mod authority;
pub mod owner;
pub mod policy;
