//! Identity from a cgroup path: which systemd unit, and which manager's,
//! a process is in ([`unit_of`]), and which containers ([`containers_in_path`]):
//! pure parsing, no I/O, no runtime needed.
//!
//! **Anchoring.** Every systemd user may create cgroups of any name inside
//! their own delegated tree (`…/user@UID.service/…`), and a delegated
//! service inside its own; so a name proves something only where nobody but
//! the system manager (or root) can create it. From the manager's root
//! (`/` on a host; the outer container's cgroup when systemd runs in one):
//!
//! - a **system unit** is the first component below a chain of slices
//!   (`/system.slice/X.service`, `/system.slice/system-getty.slice/getty@tty1.service`,
//!   `/init.scope`); everything below it is that unit's, whatever its name;
//! - a **user's unit** is the first component below a chain of slices under
//!   that user's `user-UID.slice/user@UID.service`, and belongs to user UID's
//!   manager, never to the system's;
//! - a **container** is a runtime's cgroup at the runtime's own place:
//!
//! | runtime, driver | path (from the root) |
//! | --- | --- |
//! | Docker, cgroupfs | `/docker/<id>` |
//! | Docker, systemd | `/system.slice/docker-<id>.scope` (any slice chain) |
//! | Podman, cgroupfs | `/libpod_parent/libpod-<id>` |
//! | Podman, systemd | `/machine.slice/libpod-<id>.scope` (its `container` child too), `/machine.slice/<id>` |
//! | containerd (`ctr`), cgroupfs | `/<namespace>/<id>` |
//! | kubelet + containerd, systemd | `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope` |
//! | kubelet + any CRI, cgroupfs | `/kubepods/besteffort/pod<uid>/<id>` |
//! | kubelet + CRI-O, systemd | `…/crio-<id>.scope` |
//! | rootless Podman or Docker | `…/user@UID.service/<slices>/libpod-<id>.scope` (`docker-<id>.scope`): user UID's container ([`CgroupContainer::user`]) |
//!
//! Container- or pod-shaped names anywhere else (below a unit, or in a
//! user's tree other than the rootless shapes) name nothing. The path says
//! only where a container's cgroup is; that a process is that container's
//! takes the runtime's word too (its init's pid namespace, checked at the
//! edge, `selfheal::runtime`).
//!
//! Nested containers (Docker in Docker, kind) give a chain, outermost
//! first: a container's cgroup is the root of its own tree, where the same
//! anchors apply again. The monitors that run beside a container
//! (`libpod-conmon-<id>.scope`, `crio-conmon-<id>.scope`) are in no
//! container but the ones around them.
//!
//! Architecture invariant: nothing here reads a file or can panic on its
//! input; any text gives an answer (possibly "no unit", "no container").

use serde::Serialize;

use crate::runtime::Runtime;

/// Whose systemd instance manages a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase", tag = "manager", content = "uid")]
pub enum Manager {
    /// The system manager (PID 1).
    System,
    /// User UID's manager (`user@UID.service`).
    User(u32),
}

impl std::fmt::Display for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Manager::System => f.write_str("the system manager"),
            Manager::User(uid) => write!(f, "uid {uid}'s user manager"),
        }
    }
}

/// The unit a cgroup is in, and whose manager runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitPlace<'a> {
    pub manager: Manager,
    pub unit: &'a str,
}

/// The components of `path` below `root` (both absolute cgroup paths);
/// `None` when `path` is not under `root`.
fn below<'a>(path: &'a str, root: &str) -> Option<Vec<&'a str>> {
    let mut p = path.split('/').filter(|c| !c.is_empty());
    for r in root.split('/').filter(|c| !c.is_empty()) {
        if p.next()? != r {
            return None;
        }
    }
    Some(p.collect())
}

