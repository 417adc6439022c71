//! `selfheal inspect`: kernel-level diagnosis of one process for a person at
//! a terminal (or a script, with `--json`).

use std::{io::Write as _, process::ExitCode, time::Duration};

use anyhow::Context as _;
use selfheal::{ebpf::Strategy, inspect};

/// Show a process's threads and the receive each is blocked in (and for how
/// long), its TCP sockets with the kernel's tcp_info and eBPF activity, and
/// which eBPF attach strategy was used and why the others failed.
#[derive(clap::Args)]
pub struct Args {
    /// The process to inspect.
    #[arg(long)]
    pid: u32,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the tracer attached this long before reading it, so receives that
    /// start meanwhile are timed from their beginning (e.g. 2s).
    #[arg(long, value_parser = super::parse_duration, default_value = "0s")]
    wait: Duration,
    /// Try only this eBPF attach strategy (repeatable, tried in the order
    /// given): kprobe, fentry, tp_btf, tracepoint.
    #[arg(long = "ebpf-strategy", value_parser = parse_strategy)]
    strategies: Vec<Strategy>,
    /// Do not use eBPF: procfs and sock_diag only.
    #[arg(long)]
    no_ebpf: bool,
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::from_name(s).ok_or_else(|| {
        let names: Vec<_> = Strategy::ALL.iter().map(|s| s.name()).collect();
        format!("unknown strategy {s:?}; one of {}", names.join(", "))
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = inspect::CollectOptions {
        no_ebpf: args.no_ebpf,
        strategies: args.strategies,
        wait: args.wait,
    };
    let pid = args.pid;
    procfs::process::Process::new(pid as i32)
        .with_context(|| format!("no process with pid {pid}"))?;
    let target = inspect::Target {
        agent: None,
        rule: format!("pid={pid}"),
        roots: vec![pid],
        pids: vec![pid],
        problem: None,
        role_of: Box::new(|_| None),
        upstreams: Vec::new(),
    };
    let evidence = inspect::collect(&target, &opts);
    let report = inspect::build(&evidence);
    // Stdout is line-buffered: a pretty JSON document of thousands of lines
    // would otherwise be thousands of writes.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report).context("cannot write the report")?;
        writeln!(out).context("cannot write the report")?;
    } else {
        out.write_all(inspect::render(&report).as_bytes())
            .context("cannot write the report")?;
    }
    out.flush().context("cannot write the report")?;
    Ok(ExitCode::SUCCESS)
}
