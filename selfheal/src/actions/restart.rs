//! Running a restart command: never through a shell, in its own process
//! group, its output captured in bounded excerpts, killed at its timeout.

use std::{
    io::Read,
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use super::{ActionError, deadline, signal::KILL_WAIT};

/// Bytes of each output stream kept by [`restart`]: the first and last
/// halves when there is more.
pub const OUTPUT_LIMIT: usize = 16 * 1024;

/// How long [`restart`] keeps reading output after the command exited (a
/// child it left running may hold the pipes open).
const OUTPUT_GRACE: Duration = Duration::from_millis(500);

/// What [`restart`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartOutcome {
    /// The exit code, if it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did (SIGKILL after a timeout).
    pub signal: Option<i32>,
    /// Exited with code 0, in time.
    pub success: bool,
    /// Killed (with its process group) at the timeout.
    pub timed_out: bool,
    pub duration_ms: u64,
    /// Output excerpts (lossy UTF-8; see [`OUTPUT_LIMIT`]).
    pub stdout: String,
    pub stderr: String,
    /// More was written than kept, or reading stopped before the stream
    /// ended.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

/// An output excerpt: the first and last `limit / 2` bytes.
#[derive(Clone, Debug, Default)]
struct Excerpt {
    head: Vec<u8>,
    tail: Vec<u8>,
    total: u64,
    limit: usize,
}

impl Excerpt {
    fn new(limit: usize) -> Excerpt {
        Excerpt {
            limit,
            ..Excerpt::default()
        }
    }

    fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let half = self.limit / 2;
        let room = half.saturating_sub(self.head.len());
        let take = room.min(data.len());
        self.head.extend_from_slice(&data[..take]);
        data = &data[take..];
        let keep = self.limit - half;
        self.tail.extend_from_slice(data);
        if self.tail.len() > 2 * keep.max(1) {
            let cut = self.tail.len() - keep;
            self.tail.drain(..cut);
        }
    }

    /// The text, with a marker where bytes were left out; whether any were.
    fn finish(mut self) -> (String, bool) {
        let keep = self.limit - self.limit / 2;
        if self.tail.len() > keep {
            let cut = self.tail.len() - keep;
            self.tail.drain(..cut);
        }
        let kept = (self.head.len() + self.tail.len()) as u64;
        let left_out = self.total - kept;
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if left_out > 0 {
            text.push_str(&format!("\n[… {left_out} bytes left out …]\n"));
        }
        text.push_str(&String::from_utf8_lossy(&self.tail));
        (text, left_out > 0)
    }
}

/// An output stream being read on its own thread: the excerpt so far, and
/// a signal when the stream ended.
struct Capture {
    excerpt: std::sync::Arc<std::sync::Mutex<Excerpt>>,
    done: mpsc::Receiver<()>,
}

/// Reads `r` to its end into an excerpt, on its own thread (so one stream
/// filling up never blocks the other, nor the command).
fn capture(mut r: impl Read + Send + 'static) -> Capture {
    let excerpt = std::sync::Arc::new(std::sync::Mutex::new(Excerpt::new(OUTPUT_LIMIT)));
    let (tx, done) = mpsc::channel();
    let shared = std::sync::Arc::clone(&excerpt);
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => match shared.lock() {
                    Ok(mut e) => e.push(&buf[..n]),
                    Err(p) => p.into_inner().push(&buf[..n]),
                },
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = tx.send(());
    });
    Capture { excerpt, done }
}

