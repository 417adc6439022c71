//! `[auto]` end to end, through the root helper as the timer runs it: a
//! testbed runner in a container of a real `dockerd` of the test's own,
//! labelled `selfheal.enable=true`, is watched with no `[[agent]]` table;
//! its outbound attach stream cut mid-stream (the dispatch side drops the
//! flow both ways, no FIN or RST) is judged wedged and healed by the
//! socket rung, same container, same pid, and it reattaches. A runner
//! container that claims the label by other means (the environment variable
//! `selfheal.enable=true`, a name holding `selfheal.enable-true`, the label
//! `selfheal.enable=yes`) is never watched, and the same cut stays unhealed.
//! A unit named in `[auto] units` (a cgroup below `system.slice` standing
//! in for the unit: PID 1 here is no systemd) is healed the same way,
//! while another unit's server, whose accepted connection is cut the same
//! way, stays healthy past the thresholds: an accepted connection has no
//! role. `inspect` names an `[auto]` agent as `check` does.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use selfheal_testbed::scenario::{Bed, CheckRun, FAST};
use serde_json::Value;
use tests::{
    Scratch,
    fixtures::rethrow,
    runner_container::{
        DockerBed, Healing, RunnerContainer, after_cut, bed_options, docker_bed, steps,
    },
    runtimes::{cgroup2_root, docker, need_root_and, run_ok},
};

/// `[auto]`'s tables (the section's own line is the test's).
const SETTINGS: &str = "[auto.thresholds]\nsuspect_after = \"2s\"\nrecv_blocked = \"2s\"\n\
                        [auto.heal]\nstep_window = \"5s\"\nbackoff = \"1s\"\n\
                        [auto.proof]\nidle = \"1s\"\ninterval = \"1s\"\ncount = 2\n";
const SUSPECT_AFTER: Duration = Duration::from_secs(2);
/// The proof's idle and its count of intervals.
const PROOF: Duration = Duration::from_secs(3);

