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
    process::Command,
    time::{Duration, Instant},
};

use selfheal_testbed::scenario::{Bed, FAST, Options};
use tests::fixtures::rethrow;
use tests::{
    Scratch,
    runtimes::{docker, docker_with_image, need_root_and, only_docker, run_ok},
    selfheal_bin, testbed_bin,
};

fn ip(args: &[&str]) -> Result<String, String> {
    run_ok(Command::new("ip").args(args))
}

/// A testbed runner in a Docker container of `image` with no network of
/// Docker's: its namespace gets a veth to the dispatch server's namespace
/// (10.`subnets.0`.n.0/24) and one to the provider's (10.`subnets.1`.n.0/24),
/// then `/flag/RUNNER` appears and the runner starts (exec: the shell's pid).
struct Container {
    runner: &'static str,
    name: String,
    label: &'static str,
    /// The `[agent.heal]` lines.
    heal: &'static str,
    subnets: (u8, u8),
    /// Prefix of the veths' names (at most 4 bytes).
    dev: &'static str,
}

impl Container {
    /// Starts it, adds its agent (matched by its label only) to the bed's
    /// config, and wires its network: its pid and container id.
    fn start(
        &self,
        bed: &mut Bed,
        sock: &std::path::Path,
        image: &str,
        flag: &std::path::Path,
        n: u8,
    ) -> (u32, String) {
        let (dispatch, provider) = (bed.dispatch_addr(), bed.provider());
        let bin = testbed_bin();
        let runner = format!(
            "while [ ! -e /flag/{r} ]; do sleep 0.1; done; exec /selfheal-testbed runner \
             --name {r} --dispatch {dispatch} --provider {provider} --provider-path '{FAST}' \
             --status 127.0.0.1:9001 --heartbeat 1000ms --mode blocking",
            r = self.runner
        );
        let mut cmd = docker(sock);
        cmd.args(["run", "-d", "--name", &self.name, "--network", "none"])
            .args(["--label", self.label])
            .arg("-v")
            .arg(format!("{}:/selfheal-testbed:ro", bin.display()))
            .args(["-v", "/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu:ro"])
            .args(["-v", "/lib64:/lib64:ro"])
            .arg("-v")
            .arg(format!("{}:/flag:ro", flag.display()))
            .args([image, "/bin/sh", "-c", &runner]);
        let block = format!(
            "[[agent]]\nname = \"{}\"\nmatch = {{ label = \"{}\" }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"{dispatch}\"\nheartbeat = \"1000ms\"\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{provider}\"\n\
             [agent.thresholds]\nsuspect_after = \"2s\"\nrecv_blocked = \"2s\"\n\
             [agent.heal]\n{}",
            self.runner, self.label, self.heal
        );
        bed.spawn(&format!("{}-docker", self.runner), cmd, Some(block))
            .expect("docker run");
        let inspect =
            |format: &str| run_ok(docker(sock).args(["inspect", "--format", format, &self.name]));
        let pid: u32 = tests::wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
            inspect("{{.State.Pid}}")
                .ok()?
                .parse()
                .ok()
                .filter(|p| *p > 0)
        })
        .expect("the container runs");
        let id = inspect("{{.Id}}").expect("its id");
        let net = format!("/proc/{pid}/ns/net");
        let pid_s = pid.to_string();
        let (a, b) = self.subnets;
        for (ns, host_end, sub, peer_ip) in [
            (
                &bed.topo.dispatch.name,
                format!("{}d{n}", self.dev),
                a,
                dispatch.ip().to_string(),
            ),
            (
                &bed.topo.provider.name,
                format!("{}p{n}", self.dev),
                b,
                provider.ip().to_string(),
            ),
        ] {
            let (cip, hip) = (format!("10.{sub}.{n}.1"), format!("10.{sub}.{n}.2"));
            let inner = format!("{host_end}i");
            ip(&[
                "-n", ns, "link", "add", &host_end, "type", "veth", "peer", "name", &inner,
                "netns", &pid_s,
            ])
            .expect("veth");
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{hip}/24"),
                "dev",
                &host_end,
            ])
            .expect("addr");
            ip(&["-n", ns, "link", "set", &host_end, "up"]).expect("up");
            let nsip = |args: &[&str]| {
                run_ok(
                    Command::new("nsenter")
                        .arg(format!("--net={net}"))
                        .arg("ip")
                        .args(args),
                )
            };
            nsip(&["addr", "add", &format!("{cip}/24"), "dev", &inner]).expect("addr in");
            nsip(&["link", "set", &inner, "up"]).expect("up in");
            nsip(&["link", "set", "lo", "up"]).expect("lo");
            nsip(&["route", "add", &format!("{peer_ip}/32"), "via", &hip]).expect("route");
        }
        std::fs::write(flag.join(self.runner), "").unwrap();
        (pid, id)
    }
}

