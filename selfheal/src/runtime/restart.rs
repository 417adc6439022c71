//! The runtime restart rung (`restart = { runtime = true }`): the agent's
//! container restarted through its runtime.
//!
//! - Docker and Podman: `POST /containers/{id}/restart` (stop with the
//!   grace, then start), the API's own restart. It shows as a new
//!   `State.StartedAt` and pid; `RestartCount` stays as it was (both count
//!   only their restart policy's restarts there).
//! - containerd (a Kubernetes pod's container, or a `ctr` task): the task's
//!   init process (its `init.pid` in the state directory) gets SIGTERM,
//!   then SIGKILL after the grace, so that its controller (the kubelet, on
//!   a node) starts a new one. Without a Kubernetes API server here nothing
//!   deletes or evicts the pod; where one is, deleting the pod through it
//!   is the alternative (docs/capabilities.md).
//!
//! Right before acting, it checks again that the container still holds the
//! agent's process, the same way the check decided it
//! ([`crate::agents::ProcessTable`]): the process (by pidfd, against the
//! start time the check saw) is in the container's anchored cgroup **and**
//! in the pid namespace of the init the runtime reports now (`State.Pid`,
//! the task's `init.pid`), itself in that cgroup. A process moved out, a
//! container gone (its id reused or not), a runtime that reports no pid or
//! one of another pid namespace: each is left alone, with the reason. And
//! the runtime must say it is running: a container stopped on purpose
//! (`exited`, `created`, `paused`, or one the runtime is already
//! restarting) is left alone. Runs in the caller (`check`, `watch`), never in the helper
//! (docs/capabilities.md says why).

use std::{path::PathBuf, time::Duration};

use selfheal_core::runtime::Runtime;

use super::{Sources, docker};
use crate::{
    actions::{self, ActionError},
    sys::pidfd::PidfdError,
};

/// Why a container was not restarted: left alone, or its runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    /// The container no longer holds the judged process.
    #[error("container {short}: {why}: left alone")]
    NotHeld { short: String, why: NotHeld },
    /// The task's init process is no longer in the container.
    #[error("container {short}: its init pid {init}: {why}: left alone")]
    InitNotHeld {
        short: String,
        init: u32,
        why: NotHeld,
    },
    /// The runtime's API failed.
    #[error("{runtime} {}: {what} {short}: {source}", .socket.display())]
    Api {
        runtime: Runtime,
        socket: PathBuf,
        what: &'static str,
        short: String,
        source: selfheal_core::runtime::docker::Error,
    },
    /// Stopped on purpose or by its runtime (`status` escaped).
    #[error(
        "container {short} is {status}, not running: stopped on purpose or by its runtime, left alone"
    )]
    NotRunning { short: String, status: String },
    #[error("container {short}: {runtime} reports no init pid for it: left alone")]
    NoInitPid { short: String, runtime: Runtime },
    #[error("container {short}: its init pid {init} is gone")]
    InitGone { short: String, init: u32 },
    /// Opening or signalling the task's init failed.
    #[error(transparent)]
    Act(#[from] ActionError),
    #[error(
        "container {short}: CRI-O has no runtime restart here; give `restart` an argv (e.g. crictl stop {id})"
    )]
    Crio { short: String, id: String },
    /// The task's init pid could not be read.
    #[error(transparent)]
    Task(#[from] TaskError),
}

/// Why a container does not hold a process (now).
#[derive(Debug, thiserror::Error)]
pub enum NotHeld {
    #[error("pid {pid} is gone ({source})")]
    Gone { pid: u32, source: PidfdError },
    #[error("cannot read pid {pid}'s cgroup ({source})")]
    CgroupUnread { pid: u32, source: std::io::Error },
    #[error("pid {pid} exited")]
    Exited { pid: u32 },
    #[error("pid {pid} is no longer in it")]
    NotInIt { pid: u32 },
    #[error("its init pid {init}, as its runtime reports it, is no process here ({source})")]
    InitNoProcess { init: u32, source: PidfdError },
    #[error(
        "pid {init}, its init as its runtime reports it, is not its ({why}): the runtime's pid namespace is another"
    )]
    InitNotIts { init: u32, why: Box<NotHeld> },
    /// A pid namespace could not be read: the reader's words.
    #[error("{0}")]
    PidNs(String),
    #[error("pid {pid} or its init pid {init} exited")]
    EitherExited { pid: u32, init: u32 },
    #[error("pid {pid} is not in the pid namespace of its init (pid {init})")]
    OtherPidNs { pid: u32, init: u32 },
}

