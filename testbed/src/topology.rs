//! The testbed's network: three network namespaces — runners, dispatch
//! server, provider — the runners' joined to each server's by a veth pair
//! on its own /24 (10.253.N.0 to the dispatch server, 10.254.N.0 to the
//! provider; addresses that exist only inside these namespaces). Nothing is
//! added to the host's own namespace. Dropping the value deletes the
//! namespaces, and with them the veths and every nftables rule.
//!
//! The incident's fault is [`Topology::drop_flow`]: the gateway forgets one
//! attach flow and drops its packets both ways, without a FIN or RST to
//! either side, while new connections go through.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// A network namespace this process made; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates namespace `name` (replacing a leftover of that name) with
    /// its loopback up.
    pub fn create(name: String) -> anyhow::Result<Netns> {
        let _ = quiet("ip", &["netns", "del", &name]);
        run("ip", &["netns", "add", &name])?;
        let ns = Netns { name };
        run("ip", &["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `program` run inside the namespace (`ip netns exec`, which execs it:
    /// the child's pid is the program's).
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Runs `f` on a thread that has entered the namespace (the product's
    /// one way in: `selfheal::sys::netns::run_in`).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
        let path = format!("/run/netns/{}", self.name);
        let file = std::fs::File::open(&path).with_context(|| format!("cannot open {path}"))?;
        selfheal::sys::netns::run_in(&file, f)
            .with_context(|| format!("cannot enter network namespace {}", self.name))
    }

    /// Loads `rules` (an `nft -f` script) inside the namespace.
    pub fn nft(&self, rules: &str) -> anyhow::Result<()> {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot run nft (Debian package nftables)")?;
        child
            .stdin
            .take()
            .context("nft stdin")?
            .write_all(rules.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("nft: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = quiet("ip", &["netns", "del", &self.name]);
    }
}

/// The three namespaces and their addresses.
#[derive(Debug)]
pub struct Topology {
    pub runners: Netns,
    pub dispatch: Netns,
    pub provider: Netns,
    /// The runners' address toward the dispatch server.
    pub runners_ip: Ipv4Addr,
    pub dispatch_ip: Ipv4Addr,
    pub provider_ip: Ipv4Addr,
}

/// Namespace names start with this and the owning process's pid, so that
/// leftovers of a killed run can be recognized and removed.
pub const PREFIX: &str = "selfheal-tb";

impl Topology {
    /// Builds the namespaces `selfheal-tb<pid>-<tag>-{run,dsp,prv}`. `n`
    /// (1–250) picks the subnets; concurrent topologies need distinct `n`.
    pub fn new(tag: &str, n: u8) -> anyhow::Result<Topology> {
        let base = format!("{PREFIX}{}-{tag}", std::process::id());
        let runners = Netns::create(format!("{base}-run"))?;
        let dispatch = Netns::create(format!("{base}-dsp"))?;
        let provider = Netns::create(format!("{base}-prv"))?;
        let runners_ip = Ipv4Addr::new(10, 253, n, 1);
        let dispatch_ip = Ipv4Addr::new(10, 253, n, 2);
        let provider_ip = Ipv4Addr::new(10, 254, n, 2);
        link(
            &runners,
            &dispatch,
            &format!("tbd{n}"),
            runners_ip,
            dispatch_ip,
        )?;
        link(
            &runners,
            &provider,
            &format!("tbp{n}"),
            Ipv4Addr::new(10, 254, n, 1),
            provider_ip,
        )?;
        Ok(Topology {
            runners,
            dispatch,
            provider,
            runners_ip,
            dispatch_ip,
            provider_ip,
        })
    }

    /// The gateway forgets the attach flow from `runner` (the runner's
    /// address and port as the dispatch server sees it): its packets are
    /// dropped both ways from now on, silently.
    pub fn drop_flow(&self, runner: SocketAddr) -> anyhow::Result<()> {
        drop_flow_in(&self.dispatch, "selfheal_gw", runner)
    }

    /// The gateway forgets the provider flow from `runner` (the caller's
    /// address and port as the provider sees it): its packets are dropped
    /// both ways in the provider's namespace from now on, without a FIN or
    /// RST to either side. New connections go through.
    pub fn drop_provider_flow(&self, runner: SocketAddr) -> anyhow::Result<()> {
        drop_flow_in(&self.provider, "selfheal_pgw", runner)
    }

    /// New connections to the provider's `port` go unanswered from now on
    /// (their SYNs dropped in the provider's namespace), until
    /// [`Topology::answer_provider_syns`]; established ones flow.
    pub fn drop_provider_syns(&self, port: u16) -> anyhow::Result<()> {
        self.provider.nft(&format!(
            "table inet selfheal_syn_{port} {{\n \
             chain input {{ type filter hook input priority 0; tcp dport {port} tcp flags & (syn | ack) == syn drop; }}\n}}\n"
        ))
    }

    /// Undoes [`Topology::drop_provider_syns`].
    pub fn answer_provider_syns(&self, port: u16) -> anyhow::Result<()> {
        self.provider
            .nft(&format!("delete table inet selfheal_syn_{port}\n"))
    }

    /// Attach streams to the dispatch server's `port` are refused silently
    /// from now on, old and new alike (packets dropped both ways).
    pub fn drop_port(&self, port: u16) -> anyhow::Result<()> {
        self.dispatch.nft(&format!(
            "table inet selfheal_port_{port} {{\n \
             chain input {{ type filter hook input priority 0; tcp dport {port} drop; }}\n \
             chain output {{ type filter hook output priority 0; tcp sport {port} drop; }}\n}}\n"
        ))
    }
}

/// In `ns`, table `{table}_{PORT}` drops every packet from and to `peer`
/// (its address and port, as `ns` sees it), both ways, silently.
fn drop_flow_in(ns: &Netns, table: &str, peer: SocketAddr) -> anyhow::Result<()> {
    let (ip, port) = (peer.ip(), peer.port());
    ns.nft(&format!(
        "table inet {table}_{port} {{\n \
         chain input {{ type filter hook input priority 0; ip saddr {ip} tcp sport {port} drop; }}\n \
         chain output {{ type filter hook output priority 0; ip daddr {ip} tcp dport {port} drop; }}\n}}\n"
    ))
}

/// Joins `a` and `b` by a veth pair `{name}a`/`{name}b` (names of at most
/// 14 bytes), addressed `a_ip/24` and `b_ip/24`, both up.
pub fn link(
    a: &Netns,
    b: &Netns,
    name: &str,
    a_ip: Ipv4Addr,
    b_ip: Ipv4Addr,
) -> anyhow::Result<()> {
    let (va, vb) = (format!("{name}a"), format!("{name}b"));
    run(
        "ip",
        &[
            "-n", &a.name, "link", "add", &va, "type", "veth", "peer", "name", &vb, "netns",
            &b.name,
        ],
    )?;
    run(
        "ip",
        &[
            "-n",
            &a.name,
            "addr",
            "add",
            &format!("{a_ip}/24"),
            "dev",
            &va,
        ],
    )?;
    run(
        "ip",
        &[
            "-n",
            &b.name,
            "addr",
            "add",
            &format!("{b_ip}/24"),
            "dev",
            &vb,
        ],
    )?;
    run("ip", &["-n", &a.name, "link", "set", &va, "up"])?;
    run("ip", &["-n", &b.name, "link", "set", &vb, "up"])
}

/// Deletes namespaces left by testbed runs whose process is gone (a run
/// killed with SIGKILL cannot clean up after itself). Returns their names.
pub fn remove_stale() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return vec![];
    };
    let mut removed = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists()
            && quiet("ip", &["netns", "del", &name]).is_ok()
        {
            removed.push(name);
        }
    }
    removed
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program} (Debian package iproute2)"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn quiet(program: &str, args: &[&str]) -> std::io::Result<()> {
    let status = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("{program} failed")))
    }
}
