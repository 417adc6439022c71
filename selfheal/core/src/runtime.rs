//! A container as every output names it, and the `match` rules on it: the
//! plain types, and the parsers of what the runtimes answer ([`docker`],
//! [`bundle`]). Reading cgroups and asking the runtimes is the I/O edge
//! (`selfheal::runtime`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod bundle;
pub mod docker;

/// The runtime a container's cgroup names, as far as the path tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    Docker,
    Podman,
    Containerd,
    Crio,
    /// A Kubernetes pod's container under the cgroupfs driver
    /// (`/kubepods/…/pod<uid>/<id>`): the CRI runtime is not in the path.
    Cri,
    /// A bare 64-hex id under a parent no runtime above is known by (as
    /// `ctr`'s `/<namespace>/<id>`).
    Unknown,
}

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Podman => "podman",
            Runtime::Containerd => "containerd",
            Runtime::Crio => "crio",
            Runtime::Cri => "cri",
            Runtime::Unknown => "unknown",
        }
    }
}

display_as_str!(Runtime);

/// A process's container as every output shows it: what the cgroup gives,
/// and what a runtime added (`None` where no runtime answered).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// The runtime that answered for it, else the one its cgroup names.
    pub runtime: Runtime,
    pub id: String,
    pub name: Option<String>,
    pub image: Option<String>,
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub pod_uid: Option<String>,
    /// Matched by `label`; not printed (label values are the operator's and
    /// may be long or hold anything).
    #[serde(skip)]
    pub labels: BTreeMap<String, String>,
    /// Whether a runtime answered for it (else only the cgroup spoke).
    #[serde(skip)]
    pub resolved: bool,
}

impl Identity {
    /// The first 12 digits of the id, as `docker ps` shows it.
    pub fn short_id(&self) -> &str {
        &self.id[..self.id.len().min(12)]
    }

    /// `NAME (ID12, docker, image IMAGE, pod NS/POD)` for people, one line
    /// (what a runtime said is escaped where it holds control characters).
    pub fn describe(&self) -> String {
        let mut s = match &self.name {
            Some(n) => format!(
                "{} ({}, {}",
                crate::text::escape(n),
                self.short_id(),
                self.runtime
            ),
            None => format!("{} ({}", self.short_id(), self.runtime),
        };
        if let Some(i) = &self.image {
            s.push_str(&format!(", image {}", crate::text::escape(i)));
        }
        match (&self.namespace, &self.pod) {
            (Some(ns), Some(p)) => s.push_str(&format!(
                ", pod {}/{}",
                crate::text::escape(ns),
                crate::text::escape(p)
            )),
            (None, Some(p)) => s.push_str(&format!(", pod {}", crate::text::escape(p))),
            _ => {}
        }
        if !self.resolved {
            s.push_str(", no runtime answered for it");
        }
        s.push(')');
        s
    }
}

/// A glob: `*` any run of characters, `?` one; everything else literal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Glob(pub String);

impl Glob {
    pub fn matches(&self, text: &str) -> bool {
        glob_match(self.0.as_bytes(), text.as_bytes())
    }

    /// Whether the pattern has no wildcard.
    pub fn is_literal(&self) -> bool {
        !self.0.contains(['*', '?'])
    }
}

/// Iterative glob with one backtrack point: linear in practice, never
/// exponential.
pub fn glob_match(p: &[u8], t: &[u8]) -> bool {
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == b'?' || (p[pi] != b'*' && p[pi] == t[ti])) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// A `match` rule on container identity (`container`, `image`, `label`,
/// `pod`, `namespace`): every key given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerRule {
    /// The container's name, or its id (a literal of 12 to 64 hex digits is
    /// an id prefix).
    pub container: Option<Glob>,
    pub image: Option<Glob>,
    /// `key=value` pairs, compared exactly.
    pub labels: Vec<(String, String)>,
    pub pod: Option<Glob>,
    pub namespace: Option<Glob>,
}

impl ContainerRule {
    pub fn matches(&self, id: &Identity) -> bool {
        let opt = |g: &Option<Glob>, v: &Option<String>| match g {
            None => true,
            Some(g) => v.as_deref().is_some_and(|v| g.matches(v)),
        };
        let container = match &self.container {
            None => true,
            Some(g) => {
                let p = &g.0;
                let id_prefix = g.is_literal()
                    && p.len() >= 12
                    && p.bytes().all(|b| b.is_ascii_hexdigit())
                    && id.id.starts_with(&p.to_ascii_lowercase());
                id_prefix || g.matches(&id.id) || id.name.as_deref().is_some_and(|n| g.matches(n))
            }
        };
        container
            && opt(&self.image, &id.image)
            && opt(&self.pod, &id.pod)
            && opt(&self.namespace, &id.namespace)
            && self
                .labels
                .iter()
                .all(|(k, v)| id.labels.get(k).is_some_and(|have| have == v))
    }
}

impl std::fmt::Display for ContainerRule {
    /// As written in the config: `container = "x*", label = ["app=runner"]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (key, g) in [
            ("container", &self.container),
            ("image", &self.image),
            ("pod", &self.pod),
            ("namespace", &self.namespace),
        ] {
            if let Some(g) = g {
                parts.push(format!("{key} = {:?}", g.0));
            }
        }
        match self.labels.as_slice() {
            [] => {}
            [(k, v)] => parts.push(format!("label = {:?}", format!("{k}={v}"))),
            many => {
                let l: Vec<String> = many
                    .iter()
                    .map(|(k, v)| format!("{:?}", format!("{k}={v}")))
                    .collect();
                parts.push(format!("label = [{}]", l.join(", ")));
            }
        }
        f.write_str(&parts.join(", "))
    }
}

/// What a runtime says about one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    /// Without Docker's leading `/`.
    pub name: Option<String>,
    pub image: Option<String>,
    /// Labels (Docker, Podman) or OCI annotations (containerd bundles).
    pub labels: BTreeMap<String, String>,
    /// The container's init process as the runtime reports it (`State.Pid`
    /// for Docker and Podman, the task's `init.pid` for containerd), in the
    /// runtime's pid namespace; `None` where it reported none.
    pub init_pid: Option<u32>,
}
