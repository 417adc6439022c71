//! Who may query and act on which process: the helper's authorization. This
//! module owns the policy file (`/etc/selfheal/helper.toml`: its shape, its
//! validation with file:line:key errors, and the refusal of a file that a
//! non-trusted user could have written), reading a target's identity from
//! procfs, and the pure rules that decide.
//!
//! # Rules
//!
//! - root (uid 0) may query and act on every process;
//! - any other caller may query and act on a process when every uid of it
//!   (real, effective, saved) is the caller's own or granted to the caller
//!   by the policy file — so a user cannot reach a setuid program it
//!   started;
//! - nobody may act on pid 1, on the helper itself, or on a kernel thread,
//!   whatever the policy says.
//!
//! # The policy file
//!
//! ```toml
//! [[grant]]
//! uid = 1000          # this caller…
//! uids = [1001, 1002] # …may query and act on processes of these uids
//! ```
//!
//! Nothing else: unknown keys are errors. A grant by agent name is not
//! offered on purpose: the agent name in a request is the caller's claim,
//! which the helper cannot check.
//!
//! A policy file decides what others may do as root, so it must be trusted:
//! the file and every directory above it must be owned by root (or by the
//! helper's own user when the helper does not run as root) and not writable
//! by group or others (a sticky directory such as `/tmp` is accepted above
//! the file's directory). An untrusted file is not skipped in favour of the
//! default policy: the helper refuses to start, since a silently ignored
//! policy would hide the attack or the mistake.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    io::Read as _,
    ops::Range,
    path::{Path, PathBuf},
};

use toml::{
    Spanned,
    de::{DeTable, DeValue},
};

use super::protocol::Caller;
use crate::config::line_col;

/// The policy file read when no `--policy` is given (if it exists).
pub const DEFAULT_POLICY: &str = "/etc/selfheal/helper.toml";

/// A policy file larger than this is refused.
const MAX_POLICY_BYTES: u64 = 1 << 20;

/// `PF_KTHREAD` in `/proc/PID/stat` flags.
const PF_KTHREAD: u32 = 0x0020_0000;

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The file, or a directory above it, could have been written by
    /// someone the helper must not trust.
    #[error("refusing policy {}: {reason}", path.display())]
    Untrusted { path: PathBuf, reason: String },
    /// The file is not a valid policy. `line` and `column` are 1-based.
    #[error("{}:{line}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
}

/// The loaded policy: which callers may reach which other uids.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Caller uid → the uids whose processes it may query and act on (on
    /// top of its own).
    pub grants: BTreeMap<u32, BTreeSet<u32>>,
    /// The file it came from; `None` for the default policy.
    pub source: Option<PathBuf>,
}

/// What the rules need to know about a target process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub pid: u32,
    /// Real, effective and saved uid.
    pub uids: [u32; 3],
    pub kernel_thread: bool,
}

/// Reads `pid`'s identity from procfs; `None` when it is gone.
pub fn read_target(pid: u32) -> Option<Target> {
    let p = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    let status = p.status().ok()?;
    let stat = p.stat().ok()?;
    Some(Target {
        pid,
        uids: [status.ruid, status.euid, status.suid],
        kernel_thread: stat.flags & PF_KTHREAD != 0,
    })
}

impl Policy {
    /// Whether `caller_uid` may reach processes of `uid`.
    pub fn may_reach(&self, caller_uid: u32, uid: u32) -> bool {
        caller_uid == 0
            || caller_uid == uid
            || self
                .grants
                .get(&caller_uid)
                .is_some_and(|g| g.contains(&uid))
    }

    /// Whether `caller` may query `target` (watch it, read its eBPF data).
    pub fn check_query(&self, caller: &Caller, target: &Target) -> Result<(), String> {
        match target
            .uids
            .iter()
            .find(|uid| !self.may_reach(caller.uid, **uid))
        {
            None => Ok(()),
            Some(uid) => Err(format!(
                "uid {} may not query pid {} (a process of uid {uid})",
                caller.uid, target.pid
            )),
        }
    }

