//! Which processes a rule names: by pid, pidfile, command line, executable,
//! unit or container, with their descendants; and the re-check right before
//! an act that a unit's process is still in its unit.

use super::*;

/// The processes a rule found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Matched {
    /// The processes the rule names (for `cmdline`, `exe` and `unit`: those
    /// whose parent is not matched too), sorted.
    pub roots: Vec<u32>,
    /// The roots and every descendant, sorted, deduplicated.
    pub all: Vec<u32>,
    /// Why nothing (or not what was asked) was found: a pidfile that cannot
    /// be read or holds no pid, a pid that is not running, no process
    /// matching.
    pub problem: Option<String>,
}

impl Matched {
    pub(super) fn problem(problem: String) -> Matched {
        Matched {
            problem: Some(problem),
            ..Matched::default()
        }
    }

    pub(super) fn of_roots(
        table: &ProcessTable,
        roots: Vec<u32>,
        none: impl FnOnce() -> String,
    ) -> Matched {
        if roots.is_empty() {
            return Matched::problem(none());
        }
        Matched {
            all: table.with_descendants(&roots),
            roots,
            problem: None,
        }
    }
}

/// The processes of `table` that `rule` picks, with their descendants.
/// Reads the pidfile of a `pidfile` rule and resolves the symlinks of an
/// `exe` rule's path; the rest is pure.
pub fn find(rule: &MatchRule, table: &ProcessTable) -> Matched {
    find_of(rule, None, table)
}

/// The processes of `agent` when selfheal runs as `runner`: its rule,
/// limited to `match.uid` ([`AgentConfig::uid_filter`]) and, for a unit,
/// to the managers it may name ([`AgentConfig::unit_owner`]).
pub fn find_for(agent: &AgentConfig, runner: u32, table: &ProcessTable) -> Matched {
    find_owned(
        &agent.rule,
        agent.uid_filter(runner),
        agent.unit_owner(runner),
        table,
    )
}

/// [`find`], limited for `cmdline` and `exe` rules to the processes of
/// `uid` when one is given ([`selfheal_core::config::MatchUid::filter`]). When
/// nothing of `uid` matches but processes of other uids would, the problem
/// says how many and how to include them.
pub fn find_of(rule: &MatchRule, uid: Option<u32>, table: &ProcessTable) -> Matched {
    find_owned(rule, uid, UnitOwner::System, table)
}

/// [`find_of`], with a unit rule naming units of `owner`.
pub(super) fn find_owned(
    rule: &MatchRule,
    uid: Option<u32>,
    owner: UnitOwner,
    table: &ProcessTable,
) -> Matched {
    let Some(uid) = uid else {
        return find_any(rule, owner, table, &|_| true);
    };
    let mut m = find_any(rule, owner, table, &|e| e.uid == Some(uid));
    if let Some(problem) = &m.problem {
        let others = find_any(rule, owner, table, &|e| e.uid != Some(uid));
        if !others.roots.is_empty() {
            m.problem = Some(format!(
                "{problem} (uid {uid}'s processes only; {} process(es) of other uids match: \
                 set match.uid to their uid, or \"any\", to include them)",
                others.roots.len()
            ));
        }
    }
    m
}

/// `rule`'s processes among those `keep` allows (descendants are the
/// agent's whoever they run as).
pub(super) fn find_any(
    rule: &MatchRule,
    owner: UnitOwner,
    table: &ProcessTable,
    keep: &dyn Fn(&ProcEntry) -> bool,
) -> Matched {
    match rule {
        MatchRule::Pid(pid) => by_pid(table, *pid, |pid| format!("pid {pid} is not running")),
        MatchRule::Pidfile(path) => match read_pidfile(path) {
            Ok(pid) => by_pid(table, pid, |pid| {
                format!("pidfile {}: pid {pid} is not running", path.display())
            }),
            Err(problem) => Matched::problem(problem.to_string()),
        },
        MatchRule::Cmdline(re) => {
            let matched = table
                .entries()
                .filter(|e| !e.cmdline.is_empty() && !table.is_own(e.pid) && keep(e))
                .filter(|e| re.is_match(&e.cmdline.join(" ")))
                .map(|e| e.pid)
                .collect();
            Matched::of_roots(table, table.tops(&matched), || {
                format!("no process's command line matches {:?}", re.as_str())
            })
        }
        MatchRule::Exe(path) => {
            let mut paths = vec![path.clone()];
            if let Ok(real) = std::fs::canonicalize(path)
                && real != *path
            {
                paths.push(real);
            }
            by_exe(table, &paths, keep)
        }
        MatchRule::Container(rule) => by_container(table, rule),
        MatchRule::Unit(unit) => {
            let matched = table
                .entries()
                .filter(|e| !table.is_own(e.pid))
                .filter(|e| {
                    table
                        .unit_of(e.pid)
                        .is_some_and(|p| in_owned_unit(p, unit, owner))
                })
                .map(|e| e.pid)
                .collect();
            Matched::of_roots(table, table.tops(&matched), || {
                let mut p = format!("{owner} {unit} has no processes");
                if table.entries().all(|e| e.cgroup.is_none()) {
                    p.push_str(" (no process's cgroup could be read)");
                } else {
                    // The same name elsewhere (another user's tree, below
                    // another unit) is not this unit: say so.
                    let elsewhere = table
                        .entries()
                        .filter(|e| e.cgroup.as_deref().is_some_and(|c| in_unit(c, unit)))
                        .count();
                    if elsewhere > 0 {
                        p.push_str(&format!(
                            " ({elsewhere} process(es) in cgroups named {unit} elsewhere: \
                             not that manager's unit)"
                        ));
                    }
                }
                p
            })
        }
    }
}

