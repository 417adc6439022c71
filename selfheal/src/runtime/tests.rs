//! The inventory's identities, pods and gaps, and the container rules
//! over them, on made-up runtimes' answers.

use std::collections::BTreeMap;

use selfheal_core::{
    cgroup::CgroupContainer,
    runtime::{ContainerInfo, ContainerRule, Glob, Identity, PodClaim, Runtime},
};

use super::*;

#[test]
fn globs() {
    for (p, t, want) in [
        ("runner*", "runner-1", true),
        ("runner*", "xrunner", false),
        ("*", "", true),
        ("", "", true),
        ("", "a", false),
        ("a?c", "abc", true),
        ("a?c", "ac", false),
        ("*a*b*c*", "xxaxxbxxcxx", true),
        ("*a*b*c*", "xxaxxcxxbxx", false),
        ("a*", "a", true),
        ("**", "ab", true),
        ("exact", "exact", true),
        ("exact", "exactly", false),
    ] {
        assert_eq!(Glob(p.into()).matches(t), want, "{p:?} on {t:?}");
    }
    // Long adversarial input stays fast (no exponential backtracking).
    let t = "a".repeat(10_000);
    let p = format!("{}b", "*a".repeat(50));
    assert!(!Glob(p).matches(&t));
}

/// The identity of the one container `info` of `runtime`, found from
/// a cgroup that names it as `seen` (by id alone), in pod `pod_uid`'s
/// cgroup where given.
fn identity_of(
    runtime: Runtime,
    info: ContainerInfo,
    seen: Runtime,
    pod_uid: Option<&str>,
) -> Identity {
    let id = info.id.clone();
    Inventory::from_containers(vec![(runtime, info)])
        .identity(&[CgroupContainer {
            runtime: seen,
            id,
            pod_uid: pod_uid.map(str::to_string),
            user: None,
        }])
        .unwrap()
}

const POD_UID: &str = "5c1b4b8e-2f0e-4a57-9d7a-0d6a1c3e9b11";

fn ident(labels: &[(&str, &str)]) -> Identity {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let info = ContainerInfo {
        id: "a".repeat(64),
        name: Some("runner-1".into()),
        image: Some("shtest:1".into()),
        pod: PodClaim::from_labels(&labels, selfheal_core::runtime::docker::KUBELET_POD),
        labels,
        init_pid: None,
    };
    identity_of(Runtime::Docker, info, Runtime::Unknown, Some(POD_UID))
}

#[test]
fn rules() {
    let id = ident(&[
        ("app", "runner"),
        ("io.kubernetes.pod.name", "runner-0"),
        ("io.kubernetes.pod.namespace", "agents"),
        ("io.kubernetes.pod.uid", POD_UID),
        ("quoted", "a\"b\nc"),
    ]);
    assert_eq!(id.runtime, Runtime::Docker);
    assert_eq!(id.pod.as_deref(), Some("runner-0"));
    let g = |s: &str| Some(Glob(s.into()));
    let lab = |k: &str, v: &str| (k.to_string(), v.to_string());
    let by_container = |s: &str| ContainerRule {
        container: g(s),
        ..Default::default()
    };
    let by_labels = |labels: Vec<(String, String)>| ContainerRule {
        labels,
        ..Default::default()
    };
    for (rule, want) in [
        (by_container("runner-*"), true),
        (by_container("other*"), false),
        (by_container(&"a".repeat(12)), true),
        (by_container(&"A".repeat(12)), true),
        (by_container(&"a".repeat(11)), false),
        (
            ContainerRule {
                image: g("shtest:*"),
                ..Default::default()
            },
            true,
        ),
        (by_labels(vec![lab("app", "runner")]), true),
        (by_labels(vec![lab("app", "run")]), false),
        (by_labels(vec![lab("quoted", "a\"b\nc")]), true),
        (
            by_labels(vec![lab("app", "runner"), lab("tier", "x")]),
            false,
        ),
        (
            ContainerRule {
                pod: g("runner-*"),
                namespace: g("agents"),
                ..Default::default()
            },
            true,
        ),
        (
            ContainerRule {
                namespace: g("agents"),
                labels: vec![lab("app", "other")],
                ..Default::default()
            },
            false,
        ),
    ] {
        assert_eq!(rule.matches(&id), want, "{rule}");
    }
    // With no runtime answer, only the id can match.
    let bare = Inventory::default()
        .identity(&[CgroupContainer {
            runtime: Runtime::Docker,
            id: "a".repeat(64),
            pod_uid: None,
            user: None,
        }])
        .unwrap();
    assert!(!bare.resolved);
    assert!(by_container(&"a".repeat(12)).matches(&bare));
    assert!(!by_container("runner-*").matches(&bare));
    assert!(!by_labels(vec![lab("app", "runner")]).matches(&bare));
}

