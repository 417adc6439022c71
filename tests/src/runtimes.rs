//! Container runtimes for the tests: a `dockerd` of a test's
//! own in scratch directories, a busybox root filesystem to import (no
//! registry), and the environment that points selfheal at them. Shared by
//! the container, deployment and image tests.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    Scratch,
    fixtures::{Places, check_cmd},
    wait_for,
};

/// The environment that points selfheal at `docker` for Docker and at
/// nothing for the others.
pub fn only_docker(scratch: &Scratch, docker: &Path, timeout: &str) -> Vec<(&'static str, String)> {
    vec![
        ("DOCKER_HOST", format!("unix://{}", docker.display())),
        (
            "CONTAINER_HOST",
            format!("unix://{}", scratch.join("no-podman.sock").display()),
        ),
        (
            "SELFHEAL_CONTAINERD_STATE",
            scratch.join("no-containerd").display().to_string(),
        ),
        ("SELFHEAL_RUNTIME_TIMEOUT", timeout.to_string()),
    ]
}

/// A daemon child stopped (SIGTERM, then SIGKILL after 20 s) on drop.
pub struct Daemon {
    pub child: Child,
    pub name: &'static str,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("{} did not stop on SIGTERM: killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `program` is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A root filesystem with a static busybox (`sleep`, `sh`), as a tar.
pub fn rootfs_tar(scratch: &Scratch) -> Result<PathBuf, String> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        return Err("no /bin/busybox (Debian package busybox-static)".into());
    }
    let root = scratch.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(busybox, root.join("bin/busybox")).map_err(|e| e.to_string())?;
    for applet in ["sh", "sleep"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let tar = scratch.join("rootfs.tar");
    let ok = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(tar).ok_or_else(|| "tar failed".into())
}

