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
//! passes [`selfheal_core::text::redact_secrets`] (or is left out).
//!
//! Every failure is a [`ProbeError`] kind in the result (with a human
//! `detail`), never a panic or an `Err`: a probe that cannot even be sent is
//! a failed probe like any other.

use selfheal_core::probe::{
    Failure, MAX_BODY_BYTES, MAX_REDIRECTS, ProbeError, ProbeKind, ProbeResult, classify,
    evaluate_response, excerpt, health_file_result, size_text,
};
use std::{
    collections::BTreeMap,
    io,
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use selfheal_core::{
    config::{ProbeAuth, ProbeConfig, Redirects, SecretSource},
    text::{self, redact_url, redact_urls_in},
};

/// The connect timeout of [`client`]; a probe's own timeout bounds it too,
/// so a probe's connect timeout is `min(timeout, CONNECT_TIMEOUT)`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long reading a health file's metadata may take (a hung network
/// file system must not hang the check).
pub const HEALTH_FILE_TIMEOUT: Duration = Duration::from_secs(2);

/// What [`run_all`] allows beyond the largest probe timeout before it gives
/// up on the probes still running.
pub const RUN_ALL_MARGIN: Duration = Duration::from_millis(500);

/// The HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the http client: {0}")]
pub struct HttpClientError(#[source] reqwest::Error);

/// The HTTP client for probes with the default `redirects =
/// "same-origin"`: [`client_for`].
pub fn client() -> Result<reqwest::Client, HttpClientError> {
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
pub fn client_for(redirects: Redirects) -> Result<reqwest::Client, HttpClientError> {
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
        .map_err(HttpClientError)
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

/// Why a probe's credential could not be read. The message names the
/// variable or file and what to do, and never holds the secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// `bearer_env` names a variable that is not set.
    #[error("bearer_env: environment variable {name} is not set")]
    EnvUnset { name: String },
    /// `bearer_env` names a variable that is not UTF-8.
    #[error("bearer_env: environment variable {name} is not UTF-8")]
    EnvNotUtf8 { name: String },
    /// `bearer_file` could not be opened, examined or read (`action`).
    #[error("bearer_file {shown}: cannot {action}: {source}")]
    File {
        shown: String,
        action: &'static str,
        source: std::io::Error,
    },
    /// `bearer_file` is not a regular file.
    #[error("bearer_file {shown}: not a regular file")]
    NotAFile { shown: String },
    /// `bearer_file` is owned by someone other than root or us.
    #[error("bearer_file {shown}: owned by uid {owner}, not by root or uid {me}: chown it")]
    Owner { shown: String, owner: u32, me: u32 },
    /// `bearer_file` can be read or changed by other users.
    #[error(
        "bearer_file {shown}: mode {mode:04o} lets other users read or change it: chmod 600 it (or 640 for a group)"
    )]
    Mode { shown: String, mode: u32 },
    /// `bearer_file` is over 64 KiB.
    #[error("bearer_file {shown}: larger than 64 KiB")]
    TooLarge { shown: String },
    /// `bearer_file` is not UTF-8 text.
    #[error("bearer_file {shown}: not UTF-8 text")]
    NotUtf8 { shown: String },
    /// The credential (`what`: its variable or file) is empty.
    #[error("{what}: empty")]
    Empty { what: String },
    /// The credential holds control characters.
    #[error("{what}: holds control characters")]
    Control { what: String },
}

/// Why a probe's `auth` header could not be made.
#[derive(Debug, thiserror::Error)]
enum AuthError {
    /// Its credential could not be read.
    #[error("{source}")]
    Secret {
        #[from]
        source: SecretError,
    },
    /// The configured header name is not one HTTP allows.
    #[error("auth: bad header name {name:?}")]
    HeaderName { name: String },
    /// The credential cannot be sent in a header.
    #[error("auth: the secret is not a valid header value")]
    HeaderValue,
}

/// The credential of a probe's `auth`, read now: the first line of its
/// file, or its environment variable. The error says what is wrong and
/// what to do, and never holds the secret.
///
/// A file must be a regular file owned by root or by us, writable by
/// nobody else and readable by no other user (group-readable is allowed,
/// for a `root:selfheal 0640` file).
pub fn read_secret(source: &SecretSource) -> Result<String, SecretError> {
    use std::{io::Read as _, os::unix::fs::MetadataExt as _};
    let text = match source {
        SecretSource::Env(name) => match std::env::var(name) {
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => {
                return Err(SecretError::EnvUnset { name: name.clone() });
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(SecretError::EnvNotUtf8 { name: name.clone() });
            }
        },
        SecretSource::File(path) => {
            let shown = text::escape(&path.display().to_string());
            let io = |action: &'static str| {
                let shown = shown.clone();
                move |source| SecretError::File {
                    shown,
                    action,
                    source,
                }
            };
            let file = std::fs::File::open(path).map_err(io("open"))?;
            let meta = file.metadata().map_err(io("stat"))?;
            let me = crate::sys::creds::euid();
            if !meta.is_file() {
                return Err(SecretError::NotAFile { shown });
            }
            if meta.uid() != 0 && meta.uid() != me {
                return Err(SecretError::Owner {
                    shown,
                    owner: meta.uid(),
                    me,
                });
            }
            if meta.mode() & 0o026 != 0 {
                return Err(SecretError::Mode {
                    shown,
                    mode: meta.mode() & 0o7777,
                });
            }
            let mut bytes = Vec::new();
            file.take(MAX_SECRET_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(io("read"))?;
            if bytes.len() as u64 > MAX_SECRET_BYTES {
                return Err(SecretError::TooLarge { shown });
            }
            String::from_utf8(bytes).map_err(|_| SecretError::NotUtf8 { shown })?
        }
    };
    let what = || match source {
        SecretSource::Env(name) => format!("bearer_env {name}"),
        SecretSource::File(path) => {
            format!("bearer_file {}", text::escape(&path.display().to_string()))
        }
    };
    let secret = text.lines().next().unwrap_or("").trim();
    if secret.is_empty() {
        return Err(SecretError::Empty { what: what() });
    }
    if secret.chars().any(char::is_control) {
        return Err(SecretError::Control { what: what() });
    }
    Ok(secret.to_string())
}

/// The header a probe's `auth` sends, read now.
fn auth_header(
    auth: &ProbeAuth,
) -> Result<(reqwest::header::HeaderName, reqwest::header::HeaderValue), AuthError> {
    let secret = read_secret(&auth.source)?;
    let (name, value) = match &auth.header {
        None => (reqwest::header::AUTHORIZATION, format!("Bearer {secret}")),
        Some(h) => (
            reqwest::header::HeaderName::from_bytes(h.as_bytes())
                .map_err(|_| AuthError::HeaderName { name: h.clone() })?,
            secret,
        ),
    };
    let mut value =
        reqwest::header::HeaderValue::from_str(&value).map_err(|_| AuthError::HeaderValue)?;
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
    // Why the body was not read to its end, if it was not.
    let cut: Option<(ProbeError, String)> = loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => {
                break Some((
                    ProbeError::Timeout,
                    format!(
                        "body of {} not complete within {timeout_text} ({} bytes read)",
                        shown_url,
                        body.len()
                    ),
                ));
            }
            Ok(Err(e)) => {
                break Some((
                    classify(failure_of(&e)),
                    format!("reading the body: {}", error_chain(&e)),
                ));
            }
            Ok(Ok(None)) => break None,
            Ok(Ok(Some(chunk))) => {
                let room = MAX_BODY_BYTES - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    break Some((
                        ProbeError::TooLarge,
                        format!(
                            "body of {} is over the {} limit (stopped reading)",
                            shown_url,
                            size_text(MAX_BODY_BYTES)
                        ),
                    ));
                }
                body.extend_from_slice(&chunk);
            }
        }
    };
    if let Some((error, detail)) = cut {
        result.latency_ms = Some(elapsed_ms(start));
        result.body_excerpt = excerpt(&body);
        result.fail(error, detail);
        return result;
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

/// The origin of a URL as shown: `scheme://host:port`.
fn origin(url: &reqwest::Url) -> String {
    match (url.host_str(), url.port_or_known_default()) {
        (Some(h), Some(p)) => format!("{}://{h}:{p}", url.scheme()),
        (Some(h), None) => format!("{}://{h}", url.scheme()),
        _ => redact_url(url.as_str()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_that_cannot_be_used_is_named_never_shown() {
        use std::os::unix::fs::PermissionsExt as _;
        let unset = SecretSource::Env("SELFHEAL_TEST_NO_SUCH_VARIABLE_9".into());
        assert_eq!(
            read_secret(&unset).unwrap_err().to_string(),
            "bearer_env: environment variable SELFHEAL_TEST_NO_SUCH_VARIABLE_9 is not set"
        );
        let dir = std::env::temp_dir().join(format!("selfheal-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let loose = read_secret(&SecretSource::File(file.clone())).unwrap_err();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let read = read_secret(&SecretSource::File(file.clone()));
        std::fs::write(&file, "\n").unwrap();
        let empty = read_secret(&SecretSource::File(file.clone())).unwrap_err();
        let missing = read_secret(&SecretSource::File(dir.join("none"))).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        let shown = file.display();
        assert_eq!(
            loose.to_string(),
            format!(
                "bearer_file {shown}: mode 0644 lets other users read or change it: chmod 600 it (or 640 for a group)"
            )
        );
        assert_eq!(read.unwrap(), "s3cret");
        assert_eq!(empty.to_string(), format!("bearer_file {shown}: empty"));
        let missing = missing.to_string();
        assert!(
            missing.starts_with(&format!(
                "bearer_file {}: cannot open: ",
                dir.join("none").display()
            )),
            "{missing}"
        );
        assert!(!loose.to_string().contains("s3cret"));
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
    fn huge_timeouts_do_not_overflow() {
        let far = deadline_after(Duration::MAX);
        assert!(far > tokio::time::Instant::now() + Duration::from_secs(86_400));
        let soon = deadline_after(Duration::from_millis(10));
        assert!(soon <= tokio::time::Instant::now() + Duration::from_millis(10));
    }
}