#[test]
fn the_incident_in_a_docker_container_is_healed_by_the_socket_rung_same_container_same_pid() {
    let _area = tests::area(module_path!());
    const TEST: &str =
        "the_incident_in_a_docker_container_is_healed_by_the_socket_rung_same_container_same_pid";
    if !need_root_and(
        TEST,
        &["dockerd", "docker", "nft", "ip", "nsenter"],
        "run `cargo xtask setup`",
    ) {
        return;
    }
    let scratch = Scratch::new("container-socket-rung");
    let sock = scratch.join("docker.sock");
    let Some(d) = docker_with_image(TEST, &scratch, "s", "s") else {
        return;
    };
    let (dockerd, sock2, tag, image, exec) = (d.dockerd, d.sock, d.tag, d.image, d.exec);
    assert_eq!(sock, sock2);
    let name = format!("{tag}-runner");

    let n = (std::process::id() % 200) as u8 + 30;
    let opts = Options {
        selfheal: selfheal_bin(),
        testbed: testbed_bin(),
        heartbeat: Duration::from_secs(1),
        check_every: Duration::from_secs(1),
        net: n,
        keep_snapshots: None,
        env: only_docker(&scratch, &sock, "5s"),
        check_args: Vec::new(),
    };
    let flag = scratch.join("flag");
    std::fs::create_dir_all(&flag).unwrap();
    let result = std::panic::catch_unwind(|| {
        let mut bed = Bed::new(&opts, "ctr", Duration::from_secs(1)).expect("the testbed");
        let first = Container {
            runner: "crunner",
            name: name.clone(),
            label: "app=runner",
            heal: "step_window = \"5s\"\nbackoff = \"1s\"\n",
            subnets: (252, 251),
            dev: "shc",
        };
        let (pid, id) = first.start(&mut bed, &sock, &image, &flag, n);
        let inspect =
            |format: &str| run_ok(docker(&sock).args(["inspect", "--format", format, &name]));

        let row = bed
            .wait_working("crunner", 1)
            .expect("the runner in the container works");
        let peer: SocketAddr = row["peer"]
            .as_str()
            .and_then(|p| p.parse().ok())
            .expect("peer");
        let (old_conn, done_before) = (row["conn"].as_u64(), row["done"].as_u64().unwrap_or(0));
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
        let (mut detect, mut recover) = (None, None);
        let mut heals = Vec::new();
        let mut longest_check = Duration::ZERO;
        for _ in 0..60 {
            std::thread::sleep(opts.check_every);
            let tick = Instant::now();
            let run = bed.check().expect("check");
            longest_check = longest_check.max(tick.elapsed());
            let Some(o) = run.of("crunner") else {
                panic!("{run:?}")
            };
            if detect.is_none() && o["verdict"] == "wedged" {
                detect = Some(fault.elapsed());
                eprintln!("wedged: {}", o["reasons"]);
            }
            for a in o["heal"]["actions"].as_array().into_iter().flatten() {
                heals.push(format!(
                    "{} ok={}",
                    a["step"]["action"].as_str().unwrap_or("?"),
                    a["ok"]
                ));
            }
            let row = bed.row("crunner").expect("row");
            let back = row["conn"].as_u64() > old_conn
                && row["done"].as_u64().unwrap_or(0) > done_before
                && row["status"] == "connected";
            if back && recover.is_none() {
                recover = Some(fault.elapsed());
            }
            if back && detect.is_some() && o["verdict"] != "wedged" {
                break;
            }
        }
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
        let second = Container {
            runner: "crunner2",
            name: format!("{name}2"),
            label: "app=runner2",
            heal: "sockets = false\nrestart = { runtime = true }\ngrace = \"1s\"\n\
                   step_window = \"30s\"\nbackoff = \"1s\"\n",
            subnets: (250, 249),
            dev: "shx",
        };
        let (pid2, id2) = second.start(&mut bed, &sock, &image, &flag, n);
        let inspect2 = |format: &str| {
            run_ok(docker(&sock).args(["inspect", "--format", format, &second.name]))
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
    let _ = run_ok(docker(&sock).args(["rm", "-f", &name, &format!("{name}2")]));
    let _ = run_ok(docker(&sock).args(["rmi", "-f", &image]));
    drop(dockerd);
    let _ = std::fs::remove_dir_all(&exec);
    rethrow(result);
}
