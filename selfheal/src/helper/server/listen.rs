//! Where the helper's server listens: the socket path it binds (its
//! directory made and checked first, a stale socket replaced, a live one
//! refused, the file removed on exit only while it is still ours), or the
//! listener systemd hands over by socket activation.

use std::{
    io,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::{
            fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
            net::{UnixListener, UnixStream},
        },
    },
    path::{Path, PathBuf},
};

use nix::sys::socket::{getsockopt, sockopt};

use super::ServerError;
use crate::sys::activation::ActivationError;

/// Where the helper listens when no `--socket` is given.
pub const DEFAULT_SOCKET: &str = "/run/selfheal/helper.sock";

/// Mode of the socket file the helper binds: 0666, anyone may connect.
///
/// Authorization is by `SO_PEERCRED` on every request, against the policy;
/// the file mode only limits who may *connect*. The default policy lets
/// every user query and heal its own processes, and `selfheal check` runs
/// from every user's timer, so every user must be able to connect: a 0660
/// socket would need a deployment-time group mirroring the policy with a
/// second, coarser rule that can only disagree with it. What a stranger who
/// connects can cost is bounded by the connection cap, the request size and
/// time limits, and the per-uid rate limit; what it can do is nothing the
/// policy does not grant. (A deployment that wants fewer callers can set
/// `SocketMode=` on its socket unit: the helper accepts any mode then.)
pub const SOCKET_MODE: u32 = 0o666;

/// Mode of the socket's directory when the helper creates it.
pub const SOCKET_DIR_MODE: u32 = 0o755;

/// What `systemd` passes a socket-activated service, read from
/// `LISTEN_PID` and `LISTEN_FDS` (pure): the number of fds from 3 on when
/// they are meant for `our_pid`, else `None`.
pub fn activation(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    our_pid: u32,
) -> Result<Option<u32>, ActivationError> {
    let Some(pid) = listen_pid else {
        return Ok(None);
    };
    // Variables inherited from a parent that was activated are not ours.
    if pid.trim().parse::<u32>().ok() != Some(our_pid) {
        return Ok(None);
    }
    let fds = listen_fds.ok_or(ActivationError::NoFds)?;
    let n: u32 = fds.trim().parse().map_err(|_| ActivationError::BadFds {
        value: fds.to_string(),
    })?;
    Ok((n > 0).then_some(n))
}

/// Takes the listening socket systemd passed (fd 3) when `LISTEN_PID` is
/// ours and `LISTEN_FDS` ≥ 1, and removes `LISTEN_PID`, `LISTEN_FDS` and
/// `LISTEN_FDNAMES` from the environment either way, so that no child
/// mistakes them for its own. Every passed fd is made close-on-exec; fds
/// after the first are left unused. Changing the environment needs a
/// process with one thread: call it first thing, before any thread starts
/// ([`crate::sys::activation::take_env`]).
pub fn take_activated_listener() -> Result<Option<OwnedFd>, ServerError> {
    let activation_error = |why| ServerError::Activation { why };
    let (pid, fds) = crate::sys::activation::take_env().map_err(activation_error)?;
    let found = activation(pid.as_deref(), fds.as_deref(), std::process::id());
    let Some(n) = found.map_err(activation_error)? else {
        return Ok(None);
    };
    crate::sys::activation::take_listener(n).map_err(activation_error)
}

/// A socket file we bound, removed on exit if it is still ours.
pub(super) struct BoundSocket {
    pub(super) path: PathBuf,
    /// Device, inode and change time: inode numbers are reused at once on
    /// tmpfs.
    pub(super) id: (u64, u64, i64, i64),
}

fn file_id(md: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (md.dev(), md.ino(), md.ctime(), md.ctime_nsec())
}

