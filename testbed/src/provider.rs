//! The testbed's LLM provider.
//!
//! - `GET /v1/stream` answers at once with the head of a server-sent-events
//!   response, then thinks for `first_ms`, then sends `tokens` events
//!   `gap_ms` apart and `[DONE]`. With `hang=1` it sends the head and then
//!   nothing, keeping the connection open: a provider gone silent.
//! - `POST /v1/chat/completions` speaks OpenAI's chat completions (SSE
//!   `chat.completion.chunk`s and `[DONE]` with `"stream": true`, one
//!   `chat.completion` otherwise) and `POST /v1/messages` Anthropic's
//!   Messages API (its streaming events with `"stream": true`, one
//!   `message` otherwise), so that the official SDKs, unmodified, can call
//!   it. The pacing is the request's `model` ([`Pacing::parse`]), e.g.
//!   `think-6000-gap-100-tokens-20-head-late`.
//!
//! A model with `fleet-MS` leaves the call's fate to the provider
//! ([`Fate`]): picked from the model name and the provider's `--seed`, the
//! same for the same pair, with `MS` as the bound a stalled stream is given.
//!
//! The request body is read in full before the provider starts thinking.

use std::{net::SocketAddr, time::Duration};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use super::{http, say};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to serve on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The seed of fleet calls' fates (default: from the clock); said in
    /// the `listening` line.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// The seed of fleet calls' fates, set once as the provider starts.
static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// How a call through the compatible APIs is paced, from its `model`:
/// dash-separated pairs `think-MS` (silence before the first byte of the
/// body, default 200), `gap-MS` (between tokens, default 50), `tokens-N`
/// (default 10, at most 100 000), `head-late` (the response head only
/// with the first token; default `head-early`: the head at once, as
/// providers that acknowledge a request before thinking do), and
/// `first-early` (with an early head, the first event too, OpenAI's role
/// chunk or Anthropic's `message_start`, before thinking: what real
/// providers do), and `lag-MS` (an early head only after MS, default 0: a
/// real provider's head comes some ticks after the request, not in the
/// same one), and `pool` (the connection kept open for the client's next
/// call, as real providers keep theirs, a streamed answer then in chunked
/// encoding; default: `Connection: close`). Unknown words are ignored,
/// so any model name works.
///
/// A stalled stream: `ping-MS` sends the head and the first event at once
/// (as `first-early`), then instead of thinking only keepalive pings, one
/// every MS ms (at least 10), in the style of the API served: an SSE
/// comment line `: ping` for OpenAI's stream, Anthropic's `event: ping`
/// with `data: {"type": "ping"}` for the Messages stream; with `stamp`,
/// each ping carries the time since the stream began and a relay's trace
/// of 0, 6, 12 or 18 hex digits in turn, so the pings vary in size by up
/// to about 20 bytes (a relay that stamps them); with `hush-MS`, the pings
/// begin only after MS of silence (a first keepalive that comes late: a
/// call that thought in silence, then pinged). It pings for an
/// hour and then closes without an answer (a stall), or with `for-MS`
/// for MS and then answers as any call does (`gap`, `tokens`). Content
/// that comes slowly is `first-early-think-0-gap-MS`: a word every MS.
///
/// `fleet-MS` replaces all of these with a [`Fate`]'s pacing, picked per
/// call from the whole model name and the provider's seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    pub think: Duration,
    pub gap: Duration,
    pub tokens: u64,
    pub head_late: bool,
    pub first_early: bool,
    pub lag: Duration,
    pub pool: bool,
    /// Keepalive pings this far apart instead of thinking.
    pub ping: Option<Duration>,
    /// How long the pings go on before the answer (None: a stall).
    pub ping_for: Option<Duration>,
    /// Pings carry a time stamp: their sizes vary.
    pub stamp: bool,
    /// Silence after the first event before the first ping.
    pub hush: Duration,
    /// `fleet-MS`: the provider picks the fate ([`Fate`]); MS is the bound
    /// a stalled stream is given.
    pub fleet: Option<Duration>,
    /// After the first event, say `cut` and go silent for [`CUT_HOLD`]
    /// (the soak drops the connection's packets meanwhile).
    pub cut: bool,
}