/// Why a containerd task's init pid could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// `id` escaped.
    #[error("{id} is not a container id")]
    NotAnId { id: String },
    #[error("no containerd task for {id}: cannot read {} ({source})", .tasks.display())]
    TasksUnread {
        id: String,
        tasks: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a pid", .file.display())]
    NotAPid { file: PathBuf },
    #[error("cannot read {} ({source})", .file.display())]
    Unread {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("no containerd task {id} under {} (not running)", .tasks.display())]
    NoTask { id: String, tasks: PathBuf },
}

/// Restarts container `id` of `runtime`, which must hold process
/// `pid`/`start_ticks`; what was done, as JSON, or why not. `pid_ns`
/// tells a process's pid namespace (the inode of `/proc/PID/ns/pid`), or
/// why it cannot.
#[allow(clippy::too_many_arguments)]
pub fn restart_container<E: std::fmt::Display>(
    sources: &Sources,
    runtime: Runtime,
    id: &str,
    pid: u32,
    start_ticks: u64,
    grace: Duration,
    timeout: Duration,
    pid_ns: &dyn Fn(u32) -> Result<u64, E>,
) -> Result<serde_json::Value, RestartError> {
    let short = selfheal_core::runtime::short_id(id).to_string();
    let not_held = |why| RestartError::NotHeld {
        short: short.clone(),
        why,
    };
    holds(pid, Some(start_ticks), id).map_err(not_held)?;
    match runtime {
        Runtime::Docker | Runtime::Podman => {
            let socket = if runtime == Runtime::Docker {
                &sources.docker
            } else {
                &sources.podman
            };
            let e = |what: &'static str, source| RestartError::Api {
                runtime,
                socket: socket.clone(),
                what,
                short: short.clone(),
                source,
            };
            let bound = sources.timeout;
            let before = docker::inspect(socket, id, bound).map_err(|x| e("inspect", x))?;
            if before.status != "running" {
                return Err(RestartError::NotRunning {
                    short,
                    status: selfheal_core::text::escape(&before.status),
                });
            }
            if before.pid == 0 {
                return Err(RestartError::NoInitPid { short, runtime });
            }
            in_namespace_of(pid, start_ticks, id, before.pid, pid_ns).map_err(not_held)?;
            docker::restart(socket, id, grace, timeout.max(grace + bound))
                .map_err(|x| e("restart", x))?;
            let after = docker::inspect(socket, id, bound).map_err(|x| e("inspect", x))?;
            Ok(serde_json::json!({
                "runtime": runtime,
                "id": id,
                "before": before,
                "after": after,
            }))
        }
        Runtime::Containerd | Runtime::Cri | Runtime::Unknown => {
            let init = init_pid(&sources.containerd_state, id)?;
            let start = crate::sys::pidfd::start_ticks(init).ok_or(RestartError::InitGone {
                short: short.clone(),
                init,
            })?;
            let target = actions::guard::open_target(init, start)?;
            holds(init, Some(start), id).map_err(|why| RestartError::InitNotHeld {
                short: short.clone(),
                init,
                why,
            })?;
            in_namespace_of(pid, start_ticks, id, init, pid_ns).map_err(not_held)?;
            let out = actions::signal::signal_escalate(&target, grace)?;
            Ok(serde_json::json!({
                "runtime": "containerd",
                "id": id,
                "task_killed": out,
            }))
        }
        Runtime::Crio => Err(RestartError::Crio {
            short,
            id: id.to_string(),
        }),
    }
}

/// Whether process `pid` (of that start time) is in container `id` now.
fn holds(pid: u32, start_ticks: Option<u64>, id: &str) -> Result<(), NotHeld> {
    let target = crate::sys::pidfd::Pidfd::open(pid, start_ticks)
        .map_err(|source| NotHeld::Gone { pid, source })?;
    let text =
        std::fs::read_to_string(crate::sys::procfs::ProcRoot::default().of_pid(pid, "cgroup"))
            .map_err(|source| NotHeld::CgroupUnread { pid, source })?;
    // Read after the pidfd was opened: if it is still alive, the text was
    // that process's.
    if !target.is_alive() {
        return Err(NotHeld::Exited { pid });
    }
    if selfheal_core::cgroup::containers_for(&text, crate::sys::creds::euid())
        .iter()
        .any(|c| c.id == id)
    {
        Ok(())
    } else {
        Err(NotHeld::NotInIt { pid })
    }
}

