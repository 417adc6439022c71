//! A testbed runner in a Docker container of the test's own dockerd, with
//! no network of Docker's: the test gives the container's network namespace
//! two veths of its own, one to the dispatch server's namespace and one to
//! the provider's (`container_socket_rung`, `auto`).

use std::{
    process::Command,
    time::{Duration, Instant},
};

use selfheal_testbed::scenario::{Bed, CheckRun, FAST, Options};
use serde_json::Value;

use crate::{
    runtimes::{docker, run_ok},
    testbed_bin,
};

fn ip(args: &[&str]) -> Result<String, String> {
    run_ok(Command::new("ip").args(args))
}

/// A testbed runner in a Docker container of `image` with no network of
/// Docker's: its namespace gets a veth to the dispatch server's namespace
/// (10.`subnets.0`.n.0/24) and one to the provider's (10.`subnets.1`.n.0/24),
/// then `/flag/RUNNER` appears and the runner starts (exec: the shell's pid).
pub struct RunnerContainer {
    pub runner: &'static str,
    pub name: String,
    /// `docker run --label` of each.
    pub labels: Vec<String>,
    /// `docker run --env` of each.
    pub env: Vec<String>,
    pub subnets: (u8, u8),
    /// Prefix of the veths' names (at most 4 bytes).
    pub dev: &'static str,
}

impl RunnerContainer {
    /// Runner `runner` in container `name`, labelled `label`, its veths on
    /// `subnets` and named from `dev`; no environment of its own.
    pub fn new(
        runner: &'static str,
        name: &str,
        label: &str,
        subnets: (u8, u8),
        dev: &'static str,
    ) -> RunnerContainer {
        RunnerContainer {
            runner,
            name: name.to_string(),
            labels: vec![label.to_string()],
            env: Vec::new(),
            subnets,
            dev,
        }
    }

    /// Its `[[agent]]` block, matched by `label` only, with the `[agent.heal]`
    /// lines `heal`.
    pub fn agent(&self, bed: &Bed, label: &str, heal: &str) -> String {
        format!(
            "[[agent]]\nname = \"{}\"\nmatch = {{ label = \"{label}\" }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"{}\"\nheartbeat = \"1000ms\"\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{}\"\n\
             [agent.thresholds]\nsuspect_after = \"2s\"\nrecv_blocked = \"2s\"\n\
             [agent.heal]\n{heal}",
            self.runner,
            bed.dispatch_addr(),
            bed.provider(),
        )
    }