/// Container rules over a process table: a container's processes and
/// their descendants, never the monitor beside it, nor selfheal.
#[test]
fn rules_over_a_table() {
    use selfheal_core::config::MatchRule;

    use crate::agents::{ProcEntry, ProcessTable, find};
    let a = "a".repeat(64);
    let b = "b".repeat(64);
    let in_ctr = |pid, ppid, id: &str| {
        let mut e = ProcEntry::new(pid, ppid, &["/bin/sleep", "600"]);
        e.containers = vec![CgroupContainer {
            runtime: Runtime::Docker,
            id: id.to_string(),
            pod_uid: None,
            user: None,
        }];
        // Each container its own pid namespace.
        e.pidns = Some(u64::from(id.as_bytes()[0]));
        e
    };
    // A host process in a cgroup named like container a's (only root
    // could put one there; the runtime still says it is not a's).
    let mut forged = in_ctr(40, 1, &a);
    forged.pidns = Some(1);
    let table = ProcessTable::from_entries(vec![
        ProcEntry::new(1, 0, &["/sbin/init"]),
        ProcEntry::new(10, 1, &["containerd-shim"]),
        in_ctr(11, 10, &a),
        in_ctr(12, 11, &a),
        ProcEntry::new(20, 1, &["containerd-shim"]),
        in_ctr(21, 20, &b),
        // selfheal itself, in a container of its own (a sidecar).
        in_ctr(30, 1, &b),
        forged,
    ])
    .with_own_pid(30)
    .with_inventory(Inventory::from_containers(vec![
        (
            Runtime::Docker,
            ContainerInfo {
                id: a.clone(),
                name: Some("runner-1".into()),
                image: Some("img:1".into()),
                labels: [("app".to_string(), "runner".to_string())].into(),
                init_pid: Some(11),
                ..Default::default()
            },
        ),
        (
            Runtime::Docker,
            ContainerInfo {
                id: b.clone(),
                name: Some("sidecar".into()),
                image: None,
                labels: BTreeMap::new(),
                init_pid: Some(21),
                ..Default::default()
            },
        ),
    ]));
    let rule = |r: ContainerRule| MatchRule::Container(r);
    let m = find(
        &rule(ContainerRule {
            labels: vec![("app".into(), "runner".into())],
            ..Default::default()
        }),
        &table,
    );
    assert_eq!(
        (m.roots.as_slice(), m.all.as_slice()),
        (&[11][..], &[11, 12][..])
    );
    let m = find(
        &rule(ContainerRule {
            container: Some(Glob("sidecar".into())),
            ..Default::default()
        }),
        &table,
    );
    assert_eq!(m.roots, vec![21], "selfheal (30) is never its own agent");
    let m = find(
        &rule(ContainerRule {
            image: Some(Glob("other:*".into())),
            ..Default::default()
        }),
        &table,
    );
    assert!(m.roots.is_empty());
    assert_eq!(
        m.problem.as_deref(),
        Some(
            "no container matches image = \"other:*\" (2 container(s) running); \
             1 process(es) whose cgroup names a container were not taken for it \
             (pid 40 is not taken for container aaaaaaaaaaaa (docker): \
             it is not in the pid namespace of the container's init (pid 11))"
        )
    );
    assert_eq!(table.identity(40), None, "not in a's pid namespace");
    assert_eq!(
        table.refusals(&[40, 11]),
        [format!(
            "pid 40 is not taken for container {} (docker): it is not in the pid namespace of the container's init (pid 11)",
            &a[..12]
        )]
    );
    let ids = table.identities(&[12, 11, 21, 1]);
    let names: Vec<_> = ids.iter().map(|i| i.name.as_deref()).collect();
    assert_eq!(names, vec![Some("runner-1"), Some("sidecar")]);
}