/// How long a cut call's provider holds its silent connection.
pub const CUT_HOLD: Duration = Duration::from_secs(120);

/// What a fleet call's provider does, picked at random per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Answers at once.
    Quick,
    /// The head and first event, then silent thinking past the bound,
    /// then the answer.
    Think,
    /// The head and first event, pings every second for three fifths of
    /// the bound, then the answer.
    PingAnswer,
    /// The head and first event, then a word every three fifths of the
    /// bound, four words: content for longer than the bound.
    Slow,
    /// The head and first event, then `cut` said and silence: the soak
    /// makes the peer vanish without a FIN or RST.
    Cut,
    /// The head and first event, then only pings, for an hour.
    Stall,
}

impl Fate {
    pub const ALL: [Fate; 6] = [
        Fate::Quick,
        Fate::Think,
        Fate::PingAnswer,
        Fate::Slow,
        Fate::Cut,
        Fate::Stall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fate::Quick => "quick",
            Fate::Think => "think",
            Fate::PingAnswer => "ping_answer",
            Fate::Slow => "slow",
            Fate::Cut => "cut",
            Fate::Stall => "stall",
        }
    }

    pub fn parse(name: &str) -> Option<Fate> {
        Fate::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The fate of the call with `model` under `seed`: one of [`Fate::ALL`]
    /// alike, the same for the same pair (FNV-1a of the name, mixed with
    /// the seed by splitmix64).
    pub fn pick(seed: u64, model: &str) -> Fate {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in model.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let mut z = (h ^ seed).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Fate::ALL[(z % Fate::ALL.len() as u64) as usize]
    }

    /// The pacing of this fate for a stream given `bound` (every answer on
    /// a kept connection, in chunks, as real providers send it).
    pub fn pacing(self, bound: Duration) -> Pacing {
        // Any bound a caller names: the arithmetic saturates.
        let ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
        let three_fifths = ms / 5 * 3;
        let model = match self {
            Fate::Quick => "think-100-gap-20-tokens-5".to_string(),
            Fate::Think => format!(
                "first-early-think-{}-gap-20-tokens-5",
                ms.saturating_add(3000)
            ),
            Fate::PingAnswer => format!("ping-1000-for-{three_fifths}-gap-20-tokens-5"),
            Fate::Slow => format!("first-early-think-0-gap-{three_fifths}-tokens-4"),
            Fate::Cut => "first-early-think-0-tokens-5".to_string(),
            Fate::Stall => "ping-1000".to_string(),
        };
        let mut p = Pacing::parse(&format!("{model}-pool"));
        p.cut = self == Fate::Cut;
        p
    }
}

/// How long a stalled stream pings before it closes.
pub const STALL_LIMIT: Duration = Duration::from_secs(3600);

impl Pacing {
    pub fn parse(model: &str) -> Pacing {
        let mut p = Pacing {
            think: Duration::from_millis(200),
            gap: Duration::from_millis(50),
            tokens: 10,
            head_late: false,
            first_early: false,
            lag: Duration::ZERO,
            pool: false,
            ping: None,
            ping_for: None,
            stamp: false,
            hush: Duration::ZERO,
            fleet: None,
            cut: false,
        };
        let words: Vec<&str> = model.split('-').collect();
        p.pool = words.contains(&"pool");
        p.stamp = words.contains(&"stamp");
        for pair in words.windows(2) {
            let n = pair[1].parse::<u64>().ok();
            match (pair[0], n) {
                ("think", Some(ms)) => p.think = Duration::from_millis(ms),
                ("gap", Some(ms)) => p.gap = Duration::from_millis(ms),
                ("tokens", Some(k)) => p.tokens = k.min(100_000),
                ("head", _) => p.head_late = pair[1] == "late",
                ("first", _) => p.first_early = pair[1] == "early",
                ("lag", Some(ms)) => p.lag = Duration::from_millis(ms),
                ("ping", Some(ms)) => p.ping = Some(Duration::from_millis(ms.max(10))),
                ("for", Some(ms)) => p.ping_for = Some(Duration::from_millis(ms)),
                ("hush", Some(ms)) => p.hush = Duration::from_millis(ms),
                ("fleet", Some(ms)) => p.fleet = Some(Duration::from_millis(ms)),
                _ => {}
            }
        }
        if p.ping.is_some() {
            p.head_late = false;
            p.first_early = true;
        }
        p
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    super::runtime()?.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        let seed = *SEED.get_or_init(|| {
            args.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            })
        });
        say(format!("listening provider={} seed={seed}", args.listen));
        http::serve_reusing(listener, |req, mut s| async move {
            let peer = s
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into());
            let keep = match (req.method.as_str(), req.path.as_str()) {
                (_, "/v1/stream") => stream(&req, &mut s).await.map(|()| false),
                ("POST", "/v1/chat/completions") => {
                    compatible(Api::OpenAi, &req, &mut s, &peer).await
                }
                ("POST", "/v1/messages") => compatible(Api::Anthropic, &req, &mut s, &peer).await,
                _ => http::respond_json(&mut s, 404, &json!({"error": "no such path"}))
                    .await
                    .map(|()| false),
            }?;
            Ok(keep.then_some(s))
        })
        .await;
        Ok(())
    })
}

