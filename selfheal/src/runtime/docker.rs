//! Docker's Engine API, and Podman's compatible one, over a unix socket:
//! a read-only `GET /containers/json` for identities, and for the runtime
//! restart rung `GET /containers/{id}/json` and `POST
//! /containers/{id}/restart`, each within a deadline.
//!
//! Written by hand (HTTP/1.0, so the answer is never chunked and ends at
//! the connection's end) rather than with `bollard`: one endpoint does not
//! pay for hyper, tower and the Engine API's full model on a 2-core build
//! (ARCHITECTURE.md says more). The parsers of the answers are pure, in
//! [`selfheal_core::runtime::docker`], and fuzzed.

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

use selfheal_core::runtime::{
    ContainerInfo,
    docker::{
        Error, MAX_ANSWER_BYTES, State, parse_answer, parse_list, parse_response, parse_state,
    },
};

/// The API version asked for: old enough for every Docker and Podman here
/// (Podman serves the compatible API under any version), and its list has
/// every field read.
const PATH: &str = "/v1.24/containers/json";

/// The running containers the runtime at `socket` lists, within `timeout`
/// in all (connect, ask, read).
pub fn list(socket: &Path, timeout: Duration) -> Result<Vec<ContainerInfo>, Error> {
    let answer = exchange(socket, "GET", PATH, timeout)?;
    parse_list(parse_response(&answer)?)
}

/// One HTTP/1.0 request to the API at `socket` and its whole answer, within
/// `timeout` in all (connect, ask, read).
pub fn exchange(
    socket: &Path,
    method: &str,
    path: &str,
    timeout: Duration,
) -> Result<Vec<u8>, Error> {
    let deadline = Instant::now() + timeout;
    let mut stream = UnixStream::connect(socket).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::Absent(e),
        std::io::ErrorKind::ConnectionRefused => Error::Refused(e),
        _ => Error::Io(e),
    })?;
    let left = |deadline: Instant| {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(Error::Timeout(timeout))
    };
    stream
        .set_write_timeout(Some(left(deadline)?))
        .map_err(Error::Io)?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nAccept: application/json\r\nContent-Length: 0\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| io_or_timeout(e, timeout))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        stream
            .set_read_timeout(Some(left(deadline)?))
            .map_err(Error::Io)?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if answer.len() + n > MAX_ANSWER_BYTES {
                    return Err(Error::Bad(format!("more than {MAX_ANSWER_BYTES} bytes")));
                }
                answer.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_or_timeout(e, timeout)),
        }
    }
    Ok(answer)
}

/// Container `id`'s state (`id` must be 64 hex digits: it goes in a path).
pub fn inspect(socket: &Path, id: &str, timeout: Duration) -> Result<State, Error> {
    check_id(id)?;
    let answer = exchange(
        socket,
        "GET",
        &format!("/v1.24/containers/{id}/json"),
        timeout,
    )?;
    parse_state(parse_response(&answer)?)
}

/// Restarts container `id` (`POST /containers/{id}/restart?t=…`: stop with
/// `grace`, then start), waiting up to `timeout` for the runtime's answer.
pub fn restart(socket: &Path, id: &str, grace: Duration, timeout: Duration) -> Result<(), Error> {
    check_id(id)?;
    let path = format!(
        "/v1.24/containers/{id}/restart?t={}",
        grace.as_secs().max(1)
    );
    let answer = exchange(socket, "POST", &path, timeout)?;
    parse_answer(&answer, &[200, 204]).map(|_| ())
}

fn check_id(id: &str) -> Result<(), Error> {
    if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(Error::Other(format!("{id:?} is not a container id")))
    }
}

fn io_or_timeout(e: std::io::Error, timeout: Duration) -> Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout(timeout),
        _ => Error::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inspection_and_restart_answers() {
        // Docker 20.10's `GET /containers/{id}/json`, trimmed.
        let body = br#"{"Id":"x","State":{"Status":"exited","Running":false,"StartedAt":"2026-11-30T18:27:16.12913505Z"},"RestartCount":2,"Name":"/r"}"#;
        let st = parse_state(body).unwrap();
        assert_eq!(st.status, "exited");
        assert_eq!(st.restart_count, 2);
        assert_eq!(st.started_at, "2026-11-30T18:27:16.12913505Z");
        // Podman leaves out nothing read, but an old one may omit the count.
        assert_eq!(
            parse_state(br#"{"State":{"Status":"running"}}"#)
                .unwrap()
                .restart_count,
            0
        );
        for bad in [
            &b""[..],
            b"[]",
            b"{}",
            b"{\"State\":{}}",
            b"{\"State\":{\"Status\":5}}",
        ] {
            assert!(
                parse_state(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // The restart's answer: 204 No Content is success, 404 and 500 not.
        assert!(parse_answer(b"HTTP/1.0 204 No Content\r\n\r\n", &[200, 204]).is_ok());
        let e = parse_answer(
            b"HTTP/1.0 404 Not Found\r\n\r\n{\"message\":\"No such container\"}",
            &[200, 204],
        )
        .unwrap_err();
        assert!(e.to_string().contains("status 404"), "{e}");
        // Ids go into a path: anything but 64 hex digits is refused unsent.
        for id in ["../../v1.24/info", "", &"g".repeat(64)] {
            assert!(inspect(Path::new("/nonexistent"), id, Duration::from_secs(1)).is_err());
            let e = restart(
                Path::new("/nonexistent"),
                id,
                Duration::from_secs(1),
                Duration::from_secs(1),
            )
            .unwrap_err();
            assert!(e.to_string().contains("is not a container id"), "{e}");
        }
    }

    #[test]
    fn absent_socket() {
        let e = list(
            Path::new("/nonexistent/selfheal-test.sock"),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(e.is_absent(), "{e}");
    }
}