/// A runtime that reports no init pid, or one that is no process here
/// (another pid namespace's), or a pid outside the container's cgroup
/// (an id reused by another container, a stale answer): the process is
/// in no container, and the refusal says why.
#[test]
fn a_runtime_that_cannot_confirm_is_refused_with_its_reason() {
    use crate::agents::{ProcEntry, ProcessTable};
    let a = "a".repeat(64);
    let in_a = |pid| {
        let mut e = ProcEntry::new(pid, 1, &["sleep"]);
        e.containers = vec![CgroupContainer {
            runtime: Runtime::Docker,
            id: a.clone(),
            pod_uid: None,
            user: None,
        }];
        e.pidns = Some(7);
        e
    };
    let mut host = ProcEntry::new(50, 1, &["other"]);
    host.pidns = Some(7);
    let table = |init_pid| {
        ProcessTable::from_entries(vec![
            ProcEntry::new(1, 0, &["init"]),
            in_a(11),
            host.clone(),
        ])
        .with_inventory(Inventory::from_containers(vec![(
            Runtime::Docker,
            ContainerInfo {
                id: a.clone(),
                name: Some("runner".into()),
                init_pid,
                ..Default::default()
            },
        )]))
    };
    for (init_pid, why) in [
        (None, "its runtime reports no init pid for it"),
        (
            Some(4242),
            "its init pid 4242, as its runtime reports it, is no process here (the runtime's pid namespace is another)",
        ),
        (
            Some(50),
            "pid 50, its init as its runtime reports it, is not in its cgroup (the runtime's pid namespace is another)",
        ),
    ] {
        let t = table(init_pid);
        assert_eq!(t.identity(11), None, "{init_pid:?}");
        assert_eq!(
            t.refusals(&[11]),
            [format!(
                "pid 11 is not taken for container aaaaaaaaaaaa (docker): {why}"
            )]
        );
    }
    let t = table(Some(11));
    assert_eq!(
        t.identity(11).and_then(|i| i.name.as_deref()),
        Some("runner")
    );
    assert!(t.refusals(&[11]).is_empty());
}

/// The shipped ConfigMap's rule.
fn runners() -> ContainerRule {
    ContainerRule {
        namespace: Some(Glob("agents".into())),
        pod: Some(Glob("runner-*".into())),
        ..Default::default()
    }
}

/// A pod's container bundle as containerd's CRI writes it: the pod's
/// passed-through annotations `extra`, then its own keys.
fn cri_bundle(id: &str, ns: &str, pod: &str, uid: &str, extra: &str) -> ContainerInfo {
    let json = format!(
        r#"{{"annotations":{{{extra}"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-namespace":"{ns}","io.kubernetes.cri.sandbox-name":"{pod}","io.kubernetes.cri.sandbox-uid":"{uid}","io.kubernetes.cri.container-name":"runner"}}}}"#
    );
    selfheal_core::runtime::bundle::parse_config(id, json.as_bytes()).unwrap()
}

fn in_pod(id: &str, uid: &str) -> CgroupContainer {
    CgroupContainer {
        runtime: Runtime::Containerd,
        id: id.to_string(),
        pod_uid: Some(uid.to_string()),
        user: None,
    }
}