/// The systemd unit a process in cgroup `path` belongs to, and its manager,
/// where `root` is the system manager's root cgroup ([`manager_root`]).
/// `None` outside every unit (the root itself, a slice, a path not under
/// `root`, a malformed user tree).
pub fn unit_of<'a>(path: &'a str, root: &str) -> Option<UnitPlace<'a>> {
    let rel = below(path, root)?;
    let (i, unit) = first_unit(&rel)?;
    if let Some(uid) = user_manager_uid(unit)
        && i > 0
        && rel[i - 1] == format!("user-{uid}.slice")
        && let Some((_, user_unit)) = first_unit(&rel[i + 1..])
    {
        return Some(UnitPlace {
            manager: Manager::User(uid),
            unit: user_unit,
        });
    }
    Some(UnitPlace {
        manager: Manager::System,
        unit,
    })
}

/// The first component that is not a slice, after only slices: a unit's
/// cgroup (`None` if a component is empty or there is none).
fn first_unit<'a>(rel: &[&'a str]) -> Option<(usize, &'a str)> {
    let i = rel.iter().position(|c| !c.ends_with(".slice"))?;
    let c = rel[i];
    let (name, kind) = c.rsplit_once('.')?;
    (!name.is_empty() && UNIT_KINDS.contains(&kind)).then_some((i, c))
}

/// The unit types that hold processes (and so have a cgroup of their own).
const UNIT_KINDS: &[&str] = &["service", "scope", "socket", "mount", "swap"];

/// `UID` of `user@UID.service`.
fn user_manager_uid(c: &str) -> Option<u32> {
    let n = c.strip_prefix("user@")?.strip_suffix(".service")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || (n.len() > 1 && n.starts_with('0'))
    {
        return None;
    }
    n.parse().ok()
}

/// The system manager's root cgroup from its own (PID 1's) cgroup path:
/// the parent of its `init.scope` (`/` on a host, `/docker/<id>` for a
/// systemd in a container seen from the host's cgroup namespace); `/` when
/// PID 1 is not in an `init.scope` (no systemd), or its cgroup is unknown.
pub fn manager_root(pid1_cgroup: Option<&str>) -> String {
    let Some(path) = pid1_cgroup else {
        return "/".into();
    };
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    match comps.split_last() {
        Some((&"init.scope", parent)) => format!("/{}", parent.join("/")),
        _ => "/".into(),
    }
}

/// One container a cgroup path names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct CgroupContainer {
    pub runtime: Runtime,
    /// 64 lowercase hex digits.
    pub id: String,
    /// The Kubernetes pod's uid (with dashes), when the path is under a
    /// `pod<uid>` cgroup below the kubepods root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The user whose delegated tree holds it (a rootless Podman or Docker
    /// container, or any container nested in one): that user's runtime
    /// speaks for it, never the system's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<u32>,
}

/// The containers a cgroup path names, outermost first; empty for a process
/// in no container. A container's monitor ends the chain: the containers
/// around it (a nested runtime's outer one) stay, its own does not.
pub fn containers_in_path(path: &str) -> Vec<CgroupContainer> {
    // In a cgroup namespace (a pod's, on cgroup v2) a cgroup outside it
    // reads `/../../X`: the `..` climb through the ancestors of the
    // reader's own cgroup, which only the system made, so they anchor
    // like slices; what follows is read as from the root.
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty())
        .skip_while(|c| *c == "..")
        .collect();
    let mut out = Vec::new();
    let mut rest: &[&str] = &comps;
    let mut user: Option<u32> = None;
    loop {
        // Podman's systemd driver puts the payload in a `container` child.
        if !out.is_empty() && rest.first() == Some(&"container") {
            rest = &rest[1..];
        }
        let found = match user {
            Some(_) => anchored_rootless(rest),
            None => anchored(rest).or_else(|| {
                // A user's delegated tree: only the rootless shapes, and
                // they are that user's.
                let (i, unit) = first_unit(rest)?;
                let uid = user_manager_uid(unit)?;
                (i > 0 && rest[i - 1] == format!("user-{uid}.slice")).then_some(())?;
                let (len, c) = anchored_rootless(&rest[i + 1..])?;
                user = Some(uid);
                Some((i + 1 + len, c))
            }),
        };
        match found {
            Some((len, Anchor::Container(mut c))) => {
                c.user = user;
                out.push(c);
                rest = &rest[len..];
            }
            Some((_, Anchor::Monitor)) | None => return out,
        }
    }
}

