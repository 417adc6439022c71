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
    // A static pod's uid: the kubelet's 32-hex hash of its manifest.
    const HASH: &str = "0123456789abcdef0123456789abcdef";
    check(
        &format!("/kubepods/burstable/pod{HASH}/{A}"),
        &[(Cri, A, Some(HASH))],
    );
    check(
        &format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{HASH}.slice/cri-containerd-{A}.scope"
        ),
        &[(Containerd, A, Some(HASH))],
    );
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
        format!("{user}/app.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope"),
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
        // 31 and 33 hex digits: neither a UUID nor a static pod's hash.
        &format!("/kubepods/besteffort/pod{}/{A}", &A[..31]),
        &format!("/kubepods/besteffort/pod{}/{A}", &A[..33]),
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
    let system = &containers_in_path(&format!("/system.slice/docker-{a}.scope"))[0];
    assert!(system.speaks_for(0) && system.speaks_for(1000));
    let users = &containers_in_path(&format!(
        "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{a}.scope"
    ))[0];
    assert!(!users.speaks_for(0) && !users.speaks_for(1001) && users.speaks_for(1000));
}
