//! Identity an unprivileged user cannot forge: root's check takes a unit,
//! a container or a pod for its agent only where the cgroup is anchored
//! (the system manager's slices, the runtime's own parent) and the runtime
//! confirms it (the container's init's pid namespace).
//!
//! Each test plays the attacker with an ordinary uid (65534): as root it
//! makes the cgroup that user could make in their own delegated tree
//! (`user.slice/user-65534.slice/user@65534.service/…`, which systemd
//! delegates to every user), puts that user's process there, and shows
//! what root's check takes it for. Every cgroup made here has `ident` in
//! its name or sits below one that does, and is removed on drop.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use tests::fixtures::rethrow;
use tests::runtimes::cgroup2_root;
use tests::runtimes::config_check_output;
use tests::{
    Scratch, need_root,
    runtimes::{
        docker, docker_with_image, need_docker, only_docker, podman_ready, run_ok, run_sleeper,
    },
    skip, wait_for,
};

/// The ordinary uid the attacker runs as.
const ATTACKER: u32 = 65534;

/// `sleep 600` (as `uid`, when given) in cgroup `rel` of the v2
/// hierarchy, made for it. Killed, and the directories it made removed,
/// on drop.
struct Placed {
    child: Child,
    made: Vec<PathBuf>,
}

impl Placed {
    fn start(rel: &str, uid: Option<u32>) -> Result<Placed, String> {
        let root = cgroup2_root().ok_or("no cgroup v2 hierarchy")?;
        let mut made = Vec::new();
        let mut dir = root.clone();
        for c in rel.split('/').filter(|c| !c.is_empty()) {
            dir.push(c);
            if !dir.exists() {
                std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
                made.push(dir.clone());
            }
        }
        let mut cmd = Command::new("sleep");
        cmd.arg("600").stdin(Stdio::null());
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt as _;
            cmd.uid(uid).gid(uid);
        }
        let child = cmd.spawn().map_err(|e| format!("spawn sleep: {e}"))?;
        let p = Placed { child, made };
        std::fs::write(dir.join("cgroup.procs"), p.child.id().to_string())
            .map_err(|e| format!("move into {}: {e}", dir.display()))?;
        Ok(p)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for d in self.made.iter().rev() {
            let _ = wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
                std::fs::remove_dir(d).ok()
            });
        }
    }
}

/// A user's delegated tree, as systemd makes it.
fn user_tree(uid: u32) -> String {
    format!("user.slice/user-{uid}.slice/user@{uid}.service")
}

/// `selfheal config check` of `config` with `env`: its report (printed).
fn config_check(config: &Path, env: &[(&str, String)]) -> String {
    let out = config_check_output(config, env);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    text
}

/// [`config_check`] of `text`, written to `config`.
fn check_config_text(config: &Path, text: &str, env: &[(&str, String)]) -> String {
    std::fs::write(config, text).unwrap();
    config_check(config, env)
}

/// Agent `agent`'s section of a `config check` report.
fn section<'a>(report: &'a str, agent: &str) -> &'a str {
    report
        .split("\nagent ")
        .find(|s| s.starts_with(&format!("{agent}\n")))
        .unwrap_or_else(|| panic!("no agent {agent} in {report}"))
}

