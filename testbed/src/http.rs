//! Just enough HTTP/1.1 for the testbed: a server that hands each request's
//! connection to a handler (which writes its response itself, so an SSE
//! stream can pause exactly where a test wants), and a blocking client for a
//! GET whose body is read as it arrives. Request and response heads are
//! parsed by `httparse`; bodies are never chunked (`Connection: close`).
//!
//! Not hyper: the testbed needs byte-level control of when bytes reach the
//! socket (a provider thinking, a stream stalling), and a blocking client
//! whose thread sleeps inside `recv` as a real blocking worker does.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Request heads larger than this are refused.
const MAX_HEAD: usize = 16 * 1024;

/// Request bodies larger than this are refused (the connection dropped).
pub const MAX_BODY: usize = 1 << 20;

/// A parsed request line.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    query: Vec<(String, String)>,
    /// The body, read in full (`Content-Length` bytes, at most
    /// [`MAX_BODY`]) before the handler is called; empty without one.
    pub body: Vec<u8>,
}

impl Request {
    /// A query parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A numeric query parameter, `default` when absent or not a number.
    pub fn param_u64(&self, key: &str, default: u64) -> u64 {
        self.param(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }
}

/// Reads and parses one request head, then its body (`Content-Length`
/// bytes; chunked bodies are refused).
pub async fn read_request(stream: &mut tokio::net::TcpStream) -> std::io::Result<Request> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let target = req.path.unwrap_or("/");
                let (path, query) = target.split_once('?').unwrap_or((target, ""));
                let header = |name: &str| {
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .map(|h| String::from_utf8_lossy(h.value).trim().to_string())
                };
                if header("transfer-encoding").is_some() {
                    return Err(invalid("chunked request bodies are not supported".into()));
                }
                let length = match header("content-length") {
                    Some(v) => v
                        .parse::<usize>()
                        .map_err(|_| invalid(format!("bad Content-Length {v:?}")))?,
                    None => 0,
                };
                if length > MAX_BODY {
                    return Err(invalid(format!("request body over {MAX_BODY} bytes")));
                }
                let request = Request {
                    method: req.method.unwrap_or("GET").to_string(),
                    path: path.to_string(),
                    query: form_urlencoded::parse(query.as_bytes())
                        .into_owned()
                        .collect(),
                    body: Vec::new(),
                };
                let mut body = buf.split_off(head_len);
                body.truncate(length);
                while body.len() < length {
                    let want = (length - body.len()).min(chunk.len());
                    let n = stream.read(&mut chunk[..want]).await?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    body.extend_from_slice(&chunk[..n]);
                }
                return Ok(Request { body, ..request });
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                return Err(invalid(format!("request head over {MAX_HEAD} bytes")));
            }
            Err(e) => return Err(invalid(format!("bad request: {e}"))),
        }
    }
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

/// Writes a complete JSON response and closes the write side.
pub async fn respond_json(
    stream: &mut tokio::net::TcpStream,
    status: u16,
    body: &serde_json::Value,
) -> std::io::Result<()> {
    let body = body.to_string();
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Accepts connections forever, reading each request and handing it with
/// its connection to `handler`, each in its own task.
pub async fn serve<H, F>(listener: tokio::net::TcpListener, handler: H)
where
    H: Fn(Request, tokio::net::TcpStream) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    serve_reusing(listener, move |req, stream| {
        let answered = handler(req, stream);
        async move { answered.await.map(|()| None) }
    })
    .await
}

/// [`serve`] for a handler that may keep a connection open for the next
/// request (HTTP/1.1 keep-alive): it gives the connection back. A kept
/// connection waits up to 2 minutes, idle, for its next request.
pub async fn serve_reusing<H, F>(listener: tokio::net::TcpListener, handler: H)
where
    H: Fn(Request, tokio::net::TcpStream) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = std::io::Result<Option<tokio::net::TcpStream>>>
        + Send
        + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of fds or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            // A client that sends no head and body in 5 s is dropped.
            let mut wait = Duration::from_secs(5);
            let mut stream = stream;
            loop {
                let req = tokio::time::timeout(wait, read_request(&mut stream)).await;
                let Ok(Ok(req)) = req else { return };
                match handler(req, stream).await {
                    Ok(Some(kept)) => stream = kept,
                    _ => return,
                }
                wait = Duration::from_secs(120);
            }
        });
    }
}

/// A response whose head has been read; the body is read from `body`.
pub struct Streaming {
    pub status: u16,
    pub body: BufReader<TcpStream>,
}

/// Sends `GET path` to `addr` and reads the response head. `timeout`
/// bounds the connect and every read (`None`: reads may block forever, as a
/// careless client's do).
pub fn get_streaming(
    addr: SocketAddr,
    path: &str,
    timeout: Option<Duration>,
) -> std::io::Result<Streaming> {
    let mut stream = match timeout {
        Some(t) => TcpStream::connect_timeout(&addr, t)?,
        None => TcpStream::connect(addr)?,
    };
    stream.set_read_timeout(timeout)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = BufReader::new(stream);
    let mut head = Vec::new();
    loop {
        let n = body.read_until(b'\n', &mut head)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if head.ends_with(b"\r\n\r\n") {
            break;
        }
        if head.len() > MAX_HEAD {
            return Err(invalid(format!("response head over {MAX_HEAD} bytes")));
        }
    }
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(&head) {
        Ok(httparse::Status::Complete(_)) => Ok(Streaming {
            status: resp.code.unwrap_or(0),
            body,
        }),
        Ok(httparse::Status::Partial) => Err(invalid("truncated response head".into())),
        Err(e) => Err(invalid(format!("bad response: {e}"))),
    }
}

/// `GET path` with every step bounded by `timeout`: status and JSON body.
pub fn get_json(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, serde_json::Value)> {
    let mut resp = get_streaming(addr, path, Some(timeout))?;
    let mut body = Vec::new();
    resp.body.by_ref().take(1 << 20).read_to_end(&mut body)?;
    let value = serde_json::from_slice(&body).map_err(|e| invalid(format!("bad JSON: {e}")))?;
    Ok((resp.status, value))
}
