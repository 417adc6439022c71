//! Agents in containers: matched by container name, label, pod
//! and namespace on real runtimes (a `dockerd`, a Podman API service and a
//! `containerd` each started here, in scratch directories, with an image
//! imported from a root filesystem made here: no registry), and a runtime
//! that hangs, answers garbage or refuses is a gap within the bound, never
//! a hang.

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tests::fixtures::Places;
use tests::fixtures::rethrow;
use tests::runtimes::cgroup2_root;
use tests::runtimes::config_check_output;
use tests::{
    Scratch, need_root,
    runtimes::{
        Daemon, check_json_args, docker, docker_with_image, have, need_docker, need_root_and,
        only_docker, restarted_by_runtime, rootfs_tar, run_ok, run_sleeper, runtime_restart_config,
        start_podman,
    },
    selfheal_bin, skip, wait_for,
};

/// A process in a cgroup named like a container's (`/selfheal-test-PID/ID`
/// in the cgroup v2 hierarchy): what the cgroup parser sees of a container,
/// with no runtime at all. Killed and its cgroup removed on drop.
struct FakeContainer {
    child: Child,
    dir: PathBuf,
    parent: PathBuf,
    id: String,
}

/// 64 hex digits that differ in every test and run (splitmix64 over the
/// time, the pid and `tag`).
fn random_id(tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = nanos ^ u64::from(std::process::id()).rotate_left(32);
    for b in tag.bytes() {
        x = x.rotate_left(8) ^ u64::from(b);
    }
    (0..4)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            format!("{:016x}", z ^ (z >> 31))
        })
        .collect()
}

impl FakeContainer {
    /// [`FakeContainer::start`] for root's `test`; `None`, with `test`
    /// skipped, without root or a cgroup to make.
    fn for_test(test: &str, tag: &str) -> Option<FakeContainer> {
        if !need_root(test) {
            return None;
        }
        FakeContainer::start(tag)
            .map_err(|e| skip(test, &format!("cannot make a container's cgroup: {e}")))
            .ok()
    }

    fn start(tag: &str) -> Result<FakeContainer, String> {
        let root = cgroup2_root().ok_or("no cgroup v2 hierarchy")?;
        let parent = root.join(format!("selfheal-test-{}-{tag}", std::process::id()));
        let id = random_id(tag);
        let dir = parent.join(&id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let child = Command::new("sleep")
            .arg("600")
            .spawn()
            .map_err(|e| format!("spawn sleep: {e}"))?;
        let c = FakeContainer {
            child,
            dir,
            parent,
            id,
        };
        std::fs::write(c.dir.join("cgroup.procs"), c.child.id().to_string())
            .map_err(|e| format!("move into {}: {e}", c.dir.display()))?;
        Ok(c)
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The cgroup empties once the process is reaped.
        let _ = wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
            std::fs::remove_dir(&self.dir).ok()
        });
        let _ = std::fs::remove_dir(&self.parent);
    }
}