const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
/// The head of a streamed answer on a connection kept for the next call.
const SSE_HEAD_POOLED: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";

/// A streamed answer's body: written as it is, or as HTTP/1.1 chunks on a
/// kept connection.
struct Body<'s> {
    s: &'s mut tokio::net::TcpStream,
    chunked: bool,
}

impl Body<'_> {
    async fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if !self.chunked || bytes.is_empty() {
            return self.s.write_all(bytes).await;
        }
        let mut out = format!("{:x}\r\n", bytes.len()).into_bytes();
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
        self.s.write_all(&out).await
    }

    /// Ends the answer: the last chunk (the connection is kept), or the
    /// write side closed.
    async fn end(self) -> std::io::Result<bool> {
        self.end_with(b"").await
    }

    /// [`Body::end`] with `last` written in the same write as the end.
    async fn end_with(self, last: &[u8]) -> std::io::Result<bool> {
        if self.chunked {
            let mut out = Vec::new();
            if !last.is_empty() {
                out.extend(format!("{:x}\r\n", last.len()).into_bytes());
                out.extend_from_slice(last);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
            self.s.write_all(&out).await?;
            Ok(true)
        } else {
            self.s.write_all(last).await?;
            self.s.shutdown().await.map(|()| false)
        }
    }
}

async fn stream(req: &http::Request, s: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    let first = Duration::from_millis(req.param_u64("first_ms", 200));
    let gap = Duration::from_millis(req.param_u64("gap_ms", 50));
    let tokens = req.param_u64("tokens", 10).min(100_000);
    let hang = req.param_u64("hang", 0) == 1;
    s.write_all(SSE_HEAD).await?;
    if hang {
        // Silent with the connection open, for an hour at most.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        return Ok(());
    }
    tokio::time::sleep(first).await;
    for i in 0..tokens {
        s.write_all(format!("data: {{\"token\":{i}}}\n\n").as_bytes())
            .await?;
        tokio::time::sleep(gap).await;
    }
    s.write_all(b"data: [DONE]\n\n").await?;
    s.shutdown().await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    OpenAi,
    Anthropic,
}