impl BoundSocket {
    pub(super) fn remove(&self) {
        if let Ok(md) = std::fs::symlink_metadata(&self.path)
            && file_id(&md) == self.id
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Creates the socket's directory (0755) if missing and checks that only we
/// or root could replace the socket in it — the directory and every one
/// above it, by the rule of [`crate::fs::safedir`] (symlinks on the way only
/// when root's or ours).
fn prepare_socket_dir(dir: &Path) -> Result<(), ServerError> {
    crate::fs::safedir::check_above(dir).map_err(|e| ServerError::UnsafeDir {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    let io_err = |action| {
        move |source| ServerError::Io {
            action,
            path: dir.to_path_buf(),
            source,
        }
    };
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(SOCKET_DIR_MODE)
                .create(dir)
                .map_err(io_err("create"))?;
            // The umask may have taken bits away.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(SOCKET_DIR_MODE))
                .map_err(io_err("set the mode of"))?;
        }
        Err(e) => return Err(io_err("examine")(e)),
    }
    let md = std::fs::symlink_metadata(dir).map_err(io_err("examine"))?;
    let unsafe_dir = |reason: String| ServerError::UnsafeDir {
        path: dir.to_path_buf(),
        reason,
    };
    if md.file_type().is_symlink() {
        return Err(unsafe_dir(
            "it is a symlink (give the real directory)".into(),
        ));
    }
    if !md.is_dir() {
        return Err(unsafe_dir("not a directory".into()));
    }
    let me = crate::sys::creds::euid();
    let mode = md.mode() & 0o7777;
    // A sticky directory (/tmp) lets nobody else remove our socket.
    if mode & 0o1000 == 0 {
        if md.uid() != me && md.uid() != 0 {
            return Err(unsafe_dir(format!(
                "owned by uid {}, not by root or this user (uid {me})",
                md.uid()
            )));
        }
        if mode & 0o022 != 0 {
            if md.uid() != me {
                return Err(unsafe_dir(format!(
                    "writable by group or others (mode {mode:04o}) and not this user's to close"
                )));
            }
            return take_over(dir, &md, me);
        }
    }
    Ok(())
}

/// Takes over a directory of the helper's own user that others may
/// write, as the kubelet makes every `emptyDir` (0777): its group and
/// other write bits are dropped through an fd of it (the one examined, not
/// whatever the path names by then), and only then is it read: anything in
/// it that is neither root's nor this user's was put there by someone else
/// before it was closed to them (a socket of theirs, a directory for the
/// helper's pins) and the directory is refused, naming it.
fn take_over(dir: &Path, md: &std::fs::Metadata, me: u32) -> Result<(), ServerError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let unsafe_dir = |reason: String| ServerError::UnsafeDir {
        path: dir.to_path_buf(),
        reason,
    };
    let io_err = |action| {
        move |source| ServerError::Io {
            action,
            path: dir.to_path_buf(),
            source,
        }
    };
    let was = md.mode() & 0o7777;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(io_err("open"))?;
    let held = f.metadata().map_err(io_err("examine"))?;
    if (held.dev(), held.ino()) != (md.dev(), md.ino()) || held.uid() != md.uid() {
        return Err(unsafe_dir("it was replaced while being examined".into()));
    }
    let now = was & !0o022;
    f.set_permissions(std::fs::Permissions::from_mode(now))
        .map_err(io_err("set the mode of"))?;
    // Listed through the fd examined, not the path.
    let owners =
        crate::sys::fs::entry_owners(std::os::fd::AsFd::as_fd(&f)).map_err(io_err("list"))?;
    if let Some((name, owner)) = owners.iter().find(|(_, uid)| *uid != 0 && *uid != me) {
        return Err(unsafe_dir(format!(
            "it was writable by group or others (mode {was:04o}) and holds {name:?} of uid {owner}"
        )));
    }
    tracing::warn!(
        dir = %dir.display(),
        "the socket directory was writable by group or others (mode {was:04o}); now {now:04o}"
    );
    Ok(())
}

pub(super) fn bind_path(path: &Path) -> Result<(UnixListener, BoundSocket), ServerError> {
    let io_err = |action| {
        move |source| ServerError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    prepare_socket_dir(dir)?;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("examine")(e)),
        Ok(md) if md.file_type().is_socket() => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(ServerError::AlreadyRunning {
                    path: path.to_path_buf(),
                });
            }
            // Nobody listens: a helper that died left it.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                std::fs::remove_file(path).map_err(io_err("remove the stale socket"))?;
            }
            Err(e) => return Err(io_err("connect to the existing socket")(e)),
        },
        Ok(_) => {
            return Err(ServerError::NotASocket {
                path: path.to_path_buf(),
            });
        }
    }
    let listener = UnixListener::bind(path).map_err(io_err("bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(io_err("set the mode of"))?;
    let md = std::fs::symlink_metadata(path).map_err(io_err("examine"))?;
    Ok((
        listener,
        BoundSocket {
            path: path.to_path_buf(),
            id: file_id(&md),
        },
    ))
}

/// Checks that a handed-over fd is a listening unix stream socket.
pub(super) fn listener_from_fd(fd: OwnedFd) -> Result<UnixListener, ServerError> {
    let bad = |why| ServerError::Activation { why };
    let n = fd.as_raw_fd();
    match getsockopt(&fd, sockopt::SockType) {
        Ok(nix::sys::socket::SockType::Stream) => {}
        Ok(t) => {
            return Err(bad(ActivationError::NotStream {
                fd: n,
                kind: format!("{t:?}"),
            }));
        }
        Err(errno) => return Err(bad(ActivationError::NotSocket { fd: n, errno })),
    }
    if !getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false) {
        return Err(bad(ActivationError::NotListening { fd: n }));
    }
    let listener = UnixListener::from(fd);
    listener.local_addr().map_err(|e| {
        bad(ActivationError::NotUnix {
            reason: e.to_string(),
        })
    })?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_is_read_from_the_environment() {
        assert_eq!(activation(None, None, 10), Ok(None));
        assert_eq!(activation(Some("10"), Some("1"), 10), Ok(Some(1)));
        assert_eq!(activation(Some("10"), Some("3"), 10), Ok(Some(3)));
        assert_eq!(activation(Some("10"), Some("0"), 10), Ok(None));
        // Meant for another process (inherited): ignored.
        assert_eq!(activation(Some("11"), Some("1"), 10), Ok(None));
        assert_eq!(activation(Some("x"), Some("1"), 10), Ok(None));
        assert!(activation(Some("10"), None, 10).is_err());
        assert!(
            activation(Some("10"), Some("two"), 10)
                .unwrap_err()
                .to_string()
                .contains("LISTEN_FDS")
        );
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_one_refused() {
        struct Cleanup(PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir = std::env::temp_dir().join(format!("selfheal-helper-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _cleanup = Cleanup(dir.clone());
        let path = dir.join("sub/helper.sock");
        let (l, b) = bind_path(&path).unwrap();
        let md = std::fs::metadata(dir.join("sub")).unwrap();
        assert_eq!(md.mode() & 0o777, SOCKET_DIR_MODE);
        assert_eq!(
            std::fs::metadata(&path).unwrap().mode() & 0o777,
            SOCKET_MODE
        );
        assert!(matches!(
            bind_path(&path),
            Err(ServerError::AlreadyRunning { .. })
        ));
        drop(l);
        let (_l, b2) = bind_path(&path).unwrap();
        // The old handle no longer names the file: it leaves it alone.
        b.remove();
        assert!(path.exists());
        b2.remove();
        assert!(!path.exists());
        std::fs::write(&path, "x").unwrap();
        assert!(matches!(
            bind_path(&path),
            Err(ServerError::NotASocket { .. })
        ));
    }

    /// A directory of ours others may write (an `emptyDir`, 0777) is
    /// closed to them before the socket is made in it; one that already
    /// holds something of another user's is refused, naming it.
    #[test]
    fn a_world_writable_directory_of_ours_is_closed_or_refused() {
        use std::os::unix::fs::{PermissionsExt as _, chown};
        let dir = std::env::temp_dir().join(format!("selfheal-helper-open-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let open =
            |d: &Path| std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        open(&dir);
        let (_l, b) = bind_path(&dir.join("helper.sock")).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o755);
        b.remove();
        // Another user's entry, made while others could write (only root
        // can give a file away, so only as root).
        if crate::sys::creds::euid() == 0 {
            open(&dir);
            let planted = dir.join("bpf");
            std::fs::create_dir(&planted).unwrap();
            chown(&planted, Some(65534), Some(65534)).unwrap();
            match bind_path(&dir.join("helper.sock")) {
                Err(ServerError::UnsafeDir { reason, .. }) => {
                    assert!(reason.contains("\"bpf\" of uid 65534"), "{reason}")
                }
                Err(other) => panic!("{other}"),
                Ok(_) => panic!("a planted directory was taken over"),
            }
            assert!(!dir.join("helper.sock").exists());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