fn peer(row: &Value) -> SocketAddr {
    row["peer"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .expect("peer")
}

/// The bound on finding a cut connection of an `[auto]` agent wedged, in
/// ms: its silence past `suspect_after`, the proof's probes, a check
/// interval, and the longest check's own run time twice (the check that
/// arms the proof, and the one that reads it), as this run measured it.
fn auto_bound_ms(check_every: Duration, longest_check: Duration) -> u64 {
    let every = check_every.as_millis() as u64;
    (SUSPECT_AFTER + PROOF).as_millis() as u64
        + every
        + 2 * (longest_check.as_millis() as u64).max(every)
}

/// The cut, healed, as [`after_cut`] saw it: `agent` was found wedged
/// within the bound, healed by the socket rung only, and its runner
/// `runner` reattached and took work again.
fn healed(bed: &Bed, agent: &str, runner: &str, healing: Healing) -> Healing {
    let detect = healing
        .detect
        .unwrap_or_else(|| panic!("{agent} was never found wedged"));
    let recover = healing
        .recover
        .unwrap_or_else(|| panic!("{runner} never reattached"));
    let bound = auto_bound_ms(bed.opts.check_every, healing.longest_check);
    eprintln!(
        "{agent}: wedged {} ms after the cut (bound {bound} ms, checks took up to {} ms), \
         reattached {} ms after it, heals {:?}",
        detect.as_millis(),
        healing.longest_check.as_millis(),
        recover.as_millis(),
        healing.heals
    );
    assert!(
        detect.as_millis() as u64 <= bound,
        "{agent} found after {detect:?} (bound {bound} ms)"
    );
    assert!(!healing.heals.is_empty());
    assert!(
        healing.heals.iter().any(|h| h == "destroy_socket ok=true"),
        "{:?}",
        healing.heals
    );
    for h in &healing.heals {
        assert!(
            ["arm_keepalive", "expire_keepalive", "destroy_socket"]
                .iter()
                .any(|s| h.starts_with(s)),
            "{:?}",
            healing.heals
        );
    }
    healing
}

#[test]
fn a_labelled_container_is_healed_and_one_claiming_the_label_otherwise_is_never_watched() {
    let _area = tests::area(module_path!());
    const TEST: &str =
        "a_labelled_container_is_healed_and_one_claiming_the_label_otherwise_is_never_watched";
    let Some(b) = docker_bed(TEST, "auto-containers", "a") else {
        return;
    };
    let tag = &b.docker.tag;
    let (name, claims) = (
        format!("{tag}-runner"),
        format!("{tag}-selfheal.enable-true"),
    );
    let (sock, image) = (&b.docker.sock, &b.docker.image);
    let (opts, flag, n) = (&b.opts, &b.flag, b.n);
    let result = std::panic::catch_unwind(|| {
        let mut bed = Bed::new(opts, "aut", Duration::from_secs(1)).expect("the testbed");
        let labelled =
            RunnerContainer::new("arunner", &name, "selfheal.enable=true", (244, 243), "sau");
        let section = format!("[auto]\ncontainers = true\n{SETTINGS}");
        let (pid, id) = labelled.start(&mut bed, sock, image, flag, n, Some(section));
        let mut claimer =
            RunnerContainer::new("aclaims", &claims, "selfheal.enable=yes", (242, 241), "sav");
        claimer.env.push("selfheal.enable=true".into());
        let (claimer_pid, claimer_id) = claimer.start(&mut bed, sock, image, flag, n, None);
        let agent = format!("auto.docker.{name}.{}", &id[..12]);
        let row = bed
            .wait_working("arunner", 1)
            .expect("the labelled runner works");
        let claimer_row = bed
            .wait_working("aclaims", 1)
            .expect("the other runner works");
        // Neither by its agent's name nor by its container: the claimer is
        // in no outcome.
        let unwatched = |run: &CheckRun| {
            for o in &run.outcomes {
                assert!(
                    !o.to_string().contains(&claimer_id[..12]),
                    "the container that is not labelled is watched: {o}"
                );
            }
        };
        let run = bed.check().expect("check");
        let first = run
            .of(&agent)
            .unwrap_or_else(|| panic!("no {agent}: {:?}", run.outcomes));
        assert_eq!(first["containers"][0]["id"], id.as_str(), "{first}");
        assert_ne!(first["verdict"], "wedged", "{first}");
        assert_eq!(run.outcomes.len(), 1, "{:?}", run.outcomes);
        unwatched(&run);

        bed.topo.drop_flow(peer(&row)).expect("the cut");
        bed.topo
            .drop_flow(peer(&claimer_row))
            .expect("the other cut");
        let fault = Instant::now();
        let healing = after_cut(&bed, &agent, "arunner", fault, &row, &mut |run| {
            unwatched(run)
        });
        healed(&bed, &agent, "arunner", healing);
        // `inspect` names the `[auto]` agent as check does: the labelled
        // container's process, judged against check's history; a name of
        // the same form that no container has is refused, saying what is.
        let (text, doc) = bed.inspect(&agent).expect("inspect the [auto] agent");
        assert_eq!(doc["agent"], agent.as_str(), "{doc}");
        assert!(
            doc["processes"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["pid"] == pid)),
            "{doc}"
        );
        assert!(doc["verdict"].is_string(), "{doc}");
        assert!(text.starts_with(&format!("agent {agent} ")), "{text}");
        let none = format!("auto.docker.{name}.000000000000");
        let e = bed
            .inspect(&none)
            .expect_err("no such [auto] agent")
            .to_string();
        assert!(
            e.contains(&format!("no [auto] agent named {none:?}")) && e.contains(&agent),
            "{e}"
        );
        let inspect = |c: &str, format: &str| {
            run_ok(docker(sock).args(["inspect", "--format", format, c])).expect("docker inspect")
        };
        // Same container, same pid; the other one untouched: its cut
        // connection is still its attach stream.
        assert_eq!(inspect(&name, "{{.Id}}"), id);
        assert_eq!(inspect(&name, "{{.State.Pid}}"), pid.to_string());
        assert_eq!(inspect(&claims, "{{.State.Pid}}"), claimer_pid.to_string());
        check_cost(&b, claimer_pid, &agent);
        // Its stream is the one cut: the dispatch server has not heard
        // from it for more than two heartbeats, and it has not reattached.
        let after = bed.row("aclaims").expect("row");
        assert_eq!(after["conn"], claimer_row["conn"], "{after}");
        let silent = after["last_seen_ms_ago"].as_u64().unwrap_or(0);
        assert!(silent > 2 * opts.heartbeat.as_millis() as u64, "{after}");
    });
    b.finish(&[&name, &claims], result);
}

