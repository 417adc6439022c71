//! Docker's Engine API, and Podman's compatible one, over a unix socket:
//! a read-only `GET /containers/json` for identities, and for the runtime
//! restart rung `GET /containers/{id}/json` and `POST
//! /containers/{id}/restart`, each within a deadline.
//!
//! Written by hand (HTTP/1.0, so the answer is never chunked and ends at
//! the connection's end) rather than with `bollard`: one endpoint does not
//! pay for hyper, tower and the Engine API's full model on a 2-core build
//! (ARCHITECTURE.md says more). The parsers ([`parse_response`],
//! [`parse_list`]) are pure and fuzzed.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

use serde::Deserialize;

use super::ContainerInfo;

/// The API version asked for: old enough for every Docker and Podman here
/// (Podman serves the compatible API under any version), and its list has
/// every field read.
const PATH: &str = "/v1.24/containers/json";

/// Largest answer read: a list of a few thousand containers.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;

/// Why a runtime's list could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No socket there: the runtime is not installed or not running.
    #[error("no socket ({0})")]
    Absent(std::io::Error),
    /// The socket is there but the connection was refused.
    #[error("connection refused ({0})")]
    Refused(std::io::Error),
    /// No complete answer within the bound.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot talk to it: {0}")]
    Io(std::io::Error),
    /// An answer that is not HTTP, not 200, or not the expected JSON.
    #[error("bad answer: {0}")]
    Bad(String),
    #[error("{0}")]
    Other(String),
}

impl Error {
    pub fn is_absent(&self) -> bool {
        matches!(self, Error::Absent(_))
    }
}

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

/// A container's state, as `GET /containers/{id}/json` tells it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct State {
    /// `running`, `exited`, `restarting`, `paused`, `created`, …
    pub status: String,
    pub restart_count: u64,
    pub started_at: String,
    /// The container's init process (`State.Pid`) in the runtime's pid
    /// namespace; 0 when it runs none.
    pub pid: u32,
}

#[derive(Deserialize)]
struct Inspected {
    #[serde(rename = "State")]
    state: InspectedState,
    #[serde(rename = "RestartCount", default)]
    restart_count: u64,
}

#[derive(Deserialize)]
struct InspectedState {
    #[serde(rename = "Status")]
    status: String,
    #[serde(rename = "StartedAt", default)]
    started_at: String,
    #[serde(rename = "Pid", default)]
    pid: u32,
}

/// The state in a `/containers/{id}/json` body.
pub fn parse_state(body: &[u8]) -> Result<State, Error> {
    let i: Inspected = serde_json::from_slice(body)
        .map_err(|e| Error::Bad(format!("not a container's inspection: {e}")))?;
    Ok(State {
        status: i.state.status,
        restart_count: i.restart_count,
        started_at: i.state.started_at,
        pid: i.state.pid,
    })
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

/// The body of a complete HTTP answer with status 200 (the connection's
/// end ends it; a `Content-Length` that disagrees is an error).
pub fn parse_response(answer: &[u8]) -> Result<&[u8], Error> {
    parse_answer(answer, &[200])
}

/// [`parse_response`] with the statuses that count as success.
pub fn parse_answer<'a>(answer: &'a [u8], ok: &[u16]) -> Result<&'a [u8], Error> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(answer) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err(Error::Bad("incomplete HTTP header".into())),
        Err(e) => return Err(Error::Bad(format!("not HTTP ({e})"))),
    };
    let code = resp.code.unwrap_or(0);
    let body = &answer[head_len..];
    if !ok.contains(&code) {
        let text: String = String::from_utf8_lossy(&body[..body.len().min(200)])
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        return Err(Error::Bad(format!("status {code}: {}", text.trim())));
    }
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Error::Bad("a chunked answer to an HTTP/1.0 request".into()));
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let n: usize = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| Error::Bad("bad Content-Length".into()))?;
            if n != body.len() {
                return Err(Error::Bad(format!(
                    "{} body bytes where Content-Length says {n}",
                    body.len()
                )));
            }
        }
    }
    Ok(body)
}

