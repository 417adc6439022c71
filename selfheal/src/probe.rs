//! Probes: asking an agent (or its dispatch server) how it is, from outside.
//!
//! This module owns running the `[[agent.probe]]` entries of the config
//! ([`ProbeConfig`]) and the shape of their results ([`ProbeResult`]):
//!
//! - **HTTP**: one request with reqwest (connect timeout `min(timeout, 2s)`,
//!   total timeout the probe's `timeout`, at most [`MAX_REDIRECTS`]
//!   redirects and only to the same origin, no `Referer`, the `auth`
//!   credential read now, a body read of at most [`MAX_BODY_BYTES`]), then the status
//!   check, the named fields extracted from the JSON body by JSON pointer,
//!   and the expectations on them.
//! - **health file**: the age of a file's modification time against a
//!   maximum age.
//!
//! What a probe result *means* for an agent (unresponsive, contradicting the
//! kernel…) is the judge's business, not this module's. Deciding a result
//! from a response is pure ([`evaluate_response`], [`health_file_result`]);
//! only [`run`], [`run_all`] and [`check_health_file`] do I/O.
//!
//! A result never holds the URL as written: its target is
//! [`redact_url`]'s form, its messages are redacted, and its body excerpt
//! passes [`redact_secrets`] (or is left out).
//!
//! Every failure is a [`ProbeError`] kind in the result (with a human
//! `detail`), never a panic or an `Err`: a probe that cannot even be sent is
//! a failed probe like any other.

use std::{
    collections::BTreeMap,
    io,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    config::{ProbeAuth, ProbeConfig, Redirects, SecretSource},
    text::{redact_secrets, redact_url, redact_urls_in},
};

/// The most of a response body that is read; a larger body fails the probe
/// with [`ProbeError::TooLarge`] and is not read further.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// How much of a body a result keeps ([`ProbeResult::body_excerpt`]), so
/// snapshots stay bounded.
pub const EXCERPT_BYTES: usize = 4 << 10;

/// Redirects followed before [`ProbeError::RedirectLoop`].
pub const MAX_REDIRECTS: usize = 5;

/// The connect timeout of [`client`]; a probe's own timeout bounds it too,
/// so a probe's connect timeout is `min(timeout, CONNECT_TIMEOUT)`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long reading a health file's metadata may take (a hung network
/// file system must not hang the check).
pub const HEALTH_FILE_TIMEOUT: Duration = Duration::from_secs(2);

/// What [`run_all`] allows beyond the largest probe timeout before it gives
/// up on the probes still running.
pub const RUN_ALL_MARGIN: Duration = Duration::from_millis(500);

/// Which kind of probe a result is from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeKind {
    /// An HTTP request (`url = …`).
    Http,
    /// A file's modification time (`health_file = …`).
    HealthFile,
}

/// Why a probe failed: a stable code (`refused`, `timeout`, …) in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum ProbeError {
    /// Nothing listens on the port (the connection was refused).
    #[error("connection refused")]
    Refused,
    /// No complete answer within the probe's timeout (connecting, waiting
    /// for the response, or reading its body).
    #[error("timed out")]
    Timeout,
    /// Another failure to connect: name resolution, unreachable network,
    /// TLS handshake.
    #[error("cannot connect")]
    Connect,
    /// The status is not the expected one (any 2xx when none is set).
    #[error("unexpected status")]
    UnexpectedStatus,
    /// Fields are wanted but the body is not JSON.
    #[error("body is not json")]
    BadJson,
    /// The body is larger than [`MAX_BODY_BYTES`].
    #[error("body too large")]
    TooLarge,
    /// More than [`MAX_REDIRECTS`] redirects (a loop, or a chain too long).
    #[error("too many redirects")]
    RedirectLoop,
    /// A redirect to another origin (scheme, host or port), which a probe
    /// does not follow: the answer would not be the agent's.
    #[error("redirect to another origin refused")]
    RedirectRefused,
    /// The probe cannot be sent as configured (a URL or method the HTTP
    /// client refuses), or the HTTP client cannot be built.
    #[error("probe cannot be sent")]
    Invalid,
    /// Another I/O failure: the connection closed or reset mid-answer, a
    /// health file that cannot be read.
    #[error("i/o error")]
    Io,
    /// The health file does not exist.
    #[error("health file missing")]
    Missing,
    /// The health file is older than its maximum age.
    #[error("health file stale")]
    Stale,
}

impl ProbeError {
    /// The stable code, as in JSON: `refused`, `timeout`, `bad_json`, …
    pub fn code(self) -> &'static str {
        match self {
            ProbeError::Refused => "refused",
            ProbeError::Timeout => "timeout",
            ProbeError::Connect => "connect",
            ProbeError::UnexpectedStatus => "unexpected_status",
            ProbeError::BadJson => "bad_json",
            ProbeError::TooLarge => "too_large",
            ProbeError::RedirectLoop => "redirect_loop",
            ProbeError::RedirectRefused => "redirect_refused",
            ProbeError::Invalid => "invalid",
            ProbeError::Io => "io",
            ProbeError::Missing => "missing",
            ProbeError::Stale => "stale",
        }
    }
}

