//! `selfheal helper`: the privileged long-running process. Owns the command
//! line (flags, the root check, socket activation, signals, the exit code);
//! everything else is `selfheal::helper`.

use std::{path::PathBuf, sync::Arc, time::Duration};

use super::{Error, Finished};
use anyhow::Context as _;
use nix::sys::signal::{SigSet, Signal};
use selfheal::{
    ebpf::TracerOptions,
    helper::{
        DEFAULT_SOCKET, Listen, Performer, SOCKET_MODE, ServerOptions, StopReason, access::policy,
        serve, server::listen::take_activated_listener,
    },
};

/// Run the privileged helper that reads and heals for authorized callers.
///
/// It pins the kernel's task iterators (in /sys/fs/bpf/selfheal where the
/// system mounts a bpffs, else in its own at /run/selfheal/bpf; they stay
/// pinned after it exits; pins of this build already there are used as
/// they are) for root's checks and runs them for others', answers queries
/// and performs healing actions for the callers its policy authorizes
/// (each request by the caller's uid), on a unix socket speaking JSON
/// lines (protocol version 1). It attaches no hook that runs while nobody
/// asks, unless started with --tracer. Socket-activated by systemd
/// (LISTEN_FDS), it exits after --idle-timeout without connections;
/// otherwise it runs until SIGTERM or SIGINT.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The unix socket to listen on (created mode 0666: every request is
    /// authorized by the caller's uid). Needed to run as a user other than
    /// root. [default: /run/selfheal/helper.sock]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The policy file granting uids other uids' processes. It must be
    /// owned by root and writable by nobody else. [default:
    /// /etc/selfheal/helper.toml, when it exists]
    #[arg(long, value_name = "PATH")]
    policy: Option<PathBuf>,
    /// The subordinate uid file: a caller whose uid lies in a range counts
    /// against the range's owner in every limit (connections, request
    /// rate, acts, pending SIGKILLs, watched pids). Read again when it
    /// changes; missing means no ranges. [default: /etc/subuid]
    #[arg(long, value_name = "PATH")]
    subuid: Option<PathBuf>,
    /// When socket-activated, exit after this long without a connection
    /// (e.g. 60s, 5m).
    #[arg(long, value_name = "DUR", value_parser = super::parse_duration, default_value = "60s")]
    idle_timeout: Duration,
    /// Load no eBPF at all: no task iterators (root's checks read threads
    /// and sockets from procfs, others' `iterate` and `collect` do too) and
    /// no tracer.
    #[arg(long)]
    no_ebpf: bool,
    /// Keep the eBPF receive tracer attached, for `watch` and
    /// `ebpf_snapshot`. It sees what a check cannot read from a task: when
    /// a receive began across spurious wake-ups, and each socket's
    /// receives and sends by the process (counts, empty receives, the last
    /// read and write). Its hooks run on every context switch and socket
    /// read and write of the host, watched or not: recv-bench measures that
    /// tax. Without it, checks time a receive from when its thread last ran.
    #[arg(long, conflicts_with = "no_ebpf")]
    tracer: bool,
    /// Pin the task iterators, as the helper does at start, and exit (root
    /// only). The packaged unit runs this before the helper, outside its
    /// sandbox (`ExecStartPre=-+`), where the sandbox keeps the bpffs
    /// read-only.
    #[arg(long, conflicts_with = "no_ebpf")]
    pin_iterators: bool,
}

pub fn run(args: Args, executor: Arc<dyn Performer>) -> Result<Finished, Error> {
    let euid = selfheal::sys::creds::euid();
    if args.pin_iterators {
        if euid != 0 {
            return Err(anyhow::anyhow!("--pin-iterators needs root (euid {euid})").into());
        }
        let dir = selfheal::ebpf::iter::publish().map_err(|e| {
            anyhow::anyhow!(
                "cannot pin the task iterators: {}",
                selfheal::ebpf::chain(&e)
            )
        })?;
        tracing::info!("helper: task iterators pinned in {}", dir.display());
        return Ok(Finished::Done);
    }
    // The first thing serving does, before it starts any thread; main
    // starts none (the log subscriber runs on the caller's).
    let activated = take_activated_listener()?;
    if euid != 0 && args.socket.is_none() && activated.is_none() {
        return Err(Error::HelperNotRoot {
            euid,
            socket: DEFAULT_SOCKET,
        });
    }
    let policy = policy::load(args.policy.as_deref(), euid)?;
    let policy_line = policy.describe();
    let (listen, idle, where_) = match activated {
        Some(fd) => (
            Listen::Fd(fd),
            Some(args.idle_timeout),
            "the socket systemd passed (fd 3)".to_string(),
        ),
        None => {
            let path = args.socket.unwrap_or_else(|| DEFAULT_SOCKET.into());
            let where_ = format!("{} (mode {SOCKET_MODE:04o})", path.display());
            (Listen::Path(path), None, where_)
        }
    };
    let mut opts = ServerOptions::new(listen);
    opts.policy = policy;
    opts.idle_timeout = idle;
    if let Some(p) = args.subuid {
        opts.subuid = p;
    }
    opts.iterators = !args.no_ebpf;
    opts.ebpf = args.tracer.then(TracerOptions::default);

    // SIGTERM and SIGINT are taken by one thread with sigwait; blocked here,
    // before any thread starts, so that every thread inherits the mask.
    // (Children get an empty mask: std resets it before exec.)
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .context("cannot block SIGTERM and SIGINT")?;

    let handle = serve(opts, executor)?;
    match &handle.ebpf().strategy {
        Some(s) => tracing::info!("helper: eBPF tracer attached ({s})"),
        None if !args.tracer => tracing::info!(
            "helper: no eBPF tracer: {}",
            handle.ebpf().error.as_deref().unwrap_or("not asked for")
        ),
        None => tracing::warn!(
            "helper: no eBPF tracer: {}",
            handle.ebpf().error.as_deref().unwrap_or("unknown reason")
        ),
    }
    // Root's checks link the pinned task iterators, others' get their
    // passes from the helper, instead of reading each thread from procfs;
    // without them they read procfs (and say so).
    match (handle.iterators(), handle.has_iterators()) {
        (Ok(dir), _) => tracing::info!("helper: task iterators pinned in {}", dir.display()),
        (Err(e), true) => tracing::warn!(
            "helper: task iterators not pinned: {e}; root's checks in other processes read \
             threads from procfs (`watch` loads its own)"
        ),
        (Err(e), false) => tracing::warn!(
            "helper: task iterators not pinned: {e}; checks read threads from procfs"
        ),
    }
    tracing::info!(
        "helper: listening on {where_}; policy: {policy_line}; idle timeout: {}",
        idle.map_or("none".to_string(), |d| humantime::format_duration(d)
            .to_string())
    );

    let stopper = handle.stopper();
    std::thread::Builder::new()
        .name("selfheal-signals".into())
        .spawn(move || {
            if let Ok(sig) = signals.wait() {
                tracing::info!("helper: {sig}: stopping (finishing requests in flight)");
                stopper.stop();
            }
        })
        .context("cannot start the signal thread")?;

    match handle.join()? {
        StopReason::Shutdown => tracing::info!("helper: stopped"),
        StopReason::Idle => tracing::info!(
            "helper: no connection for {}; exiting (systemd starts it again on the next one)",
            humantime::format_duration(args.idle_timeout)
        ),
    }
    Ok(Finished::Done)
}
