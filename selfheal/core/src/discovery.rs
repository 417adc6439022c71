//! What finding a config's agents must read of the host, from their rules
//! alone: [`Reads::of`]. Pure; the edge (`selfheal::agents`) follows it.
//!
//! A `pid` or `pidfile` rule names its process, a `unit` rule its unit's
//! cgroup (whose `cgroup.procs` lists its processes): none of them needs
//! to look at a process it does not name. A `cmdline` or `exe` rule must
//! look at every process of the uids its `match.uid` admits (the owner of
//! `/proc/PID`, read without opening it), and at no other's command line
//! or executable; one that admits any uid looks at every process. A
//! `container` rule looks at every process's cgroup (which containers run
//! is the cgroups'). Descendants are an agent's whoever runs them, so
//! they are found from the agent's processes, not by their uid.

use std::collections::BTreeSet;

use crate::config::{AgentConfig, MatchRule};

/// Whose processes a rule may pick by what it reads of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Uids {
    /// Of any uid.
    Any,
    /// Of these uids only.
    Only(BTreeSet<u32>),
}

impl Uids {
    /// Whether a process of `uid` (`None`: unknown) may be picked.
    pub fn admit(&self, uid: Option<u32>) -> bool {
        match self {
            Uids::Any => true,
            Uids::Only(set) => uid.is_some_and(|u| set.contains(&u)),
        }
    }

    fn add(this: &mut Option<Uids>, filter: Option<u32>) {
        *this = match (this.take(), filter) {
            (_, None) | (Some(Uids::Any), _) => Some(Uids::Any),
            (None, Some(u)) => Some(Uids::Only(BTreeSet::from([u]))),
            (Some(Uids::Only(mut set)), Some(u)) => {
                set.insert(u);
                Some(Uids::Only(set))
            }
        };
    }
}

/// What discovering some agents reads, by their rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reads {
    /// Some `pid` or `pidfile` rule: the processes they name.
    pub named: bool,
    /// Some `unit` rule: the `cgroup.procs` of its units' cgroups, and the
    /// cgroup of each process listed there.
    pub units: bool,
    /// Whose command lines `cmdline` rules read (`None`: no such rule).
    pub cmdlines: Option<Uids>,
    /// Whose executables `exe` rules read (`None`: no such rule).
    pub exes: Option<Uids>,
    /// Some `container` rule: every process's cgroup.
    pub containers: bool,
}

impl Reads {
    /// What `agents`' rules read when selfheal runs as `runner` (each
    /// rule's uid by [`AgentConfig::uid_filter`]).
    pub fn of<'a>(agents: impl IntoIterator<Item = &'a AgentConfig>, runner: u32) -> Reads {
        let mut reads = Reads::default();
        for agent in agents {
            match &agent.rule {
                MatchRule::Pid(_) | MatchRule::Pidfile(_) => reads.named = true,
                MatchRule::Unit(_) => reads.units = true,
                MatchRule::Cmdline(_) => Uids::add(&mut reads.cmdlines, agent.uid_filter(runner)),
                MatchRule::Exe(_) => Uids::add(&mut reads.exes, agent.uid_filter(runner)),
                MatchRule::Container(_) => reads.containers = true,
            }
        }
        reads
    }

    /// Whether some rule must look at every process of the host (list
    /// `/proc`): a `cmdline`, `exe` or `container` rule.
    pub fn lists_host(&self) -> bool {
        self.cmdlines.is_some() || self.exes.is_some() || self.containers
    }

    /// Whether the owner of each listed process is read: a `cmdline` or
    /// `exe` rule (whose uid limits it, and whose reads are accounted per
    /// uid).
    pub fn uids(&self) -> bool {
        self.cmdlines.is_some() || self.exes.is_some()
    }

    /// Whether a process of `uid` has its command line read.
    pub fn cmdline_of(&self, uid: Option<u32>) -> bool {
        self.cmdlines.as_ref().is_some_and(|u| u.admit(uid))
    }

    /// Whether a process of `uid` has its executable read.
    pub fn exe_of(&self, uid: Option<u32>) -> bool {
        self.exes.as_ref().is_some_and(|u| u.admit(uid))
    }

    /// Whether a process of `uid` may be picked by what is read of it
    /// (its command line or executable): one the rules then read in full.
    pub fn picks(&self, uid: Option<u32>) -> bool {
        self.cmdline_of(uid) || self.exe_of(uid)
    }
}

/// How an agent's descendants are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Descent {
    /// From each of its processes' threads' `task/TID/children`: cheaper
    /// than one `stat` of every process of the host.
    Children,
    /// From the `stat` of every process (its parent): the kernel has no
    /// `children` files, or the agents' threads outnumber the host's
    /// processes.
    Walk,
}

