//! The helper's policy file and its targets, as read from the system:
//! finding and reading the file (`/etc/selfheal/helper.toml`), refusing one
//! that a non-trusted user could have written, and reading a target's
//! identity from procfs. The rules that decide, the file's shape and its
//! validation are the core's ([`selfheal_core::access::policy`]).
//!
//! A policy file decides what others may do as root, so it must be trusted:
//! the file and every directory above it must be owned by root (or by the
//! helper's own user when the helper does not run as root) and not writable
//! by group or others (a sticky directory such as `/tmp` is accepted above
//! the file's directory). An untrusted file is not skipped in favour of the
//! default policy: the helper refuses to start, since a silently ignored
//! policy would hide the attack or the mistake.

use std::path::Path;

use selfheal_core::access::policy::{Policy, PolicyError, TargetProcess};

/// The policy file read when no `--policy` is given (if it exists).
pub const DEFAULT_POLICY: &str = "/etc/selfheal/helper.toml";

/// A policy file larger than this is refused.
const MAX_POLICY_BYTES: u64 = 1 << 20;

/// `PF_KTHREAD` in `/proc/PID/stat` flags.
const PF_KTHREAD: u32 = 0x0020_0000;

/// Loads the policy for a helper running as `euid`: `path` when given
/// (it must exist), else [`DEFAULT_POLICY`] if it exists, else the
/// default policy.
pub fn load(path: Option<&Path>, euid: u32) -> Result<Policy, PolicyError> {
    let (path, required) = match path {
        Some(p) => (p, true),
        None => (Path::new(DEFAULT_POLICY), false),
    };
    match std::fs::symlink_metadata(path) {
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Policy::default());
        }
        Err(error) => {
            return Err(PolicyError::Read {
                path: path.to_path_buf(),
                error,
            });
        }
        Ok(_) => {}
    }
    let text = read_trusted(path, euid)?;
    Policy::parse(&text, path)
}

/// Reads `pid`'s identity from procfs; `None` when it is gone.
pub fn read_target(pid: u32) -> Option<TargetProcess> {
    let p = crate::sys::procfs::ProcRoot::default().process(pid).ok()?;
    let status = p.status().ok()?;
    let stat = p.stat().ok()?;
    Some(TargetProcess {
        pid,
        uids: [status.ruid, status.euid, status.suid],
        kernel_thread: stat.flags & PF_KTHREAD != 0,
    })
}

/// Reads `path` after checking that only trusted users (root, and `euid`)
/// could have written it or replaced it.
fn read_trusted(path: &Path, euid: u32) -> Result<String, PolicyError> {
    crate::trust::read_trusted_text(
        path,
        euid,
        crate::trust::Sticky::AboveItsOwn,
        MAX_POLICY_BYTES,
    )
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, os::unix::fs::PermissionsExt as _, path::PathBuf};

    use super::*;

    /// A root-owned directory under /tmp for file checks, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p =
                std::env::temp_dir().join(format!("selfheal-policy-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn untrusted_files_are_refused() {
        let euid = crate::sys::creds::euid();
        let dir = TempDir::new("trust");
        let file = dir.0.join("helper.toml");
        std::fs::write(&file, "[[grant]]\nuid = 1000\nuids = [1001]\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let p = load(Some(&file), euid).unwrap();
        assert_eq!(p.grants[&1000], BTreeSet::from([1001]));

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o664)).unwrap();
        let e = load(Some(&file), euid).unwrap_err().to_string();
        assert!(e.contains("writable by group or others (mode 0664)"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();

        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = load(Some(&file), euid).unwrap_err().to_string();
        assert!(
            e.contains("is writable by group or others (mode 0777)"),
            "{e}"
        );
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();

        if euid == 0 {
            // Owned by nobody: refused when the helper runs as root.
            std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
            let e = load(Some(&file), 0).unwrap_err().to_string();
            assert!(e.contains("owned by uid 65534, not root"), "{e}");
            std::os::unix::fs::chown(&file, Some(0), Some(0)).unwrap();
        }

        // A named file must exist; the default one may be missing.
        let missing = dir.0.join("missing.toml");
        assert!(matches!(
            load(Some(&missing), euid),
            Err(PolicyError::Read { .. })
        ));
        // A symlink is followed to the real file, whose checks apply.
        let link = dir.0.join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(load(Some(&link), euid).is_ok());
    }

    #[test]
    fn targets_are_read_from_procfs() {
        let me = read_target(std::process::id()).unwrap();
        // SAFETY: getuid/geteuid have no preconditions.
        let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
        assert_eq!(me.uids[..2], [uid, euid]);
        assert!(!me.kernel_thread);
        if let Some(kthreadd) = read_target(2) {
            // pid 2 is kthreadd on the host; in a pid namespace it may be anything.
            if std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd") {
                assert!(kthreadd.kernel_thread);
            }
        }
        assert_eq!(read_target(u32::MAX), None);
    }
}
