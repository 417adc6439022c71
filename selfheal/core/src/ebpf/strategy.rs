//! Attach strategies as data: which programs each one loads and where it
//! hooks them, in the order they are tried.

use serde::Serialize;

/// One way of attaching the receive tracer to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// kprobe/kretprobe on `tcp_recvmsg` and `tcp_sendmsg`.
    Kprobe,
    /// fentry/fexit on `tcp_recvmsg`, fexit on `tcp_sendmsg`.
    Fentry,
    /// `tp_btf` on `sock_recv_length`/`sock_send_length`, and on
    /// `sched_switch` to see receives that sleep.
    TpBtf,
    /// Classic `sock:sock_{recv,send}_length` tracepoints, plus the receive
    /// syscalls' enter/exit tracepoints.
    Tracepoint,
}

/// Where one program is attached.
#[derive(Clone, Copy, Debug)]
pub enum Hook {
    Kprobe(&'static str),
    Kretprobe(&'static str),
    Fentry(&'static str),
    Fexit(&'static str),
    TpBtf(&'static str),
    Tracepoint(&'static str, &'static str),
}

/// A program of the eBPF object and its hook.
#[derive(Clone, Copy, Debug)]
pub struct ProgramSpec {
    /// The program's name in the object (its Rust function name).
    pub program: &'static str,
    pub hook: Hook,
}

const fn p(program: &'static str, hook: Hook) -> ProgramSpec {
    ProgramSpec { program, hook }
}

/// A program on the `syscalls` tracepoint of its own name.
const fn syscall(tracepoint: &'static str) -> ProgramSpec {
    p(tracepoint, Hook::Tracepoint("syscalls", tracepoint))
}

/// Receive entry/exit by syscall, for the classic-tracepoint strategy. Costly:
/// any enabled syscall tracepoint sends every syscall of every process down
/// the kernel's slow path.
const SYSCALL_HOOKS: [ProgramSpec; 8] = [
    syscall("sys_enter_recvfrom"),
    syscall("sys_enter_recvmsg"),
    syscall("sys_enter_read"),
    syscall("sys_enter_readv"),
    syscall("sys_exit_recvfrom"),
    syscall("sys_exit_recvmsg"),
    syscall("sys_exit_read"),
    syscall("sys_exit_readv"),
];

const KPROBE: [ProgramSpec; 4] = [
    p("kprobe_tcp_recvmsg", Hook::Kprobe("tcp_recvmsg")),
    p("kretprobe_tcp_recvmsg", Hook::Kretprobe("tcp_recvmsg")),
    p("kprobe_tcp_sendmsg", Hook::Kprobe("tcp_sendmsg")),
    p("kretprobe_tcp_sendmsg", Hook::Kretprobe("tcp_sendmsg")),
];

const FENTRY: [ProgramSpec; 3] = [
    p("fentry_tcp_recvmsg", Hook::Fentry("tcp_recvmsg")),
    p("fexit_tcp_recvmsg", Hook::Fexit("tcp_recvmsg")),
    p("fexit_tcp_sendmsg", Hook::Fexit("tcp_sendmsg")),
];

const TP_BTF: [ProgramSpec; 3] = [
    p("tp_btf_sock_recv_length", Hook::TpBtf("sock_recv_length")),
    p("tp_btf_sock_send_length", Hook::TpBtf("sock_send_length")),
    p("tp_btf_sched_switch", Hook::TpBtf("sched_switch")),
];

const TRACEPOINT: [ProgramSpec; 2] = [
    p(
        "tp_sock_recv_length",
        Hook::Tracepoint("sock", "sock_recv_length"),
    ),
    p(
        "tp_sock_send_length",
        Hook::Tracepoint("sock", "sock_send_length"),
    ),
];

impl Strategy {
    /// All strategies, in the order they are tried: cheapest and most
    /// precise first.
    pub const ALL: [Strategy; 4] = [Self::Kprobe, Self::Fentry, Self::TpBtf, Self::Tracepoint];

    /// The name used in output, config and `--ebpf-strategy`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kprobe => "kprobe",
            Self::Fentry => "fentry",
            Self::TpBtf => "tp_btf",
            Self::Tracepoint => "tracepoint",
        }
    }

    /// Parses a name as printed by [`Strategy::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The programs this strategy loads, in attach order.
    pub fn programs(self) -> Vec<ProgramSpec> {
        match self {
            Self::Kprobe => KPROBE.to_vec(),
            Self::Fentry => FENTRY.to_vec(),
            Self::TpBtf => TP_BTF.to_vec(),
            Self::Tracepoint => [&TRACEPOINT[..], &SYSCALL_HOOKS[..]].concat(),
        }
    }

    /// Whether a receive's entry hook sees the socket itself (and so its
    /// inode), rather than only the file descriptor.
    pub fn entry_sees_socket(self) -> bool {
        matches!(self, Self::Kprobe | Self::Fentry)
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(Strategy::from_name(s.name()), Some(s));
        }
        assert_eq!(Strategy::from_name("uprobe"), None);
    }

    #[test]
    fn every_strategy_has_a_receive_exit_and_a_send_hook() {
        for s in Strategy::ALL {
            let progs = s.programs();
            assert!(progs.iter().any(|p| p.program.contains("recv")), "{s}");
            assert!(progs.iter().any(|p| p.program.contains("send")), "{s}");
        }
    }
}