/// What `[auto] containers = true` costs a check, measured here (no bound
/// asserted): `check --dry-run` of one agent by pid (`pid`), with and
/// without the section, alternating, 7 runs each; the medians printed.
/// Then `--agent AGENT` (an `[auto]` agent's name) checks that one only.
fn check_cost(b: &DockerBed, pid: u32, agent: &str) {
    let base = format!("[[agent]]\nname = \"bypid\"\nmatch = {{ pid = {pid} }}\n");
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for (i, config) in [format!("[auto]\ncontainers = true\n{base}"), base]
        .iter()
        .enumerate()
    {
        std::fs::write(b.scratch.join(&format!("cost{i}.toml")), config).expect("config");
    }
    let check = |i: usize| {
        let mut cmd = Command::new(tests::selfheal_bin());
        cmd.envs(b.opts.env.iter().map(|(k, v)| (*k, v)))
            .args(["check", "--json", "--dry-run", "--config"])
            .arg(b.scratch.join(&format!("cost{i}.toml")))
            .arg("--state-dir")
            .arg(b.scratch.join(&format!("cost-state{i}")))
            .arg("--snapshot-dir")
            .arg(b.scratch.join(&format!("cost-snapshots{i}")))
            .arg("--helper")
            .arg(b.scratch.join("no-helper.sock"));
        cmd
    };
    for round in 0..14 {
        let i = round % 2;
        let mut cmd = check(i);
        let t = Instant::now();
        let out = cmd.output().expect("check");
        times[i].push(t.elapsed());
        let agents = String::from_utf8_lossy(&out.stdout).lines().count();
        assert_eq!(agents, 2 - i, "{}", String::from_utf8_lossy(&out.stderr));
    }
    let out = check(0).args(["--agent", agent]).output().expect("check");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["agent"], agent, "{lines:?}");
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_millis()
    };
    eprintln!(
        "check --dry-run of one agent by pid: {} ms with [auto] containers = true \
         (that agent and the labelled container's), {} ms without (medians of 7, alternating)",
        median(&mut times[0]),
        median(&mut times[1])
    );
}

/// A cgroup below the unified hierarchy's `system.slice` standing in for a
/// system unit, removed (its processes moved back to the root) on drop.
struct Unit {
    dir: PathBuf,
    made: Vec<PathBuf>,
}

impl Unit {
    fn new(name: &str) -> Result<Unit, String> {
        let root = cgroup2_root().ok_or("no cgroup v2 hierarchy")?;
        let mut made = Vec::new();
        let mut dir = root.clone();
        for c in ["system.slice", name] {
            dir.push(c);
            if !dir.exists() {
                std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
                made.push(dir.clone());
            }
        }
        Ok(Unit { dir, made })
    }

