//! What the runtimes said: each container they list, by id, with its
//! init pid where the check needs it, and each source's failure; the
//! identity and pod of a process's containers, and the gaps to report.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use selfheal_core::{
    cgroup::CgroupContainer,
    runtime::{ContainerInfo, Identity, Runtime, confirm_pod},
};

use super::{Sources, bundle, docker};

/// The most containers whose init pid one check asks a runtime for (the
/// containers of the processes the rules look at; more stay unverified).
const MAX_INSPECTED: usize = 256;
/// How many of those questions are asked at once.
const INSPECT_WORKERS: usize = 8;

/// What one source could not give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    /// `docker /var/run/docker.sock`, `containerd /run/containerd`.
    pub source: String,
    pub error: String,
    /// The runtime is not there at all (no socket): worth saying only when
    /// a container went unnamed.
    pub absent: bool,
}

/// The containers the runtimes told of, by id, and what they could not.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    by_id: HashMap<String, (Runtime, ContainerInfo)>,
    pub errors: Vec<SourceError>,
    /// Whose runtimes were asked: 0 the system's (root's check), else that
    /// user's own (rootless Podman): which containers they speak for
    /// ([`CgroupContainer::speaks_for`]).
    euid: u32,
}

impl Inventory {
    /// Asks Docker and Podman (in parallel, each within
    /// `sources.timeout`) for their running containers, and containerd's
    /// bundles for the ids in `wanted` no API answered for.
    pub fn read(sources: &Sources, wanted: &[CgroupContainer]) -> Inventory {
        let mut inv = Inventory::default().for_user(crate::sys::creds::euid());
        let apis = [
            (Runtime::Docker, &sources.docker),
            (Runtime::Podman, &sources.podman),
        ];
        let answers: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = apis
                .iter()
                .map(|(rt, path)| {
                    let timeout = sources.timeout;
                    (*rt, *path, s.spawn(move || docker::list(path, timeout)))
                })
                .collect();
            handles
                .into_iter()
                .map(|(rt, path, h)| {
                    let r = h.join().unwrap_or_else(|_| {
                        Err(selfheal_core::runtime::docker::Error::Other(
                            "the client panicked".into(),
                        ))
                    });
                    (rt, path, r)
                })
                .collect()
        });
        for (rt, path, answer) in answers {
            match answer {
                Ok(list) => {
                    for c in list {
                        inv.by_id.entry(c.id.clone()).or_insert((rt, c));
                    }
                    inv.read_init_pids(rt, path, sources.timeout, wanted);
                }
                Err(e) => inv.errors.push(SourceError {
                    source: format!("{rt} {}", path.display()),
                    absent: e.is_absent(),
                    error: e.to_string(),
                }),
            }
        }
        let missing: Vec<&str> = wanted
            .iter()
            .filter(|c| !inv.by_id.contains_key(&c.id))
            .map(|c| c.id.as_str())
            .collect();
        if !missing.is_empty() {
            let (found, errors) = bundle::read(&sources.containerd_state, &missing);
            for c in found {
                inv.by_id
                    .entry(c.id.clone())
                    .or_insert((Runtime::Containerd, c));
            }
            inv.errors
                .extend(errors.into_iter().map(|(error, absent)| SourceError {
                    source: format!("containerd {}", sources.containerd_state.display()),
                    error,
                    absent,
                }));
        }
        inv
    }

    /// Asks the runtime at `socket` for the init pid (`State.Pid`) of each
    /// container in `wanted` it listed (in parallel, each within `timeout`):
    /// what a process's identity is verified against. One it cannot tell
    /// stays `None` (and its processes unverified).
    fn read_init_pids(
        &mut self,
        runtime: Runtime,
        socket: &std::path::Path,
        timeout: Duration,
        wanted: &[CgroupContainer],
    ) {
        let ids: Vec<String> = wanted
            .iter()
            .filter(|c| self.by_id.get(&c.id).is_some_and(|(rt, _)| *rt == runtime))
            .map(|c| c.id.clone())
            .take(MAX_INSPECTED)
            .collect();
        let workers = ids.len().min(INSPECT_WORKERS);
        let ids = &ids;
        let pids: Vec<(String, Option<u32>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    s.spawn(move || {
                        ids.iter()
                            .skip(w)
                            .step_by(workers)
                            .map(|id| {
                                let pid = docker::inspect(socket, id, timeout)
                                    .ok()
                                    .map(|st| st.pid)
                                    .filter(|p| *p > 0);
                                (id.clone(), pid)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().ok())
                .flatten()
                .collect()
        });
        for (id, pid) in pids {
            if let Some((_, info)) = self.by_id.get_mut(&id) {
                info.init_pid = pid;
            }
        }
    }

    /// An inventory of the given containers (for fixtures), from the
    /// system's runtimes.
    pub fn from_containers(containers: Vec<(Runtime, ContainerInfo)>) -> Inventory {
        Inventory {
            by_id: containers
                .into_iter()
                .map(|(rt, c)| (c.id.clone(), (rt, c)))
                .collect(),
            errors: Vec::new(),
            euid: 0,
        }
    }

    /// The same answers, as `euid`'s runtimes gave them (0: the system's).
    pub fn for_user(mut self, euid: u32) -> Inventory {
        self.euid = euid;
        self
    }

    /// The init pid the runtime reported for container `id`: `None` when no
    /// runtime lists it, `Some(None)` when one does but told no pid.
    pub fn init_pid(&self, id: &str) -> Option<Option<u32>> {
        self.by_id.get(id).map(|(_, info)| info.init_pid)
    }

    /// The identity of a process in the containers `chain` (outermost
    /// first) that these runtimes speak for (the chain up to the first
    /// container in a user's delegated tree other than their own user's:
    /// for the system's runtimes, up to any user's): the innermost of those
    /// a runtime knows, else the innermost. `None` when there is none.
    ///
    /// Its pod is the one its runtime names only where the uid is its
    /// cgroup's pod ([`confirm_pod`]); else it has none, and says why
    /// ([`Identity::pod_refused`]).
    pub fn identity(&self, chain: &[CgroupContainer]) -> Option<Identity> {
        let ours = chain
            .iter()
            .position(|c| !c.speaks_for(self.euid))
            .unwrap_or(chain.len());
        let chain = &chain[..ours];
        let known = chain.iter().rev().find(|c| self.by_id.contains_key(&c.id));
        let c = known.or_else(|| chain.last())?;
        let mut id = Identity {
            runtime: c.runtime,
            id: c.id.clone(),
            name: None,
            image: None,
            pod: None,
            namespace: None,
            pod_uid: c.pod_uid.clone(),
            labels: BTreeMap::new(),
            resolved: false,
            pod_refused: None,
        };
        if let Some((rt, info)) = self.by_id.get(&c.id) {
            id.runtime = *rt;
            id.name = info.name.clone();
            id.image = info.image.clone();
            match confirm_pod(&info.pod, c.pod_uid.as_deref()) {
                Ok(pod) => {
                    id.pod = pod.as_ref().and_then(|p| p.name.clone());
                    id.namespace = pod.and_then(|p| p.namespace);
                }
                Err(why) => id.pod_refused = Some(why),
            }
            id.labels = info.labels.clone();
            id.resolved = true;
        }
        Some(id)
    }

    /// The identities of `containers` one by one (each a chain of one; a
    /// nested container counts once per level).
    pub fn identities_of(&self, containers: &[CgroupContainer]) -> Vec<Identity> {
        containers
            .iter()
            .filter_map(|c| self.identity(std::slice::from_ref(c)))
            .collect()
    }

    /// The gaps to report for an agent with these containers: each one no
    /// runtime answered for (with why every source failed), else every
    /// source that failed other than by being absent, when the agent has
    /// containers or `always` (its rule needs the runtimes).
    pub fn gaps(&self, identities: &[Identity], always: bool) -> Vec<String> {
        let unresolved: Vec<&Identity> = identities.iter().filter(|i| !i.resolved).collect();
        let mut gaps = Vec::new();
        let errors = |all: bool| -> Vec<String> {
            self.errors
                .iter()
                .filter(|e| all || !e.absent)
                .map(|e| format!("{}: {}", e.source, e.error))
                .collect()
        };
        for i in &unresolved {
            let why = errors(true);
            gaps.push(format!(
                "container {} ({} by its cgroup): name, image and labels unknown: {}",
                i.short_id(),
                i.runtime,
                if why.is_empty() {
                    "no runtime lists it".to_string()
                } else {
                    why.join("; ")
                }
            ));
        }
        if unresolved.is_empty() && (always || !identities.is_empty()) {
            gaps.extend(
                errors(false)
                    .into_iter()
                    .map(|e| format!("container runtime {e}")),
            );
        }
        gaps
    }
}