    /// Starts it, adds `config` to the bed's config, and wires its network:
    /// its pid and container id.
    pub fn start(
        &self,
        bed: &mut Bed,
        sock: &std::path::Path,
        image: &str,
        flag: &std::path::Path,
        n: u8,
        config: Option<String>,
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
            .args(self.labels.iter().flat_map(|l| ["--label", l.as_str()]))
            .args(self.env.iter().flat_map(|e| ["--env", e.as_str()]))
            .arg("-v")
            .arg(format!("{}:/selfheal-testbed:ro", bin.display()))
            .args(["-v", "/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu:ro"])
            .args(["-v", "/lib64:/lib64:ro"])
            .arg("-v")
            .arg(format!("{}:/flag:ro", flag.display()))
            .args([image, "/bin/sh", "-c", &runner]);
        bed.spawn(&format!("{}-docker", self.runner), cmd, config)
            .expect("docker run");
        let inspect =
            |format: &str| run_ok(docker(sock).args(["inspect", "--format", format, &self.name]));
        let pid: u32 = crate::wait_for(Duration::from_secs(30), Duration::from_millis(100), || {
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

/// The bed's options of a runner-container test: checks every second
/// through the helper, heartbeats every second, the runtimes asked only
/// the dockerd at `sock`.
pub fn bed_options(scratch: &crate::Scratch, sock: &std::path::Path, n: u8) -> Options {
    Options {
        selfheal: crate::selfheal_bin(),
        testbed: testbed_bin(),
        heartbeat: Duration::from_secs(1),
        check_every: Duration::from_secs(1),
        net: n,
        keep_snapshots: None,
        env: crate::runtimes::only_docker(scratch, sock, "5s"),
        check_args: Vec::new(),
    }
}

/// What a runner-container test starts from: a dockerd of its own with the
/// busybox image, the bed's options and an empty flag directory.
pub struct DockerBed {
    pub scratch: crate::Scratch,
    pub docker: crate::runtimes::DockerImage,
    pub opts: Options,
    pub flag: std::path::PathBuf,
    /// The bed's network number (and the containers' veths').
    pub n: u8,
}

/// [`DockerBed`] for `test` in scratch directory `scratch`; `None`, the test
/// skipped, without root, the tools or busybox.
pub fn docker_bed(test: &str, scratch: &str, short: &str) -> Option<DockerBed> {
    if !crate::runtimes::need_root_and(
        test,
        &["dockerd", "docker", "nft", "ip", "nsenter"],
        "run `cargo xtask setup`",
    ) {
        return None;
    }
    let scratch = crate::Scratch::new(scratch);
    let docker = crate::runtimes::docker_with_image(test, &scratch, short, short)?;
    let n = (std::process::id() % 200) as u8 + 30;
    let opts = bed_options(&scratch, &docker.sock, n);
    let flag = scratch.join("flag");
    std::fs::create_dir_all(&flag).expect("the flag directory");
    Some(DockerBed {
        scratch,
        docker,
        opts,
        flag,
        n,
    })
}

impl DockerBed {
    /// Removes `containers` and the image, stops the dockerd, removes its
    /// exec root, then passes on the test's `result` (a panic again).
    pub fn finish(self, containers: &[&str], result: std::thread::Result<()>) {
        let sock = &self.docker.sock;
        let _ = run_ok(docker(sock).args(["rm", "-f"]).args(containers));
        let _ = run_ok(docker(sock).args(["rmi", "-f", &self.docker.image]));
        let exec = self.docker.exec.clone();
        drop(self.docker);
        let _ = std::fs::remove_dir_all(&exec);
        crate::fixtures::rethrow(result);
    }
}

/// What the checks after a cut saw of `agent`.
pub struct Healing {
    /// When it was first found wedged, after the cut.
    pub detect: Option<Duration>,
    /// When its runner had reattached and taken work again.
    pub recover: Option<Duration>,
    /// Each step taken: `ACTION ok=BOOL`.
    pub heals: Vec<String>,
    /// The longest check's own run time.
    pub longest_check: Duration,
}

/// Each step of an outcome `o`: `ACTION ok=BOOL`.
pub fn steps(o: &Value) -> Vec<String> {
    o["heal"]["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            format!(
                "{} ok={}",
                a["step"]["action"].as_str().unwrap_or("?"),
                a["ok"]
            )
        })
        .collect()
}

/// Checks every `bed.opts.check_every` (at most 60 times) after the cut
/// at `fault` of runner `runner` (whose dispatch row was `old` before it),
/// until `agent` was found wedged and is no longer, and the runner has
/// reattached and taken work again; `also` sees every check.
pub fn after_cut(
    bed: &Bed,
    agent: &str,
    runner: &str,
    fault: Instant,
    old: &Value,
    also: &mut dyn FnMut(&CheckRun),
) -> Healing {
    let (old_conn, done_before) = (old["conn"].as_u64(), old["done"].as_u64().unwrap_or(0));
    let mut h = Healing {
        detect: None,
        recover: None,
        heals: Vec::new(),
        longest_check: Duration::ZERO,
    };
    for _ in 0..60 {
        std::thread::sleep(bed.opts.check_every);
        let tick = Instant::now();
        let run = bed.check().expect("check");
        h.longest_check = h.longest_check.max(tick.elapsed());
        also(&run);
        let Some(o) = run.of(agent) else {
            panic!("no {agent} in {run:?}")
        };
        if h.detect.is_none() && o["verdict"] == "wedged" {
            h.detect = Some(fault.elapsed());
            eprintln!("{agent} wedged: {}", o["reasons"]);
        }
        h.heals.extend(steps(o));
        let row = bed.row(runner).expect("row");
        let back = row["conn"].as_u64() > old_conn
            && row["done"].as_u64().unwrap_or(0) > done_before
            && row["status"] == "connected";
        if back && h.recover.is_none() {
            h.recover = Some(fault.elapsed());
        }
        if back && h.detect.is_some() && o["verdict"] != "wedged" {
            break;
        }
    }
    h
}