/// One `expect` entry checked against the extracted field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    /// The field name (declared in the probe's `fields`).
    pub field: String,
    /// The value expected, as written in the config.
    pub expected: String,
    /// The field's value rendered as a string (a JSON string without its
    /// quotes, other values as JSON text); `None` when the pointer found
    /// nothing.
    pub actual: Option<String>,
    /// Whether `actual` equals `expected`.
    pub met: bool,
}

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    /// The URL with its userinfo, query values and fragment redacted
    /// ([`redact_url`]: this is the only form any output gets), or the
    /// health file's path, as text.
    pub target: String,
    pub kind: ProbeKind,
    /// Every check passed: no `error`, and every expectation met.
    pub ok: bool,
    /// HTTP: from sending the request to the outcome (body read, or the
    /// failure). `None` for health files.
    pub latency_ms: Option<u64>,
    /// HTTP: the final status (after redirects), when a response came.
    pub status: Option<u16>,
    /// Field name → the JSON value at its pointer. A pointer that finds
    /// nothing leaves its field out (absent, not an error).
    pub fields: BTreeMap<String, Value>,
    /// The expectations in name order, each with what was found.
    pub expectations: Vec<Expectation>,
    /// Why the probe got no usable answer. `None` when it got one, even if
    /// an expectation is unmet: the agent answered, and what it says is the
    /// judge's to weigh against the kernel (then `ok` is false and `detail`
    /// names the unmet fields).
    pub error: Option<ProbeError>,
    /// A human message: the failure, the unmet expectations, or an oddity
    /// (a health file modified in the future).
    pub detail: Option<String>,
    /// The first [`EXCERPT_BYTES`] of the body (UTF-8, lossily), known
    /// secret shapes redacted ([`redact_secrets`]), when there was one and
    /// the probe's `body_excerpt` is on.
    pub body_excerpt: Option<String>,
    /// Health file: how long ago it was last modified.
    pub age_ms: Option<u64>,
}

impl ProbeResult {
    /// A result that is so far ok, with nothing found yet.
    fn new(target: String, kind: ProbeKind) -> ProbeResult {
        ProbeResult {
            target,
            kind,
            ok: true,
            latency_ms: None,
            status: None,
            fields: BTreeMap::new(),
            expectations: Vec::new(),
            error: None,
            detail: None,
            body_excerpt: None,
            age_ms: None,
        }
    }

    /// Marks the result failed with `error` (keeping an earlier error).
    fn fail(&mut self, error: ProbeError, detail: String) {
        if self.error.is_none() {
            self.error = Some(error);
            self.detail = Some(detail);
        }
        self.ok = false;
    }

    /// A result for `probe` that failed before anything was learned.
    fn failed(probe: &ProbeConfig, error: ProbeError, detail: String) -> ProbeResult {
        let (target, kind) = target_of(probe);
        let mut r = ProbeResult::new(target, kind);
        r.fail(error, detail);
        r
    }
}

/// The target text and kind of a probe.
fn target_of(probe: &ProbeConfig) -> (String, ProbeKind) {
    match probe {
        ProbeConfig::Http { url, .. } => (redact_url(url), ProbeKind::Http),
        ProbeConfig::HealthFile { path, .. } => (path.display().to_string(), ProbeKind::HealthFile),
    }
}

/// The HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the http client: {0}")]
pub struct ClientError(#[source] reqwest::Error);

/// The HTTP client for probes with the default `redirects =
/// "same-origin"`: [`client_for`].
pub fn client() -> Result<reqwest::Client, ClientError> {
    client_for(Redirects::SameOrigin)
}

/// A redirect to another origin, refused (the source of the redirect error
/// reqwest returns, found again by [`failure_of`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "redirect from {from} to another origin, {to}, not followed (a probe asks only its own origin)"
)]
struct CrossOrigin {
    from: String,
    to: String,
}