/// One call through a compatible API. Says `call api=… peer=… model=…` as
/// it starts thinking (the scenarios find a caller's connection by it).
/// `Ok(true)`: the connection is kept for the next call.
async fn compatible(
    api: Api,
    req: &http::Request,
    s: &mut tokio::net::TcpStream,
    peer: &str,
) -> std::io::Result<bool> {
    let Ok(body) = serde_json::from_slice::<Value>(&req.body) else {
        return http::respond_json(s, 400, &error(api, "the body is not JSON"))
            .await
            .map(|()| false);
    };
    let model = body["model"].as_str().unwrap_or("").to_string();
    let streaming = body["stream"].as_bool().unwrap_or(false);
    let mut pace = Pacing::parse(&model);
    let fate = pace
        .fleet
        .map(|bound| (Fate::pick(SEED.get().copied().unwrap_or(0), &model), bound));
    if let Some((fate, bound)) = fate {
        pace = fate.pacing(bound);
    }
    say(format!(
        "call api={} peer={peer} model={model} stream={streaming}{}",
        match api {
            Api::OpenAi => "openai",
            Api::Anthropic => "anthropic",
        },
        fate.map(|(f, _)| format!(" fate={}", f.name()))
            .unwrap_or_default()
    ));
    let id = format!("tb-{}", std::process::id());
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if !streaming {
        let text = "tok ".repeat(pace.tokens as usize);
        let out = match api {
            Api::OpenAi => json!({
                "id": id, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": pace.tokens,
                          "total_tokens": pace.tokens + 1},
            }),
            Api::Anthropic => json!({
                "id": id, "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 1, "output_tokens": pace.tokens},
            }),
        };
        let out = out.to_string();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n",
            out.len(),
            if pace.pool {
                ""
            } else {
                "Connection: close\r\n"
            }
        );
        if !pace.head_late {
            s.write_all(head.as_bytes()).await?;
        }
        tokio::time::sleep(pace.think + pace.gap * pace.tokens as u32).await;
        if pace.head_late {
            s.write_all(head.as_bytes()).await?;
        }
        s.write_all(out.as_bytes()).await?;
        if pace.pool {
            return Ok(true);
        }
        return s.shutdown().await.map(|()| false);
    }
    // The first event before thinking (with an early head), else after.
    let first_early = pace.first_early && !pace.head_late;
    let head = if pace.pool { SSE_HEAD_POOLED } else { SSE_HEAD };
    if !pace.head_late {
        tokio::time::sleep(pace.lag).await;
        s.write_all(head).await?;
    }
    if !first_early {
        tokio::time::sleep(pace.think).await;
    }
    if pace.head_late && pace.pool {
        s.write_all(head).await?;
    }
    let mut s = Body {
        s,
        chunked: pace.pool,
    };
    // A late head goes out with the first event, in one write.
    let mut first = Vec::new();
    if pace.head_late && !pace.pool {
        first.extend_from_slice(head);
    }
    let chunk = |delta: Value, finish: Value| {
        sse(
            None,
            &json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            }),
        )
    };
    match api {
        Api::OpenAi => {
            first.extend(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            ));
            s.put(&first).await?;
            if first_early && !hold(api, &pace, &mut s, peer, &model).await? {
                return s.end().await;
            }
            for _ in 0..pace.tokens {
                s.put(&chunk(json!({"content": "tok "}), Value::Null))
                    .await?;
                tokio::time::sleep(pace.gap).await;
            }
            s.put(&chunk(json!({}), json!("stop"))).await?;
            // `[DONE]` and the body's end in one write, as providers send
            // them: a client that stops reading at `[DONE]` finds the end
            // already there and keeps the connection.
            return s.end_with(b"data: [DONE]\n\n").await;
        }
        Api::Anthropic => {
            first.extend(sse(
                Some("message_start"),
                &json!({"type": "message_start", "message": {
                    "id": id, "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 1, "output_tokens": 1}}}),
            ));
            first.extend(sse(
                Some("content_block_start"),
                &json!({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}),
            ));
            s.put(&first).await?;
            if first_early && !hold(api, &pace, &mut s, peer, &model).await? {
                return s.end().await;
            }
            for _ in 0..pace.tokens {
                let delta = json!({"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": "tok "}});
                s.put(&sse(Some("content_block_delta"), &delta)).await?;
                tokio::time::sleep(pace.gap).await;
            }
            let mut last = sse(
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": 0}),
            );
            last.extend(sse(
                Some("message_delta"),
                &json!({"type": "message_delta",
                        "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                        "usage": {"output_tokens": pace.tokens}}),
            ));
            last.extend(sse(Some("message_stop"), &json!({"type": "message_stop"})));
            s.put(&last).await?;
        }
    }
    s.end().await
}

/// After the first event: says `cut peer=… model=…` and holds the
/// connection silent for [`CUT_HOLD`] (`false`: no answer), thinks
/// (`think`), or pings every `ping` for
/// `ping_for` (then `true`: the answer follows) or [`STALL_LIMIT`]
/// (`false`: a stall, no answer).
async fn hold(
    api: Api,
    pace: &Pacing,
    s: &mut Body<'_>,
    peer: &str,
    model: &str,
) -> std::io::Result<bool> {
    if pace.cut {
        say(format!("cut peer={peer} model={model}"));
        tokio::time::sleep(CUT_HOLD).await;
        return Ok(false);
    }
    let Some(every) = pace.ping else {
        tokio::time::sleep(pace.think).await;
        return Ok(true);
    };
    tokio::time::sleep(pace.hush).await;
    let start = tokio::time::Instant::now();
    let until = start + pace.ping_for.unwrap_or(STALL_LIMIT);
    for n in 0usize.. {
        let next = tokio::time::Instant::now() + every;
        if next > until {
            tokio::time::sleep_until(until).await;
            break;
        }
        tokio::time::sleep_until(next).await;
        let stamp = pace.stamp.then(|| (start.elapsed().as_millis(), n));
        s.put(&ping(api, stamp)).await?;
    }
    Ok(pace.ping_for.is_some())
}

/// One keepalive ping in `api`'s style; stamped, ping `n` at `ms` carries
/// the time and a trace of `n % 4 * 6` hex digits.
fn ping(api: Api, stamp: Option<(u128, usize)>) -> Vec<u8> {
    let Some((ms, n)) = stamp else {
        return match api {
            Api::OpenAi => b": ping\n\n".to_vec(),
            Api::Anthropic => sse(Some("ping"), &json!({"type": "ping"})),
        };
    };
    let trace = "5e1f".repeat(5)[..n % 4 * 6].to_string();
    match api {
        Api::OpenAi => format!(": ping t={ms} trace={trace}\n\n").into_bytes(),
        Api::Anthropic => sse(
            Some("ping"),
            &json!({"type": "ping", "t": ms, "trace": trace}),
        ),
    }
}

/// One server-sent event.
fn sse(event: Option<&str>, data: &Value) -> Vec<u8> {
    let mut out = String::new();
    if let Some(e) = event {
        out.push_str(&format!("event: {e}\n"));
    }
    out.push_str(&format!("data: {data}\n\n"));
    out.into_bytes()
}

fn error(api: Api, message: &str) -> Value {
    match api {
        Api::OpenAi => json!({"error": {"message": message, "type": "invalid_request_error"}}),
        Api::Anthropic => json!({"type": "error",
                                 "error": {"type": "invalid_request_error", "message": message}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_comes_from_the_model_name() {
        let p = Pacing::parse("think-6000-gap-100-tokens-20-head-late");
        assert_eq!(p.think, Duration::from_millis(6000));
        assert_eq!(p.gap, Duration::from_millis(100));
        assert_eq!(p.tokens, 20);
        assert!(p.head_late);
        let d = Pacing::parse("gpt-4o");
        assert_eq!(d.think, Duration::from_millis(200));
        assert!(!d.head_late);
        assert!(!d.first_early);
        assert!(Pacing::parse("think-9-first-early").first_early);
        assert_eq!(Pacing::parse("lag-300").lag, Duration::from_millis(300));
        assert_eq!(Pacing::parse("tokens-999999999").tokens, 100_000);
        assert_eq!(d.ping, None);
    }

    #[test]
    fn pings_come_from_the_model_name() {
        // A stall: the head and first event at once, then pings forever.
        let p = Pacing::parse("ping-5000");
        assert_eq!(p.ping, Some(Duration::from_millis(5000)));
        assert_eq!(p.ping_for, None);
        assert!(p.first_early && !p.head_late && !p.stamp);
        // Pings then the answer; a late head is overruled by the pings.
        let p = Pacing::parse("ping-2000-for-20000-tokens-3-head-late");
        assert_eq!(p.ping, Some(Duration::from_millis(2000)));
        assert_eq!(p.ping_for, Some(Duration::from_millis(20_000)));
        assert_eq!(p.tokens, 3);
        assert!(p.first_early && !p.head_late);
        assert!(Pacing::parse("ping-1000-stamp").stamp);
        // Silence before the first ping.
        let p = Pacing::parse("ping-1000-hush-7000");
        assert_eq!((p.hush, p.ping_for), (Duration::from_millis(7000), None));
        assert_eq!(Pacing::parse("ping-1000").hush, Duration::ZERO);
        // A ping every 0 ms would spin: at least 10.
        assert_eq!(
            Pacing::parse("ping-0").ping,
            Some(Duration::from_millis(10))
        );
        // Not numbers: ignored, as any unknown word.
        assert_eq!(Pacing::parse("ping-soon").ping, None);
        assert_eq!(Pacing::parse("ping-1000-for-ever").ping_for, None);
        // Slow content: a word every 3 s from the first event on.
        let p = Pacing::parse("first-early-think-0-gap-3000-tokens-9");
        assert_eq!(
            (p.think, p.gap, p.tokens),
            (Duration::ZERO, Duration::from_millis(3000), 9)
        );
        assert!(p.first_early && p.ping.is_none());
    }

    #[test]
    fn a_fleet_calls_fate_comes_from_its_name_and_the_seed() {
        let p = Pacing::parse("fleet-5000-agent-a0-call-7");
        assert_eq!(p.fleet, Some(Duration::from_millis(5000)));
        // The same pair, the same fate; every fate drawn, none far from
        // a sixth of 6,000 names.
        let mut seen = std::collections::BTreeMap::new();
        for n in 0..6000 {
            let model = format!("fleet-5000-agent-a0-call-{n}");
            let f = Fate::pick(42, &model);
            assert_eq!(f, Fate::pick(42, &model));
            *seen.entry(f.name()).or_insert(0) += 1;
        }
        assert_eq!(seen.len(), 6, "{seen:?}");
        assert!(seen.values().all(|&k| (800..1200).contains(&k)), "{seen:?}");
        // Another seed, other fates.
        let differ = (0..100)
            .filter(|n| {
                let m = format!("fleet-5000-call-{n}");
                Fate::pick(1, &m) != Fate::pick(2, &m)
            })
            .count();
        assert!(differ > 50, "{differ}");
        for f in Fate::ALL {
            assert_eq!(Fate::parse(f.name()), Some(f));
        }
        let b = Duration::from_millis(5000);
        // Thinking past the bound in silence; pings within it; content
        // past it, a word within it each; a stall pings forever; a cut
        // goes silent.
        let t = Fate::Think.pacing(b);
        assert!(t.first_early && t.think > b && t.ping.is_none() && t.pool);
        let p = Fate::PingAnswer.pacing(b);
        assert!(p.ping_for.is_some_and(|f| f < b) && p.tokens > 0);
        let s = Fate::Slow.pacing(b);
        assert!(s.gap < b && s.gap * s.tokens as u32 > b && s.first_early);
        let st = Fate::Stall.pacing(b);
        assert!(st.ping.is_some() && st.ping_for.is_none());
        assert!(Fate::Cut.pacing(b).cut && !Fate::Quick.pacing(b).cut);
        assert!(Fate::Quick.pacing(b).fleet.is_none());
        // A bound no u64 of ms holds, from a caller's model: no overflow.
        let p = Pacing::parse("fleet-18446744073709551615");
        assert_eq!(p.fleet, Some(Duration::from_millis(u64::MAX)));
        for f in Fate::ALL {
            f.pacing(Duration::MAX);
        }
        assert_eq!(
            Fate::Think.pacing(Duration::MAX).think,
            Duration::from_millis(u64::MAX)
        );
    }

    #[test]
    fn pings_are_small_and_alike_in_the_api_style() {
        assert_eq!(ping(Api::OpenAi, None), b": ping\n\n");
        assert_eq!(
            ping(Api::Anthropic, None),
            b"event: ping\ndata: {\"type\":\"ping\"}\n\n"
        );
        // Stamped: up to 18 bytes of trace more, and the time's digits,
        // never content-sized.
        let (a, b) = (
            ping(Api::OpenAi, Some((5, 0))),
            ping(Api::OpenAi, Some((5, 3))),
        );
        assert_eq!(b.len() - a.len(), 18);
        assert_eq!(ping(Api::OpenAi, Some((5, 4))), a);
        let c = ping(Api::Anthropic, Some((123_456, 7)));
        assert!(c.len() < 80, "{}", String::from_utf8_lossy(&c));
        assert!(String::from_utf8_lossy(&c).starts_with("event: ping\n"));
    }
}