/// What an anchored component names.
enum Anchor {
    Container(CgroupContainer),
    /// A container's monitor: in no container of its own.
    Monitor,
}

fn container(runtime: Runtime, id: &str, pod_uid: Option<String>) -> Anchor {
    Anchor::Container(CgroupContainer {
        runtime,
        id: id.to_string(),
        pod_uid,
        user: None,
    })
}

/// The container whose cgroup starts `rest` (a tree's root), anchored at
/// its runtime's place, and how many components its cgroup takes.
fn anchored(rest: &[&str]) -> Option<(usize, Anchor)> {
    // cgroupfs drivers: fixed parents at the root.
    match rest {
        ["docker", id, ..] if is_id(id) => return Some((2, container(Runtime::Docker, id, None))),
        ["libpod_parent", c, ..] => {
            if c.starts_with("libpod-conmon-") {
                return Some((2, Anchor::Monitor));
            }
            let id = c.strip_prefix("libpod-").filter(|id| is_id(id))?;
            return Some((2, container(Runtime::Podman, id, None)));
        }
        ["machine.slice", id, ..] if is_id(id) => {
            return Some((2, container(Runtime::Podman, id, None)));
        }
        ["kubepods", ..] => return kubepods_cgroupfs(&rest[1..]).map(|(n, a)| (n + 1, a)),
        [ns, id, ..] if is_id(id) && !ns.contains('.') && is_name(ns) => {
            return Some((2, container(Runtime::Unknown, id, None)));
        }
        _ => {}
    }
    // systemd drivers: a scope below a chain of slices only the system
    // manager makes.
    let i = rest.iter().position(|c| !c.ends_with(".slice"))?;
    let scope = rest[i];
    if is_monitor(scope) {
        return Some((i + 1, Anchor::Monitor));
    }
    let (runtime, id) = named_id(scope)?;
    let slices = &rest[..i];
    let pod_uid = if slices.iter().any(|s| is_kubepods_slice(s)) {
        slices.last().and_then(|s| pod_uid_of(s))
    } else {
        None
    };
    Some((i + 1, container(runtime, id, pod_uid)))
}

/// A rootless runtime's container at the root of a user's tree: a
/// `libpod-<id>.scope` or `docker-<id>.scope` below slices.
fn anchored_rootless(rest: &[&str]) -> Option<(usize, Anchor)> {
    let i = rest.iter().position(|c| !c.ends_with(".slice"))?;
    let scope = rest[i];
    if is_monitor(scope) {
        return Some((i + 1, Anchor::Monitor));
    }
    match named_id(scope)? {
        (rt @ (Runtime::Podman | Runtime::Docker), id) if scope.ends_with(".scope") => {
            Some((i + 1, container(rt, id, None)))
        }
        _ => None,
    }
}

/// Below `/kubepods` (cgroupfs): `[besteffort|burstable/]pod<uid>/<id>`.
fn kubepods_cgroupfs(rest: &[&str]) -> Option<(usize, Anchor)> {
    let (qos, rest) = match rest {
        ["besteffort" | "burstable", rest @ ..] => (1, rest),
        _ => (0, rest),
    };
    let [pod, c, ..] = rest else {
        return None;
    };
    if pod.ends_with(".slice") {
        return None;
    }
    let uid = pod_uid_of(pod)?;
    let n = qos + 2;
    if is_monitor(c) {
        return Some((n, Anchor::Monitor));
    }
    if is_id(c) {
        return Some((n, container(Runtime::Cri, c, Some(uid))));
    }
    let (runtime, id) = named_id(c)?;
    Some((n, container(runtime, id, Some(uid))))
}

/// `kubepods.slice`, or a kubelet's `--cgroup-root` form of it
/// (`kubelet-kubepods.slice`, `kubepods-besteffort.slice`, …).
fn is_kubepods_slice(s: &str) -> bool {
    s == "kubepods.slice" || s.starts_with("kubepods-") || s.contains("-kubepods")
}

