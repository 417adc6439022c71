//! The testbed's attach protocol between a runner and the dispatch server:
//! frames of a 4-byte big-endian length and one JSON message, both ways on
//! one TCP connection. The runner says hello and heartbeats; the server
//! acknowledges every heartbeat and dispatches work; the runner reports work
//! done.
//!
//! Why not HTTP/2 or gRPC: what the incident turns on is a read that blocks
//! forever on a half-open TCP connection with no keepalive, which is the same
//! at the socket whatever the framing; HTTP/2 would add PING frames the
//! incident's runner never enabled, and a runner variant with a blocking
//! worker thread could not speak it without an event loop.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt as _};

/// Larger frames are refused: a peer cannot make us allocate without bound.
pub const MAX_FRAME: usize = 64 * 1024;

/// One message of the attach stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Msg {
    /// Runner → server, first on every connection.
    Hello { runner: String, executor: String },
    /// Runner → server, every heartbeat interval.
    Heartbeat { seq: u64 },
    /// Server → runner, for every heartbeat.
    Ack { seq: u64 },
    /// Server → runner: a work item.
    Work { id: String, prompt: String },
    /// Runner → server: a work item finished.
    Done { id: String, tokens: u64 },
}

/// The frame for `msg`: length, then JSON.
pub fn encode(msg: &Msg) -> Vec<u8> {
    let body = serde_json::to_vec(msg).expect("a Msg always serializes");
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

fn decode(
    len: [u8; 4],
    read_body: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
) -> std::io::Result<Msg> {
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes (limit {MAX_FRAME})"),
        ));
    }
    let mut body = vec![0; len];
    read_body(&mut body)?;
    serde_json::from_slice(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Reads one message from a blocking stream.
pub fn read(r: &mut impl Read) -> std::io::Result<Msg> {
    let mut len = [0; 4];
    r.read_exact(&mut len)?;
    decode(len, |body| r.read_exact(body))
}

/// Writes one message to a blocking stream.
pub fn write(w: &mut impl Write, msg: &Msg) -> std::io::Result<()> {
    w.write_all(&encode(msg))
}

/// Reads one message from an async stream.
pub async fn read_async(r: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Msg> {
    let mut len = [0; 4];
    r.read_exact(&mut len).await?;
    let len_usize = u32::from_be_bytes(len) as usize;
    let mut body = vec![0; len_usize.min(MAX_FRAME)];
    if len_usize <= MAX_FRAME {
        r.read_exact(&mut body).await?;
    }
    decode(len, |b| {
        b.copy_from_slice(&body);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversized_frames_are_refused() {
        let msgs = [
            Msg::Hello {
                runner: "r".into(),
                executor: "opencode".into(),
            },
            Msg::Heartbeat { seq: 7 },
            Msg::Ack { seq: 7 },
            Msg::Work {
                id: "WI-1".into(),
                prompt: "p".into(),
            },
            Msg::Done {
                id: "WI-1".into(),
                tokens: 3,
            },
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write(&mut buf, m).unwrap();
        }
        let mut r = &buf[..];
        for m in &msgs {
            assert_eq!(&read(&mut r).unwrap(), m);
        }
        assert_eq!(
            read(&mut r).unwrap_err().kind(),
            std::io::ErrorKind::UnexpectedEof
        );

        let big = (MAX_FRAME as u32 + 1).to_be_bytes();
        let err = read(&mut &big[..]).unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
        let garbage = [0, 0, 0, 2, b'{', b'x'];
        assert_eq!(
            read(&mut &garbage[..]).unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
    }
}