/// Whether two URLs share scheme, host and port (the port a scheme
/// implies counts as written).
fn same_origin(a: &reqwest::Url, b: &reqwest::Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// The HTTP client probes with this redirect rule are meant to be run
/// with: connect timeout [`CONNECT_TIMEOUT`]; redirects only to the same
/// origin, at most [`MAX_REDIRECTS`] of them ([`Redirects::SameOrigin`]),
/// or none ([`Redirects::None`]); never a `Referer` (it would carry the
/// URL, query token included, to wherever a redirect points); no retries,
/// no proxy (a probe asks the agent, not whatever `HTTP_PROXY` points at),
/// and no pooled connections (every probe opens its own, so it also
/// proves the agent still accepts).
///
/// TLS is rustls (aws-lc-rs crypto, or the process default provider when
/// one is installed), certificates checked against the platform's trust
/// store; HTTP/1.1 only.
pub fn client_for(redirects: Redirects) -> Result<reqwest::Client, ClientError> {
    let policy = match redirects {
        Redirects::None => reqwest::redirect::Policy::none(),
        Redirects::SameOrigin => reqwest::redirect::Policy::custom(|attempt| {
            if let Some(first) = attempt.previous().first()
                && !same_origin(first, attempt.url())
            {
                let error = CrossOrigin {
                    from: origin(first),
                    to: origin(attempt.url()),
                };
                return attempt.error(error);
            }
            // A URL seen before is not refused at once: POST then 303 to the
            // same URL is a legitimate GET. The limit stops true loops.
            if attempt.previous().len() > MAX_REDIRECTS {
                let msg = if attempt.previous().contains(attempt.url()) {
                    format!(
                        "redirect loop: more than {MAX_REDIRECTS} redirects, back to {}",
                        redact_url(attempt.url().as_str())
                    )
                } else {
                    format!("more than {MAX_REDIRECTS} redirects")
                };
                attempt.error(msg)
            } else {
                attempt.follow()
            }
        }),
    };
    reqwest::Client::builder()
        .user_agent(concat!("selfheal/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(policy)
        .referer(false)
        .retry(reqwest::retry::never())
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .map_err(ClientError)
}

/// Runs one probe. Never fails and never outlives the probe's timeout
/// (HTTP) or [`HEALTH_FILE_TIMEOUT`] (health file) by more than a
/// scheduling delay; a failure is in the result.
///
/// Must run inside a tokio runtime with I/O and time enabled (reqwest's
/// requirement); `client` should come from [`client_for`] the probe's
/// `redirects`, whose connect timeout and redirect policy the results
/// assume.
pub async fn run(probe: &ProbeConfig, client: &reqwest::Client) -> ProbeResult {
    match probe {
        ProbeConfig::Http {
            url,
            method,
            timeout,
            expect_status,
            fields,
            expect,
            auth,
            redirects: _,
            body_excerpt,
        } => {
            let request = HttpRequest {
                url,
                method,
                timeout: *timeout,
                expect_status: *expect_status,
                fields,
                expect,
                auth: auth.as_ref(),
                body_excerpt: *body_excerpt,
            };
            run_http(&request, client).await
        }
        ProbeConfig::HealthFile { path, max_age } => run_health_file(path, *max_age).await,
    }
}

/// Runs all `probes` concurrently on one current-thread tokio runtime and
/// returns their results in the same order. Blocks for at most the largest
/// probe timeout (health files count [`HEALTH_FILE_TIMEOUT`]) plus
/// [`RUN_ALL_MARGIN`]: a probe still running then gets a `timeout` result.
pub fn run_all(probes: &[&ProbeConfig]) -> Vec<ProbeResult> {
    if probes.is_empty() {
        return Vec::new();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let detail = format!("cannot start the probe runtime: {e}");
            return probes
                .iter()
                .map(|p| ProbeResult::failed(p, ProbeError::Io, detail.clone()))
                .collect();
        }
    };
    // Building the clients needs no runtime, but a client failure only
    // matters to HTTP probes: health files still run.
    let same_origin = client_for(Redirects::SameOrigin).map_err(|e| e.to_string());
    // The second client only when a probe needs it (building one reads the
    // platform's trust store).
    let wants_none = probes.iter().any(|p| {
        matches!(
            p,
            ProbeConfig::Http {
                redirects: Redirects::None,
                ..
            }
        )
    });
    let no_redirects = if wants_none {
        client_for(Redirects::None).map_err(|e| e.to_string())
    } else {
        Err("no probe here has redirects = \"none\"".to_string())
    };
    let limit = probes
        .iter()
        .map(|p| match p {
            ProbeConfig::Http { timeout, .. } => *timeout,
            ProbeConfig::HealthFile { .. } => HEALTH_FILE_TIMEOUT,
        })
        .max()
        .unwrap_or(HEALTH_FILE_TIMEOUT)
        .saturating_add(RUN_ALL_MARGIN);

    let results = runtime.block_on(async {
        let deadline = deadline_after(limit);
        let handles: Vec<_> = probes
            .iter()
            .map(|&p| {
                let probe = p.clone();
                let client = match p {
                    ProbeConfig::Http {
                        redirects: Redirects::None,
                        ..
                    } => no_redirects.clone(),
                    _ => same_origin.clone(),
                };
                tokio::spawn(async move {
                    match (&probe, &client) {
                        // No client is needed for a file.
                        (ProbeConfig::HealthFile { path, max_age }, _) => {
                            run_health_file(path, *max_age).await
                        }
                        (ProbeConfig::Http { .. }, Ok(client)) => run(&probe, client).await,
                        (ProbeConfig::Http { .. }, Err(e)) => {
                            ProbeResult::failed(&probe, ProbeError::Invalid, e.clone())
                        }
                    }
                })
            })
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for (handle, probe) in handles.into_iter().zip(probes) {
            let abort = handle.abort_handle();
            let result = match tokio::time::timeout_at(deadline, handle).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => {
                    ProbeResult::failed(probe, ProbeError::Io, format!("probe task failed: {e}"))
                }
                Err(_) => {
                    abort.abort();
                    ProbeResult::failed(
                        probe,
                        ProbeError::Timeout,
                        format!(
                            "probe still running after {}",
                            humantime::format_duration(limit)
                        ),
                    )
                }
            };
            out.push(result);
        }
        out
    });
    // A health file stat stuck in the kernel must not hold us: leave its
    // blocking thread behind instead of waiting for it.
    runtime.shutdown_background();
    results
}

/// The instant `after` from now; a duration too long to add (a config may
/// say `timeout = "1000000y"`) is a year, which is as good as never.
fn deadline_after(after: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 86_400))
}

/// The parts of an HTTP probe, borrowed from its config.
struct HttpRequest<'a> {
    url: &'a str,
    method: &'a str,
    timeout: Duration,
    expect_status: Option<u16>,
    fields: &'a BTreeMap<String, String>,
    expect: &'a BTreeMap<String, String>,
    auth: Option<&'a ProbeAuth>,
    body_excerpt: bool,
}

/// The most of a `bearer_file` that is read.
const MAX_SECRET_BYTES: u64 = 64 << 10;