/// Runs `cmd` (stdin closed); its stdout, or its stderr as the error.
pub fn run_ok(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A `dockerd` of this test's own (socket, data and exec roots in
/// `scratch`; no bridge, no iptables, vfs storage).
pub fn start_dockerd(scratch: &Scratch, exec: &Path) -> Result<(Daemon, PathBuf), String> {
    let sock = scratch.join("docker.sock");
    let child = Command::new("dockerd")
        .args([
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--storage-driver=vfs",
        ])
        .arg(format!("--data-root={}", scratch.join("docker").display()))
        .arg(format!("--exec-root={}", exec.display()))
        .arg(format!(
            "--pidfile={}",
            scratch.join("docker.pid").display()
        ))
        .arg(format!("--host=unix://{}", sock.display()))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(scratch.join("dockerd.log")).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("spawn dockerd: {e}"))?;
    let d = Daemon {
        child,
        name: "dockerd",
    };
    let up = wait_for(Duration::from_secs(60), Duration::from_millis(250), || {
        run_ok(docker(&sock).arg("version")).ok()
    });
    if up.is_none() {
        let log = std::fs::read_to_string(scratch.join("dockerd.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        return Err(format!("dockerd did not come up in 60 s: {tail:?}"));
    }
    Ok((d, sock))
}

/// The cgroup v2 hierarchy: `/sys/fs/cgroup` on a v2 host, its `unified`
/// mount on a hybrid one.
pub fn cgroup2_root() -> Option<PathBuf> {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists())
}

/// `selfheal config check --config CONFIG` with `env` (the runtimes'
/// places), run.
pub fn config_check_output(config: &Path, env: &[(&str, String)]) -> std::process::Output {
    Command::new(crate::selfheal_bin())
        .args(["config", "check", "--config"])
        .arg(config)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run selfheal config check")
}

/// Whether `test` runs as root with every one of `programs` installed;
/// else it is skipped, with `hint` where a program is missing.
pub fn need_root_and(test: &str, programs: &[&str], hint: &str) -> bool {
    crate::need_root(test) && need_programs(test, programs, hint)
}

/// [`need_root_and`] `dockerd` and `docker`.
pub fn need_docker(test: &str) -> bool {
    need_root_and(
        test,
        &["dockerd", "docker"],
        "run `cargo xtask setup`: Debian docker.io",
    )
}

/// Skips `test` (returns `false`) unless every one of `programs` is on the
/// PATH; the reason names the first missing one and `hint`, what installs it.
pub fn need_programs(test: &str, programs: &[&str], hint: &str) -> bool {
    match programs.iter().find(|p| !have(p)) {
        Some(p) => {
            crate::skip_tool_missing(test, p, hint);
            false
        }
        None => true,
    }
}

/// A [`start_dockerd`] of the test's own with the busybox root filesystem
/// ([`rootfs_tar`]) imported as `image`.
pub struct DockerImage {
    pub dockerd: Daemon,
    pub sock: PathBuf,
    /// dockerd's exec root, for the test to remove at its end.
    pub exec: PathBuf,
    /// The root filesystem imported, for other runtimes to import too.
    pub tar: PathBuf,
    /// `selfheal-TAGPID`: the image's name, and its containers' names start
    /// with it.
    pub tag: String,
    /// `TAG:1`.
    pub image: String,
}

/// Starts a `dockerd` in `scratch` (exec root `/run/shd-PID-SHORT`: it
/// holds containerd's socket, so its path stays short) and imports the
/// busybox root filesystem as `selfheal-TAGPID:1`. `None`, with `test`
/// skipped, without busybox; a dockerd that does not come up panics.
pub fn docker_with_image(
    test: &str,
    scratch: &Scratch,
    short: &str,
    tag: &str,
) -> Option<DockerImage> {
    let tar = match rootfs_tar(scratch) {
        Ok(t) => t,
        Err(e) => {
            crate::skip(test, &e);
            return None;
        }
    };
    let exec = PathBuf::from(format!("/run/shd-{}-{short}", std::process::id()));
    let (dockerd, sock) = start_dockerd(scratch, &exec).unwrap_or_else(|e| panic!("{e}"));
    let tag = format!("selfheal-{tag}{}", std::process::id());
    let image = format!("{tag}:1");
    run_ok(docker(&sock).arg("import").arg(&tar).arg(&image)).expect("docker import");
    Some(DockerImage {
        dockerd,
        sock,
        exec,
        tar,
        tag,
        image,
    })
}

/// What a Podman test needs before it starts Podman: root, `podman`, the
/// scratch directory `scratch_tag` and the busybox root filesystem in it.
/// `None`, with `test` skipped, where one is missing.
pub fn podman_ready(test: &str, scratch_tag: &str) -> Option<(Scratch, PathBuf)> {
    if !crate::need_root(test) {
        return None;
    }
    if !have("podman") {
        crate::skip_tool_missing(test, "podman", "run `cargo xtask setup`: Debian podman");
        return None;
    }
    let scratch = Scratch::new(scratch_tag);
    match rootfs_tar(&scratch) {
        Ok(tar) => Some((scratch, tar)),
        Err(e) => {
            crate::skip(test, &e);
            None
        }
    }
}

/// `docker run -d --name NAME --label L… IMAGE /bin/sleep 600`: the new
/// container's id (with its newline).
pub fn run_sleeper(sock: &Path, name: &str, labels: &[&str], image: &str) -> String {
    let mut cmd = docker(sock);
    cmd.args(["run", "-d", "--name", name]);
    for l in labels {
        cmd.args(["--label", l]);
    }
    run_ok(cmd.args([image, "/bin/sleep", "600"])).expect("docker run")
}

/// `docker -H unix://SOCK`.
pub fn docker(sock: &Path) -> Command {
    let mut c = Command::new("docker");
    c.arg("-H").arg(format!("unix://{}", sock.display()));
    c
}

/// One `selfheal check --json --agent AGENT` that may act (no helper:
/// root acts directly); its line and its log.
pub fn check_acting(
    config: &Path,
    scratch: &Scratch,
    env: &[(&str, String)],
    agent: &str,
) -> (serde_json::Value, String) {
    check_json_args(config, scratch, env, agent, &[])
}

/// `selfheal check --json --agent AGENT ARGS…` with state and snapshots in
/// `scratch`, no helper, and `env` (the runtimes' places): its one line and
/// its log (stderr).
pub fn check_json_args(
    config: &Path,
    scratch: &Scratch,
    env: &[(&str, String)],
    agent: &str,
    args: &[&str],
) -> (serde_json::Value, String) {
    let out = check_cmd(config, &Places::without_helper(&scratch.0))
        .args(["--agent", agent])
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run selfheal check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    let line = serde_json::from_str(text.lines().next().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {text:?} {log}"));
    (line, log)
}

/// `cargo xtask TASK --debug --out OUT` (`package` or `image`) of this
/// tree (the debug build the tests use): the file it wrote in `out`, the
/// one named `*.EXT`.
pub fn xtask_build(task: &str, out: &Path, ext: &str) -> PathBuf {
    run_ok(
        crate::cargo()
            .args(["run", "-q", "-p", "xtask", "--", task, "--debug", "--out"])
            .arg(out),
    )
    .unwrap_or_else(|e| panic!("cargo xtask {task}: {e}"));
    std::fs::read_dir(out)
        .unwrap_or_else(|e| panic!("{}: {e}", out.display()))
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == ext))
        .unwrap_or_else(|| panic!("no *.{ext} in {}", out.display()))
}

