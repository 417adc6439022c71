//! The one seam to the system. Every raw system call (each `unsafe` block
//! of this library) and every `/proc` path is here, so a newcomer finds
//! all raw system access in one place, and a unit test (`layers.rs`) fails
//! if either appears anywhere else. This module names nothing else of the
//! crate.
//!
//! - [`procfs`]: the procfs root every `/proc` path is built from, which a
//!   test points at a fixture tree;
//! - [`pidfd`]: process handles that pid reuse cannot fool;
//! - [`netns`] and [`ns`]: entering another network namespace; namespace
//!   fds (parent, owner, a pidfd's user namespace);
//! - [`memread`]: reading another process's memory, abandonably;
//! - [`sockdiag`]: the sock_diag netlink interface (the TCP dump with
//!   `tcp_info`, `SOCK_DESTROY`);
//! - [`socket`]: socket options (ints, `SO_COOKIE`, `tcp_info`, the
//!   receive timeout, a socket's namespace, `SO_PEERPIDFD`);
//! - [`bpf`]: the `bpf(2)` commands aya lacks (an iterator linked to one
//!   process, a pinned program, a program's info);
//! - [`fs`]: directory-relative file calls, for `SafeDir`;
//! - [`poll`], [`signal`], [`activation`]: `poll(2)`, killing a process
//!   group and catching SIGINT/SIGTERM as a flag, systemd socket
//!   activation;
//! - [`clock`] and [`creds`]: the clock ages are measured with; this
//!   process's effective uid;
//! - [`system`]: what the acts ask of the kernel, as one trait, `System`,
//!   with `Kernel` the real one over the modules above; in tests, `fake`
//!   is a kernel made of plain data that records every call.

pub mod activation;
pub mod bpf;
pub mod clock;
pub mod creds;
#[cfg(test)]
pub mod fake;
pub mod fs;
pub mod memread;
pub mod netns;
pub mod ns;
pub mod pidfd;
pub mod poll;
pub mod procfs;
pub mod signal;
pub mod sockdiag;
pub mod socket;
pub mod system;

/// A libc call's `0` as `Ok`, anything else as the error in `errno`.
fn check(r: libc::c_int) -> std::io::Result<()> {
    if r != 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