#[derive(Deserialize)]
struct Listed {
    #[serde(rename = "Id")]
    id: String,
    #[serde(rename = "Names", default)]
    names: Option<Vec<String>>,
    #[serde(rename = "Image", default)]
    image: Option<String>,
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

/// The containers in a `/containers/json` body. Ids must be 64 hex digits
/// (what cgroups name); an entry that is not is an error, not skipped, so a
/// garbled answer does not pass for a short list.
pub fn parse_list(body: &[u8]) -> Result<Vec<ContainerInfo>, Error> {
    let listed: Vec<Listed> = serde_json::from_slice(body)
        .map_err(|e| Error::Bad(format!("not a container list: {e}")))?;
    listed
        .into_iter()
        .map(|l| {
            let id = l.id.to_ascii_lowercase();
            if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(Error::Bad(format!(
                    "container id {:?} is not 64 hex digits",
                    l.id
                )));
            }
            Ok(ContainerInfo {
                id,
                name: l
                    .names
                    .unwrap_or_default()
                    .into_iter()
                    .next()
                    .map(|n| n.strip_prefix('/').unwrap_or(&n).to_string()),
                image: l.image.filter(|i| !i.is_empty()),
                labels: l.labels.unwrap_or_default(),
                init_pid: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "ac71a600e8e6906ba7b18907acbb0c3d42386de3f68e5e60267627c2157e58e4";

    #[test]
    fn docker_answer() {
        // Docker 20.10's answer, as read here (trimmed).
        let body = format!(
            r#"[{{"Id":"{ID}","Names":["/fx-docker"],"Image":"shtest:1","Command":"/bin/sleep 300","Labels":{{"app":"runner"}},"State":"running"}}]"#
        );
        let answer = format!(
            "HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let list = parse_list(parse_response(answer.as_bytes()).unwrap()).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].id, ID);
        assert_eq!(list[0].name.as_deref(), Some("fx-docker"));
        assert_eq!(list[0].image.as_deref(), Some("shtest:1"));
        assert_eq!(
            list[0].labels.get("app").map(String::as_str),
            Some("runner")
        );
        // Null labels and names (Podman may send them) are empty.
        let body = format!(r#"[{{"Id":"{ID}","Names":null,"Labels":null}}]"#);
        let list = parse_list(body.as_bytes()).unwrap();
        assert!(list[0].name.is_none() && list[0].labels.is_empty());
        assert!(parse_list(b"[]").unwrap().is_empty());
    }

    #[test]
    fn garbage() {
        for answer in [
            &b""[..],
            b"garbage",
            b"HTTP/1.0 200 OK\r\n",
            b"HTTP/1.0 500 Internal Server Error\r\n\r\n{\"message\":\"boom\"}",
            b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\n[]",
            b"HTTP/1.0 200 OK\r\nContent-Length: x\r\n\r\n[]",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
        ] {
            assert!(
                parse_response(answer).is_err(),
                "{:?}",
                String::from_utf8_lossy(answer)
            );
        }
        for body in [
            &b""[..],
            b"{}",
            b"[{}]",
            b"[{\"Id\":\"short\"}]",
            b"[{\"Id\":5}]",
            b"[{\"Id\":\"../../etc\"}]",
            b"\xff\xfe",
            b"[{\"Id\":\"ac71a600e8e6906ba7b18907acbb0c3d42386de3f68e5e60267627c2157e58e4\",\"Labels\":{\"a\":1}}]",
        ] {
            assert!(parse_list(body).is_err(), "{:?}", String::from_utf8_lossy(body));
        }
        let e = parse_response(b"HTTP/1.0 403 Forbidden\r\n\r\nno\x1b[31m").unwrap_err();
        assert_eq!(e.to_string(), "bad answer: status 403: no [31m");
    }

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