/// Writes to `path` the config of agent `name`, matched by `rule` (the
/// inside of `match = { … }`), whose control upstream (192.0.2.1:443, a
/// documentation address) never answers: past a 1 s `suspect_after` it is
/// wedged, and the one rung it may take is a restart through its runtime
/// (grace 1 s). `heal_extra` ends its `[agent.heal]` table.
pub fn runtime_restart_config(path: &Path, name: &str, rule: &str, heal_extra: &str) {
    std::fs::write(
        path,
        format!(
            "[[agent]]\nname = \"{name}\"\nmatch = {{ {rule} }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"192.0.2.1:443\"\n\
             [agent.thresholds]\nsuspect_after = \"1s\"\n\
             [agent.heal]\nsockets = false\nrestart = {{ runtime = true }}\ngrace = \"1s\"\n\
             {heal_extra}"
        ),
    )
    .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// The runtime restart rung of [`runtime_restart_config`]'s agent: a first
/// check of `agent` starts its silence; a second, 1.2 s later, finds it
/// `wedged` and restarts its container through its runtime, its first
/// action, done. Both checks' lines and the second one's log (printed, with
/// how long it took).
pub fn restarted_by_runtime(
    config: &Path,
    scratch: &Scratch,
    env: &[(&str, String)],
    agent: &str,
) -> (serde_json::Value, serde_json::Value, String) {
    let (first, _) = check_acting(config, scratch, env, agent);
    std::thread::sleep(Duration::from_millis(1_200));
    let t = std::time::Instant::now();
    let (line, log) = check_acting(config, scratch, env, agent);
    eprintln!("{log}the healing check took {:?}", t.elapsed());
    assert_eq!(line["verdict"], "wedged", "{line}");
    let action = &line["heal"]["actions"][0];
    assert_eq!(action["step"]["action"], "restart_container", "{line}");
    assert_eq!(action["ok"], true, "{line}");
    (first, line, log)
}

/// A Podman container (storage in `scratch`) and the compatible API service
/// on a socket of its own.
pub struct Podman {
    pub service: Daemon,
    pub sock: PathBuf,
    pub args: Vec<String>,
    pub tag: String,
    pub id: String,
    /// Podman keeps a blob cache in /var/lib/containers whatever `--root`
    /// says: removed on stop when this test made it.
    pub made_var_lib: bool,
}

impl Podman {
    pub fn stop(self) {
        let name = format!("{}-runner", self.tag);
        let _ = run_ok(
            Command::new("podman")
                .args(&self.args)
                .args(["rm", "-f", "-t", "0", &name]),
        );
        drop(self.service);
        let image = format!("localhost/{}:1", self.tag);
        let _ = run_ok(
            Command::new("podman")
                .args(&self.args)
                .args(["rmi", "-f", &image]),
        );
        if self.made_var_lib {
            let _ = std::fs::remove_dir_all("/var/lib/containers");
        }
    }
}

/// `sleep 600` in a Podman container `name` of `image` (no network),
/// with Podman's global `args` and `extra` run options: its id.
pub fn podman_sleeper(
    args: &[String],
    image: &str,
    name: &str,
    extra: &[&str],
) -> Result<String, String> {
    // Limits no higher than this process's own: runc may not raise them.
    run_ok(
        Command::new("podman")
            .args(args)
            .args([
                "run",
                "-d",
                "--network=none",
                "--ulimit=nofile=1024:1024",
                "--ulimit=nproc=1024:1024",
                "--name",
                name,
            ])
            .args(extra)
            .args([image, "/bin/sleep", "600"]),
    )
}

pub fn start_podman(scratch: &Scratch, tar: &Path, tag: &str) -> Result<Podman, String> {
    let args: Vec<String> = vec![
        format!("--root={}", scratch.join("podman/root").display()),
        format!("--runroot={}", scratch.join("podman/run").display()),
        "--storage-driver=vfs".into(),
        "--cgroup-manager=cgroupfs".into(),
        "--events-backend=file".into(),
    ];
    let image = format!("localhost/{tag}:1");
    let made_var_lib = !Path::new("/var/lib/containers").exists();
    run_ok(
        Command::new("podman")
            .args(&args)
            .arg("import")
            .arg(tar)
            .arg(&image),
    )?;
    let id = podman_sleeper(
        &args,
        &image,
        &format!("{tag}-runner"),
        &["--label", "app=runner"],
    )?;
    let sock = scratch.join("podman.sock");
    let child = Command::new("podman")
        .args(&args)
        .args(["system", "service", "--time=0"])
        .arg(format!("unix://{}", sock.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("podman system service: {e}"))?;
    let service = Daemon {
        child,
        name: "podman system service",
    };
    wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
        sock.exists().then_some(())
    })
    .ok_or("podman's API socket did not appear in 30 s")?;
    Ok(Podman {
        service,
        sock,
        args,
        tag: tag.to_string(),
        id,
        made_var_lib,
    })
}
