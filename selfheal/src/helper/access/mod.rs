//! Who may do what through the helper, as read from the system: the policy
//! file and a target's uids ([`policy`]), a target's credentials and a
//! socket's state on its duplicate ([`authority`]: no more than the kernel
//! would let the caller do itself), whom a caller counts against
//! ([`owner`]), and the caller and every pid and fd a request names, pinned
//! and checked right before use (`authz`). The rules that decide are the
//! core's (`selfheal_core::access`).
//!
//! # Which check guards which act
//!
//! | request | where it is checked |
//! | --- | --- |
//! | every request | `authz::Connector::verify`: the process pinned at accept still runs, with the same pid and start time; [`owner::ConnSet::admit`] at accept |
//! | the queries (`watch`, `ebpf_snapshot`, `iterate`, `collect`, `namespaces`) | `authz`'s `authorize_query_pinned`: the pid namespace, the policy's reach before and after the pidfd, [`authority::Authority::check_seen`]; `Pinned::still_readable` before anything read is answered |
//! | `act` | the policy's `check_act` on the pinned target, then [`authority::Authority::check`] |
//! | `act` on a socket | `authz::check_socket_fd` before `pidfd_getfd`, then [`authority::Authority::check_socket`] on the duplicate |
//! | `act`: a signal | [`authority::Authority::recheck`] right before it; the SIGKILL escalation: `authz::identity` compared with the one at SIGTERM, then `check_act` and [`authority::Authority::check`] again |
//! | `restore_keepalive`, `expire_keepalive` | the server's `ProofBook`: only a proof the helper armed, by socket cookie |

pub mod authority;
pub(in crate::helper) mod authz;
pub mod owner;
pub mod policy;