/// The root pids of agent `agent` in a `config check` report (its
/// `processes` line: `pid 12 (…)`, `pids 12, 13 (…)`, `none (…)`).
fn roots(report: &str, agent: &str) -> Vec<u32> {
    let s = section(report, agent);
    let line = s
        .lines()
        .find_map(|l| l.trim().strip_prefix("processes"))
        .unwrap_or_else(|| panic!("no processes line: {s}"))
        .trim();
    let Some(list) = line
        .strip_prefix("pids ")
        .or_else(|| line.strip_prefix("pid "))
    else {
        return Vec::new();
    };
    list.split(" (")
        .next()
        .unwrap_or("")
        .split(", ")
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Root's `match = { unit = "X" }` is the system's X: never a cgroup of
/// that name a user made in their own tree. `uid` names the user's.
#[test]
fn a_unit_a_user_made_in_their_own_tree_is_not_roots_unit() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_unit_a_user_made_in_their_own_tree_is_not_roots_unit";
    if !need_root(TEST) {
        return;
    }
    let unit = format!("ident-runner-{}.service", std::process::id());
    let system = match Placed::start(&format!("system.slice/{unit}"), None) {
        Ok(p) => p,
        Err(e) => return skip(TEST, &format!("cannot make a unit's cgroup: {e}")),
    };
    let forged = Placed::start(
        &format!("{}/app.slice/{unit}", user_tree(ATTACKER)),
        Some(ATTACKER),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Below another system unit (a delegated service's own tree): a name.
    let nested = Placed::start(
        &format!(
            "system.slice/ident-other-{}.service/{unit}",
            std::process::id()
        ),
        Some(ATTACKER),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let scratch = Scratch::new("ident-unit");
    let config = scratch.join("config.toml");
    let report = check_config_text(
        &config,
        &format!("[[agent]]\nname = \"runner\"\nmatch = {{ unit = \"{unit}\" }}\n"),
        &[],
    );
    assert_eq!(
        roots(&report, "runner"),
        [system.pid()],
        "root's unit is the system's only (the user's {} and the nested {} are not it): {report}",
        forged.pid(),
        nested.pid()
    );
    assert!(
        section(&report, "runner").contains("(a system unit)"),
        "{report}"
    );
    let report = check_config_text(
        &config,
        &format!(
            "[[agent]]\nname = \"users\"\nmatch = {{ unit = \"{unit}\", uid = {ATTACKER} }}\n"
        ),
        &[],
    );
    assert_eq!(roots(&report, "users"), [forged.pid()], "{report}");
}

/// The two impostors of container `id`, whose init is `init`: nobody's
/// process in a cgroup named `scope` in nobody's own tree; and, where the
/// init is in a v2 cgroup of the id, nobody's process root put in that real
/// cgroup (anchored, but outside the container's pid namespace).
fn impostors(test: &str, scope: &str, id: &str, init: u32) -> (Placed, Option<Placed>) {
    let init_cgroup = std::fs::read_to_string(format!("/proc/{init}/cgroup")).unwrap();
    let forged = Placed::start(
        &format!("{}/app.slice/{scope}", user_tree(ATTACKER)),
        Some(ATTACKER),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let own = init_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.contains(id))
        .map(|p| p.trim_start_matches('/').to_string());
    let outsider = own
        .as_deref()
        .map(|rel| Placed::start(rel, Some(ATTACKER)).unwrap_or_else(|e| panic!("{e}")));
    if outsider.is_none() {
        skip(
            test,
            &format!(
                "the outsider part: the container's init is in no v2 cgroup of it ({init_cgroup:?})"
            ),
        );
    }
    (forged, outsider)
}

/// Root's `config check` with `env`: the container `name` (`id`, of
/// `runtime`) is its init only; the forged process is in no container; the
/// outsider neither, with the gap that says why.
#[allow(clippy::too_many_arguments)]
fn impostors_are_not_the_container(
    scratch: &Scratch,
    env: &[(&str, String)],
    name: &str,
    id: &str,
    init: u32,
    runtime: &str,
    forged: &Placed,
    outsider: Option<&Placed>,
) {
    let config = scratch.join("config.toml");
    let mut text = format!(
        "[[agent]]\nname = \"byname\"\nmatch = {{ container = \"{name}\" }}\n\n\
         [[agent]]\nname = \"forged\"\nmatch = {{ pid = {} }}\n",
        forged.pid()
    );
    if let Some(o) = outsider {
        text.push_str(&format!(
            "\n[[agent]]\nname = \"outsider\"\nmatch = {{ pid = {} }}\n",
            o.pid()
        ));
    }
    let report = check_config_text(&config, &text, env);
    assert_eq!(roots(&report, "byname"), [init], "{report}");
    assert!(
        !section(&report, "forged").contains("container  "),
        "{report}"
    );
    if let Some(o) = outsider {
        let s = section(&report, "outsider");
        assert!(!s.contains("container  "), "{report}");
        assert!(
            s.contains(&format!(
                "gap        pid {} is not taken for container {} ({runtime}): it is not in the pid namespace of the container's init (pid {init})",
                o.pid(),
                &id[..12]
            )),
            "{report}"
        );
    }
}

/// A container's cgroup name in a user's tree, an id of root's real
/// container (Docker, started here), is not that container; nor is a
/// process root put in the container's own cgroup from outside its pid
/// namespace; and the restart's act-time check refuses both.
#[test]
fn a_docker_container_is_a_processs_only_where_the_runtime_says() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_docker_container_is_a_processs_only_where_the_runtime_says";
    if !need_docker(TEST) {
        return;
    }
    if cgroup2_root().is_none() {
        return skip(TEST, "no cgroup v2 hierarchy");
    }
    let scratch = Scratch::new("ident-docker");
    let Some(d) = docker_with_image(TEST, &scratch, "ident", "ident") else {
        return;
    };
    let (dockerd, sock, tag, image, exec) = (d.dockerd, d.sock, d.tag, d.image, d.exec);
    let name = format!("{tag}-runner");
    let id = run_sleeper(&sock, &name, &["app=runner"], &image);
    let id = id.trim().to_string();
    let cleanup = || {
        let _ = run_ok(docker(&sock).args(["rm", "-f", &name]));
        let _ = run_ok(docker(&sock).args(["rmi", "-f", &image]));
    };
    let result = std::panic::catch_unwind(|| {
        let started = |what: &str| {
            run_ok(docker(&sock).args(["inspect", "-f", what, &name]))
                .expect("docker inspect")
                .trim()
                .to_string()
        };
        let init: u32 = started("{{.State.Pid}}").parse().expect("State.Pid");
        let (forged, outsider) = impostors(TEST, &format!("docker-{id}.scope"), &id, init);
        let env = only_docker(&scratch, &sock, "5s");
        impostors_are_not_the_container(
            &scratch,
            &env,
            &name,
            &id,
            init,
            "docker",
            &forged,
            outsider.as_ref(),
        );

        // The restart's act-time check: never for a process the runtime
        // does not place in the container.
        let sources = selfheal::runtime::Sources {
            docker: sock.clone(),
            podman: scratch.join("no-podman.sock"),
            containerd_state: scratch.join("no-containerd"),
            timeout: Duration::from_secs(5),
        };
        // The Docker restart of the container `id` for the process `pid`
        // judged with start time `start` (grace 1 s, 20 s to come back).
        let restart = |pid: u32, start: u64| {
            selfheal::runtime::restart::restart_container(
                &sources,
                selfheal_core::runtime::Runtime::Docker,
                &id,
                pid,
                start,
                Duration::from_secs(1),
                Duration::from_secs(20),
                &selfheal::runtime::restart::pid_namespace_here,
            )
            .map_err(|e| e.to_string())
        };
        let before = started("{{.State.StartedAt}}");
        let mut targets = vec![("forged", forged.pid())];
        if let Some(o) = &outsider {
            targets.push(("outsider", o.pid()));
        }
        for (what, pid) in targets {
            let start = selfheal::sys::pidfd::start_ticks(pid).expect("its start time");
            let e = restart(pid, start).expect_err(what);
            eprintln!("{what}: {e}");
            assert!(e.ends_with("left alone"), "{what}: {e}");
            assert_eq!(started("{{.State.StartedAt}}"), before, "{what}: restarted");
        }
        drop(forged);
        drop(outsider);
        // The real one still restarts (the legit case unchanged).
        let start = selfheal::sys::pidfd::start_ticks(init).expect("init's start time");
        restart(init, start).expect("restart of the container's own init");
        let after = started("{{.State.StartedAt}}");
        assert_ne!(after, before, "not restarted");
        // The same id now runs a new init: an act judged on the old one
        // is refused, never aimed at what now has the id.
        let e = restart(init, start).expect_err("the old init");
        eprintln!("the old init: {e}");
        assert!(e.ends_with("left alone"), "{e}");
        assert_eq!(started("{{.State.StartedAt}}"), after, "restarted again");
        // Stopped: never restarted, whatever the process.
        run_ok(docker(&sock).args(["stop", "-t", "1", &name])).expect("docker stop");
        let e = restart(
            std::process::id(),
            selfheal::sys::pidfd::start_ticks(std::process::id()).unwrap(),
        )
        .expect_err("a stopped container");
        eprintln!("stopped: {e}");
        assert!(e.ends_with("left alone"), "{e}");
        assert_eq!(started("{{.State.Status}}"), "exited");
    });
    cleanup();
    drop(dockerd);
    let _ = std::fs::remove_dir_all(&exec);
    rethrow(result);
}

/// The shipped ConfigMap's `match` line.
fn configmap_rule() -> String {
    let configmap = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/kubernetes/configmap.yaml"),
    )
    .unwrap();
    configmap
        .lines()
        .find(|l| l.trim_start().starts_with("match = {"))
        .expect("the ConfigMap's match rule")
        .trim()
        .to_string()
}

/// The environment of a check whose only runtime is containerd's state
/// directory `state` (Docker's and Podman's sockets absent).
fn containerd_only(scratch: &Scratch, state: &Path) -> Vec<(&'static str, String)> {
    vec![
        (
            "DOCKER_HOST",
            format!("unix://{}", scratch.join("no-docker.sock").display()),
        ),
        (
            "CONTAINER_HOST",
            format!("unix://{}", scratch.join("no-podman.sock").display()),
        ),
        ("SELFHEAL_CONTAINERD_STATE", state.display().to_string()),
        ("SELFHEAL_RUNTIME_TIMEOUT", "2s".to_string()),
    ]
}

/// A pod's cgroup shape (`kubepods-besteffort-pod<uid>.slice/
/// cri-containerd-<id>.scope`) in a user's tree, for a task containerd
/// knows (its OCI bundle with the kubelet's labels, as the shipped
/// ConfigMap's rule matches them), is not that pod.
#[test]
fn a_pod_a_user_made_in_their_own_tree_is_not_the_pod() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_pod_a_user_made_in_their_own_tree_is_not_the_pod";
    if !need_root(TEST) {
        return;
    }
    let scratch = Scratch::new("ident-pod");
    let id = format!("{:0>64}", format!("1dea{:x}", std::process::id()));
    let pod_uid = "5c1b4b8e-2f0e-4a57-9d7a-0d6a1c3e9b11";
    let state = scratch.join("containerd");
    let task = state.join("io.containerd.runtime.v2.task/k8s.io").join(&id);
    std::fs::create_dir_all(&task).unwrap();
    std::fs::write(
        task.join("config.json"),
        format!(
            r#"{{"ociVersion":"1.0.2","annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-name":"runner-0","io.kubernetes.cri.sandbox-namespace":"agents","io.kubernetes.cri.sandbox-uid":"{pod_uid}","io.kubernetes.cri.container-name":"runner"}}}}"#
        ),
    )
    .unwrap();
    let forged = match Placed::start(
        &format!(
            "{}/app.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{id}.scope",
            user_tree(ATTACKER),
            pod_uid.replace('-', "_")
        ),
        Some(ATTACKER),
    ) {
        Ok(p) => p,
        Err(e) => return skip(TEST, &format!("cannot make the cgroup: {e}")),
    };
    // The task's init as containerd would record it: the forged process
    // itself (the most an attacker could hope for).
    std::fs::write(task.join("init.pid"), forged.pid().to_string()).unwrap();
    let rule = configmap_rule();
    let config = tests::config_in(
        &scratch,
        format!(
            "[[agent]]\nname = \"pods\"\n{rule}\n\n[[agent]]\nname = \"forged\"\nmatch = {{ pid = {} }}\n",
            forged.pid()
        ),
    );
    let env = containerd_only(&scratch, &state);
    let report = config_check(&config, &env);
    assert_eq!(roots(&report, "pods"), Vec::<u32>::new(), "{report}");
    assert!(
        !section(&report, "forged").contains("container  "),
        "{report}"
    );
}

