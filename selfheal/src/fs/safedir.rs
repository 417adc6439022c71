//! The one rule for every directory selfheal writes into — the state
//! directory, the snapshot log's, the metrics file's — and the helper's
//! socket directory checks the same way: [`SafeDir::open`] walks the path
//! from `/` one component at a time with `openat(O_NOFOLLOW)`, checking
//! each directory as it holds it, and the caller then writes only through
//! the directory fd it got (`openat`, `renameat`, `unlinkat`), re-checking
//! the path before each write ([`SafeDir::recheck`]).
//!
//! The rule, for a process running as uid `me` (often root):
//!
//! - every directory on the way is owned by root or `me`, and not writable
//!   by group or others — unless it is sticky (`/tmp`: others may not
//!   rename or remove there what they do not own), or it is owned by root,
//!   not writable by others, and its group is a system group (gid below
//!   [`FIRST_USER_GID`]: `/var/log` is 0775 root:syslog on Ubuntu; only
//!   system daemons are in such groups, and what they could do — rename a
//!   directory away — is caught by the re-check, never followed);
//! - a symlink on the way is followed only when root or `me` owns it (in a
//!   sticky directory anyone can plant one, and only its owner can re-point
//!   it); its target is walked by the same rule;
//! - the directory itself is owned by `me` and not writable by group or
//!   others.
//!
//! Missing directories are created by us (mode given by the caller), so
//! they pass.

use std::{
    ffi::{CString, OsStr, OsString},
    fs::File,
    io,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Component, Path, PathBuf},
    sync::Arc,
};

use super::{StoreError, io_err};
use crate::sys::{
    creds::euid,
    fs::{self as sys, fstat, lstatat, openat, readlinkat},
};

/// Groups with a gid below this are system groups (Debian's, Fedora's and
/// Arch's `SYS_GID_MAX` is 999).
pub const FIRST_USER_GID: u32 = 1000;

/// Symlinks followed in one walk, as the kernel's limit.
const MAX_SYMLINKS: usize = 40;

/// A directory that passed the rule, held open.
#[derive(Debug, Clone)]
pub struct SafeDir {
    path: PathBuf,
    fd: Arc<OwnedFd>,
    /// Device and inode, to tell whether the path still leads here.
    id: (u64, u64),
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

const S_IFMT: u32 = libc::S_IFMT;

fn kind(st: &libc::stat) -> u32 {
    st.st_mode & S_IFMT
}

/// Why a directory on the way (not the last) is refused, if it is.
fn ancestor_problem(st: &libc::stat, me: u32) -> Option<String> {
    let mode = st.st_mode & 0o7777;
    let owner = if me == 0 {
        "root".to_string()
    } else {
        format!("root or this user (uid {me})")
    };
    if st.st_uid != 0 && st.st_uid != me {
        return Some(format!(
            "is owned by uid {}, not by {owner}: it could swap what is below it; \
             give a path whose every directory is {owner}'s",
            st.st_uid
        ));
    }
    let sticky = mode & 0o1000 != 0;
    let system_group = st.st_uid == 0 && mode & 0o002 == 0 && st.st_gid < FIRST_USER_GID;
    if mode & 0o022 != 0 && !sticky && !system_group {
        return Some(format!(
            "is writable by group or others and not sticky (mode {mode:04o}), and is not \
             root's with only a system group (gid below {FIRST_USER_GID}; its gid is {}) \
             writing: run chmod go-w on it, or give a path elsewhere",
            st.st_gid
        ));
    }
    None
}

impl SafeDir {
    /// Walks `path` by the rule (see the module doc) and holds the
    /// directory. Missing directories are created with `create` mode (then
    /// set exactly, whatever the umask) when it is given, else are an
    /// error.
    pub fn open(path: &Path, create: Option<u32>) -> Result<SafeDir, StoreError> {
        let me = euid();
        let fd = walk(path, create, false)?
            .ok_or_else(|| io_err("examine", path)(io::Error::from_raw_os_error(libc::ENOENT)))?;
        let st = fstat(fd.as_raw_fd()).map_err(io_err("examine", path))?;
        let p = path.to_path_buf();
        if st.st_uid != me {
            return Err(StoreError::NotOwner {
                path: p,
                owner: st.st_uid,
                euid: me,
            });
        }
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(StoreError::Writable { path: p, mode });
        }
        Ok(SafeDir {
            path: p,
            fd: Arc::new(fd),
            id: (st.st_dev, st.st_ino),
        })
    }