    /// Whether `caller` may act on `target`; `helper_pid` is the helper's own.
    pub fn check_act(
        &self,
        caller: &Caller,
        target: &Target,
        helper_pid: u32,
    ) -> Result<(), String> {
        if let Some(why) = never_acted_on(target.pid, helper_pid) {
            return Err(why);
        }
        if target.kernel_thread {
            return Err(format!(
                "pid {} is a kernel thread: never acted on",
                target.pid
            ));
        }
        match target
            .uids
            .iter()
            .find(|uid| !self.may_reach(caller.uid, **uid))
        {
            None => Ok(()),
            Some(uid) => Err(format!(
                "uid {} may not act on pid {} (a process of uid {uid})",
                caller.uid, target.pid
            )),
        }
    }

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

    /// Validates policy `text`; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Policy, PolicyError> {
        let cx = Cx { text, path };
        let root = DeTable::parse(text).map_err(|e| cx.syntax(&e))?;
        let root = root.get_ref();
        let mut grants: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        for (key, value) in root.iter() {
            let name: &str = key.get_ref().as_ref();
            if name != "grant" {
                return Err(cx.key_error("", name, key.span(), "unknown key (expected grant)"));
            }
            let DeValue::Array(items) = value.get_ref() else {
                return Err(cx.type_error("", "grant", value, "an array of tables ([[grant]])"));
            };
            for (i, item) in items.iter().enumerate() {
                let scope = format!("grant {}: ", i + 1);
                let DeValue::Table(t) = item.get_ref() else {
                    return Err(cx.type_error(&scope, "grant", item, "a table"));
                };
                let (uid, uids) = grant(&cx, &scope, t, item.span())?;
                grants.entry(uid).or_default().extend(uids);
            }
        }
        Ok(Policy {
            grants,
            source: Some(path.to_path_buf()),
        })
    }

    /// One line describing the policy, for the startup log.
    pub fn describe(&self) -> String {
        match &self.source {
            None => "default (each uid its own processes, root all)".into(),
            Some(p) => {
                let grants: Vec<String> = self
                    .grants
                    .iter()
                    .map(|(uid, uids)| {
                        let list: Vec<String> = uids.iter().map(u32::to_string).collect();
                        format!("uid {uid} → uids {}", list.join(","))
                    })
                    .collect();
                if grants.is_empty() {
                    format!("{}: no grants", p.display())
                } else {
                    format!("{}: {}", p.display(), grants.join("; "))
                }
            }
        }
    }
}

/// Why `pid` may never be acted on, if it may not (a pure rule).
pub fn never_acted_on(pid: u32, helper_pid: u32) -> Option<String> {
    if pid == 1 {
        Some("pid 1 is init: never acted on".into())
    } else if pid == helper_pid {
        Some(format!("pid {pid} is the helper itself: never acted on"))
    } else {
        None
    }
}

fn grant(
    cx: &Cx<'_>,
    scope: &str,
    t: &DeTable<'_>,
    span: Range<usize>,
) -> Result<(u32, Vec<u32>), PolicyError> {
    let mut uid = None;
    let mut uids = None;
    for (key, value) in t.iter() {
        let name: &str = key.get_ref().as_ref();
        match name {
            "uid" => uid = Some(cx.uid(scope, name, value)?),
            "uids" => {
                let DeValue::Array(items) = value.get_ref() else {
                    return Err(cx.type_error(scope, name, value, "an array of uids"));
                };
                let mut list = Vec::new();
                for item in items.iter() {
                    list.push(cx.uid(scope, name, item)?);
                }
                uids = Some(list);
            }
            _ => {
                return Err(cx.key_error(
                    scope,
                    name,
                    key.span(),
                    "unknown key (expected uid, uids)",
                ));
            }
        }
    }
    let missing = |key: &str| cx.error(span.clone(), format!("{scope}missing key `{key}`"));
    Ok((
        uid.ok_or_else(|| missing("uid"))?,
        uids.ok_or_else(|| missing("uids"))?,
    ))
}

/// The text being parsed and its file, for errors.
struct Cx<'a> {
    text: &'a str,
    path: &'a Path,
}