    fn take(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        let root = cgroup2_root().expect("cgroup v2");
        if let Ok(pids) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in pids.lines() {
                let _ = std::fs::write(root.join("cgroup.procs"), pid);
            }
        }
        for d in self.made.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The interpreter `python3` runs (not a shim that execs it: the pid
/// spawned is the server's).
fn python() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// Listens on 127.0.0.1:PORT, accepts one connection and waits in a
/// receive on it: a server whose client is gone.
const SERVER: &str = "import socket, sys\n\
s = socket.socket()\n\
s.bind(('127.0.0.1', int(sys.argv[1])))\n\
s.listen(1)\n\
print('listening', flush=True)\n\
c, _ = s.accept()\n\
print('accepted', flush=True)\n\
c.recv(1)\n";

#[test]
fn an_auto_unit_is_healed_and_a_connection_it_accepted_is_not_judged() {
    let _area = tests::area(module_path!());
    const TEST: &str = "an_auto_unit_is_healed_and_a_connection_it_accepted_is_not_judged";
    if !need_root_and(TEST, &["nft", "ip"], "run `cargo xtask setup`") {
        return;
    }
    let Some(python) = python() else {
        return tests::skip(TEST, "no python3");
    };
    let me = std::process::id();
    let (run_unit, in_unit) = (
        format!("auto-run-{me}.service"),
        format!("auto-in-{me}.service"),
    );
    let (runner_cg, server_cg) = match (Unit::new(&run_unit), Unit::new(&in_unit)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return tests::skip(TEST, &format!("no unit cgroup: {e}")),
    };
    let scratch = Scratch::new("auto-units");
    let n = (me % 200) as u8 + 30;
    let opts = bed_options(&scratch, &scratch.join("no-docker.sock"), n);
    let result = std::panic::catch_unwind(|| {
        let mut bed = Bed::new(&opts, "auu", Duration::from_secs(1)).expect("the testbed");
        let mut cmd = bed.topo.runners.command(&opts.testbed);
        cmd.args(["runner", "--name", "urunner", "--dispatch"])
            .arg(bed.dispatch_addr().to_string())
            .arg("--provider")
            .arg(bed.provider().to_string())
            .args(["--provider-path", FAST, "--status", "127.0.0.1:9101"])
            .args(["--heartbeat", "1000ms", "--mode", "blocking"]);
        let section = format!("[auto]\nunits = [\"{run_unit}\", \"{in_unit}\"]\n{SETTINGS}");
        bed.spawn("urunner", cmd, Some(section))
            .expect("the runner");
        let pid = bed.pid("urunner").expect("pid");
        runner_cg.take(pid);
        let port = 9102u16;
        let mut cmd = bed.topo.runners.command(&python);
        cmd.args(["-c", SERVER, &port.to_string()]);
        bed.spawn("userver", cmd, None).expect("the server");
        bed.expect_line("userver", "listening", Duration::from_secs(10))
            .expect("the server listens");
        let server = bed.pid("userver").expect("pid");
        server_cg.take(server);
        let client = bed
            .topo
            .runners
            .enter(|| std::net::TcpStream::connect(("127.0.0.1", port)))
            .expect("the namespace")
            .expect("connect");
        bed.expect_line("userver", "accepted", Duration::from_secs(10))
            .expect("the server accepts");
        let row = bed.wait_working("urunner", 1).expect("the runner works");
        let (runner_agent, server_agent) = (
            format!("auto.unit.{run_unit}"),
            format!("auto.unit.{in_unit}"),
        );
        let run = bed.check().expect("check");
        for a in [&runner_agent, &server_agent] {
            let o = run
                .of(a)
                .unwrap_or_else(|| panic!("no {a}: {:?}", run.outcomes));
            assert_ne!(o["verdict"], "wedged", "{o}");
        }

        // The runner's attach stream cut, and the server's accepted
        // connection: packets to and from its port dropped both ways.
        bed.topo.drop_flow(peer(&row)).expect("the cut");
        bed.topo
            .runners
            .nft(&format!(
                "table inet selfheal_auto_{port} {{\n \
                 chain input {{ type filter hook input priority 0; tcp dport {port} drop; tcp sport {port} drop; }}\n \
                 chain output {{ type filter hook output priority 0; tcp dport {port} drop; tcp sport {port} drop; }}\n}}\n"
            ))
            .expect("the accepted connection's cut");
        let fault = Instant::now();
        let mut server_seen = Vec::new();
        let healing = after_cut(&bed, &runner_agent, "urunner", fault, &row, &mut |run| {
            server_seen.push(run.of(&server_agent).cloned())
        });
        let healing = healed(&bed, &runner_agent, "urunner", healing);
        assert_eq!(bed.pid("urunner").ok(), Some(pid), "same pid");
        assert!(bed.running("urunner").expect("runner"));
        // Past the bound a made connection is found in, the accepted one
        // is still not judged.
        let past = Duration::from_millis(auto_bound_ms(opts.check_every, healing.longest_check))
            + 2 * opts.check_every;
        for _ in 0..60 {
            if fault.elapsed() > past {
                break;
            }
            std::thread::sleep(opts.check_every);
            server_seen.push(bed.check().expect("check").of(&server_agent).cloned());
        }
        for o in &server_seen {
            let o = o.as_ref().unwrap_or_else(|| panic!("no {server_agent}"));
            assert_eq!(o["verdict"], "healthy", "{o}");
            assert!(steps(o).is_empty(), "{o}");
        }
        eprintln!(
            "{server_agent}: its accepted connection cut, ok through {} checks over {} ms \
             (past the {} ms a made connection is found in)",
            server_seen.len(),
            fault.elapsed().as_millis(),
            past.as_millis()
        );
        assert!(bed.running("userver").expect("server"), "the server runs");
        bed.topo
            .runners
            .nft(&format!("delete table inet selfheal_auto_{port}\n"))
            .expect("undo");
        drop(client);
    });
    drop((runner_cg, server_cg));
    rethrow(result);
}
