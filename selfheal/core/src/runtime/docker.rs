//! The answers of Docker's Engine API (and Podman's compatible one), parsed:
//! an HTTP/1.0 answer's body ([`parse_response`], [`parse_answer`]), the
//! container list ([`parse_list`]) and one container's state
//! ([`parse_state`]). Pure and fuzzed; talking to the socket is the edge's
//! (`selfheal::runtime::docker`).

use std::{collections::BTreeMap, time::Duration};

use serde::Deserialize;

use super::{ContainerInfo, PodClaim};

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

/// A pod's namespace, name and uid as the kubelet labels a pod's Docker
/// container (through cri-dockerd). The labels of a Docker or Podman
/// container are whoever created it through the API's (root, or the
/// kubelet): cri-dockerd keeps a pod's annotations, the pod author's, under
/// `annotation.<key>`, and the kubelet writes these keys after the pod's
/// own labels, so a pod's author cannot write them.
pub const KUBELET_POD: [&str; 3] = [
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.uid",
];

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
                pod: l
                    .labels
                    .as_ref()
                    .map(|labels| PodClaim::from_labels(labels, KUBELET_POD))
                    .unwrap_or_default(),
                labels: l.labels.unwrap_or_default(),
                init_pid: None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::assert_all_rejected;

    const ID: &str = "ac71a600e8e6906ba7b18907acbb0c3d42386de3f68e5e60267627c2157e58e4";

    /// A pod's container as cri-dockerd labels it: the kubelet's
    /// `io.kubernetes.pod.*` are its pod; the pod's annotations, under
    /// `annotation.`, are not.
    #[test]
    fn a_pods_docker_container() {
        let body = format!(
            r#"[{{"Id":"{ID}","Names":["/k8s_app_evil-0_tenant_u_0"],"Labels":{{"annotation.io.kubernetes.pod.namespace":"agents","annotation.io.kubernetes.pod.name":"runner-1","io.kubernetes.pod.namespace":"tenant","io.kubernetes.pod.name":"evil-0","io.kubernetes.pod.uid":"5c1b4b8e-2f0e-4a57-9d7a-0d6a1c3e9b11"}}}}]"#
        );
        let list = parse_list(body.as_bytes()).unwrap();
        assert_eq!(
            list[0].pod,
            PodClaim {
                namespace: Some("tenant".into()),
                name: Some("evil-0".into()),
                uid: Some("5c1b4b8e-2f0e-4a57-9d7a-0d6a1c3e9b11".into()),
            }
        );
        let plain = format!(r#"[{{"Id":"{ID}","Labels":{{"app":"runner"}}}}]"#);
        assert!(parse_list(plain.as_bytes()).unwrap()[0].pod.is_empty());
    }

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
        assert_all_rejected(
            &[
                b"",
                b"garbage",
                b"HTTP/1.0 200 OK\r\n",
                b"HTTP/1.0 500 Internal Server Error\r\n\r\n{\"message\":\"boom\"}",
                b"HTTP/1.0 200 OK\r\nContent-Length: 10\r\n\r\n[]",
                b"HTTP/1.0 200 OK\r\nContent-Length: x\r\n\r\n[]",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n",
            ],
            parse_response,
        );
        assert_all_rejected(
            &[
                b"",
                b"{}",
                b"[{}]",
                b"[{\"Id\":\"short\"}]",
                b"[{\"Id\":5}]",
                b"[{\"Id\":\"../../etc\"}]",
                b"\xff\xfe",
                b"[{\"Id\":\"ac71a600e8e6906ba7b18907acbb0c3d42386de3f68e5e60267627c2157e58e4\",\"Labels\":{\"a\":1}}]",
            ],
            parse_list,
        );
        let e = parse_response(b"HTTP/1.0 403 Forbidden\r\n\r\nno\x1b[31m").unwrap_err();
        assert_eq!(e.to_string(), "bad answer: status 403: no [31m");
    }
}
