//! Which container a process is in, from its cgroup path alone: pure
//! parsing, no I/O, no runtime needed.
//!
//! Each runtime names the cgroup it makes for a container after the
//! container's id, in a few shapes that depend on the runtime and on the
//! cgroup driver (cgroupfs or systemd), the same in cgroup v1 and v2:
//!
//! | runtime, driver | path |
//! | --- | --- |
//! | Docker, cgroupfs | `/docker/<id>` |
//! | Docker, systemd | `/system.slice/docker-<id>.scope` |
//! | Podman, cgroupfs | `/libpod_parent/libpod-<id>` |
//! | Podman, systemd | `/machine.slice/libpod-<id>.scope` (its `container` child too) |
//! | containerd (`ctr`), cgroupfs | `/<namespace>/<id>` |
//! | kubelet + containerd, systemd | `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope` |
//! | kubelet + any CRI, cgroupfs | `/kubepods/besteffort/pod<uid>/<id>` |
//! | kubelet + CRI-O, systemd | `…/crio-<id>.scope` |
//!
//! Every component of the path is looked at, so nested containers (Docker
//! in Docker, kind) give a chain, outermost first; the monitors that run
//! beside a container (`libpod-conmon-<id>.scope`, `crio-conmon-<id>.scope`)
//! are not in it: a process in one is in no container but the ones
//! around the monitor (none on a host; the outer one when nested).
//!
//! Architecture invariant: nothing here reads a file or can panic on its
//! input; any text gives an answer (possibly "no container").

use serde::Serialize;

pub use selfheal_core::runtime::Runtime;

/// One container a cgroup path names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct CgroupContainer {
    pub runtime: Runtime,
    /// 64 lowercase hex digits.
    pub id: String,
    /// The Kubernetes pod's uid (with dashes), when the path is under a
    /// `pod<uid>` cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

/// The containers a cgroup path names, outermost first; empty for a process
/// in no container. A container's monitor ends the chain: the containers
/// around it (a nested runtime's outer one) stay, its own does not.
pub fn containers_in_path(path: &str) -> Vec<CgroupContainer> {
    let mut out = Vec::new();
    let mut pod_uid: Option<String> = None;
    let mut under_kubepods = false;
    let mut parent = "";
    for c in path.split('/').filter(|c| !c.is_empty()) {
        if is_monitor(c) {
            return out;
        }
        if c == "kubepods" || c.starts_with("kubepods-") || c == "kubepods.slice" {
            under_kubepods = true;
        }
        if let Some(uid) = pod_uid_of(c) {
            pod_uid = Some(uid);
        }
        let before = out.len();
        match named_id(c) {
            Some((runtime, id)) => out.push(CgroupContainer {
                runtime,
                id: id.to_string(),
                pod_uid: if under_kubepods {
                    pod_uid.clone()
                } else {
                    None
                },
            }),
            None if is_id(c) => {
                let runtime = if parent == "docker" {
                    Runtime::Docker
                } else if matches!(parent, "libpod_parent" | "machine.slice") {
                    Runtime::Podman
                } else if under_kubepods && pod_uid.is_some() {
                    Runtime::Cri
                } else {
                    Runtime::Unknown
                };
                out.push(CgroupContainer {
                    runtime,
                    id: c.to_string(),
                    pod_uid: if under_kubepods {
                        pod_uid.clone()
                    } else {
                        None
                    },
                });
            }
            None => {}
        }
        if out.len() > before {
            // Cgroups a nested runtime makes inside this container start
            // over: an outer pod is not an inner container's pod.
            under_kubepods = false;
            pod_uid = None;
        }
        parent = c;
    }
    out
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
fn is_id(s: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "ac71a600e8e6906ba7b18907acbb0c3d42386de3f68e5e60267627c2157e58e4";
    const B: &str = "e29ee482134e460ea9324b2720297c50d9e6612a20a82bd9c15524e86a907985";
    const UID: &str = "5c1b4b8e-2f0e-4a57-9d7a-0d6a1c3e9b11";
    const UID_: &str = "5c1b4b8e_2f0e_4a57_9d7a_0d6a1c3e9b11";

    fn check(path: &str, want: &[(Runtime, &str, Option<&str>)]) {
        let got = containers_in_path(path);
        let got: Vec<_> = got
            .iter()
            .map(|c| (c.runtime, c.id.as_str(), c.pod_uid.as_deref()))
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
        check(
            &format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{A}.scope"),
            &[(Podman, A, None)],
        );
        check(&format!("/machine.slice/libpod-conmon-{A}.scope"), &[]);
        check(&format!("/machine.slice/{A}"), &[(Podman, A, None)]);
        check(&format!("/default/{A}"), &[(Unknown, A, None)]);
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
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cgroup");
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
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cgroup");
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
}
