//! `selfheal scan`: with no config, every TCP connection on the host that
//! a thread waits on, that is still connecting, or whose peer has closed,
//! with a passive verdict, for a person (a table, most severe first) or a
//! script (`--json`: JSON Lines).

use std::{io::Write as _, time::Duration};

use super::{Error, Finished};
use anyhow::Context as _;
use selfheal_core::{
    keepalive::{KeepaliveSettings, ProofKeepalive},
    prove::ProofTarget,
    scan,
};

/// Census of every process on the host (root; else your own) waiting on a
/// TCP peer: each connection a thread waits on, or that is connecting or
/// peer-closed, with a verdict: suspect (no data either way for
/// --silent-for while a thread waits on it), connecting (SYN-SENT that
/// long), peer_closed (CLOSE-WAIT still held) or alive; and each process
/// with unreaped zombie children (with the missing-init diagnosis) or a
/// thread in D state for --silent-for, as inspect shows them. Reads only,
/// unless --prove; needs no config. Exit 0 when no connection is dead,
/// suspect, connecting or peer-closed, 2 when one is proven dead, else 1.
#[derive(clap::Args)]
pub struct Args {
    /// How long a waited-on connection may carry no data before it is
    /// suspect, and a connect may last before it is listed (e.g. 30s).
    #[arg(long, value_parser = super::parse_duration, default_value = "30s")]
    silent_for: Duration,
    /// Print one JSON object per connection, then one per process finding
    /// ("kind": "process"), then one of what the scan read and could not
    /// see ("kind": "coverage"), one per line, instead of a table.
    #[arg(long)]
    json: bool,
    /// Ask each suspect's peer whether it is there: a proof keepalive
    /// (probes 5 s apart, 3 unanswered prove it dead), through the helper
    /// where one runs, else directly where the kernel lets this user (root,
    /// or its own processes). Prints how long the answers may take (22 s at
    /// most with these probes), reports each suspect dead or alive, and
    /// puts every socket's own keepalive options back. Takes no other
    /// action.
    #[arg(long)]
    prove: bool,
    /// Only these processes (repeat for more): their connections and
    /// process findings are what is listed, and so what --prove asks
    /// about.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Read every process from procfs, and each network namespace's
    /// sockets from sock_diag, instead of one pass of the kernel's task
    /// iterators over the host (which root's scans use where the kernel
    /// has them: the same evidence, read in the kernel). The table's last
    /// line says when a scan as root read procfs, and why.
    #[arg(long)]
    no_iterators: bool,
    /// The privileged helper's socket, for --prove. Without a helper
    /// there, proofs are armed directly where the kernel lets this user.
    #[arg(long, value_name = "PATH", default_value = selfheal::helper::server::listen::DEFAULT_SOCKET)]
    helper: std::path::PathBuf,
}

/// The last line of `--json`: what the census read and could not see.
#[derive(serde::Serialize)]
struct Summary<'a> {
    kind: &'static str,
    #[serde(flatten)]
    coverage: &'a scan::Coverage,
}

pub fn run(args: Args) -> Result<Finished, Error> {
    let silent_for_ms = selfheal_core::clock::ms(args.silent_for);
    let read = selfheal::scan::scan(selfheal::sys::creds::euid(), args.no_iterators);
    let mut connections = read.connections;
    if !args.pids.is_empty() {
        connections.retain(|c| args.pids.contains(&c.owner.pid));
    }
    let mut findings = scan::census(&connections, silent_for_ms);
    let mut processes = scan::process_findings(&read.processes, silent_for_ms);
    if !args.pids.is_empty() {
        processes.retain(|p| args.pids.contains(&p.owner.pid));
    }
    if args.prove && scan::suspects(&findings).next().is_some() {
        // SIGINT and SIGTERM end the proofs as unproven, every socket's
        // options put back, instead of the process.
        let stop = selfheal::sys::signal::catch_stop()
            .context("cannot catch SIGINT and SIGTERM while proving")?;
        let (executor, _) = super::check::executor(&args.helper);
        let ka = selfheal::prove::keepalive(&selfheal_core::config::ProofConfig::default());
        let arm = |t: &ProofTarget, ka: &ProofKeepalive| executor.arm_proof("scan", t, ka);
        let restore = |t: &ProofTarget, previous: &KeepaliveSettings| {
            executor.restore_proof("scan", t, previous)
        };
        let prover = selfheal::scan::Prover {
            arm: &arm,
            restore: &restore,
        };
        let json = args.json;
        let proofs = selfheal::scan::prove(&findings, &ka, &prover, stop, |bound, n| {
            if !json {
                // Progress for the person waiting, not an error: stdout
                // holds the answer alone.
                let took = selfheal_core::clock::ms(bound);
                let _ = writeln!(
                    std::io::stderr(),
                    "proving {n} suspect connection(s): each answers within {}",
                    selfheal_core::inspect::human_ms(took)
                );
            }
        });
        findings = scan::with_proofs(findings, proofs);
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        let summary = Summary {
            kind: "coverage",
            coverage: &read.coverage,
        };
        let lines = findings
            .iter()
            .map(serde_json::to_string)
            .chain(processes.iter().map(serde_json::to_string))
            .chain(std::iter::once(serde_json::to_string(&summary)));
        for line in lines {
            let line = line.context("cannot write the census")?;
            // Still JSON, with DEL and C1 controls as \u escapes too.
            writeln!(out, "{}", selfheal_core::text::escape_json(&line))
                .context("cannot write the census")?;
        }
    } else {
        let text = scan::render(&findings, &processes, &read.coverage, silent_for_ms);
        out.write_all(text.as_bytes())
            .context("cannot write the census")?;
    }
    out.flush().context("cannot write the census")?;
    Ok(match scan::exit_code(&findings) {
        0 => Finished::Done,
        code => Finished::Status(code),
    })
}
