//! Who may query and act on which process: the helper's authorization
//! rules and its policy file's shape and validation (file:line:key
//! errors). Reading the file, refusing one that a non-trusted user could
//! have written, and reading a target's identity from procfs are the
//! helper's (`selfheal::helper::access::policy`).
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

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::Range,
    path::{Path, PathBuf},
};

use toml::de::{DeTable, DeValue};

use crate::{
    config::walk::{Cx, Invalid, Value},
    protocol::Caller,
};

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
pub struct TargetProcess {
    pub pid: u32,
    /// Real, effective and saved uid.
    pub uids: [u32; 3],
    pub kernel_thread: bool,
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
    pub fn check_query(&self, caller: &Caller, target: &TargetProcess) -> Result<(), String> {
        self.check_reach(caller, target, "query")
    }

    /// Whether `caller` may reach every uid of `target`; `verb` names what
    /// it may not do in the refusal.
    fn check_reach(
        &self,
        caller: &Caller,
        target: &TargetProcess,
        verb: &str,
    ) -> Result<(), String> {
        match target
            .uids
            .iter()
            .find(|uid| !self.may_reach(caller.uid, **uid))
        {
            None => Ok(()),
            Some(uid) => Err(format!(
                "uid {} may not {verb} pid {} (a process of uid {uid})",
                caller.uid, target.pid
            )),
        }
    }

    /// Whether `caller` may act on `target`; `helper_pid` is the helper's own.
    pub fn check_act(
        &self,
        caller: &Caller,
        target: &TargetProcess,
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
        self.check_reach(caller, target, "act on")
    }

    /// Validates policy `text`; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Policy, PolicyError> {
        let cx = Cx::<PolicyError>::new(text, path);
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

/// One `[[grant]]` table at `span`: the caller's uid and the uids it may reach.
fn grant(
    cx: &Cx<'_, PolicyError>,
    scope: &str,
    t: &DeTable<'_>,
    span: Range<usize>,
) -> Result<(u32, Vec<u32>), PolicyError> {
    let mut uid = None;
    let mut uids = None;
    for (key, value) in t.iter() {
        let name: &str = key.get_ref().as_ref();
        match name {
            "uid" => uid = Some(uid_value(cx, scope, name, value)?),
            "uids" => {
                let DeValue::Array(items) = value.get_ref() else {
                    return Err(cx.type_error(scope, name, value, "an array of uids"));
                };
                let mut list = Vec::new();
                for item in items.iter() {
                    list.push(uid_value(cx, scope, name, item)?);
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

/// A uid: an integer from 0 to 2^32 - 2 (`(uid_t) -1` is no uid).
fn uid_value(
    cx: &Cx<'_, PolicyError>,
    scope: &str,
    key: &str,
    v: &Value<'_>,
) -> Result<u32, PolicyError> {
    let DeValue::Integer(i) = v.get_ref() else {
        return Err(cx.type_error(scope, key, v, "a uid (an integer)"));
    };
    i64::from_str_radix(i.as_str(), i.radix())
        .ok()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n != u32::MAX)
        .ok_or_else(|| {
            cx.key_error(
                scope,
                key,
                v.span(),
                format!("uid {} out of range (0 to {})", i.as_str(), u32::MAX - 1),
            )
        })
}

impl Invalid for PolicyError {
    fn invalid(path: &Path, line: usize, column: usize, message: String) -> Self {
        PolicyError::Invalid {
            path: path.to_path_buf(),
            line,
            column,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(uid: u32) -> Caller {
        Caller {
            uid,
            gid: uid,
            pid: 4242,
        }
    }

    fn target(pid: u32, uid: u32) -> TargetProcess {
        TargetProcess {
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
        let setuid = TargetProcess {
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
        let kthread = TargetProcess {
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

    #[test]
    fn a_duplicate_key_is_named() {
        let e = parse("[[grant]]\nuid = 1\nuid = 2\nuids = [2]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/selfheal/helper.toml:3: bad TOML: ") && e.ends_with("`uid`"),
            "{e}"
        );
    }
}
