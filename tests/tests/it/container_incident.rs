//! Healing an agent in a container through its runtime: a real
//! `dockerd` of this test's own runs the agent in a container built from a
//! root filesystem made here (no registry); the agent, matched by
//! `label = "app=runner"` only, is wedged (its control upstream is gone
//! past `suspect_after`), and with the socket rungs off `check` heals it
//! with `restart = { runtime = true }`: the Engine API's restart, after the
//! snapshot. A container stopped on purpose (`docker stop`) is left alone.
//! The same rung through Podman's compatible API.

use std::{process::Command, time::Duration};

use tests::fixtures::rethrow;
use tests::{
    Scratch,
    runtimes::{
        check_acting, docker, docker_with_image, need_docker, only_docker, podman_ready,
        restarted_by_runtime, run_ok, run_sleeper, runtime_restart_config, start_podman,
    },
};

#[test]
fn a_wedged_container_is_restarted_through_docker_and_a_stopped_one_left_alone() {
    let _area = tests::area(module_path!());
    const TEST: &str =
        "a_wedged_container_is_restarted_through_docker_and_a_stopped_one_left_alone";
    if !need_docker(TEST) {
        return;
    }
    let scratch = Scratch::new("container-incident");
    let Some(d) = docker_with_image(TEST, &scratch, "i", "i") else {
        return;
    };
    let (dockerd, sock, tag, image, exec) = (d.dockerd, d.sock, d.tag, d.image, d.exec);
    let name = format!("{tag}-runner");
    let id = run_sleeper(&sock, &name, &["app=runner"], &image);
    let inspect = |format: &str| {
        run_ok(docker(&sock).args(["inspect", "--format", format, &name])).expect("docker inspect")
    };

    let config = scratch.join("config.toml");
    runtime_restart_config(
        &config,
        "runner",
        "label = \"app=runner\"",
        "step_window = \"30s\"\nbackoff = \"1s\"\n",
    );
    let env = only_docker(&scratch, &sock, "5s");

    let result = std::panic::catch_unwind(|| {
        let started = inspect("{{.State.StartedAt}}");
        let count = inspect("{{.RestartCount}}");
        let pid: u32 = inspect("{{.State.Pid}}").parse().expect("a pid");

        // The control upstream is absent: past `suspect_after` it is a
        // wedge, and the only rung allowed is the runtime's restart.
        let (first, line, log) = restarted_by_runtime(&config, &scratch, &env, "runner");
        assert_eq!(first["containers"][0]["id"], id.as_str(), "{first}");
        let snapshot = line["snapshot"]
            .as_str()
            .unwrap_or_else(|| panic!("no snapshot: {line}"));
        let actions = &line["heal"]["actions"];
        assert_eq!(actions[0]["step"]["id"], id.as_str(), "{line}");
        // Snapshot first: the snapshot names the container.
        let text = tests::show_snapshot(snapshot, &scratch.join("snaps"));
        assert!(text.contains(&id), "{text}");
        assert!(log.contains("restart docker container"), "{log}");

        let started2 = inspect("{{.State.StartedAt}}");
        let count2 = inspect("{{.RestartCount}}");
        let pid2: u32 = inspect("{{.State.Pid}}").parse().expect("a pid");
        eprintln!(
            "docker reports: StartedAt {started} -> {started2}, RestartCount {count} -> {count2}, pid {pid} -> {pid2}"
        );
        assert_eq!(inspect("{{.State.Status}}"), "running");
        assert_ne!(started, started2, "the container was started again");
        assert_ne!(pid, pid2, "a new process");
        // Docker counts in RestartCount only the restarts its restart policy
        // makes, not an API restart: what it reports, it reports unchanged.
        assert_eq!(count, count2, "RestartCount as Docker reports it");

        // Stopped on purpose: not the agent's to heal.
        run_ok(docker(&sock).args(["stop", "-t", "1", &name])).expect("docker stop");
        std::thread::sleep(Duration::from_millis(1_200));
        let (line, log) = check_acting(&config, &scratch, &env, "runner");
        eprintln!("{log}");
        assert_ne!(line["verdict"], "wedged", "{line}");
        assert!(!line.to_string().contains("restart_container"), "{line}");
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(inspect("{{.State.Status}}"), "exited", "left alone");
        assert_eq!(
            inspect("{{.State.StartedAt}}"),
            started2,
            "not started again"
        );

        // The rung's own re-check: a restart step for a container that is
        // stopped is refused (a state file of an older check may hold one).
        let step = selfheal_core::protocol::Act::RestartContainer(
            selfheal_core::protocol::ContainerRestart {
                runtime: selfheal_core::runtime::Runtime::Docker,
                id: id.clone(),
                pid: pid2,
                start_ticks: 0,
                grace_ms: 1_000,
                timeout_ms: 10_000,
            },
        );
        let e = selfheal::heal::direct::act_here(&step, &Default::default(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("left alone"), "{e}");
        assert_eq!(inspect("{{.State.Status}}"), "exited", "left alone");
    });
    let _ = run_ok(docker(&sock).args(["rm", "-f", &name]));
    let _ = run_ok(docker(&sock).args(["rmi", "-f", &image]));
    drop(dockerd);
    let _ = std::fs::remove_dir_all(&exec);
    rethrow(result);
}

/// The same rung through Podman's compatible API (its `system service` on a
/// socket of this test's own): the container, matched by label, wedged, is
/// restarted by `POST /containers/{id}/restart`.
#[test]
fn a_wedged_podman_container_is_restarted_through_its_api() {
    let _area = tests::area(module_path!());
    const TEST: &str = "a_wedged_podman_container_is_restarted_through_its_api";
    let Some((scratch, tar)) = podman_ready(TEST, "ci-podman") else {
        return;
    };
    let tag = format!("selfheal-p{}", std::process::id());
    // Podman is installed (podman_ready): one that cannot start is a
    // failure, not a skip.
    let podman = start_podman(&scratch, &tar, &tag)
        .unwrap_or_else(|e| panic!("podman is installed but does not start: {e}"));
    let name = format!("{tag}-runner");
    let inspect = |format: &str| {
        run_ok(
            Command::new("podman")
                .args(&podman.args)
                .args(["inspect", "--format", format, &name]),
        )
        .expect("podman inspect")
    };
    let config = scratch.join("config.toml");
    runtime_restart_config(&config, "runner", "label = \"app=runner\"", "");
    let mut env = only_docker(&scratch, &scratch.join("no-docker.sock"), "5s");
    env[1].1 = format!("unix://{}", podman.sock.display());
    let result = std::panic::catch_unwind(|| {
        let started = inspect("{{.State.StartedAt}}");
        let count = inspect("{{.RestartCount}}");
        let pid = inspect("{{.State.Pid}}");
        let (_, line, _) = restarted_by_runtime(&config, &scratch, &env, "runner");
        let action = &line["heal"]["actions"][0];
        assert_eq!(action["step"]["runtime"], "podman", "{line}");
        assert_eq!(action["step"]["id"], podman.id.as_str(), "{line}");
        let (started2, count2, pid2) = (
            inspect("{{.State.StartedAt}}"),
            inspect("{{.RestartCount}}"),
            inspect("{{.State.Pid}}"),
        );
        eprintln!(
            "podman reports: StartedAt {started} -> {started2}, RestartCount {count} -> {count2}, pid {pid} -> {pid2}"
        );
        assert_eq!(inspect("{{.State.Status}}"), "running");
        assert_ne!(started, started2, "started again");
        assert_ne!(pid, pid2, "a new process");
    });
    podman.stop();
    rethrow(result);
}
