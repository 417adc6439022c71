//! Where the runtimes are asked, and how long each may take: the
//! environment's sockets and bound, else the runtimes' default places.

use std::{ffi::OsString, path::PathBuf, time::Duration};

/// Where the runtimes are, and how long each may take.
#[derive(Clone, Debug)]
pub struct Sources {
    pub docker: PathBuf,
    pub podman: PathBuf,
    pub containerd_state: PathBuf,
    /// The bound on each runtime's answer (they are asked in parallel).
    pub timeout: Duration,
}

/// The bound on a runtime's answer unless `SELFHEAL_RUNTIME_TIMEOUT` says.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

impl Sources {
    /// From the environment (`DOCKER_HOST`, `CONTAINER_HOST`, `XDG_RUNTIME_DIR`,
    /// `SELFHEAL_CONTAINERD_STATE`, `SELFHEAL_RUNTIME_TIMEOUT`), else the
    /// runtimes' default places. A `DOCKER_HOST` that is not `unix://` is
    /// ignored: only a local socket is asked.
    pub fn from_env() -> Sources {
        Sources::from_vars(|var| std::env::var_os(var), crate::sys::creds::euid())
    }

    /// [`Sources::from_env`] with the variables read by `var`, for a
    /// process of effective uid `euid`.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>, euid: u32) -> Sources {
        let unix = |name: &str, default: &str| {
            var(name)
                .and_then(|v| v.into_string().ok())
                .and_then(|v| v.strip_prefix("unix://").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from(default))
        };
        let podman_default = podman_socket(var("XDG_RUNTIME_DIR").as_deref(), euid)
            .display()
            .to_string();
        Sources {
            docker: unix("DOCKER_HOST", "/var/run/docker.sock"),
            podman: unix("CONTAINER_HOST", &podman_default),
            containerd_state: var("SELFHEAL_CONTAINERD_STATE")
                .map_or_else(|| PathBuf::from("/run/containerd"), PathBuf::from),
            timeout: var("SELFHEAL_RUNTIME_TIMEOUT")
                .and_then(|v| v.into_string().ok())
                .and_then(|s| humantime::parse_duration(&s).ok())
                .filter(|d| !d.is_zero())
                .unwrap_or(DEFAULT_TIMEOUT),
        }
    }
}

/// Podman's API socket by default: root's, or (rootless Podman) the one in
/// the user's runtime directory.
fn podman_socket(xdg_runtime_dir: Option<&std::ffi::OsStr>, euid: u32) -> PathBuf {
    match xdg_runtime_dir {
        Some(dir) if euid != 0 && !dir.is_empty() => PathBuf::from(dir).join("podman/podman.sock"),
        _ => PathBuf::from("/run/podman/podman.sock"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_socket_by_default() {
        use std::ffi::OsStr;
        let root = PathBuf::from("/run/podman/podman.sock");
        assert_eq!(podman_socket(None, 0), root);
        assert_eq!(podman_socket(Some(OsStr::new("/run/user/0")), 0), root);
        assert_eq!(podman_socket(None, 1000), root);
        assert_eq!(podman_socket(Some(OsStr::new("")), 1000), root);
        assert_eq!(
            podman_socket(Some(OsStr::new("/run/user/1000")), 1000),
            PathBuf::from("/run/user/1000/podman/podman.sock")
        );
    }

    #[test]
    fn sources_come_from_the_environment_else_the_defaults() {
        let none = Sources::from_vars(|_| None, 0);
        assert_eq!(none.docker, PathBuf::from("/var/run/docker.sock"));
        assert_eq!(none.podman, PathBuf::from("/run/podman/podman.sock"));
        assert_eq!(none.containerd_state, PathBuf::from("/run/containerd"));
        assert_eq!(none.timeout, DEFAULT_TIMEOUT);
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let set = Sources::from_vars(
            vars(&[
                ("DOCKER_HOST", "unix:///tmp/d.sock"),
                ("CONTAINER_HOST", "unix:///tmp/p.sock"),
                ("SELFHEAL_CONTAINERD_STATE", "/tmp/ctrd"),
                ("SELFHEAL_RUNTIME_TIMEOUT", "750ms"),
            ]),
            1000,
        );
        assert_eq!(set.docker, PathBuf::from("/tmp/d.sock"));
        assert_eq!(set.podman, PathBuf::from("/tmp/p.sock"));
        assert_eq!(set.containerd_state, PathBuf::from("/tmp/ctrd"));
        assert_eq!(set.timeout, Duration::from_millis(750));
        // Only a local socket is asked; a zero or bad bound is the default;
        // a user's Podman is in its runtime directory.
        let odd = Sources::from_vars(
            vars(&[
                ("DOCKER_HOST", "tcp://10.0.0.1:2375"),
                ("SELFHEAL_RUNTIME_TIMEOUT", "0s"),
                ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ]),
            1000,
        );
        assert_eq!(odd.docker, PathBuf::from("/var/run/docker.sock"));
        assert_eq!(odd.timeout, DEFAULT_TIMEOUT);
        assert_eq!(
            odd.podman,
            PathBuf::from("/run/user/1000/podman/podman.sock")
        );
        let bad = Sources::from_vars(vars(&[("SELFHEAL_RUNTIME_TIMEOUT", "soon")]), 0);
        assert_eq!(bad.timeout, DEFAULT_TIMEOUT);
    }
}
