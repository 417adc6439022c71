//! `cargo xtask demo`: a small agent with two upstream connections, shown
//! through `selfheal inspect`.
//!
//! The agent (a child process) has a control connection whose server sends a
//! heartbeat every second, read by a blocking thread, and a provider
//! connection on which it sent a request that is never answered: its thread
//! waits in `recv` forever, as in the incident. `selfheal inspect` then shows
//! which thread waits in which receive, for how long, on which socket, what
//! the kernel's tcp_info says about each connection, and what it could not
//! see.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    process::{Command, ExitCode},
    thread,
    time::Duration,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("agent") {
        agent(&args[1], &args[2]);
        return ExitCode::SUCCESS;
    }
    match demo() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo() -> Result<(), String> {
    let selfheal = std::env::var("SELFHEAL_BIN").unwrap_or_else(|_| "selfheal".into());
    let control = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let provider = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let control_addr = control.local_addr().map_err(|e| e.to_string())?;
    let provider_addr = provider.local_addr().map_err(|e| e.to_string())?;

    // The dispatch server: one heartbeat a second, for as long as the demo runs.
    thread::spawn(move || {
        if let Ok((mut s, _)) = control.accept() {
            for _ in 0..120 {
                if s.write_all(b"heartbeat\n").is_err() {
                    break;
                }
                thread::sleep(Duration::from_secs(1));
            }
        }
    });
    // The provider: takes the request, never answers, keeps the connection.
    thread::spawn(move || {
        if let Ok((mut s, _)) = provider.accept() {
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf);
            thread::sleep(Duration::from_secs(120));
        }
    });

    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut agent = Command::new(exe)
        .args([
            "agent",
            &control_addr.to_string(),
            &provider_addr.to_string(),
        ])
        .spawn()
        .map_err(|e| format!("cannot start the agent: {e}"))?;
    let pid = agent.id();
    println!("demo: agent pid {pid}: control connection to {control_addr} (heartbeat every 1 s),");
    println!("      provider connection to {provider_addr} (request sent, never answered).");
    println!("demo: waiting 3 s, then: {selfheal} inspect --pid {pid} --wait 2500ms\n");
    thread::sleep(Duration::from_secs(3));

    let status = Command::new(&selfheal)
        .args(["inspect", "--pid", &pid.to_string(), "--wait", "2500ms"])
        .status()
        .map_err(|e| format!("cannot run {selfheal}: {e}"));
    let _ = agent.kill();
    let _ = agent.wait();
    let status = status?;
    println!(
        "\ndemo: the control reader waits less than a second at a time (heartbeats arrive);\n\
         the provider caller has waited since the request: the same kernel state as a half-open\n\
         connection. Its receive began before the tracer attached, so its age comes from procfs."
    );
    if status.success() {
        Ok(())
    } else {
        Err(format!("selfheal inspect failed: {status}"))
    }
}

/// The agent: a control reader and a provider caller, each a blocking thread.
fn agent(control: &str, provider: &str) {
    let control = control.to_string();
    let provider = provider.to_string();
    let reader = thread::Builder::new()
        .name("control-reader".into())
        .spawn(move || {
            let Ok(mut s) = TcpStream::connect(&control) else {
                return;
            };
            let mut buf = [0u8; 256];
            while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
        });
    let caller = thread::Builder::new()
        .name("provider-call".into())
        .spawn(move || {
            let Ok(mut s) = TcpStream::connect(&provider) else {
                return;
            };
            let _ = s.write_all(b"POST /v1/messages\n");
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf);
        });
    for t in [reader, caller].into_iter().flatten() {
        let _ = t.join();
    }
}