/// The credential of a probe's `auth`, read now: the first line of its
/// file, or its environment variable. The error says what is wrong and
/// what to do, and never holds the secret.
///
/// A file must be a regular file owned by root or by us, writable by
/// nobody else and readable by no other user (group-readable is allowed,
/// for a `root:selfheal 0640` file).
pub fn read_secret(source: &SecretSource) -> Result<String, String> {
    use std::{io::Read as _, os::unix::fs::MetadataExt as _};
    let text = match source {
        SecretSource::Env(name) => match std::env::var(name) {
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => {
                return Err(format!(
                    "bearer_env: environment variable {name} is not set"
                ));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!(
                    "bearer_env: environment variable {name} is not UTF-8"
                ));
            }
        },
        SecretSource::File(path) => {
            let shown = crate::text::escape(&path.display().to_string());
            let file = std::fs::File::open(path)
                .map_err(|e| format!("bearer_file {shown}: cannot open: {e}"))?;
            let meta = file
                .metadata()
                .map_err(|e| format!("bearer_file {shown}: cannot stat: {e}"))?;
            let me = crate::trust::euid();
            if !meta.is_file() {
                return Err(format!("bearer_file {shown}: not a regular file"));
            }
            if meta.uid() != 0 && meta.uid() != me {
                return Err(format!(
                    "bearer_file {shown}: owned by uid {}, not by root or uid {me}: chown it",
                    meta.uid()
                ));
            }
            if meta.mode() & 0o026 != 0 {
                return Err(format!(
                    "bearer_file {shown}: mode {:04o} lets other users read or change it: chmod 600 it (or 640 for a group)",
                    meta.mode() & 0o7777
                ));
            }
            let mut bytes = Vec::new();
            file.take(MAX_SECRET_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| format!("bearer_file {shown}: cannot read: {e}"))?;
            if bytes.len() as u64 > MAX_SECRET_BYTES {
                return Err(format!("bearer_file {shown}: larger than 64 KiB"));
            }
            String::from_utf8(bytes).map_err(|_| format!("bearer_file {shown}: not UTF-8 text"))?
        }
    };
    let what = match source {
        SecretSource::Env(name) => format!("bearer_env {name}"),
        SecretSource::File(path) => {
            format!(
                "bearer_file {}",
                crate::text::escape(&path.display().to_string())
            )
        }
    };
    let secret = text.lines().next().unwrap_or("").trim();
    if secret.is_empty() {
        return Err(format!("{what}: empty"));
    }
    if secret.chars().any(char::is_control) {
        return Err(format!("{what}: holds control characters"));
    }
    Ok(secret.to_string())
}

/// The header a probe's `auth` sends, read now.
fn auth_header(
    auth: &ProbeAuth,
) -> Result<(reqwest::header::HeaderName, reqwest::header::HeaderValue), String> {
    let secret = read_secret(&auth.source)?;
    let (name, value) = match &auth.header {
        None => (reqwest::header::AUTHORIZATION, format!("Bearer {secret}")),
        Some(h) => (
            reqwest::header::HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| format!("auth: bad header name {h:?}"))?,
            secret,
        ),
    };
    let mut value = reqwest::header::HeaderValue::from_str(&value)
        .map_err(|_| "auth: the secret is not a valid header value".to_string())?;
    value.set_sensitive(true);
    Ok((name, value))
}

async fn run_http(req: &HttpRequest<'_>, client: &reqwest::Client) -> ProbeResult {
    let mut result = ProbeResult::new(redact_url(req.url), ProbeKind::Http);
    let shown_url = result.target.clone();
    let keep = req.body_excerpt;
    let excerpt = |body: &[u8]| if keep { excerpt(body) } else { None };
    let start = Instant::now();
    let deadline = deadline_after(req.timeout);
    let timeout_text = humantime::format_duration(req.timeout);
    let elapsed_ms =
        |start: Instant| u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);

    let method = match reqwest::Method::from_bytes(req.method.as_bytes()) {
        Ok(m) => m,
        Err(_) => {
            result.fail(
                ProbeError::Invalid,
                format!("bad http method {:?}", req.method),
            );
            return result;
        }
    };
    let is_head = method == reqwest::Method::HEAD;
    let mut request = client.request(method, req.url);
    if let Some(auth) = req.auth {
        match auth_header(auth) {
            Ok((name, value)) => request = request.header(name, value),
            Err(e) => {
                result.fail(ProbeError::Invalid, format!("auth: {e}"));
                return result;
            }
        }
    }
    let sent = tokio::time::timeout_at(deadline, request.send()).await;
    let mut response = match sent {
        Err(_) => {
            result.latency_ms = Some(elapsed_ms(start));
            result.fail(
                ProbeError::Timeout,
                format!("no response from {shown_url} within {timeout_text}"),
            );
            return result;
        }
        Ok(Err(e)) => {
            result.latency_ms = Some(elapsed_ms(start));
            result.fail(classify(failure_of(&e)), error_chain(&e));
            return result;
        }
        Ok(Ok(r)) => r,
    };
    let status = response.status().as_u16();
    result.status = Some(status);
    // A redirect not followed (`redirects = "none"`): say where it pointed.
    let unfollowed = response
        .status()
        .is_redirection()
        .then(|| response.headers().get(reqwest::header::LOCATION))
        .flatten()
        .map(|l| redact_url(&String::from_utf8_lossy(l.as_bytes())));

    if !is_head
        && let Some(len) = response.content_length()
        && len > MAX_BODY_BYTES as u64
    {
        result.latency_ms = Some(elapsed_ms(start));
        result.fail(
            ProbeError::TooLarge,
            format!(
                "body of {} is {len} bytes, over the {} limit",
                shown_url,
                size_text(MAX_BODY_BYTES)
            ),
        );
        return result;
    }

    let mut body: Vec<u8> = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => {
                result.latency_ms = Some(elapsed_ms(start));
                result.body_excerpt = excerpt(&body);
                result.fail(
                    ProbeError::Timeout,
                    format!(
                        "body of {} not complete within {timeout_text} ({} bytes read)",
                        shown_url,
                        body.len()
                    ),
                );
                return result;
            }
            Ok(Err(e)) => {
                result.latency_ms = Some(elapsed_ms(start));
                result.body_excerpt = excerpt(&body);
                result.fail(
                    classify(failure_of(&e)),
                    format!("reading the body: {}", error_chain(&e)),
                );
                return result;
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(chunk))) => {
                let room = MAX_BODY_BYTES - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    result.latency_ms = Some(elapsed_ms(start));
                    result.body_excerpt = excerpt(&body);
                    result.fail(
                        ProbeError::TooLarge,
                        format!(
                            "body of {} is over the {} limit (stopped reading)",
                            shown_url,
                            size_text(MAX_BODY_BYTES)
                        ),
                    );
                    return result;
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
    // Dropping the response here (body fully read) closes the connection.
    drop(response);
    result.latency_ms = Some(elapsed_ms(start));
    let eval = evaluate_response(status, &body, req.expect_status, req.fields, req.expect);
    result.fields = eval.fields;
    result.expectations = eval.expectations;
    result.body_excerpt = excerpt(&body);
    result.ok = eval.ok;
    result.error = eval.error;
    result.detail = match (eval.detail, unfollowed) {
        (Some(d), Some(to)) if eval.error == Some(ProbeError::UnexpectedStatus) => {
            Some(format!("{d} (a redirect to {to}, not followed)"))
        }
        (d, _) => d,
    };
    result
}