/// Whether process `pid` (of that start time) is in the pid namespace of
/// `init`, the container's init as its runtime reports it now, and `init`
/// is in container `id`'s cgroup (so the runtime's pid is this pid
/// namespace's, and the container's).
fn in_namespace_of<E: std::fmt::Display>(
    pid: u32,
    start_ticks: u64,
    id: &str,
    init: u32,
    pid_ns: &dyn Fn(u32) -> Result<u64, E>,
) -> Result<(), NotHeld> {
    let target = crate::sys::pidfd::Pidfd::open(pid, Some(start_ticks))
        .map_err(|source| NotHeld::Gone { pid, source })?;
    let init_fd = crate::sys::pidfd::Pidfd::open(init, None)
        .map_err(|source| NotHeld::InitNoProcess { init, source })?;
    holds(init, None, id).map_err(|why| NotHeld::InitNotIts {
        init,
        why: Box::new(why),
    })?;
    let ns = |pid: u32| pid_ns(pid).map_err(|e| NotHeld::PidNs(e.to_string()));
    let (mine, its) = (ns(pid)?, ns(init)?);
    if !target.is_alive() || !init_fd.is_alive() {
        return Err(NotHeld::EitherExited { pid, init });
    }
    if mine != its {
        return Err(NotHeld::OtherPidNs { pid, init });
    }
    Ok(())
}

/// A process's pid namespace this process may not read (another user's
/// needs `CAP_SYS_PTRACE`), or that has exited.
#[derive(Debug, thiserror::Error)]
#[error("cannot read pid {pid}'s pid namespace ({source})")]
pub struct PidNsUnread {
    pub pid: u32,
    pub source: std::io::Error,
}

/// The pid namespace of `pid` as this process reads it (the inode of
/// `/proc/PID/ns/pid`).
pub fn pid_namespace_here(pid: u32) -> Result<u64, PidNsUnread> {
    crate::sys::procfs::ProcRoot::default()
        .namespace(pid, "pid")
        .map_err(|source| PidNsUnread { pid, source })
}

/// The pid of task `id`'s init process, from containerd's state directory
/// (`STATE/io.containerd.runtime.v2.task/NAMESPACE/ID/init.pid`).
fn init_pid(state: &std::path::Path, id: &str) -> Result<u32, TaskError> {
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TaskError::NotAnId {
            id: selfheal_core::text::escape(id),
        });
    }
    let tasks = state.join("io.containerd.runtime.v2.task");
    let dir = std::fs::read_dir(&tasks).map_err(|source| TaskError::TasksUnread {
        id: id.to_string(),
        tasks: tasks.clone(),
        source,
    })?;
    let files: Vec<PathBuf> = dir
        .filter_map(|e| e.ok())
        .take(64)
        .map(|e| e.path().join(id).join("init.pid"))
        .collect();
    for f in files {
        match std::fs::read_to_string(&f) {
            Ok(s) => {
                return s
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| TaskError::NotAPid { file: f });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(TaskError::Unread { file: f, source }),
        }
    }
    Err(TaskError::NoTask {
        id: id.to_string(),
        tasks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_pid_from_the_state_directory() {
        let dir = std::env::temp_dir().join(format!("selfheal-restart-{}", std::process::id()));
        let id = "c".repeat(64);
        let task = dir.join("io.containerd.runtime.v2.task/k8s.io").join(&id);
        std::fs::create_dir_all(&task).unwrap();
        std::fs::write(task.join("init.pid"), "4242\n").unwrap();
        assert_eq!(init_pid(&dir, &id).ok(), Some(4242));
        let e = init_pid(&dir, &"d".repeat(64)).unwrap_err().to_string();
        assert!(e.contains("not running"), "{e}");
        let e = init_pid(&dir, "../../etc").unwrap_err().to_string();
        assert!(e.contains("not a container id"), "{e}");
        std::fs::write(task.join("init.pid"), "x\u{1b}[31m").unwrap();
        assert!(
            init_pid(&dir, &id)
                .unwrap_err()
                .to_string()
                .contains("not a pid")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_process_not_in_the_container_is_left_alone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let start = crate::sys::pidfd::start_ticks(pid).expect("its start time");
        let sources = Sources {
            docker: "/nonexistent/docker.sock".into(),
            podman: "/nonexistent/podman.sock".into(),
            containerd_state: "/nonexistent".into(),
            timeout: Duration::from_secs(1),
        };
        for rt in [Runtime::Docker, Runtime::Containerd] {
            let e = restart_container(
                &sources,
                rt,
                &"e".repeat(64),
                pid,
                start,
                Duration::from_secs(1),
                Duration::from_secs(1),
                &pid_namespace_here,
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("no longer in it: left alone"), "{e}");
        }
        // The wrong start time: another process by that pid.
        let e = restart_container(
            &sources,
            Runtime::Docker,
            &"e".repeat(64),
            pid,
            start + 1,
            Duration::from_secs(1),
            Duration::from_secs(1),
            &pid_namespace_here,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("left alone"), "{e}");
        let _ = child.kill();
        let _ = child.wait();
    }
}