/// A tenant's pod `tenant/evil-0` whose own annotations (passed into
/// its bundle) say `agents/runner-1` is `tenant/evil-0`, and never
/// the ConfigMap's runner; the honest runner is.
#[test]
fn a_pod_is_what_the_cri_wrote_not_its_authors_annotations() {
    let (evil, honest) = ("e".repeat(64), "a".repeat(64));
    let other_uid = "0d6a1c3e-9b11-4a57-9d7a-5c1b4b8e2f0e";
    let inv = Inventory::from_containers(vec![
        (
            Runtime::Containerd,
            cri_bundle(
                &evil,
                "tenant",
                "evil-0",
                POD_UID,
                r#""io.kubernetes.pod.namespace":"agents","io.kubernetes.pod.name":"runner-1","io.kubernetes.pod.uid":"0d6a1c3e-9b11-4a57-9d7a-5c1b4b8e2f0e","#,
            ),
        ),
        (
            Runtime::Containerd,
            cri_bundle(&honest, "agents", "runner-0", other_uid, ""),
        ),
    ]);
    let e = inv.identity(&[in_pod(&evil, POD_UID)]).unwrap();
    assert_eq!(
        (
            e.namespace.as_deref(),
            e.pod.as_deref(),
            e.pod_refused.as_deref()
        ),
        (Some("tenant"), Some("evil-0"), None)
    );
    assert!(!runners().matches(&e));
    assert!(!e.labels.contains_key("io.kubernetes.pod.name"), "{e:?}");
    let h = inv.identity(&[in_pod(&honest, other_uid)]).unwrap();
    assert!(runners().matches(&h), "{h:?}");
}

/// A bundle whose sandbox uid is not its cgroup's pod (or whose cgroup
/// is in no pod) has no pod, and says why.
#[test]
fn a_pod_its_cgroup_does_not_confirm_is_none() {
    let id = "a".repeat(64);
    let other_uid = "0d6a1c3e-9b11-4a57-9d7a-5c1b4b8e2f0e";
    let inv = Inventory::from_containers(vec![(
        Runtime::Containerd,
        cri_bundle(&id, "agents", "runner-0", POD_UID, ""),
    )]);
    let mut in_no_pod = in_pod(&id, POD_UID);
    in_no_pod.pod_uid = None;
    for (c, why) in [
        (
            in_pod(&id, other_uid),
            format!(
                "its runtime names pod agents/runner-0 with uid {POD_UID}, but its cgroup is pod {other_uid}'s"
            ),
        ),
        (
            in_no_pod,
            format!(
                "its runtime names pod agents/runner-0 (uid {POD_UID}), but its cgroup is in no pod's"
            ),
        ),
    ] {
        let i = inv.identity(std::slice::from_ref(&c)).unwrap();
        assert_eq!((i.pod.as_deref(), i.namespace.as_deref()), (None, None));
        assert_eq!(i.pod_refused.as_deref(), Some(why.as_str()));
        assert!(!runners().matches(&i));
        assert!(
            i.describe().ends_with(&format!(", no pod: {why})")),
            "{}",
            i.describe()
        );
        // Still the runtime's container, by name.
        assert_eq!(i.name.as_deref(), Some("runner"));
    }
}

/// A container in a user's delegated tree is never the system runtime's,
/// whatever the system runtime lists under its id (a host-pid
/// container's, say): `identity` itself refuses it, and what is nested
/// in it, to root's inventory; the user's own inventory takes it.
#[test]
fn a_users_container_has_no_identity_from_the_systems_runtimes() {
    let a = "a".repeat(64);
    let b = "b".repeat(64);
    let listed = |id: &str| {
        (
            Runtime::Docker,
            ContainerInfo {
                id: id.to_string(),
                name: Some("host-pid".into()),
                init_pid: Some(1),
                ..Default::default()
            },
        )
    };
    let rootless = |id: &str, user| CgroupContainer {
        runtime: Runtime::Docker,
        id: id.to_string(),
        pod_uid: None,
        user,
    };
    let system = Inventory::from_containers(vec![listed(&a), listed(&b)]);
    assert_eq!(system.identity(&[rootless(&a, Some(1000))]), None);
    assert_eq!(
        system.identity(&[rootless(&a, Some(1000)), rootless(&b, Some(1000))]),
        None
    );
    assert!(system.identities_of(&[rootless(&a, Some(1000))]).is_empty());
    // A system container with a user's nested in it: the system one.
    let outer = system
        .identity(&[rootless(&b, None), rootless(&a, Some(1000))])
        .unwrap();
    assert_eq!(outer.id, b);
    // Another user's runtimes: not theirs either; their own: theirs.
    let users = |uid| Inventory::from_containers(vec![listed(&a)]).for_user(uid);
    assert_eq!(users(1001).identity(&[rootless(&a, Some(1000))]), None);
    let own = users(1000).identity(&[rootless(&a, Some(1000))]).unwrap();
    assert!(own.resolved && own.name.as_deref() == Some("host-pid"));
}