/// Whether a process in `place` is in unit `unit` of a manager `owner`
/// allows: its own unit, or (for the system's `user@UID.service`) anything
/// in that user's manager, which runs inside that system unit.
pub(super) fn in_owned_unit(place: cgroup::UnitPlace<'_>, unit: &str, owner: UnitOwner) -> bool {
    if place.unit == unit && owner.allows(place.manager) {
        return true;
    }
    match place.manager {
        cgroup::Manager::User(uid) => {
            owner.allows(cgroup::Manager::System) && unit == format!("user@{uid}.service")
        }
        cgroup::Manager::System => false,
    }
}

/// Why a unit agent's process is no longer the unit's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotInUnit {
    /// It exited, or its pid names another process now.
    #[error("pid {pid} is gone (it exited since it was matched)")]
    Gone { pid: u32 },
    #[error("the cgroup of pid {pid} cannot be read")]
    CgroupUnread { pid: u32 },
    /// It moved: `cgroup` (escaped) is where it is now.
    #[error("pid {pid} is no longer in {owner} {unit}: its cgroup is now {cgroup}")]
    Moved {
        pid: u32,
        owner: UnitOwner,
        unit: String,
        cgroup: String,
    },
}

/// The act-time re-check of a unit agent's identity: whether `pid`, the
/// process started at `start_ticks`, is in unit `unit` of a manager
/// `owner` allows right now (its cgroup read again, anchored below the
/// system manager's root read from PID 1's). `Err` says where it is
/// instead, or that it is gone.
pub fn still_in_unit(
    unit: &str,
    owner: UnitOwner,
    pid: u32,
    start_ticks: u64,
) -> Result<(), NotInUnit> {
    let root = cgroup::manager_root(cgroup_of(1).as_deref());
    let path = cgroup_of(pid);
    // Read after the cgroup: a cgroup read of another process under a
    // reused pid is caught here.
    if crate::sys::pidfd::start_ticks(pid) != Some(start_ticks) {
        return Err(NotInUnit::Gone { pid });
    }
    let Some(path) = path else {
        return Err(NotInUnit::CgroupUnread { pid });
    };
    match cgroup::unit_of(&path, &root) {
        Some(place) if in_owned_unit(place, unit, owner) => Ok(()),
        _ => Err(NotInUnit::Moved {
            pid,
            owner,
            unit: unit.to_string(),
            cgroup: text::escape(&path),
        }),
    }
}

/// The processes in the containers `rule` matches (monitors and shims
/// beside a container are outside its cgroup, so not among them).
pub(super) fn by_container(table: &ProcessTable, rule: &ContainerRule) -> Matched {
    let matched = table
        .entries()
        .filter(|e| !e.containers.is_empty() && !table.is_own(e.pid))
        .filter(|e| table.identity(e.pid).is_some_and(|i| rule.matches(i)))
        .map(|e| e.pid)
        .collect();
    Matched::of_roots(table, table.tops(&matched), || {
        let all = table.containers();
        let mut p = format!("no container matches {rule}");
        if all.is_empty() {
            p.push_str(" (no process is in a container)");
        } else {
            let ids = table.inventory.identities_of(&all);
            let unnamed = ids.iter().filter(|i| !i.resolved).count();
            p.push_str(&format!(" ({} container(s) running", ids.len()));
            if unnamed > 0 {
                p.push_str(&format!(", {unnamed} that no runtime answered for"));
                let errors: Vec<String> = table
                    .inventory
                    .errors
                    .iter()
                    .map(|e| format!("{}: {}", e.source, e.error))
                    .collect();
                if !errors.is_empty() {
                    p.push_str(&format!(": {}", errors.join("; ")));
                }
            }
            p.push(')');
            let no_pod: Vec<&Identity> = ids.iter().filter(|i| i.pod_refused.is_some()).collect();
            if let Some(first) = no_pod.first() {
                p.push_str(&format!(
                    "; {} container(s) are in no pod, though their runtime names one \
                     (container {}: {})",
                    no_pod.len(),
                    first.short_id(),
                    first.pod_refused.as_deref().unwrap_or_default()
                ));
            }
        }
        if let Some(first) = table.refused.values().next() {
            p.push_str(&format!(
                "; {} process(es) whose cgroup names a container were not taken for it ({first})",
                table.refused.len()
            ));
        }
        p
    })
}