impl Cx<'_> {
    fn error(&self, span: Range<usize>, message: String) -> PolicyError {
        let (line, column) = line_col(self.text, span.start);
        PolicyError::Invalid {
            path: self.path.to_path_buf(),
            line,
            column,
            message,
        }
    }

    fn key_error(
        &self,
        scope: &str,
        key: &str,
        span: Range<usize>,
        what: impl fmt::Display,
    ) -> PolicyError {
        let key = if key.chars().any(char::is_control) {
            format!("{key:?}")
        } else {
            key.to_string()
        };
        self.error(span, format!("{scope}key `{key}`: {what}"))
    }

    fn type_error(
        &self,
        scope: &str,
        key: &str,
        v: &Spanned<DeValue<'_>>,
        expected: &str,
    ) -> PolicyError {
        self.key_error(
            scope,
            key,
            v.span(),
            format!("expected {expected}, found {}", v.get_ref().type_str()),
        )
    }

    fn uid(&self, scope: &str, key: &str, v: &Spanned<DeValue<'_>>) -> Result<u32, PolicyError> {
        let DeValue::Integer(i) = v.get_ref() else {
            return Err(self.type_error(scope, key, v, "a uid (an integer)"));
        };
        i64::from_str_radix(i.as_str(), i.radix())
            .ok()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n != u32::MAX)
            .ok_or_else(|| {
                self.key_error(
                    scope,
                    key,
                    v.span(),
                    format!("uid {} out of range (0 to {})", i.as_str(), u32::MAX - 1),
                )
            })
    }

    fn syntax(&self, e: &toml::de::Error) -> PolicyError {
        let reason: Vec<_> = e
            .message()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        self.error(
            e.span().unwrap_or(0..0),
            format!("bad TOML: {}", reason.join("; ")),
        )
    }
}