/// A plain cgroup name (a `ctr` namespace): no dot, not empty, printable.
fn is_name(c: &str) -> bool {
    !c.is_empty()
        && c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The containers a process is in, from the text of `/proc/PID/cgroup`:
/// the cgroup v2 line (`0::PATH`) when it names one, else the first cgroup
/// v1 hierarchy that does (on a v1 host, runtimes place a container in
/// every hierarchy, and the v2 one may be left at `/`).
pub fn containers_in_proc_cgroup(text: &str) -> Vec<CgroupContainer> {
    let mut paths: Vec<&str> = Vec::new();
    paths.extend(text.lines().filter_map(|l| l.strip_prefix("0::")));
    paths.extend(
        text.lines()
            .filter(|l| !l.starts_with("0::"))
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, _, path) = (parts.next()?, parts.next()?, parts.next()?);
                Some(path)
            }),
    );
    paths
        .into_iter()
        .map(|p| containers_in_path(p.trim()))
        .find(|c| !c.is_empty())
        .unwrap_or_default()
}

/// `libpod-conmon-<id>.scope`, `crio-conmon-<id>.scope`: the monitor
/// process beside a container, not in it.
fn is_monitor(c: &str) -> bool {
    c.starts_with("libpod-conmon-") || c.starts_with("crio-conmon-")
}

/// A component naming its runtime and the id: `docker-<id>.scope`,
/// `libpod-<id>.scope`, `libpod-<id>` (cgroupfs), `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`.
fn named_id(c: &str) -> Option<(Runtime, &str)> {
    let base = c.strip_suffix(".scope").unwrap_or(c);
    const PREFIXES: &[(&str, Runtime)] = &[
        ("docker-", Runtime::Docker),
        ("libpod-", Runtime::Podman),
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::Crio),
    ];
    PREFIXES.iter().find_map(|(prefix, runtime)| {
        let id = base.strip_prefix(prefix)?;
        is_id(id).then_some((*runtime, id))
    })
}

/// 64 lowercase hex digits: a container id as every runtime here writes it.
pub fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The pod uid of `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_>.slice`
/// (systemd, where the uid's dashes are underscores): a UUID, or the 32 hex
/// digits of a static pod's (the kubelet's hash of its manifest), in lower
/// case.
fn pod_uid_of(c: &str) -> Option<String> {
    let rest = match c.strip_suffix(".slice") {
        Some(slice) => &slice[slice.rfind("-pod")? + 4..],
        None => c.strip_prefix("pod")?,
    };
    let uid = rest.replace('_', "-");
    let uuid = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
    let hash = uid.len() == 32 && uid.bytes().all(|b| b.is_ascii_hexdigit());
    (uuid || hash).then(|| uid.to_ascii_lowercase())
}

/// The cgroup path in the text of `/proc/PID/cgroup`: the unified (v2)
/// hierarchy's `0::PATH` line, else (cgroup v1) the `name=systemd` one.
pub fn cgroup_path(text: &str) -> Option<String> {
    let v2 = text.lines().find_map(|l| l.strip_prefix("0::"));
    let v1 = || {
        text.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            (controllers == "name=systemd").then_some(path)
        })
    };
    v2.or_else(v1)
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
}

/// Whether some component of cgroup `path` is named `unit`: only a name,
/// anywhere (a user can make one in their own tree); which unit a process
/// is in is [`unit_of`]'s answer, not this.
pub fn in_unit(path: &str, unit: &str) -> bool {
    path.split('/').any(|c| c == unit)
}

/// The containers of a process, from its `/proc/PID/cgroup` text, that
/// `euid`'s runtimes may speak for: the system's, and for a user other
/// than root that user's own (rootless); a container in another user's
/// delegated tree, and what is nested in it, is none of them.
pub fn containers_for(text: &str, euid: u32) -> Vec<CgroupContainer> {
    containers_in_proc_cgroup(text)
        .into_iter()
        .take_while(|c| c.speaks_for(euid))
        .collect()
}

impl CgroupContainer {
    /// Whether `euid`'s runtimes may speak for this container: a system
    /// container (no [`CgroupContainer::user`]) root's or any user's; one
    /// in a user's delegated tree only that user's own, never root's.
    pub fn speaks_for(&self, euid: u32) -> bool {
        match self.user {
            None => true,
            Some(user) => euid != 0 && user == euid,
        }
    }
}

#[cfg(test)]
mod tests;