pub(super) fn by_pid(
    table: &ProcessTable,
    pid: u32,
    missing: impl FnOnce(u32) -> String,
) -> Matched {
    let roots = if table.get(pid).is_some() {
        vec![pid]
    } else {
        Vec::new()
    };
    Matched::of_roots(table, roots, || missing(pid))
}

/// Processes whose executable is one of `paths` (the rule's path and its
/// canonical form). An executable replaced on disk (an upgrade) reads as
/// `PATH (deleted)` and still matches.
pub(super) fn by_exe(
    table: &ProcessTable,
    paths: &[PathBuf],
    keep: &dyn Fn(&ProcEntry) -> bool,
) -> Matched {
    let is_target = |exe: &Path| {
        let exe = exe
            .to_str()
            .and_then(|s| s.strip_suffix(" (deleted)"))
            .map_or(exe, Path::new);
        paths.iter().any(|p| p == exe)
    };
    let matched = table
        .entries()
        .filter(|e| !table.is_own(e.pid) && keep(e))
        .filter(|e| e.exe.as_deref().is_some_and(is_target))
        .map(|e| e.pid)
        .collect();
    Matched::of_roots(table, table.tops(&matched), || {
        let mut p = format!("no process runs {}", paths[0].display());
        let unreadable = table
            .entries()
            .filter(|e| e.exe.is_none() && e.has_argv)
            .count();
        if unreadable > 0 {
            let plural = if unreadable == 1 { "" } else { "es" };
            p.push_str(&format!(
                " ({unreadable} process{plural} whose executable could not be read: \
                 selfheal may lack the privilege)"
            ));
        }
        p
    })
}

/// Largest pidfile read: a pid is a few bytes.
pub(super) const MAX_PIDFILE_BYTES: u64 = 4096;

/// Why a pidfile gave no pid. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum PidfileError {
    /// It could not be read (missing, no permission).
    #[error("cannot read pidfile {}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// It is a directory, a device, a FIFO.
    #[error("pidfile {} is not a regular file", path.display())]
    NotAFile { path: std::path::PathBuf },
    /// It holds no pid (why, as the core's `parse_pidfile` says).
    #[error("pidfile {}: {why}", path.display())]
    NoPid {
        path: std::path::PathBuf,
        why: String,
    },
}

/// Reads the pid in `path`. The error names the file.
pub fn read_pidfile(path: &Path) -> Result<u32, PidfileError> {
    let read = |source| PidfileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    if !meta.is_file() {
        return Err(PidfileError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PIDFILE_BYTES).read_to_end(&mut bytes))
        .map_err(read)?;
    parse_pidfile(&String::from_utf8_lossy(&bytes)).map_err(|why| PidfileError::NoPid {
        path: path.to_path_buf(),
        why,
    })
}

/// Asks the runtimes about the containers that matter, and attaches their
/// answer to `table`: every container in the table when `all` (some agent
/// has a container rule), else those of `pids` (the processes the other
/// rules picked, whose identity the outputs show). Without any, no runtime
/// is asked.
pub fn enrich(table: ProcessTable, pids: &[u32], all: bool, sources: &Sources) -> ProcessTable {
    let wanted: Vec<CgroupContainer> = if all {
        table.containers()
    } else {
        let mut set: Vec<CgroupContainer> = pids
            .iter()
            .filter_map(|p| table.get(*p))
            .flat_map(|e| e.containers.iter().cloned())
            .collect();
        set.sort();
        set.dedup();
        set
    };
    if wanted.is_empty() {
        return table;
    }
    let inventory = Inventory::read(sources, &wanted);
    table.with_inventory(inventory)
}

/// [`enrich`] for these agents: what their rules pick now.
pub fn enrich_for(table: ProcessTable, agents: &[&AgentConfig], sources: &Sources) -> ProcessTable {
    let all = agents
        .iter()
        .any(|a| matches!(a.rule, MatchRule::Container(_)));
    let euid = crate::sys::creds::euid();
    let pids: Vec<u32> = if all {
        Vec::new()
    } else {
        agents
            .iter()
            .flat_map(|a| crate::agents::find_for(a, euid, &table).all)
            .collect()
    };
    enrich(table, &pids, all, sources)
}