/// `1 MiB`, `4 KiB`, or bytes.
fn size_text(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

/// What a complete response amounts to.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// No error and every expectation met.
    pub ok: bool,
    /// The first failure found: status, then JSON.
    pub error: Option<ProbeError>,
    /// The failure's message, else the unmet expectations'.
    pub detail: Option<String>,
    /// Fields found (absent pointers left out).
    pub fields: BTreeMap<String, Value>,
    /// Every expectation, in name order.
    pub expectations: Vec<Expectation>,
}

/// Judges a complete response (pure): the status against `expect_status`
/// (any 2xx when `None`); when `fields` is not empty, the body as JSON and
/// each field at its pointer; then each expectation (unmet ones are no
/// error, but make the result not ok). Fields are extracted
/// even from a response with an unexpected status when its body is JSON (a
/// 503 may still say why).
pub fn evaluate_response(
    status: u16,
    body: &[u8],
    expect_status: Option<u16>,
    fields: &BTreeMap<String, String>,
    expect: &BTreeMap<String, String>,
) -> Evaluation {
    let mut error = None;
    if !status_ok(status, expect_status) {
        let wanted = match expect_status {
            Some(s) => s.to_string(),
            None => "2xx".to_string(),
        };
        error = Some((
            ProbeError::UnexpectedStatus,
            format!("status {status}, expected {wanted}"),
        ));
    }
    let mut found = BTreeMap::new();
    if !fields.is_empty() {
        match serde_json::from_slice::<Value>(body) {
            Ok(doc) => found = extract_fields(&doc, fields),
            Err(e) => {
                if error.is_none() {
                    let what = if body.is_empty() {
                        "body is empty, expected json".to_string()
                    } else {
                        format!("body is not json: {e}")
                    };
                    error = Some((ProbeError::BadJson, what));
                }
            }
        }
    }
    let expectations = evaluate_expectations(&found, expect);
    let all_met = expectations.iter().all(|x| x.met);
    let detail = match error {
        Some((_, ref detail)) => Some(detail.clone()),
        None if all_met => None,
        None => Some(
            expectations
                .iter()
                .filter(|x| !x.met)
                .map(|x| match &x.actual {
                    Some(actual) => {
                        format!("field {} is {actual:?}, expected {:?}", x.field, x.expected)
                    }
                    None => format!("field {} is absent, expected {:?}", x.field, x.expected),
                })
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    Evaluation {
        ok: error.is_none() && all_met,
        error: error.map(|(e, _)| e),
        detail,
        fields: found,
        expectations,
    }
}

/// Whether `status` is as expected: equal to `expect` when set, else 2xx.
fn status_ok(status: u16, expect: Option<u16>) -> bool {
    match expect {
        Some(want) => status == want,
        None => (200..300).contains(&status),
    }
}

/// Each field's value at its JSON pointer; pointers that find nothing are
/// left out.
fn extract_fields(doc: &Value, pointers: &BTreeMap<String, String>) -> BTreeMap<String, Value> {
    pointers
        .iter()
        .filter_map(|(name, pointer)| doc.pointer(pointer).map(|v| (name.clone(), v.clone())))
        .collect()
}

/// A field's value as compared with an expectation: a JSON string without
/// its quotes, anything else as JSON text (`42`, `true`, `null`, `{"a":1}`).
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Every expectation checked against the fields found.
fn evaluate_expectations(
    fields: &BTreeMap<String, Value>,
    expect: &BTreeMap<String, String>,
) -> Vec<Expectation> {
    expect
        .iter()
        .map(|(field, expected)| {
            let actual = fields.get(field).map(render);
            Expectation {
                field: field.clone(),
                expected: expected.clone(),
                met: actual.as_deref() == Some(expected.as_str()),
                actual,
            }
        })
        .collect()
}

/// The first [`EXCERPT_BYTES`] of a body as text with known secret shapes
/// redacted ([`redact_secrets`]), `None` when empty. Twice as much is
/// redacted before the cut, so that a secret straddling it is still
/// recognised. A multi-byte character cut at the end is dropped rather
/// than shown as a replacement character; other invalid bytes are
/// replaced.
fn excerpt(body: &[u8]) -> Option<String> {
    if body.is_empty() {
        return None;
    }
    let mut cut = &body[..body.len().min(2 * EXCERPT_BYTES)];
    if cut.len() < body.len() {
        cut = &cut[..whole_chars(cut)];
    }
    let mut text = redact_secrets(&String::from_utf8_lossy(cut));
    if text.len() > EXCERPT_BYTES {
        let mut end = EXCERPT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    Some(text)
}

/// The origin of a URL as shown: `scheme://host:port`.
fn origin(url: &reqwest::Url) -> String {
    match (url.host_str(), url.port_or_known_default()) {
        (Some(h), Some(p)) => format!("{}://{h}:{p}", url.scheme()),
        (Some(h), None) => format!("{}://{h}", url.scheme()),
        _ => redact_url(url.as_str()),
    }
}

/// The length of `bytes` without a UTF-8 sequence cut short at its end.
fn whole_chars(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=n.min(4) {
        let b = bytes[n - back];
        if b & 0xC0 != 0x80 {
            // The last lead byte (or ASCII): how long its sequence should be.
            let need = match b {
                0xF0.. => 4,
                0xE0.. => 3,
                0xC0.. => 2,
                _ => 1,
            };
            return if need > back { n - back } else { n };
        }
    }
    n
}

/// What went wrong on the way, as reqwest tells it, reduced to what the
/// probe's error kind depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Failure {
    /// A timeout fired (connect or total).
    Timeout,
    /// Connecting failed; the underlying I/O error kind, if one was given.
    Connect(Option<io::ErrorKind>),
    /// The redirect policy stopped the chain.
    Redirect,
    /// The redirect policy refused a redirect to another origin.
    CrossOrigin,
    /// The request could not be built (URL, method, headers).
    Builder,
    /// Anything else (connection closed or reset mid-answer, protocol
    /// errors); the I/O error kind, if one was given.
    Other(Option<io::ErrorKind>),
}

/// The probe error kind of a transport failure (pure).
fn classify(failure: Failure) -> ProbeError {
    match failure {
        Failure::Timeout
        | Failure::Connect(Some(io::ErrorKind::TimedOut))
        | Failure::Other(Some(io::ErrorKind::TimedOut)) => ProbeError::Timeout,
        Failure::Connect(Some(io::ErrorKind::ConnectionRefused)) => ProbeError::Refused,
        Failure::Connect(_) => ProbeError::Connect,
        Failure::Redirect => ProbeError::RedirectLoop,
        Failure::CrossOrigin => ProbeError::RedirectRefused,
        Failure::Builder => ProbeError::Invalid,
        Failure::Other(_) => ProbeError::Io,
    }
}

/// The [`Failure`] a reqwest error stands for.
fn failure_of(e: &reqwest::Error) -> Failure {
    let kind = io_kind(e);
    if e.is_timeout() {
        Failure::Timeout
    } else if e.is_redirect() && found_in_chain::<CrossOrigin>(e) {
        Failure::CrossOrigin
    } else if e.is_redirect() {
        Failure::Redirect
    } else if e.is_builder() {
        Failure::Builder
    } else if e.is_connect() || e.is_dns() {
        Failure::Connect(kind)
    } else {
        Failure::Other(kind)
    }
}

/// Whether an error of type `E` is in an error's source chain.
fn found_in_chain<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    for _ in 0..32 {
        let Some(err) = cur else { return false };
        if err.is::<E>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The kind of the first `std::io::Error` in an error's source chain.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<io::ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // Bounded: source chains are short, but never trust a cycle.
    for _ in 0..32 {
        let err = cur?;
        if let Some(io) = err.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        cur = err.source();
    }
    None
}

/// An error and its sources, `: `-joined, repeats dropped (reqwest and hyper
/// often say the same thing twice), every URL in it redacted (reqwest names
/// the URL it failed on).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    for _ in 0..32 {
        let Some(err) = cur else { break };
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = err.source();
    }
    redact_urls_in(&parts.join(": "))
}