/// A tenant's pod whose own annotations claim the runner's pod, as a
/// runtime handler that passes pod annotations into the bundle
/// (containerd's `pod_annotations`) writes them: its container is
/// `tenant/evil-0`, as the CRI's keys say, and never joins the shipped
/// ConfigMap's agent, while the honest runner beside it does. A bundle
/// whose sandbox uid is not its cgroup's pod has no pod, and says why.
/// Each in a pod cgroup root made, in the kubelet's systemd shape.
#[test]
fn a_pods_own_annotations_do_not_make_it_the_runners_pod() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_pods_own_annotations_do_not_make_it_the_runners_pod";
    if !need_root(TEST) {
        return;
    }
    let scratch = Scratch::new("ident-podann");
    let state = scratch.join("containerd");
    let tasks = state.join("io.containerd.runtime.v2.task/k8s.io");
    let pid = std::process::id();
    // (pod namespace/name, sandbox uid in the bundle, the pod cgroup's
    // uid, the pod's own passed-through annotations)
    let evil_uid = format!("e7e70000-0000-4000-8000-{pid:012x}");
    let runner_uid = format!("a9e70000-0000-4000-8000-{pid:012x}");
    let other_uid = format!("0c4e0000-0000-4000-8000-{pid:012x}");
    let passed = r#""io.kubernetes.pod.namespace":"agents","io.kubernetes.pod.name":"runner-1","io.kubernetes.container.name":"runner","#;
    let pods = [
        ("tenant", "evil-0", &evil_uid, &evil_uid, passed),
        ("agents", "runner-0", &runner_uid, &runner_uid, ""),
        ("agents", "runner-2", &runner_uid, &other_uid, ""),
    ];
    let mut placed = Vec::new();
    for (i, (ns, name, uid, cgroup_uid, extra)) in pods.iter().enumerate() {
        let id = format!("{:0>64}", format!("1dea{i}{pid:x}"));
        let task = tasks.join(&id);
        std::fs::create_dir_all(&task).unwrap();
        std::fs::write(
            task.join("config.json"),
            format!(
                r#"{{"ociVersion":"1.0.2","annotations":{{{extra}"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"{}","io.kubernetes.cri.sandbox-namespace":"{ns}","io.kubernetes.cri.sandbox-name":"{name}","io.kubernetes.cri.sandbox-uid":"{uid}","io.kubernetes.cri.container-name":"runner","io.kubernetes.cri.image-name":"reg/runner:1"}}}}"#,
                "5".repeat(64)
            ),
        )
        .unwrap();
        // Each its own kubepods root, so each removes all it made.
        let kubepods = format!("selfheal-ident-{pid}-{i}-kubepods");
        let p = match Placed::start(
            &format!(
                "{kubepods}.slice/{kubepods}-besteffort.slice/{kubepods}-besteffort-pod{}.slice/cri-containerd-{id}.scope",
                cgroup_uid.replace('-', "_")
            ),
            Some(ATTACKER),
        ) {
            Ok(p) => p,
            Err(e) => return skip(TEST, &format!("cannot make the pod's cgroup: {e}")),
        };
        std::fs::write(task.join("init.pid"), p.pid().to_string()).unwrap();
        placed.push((id, p));
    }
    let rule = configmap_rule();
    assert_eq!(
        rule,
        r#"match = { namespace = "agents", pod = "runner-*" }"#
    );
    let mut text = format!("[[agent]]\nname = \"pods\"\n{rule}\n");
    for (i, (_, p)) in placed.iter().enumerate() {
        text.push_str(&format!(
            "\n[[agent]]\nname = \"p{i}\"\nmatch = {{ pid = {} }}\n",
            p.pid()
        ));
    }
    let env = containerd_only(&scratch, &state);
    let report = check_config_text(&scratch.join("config.toml"), &text, &env);
    assert_eq!(roots(&report, "pods"), [placed[1].1.pid()], "{report}");
    let container = |i: usize| {
        section(&report, &format!("p{i}"))
            .lines()
            .find_map(|l| l.trim().strip_prefix("container  "))
            .unwrap_or_else(|| panic!("p{i} has no container line: {report}"))
            .to_string()
    };
    let short = |i: usize| placed[i].0[..12].to_string();
    assert_eq!(
        container(0),
        format!(
            "runner ({}, containerd, image reg/runner:1, pod tenant/evil-0)",
            short(0)
        )
    );
    assert_eq!(
        container(2),
        format!(
            "runner ({}, containerd, image reg/runner:1, no pod: its runtime names pod \
             agents/runner-2 with uid {runner_uid}, but its cgroup is pod {other_uid}'s)",
            short(2)
        )
    );
}