/// Reads `path` after checking that only trusted users (root, and `euid`)
/// could have written it or replaced it.
fn read_trusted(path: &Path, euid: u32) -> Result<String, PolicyError> {
    let read_err = |error| PolicyError::Read {
        path: path.to_path_buf(),
        error,
    };
    let file =
        crate::trust::open_trusted(path, euid, crate::trust::Sticky::AboveItsOwn).map_err(|e| {
            match e {
                crate::trust::TrustError::Read { path, error } => PolicyError::Read { path, error },
                crate::trust::TrustError::Untrusted { reason } => PolicyError::Untrusted {
                    path: path.to_path_buf(),
                    reason,
                },
            }
        })?;
    let mut bytes = Vec::new();
    file.take(MAX_POLICY_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_POLICY_BYTES {
        return Err(PolicyError::Invalid {
            path: path.to_path_buf(),
            line: 1,
            column: 1,
            message: format!("file larger than {} MiB", MAX_POLICY_BYTES >> 20),
        });
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let text = String::from_utf8_lossy(&e.as_bytes()[..valid]);
        let (line, column) = line_col(&text, valid);
        PolicyError::Invalid {
            path: path.to_path_buf(),
            line,
            column,
            message: "not UTF-8 text".into(),
        }
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn caller(uid: u32) -> Caller {
        Caller {
            uid,
            gid: uid,
            pid: 4242,
        }
    }

    fn target(pid: u32, uid: u32) -> Target {
        Target {
            pid,
            uids: [uid; 3],
            kernel_thread: false,
        }
    }

    fn parse(text: &str) -> Result<Policy, PolicyError> {
        Policy::parse(text, Path::new("/etc/selfheal/helper.toml"))
    }

    #[test]
    fn default_rules() {
        let p = Policy::default();
        assert!(p.check_act(&caller(1000), &target(50, 1000), 7).is_ok());
        assert!(p.check_query(&caller(1000), &target(50, 1000)).is_ok());
        let e = p.check_act(&caller(1000), &target(50, 0), 7).unwrap_err();
        assert_eq!(e, "uid 1000 may not act on pid 50 (a process of uid 0)");
        assert!(p.check_query(&caller(1000), &target(50, 1001)).is_err());
        assert!(p.check_act(&caller(0), &target(50, 1000), 7).is_ok());
        // A setuid program started by the user is not the user's.
        let setuid = Target {
            pid: 60,
            uids: [1000, 0, 0],
            kernel_thread: false,
        };
        assert!(p.check_act(&caller(1000), &setuid, 7).is_err());
        // Never, not even for root.
        for (pid, needle) in [(1, "init"), (7, "helper itself")] {
            let e = p.check_act(&caller(0), &target(pid, 0), 7).unwrap_err();
            assert!(e.contains(needle), "{e}");
        }
        let kthread = Target {
            kernel_thread: true,
            ..target(2, 0)
        };
        assert!(
            p.check_act(&caller(0), &kthread, 7)
                .unwrap_err()
                .contains("kernel thread")
        );
        // Querying pid 1 is root's right; acting on it is nobody's.
        assert!(p.check_query(&caller(0), &target(1, 0)).is_ok());
    }

    #[test]
    fn grants_extend_the_default() {
        let p = parse(
            "[[grant]]\nuid = 1000\nuids = [1001, 1002]\n\n[[grant]]\nuid = 1000\nuids = [1003]\n",
        )
        .unwrap();
        for uid in [1000, 1001, 1002, 1003] {
            assert!(
                p.check_act(&caller(1000), &target(50, uid), 7).is_ok(),
                "{uid}"
            );
        }
        assert!(p.check_act(&caller(1000), &target(50, 1004), 7).is_err());
        assert!(p.check_act(&caller(1001), &target(50, 1000), 7).is_err());
        assert!(p.describe().contains("uid 1000 → uids 1001,1002,1003"));
        assert_eq!(parse("").unwrap().grants.len(), 0);
    }

    #[test]
    fn bad_policies_name_line_and_key() {
        let cases = [
            (
                "[[grant]]\nuid = 1\nuids = [2]\nagents = [\"x\"]\n",
                4,
                "grant 1: key `agents`: unknown key",
            ),
            ("allow = 1\n", 1, "key `allow`: unknown key"),
            ("grant = 1\n", 1, "key `grant`: expected an array of tables"),
            (
                "[[grant]]\nuid = \"bob\"\nuids = []\n",
                2,
                "key `uid`: expected a uid",
            ),
            (
                "[[grant]]\nuid = 1\nuids = [-1]\n",
                3,
                "uid -1 out of range",
            ),
            (
                "[[grant]]\nuid = 1\nuids = [4294967295]\n",
                3,
                "out of range",
            ),
            (
                "[[grant]]\nuid = 1\nuids = 2\n",
                3,
                "expected an array of uids",
            ),
            ("[[grant]]\nuid = 1\n", 1, "grant 1: missing key `uids`"),
            (
                "[[grant]]\nuid = 1\nuids = [2]\n[[grant]]\nuids = [2]\n",
                4,
                "grant 2: missing key `uid`",
            ),
            ("[[grant]\n", 1, "bad TOML"),
        ];
        for (text, line, needle) in cases {
            let e = parse(text).unwrap_err();
            let PolicyError::Invalid { line: got, .. } = &e else {
                panic!("{text:?}: {e}")
            };
            assert_eq!(*got, line, "{text:?}: {e}");
            let msg = e.to_string();
            assert!(
                msg.starts_with(&format!("/etc/selfheal/helper.toml:{line}: ")),
                "{msg}"
            );
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        }
    }

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
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let dir = TempDir::new("trust");
        let file = dir.0.join("helper.toml");
        std::fs::write(&file, "[[grant]]\nuid = 1000\nuids = [1001]\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let p = Policy::load(Some(&file), euid).unwrap();
        assert_eq!(p.grants[&1000], BTreeSet::from([1001]));

        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o664)).unwrap();
        let e = Policy::load(Some(&file), euid).unwrap_err().to_string();
        assert!(e.contains("writable by group or others (mode 0664)"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();

        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Policy::load(Some(&file), euid).unwrap_err().to_string();
        assert!(
            e.contains("is writable by group or others (mode 0777)"),
            "{e}"
        );
        std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();

        if euid == 0 {
            // Owned by nobody: refused when the helper runs as root.
            std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
            let e = Policy::load(Some(&file), 0).unwrap_err().to_string();
            assert!(e.contains("owned by uid 65534, not root"), "{e}");
            std::os::unix::fs::chown(&file, Some(0), Some(0)).unwrap();
        }

        // A named file must exist; the default one may be missing.
        let missing = dir.0.join("missing.toml");
        assert!(matches!(
            Policy::load(Some(&missing), euid),
            Err(PolicyError::Read { .. })
        ));
        // A symlink is followed to the real file, whose checks apply.
        let link = dir.0.join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(Policy::load(Some(&link), euid).is_ok());
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