    /// Walks the path again (creating nothing) and checks it still leads to
    /// the directory held: call before each write.
    pub fn recheck(&self) -> Result<(), StoreError> {
        let again = SafeDir::open(&self.path, None)?;
        if again.id != self.id {
            return Err(StoreError::Moved {
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `name` inside it (for messages and reading).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Opens `name` in the directory, never through a symlink: `flags` are
    /// `open(2)` flags (`O_NOFOLLOW` and `O_CLOEXEC` are added).
    pub fn open_file(&self, name: &str, flags: i32, mode: u32) -> io::Result<File> {
        let c = cstr(OsStr::new(name))?;
        let fd = openat(self.fd.as_raw_fd(), &c, flags | libc::O_NOFOLLOW, mode)?;
        Ok(File::from(fd))
    }

    /// Renames `from` to `to`, both in the directory.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (f, t) = (cstr(OsStr::new(from))?, cstr(OsStr::new(to))?);
        sys::renameat(self.fd.as_raw_fd(), &f, &t)
    }

    /// Removes the file `name` from the directory.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let c = cstr(OsStr::new(name))?;
        sys::unlinkat(self.fd.as_raw_fd(), &c)
    }

    /// The names in the directory (`.` and `..` left out).
    pub fn names(&self) -> io::Result<Vec<String>> {
        // A fresh fd: readdir moves the offset of the one it reads.
        let fd = openat(
            self.fd.as_raw_fd(),
            c".",
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        )?;
        let dir = nix::dir::Dir::from_fd(fd).map_err(io::Error::from)?;
        let mut names = Vec::new();
        for e in dir.into_iter().flatten() {
            if let Ok(n) = e.file_name().to_str()
                && n != "."
                && n != ".."
            {
                names.push(n.to_string());
            }
        }
        Ok(names)
    }

    /// Makes renames and new entries durable.
    pub fn fsync(&self) -> io::Result<()> {
        sys::fsync(self.fd.as_raw_fd())
    }

    /// The directory's group.
    pub fn gid(&self) -> io::Result<u32> {
        Ok(fstat(self.fd.as_raw_fd())?.st_gid)
    }
}

/// `path`, made absolute against the current directory when it is not.
fn absolute(path: &Path) -> Result<PathBuf, StoreError> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(std::env::current_dir()
        .map_err(io_err("find the current directory for", path))?
        .join(path))
}

/// Walks `path` by the rule, every directory on the way checked as an
/// ancestor; returns the last one held (unchecked: the caller's rule), or
/// `None` when a component is missing and `missing_ok`.
fn walk(path: &Path, create: Option<u32>, missing_ok: bool) -> Result<Option<OwnedFd>, StoreError> {
    let absolute = absolute(path)?;
    let me = euid();
    let root_name = CString::new("/").expect("no NUL");
    let io = io_err;
    let unsafe_ancestor = |ancestor: &Path, reason: String| StoreError::UnsafeAncestor {
        path: path.to_path_buf(),
        ancestor: ancestor.to_path_buf(),
        reason,
    };
    // The directories held, from `/` down, with the path they were
    // reached by (for messages).
    let root = openat(
        libc::AT_FDCWD,
        &root_name,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )
    .map_err(io("open", Path::new("/")))?;
    let mut stack: Vec<(OwnedFd, PathBuf)> = vec![(root, PathBuf::from("/"))];
    // Each name, and whether it is the last of `path` as given: that
    // one's own symlink is refused outright (give the real directory).
    let mut todo: std::collections::VecDeque<(OsString, bool)> = components(&absolute)
        .into_iter()
        .map(|n| (n, false))
        .collect();
    if let Some(last) = todo.back_mut() {
        last.1 = true;
    }
    let mut links = 0usize;
    let check_top = |stack: &Vec<(OwnedFd, PathBuf)>| -> Result<(), StoreError> {
        let (fd, at) = stack.last().expect("never empty");
        let st = fstat(fd.as_raw_fd()).map_err(io("examine", at))?;
        match ancestor_problem(&st, me) {
            Some(reason) => Err(unsafe_ancestor(at, reason)),
            None => Ok(()),
        }
    };
    while let Some((name, given_last)) = todo.pop_front() {
        let last = todo.is_empty();
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        // Everything above the next step must be safe.
        check_top(&stack)?;
        let (dir_fd, dir_path) = stack.last().expect("never empty");
        let here = dir_path.join(&name);
        let c = cstr(&name).map_err(io("examine", &here))?;
        let mut created = false;
        let st = match lstatat(dir_fd.as_raw_fd(), &c) {
            Ok(st) => st,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && missing_ok => {
                return Ok(None);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                let Some(mode) = create else {
                    return Err(io("examine", &here)(e));
                };
                if let Err(e) = sys::mkdirat(dir_fd.as_raw_fd(), &c, mode) {
                    if e.raw_os_error() != Some(libc::EEXIST) {
                        return Err(io("create directory", &here)(e));
                    }
                } else {
                    created = true;
                }
                lstatat(dir_fd.as_raw_fd(), &c).map_err(io("examine", &here))?
            }
            Err(e) => return Err(io("examine", &here)(e)),
        };
        if kind(&st) == libc::S_IFLNK {
            if given_last {
                return Err(StoreError::Symlink {
                    path: path.to_path_buf(),
                });
            }
            if st.st_uid != 0 && st.st_uid != me {
                return Err(unsafe_ancestor(
                    &here,
                    format!(
                        "is a symlink owned by uid {}, who can re-point it at any time: \
                             give the real directory instead",
                        st.st_uid
                    ),
                ));
            }
            links += 1;
            if links > MAX_SYMLINKS {
                return Err(io("resolve", &here)(io::Error::from_raw_os_error(
                    libc::ELOOP,
                )));
            }
            let target = readlinkat(dir_fd.as_raw_fd(), &c).map_err(io("read link", &here))?;
            let target = PathBuf::from(target);
            if target.is_absolute() {
                stack.truncate(1);
            }
            let mut more = components(&target);
            while let Some(n) = more.pop_back() {
                todo.push_front((n, false));
            }
            continue;
        }
        if kind(&st) != libc::S_IFDIR {
            if last {
                return Err(StoreError::NotDirectory {
                    path: path.to_path_buf(),
                });
            }
            return Err(io("enter", &here)(io::Error::from_raw_os_error(
                libc::ENOTDIR,
            )));
        }
        let fd = openat(
            dir_fd.as_raw_fd(),
            &c,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
            0,
        )
        .map_err(io("open", &here))?;
        if created {
            let mode = create.unwrap_or(0o700);
            sys::fchmod(fd.as_raw_fd(), mode).map_err(io("set the mode of", &here))?;
        }
        stack.push((fd, here));
    }
    let (fd, at) = stack.pop().expect("never empty");
    // `/` itself was opened O_PATH; any other is O_RDONLY already.
    if stack.is_empty() {
        return openat(fd.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map(Some)
            .map_err(io("open", &at));
    }
    Ok(Some(fd))
}

/// Checks every directory above `dir` (and the symlinks on the way) by the
/// rule of this module, as far as they exist: for a directory that is not
/// ours to hold (the helper's socket directory may be a sticky `/tmp`).
pub fn check_above(dir: &Path) -> Result<(), StoreError> {
    let absolute = absolute(dir)?;
    let Some(parent) = absolute.parent() else {
        return Ok(());
    };
    let Some(fd) = walk(parent, None, true)? else {
        return Ok(());
    };
    let st = fstat(fd.as_raw_fd()).map_err(io_err("examine", parent))?;
    match ancestor_problem(&st, euid()) {
        Some(reason) => Err(StoreError::UnsafeAncestor {
            path: dir.to_path_buf(),
            ancestor: parent.to_path_buf(),
            reason,
        }),
        None => Ok(()),
    }
}

/// The normal components of `p`, `..` kept (walked by popping), `.` and
/// the root dropped.
fn components(p: &Path) -> std::collections::VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// The mode of the metrics file: owner read-write, group read. The group is
/// the directory's (see [`write_file_atomically`]).
pub const METRICS_FILE_MODE: u32 = 0o640;

/// Writes `bytes` to `path` through `<path>.tmp` and a rename, both inside
/// its directory as held by [`SafeDir::open`] (checked by the one rule,
/// created by nobody: it must exist). The temporary file is created anew
/// with `mode`, never through a symlink or into a file someone else put
/// there, and given the directory's group (who may read in the directory
/// is its owner's choice: `chgrp node_exporter DIR; chmod 0750 DIR`).
pub fn write_file_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StoreError> {
    use std::io::Write as _;
    let io = io_err;
    let (Some(parent), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str()))
    else {
        return Err(io("write", path)(io::Error::from_raw_os_error(
            libc::EINVAL,
        )));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let dir = SafeDir::open(parent, None)?;
    let tmp_name = format!("{name}.tmp");
    let tmp = dir.join(&tmp_name);
    match dir.remove(&tmp_name) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove stale", &tmp)(e)),
    }
    let written = (|| {
        let mut f = dir
            .open_file(
                &tmp_name,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
                mode,
            )
            .map_err(io("create", &tmp))?;
        // The umask may have taken bits away; the group is the directory's.
        let gid = dir.gid().map_err(io("examine", dir.path()))?;
        if let Err(e) = sys::fchown_group(f.as_raw_fd(), gid) {
            tracing::debug!(
                "cannot give {} the group {gid} of its directory: {}",
                tmp.display(),
                e
            );
        }
        sys::fchmod(f.as_raw_fd(), mode).map_err(io("set the mode of", &tmp))?;
        f.write_all(bytes).map_err(io("write", &tmp))?;
        drop(f);
        dir.rename(&tmp_name, name)
            .map_err(io("rename temp file over", path))
    })();
    if let Err(e) = written {
        let _ = dir.remove(&tmp_name);
        return Err(e);
    }
    Ok(())
}