/// Runs the restart command `argv` (`argv[0]` found on `PATH` unless it has
/// a slash; the rest passed verbatim — never through a shell) in a new
/// process group, stdin from /dev/null, stdout and stderr captured
/// concurrently (a chatty command cannot block). At `timeout` the whole
/// process group is killed. A command that exits in time is not killed, and
/// nor are the children it leaves (a restarted service may be one).
pub fn restart(argv: &[String], timeout: Duration) -> Result<RestartOutcome, ActionError> {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    let (program, args) = argv.split_first().ok_or(ActionError::EmptyCommand)?;
    if program.is_empty() {
        return Err(ActionError::EmptyCommand);
    }
    let start = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| ActionError::Spawn {
            program: program.clone(),
            source,
        })?;
    let pgid = child.id() as libc::pid_t;
    let out = child.stdout.take().map(capture);
    let err = child.stderr.take().map(capture);
    let kill_at = deadline(start, timeout);
    let mut step = Duration::from_millis(1);
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                // Cannot wait for it: do not leave it running.
                crate::sys::signal::kill_group(pgid);
                if wait_bounded(&mut child, KILL_WAIT).is_none() {
                    std::thread::spawn(move || {
                        let _ = child.wait();
                    });
                }
                return Err(ActionError::io(format!("wait for {program}"), e));
            }
        }
        let now = Instant::now();
        if now >= kill_at {
            timed_out = true;
            // The group we created (pgid = the child's pid, not yet
            // reaped, so not reused).
            crate::sys::signal::kill_group(pgid);
            break wait_bounded(&mut child, KILL_WAIT);
        }
        std::thread::sleep(step.min(kill_at - now));
        step = (step * 2).min(Duration::from_millis(20));
    };
    let read_end = Instant::now() + OUTPUT_GRACE;
    let collect = |c: Option<Capture>| {
        c.map_or((String::new(), false), |c| {
            let ended = c
                .done
                .recv_timeout(read_end.saturating_duration_since(Instant::now()))
                .is_ok();
            let excerpt = c
                .excerpt
                .lock()
                .map(|e| e.clone())
                .unwrap_or_else(|p| p.into_inner().clone());
            let (mut text, truncated) = excerpt.finish();
            if !ended {
                if !text.is_empty() && !text.ends_with('\n') {
                    text.push('\n');
                }
                text.push_str("[… still open: not read to its end]\n");
            }
            (text, truncated || !ended)
        })
    };
    let (stdout, stdout_truncated) = collect(out);
    let (stderr, stderr_truncated) = collect(err);
    if status.is_none() {
        // Killed but not dead yet (uninterruptible sleep): reap it whenever
        // it dies, rather than leave a zombie.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
    }
    let exit_code = status.and_then(|s| s.code());
    Ok(RestartOutcome {
        exit_code,
        signal: status.and_then(|s| s.signal()),
        success: !timed_out && exit_code == Some(0),
        timed_out,
        duration_ms: start.elapsed().as_millis() as u64,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
    })
}

/// Reaps `child` within `timeout`; `None` if it has not died by then.
fn wait_bounded(
    child: &mut std::process::Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let end = deadline(Instant::now(), timeout);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_keeps_head_and_tail() {
        let mut e = Excerpt::new(8);
        e.push(b"abc");
        assert_eq!(e.finish(), ("abc".to_string(), false));
        let mut e = Excerpt::new(8);
        e.push(b"abcdefgh");
        assert_eq!(e.finish(), ("abcdefgh".to_string(), false));
        let mut e = Excerpt::new(8);
        for chunk in [&b"0123"[..], b"456789", b"ABCDEFGHIJ", b"xyz"] {
            e.push(chunk);
        }
        let (text, truncated) = e.finish();
        assert!(truncated);
        assert_eq!(text, "0123\n[… 15 bytes left out …]\nJxyz");
    }

    #[test]
    fn restart_refuses_an_empty_or_missing_command() {
        assert!(matches!(
            restart(&[], Duration::from_secs(1)),
            Err(ActionError::EmptyCommand)
        ));
        let e = restart(
            &["/nonexistent/selfheal-restart".to_string()],
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, ActionError::Spawn { .. }), "{e}");
        assert!(e.to_string().starts_with("cannot run /nonexistent"), "{e}");
    }
}
