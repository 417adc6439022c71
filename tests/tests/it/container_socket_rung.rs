//! The incident inside a Docker container: the testbed's runner
//! runs in a container of a real `dockerd` of this test's own (a busybox
//! root filesystem made here, the host's `selfheal-testbed` binary and its
//! libraries bind-mounted read-only: no registry), with no network of
//! Docker's: the test gives the container's network namespace two veths of
//! its own, one to the dispatch server's namespace and one to the
//! provider's. The fault is the incident's (the dispatch side drops the
//! attach flow both ways, no FIN or RST). The runner, matched by
//! `label = "app=runner"` only, is judged wedged within the host's bound
//! and healed by the socket rung through the root helper: same container,
//! same pid. Then a second runner container, with the socket rungs off, is
//! healed through `restart = { runtime = true }` (Docker's API restart).
//!
//! Alone in its binary: it points selfheal at its dockerd through the
//! environment (`DOCKER_HOST`), set before any other thread runs.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use selfheal_testbed::scenario::Bed;
use tests::{
    runner_container::{Healing, RunnerContainer, after_cut, docker_bed},
    runtimes::{docker, run_ok},
};

#[test]
fn the_incident_in_a_docker_container_is_healed_by_the_socket_rung_same_container_same_pid() {
    let _area = tests::area(module_path!());
    const TEST: &str =
        "the_incident_in_a_docker_container_is_healed_by_the_socket_rung_same_container_same_pid";
    let Some(b) = docker_bed(TEST, "container-socket-rung", "s") else {
        return;
    };
    let (opts, flag, n) = (&b.opts, &b.flag, b.n);
    let (sock, tag, image) = (&b.docker.sock, &b.docker.tag, &b.docker.image);
    let name = format!("{tag}-runner");
    let result = std::panic::catch_unwind(|| {
        let mut bed = Bed::new(opts, "ctr", Duration::from_secs(1)).expect("the testbed");
        let first = RunnerContainer::new("crunner", &name, "app=runner", (252, 251), "shc");
        let agent = first.agent(
            &bed,
            "app=runner",
            "step_window = \"5s\"\nbackoff = \"1s\"\n",
        );
        let (pid, id) = first.start(&mut bed, sock, image, flag, n, Some(agent));
        let inspect =
            |format: &str| run_ok(docker(sock).args(["inspect", "--format", format, &name]));

        let row = bed
            .wait_working("crunner", 1)
            .expect("the runner in the container works");
        let peer: SocketAddr = row["peer"]
            .as_str()
            .and_then(|p| p.parse().ok())
            .expect("peer");
        // A first check: all is well, and it is the container's.
        let run = bed.check().expect("check");
        let first = run
            .of("crunner")
            .unwrap_or_else(|| panic!("{run:?}"))
            .clone();
        assert_eq!(first["containers"][0]["id"], id.as_str(), "{first}");
        assert_ne!(first["verdict"], "wedged", "{first}");

        bed.topo.drop_flow(peer).expect("the fault");
        let fault = Instant::now();
        let Healing {
            detect,
            recover,
            heals,
            longest_check,
        } = after_cut(&bed, "crunner", "crunner", fault, &row, &mut |_| {});
        let detect = detect.expect("the runner in the container was found wedged");
        let recover = recover.expect("the runner reattached and took work again");
        eprintln!(
            "incident in a Docker container: detect {} ms, recover {} ms, heals {heals:?}",
            detect.as_millis(),
            recover.as_millis()
        );
        // The host's bound: 3 × heartbeat + a check interval + the longest
        // check's own time (at least an interval), as this run measured it.
        let bound = tests::wedge_bound_ms(
            opts.heartbeat,
            opts.check_every,
            longest_check.as_millis() as u64,
        );
        assert!(
            detect.as_millis() as u64 <= bound,
            "detected after {detect:?} (bound {bound} ms, checks took up to {longest_check:?})"
        );
        assert!(!heals.is_empty());
        for h in &heals {
            assert!(
                h.starts_with("arm_keepalive")
                    || h.starts_with("expire_keepalive")
                    || h.starts_with("destroy_socket"),
                "{heals:?}"
            );
        }
        // Same container, same pid.
        assert_eq!(inspect("{{.Id}}").as_deref(), Ok(id.as_str()));
        assert_eq!(inspect("{{.State.Pid}}").ok(), Some(pid.to_string()));

        // With the socket rungs off, the same incident on a second runner
        // container is healed through the runtime: Docker's API restart.
        // (Its new network namespace has no veths of ours: it restarts, it
        // does not reattach, which is not what is asked of it here.)
        let second = RunnerContainer::new(
            "crunner2",
            &format!("{name}2"),
            "app=runner2",
            (250, 249),
            "shx",
        );
        let agent = second.agent(
            &bed,
            "app=runner2",
            "sockets = false\nrestart = { runtime = true }\ngrace = \"1s\"\n\
             step_window = \"30s\"\nbackoff = \"1s\"\n",
        );
        let (pid2, id2) = second.start(&mut bed, sock, image, flag, n, Some(agent));
        let inspect2 = |format: &str| {
            run_ok(docker(sock).args(["inspect", "--format", format, &second.name]))
                .expect("docker inspect")
        };
        let row = bed
            .wait_working("crunner2", 1)
            .expect("the second runner works");
        let peer: SocketAddr = row["peer"]
            .as_str()
            .and_then(|p| p.parse().ok())
            .expect("peer");
        let started = inspect2("{{.State.StartedAt}}");
        bed.topo.drop_flow(peer).expect("the fault");
        let fault = Instant::now();
        let mut detect = None;
        let mut healed = None;
        for _ in 0..30 {
            std::thread::sleep(opts.check_every);
            let run = bed.check().expect("check");
            let Some(o) = run.of("crunner2") else {
                panic!("{run:?}")
            };
            if detect.is_none() && o["verdict"] == "wedged" {
                detect = Some(fault.elapsed());
            }
            if let Some(a) = o["heal"]["actions"].as_array().and_then(|a| a.first()) {
                healed = Some((fault.elapsed(), a.clone(), o["containers"][0]["id"].clone()));
                break;
            }
        }
        let detect = detect.expect("the second runner was found wedged");
        let (at, action, container) = healed.expect("a step was taken");
        assert_eq!(action["step"]["action"], "restart_container", "{action}");
        assert_eq!(action["step"]["id"], id2.as_str(), "{action}");
        assert_eq!(action["step"]["pid"], pid2, "{action}");
        assert_eq!(action["ok"], true, "{action}");
        assert_eq!(container, id2.as_str());
        let (started2, count, pid3) = (
            inspect2("{{.State.StartedAt}}"),
            inspect2("{{.RestartCount}}"),
            inspect2("{{.State.Pid}}"),
        );
        eprintln!(
            "incident in a Docker container, sockets off: detect {} ms, restarted through Docker's API {} ms after the fault; StartedAt {started} -> {started2}, pid {pid2} -> {pid3}, RestartCount {count}",
            detect.as_millis(),
            at.as_millis()
        );
        assert_ne!(started, started2, "started again");
        assert_ne!(pid3, pid2.to_string(), "a new process");
        assert_eq!(inspect2("{{.State.Status}}"), "running");
    });
    b.finish(&[&name, &format!("{name}2")], result);
}