/// Reads a health file's modification time off the async threads, bounded by
/// [`HEALTH_FILE_TIMEOUT`].
async fn run_health_file(path: &Path, max_age: Duration) -> ProbeResult {
    let target = path.display().to_string();
    if tokio::runtime::Handle::try_current().is_err() {
        return check_health_file(path, max_age);
    }
    let owned = path.to_path_buf();
    let stat = tokio::task::spawn_blocking(move || mtime_of(&owned));
    match tokio::time::timeout(HEALTH_FILE_TIMEOUT, stat).await {
        Ok(Ok(stat)) => health_file_result(target, max_age, stat, SystemTime::now()),
        Ok(Err(e)) => {
            let mut r = ProbeResult::new(target, ProbeKind::HealthFile);
            r.fail(ProbeError::Io, format!("cannot stat health file: {e}"));
            r
        }
        Err(_) => {
            let mut r = ProbeResult::new(target.clone(), ProbeKind::HealthFile);
            r.fail(
                ProbeError::Timeout,
                format!(
                    "stat of health file {target} did not return within {}",
                    humantime::format_duration(HEALTH_FILE_TIMEOUT)
                ),
            );
            r
        }
    }
}

fn mtime_of(path: &Path) -> io::Result<SystemTime> {
    std::fs::metadata(path)?.modified()
}

/// Checks a health file now, blocking (one `stat`).
pub fn check_health_file(path: &Path, max_age: Duration) -> ProbeResult {
    let stat = mtime_of(path);
    health_file_result(path.display().to_string(), max_age, stat, SystemTime::now())
}

/// Judges a health file from its stat (pure): `missing` when it does not
/// exist, `io` when it cannot be read, `stale` when `now − mtime` exceeds
/// `max_age`.
///
/// The age is measured in wall-clock time (`SystemTime`), unlike every other
/// age in selfheal (`CLOCK_BOOTTIME`, see [`crate::clock`]): a file's mtime
/// is wall-clock by nature. So a clock step changes the age; an mtime in the
/// future (clock skew, or the clock set back) counts as age 0 and is noted
/// in `detail`.
pub fn health_file_result(
    target: String,
    max_age: Duration,
    stat: io::Result<SystemTime>,
    now: SystemTime,
) -> ProbeResult {
    let mut r = ProbeResult::new(target, ProbeKind::HealthFile);
    let mtime = match stat {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let detail = format!("health file {} does not exist", r.target);
            r.fail(ProbeError::Missing, detail);
            return r;
        }
        Err(e) => {
            let detail = format!("cannot stat health file {}: {e}", r.target);
            r.fail(ProbeError::Io, detail);
            return r;
        }
    };
    let age = match now.duration_since(mtime) {
        Ok(age) => age,
        Err(ahead) => {
            r.detail = Some(format!(
                "health file {} was modified {} in the future (clock skew?)",
                r.target,
                humantime::format_duration(round_ms(ahead.duration()))
            ));
            Duration::ZERO
        }
    };
    r.age_ms = Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX));
    if age > max_age {
        let detail = format!(
            "health file {} last modified {} ago, more than its max age {}",
            r.target,
            humantime::format_duration(round_ms(age)),
            humantime::format_duration(max_age)
        );
        r.fail(ProbeError::Stale, detail);
    }
    r
}

