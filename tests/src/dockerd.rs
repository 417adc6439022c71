//! A `dockerd` of a test's own, in scratch directories (shared by the
//! container and deployment tests; tests/tests/containers.rs keeps its own
//! copy for now).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{Scratch, wait_for};

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

/// A `dockerd` of the test's own (socket, data and exec roots in `scratch`
/// and `exec`; no bridge, no iptables, vfs storage), up within 60 s.
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

/// `docker -H unix://SOCK`.
pub fn docker(sock: &Path) -> Command {
    let mut c = Command::new("docker");
    c.arg("-H").arg(format!("unix://{}", sock.display()));
    c
}