/// The attacker's other way to forge a line of `/proc/PID/cgroup`: a
/// cgroup name with a newline and a `0::/system.slice/…` after it. The
/// kernel refuses such a name, so every line read is one hierarchy's.
#[test]
fn a_cgroup_name_cannot_forge_a_line() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_cgroup_name_cannot_forge_a_line";
    if !need_root(TEST) {
        return;
    }
    let Some(root) = cgroup2_root() else {
        return skip(TEST, "no cgroup v2 hierarchy");
    };
    // The first component of such a path (`ident-PID⏎0::`, then
    // `system.slice/docker-ID.scope` below it).
    let name = format!("ident-{}\n0::", std::process::id());
    match std::fs::create_dir(root.join(&name)) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
        Ok(()) => {
            let _ = std::fs::remove_dir(root.join(&name));
            panic!("the kernel made a cgroup whose name holds a newline");
        }
    }
}

/// Right before a unit agent's step is taken, its process is checked
/// again: still in the unit, by its cgroup now. A process moved out of the
/// unit since it was matched (into another unit, or a same-named cgroup in
/// a user's tree) is refused, named with where it is now; so is one that
/// exited; one still there passes.
#[test]
fn a_unit_agents_process_is_rechecked_in_its_unit_right_before_a_step() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_unit_agents_process_is_rechecked_in_its_unit_right_before_a_step";
    use selfheal::{agents::still_in_unit, sys::pidfd::start_ticks};
    use selfheal_core::config::UnitOwner;
    if !need_root(TEST) {
        return;
    }
    let me = std::process::id();
    let unit = format!("ident-move-{me}.service");
    let agent = match Placed::start(&format!("system.slice/{unit}"), None) {
        Ok(p) => p,
        Err(e) => return skip(TEST, &format!("cannot make a unit's cgroup: {e}")),
    };
    let other = Placed::start(&format!("system.slice/ident-elsewhere-{me}.service"), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let forged = Placed::start(
        &format!("{}/app.slice/{unit}", user_tree(ATTACKER)),
        Some(ATTACKER),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let pid = agent.pid();
    let start = start_ticks(pid).expect("running");
    let root = cgroup2_root().expect("cgroup v2");
    let move_to = |dir: &str| {
        std::fs::write(root.join(dir).join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} to {dir}: {e}"))
    };

    let here = still_in_unit(&unit, UnitOwner::System, pid, start);
    eprintln!("in its unit: {here:?}");
    assert_eq!(here, Ok(()));

    move_to(&format!("system.slice/ident-elsewhere-{me}.service"));
    let moved = still_in_unit(&unit, UnitOwner::System, pid, start);
    eprintln!("moved to another unit: {moved:?}");
    let moved = moved.unwrap_err().to_string();
    assert!(
        moved.contains("is no longer in") && moved.contains(&format!("ident-elsewhere-{me}")),
        "{moved}"
    );

    move_to(&format!("{}/app.slice/{unit}", user_tree(ATTACKER)));
    let named = still_in_unit(&unit, UnitOwner::System, pid, start);
    eprintln!("moved to a same-named cgroup in a user's tree: {named:?}");
    assert!(named.is_err(), "{named:?}");
    // That place is the user's unit, for a rule that names the user's.
    assert_eq!(
        still_in_unit(&unit, UnitOwner::User(ATTACKER), pid, start),
        Ok(())
    );

    move_to(&format!("system.slice/{unit}"));
    assert_eq!(still_in_unit(&unit, UnitOwner::System, pid, start), Ok(()));
    let wrong_start = still_in_unit(&unit, UnitOwner::System, pid, start + 1);
    assert!(
        wrong_start
            .as_ref()
            .is_err_and(|e| e.to_string().contains("is gone")),
        "another process under the pid: {wrong_start:?}"
    );
    drop(agent);
    let gone = still_in_unit(&unit, UnitOwner::System, pid, start);
    eprintln!("exited: {gone:?}");
    assert!(gone.is_err_and(|e| e.to_string().contains("is gone")));
    drop((other, forged));
}

/// The same as for Docker, on a real Podman (rootful, its API service on a
/// socket of the test's own): a `libpod-<id>.scope` a user made in their
/// own tree for root's container's id is no container; a host process
/// root put in the container's own cgroup is not taken for it (not in its
/// init's pid namespace); the restart's act-time check refuses both and
/// still restarts the container's own init.
#[test]
fn a_podman_container_is_a_processs_only_where_the_runtime_says() {
    let _area = tests::area(module_path!());
    use tests::runtimes::start_podman;
    const TEST: &str = "a_podman_container_is_a_processs_only_where_the_runtime_says";
    let Some((scratch, tar)) = podman_ready(TEST, "ident-podman") else {
        return;
    };
    let tag = format!("selfheal-identp{}", std::process::id());
    let podman = start_podman(&scratch, &tar, &tag).unwrap_or_else(|e| panic!("podman: {e}"));
    let name = format!("{tag}-runner");
    let id = podman.id.trim().to_string();
    let inspect = |what: &str| {
        run_ok(
            Command::new("podman")
                .args(&podman.args)
                .args(["inspect", "-f", what, &name]),
        )
        .expect("podman inspect")
        .trim()
        .to_string()
    };
    let result = std::panic::catch_unwind(|| {
        let init: u32 = inspect("{{.State.Pid}}").parse().expect("State.Pid");
        let (forged, outsider) = impostors(TEST, &format!("libpod-{id}.scope"), &id, init);
        let mut env = only_docker(&scratch, &scratch.join("no-docker.sock"), "5s");
        env[1].1 = format!("unix://{}", podman.sock.display());
        impostors_are_not_the_container(
            &scratch,
            &env,
            &name,
            &id,
            init,
            "podman",
            &forged,
            outsider.as_ref(),
        );
        let sources = selfheal::runtime::Sources {
            docker: scratch.join("no-docker.sock"),
            podman: podman.sock.clone(),
            containerd_state: scratch.join("no-containerd"),
            timeout: Duration::from_secs(5),
        };
        let before = inspect("{{.State.StartedAt}}");
        let mut targets = vec![("forged", forged.pid())];
        if let Some(o) = &outsider {
            targets.push(("outsider", o.pid()));
        }
        let restart = |pid: u32| {
            selfheal::runtime::restart::restart_container(
                &sources,
                selfheal_core::runtime::Runtime::Podman,
                &id,
                pid,
                selfheal::sys::pidfd::start_ticks(pid).expect("its start time"),
                Duration::from_secs(1),
                Duration::from_secs(30),
                &selfheal::runtime::restart::pid_namespace_here,
            )
            .map_err(|e| e.to_string())
        };
        for (what, pid) in targets {
            let e = restart(pid).expect_err(what);
            eprintln!("{what}: {e}");
            assert!(e.ends_with("left alone"), "{what}: {e}");
            assert_eq!(inspect("{{.State.StartedAt}}"), before, "{what}: restarted");
        }
        drop(forged);
        drop(outsider);
        restart(init).expect("restart of the container's own init");
        assert_ne!(inspect("{{.State.StartedAt}}"), before, "not restarted");
    });
    podman.stop();
    rethrow(result);
}