/// A duration cut to whole milliseconds (for messages).
fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn status_rules() {
        assert!(status_ok(200, None));
        assert!(status_ok(204, None));
        assert!(status_ok(299, None));
        assert!(!status_ok(301, None));
        assert!(!status_ok(500, None));
        assert!(!status_ok(199, None));
        assert!(status_ok(503, Some(503)));
        assert!(!status_ok(200, Some(204)));
    }

    #[test]
    fn fields_by_pointer_absent_is_left_out() {
        let doc = json!({"status": "connected", "task": {"id": 7}, "list": [1, 2], "n": null});
        let got = extract_fields(
            &doc,
            &map(&[
                ("status", "/status"),
                ("id", "/task/id"),
                ("second", "/list/1"),
                ("nothing", "/missing"),
                ("null", "/n"),
                ("whole", ""),
            ]),
        );
        assert_eq!(got["status"], json!("connected"));
        assert_eq!(got["id"], json!(7));
        assert_eq!(got["second"], json!(2));
        assert_eq!(got["null"], Value::Null);
        assert_eq!(got["whole"], doc);
        assert!(!got.contains_key("nothing"));
    }

    #[test]
    fn rendering_for_expectations() {
        assert_eq!(render(&json!("connected")), "connected");
        assert_eq!(render(&json!(42)), "42");
        assert_eq!(render(&json!(true)), "true");
        assert_eq!(render(&Value::Null), "null");
        assert_eq!(render(&json!({"a": 1})), r#"{"a":1}"#);
        assert_eq!(render(&json!("say \"hi\"")), "say \"hi\"");
    }

    #[test]
    fn expectations_met_unmet_absent() {
        let fields: BTreeMap<String, Value> = [
            ("status".to_string(), json!("connected")),
            ("count".to_string(), json!(3)),
        ]
        .into();
        let got = evaluate_expectations(
            &fields,
            &map(&[("status", "connected"), ("count", "4"), ("gone", "x")]),
        );
        assert_eq!(
            got,
            vec![
                Expectation {
                    field: "count".into(),
                    expected: "4".into(),
                    actual: Some("3".into()),
                    met: false
                },
                Expectation {
                    field: "gone".into(),
                    expected: "x".into(),
                    actual: None,
                    met: false
                },
                Expectation {
                    field: "status".into(),
                    expected: "connected".into(),
                    actual: Some("connected".into()),
                    met: true
                },
            ]
        );
    }

    #[test]
    fn evaluation_order_and_details() {
        let fields = map(&[("s", "/status")]);
        let expect = map(&[("s", "connected")]);
        let ok = evaluate_response(200, br#"{"status":"connected"}"#, None, &fields, &expect);
        assert!(ok.ok);
        assert_eq!(ok.error, None);
        assert_eq!(ok.detail, None);
        assert_eq!(ok.fields["s"], json!("connected"));

        // An unmet expectation is an answer, not an error: not ok all the same.
        let unmet = evaluate_response(200, br#"{"status":"gone"}"#, None, &fields, &expect);
        assert!(!unmet.ok);
        assert_eq!(unmet.error, None);
        let detail = unmet.detail.unwrap();
        assert!(
            detail.contains(r#"field s is "gone", expected "connected""#),
            "{detail}"
        );

        let absent = evaluate_response(200, b"{}", None, &fields, &expect);
        assert!(!absent.ok);
        assert_eq!(absent.error, None);
        let detail = absent.detail.unwrap();
        assert!(detail.contains("absent"), "{detail}");

        let bad = evaluate_response(200, b"<html>", None, &fields, &expect);
        assert!(!bad.ok);
        assert_eq!(bad.error, Some(ProbeError::BadJson));
        let detail = bad.detail.unwrap();
        assert!(detail.starts_with("body is not json: "), "{detail}");
        assert!(bad.fields.is_empty());
        assert!(!bad.expectations[0].met);

        let empty = evaluate_response(200, b"", None, &fields, &BTreeMap::new());
        assert_eq!(empty.error.unwrap(), ProbeError::BadJson);

        // Status first, but fields still read from a JSON error body.
        let status = evaluate_response(503, br#"{"status":"draining"}"#, None, &fields, &expect);
        assert_eq!(status.error, Some(ProbeError::UnexpectedStatus));
        assert_eq!(status.detail.as_deref(), Some("status 503, expected 2xx"));
        assert_eq!(status.fields["s"], json!("draining"));

        let wanted = evaluate_response(200, b"", Some(204), &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(wanted.detail.as_deref(), Some("status 200, expected 204"));

        // No fields wanted: the body need not be JSON.
        let plain = evaluate_response(200, b"ok", None, &BTreeMap::new(), &BTreeMap::new());
        assert!(plain.ok);
        assert_eq!(plain.error, None);
    }

    #[test]
    fn hostile_json_is_an_error_not_a_crash() {
        let deep = "[".repeat(100_000);
        let got = evaluate_response(
            200,
            deep.as_bytes(),
            None,
            &map(&[("a", "/a")]),
            &BTreeMap::new(),
        );
        assert_eq!(got.error, Some(ProbeError::BadJson));
        let got = evaluate_response(
            200,
            &[0xff, 0xfe, 0x00],
            None,
            &map(&[("a", "/a")]),
            &BTreeMap::new(),
        );
        assert_eq!(got.error, Some(ProbeError::BadJson));
    }

    #[test]
    fn classification() {
        use io::ErrorKind as K;
        assert_eq!(classify(Failure::Timeout), ProbeError::Timeout);
        assert_eq!(
            classify(Failure::Connect(Some(K::ConnectionRefused))),
            ProbeError::Refused
        );
        assert_eq!(
            classify(Failure::Connect(Some(K::TimedOut))),
            ProbeError::Timeout
        );
        assert_eq!(
            classify(Failure::Connect(Some(K::HostUnreachable))),
            ProbeError::Connect
        );
        assert_eq!(classify(Failure::Connect(None)), ProbeError::Connect);
        assert_eq!(classify(Failure::Redirect), ProbeError::RedirectLoop);
        assert_eq!(classify(Failure::Builder), ProbeError::Invalid);
        assert_eq!(
            classify(Failure::Other(Some(K::ConnectionReset))),
            ProbeError::Io
        );
        assert_eq!(
            classify(Failure::Other(Some(K::TimedOut))),
            ProbeError::Timeout
        );
        assert_eq!(classify(Failure::Other(None)), ProbeError::Io);
    }

    #[test]
    fn io_kind_found_down_the_chain() {
        #[derive(Debug)]
        struct Wrap(io::Error);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("tcp connect error")
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Wrap(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(io_kind(&e), Some(io::ErrorKind::ConnectionRefused));
        let chain = error_chain(&e);
        assert!(chain.starts_with("tcp connect error: "), "{chain}");
    }

    #[test]
    fn excerpts_are_bounded_and_cut_on_characters() {
        assert_eq!(excerpt(b""), None);
        assert_eq!(excerpt(b"hello").as_deref(), Some("hello"));
        let big = vec![b'a'; 10 * EXCERPT_BYTES];
        assert_eq!(excerpt(&big).unwrap().len(), EXCERPT_BYTES);
        // A 3-byte character straddling the cut is dropped whole.
        let mut split = vec![b'a'; EXCERPT_BYTES - 1];
        split.extend_from_slice("€€".as_bytes());
        let got = excerpt(&split).unwrap();
        assert_eq!(got.len(), EXCERPT_BYTES - 1);
        assert!(!got.contains('\u{fffd}'));
        // Invalid bytes are replaced, not refused.
        assert_eq!(excerpt(&[b'o', 0xff, b'k']).as_deref(), Some("o\u{fffd}k"));
    }

    #[test]
    fn health_file_rules() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let max = Duration::from_secs(30);
        let fresh = health_file_result("/h".into(), max, Ok(now - Duration::from_secs(5)), now);
        assert!(fresh.ok);
        assert_eq!(fresh.age_ms, Some(5_000));
        assert_eq!(fresh.kind, ProbeKind::HealthFile);
        assert_eq!(fresh.error, None);

        let edge = health_file_result("/h".into(), max, Ok(now - max), now);
        assert!(edge.ok, "exactly max_age is not stale");

        let stale = health_file_result("/h".into(), max, Ok(now - Duration::from_secs(31)), now);
        assert_eq!(stale.error, Some(ProbeError::Stale));
        assert!(!stale.ok);
        assert_eq!(stale.age_ms, Some(31_000));
        assert!(stale.detail.unwrap().contains("31s ago"));

        let future = health_file_result("/h".into(), max, Ok(now + Duration::from_secs(9)), now);
        assert!(future.ok);
        assert_eq!(future.age_ms, Some(0));
        assert!(future.detail.unwrap().contains("future"));

        let missing = health_file_result(
            "/h".into(),
            max,
            Err(io::Error::from(io::ErrorKind::NotFound)),
            now,
        );
        assert_eq!(missing.error, Some(ProbeError::Missing));
        assert_eq!(missing.age_ms, None);

        let denied = health_file_result(
            "/h".into(),
            max,
            Err(io::Error::from(io::ErrorKind::PermissionDenied)),
            now,
        );
        assert_eq!(denied.error, Some(ProbeError::Io));
    }

    #[test]
    fn error_codes_serialize_snake_case() {
        for e in [
            ProbeError::Refused,
            ProbeError::Timeout,
            ProbeError::Connect,
            ProbeError::UnexpectedStatus,
            ProbeError::BadJson,
            ProbeError::TooLarge,
            ProbeError::RedirectLoop,
            ProbeError::RedirectRefused,
            ProbeError::Invalid,
            ProbeError::Io,
            ProbeError::Missing,
            ProbeError::Stale,
        ] {
            assert_eq!(serde_json::to_value(e).unwrap(), json!(e.code()));
        }
        assert_eq!(
            serde_json::to_value(ProbeKind::HealthFile).unwrap(),
            json!("health_file")
        );
    }

    #[test]
    fn result_round_trips_through_json() {
        let mut r = ProbeResult::new("http://localhost/".into(), ProbeKind::Http);
        r.fail(ProbeError::Refused, "connection refused".into());
        r.fields.insert("a".into(), json!([1, "x"]));
        let text = serde_json::to_string(&r).unwrap();
        let back: ProbeResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"], json!("refused"));
        assert_eq!(v["kind"], json!("http"));
        assert_eq!(v["ok"], json!(false));
    }

    #[test]
    fn huge_timeouts_do_not_overflow() {
        let far = deadline_after(Duration::MAX);
        assert!(far > tokio::time::Instant::now() + Duration::from_secs(86_400));
        let soon = deadline_after(Duration::from_millis(10));
        assert!(soon <= tokio::time::Instant::now() + Duration::from_millis(10));
    }

    #[test]
    fn sizes_in_messages() {
        assert_eq!(size_text(MAX_BODY_BYTES), "1 MiB");
        assert_eq!(size_text(EXCERPT_BYTES), "4 KiB");
        assert_eq!(size_text(10), "10 bytes");
    }
}