/// A unix socket server that runs `serve` on each connection, in a thread,
/// until dropped (bounded: it stops after 120 s whatever happens).
struct FakeRuntime {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeRuntime {
    fn start(path: PathBuf, serve: fn(std::os::unix::net::UnixStream)) -> FakeRuntime {
        let listener = UnixListener::bind(&path).expect("bind the fake runtime");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(120);
            let mut held = Vec::new();
            while !flag.load(Ordering::Relaxed) && Instant::now() < end {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nonblocking(false);
                        held.push(std::thread::spawn(move || serve(s)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        FakeRuntime {
            path,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeRuntime {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads the request and never answers (holds the connection 10 s).
fn hang(mut s: std::os::unix::net::UnixStream) {
    let mut buf = [0u8; 1024];
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = s.read(&mut buf);
    std::thread::sleep(Duration::from_secs(10));
}

/// Answers HTTP 200 with a body that is no container list.
fn garbage(mut s: std::os::unix::net::UnixStream) {
    let mut buf = [0u8; 1024];
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let _ = s.read(&mut buf);
    let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\n[{\"Id\": 12, \"Names\": \"\x1b[31m\"}]");
}

/// `selfheal config check` with the runtimes at these places.
fn config_check(config: &Path, env: &[(&str, String)]) -> (i32, String, String, Duration) {
    let start = Instant::now();
    let out = config_check_output(config, env);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        start.elapsed(),
    )
}

/// `selfheal check --json --dry-run --agent AGENT` with the runtimes at
/// these places: its one line.
fn check_json(
    config: &Path,
    scratch: &Scratch,
    env: &[(&str, String)],
    agent: &str,
) -> serde_json::Value {
    check_json_args(config, scratch, env, agent, &["--dry-run"]).0
}

#[test]
fn without_a_runtime_the_cgroup_gives_the_id_and_a_hung_one_is_a_gap_within_the_bound() {
    let _area = tests::area(module_path!());
    const TEST: &str = "without_a_runtime_the_cgroup_gives_the_id";
    let Some(fake) = FakeContainer::for_test(TEST, "hang") else {
        return;
    };
    let scratch = Scratch::new("containers-hang");
    let config = tests::config_in(
        &scratch,
        format!(
            "[[agent]]\nname = \"byid\"\nmatch = {{ container = \"{}\" }}\n\n\
             [[agent]]\nname = \"bylabel\"\nmatch = {{ label = \"app=runner\" }}\n",
            &fake.id[..12]
        ),
    );
    let short = &fake.id[..12];

    // No runtime at all: the id still matches, and the gap says why the
    // name is unknown.
    let env = only_docker(&scratch, &scratch.join("no-docker.sock"), "1s");
    let (code, out, err, _) = config_check(&config, &env);
    assert_eq!(code, 0, "{out}{err}");
    let pid = fake.child.id();
    assert!(out.contains(&format!("processes  pid {pid} ")), "{out}");
    assert!(
        out.contains(&format!(
            "container  {short} (unknown, no runtime answered for it)"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "gap        container {short} (unknown by its cgroup): name, image and labels unknown: docker {}: no socket",
            scratch.join("no-docker.sock").display()
        )),
        "{out}"
    );
    assert!(
        out.contains("processes  none (no container matches label = \"app=runner\""),
        "{out}"
    );

    // A runtime that accepts and never answers: a gap within the bound.
    let hung = FakeRuntime::start(scratch.join("hang.sock"), hang);
    let env = only_docker(&scratch, &hung.path, "1s");
    let (code, out, err, took) = config_check(&config, &env);
    eprintln!("config check against a hung runtime took {took:?}");
    assert_eq!(code, 0, "{out}{err}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(
        took >= Duration::from_millis(900),
        "took {took:?}: did it ask?"
    );
    assert!(out.contains(&format!("processes  pid {pid} ")), "{out}");
    assert!(
        out.contains(&format!(
            "docker {}: no answer within 1s",
            hung.path.display()
        )),
        "{out}"
    );

    // check --json carries the identity and the gap.
    let start = Instant::now();
    let line = check_json(&config, &scratch, &env, "byid");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(line["containers"][0]["id"], fake.id.as_str(), "{line}");
    assert_eq!(
        line["containers"][0]["name"],
        serde_json::Value::Null,
        "{line}"
    );
    let gaps = line["gaps"].to_string();
    assert!(gaps.contains("no answer within 1s"), "{gaps}");
}

#[test]
fn a_runtime_that_answers_garbage_or_refuses_is_a_gap() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_runtime_that_answers_garbage_or_refuses_is_a_gap";
    let Some(fake) = FakeContainer::for_test(TEST, "garbage") else {
        return;
    };
    let scratch = Scratch::new("containers-garbage");
    let config = tests::config_in(
        &scratch,
        format!(
            "[[agent]]\nname = \"byid\"\nmatch = {{ container = \"{}*\" }}\n",
            &fake.id[..20]
        ),
    );
    let bad = FakeRuntime::start(scratch.join("garbage.sock"), garbage);
    let (code, out, err, took) = config_check(&config, &only_docker(&scratch, &bad.path, "2s"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(
        out.contains(&format!("processes  pid {} ", fake.child.id())),
        "{out}"
    );
    assert!(out.contains("bad answer: not a container list"), "{out}");
    // Nothing the runtime sent reaches the terminal raw.
    assert!(!out.contains('\x1b'), "{out:?}");

    // A socket nobody listens on: refused.
    let dead = scratch.join("dead.sock");
    drop(UnixListener::bind(&dead).unwrap());
    let (code, out, err, _) = config_check(&config, &only_docker(&scratch, &dead, "2s"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("connection refused"), "{out}");
}

#[test]
fn docker_and_podman_containers_are_matched_by_label_and_name() {
    let _area = tests::area(module_path!());
    const TEST: &str = "docker_and_podman_containers_are_matched_by_label_and_name";
    if !need_docker(TEST) {
        return;
    }
    let scratch = Scratch::new("containers-docker");
    let Some(d) = docker_with_image(TEST, &scratch, "a", "t") else {
        return;
    };
    let (dockerd, sock, tag, image, exec, tar) = (d.dockerd, d.sock, d.tag, d.image, d.exec, d.tar);
    let name = format!("{tag}-runner");
    let id = run_sleeper(&sock, &name, &["app=runner", "odd=a\"b\nc"], &image);
    let cleanup = || {
        let _ = run_ok(docker(&sock).args(["rm", "-f", &name]));
        let _ = run_ok(docker(&sock).args(["rmi", "-f", &image]));
    };

    // Podman too: two runtimes on one host. Installed, it must start.
    let podman = if have("podman") {
        Some(
            start_podman(&scratch, &tar, &tag)
                .unwrap_or_else(|e| panic!("podman is installed but does not start: {e}")),
        )
    } else {
        tests::skip_tool_missing(
            &format!("{TEST} (podman part)"),
            "podman",
            "run `cargo xtask setup`: Debian podman",
        );
        None
    };

    let config = tests::config_in(
        &scratch,
        format!(
            "[[agent]]\nname = \"bylabel\"\nmatch = {{ label = \"app=runner\" }}\n\n\
             [[agent]]\nname = \"byname\"\nmatch = {{ container = \"{tag}-run*\" }}\n\n\
             [[agent]]\nname = \"byodd\"\nmatch = {{ label = \"odd=a\\\"b\\nc\", image = \"{tag}:*\" }}\n"
        ),
    );
    let mut env = only_docker(&scratch, &sock, "5s");
    if let Some(p) = &podman {
        env[1].1 = format!("unix://{}", p.sock.display());
    }
    let (code, out, err, took) = config_check(&config, &env);
    eprintln!("{out}config check took {took:?}");
    let result = std::panic::catch_unwind(|| {
        assert_eq!(code, 0, "{out}{err}");
        let want = format!("container  {name} ({}, docker, image {image})", &id[..12]);
        let sections: Vec<&str> = out.split("\nagent ").collect();
        let section = |agent: &str| {
            sections
                .iter()
                .find(|s| s.starts_with(agent))
                .unwrap_or_else(|| panic!("no agent {agent} in {out}"))
                .to_string()
        };
        for agent in ["bylabel", "byname", "byodd"] {
            assert!(section(agent).contains(&want), "{agent}: {out}");
        }
        if let Some(p) = &podman {
            let want = format!("container  {}-runner ({}, podman,", p.tag, &p.id[..12]);
            assert!(section("bylabel").contains(&want), "{out}");
            assert!(!section("byodd").contains(&want), "{out}");
        }
        assert!(!out.contains("gap"), "{out}");

        // inspect, text and JSON.
        let inspect = |json: bool| {
            let mut c = Command::new(selfheal_bin());
            c.args(["inspect", "byodd", "--config"]).arg(&config);
            if json {
                c.arg("--json");
            }
            let out = c
                .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                .output()
                .expect("inspect");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let text = inspect(false);
        assert!(
            text.contains(&format!(
                "\n  container {name} ({}, docker, image {image})\n",
                &id[..12]
            )),
            "{text}"
        );
        let doc: serde_json::Value = serde_json::from_str(&inspect(true)).expect("inspect --json");
        assert_eq!(doc["containers"][0]["name"], name.as_str(), "{doc}");

        let line = check_json(&config, &scratch, &env, "byname");
        let c = &line["containers"][0];
        assert_eq!(c["id"], id.as_str(), "{line}");
        assert_eq!(c["name"], name.as_str(), "{line}");
        assert_eq!(c["image"], image.as_str(), "{line}");
        assert_eq!(c["runtime"], "docker", "{line}");
        // The name glob matches Podman's container of the same name too.
        let n = 1 + usize::from(podman.is_some());
        assert_eq!(
            line["containers"].as_array().map(Vec::len),
            Some(n),
            "{line}"
        );
        if let Some(p) = &podman {
            auto_on_podman(p, &scratch, &env);
        }
    });
    if let Some(p) = podman {
        let _ = run_ok(Command::new("podman").args(&p.args).args([
            "rm",
            "-f",
            "-t",
            "0",
            &format!("{}-auto", p.tag),
            &format!("{}-claims", p.tag),
        ]));
        p.stop();
    }
    cleanup();
    drop(dockerd);
    let _ = std::fs::remove_dir_all(&exec);
    rethrow(result);
}

/// `[auto] containers = true` on Podman: a container labelled
/// `selfheal.enable=true` is an agent named for its runtime, name and id,
/// checked with no `[[agent]]` table; one that claims the label through
/// its environment and a label of another value is in no outcome, and the
/// Docker container beside them (no such label) neither.
fn auto_on_podman(p: &tests::runtimes::Podman, scratch: &Scratch, env: &[(&str, String)]) {
    let image = format!("localhost/{}:1", p.tag);
    let run = |name: &str, extra: &[&str]| {
        tests::runtimes::podman_sleeper(&p.args, &image, name, extra)
            .unwrap_or_else(|e| panic!("podman run {name}: {e}"))
    };
    let (name, claims) = (format!("{}-auto", p.tag), format!("{}-claims", p.tag));
    let id = run(&name, &["--label", "selfheal.enable=true"]);
    let claims_id = run(
        &claims,
        &[
            "--env",
            "selfheal.enable=true",
            "--label",
            "selfheal.enable=yes",
        ],
    );
    let dir = scratch.join("auto");
    std::fs::create_dir_all(&dir).expect("the [auto] scratch directory");
    let config = tests::config_in(&dir, "[auto]\ncontainers = true\n");
    let out = tests::fixtures::check_cmd(&config, &Places::without_helper(&dir))
        .arg("--dry-run")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run selfheal check");
    let (text, log) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let agent = format!("auto.podman.{name}.{}", &id[..12]);
    assert_eq!(
        lines.iter().map(|l| l["agent"].clone()).collect::<Vec<_>>(),
        [serde_json::Value::from(agent.as_str())],
        "{text}{log}"
    );
    let c = &lines[0]["containers"][0];
    assert_eq!(c["runtime"], "podman", "{text}");
    assert_eq!(c["id"], id.as_str(), "{text}");
    assert_eq!(c["name"], name.as_str(), "{text}");
    assert!(!text.contains(&claims_id[..12]), "{text}");
}

/// `sleep 600` as uid 65534 in cgroup `rel` below that user's delegated
/// tree (`user.slice/user-65534.slice/user@65534.service/`) of the v2
/// hierarchy, made for it: the process, and the directories made (to
/// remove, deepest last). `None` where the cgroup cannot be made.
fn forged_in_users_tree(rel: &str) -> Option<(Child, Vec<PathBuf>)> {
    use std::os::unix::process::CommandExt as _;
    let mut dir = cgroup2_root()?;
    let mut made = Vec::new();
    let path = format!("user.slice/user-65534.slice/user@65534.service/{rel}");
    for c in path.split('/') {
        dir.push(c);
        if !dir.exists() {
            std::fs::create_dir(&dir).ok()?;
            made.push(dir.clone());
        }
    }
    let child = Command::new("sleep")
        .arg("600")
        .uid(65534)
        .gid(65534)
        .spawn()
        .ok()?;
    std::fs::write(dir.join("cgroup.procs"), child.id().to_string()).ok()?;
    Some((child, made))
}

/// Removes `rel` (a cgroup path) and its now-empty parents up to but not
/// including `keep_depth` components, in every hierarchy mounted under
/// /sys/fs/cgroup.
fn remove_cgroup_dirs(rel: &str, keep_depth: usize) {
    let Ok(mounts) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
    let roots: Vec<PathBuf> = mounts
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .chain(std::iter::once(PathBuf::from("/sys/fs/cgroup")))
        .collect();
    for root in roots {
        for depth in (keep_depth + 1..=comps.len()).rev() {
            let _ = std::fs::remove_dir(root.join(comps[..depth].join("/")));
        }
    }
}

#[test]
fn a_containerd_task_with_kubelet_labels_is_matched_by_pod_and_namespace() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_containerd_task_with_kubelet_labels_is_matched_by_pod_and_namespace";
    if !need_root_and(
        TEST,
        &["containerd", "ctr", "runc"],
        "run `cargo xtask setup`: Debian containerd",
    ) {
        return;
    }
    let scratch = Scratch::new("containers-containerd");
    if let Err(e) = rootfs_tar(&scratch) {
        return skip(TEST, &e);
    }
    let sock = scratch.join("containerd.sock");
    let state = scratch.join("state");
    std::fs::write(
        scratch.join("containerd.toml"),
        format!(
            "version = 2\nroot = \"{}\"\nstate = \"{}\"\n[grpc]\n  address = \"{}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  disable_cgroup = true\n",
            scratch.join("root").display(),
            state.display(),
            sock.display()
        ),
    )
    .unwrap();
    let child = Command::new("containerd")
        .arg("--config")
        .arg(scratch.join("containerd.toml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(scratch.join("containerd.log")).unwrap())
        .spawn()
        .expect("spawn containerd");
    let containerd = Daemon {
        child,
        name: "containerd",
    };
    let ctr = || {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(&sock)
            .args(["--namespace", "k8s.io"]);
        c
    };
    wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
        run_ok(ctr().arg("version")).ok()
    })
    .expect("containerd answers within 30 s");

    let id = random_id("containerd");
    let pod_uid = format!("5e1f0000-0000-4000-8000-{:012x}", std::process::id());
    let pod_cgroup = format!("/kubepods/besteffort/pod{pod_uid}");
    let pod = format!("runner-{}", std::process::id());
    // What containerd's CRI writes in a pod's container's bundle (here
    // through ctr, with the cgroup path the kubelet's cgroupfs driver would
    // choose).
    let started = run_ok(
        ctr()
            .args(["run", "-d", "--cgroup"])
            .arg(format!("{pod_cgroup}/{id}"))
            .args(["--label", &format!("io.kubernetes.cri.sandbox-name={pod}")])
            .args(["--label", "io.kubernetes.cri.sandbox-namespace=agents"])
            .args([
                "--label",
                &format!("io.kubernetes.cri.sandbox-uid={pod_uid}"),
            ])
            .args(["--label", "io.kubernetes.cri.container-name=runner"])
            .arg("--rootfs")
            .arg(scratch.join("rootfs"))
            .arg(&id)
            .args(["/bin/sleep", "600"]),
    );
    let cleanup = || {
        let _ = run_ok(ctr().args(["task", "kill", "--signal", "SIGKILL", &id]));
        let _ = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
            run_ok(ctr().args(["task", "rm", &id])).ok()
        });
        let _ = run_ok(ctr().args(["container", "rm", &id]));
        remove_cgroup_dirs(&pod_cgroup, 1);
    };
    if let Err(e) = started {
        cleanup();
        drop(containerd);
        panic!("ctr run: {e}");
    }

    let config = tests::config_in(
        &scratch,
        format!(
            "[[agent]]\nname = \"pod\"\nmatch = {{ pod = \"runner-*\", namespace = \"agents\" }}\n\
             [[agent.probe]]\nhealth_file = \"{}\"\nmax_age = \"1m\"\n\n\
             [[agent]]\nname = \"elsewhere\"\nmatch = {{ pod = \"runner-*\", namespace = \"other\" }}\n",
            scratch.join("no-health-file").display()
        ),
    );
    let env: Vec<(&str, String)> = vec![
        (
            "DOCKER_HOST",
            format!("unix://{}", scratch.join("no-docker.sock").display()),
        ),
        (
            "CONTAINER_HOST",
            format!("unix://{}", scratch.join("no-podman.sock").display()),
        ),
        ("SELFHEAL_CONTAINERD_STATE", state.display().to_string()),
    ];
    let result = std::panic::catch_unwind(|| {
        let (code, out, err, _) = config_check(&config, &env);
        assert_eq!(code, 0, "{out}{err}");
        let want = format!(
            "container  runner ({}, containerd, pod agents/{pod})",
            &id[..12]
        );
        assert!(out.contains(&want), "{out}");
        assert!(
            out.contains(
                "processes  none (no container matches pod = \"runner-*\", namespace = \"other\""
            ),
            "{out}"
        );
        // The same pod's cgroup shape made by an ordinary user (65534) in
        // their own delegated tree, for this real task's id: not the pod.
        let forged = forged_in_users_tree(&format!(
            "app.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{id}.scope",
            pod_uid.replace('-', "_")
        ));
        let (code, out, err, _) = config_check(&config, &env);
        let forged_pid = forged.as_ref().map(|(c, _)| c.id());
        if let Some((mut c, dirs)) = forged {
            let _ = c.kill();
            let _ = c.wait();
            for d in dirs.iter().rev() {
                let _ = wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
                    std::fs::remove_dir(d).ok()
                });
            }
        }
        assert_eq!(code, 0, "{out}{err}");
        let pid = forged_pid.expect("the forged process");
        let pod_line = out
            .split("\nagent ")
            .find(|s| s.starts_with("pod\n"))
            .and_then(|s| s.lines().find(|l| l.trim_start().starts_with("processes")))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string();
        assert!(
            !pod_line.contains(&pid.to_string()),
            "the user's process {pid} taken for the pod: {out}"
        );
        // The probe fails (no health file): unresponsive, so a snapshot is
        // written, and it carries the pod too.
        let prom = scratch.join("metrics.prom");
        let (line, log) = check_json_args(
            &config,
            &scratch,
            &env,
            "pod",
            &["--dry-run", "--metrics-file", prom.to_str().unwrap()],
        );
        // The transition's log line and the metrics carry the pod too.
        assert!(
            log.contains(&format!(" container={}/runner pod=agents/{pod}", &id[..12])),
            "{log}"
        );
        let metrics = std::fs::read_to_string(&prom).expect("metrics file");
        assert!(
            metrics.contains(&format!(
                "selfheal_agent_container_info{{agent=\"pod\",runtime=\"containerd\",id=\"{id}\",\
                 name=\"runner\",image=\"\",pod=\"{pod}\",namespace=\"agents\"}} 1"
            )),
            "{metrics}"
        );
        let c = &line["containers"][0];
        assert_eq!(c["id"], id.as_str(), "{line}");
        assert_eq!(c["pod"], pod.as_str(), "{line}");
        assert_eq!(c["namespace"], "agents", "{line}");
        assert_eq!(c["pod_uid"], pod_uid.as_str(), "{line}");
        assert_eq!(c["runtime"], "containerd", "{line}");
        let snapshot = line["snapshot"]
            .as_str()
            .unwrap_or_else(|| panic!("{line}"));
        let text = tests::show_snapshot(snapshot, &scratch.join("snaps"));
        assert!(
            text.contains(&format!("\"pod\":\"{pod}\""))
                || text.contains(&format!("\"pod\": \"{pod}\"")),
            "{text}"
        );

        // The runtime restart rung: wedged (its control upstream gone past
        // `suspect_after`), the pod's container has its task killed
        // (SIGTERM, then SIGKILL after the grace: `sleep` as pid 1 ignores
        // SIGTERM) for its controller to replace. There is no kubelet here,
        // so the task stays stopped, which is what is checked.
        let heal = scratch.join("heal.toml");
        runtime_restart_config(
            &heal,
            "podheal",
            "pod = \"runner-*\", namespace = \"agents\"",
            "",
        );
        let (_, line, _) = restarted_by_runtime(&heal, &scratch, &env, "podheal");
        let action = &line["heal"]["actions"][0];
        assert_eq!(action["step"]["runtime"], "containerd", "{line}");
        let tasks = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
            let ls = run_ok(ctr().args(["task", "ls"])).ok()?;
            ls.lines()
                .any(|l| l.starts_with(&id[..12]) && l.contains("STOPPED"))
                .then_some(ls)
        });
        assert!(tasks.is_some(), "the task was not stopped: {line}");
    });
    cleanup();
    drop(containerd);
    rethrow(result);
}

/// The cost of identity: one `check` over N containers' agents matched by
/// label, against the same agents matched by pid (with the runtime asked for
/// their identity, and with no runtime at all). Prints the three times
/// (median of 3) and the ratios. N is `SELFHEAL_CONTAINERS_N` (default 20:
/// each container costs dockerd about a second here).
#[test]
fn cost_of_a_check_by_label_against_by_pid() {
    let _area = tests::area(module_path!());
    const TEST: &str = "cost_of_a_check_by_label_against_by_pid";
    if !need_docker(TEST) {
        return;
    }
    let n: usize = std::env::var("SELFHEAL_CONTAINERS_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| (1..=500).contains(n))
        .unwrap_or(20);
    let scratch = Scratch::new("containers-cost");
    let Some(d) = docker_with_image(TEST, &scratch, "b", "cost") else {
        return;
    };
    let (dockerd, sock, tag, image, exec) = (d.dockerd, d.sock, d.tag, d.image, d.exec);
    let mut ids = Vec::new();
    let started = Instant::now();
    for i in 0..n {
        let id = run_ok(docker(&sock).args([
            "run",
            "-d",
            "--name",
            &format!("{tag}-{i}"),
            "--label",
            "app=runner",
            "--label",
            &format!("idx={i}"),
            &image,
            "/bin/sleep",
            "900",
        ]));
        match id {
            Ok(id) => ids.push(id),
            Err(e) => {
                eprintln!("container {i}: {e}");
                break;
            }
        }
    }
    eprintln!(
        "{} containers started in {:?}",
        ids.len(),
        started.elapsed()
    );
    let result = std::panic::catch_unwind(|| {
        assert_eq!(ids.len(), n, "not every container started");
        let pids: Vec<String> = ids
            .iter()
            .map(|id| {
                run_ok(docker(&sock).args(["inspect", "-f", "{{.State.Pid}}", id])).expect("pid")
            })
            .collect();
        let by_label = scratch.join("by-label.toml");
        let by_pid = scratch.join("by-pid.toml");
        let mut a = String::new();
        let mut b = String::new();
        for (i, pid) in pids.iter().enumerate() {
            a.push_str(&format!(
                "[[agent]]\nname = \"c{i}\"\nmatch = {{ label = [\"app=runner\", \"idx={i}\"] }}\n\n"
            ));
            b.push_str(&format!(
                "[[agent]]\nname = \"c{i}\"\nmatch = {{ pid = {pid} }}\n\n"
            ));
        }
        std::fs::write(&by_label, a).unwrap();
        std::fs::write(&by_pid, b).unwrap();
        let with_docker = only_docker(&scratch, &sock, "5s");
        let no_runtime = only_docker(&scratch, &scratch.join("no-docker.sock"), "5s");
        let time = |config: &Path, env: &[(&str, String)], want_ids: bool| {
            let mut runs = Vec::new();
            for _ in 0..3 {
                let start = Instant::now();
                let out = Command::new(selfheal_bin())
                    .args(["check", "--json", "--dry-run", "--config"])
                    .arg(config)
                    .args(Places::without_helper(&scratch).args())
                    .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
                    .output()
                    .expect("check");
                runs.push(start.elapsed());
                let text = String::from_utf8_lossy(&out.stdout);
                let lines: Vec<serde_json::Value> = text
                    .lines()
                    .map(|l| serde_json::from_str(l).expect("JSON line"))
                    .collect();
                assert_eq!(lines.len(), n, "{text}");
                for (i, line) in lines.iter().enumerate() {
                    assert_ne!(line["verdict"], "down", "{line}");
                    if want_ids {
                        assert_eq!(line["containers"][0]["id"], ids[i].as_str(), "{line}");
                        assert_eq!(
                            line["containers"][0]["name"],
                            format!("{tag}-{i}"),
                            "{line}"
                        );
                    }
                }
            }
            runs.sort();
            runs[1]
        };
        let label = time(&by_label, &with_docker, true);
        let pid = time(&by_pid, &with_docker, true);
        let bare = time(&by_pid, &no_runtime, false);
        eprintln!(
            "COST check over {n} containers: by label {label:?}, by pid {pid:?} \
             (identity from dockerd), by pid with no runtime {bare:?}; \
             label/pid {:.2}, label/bare {:.2}",
            label.as_secs_f64() / pid.as_secs_f64(),
            label.as_secs_f64() / bare.as_secs_f64()
        );
    });
    for i in 0..ids.len() {
        let _ = run_ok(docker(&sock).args(["rm", "-f", &format!("{tag}-{i}")]));
    }
    let _ = run_ok(docker(&sock).args(["rmi", "-f", &image]));
    drop(dockerd);
    let _ = std::fs::remove_dir_all(&exec);
    rethrow(result);
}
