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
/// (systemd, where the uid's dashes are underscores).
fn pod_uid_of(c: &str) -> Option<String> {
    let rest = match c.strip_suffix(".slice") {
        Some(slice) => &slice[slice.rfind("-pod")? + 4..],
        None => c.strip_prefix("pod")?,
    };
    let uid = rest.replace('_', "-");
    let ok = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
    ok.then(|| uid.to_ascii_lowercase())
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
        .take_while(|c| c.user.is_none() || (euid != 0 && c.user == Some(euid)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "ac71a600e8e6906ba7b18907acbb0c3d42386de3f68e5e60267627c2157e58e4";
    const B: &str = "e29ee482134e460ea9324b2720297c50d9e6612a20a82bd9c15524e86a907985";
    const UID: &str = "5c1b4b8e-2f0e-4a57-9d7a-0d6a1c3e9b11";
    const UID_: &str = "5c1b4b8e_2f0e_4a57_9d7a_0d6a1c3e9b11";

    fn check(path: &str, want: &[(Runtime, &str, Option<&str>)]) {
        let got = containers_in_path(path);
        assert!(
            got.iter().all(|c| c.user.is_none()),
            "path {path:?}: {got:?}"
        );
        let got: Vec<_> = got
            .iter()
            .map(|c| (c.runtime, c.id.as_str(), c.pod_uid.as_deref()))
            .collect();
        assert_eq!(got, want, "path {path:?}");
    }

    /// The containers of `path` a user's runtime speaks for.
    fn check_user(path: &str, want: &[(Runtime, &str, u32)]) {
        let got: Vec<_> = containers_in_path(path)
            .into_iter()
            .map(|c| (c.runtime, c.id, c.user))
            .collect();
        let want: Vec<_> = want
            .iter()
            .map(|(rt, id, uid)| (*rt, id.to_string(), Some(*uid)))
            .collect();
        assert_eq!(got, want, "path {path:?}");
    }

    #[test]
    fn shapes() {
        use Runtime::*;
        check(&format!("/docker/{A}"), &[(Docker, A, None)]);
        check(
            &format!("/system.slice/docker-{A}.scope"),
            &[(Docker, A, None)],
        );
        check(&format!("/libpod_parent/libpod-{A}"), &[(Podman, A, None)]);
        check(
            &format!("/machine.slice/libpod-{A}.scope"),
            &[(Podman, A, None)],
        );
        check(
            &format!("/machine.slice/libpod-{A}.scope/container"),
            &[(Podman, A, None)],
        );
        // Rootless Podman and Docker: the user's own containers.
        check_user(
            &format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{A}.scope"),
            &[(Podman, A, 1000)],
        );
        check_user(
            &format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{A}.scope/container"
            ),
            &[(Podman, A, 1000)],
        );
        check_user(
            &format!(
                "/user.slice/user-1000.slice/user@1000.service/app.slice/docker-{A}.scope/docker/{B}"
            ),
            &[(Docker, A, 1000)],
        );
        check_user(
            &format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{A}.scope/container/user.slice/docker-{B}.scope"
            ),
            &[(Podman, A, 1000), (Docker, B, 1000)],
        );
        check(&format!("/machine.slice/libpod-conmon-{A}.scope"), &[]);
        check(&format!("/machine.slice/{A}"), &[(Podman, A, None)]);
        check(&format!("/default/{A}"), &[(Unknown, A, None)]);
        check(
            &format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope"
            ),
            &[(Containerd, A, Some(UID))],
        );
        check(
            &format!("/system.slice/docker-{A}.scope/container"),
            &[(Docker, A, None)],
        );
        // Read from inside a pod's cgroup namespace (cgroup v2): another
        // pod's container, and a user's tree, above the reader's root.
        check(
            &format!(
                "/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope"
            ),
            &[(Containerd, A, Some(UID))],
        );
        check(
            &format!("/../cri-containerd-{A}.scope"),
            &[(Containerd, A, None)],
        );
        check(
            &format!(
                "/../../../../user.slice/user-1000.slice/user@1000.service/app.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope"
            ),
            &[],
        );
        check(
            &format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope"
            ),
            &[(Containerd, A, Some(UID))],
        );
        check(
            &format!("/kubepods.slice/kubepods-pod{UID_}.slice/crio-{A}.scope"),
            &[(Crio, A, Some(UID))],
        );
        check(
            &format!("/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{A}.scope"),
            &[],
        );
        // A monitor inside an outer container is in the outer one.
        check(
            &format!("/docker/{A}/machine.slice/libpod-conmon-{B}.scope"),
            &[(Docker, A, None)],
        );
        check(
            &format!("/kubepods/besteffort/pod{UID}/{A}"),
            &[(Cri, A, Some(UID))],
        );
        check(&format!("/kubepods/pod{UID}/{A}"), &[(Cri, A, Some(UID))]);
        check(
            &format!("/kubepods/burstable/pod{UID}/docker-{A}.scope"),
            &[(Docker, A, Some(UID))],
        );
        // Nested: Docker in Docker, and kind (a pod in a Docker container).
        check(
            &format!("/docker/{A}/docker/{B}"),
            &[(Docker, A, None), (Docker, B, None)],
        );
        check(
            &format!("/system.slice/docker-{A}.scope/kubepods/besteffort/pod{UID}/{B}"),
            &[(Docker, A, None), (Cri, B, Some(UID))],
        );
    }

    /// Container- and pod-shaped names where only their owner put them:
    /// below a unit (a delegated service's or a user's own tree), or in
    /// the wrong place of a user's tree, name nothing.
    #[test]
    fn names_outside_the_anchors_are_nothing() {
        let user = "/user.slice/user-1000.slice/user@1000.service";
        for path in [
            format!(
                "{user}/app.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope"
            ),
            format!("{user}/app.slice/runner.service/docker-{A}.scope"),
            format!("{user}/docker/{A}"),
            format!("{user}/kubepods/besteffort/pod{UID}/{A}"),
            format!("{user}/machine.slice/{A}"),
            format!("{user}/app.slice/crio-{A}.scope"),
            format!("/system.slice/runner.service/docker-{A}.scope"),
            format!("/system.slice/runner.service/docker/{A}"),
            format!("/system.slice/runner.service/kubepods/pod{UID}/{A}"),
            format!(
                "/system.slice/foo.service/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{A}.scope"
            ),
            format!("/user.slice/user-1000.slice/session-3.scope/docker-{A}.scope"),
            // A user@ whose slice disagrees is no user's tree.
            format!("/user.slice/user-1001.slice/user@1000.service/user.slice/libpod-{A}.scope"),
            format!("/user.slice/user@1000.service/user.slice/libpod-{A}.scope"),
            // Only three components of a ctr shape at the root.
            format!("/a/b/{A}"),
        ] {
            let got = containers_in_path(&path);
            assert!(got.is_empty(), "{path}: {got:?}");
        }
        // A user's tree in a container: the outer one stays, the user's
        // pod-shaped names inside do not count.
        let got = containers_in_path(&format!(
            "/docker/{B}{user}/app.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope"
        ));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].id.as_str(), got[0].user), (B, None));
    }

    #[test]
    fn units_and_their_managers() {
        use Manager::*;
        let sys = |u: &'static str| {
            Some(UnitPlace {
                manager: System,
                unit: u,
            })
        };
        let user = |uid, u: &'static str| {
            Some(UnitPlace {
                manager: User(uid),
                unit: u,
            })
        };
        for (path, root, want) in [
            ("/system.slice/runner.service", "/", sys("runner.service")),
            (
                "/system.slice/runner.service/payload",
                "/",
                sys("runner.service"),
            ),
            (
                "/system.slice/runner.service/app.slice/x.service",
                "/",
                sys("runner.service"),
            ),
            (
                "/system.slice/system-getty.slice/getty@tty1.service",
                "/",
                sys("getty@tty1.service"),
            ),
            ("/init.scope", "/", sys("init.scope")),
            ("/custom.slice/runner.service", "/", sys("runner.service")),
            (
                "/user.slice/user-1000.slice/session-3.scope",
                "/",
                sys("session-3.scope"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service",
                "/",
                sys("user@1000.service"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice/runner.service",
                "/",
                user(1000, "runner.service"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice/runner.service/sub/x.service",
                "/",
                user(1000, "runner.service"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/init.scope",
                "/",
                user(1000, "init.scope"),
            ),
            // The slice must be the same user's.
            (
                "/user.slice/user-1001.slice/user@1000.service/app.slice/runner.service",
                "/",
                sys("user@1000.service"),
            ),
            // A systemd in a container, seen from the host's cgroup namespace.
            (
                "/docker/abc/system.slice/runner.service",
                "/docker/abc",
                sys("runner.service"),
            ),
            (
                "/docker/abc/user.slice/user-7.slice/user@7.service/app.slice/r.service",
                "/docker/abc",
                user(7, "r.service"),
            ),
            ("/docker/abc/system.slice/runner.service", "/", None),
            ("/system.slice/runner.service", "/docker/abc", None),
            // From inside a cgroup namespace, PID 1 four levels up.
            (
                "/../../../../system.slice/r.service",
                "/../../../..",
                sys("r.service"),
            ),
            (
                "/../../../../user.slice/user-7.slice/user@7.service/app.slice/r.service",
                "/../../../..",
                user(7, "r.service"),
            ),
            ("/../../system.slice/r.service", "/../../../..", None),
            ("/", "/", None),
            ("/system.slice", "/", None),
            ("/runner", "/", None),
            ("/x/runner.service", "/", None),
            ("/system.slice/.service", "/", None),
            ("", "/", None),
            (
                "/user.slice/user-1000.slice/user@01000.service/a.slice/r.service",
                "/",
                sys("user@01000.service"),
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice",
                "/",
                sys("user@1000.service"),
            ),
        ] {
            assert_eq!(unit_of(path, root), want, "{path} under {root}");
        }
    }

    #[test]
    fn the_managers_root() {
        for (pid1, want) in [
            (Some("/init.scope"), "/"),
            (Some("/docker/abc/init.scope"), "/docker/abc"),
            (Some("/../../../../init.scope"), "/../../../.."),
            (Some("/"), "/"),
            (Some("/docker/abc"), "/"),
            (Some(""), "/"),
            (None, "/"),
        ] {
            assert_eq!(manager_root(pid1), want, "{pid1:?}");
        }
    }

    #[test]
    fn not_containers() {
        for path in [
            "/",
            "",
            "/user.slice/user-0.slice/session-1.scope",
            "/system.slice/docker.service",
            "/system.slice/containerd.service",
            "/docker",
            "/docker/abc",
            // 63 and 65 digits, upper case: not ids.
            &format!("/docker/{}", &A[1..]),
            &format!("/docker/{A}0"),
            &format!("/docker/{}", A.to_ascii_uppercase()),
            &format!("/system.slice/docker-{A}.scopex"),
            "/kubepods/besteffort/podnotauid",
            "/kubepods.slice/kubepods-besteffort.slice",
            "//////",
            "/docker-\u{0}/\u{ffff}",
        ] {
            check(path, &[]);
        }
    }

    #[test]
    fn proc_cgroup_text() {
        // v2 at the root, the container in every v1 hierarchy (this host).
        let text = format!("1:name=systemd:/docker/{A}\n2:cpu:/docker/{A}\n0::/\n");
        let got = containers_in_proc_cgroup(&text);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].id, A);
        // v2 wins when it names one.
        let text = format!("1:name=systemd:/docker/{B}\n0::/docker/{A}\n");
        assert_eq!(containers_in_proc_cgroup(&text)[0].id, A);
        assert!(containers_in_proc_cgroup("0::/\n1:cpu:/\n").is_empty());
        assert!(containers_in_proc_cgroup("garbage\n::\n:::\n").is_empty());
    }

    /// Every fixture under tests/fixtures/cgroup (real `/proc/PID/cgroup`
    /// files, one per runtime and driver this machine could run, with the
    /// expected answer in its name: `RUNTIME-….txt`, or `none-….txt`; how
    /// each was captured is in that directory's README.md).
    #[test]
    fn fixtures() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cgroup");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("fixture directory") {
            let path = entry.expect("fixture").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".txt") {
                continue; // README.md: how each was captured
            }
            let text = std::fs::read_to_string(&path).expect("fixture text");
            let want_runtime = name.split('-').next().unwrap();
            let got = containers_in_proc_cgroup(&text);
            if want_runtime == "none" {
                assert!(got.is_empty(), "{name}: {got:?}");
            } else {
                let last = got.last().unwrap_or_else(|| panic!("{name}: no container"));
                assert_eq!(last.runtime.as_str(), want_runtime, "{name}");
                assert!(is_id(&last.id), "{name}");
                assert!(text.contains(&last.id), "{name}");
            }
            n += 1;
        }
        assert!(n >= 4, "only {n} fixtures in {}", dir.display());
    }

    /// The whole chain of the real systemd-driver captures (see the
    /// fixtures' README.md): made inside a Docker container running systemd
    /// (`/docker/<OUTER>`), so each names the outer container first.
    #[test]
    fn systemd_fixtures_chain() {
        use Runtime::*;
        const OUTER: &str = "a1610b622b4f9e39ecea0e9173bb9b1771835768a4a7784353a30f012a5c7de6";
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cgroup");
        let chain = |name: &str| -> Vec<(Runtime, String, Option<String>)> {
            let text = std::fs::read_to_string(dir.join(name)).expect("fixture text");
            // The cgroup v2 line alone gives the answer (no v1 fallback).
            let v2 = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
            let got = containers_in_proc_cgroup(&text);
            assert_eq!(got, containers_in_path(v2), "{name}");
            got.into_iter()
                .map(|c| (c.runtime, c.id, c.pod_uid))
                .collect()
        };
        let outer = (Docker, OUTER.to_string(), None);
        assert_eq!(
            chain("docker-systemd-nested-v1.txt"),
            [
                outer.clone(),
                (
                    Docker,
                    "e4a9e44999d443bb1fedec0455cb510a1e0e483702786a997f18831e4c763919".into(),
                    None
                )
            ]
        );
        assert_eq!(
            chain("podman-systemd-nested-v1.txt"),
            [
                outer.clone(),
                (
                    Podman,
                    "18e3a046adcc9a35a6fd8c6c66589587fcc20907c8feb3c04f0e26b194883168".into(),
                    None
                )
            ]
        );
        assert_eq!(
            chain("docker-podman-conmon-systemd-nested-v1.txt"),
            std::slice::from_ref(&outer)
        );
        assert_eq!(
            chain("containerd-kubepods-systemd-nested-v1.txt"),
            [
                outer,
                (
                    Containerd,
                    "c25fd5958ed891a65d1467d83cb5b0a6f5e2ba32a087e0c13f802c75f22fe9c8".into(),
                    Some("aa81965e-c59d-4b0d-b8da-5d59600a33a9".into())
                )
            ]
        );
    }

    #[test]
    fn cgroup_lines() {
        assert_eq!(
            cgroup_path("0::/system.slice/sol.service\n").as_deref(),
            Some("/system.slice/sol.service")
        );
        // Hybrid: v1 lines and the unified one.
        assert_eq!(
            cgroup_path("12:cpu,cpuacct:/x\n1:name=systemd:/system.slice/a.service\n0::/system.slice/b.service\n")
                .as_deref(),
            Some("/system.slice/b.service")
        );
        // Pure v1.
        assert_eq!(
            cgroup_path("3:memory:/m\n1:name=systemd:/system.slice/a.service\n").as_deref(),
            Some("/system.slice/a.service")
        );
        assert_eq!(cgroup_path(""), None);
        assert_eq!(cgroup_path("0::\n"), None);
        assert_eq!(cgroup_path("garbage"), None);
    }

    /// A rootless container (in a user's tree) is that user's: the user's
    /// own check sees it, root's and another user's do not, nor anything
    /// nested in it.
    #[test]
    fn a_users_containers_are_that_users() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let text = format!(
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{a}.scope/container/docker/{b}\n"
        );
        assert!(containers_for(&text, 0).is_empty());
        assert!(containers_for(&text, 1001).is_empty());
        let own: Vec<_> = containers_for(&text, 1000)
            .into_iter()
            .map(|c| (c.id, c.user))
            .collect();
        assert_eq!(own, [(a.clone(), Some(1000))]);
        // A system container is everyone's to name.
        let text = format!("0::/system.slice/docker-{a}.scope\n");
        assert_eq!(containers_for(&text, 0).len(), 1);
        assert_eq!(containers_for(&text, 1000).len(), 1);
    }
}