/// How to find descendants when the kernel has `children` files
/// (`children`), the agents' processes found so far have `threads`
/// threads together, and the host has `host` processes: one read per
/// thread against one per process of the host.
pub fn descent(children: bool, threads: u64, host: usize) -> Descent {
    if children && threads < host as u64 {
        Descent::Children
    } else {
        Descent::Walk
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::path::Path;

    fn reads(rules: &[&str], runner: u32) -> Reads {
        let text: String = rules
            .iter()
            .enumerate()
            .map(|(i, r)| format!("[[agent]]\nname = \"a{i}\"\nmatch = {{ {r} }}\n"))
            .collect();
        let c = Config::parse(&text, Path::new("/etc/selfheal/t.toml")).expect("config");
        Reads::of(&c.agents, runner)
    }

    fn only(uids: &[u32]) -> Option<Uids> {
        Some(Uids::Only(uids.iter().copied().collect()))
    }

    /// Which rules read what: pid, pidfile and unit rules list no host;
    /// cmdline and exe rules read the uids they may match (the runner's
    /// unless `uid` says otherwise, every uid for `"any"`); a container
    /// rule every process's cgroup.
    #[test]
    fn each_rule_reads_what_it_picks_by() {
        for (rules, runner, expected, lists) in [
            (
                &["pid = 10", "pidfile = \"/run/x.pid\""][..],
                1000,
                Reads {
                    named: true,
                    ..Reads::default()
                },
                false,
            ),
            (
                &["unit = \"x.service\"", "pid = 3"],
                0,
                Reads {
                    named: true,
                    units: true,
                    ..Reads::default()
                },
                false,
            ),
            (
                &["cmdline = \"sol\""],
                1000,
                Reads {
                    cmdlines: only(&[1000]),
                    ..Reads::default()
                },
                true,
            ),
            (
                &[
                    "cmdline = \"sol\", uid = 7",
                    "cmdline = \"x\"",
                    "exe = \"/x\"",
                ],
                0,
                Reads {
                    cmdlines: only(&[0, 7]),
                    exes: only(&[0]),
                    ..Reads::default()
                },
                true,
            ),
            (
                &[
                    "cmdline = \"sol\", uid = 7",
                    "cmdline = \"x\", uid = \"any\"",
                ],
                0,
                Reads {
                    cmdlines: Some(Uids::Any),
                    ..Reads::default()
                },
                true,
            ),
            (
                &["exe = \"/x\", uid = \"any\"", "exe = \"/y\", uid = 5"],
                0,
                Reads {
                    exes: Some(Uids::Any),
                    ..Reads::default()
                },
                true,
            ),
            (
                &["container = \"web\""],
                0,
                Reads {
                    containers: true,
                    ..Reads::default()
                },
                true,
            ),
        ] {
            let r = reads(rules, runner);
            assert_eq!(r, expected, "{rules:?}");
            assert_eq!(r.lists_host(), lists, "{rules:?}");
            assert_eq!(r.uids(), r.cmdlines.is_some() || r.exes.is_some());
        }
    }

    /// A process is read in full by what it runs only where a rule admits
    /// its uid; an unknown uid only where any uid is admitted.
    #[test]
    fn a_uid_admits_only_its_processes() {
        let r = reads(&["cmdline = \"sol\", uid = 7", "exe = \"/x\""], 0);
        for (uid, cmdline, exe) in [
            (Some(7), true, false),
            (Some(0), false, true),
            (Some(8), false, false),
            (None, false, false),
        ] {
            assert_eq!(
                (r.cmdline_of(uid), r.exe_of(uid)),
                (cmdline, exe),
                "{uid:?}"
            );
            assert_eq!(r.picks(uid), cmdline || exe, "{uid:?}");
        }
        let any = reads(&["cmdline = \"sol\", uid = \"any\""], 0);
        assert!(any.picks(None) && any.picks(Some(4242)));
        assert!(!reads(&["pid = 1"], 0).picks(Some(0)));
    }

    /// Children files only where the kernel has them, and only while they
    /// are fewer reads than one per process of the host.
    #[test]
    fn descendants_come_from_the_cheaper_read() {
        for (children, threads, host, expected) in [
            (true, 10, 300, Descent::Children),
            (true, 299, 300, Descent::Children),
            (true, 300, 300, Descent::Walk),
            (true, 5_000, 300, Descent::Walk),
            (false, 1, 300, Descent::Walk),
            (true, 0, 0, Descent::Walk),
        ] {
            assert_eq!(
                descent(children, threads, host),
                expected,
                "{children} {threads} {host}"
            );
        }
    }
}