#[test]
fn describe_escapes_what_a_runtime_said() {
    let info = ContainerInfo {
        id: "c".repeat(64),
        name: Some("run\u{1b}[31mner".into()),
        image: Some("img\n:1".into()),
        pod: PodClaim {
            namespace: Some("ns".into()),
            name: Some("p\rod".into()),
            uid: Some(POD_UID.into()),
        },
        ..Default::default()
    };
    let id = identity_of(Runtime::Containerd, info, Runtime::Cri, Some(POD_UID));
    assert_eq!(
        id.describe(),
        "run\\u{1b}[31mner (cccccccccccc, containerd, image img\\n:1, pod ns/p\\rod)"
    );
}

#[test]
fn gaps_name_the_source() {
    let mut inv = Inventory::default();
    inv.errors.push(SourceError {
        source: "docker /x.sock".into(),
        error: "no answer within 2s".into(),
        absent: false,
    });
    inv.errors.push(SourceError {
        source: "podman /y.sock".into(),
        error: "not there".into(),
        absent: true,
    });
    let id = inv
        .identity(&[CgroupContainer {
            runtime: Runtime::Docker,
            id: "b".repeat(64),
            pod_uid: None,
            user: None,
        }])
        .unwrap();
    let gaps = inv.gaps(std::slice::from_ref(&id), false);
    assert_eq!(gaps.len(), 1);
    assert!(
        gaps[0].starts_with("container bbbbbbbbbbbb (docker by its cgroup)"),
        "{gaps:?}"
    );
    assert!(gaps[0].contains("no answer within 2s") && gaps[0].contains("not there"));
    // Nothing in a container and no container rule: nothing to say.
    assert!(inv.gaps(&[], false).is_empty());
    assert_eq!(inv.gaps(&[], true).len(), 1);
}

#[test]
fn runtimes_that_are_not_there_are_absent_sources_not_gaps() {
    let dir = std::env::temp_dir().join(format!("selfheal-no-runtimes-{}", std::process::id()));
    let sources = Sources {
        docker: dir.join("docker.sock"),
        podman: dir.join("podman.sock"),
        containerd_state: dir.join("containerd"),
        timeout: std::time::Duration::from_millis(500),
    };
    let wanted = [CgroupContainer {
        runtime: Runtime::Containerd,
        id: "c".repeat(64),
        pod_uid: None,
        user: None,
    }];
    let inv = Inventory::read(&sources, &wanted);
    let named: Vec<(&str, bool)> = inv
        .errors
        .iter()
        .map(|e| (e.source.as_str(), e.absent))
        .collect();
    let docker = format!("docker {}", sources.docker.display());
    let podman = format!("podman {}", sources.podman.display());
    let containerd = format!("containerd {}", sources.containerd_state.display());
    assert_eq!(
        named,
        [
            (docker.as_str(), true),
            (podman.as_str(), true),
            (containerd.as_str(), true)
        ]
    );
    assert_eq!(inv.init_pid(&wanted[0].id), None);
    let id = inv.identity(&wanted).expect("the cgroup names it");
    assert!(!id.resolved);
    // Absent runtimes are said only of a container none of them named.
    assert!(inv.gaps(&[], true).is_empty());
    assert_eq!(inv.gaps(std::slice::from_ref(&id), false).len(), 1);
}
