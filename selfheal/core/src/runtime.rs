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
    /// Why the pod its runtime named is not taken ([`confirm_pod`]): the
    /// container then has no `pod` or `namespace`.
    #[serde(skip)]
    pub pod_refused: Option<String>,
}

/// The first 12 characters of a container id, as `docker ps` shows it
/// (an id is 64 hex digits wherever selfheal takes one; cut at a
/// character all the same, never inside one).
pub fn short_id(id: &str) -> &str {
    id.char_indices().nth(12).map_or(id, |(at, _)| &id[..at])
}

impl Identity {
    /// The first 12 digits of the id, as `docker ps` shows it.
    pub fn short_id(&self) -> &str {
        short_id(&self.id)
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
        if let Some(why) = &self.pod_refused {
            s.push_str(&format!(", no pod: {why}"));
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
    /// Labels (Docker, Podman), or the OCI annotations of a containerd
    /// bundle that its maker wrote (for a bundle the CRI made, only the
    /// CRI's own keys: [`bundle`]).
    pub labels: BTreeMap<String, String>,
    /// The pod the runtime says the container is in, from the keys that
    /// runtime itself writes (not yet confirmed: [`confirm_pod`]).
    pub pod: PodClaim,
    /// The container's init process as the runtime reports it (`State.Pid`
    /// for Docker and Podman, the task's `init.pid` for containerd), in the
    /// runtime's pid namespace; `None` where it reported none.
    pub init_pid: Option<u32>,
}

/// A container's pod as its runtime wrote it: for containerd's CRI its
/// `io.kubernetes.cri.sandbox-*` annotations, for the kubelet through
/// Docker (cri-dockerd) its `io.kubernetes.pod.*` labels. Not yet a pod:
/// [`confirm_pod`] holds it against the container's cgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodClaim {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
}

impl PodClaim {
    /// From `labels`, under the keys `namespace`, `name`, `uid` (an empty
    /// value is none).
    pub fn from_labels(
        labels: &BTreeMap<String, String>,
        [namespace, name, uid]: [&str; 3],
    ) -> PodClaim {
        let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
        PodClaim {
            namespace: get(namespace),
            name: get(name),
            uid: get(uid),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.namespace.is_none() && self.name.is_none() && self.uid.is_none()
    }

    /// `NS/NAME` (`?` for what is missing), escaped, for messages.
    fn describe(&self) -> String {
        let part = |v: &Option<String>| v.as_deref().map_or("?".into(), crate::text::escape);
        format!("{}/{}", part(&self.namespace), part(&self.name))
    }
}

/// The pod a container is taken for: its runtime's `claim` where the uid it
/// names is the pod of the container's own cgroup (`cgroup_uid`, from the
/// kubelet's `pod<uid>` cgroup that only root makes,
/// [`crate::cgroup::CgroupContainer::pod_uid`]); `Ok(None)` where the
/// runtime names no pod; an error saying why where the two disagree or
/// either is missing (the container then has no pod).
pub fn confirm_pod(claim: &PodClaim, cgroup_uid: Option<&str>) -> Result<Option<PodClaim>, String> {
    if claim.is_empty() {
        return Ok(None);
    }
    let pod = claim.describe();
    let Some(uid) = &claim.uid else {
        return Err(format!(
            "its runtime names pod {pod} without its uid, so its cgroup cannot confirm it"
        ));
    };
    let Some(cgroup_uid) = cgroup_uid else {
        return Err(format!(
            "its runtime names pod {pod} (uid {}), but its cgroup is in no pod's",
            crate::text::escape(uid)
        ));
    };
    if !uid.eq_ignore_ascii_case(cgroup_uid) {
        return Err(format!(
            "its runtime names pod {pod} with uid {}, but its cgroup is pod {cgroup_uid}'s",
            crate::text::escape(uid)
        ));
    }
    Ok(Some(claim.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "5c1b4b8e-2f0e-4a57-9d7a-0d6a1c3e9b11";
    const OTHER: &str = "0d6a1c3e-9b11-4a57-9d7a-5c1b4b8e2f0e";

    fn claim(ns: Option<&str>, name: Option<&str>, uid: Option<&str>) -> PodClaim {
        PodClaim {
            namespace: ns.map(str::to_string),
            name: name.map(str::to_string),
            uid: uid.map(str::to_string),
        }
    }

    /// A runtime's pod is taken only where its uid is the pod of the
    /// container's own cgroup; every other case says why it is not.
    #[test]
    fn a_pod_is_confirmed_by_its_cgroup() {
        let honest = claim(Some("agents"), Some("runner-0"), Some(UID));
        assert_eq!(confirm_pod(&honest, Some(UID)), Ok(Some(honest.clone())));
        // Runtimes write the uid as the API server gave it; the cgroup's is
        // lower case.
        let upper = claim(Some("agents"), Some("runner-0"), Some(&UID.to_uppercase()));
        assert!(confirm_pod(&upper, Some(UID)).unwrap().is_some());
        // Static pods' uids are 32 hex digits.
        let hash = "0123456789abcdef0123456789abcdef";
        let static_pod = claim(Some("kube-system"), Some("runner-node1"), Some(hash));
        assert!(confirm_pod(&static_pod, Some(hash)).unwrap().is_some());
        assert_eq!(confirm_pod(&PodClaim::default(), Some(UID)), Ok(None));
        assert_eq!(confirm_pod(&PodClaim::default(), None), Ok(None));
        for (c, cgroup, why) in [
            (
                claim(Some("agents"), Some("runner-1"), Some(OTHER)),
                Some(UID),
                format!(
                    "its runtime names pod agents/runner-1 with uid {OTHER}, but its cgroup is pod {UID}'s"
                ),
            ),
            (
                claim(Some("agents"), Some("runner-1"), Some(UID)),
                None,
                format!("its runtime names pod agents/runner-1 (uid {UID}), but its cgroup is in no pod's"),
            ),
            (
                claim(Some("agents"), Some("runner-1"), None),
                Some(UID),
                "its runtime names pod agents/runner-1 without its uid, so its cgroup cannot confirm it"
                    .to_string(),
            ),
            (
                claim(None, Some("run\u{1b}ner"), Some(UID)),
                Some(OTHER),
                format!(
                    "its runtime names pod ?/run\\u{{1b}}ner with uid {UID}, but its cgroup is pod {OTHER}'s"
                ),
            ),
        ] {
            assert_eq!(confirm_pod(&c, cgroup), Err(why), "{c:?} in {cgroup:?}");
        }
    }

    #[test]
    fn a_claim_from_labels_skips_empty_values() {
        let labels: BTreeMap<String, String> = [
            ("ns".to_string(), "agents".to_string()),
            ("name".to_string(), String::new()),
        ]
        .into();
        assert_eq!(
            PodClaim::from_labels(&labels, ["ns", "name", "uid"]),
            claim(Some("agents"), None, None)
        );
    }
}
