#!/usr/bin/env python3
"""An agent that calls an LLM through the REAL official SDK, in a loop.

    sdk_runner.py --name NAME --sdk SDK --base-url URL \
        --model MODEL [--model MODEL ...] [--then-model MODEL] \
        [--threads N] [--calls N] [--status HOST:PORT]

`--name` comes first so that a config can match the process by
`cmdline = "sdk_runner.py --name NAME "`. SDK is `openai` or `anthropic`
(the sync clients, a thread per caller, each waiting in `poll`),
`openai-async` or `anthropic-async` (`AsyncOpenAI`, `AsyncAnthropic`) or
`litellm` (`litellm.acompletion` on its `openai/` route): one asyncio
event loop, a task per caller, all waiting in `epoll_wait`; with `--http2`
(`openai-async`), every caller's calls share one HTTP/2 connection. Each of
`--threads` callers (caller i calls with the i-th `--model`, cycling)
makes streaming calls (whole ones with `--whole`, openai only) one after
another: its first with its model, later ones with `--then-model`
(default: the same model). Every call prints one line on stdout, flushed:

    call N start
    call N done tokens=K
    call N failed: ExceptionType: message

then the caller sleeps 200 ms (`--pause-ms`) and goes on: a failed call never ends the
process. The clients are the SDKs' defaults (their own timeouts, connection
pools and socket options) except `max_retries=0`, so that a failure is seen
as it happens. With `--status`, `GET /status` answers the agent's own story:
`{"status": "ok", "current_task": "call N" | null, "calls": ..}`.

The testbed's provider (`selfheal-testbed provider`) paces each call by its
model name, e.g. `think-600000-gap-100-tokens-20`. A `{n}` in a model is
replaced by the call's number N, so that the provider's log names each call
(the fleet soak's `fleet-5000-agent-NAME-call-{n}`).
"""

import argparse
import asyncio
import http.server
import itertools
import json
import os
import sys
import threading
import time

# The testbed's addresses exist only in its namespaces: never a proxy.
for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
    os.environ.pop(var, None)
os.environ["NO_PROXY"] = "*"
# litellm reads its model price list from its own package, not the network.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

PRINT = threading.Lock()
NEXT = itertools.count(1)
IN_FLIGHT = {}  # call number -> thread index
STATE = threading.Lock()
COUNTS = {"done": 0, "failed": 0}


def say(line):
    with PRINT:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def one_line(text):
    return " ".join(str(text).split())


def call_openai(client, model):
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say something."}],
        stream=True,
    )
    tokens = 0
    with stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                tokens += 1
    return tokens


def call_openai_whole(client, model):
    """A call without streaming: the answer in one body, its connection
    then back in the SDK's pool."""
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say something."}],
    )
    return len((reply.choices[0].message.content or "").split())


def call_anthropic(client, model):
    stream = client.messages.create(
        model=model,
        max_tokens=1024,
        messages=[{"role": "user", "content": "Say something."}],
        stream=True,
    )
    tokens = 0
    with stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                tokens += 1
    return tokens


async def acall_openai(client, model):
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say something."}],
        stream=True,
    )
    tokens = 0
    async with stream:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                tokens += 1
    return tokens


async def acall_anthropic(client, model):
    stream = await client.messages.create(
        model=model,
        max_tokens=1024,
        messages=[{"role": "user", "content": "Say something."}],
        stream=True,
    )
    tokens = 0
    async with stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                tokens += 1
    return tokens


async def acall_litellm(base_url, model):
    import litellm

    stream = await litellm.acompletion(
        model="openai/" + model,
        api_base=base_url,
        api_key="x",
        messages=[{"role": "user", "content": "Say something."}],
        stream=True,
        max_retries=0,
    )
    tokens = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            tokens += 1
    return tokens


def begin(index):
    n = next(NEXT)
    with STATE:
        IN_FLIGHT[n] = index
    say(f"call {n} start")
    return n


def end(n, tokens=None, error=None):
    """Says how call `n` ended (its tokens, or the error it failed with)
    and counts it."""
    if error is None:
        say(f"call {n} done tokens={tokens}")
        outcome = "done"
    else:
        say(f"call {n} failed: {type(error).__name__}: {one_line(error)}")
        outcome = "failed"
    with STATE:
        IN_FLIGHT.pop(n, None)
        COUNTS[outcome] += 1


def turns(index, args):
    """The calls worker `index` makes, each begun: its number and model."""
    model = args.model[index % len(args.model)]
    made = 0
    while args.calls == 0 or made < args.calls:
        n = begin(index)
        yield n, model.replace("{n}", str(n))
        made += 1
        model = args.then_model or model


def worker(index, args, client, call):
    for n, model in turns(index, args):
        try:
            tokens = call(client, model)
        except Exception as e:  # every failure is reported, none is fatal
            end(n, error=e)
        else:
            end(n, tokens=tokens)
        time.sleep(args.pause_ms / 1000)


async def aworker(index, args, client, call):
    for n, model in turns(index, args):
        try:
            tokens = await call(client, model)
        except Exception as e:  # every failure is reported, none is fatal
            end(n, error=e)
        else:
            end(n, tokens=tokens)
        await asyncio.sleep(args.pause_ms / 1000)


async def aworkers(args, client, call):
    await asyncio.gather(*(aworker(i, args, client, call) for i in range(args.threads)))


class Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/status":
            self.send_error(404)
            return
        with STATE:
            calls = sorted(IN_FLIGHT)
            body = {
                "status": "ok",
                "current_task": f"call {calls[0]}" if calls else None,
                "in_flight": len(calls),
                **COUNTS,
            }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True)
    p.add_argument(
        "--sdk",
        choices=["openai", "anthropic", "openai-async", "anthropic-async", "litellm"],
        default="openai",
    )
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", action="append", required=True)
    p.add_argument("--then-model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=0, help="calls per thread (0: forever)")
    p.add_argument("--status", help="HOST:PORT of GET /status")
    p.add_argument("--pause-ms", type=int, default=200, help="between a caller's calls")
    p.add_argument("--whole", action="store_true", help="openai: calls without streaming")
    p.add_argument(
        "--http2",
        action="store_true",
        help="openai-async: HTTP/2 with prior knowledge (every caller's calls on one connection)",
    )
    args = p.parse_args()

    if args.sdk == "openai":
        import openai

        client = openai.OpenAI(base_url=args.base_url, api_key="x", max_retries=0)
        call = call_openai_whole if args.whole else call_openai
        version = openai.__version__
    elif args.sdk == "anthropic":
        import anthropic

        client = anthropic.Anthropic(base_url=args.base_url, api_key="x", max_retries=0)
        call = call_anthropic
        version = anthropic.__version__
    elif args.sdk == "openai-async":
        import openai

        # The SDK's own httpx defaults (timeouts, limits), speaking HTTP/2.
        http_client = (
            openai.DefaultAsyncHttpxClient(http1=False, http2=True) if args.http2 else None
        )
        client = openai.AsyncOpenAI(
            base_url=args.base_url, api_key="x", max_retries=0, http_client=http_client
        )
        call = acall_openai
        version = openai.__version__
    elif args.sdk == "anthropic-async":
        import anthropic

        client = anthropic.AsyncAnthropic(base_url=args.base_url, api_key="x", max_retries=0)
        call = acall_anthropic
        version = anthropic.__version__
    else:
        import importlib.metadata

        client = args.base_url
        call = acall_litellm
        version = importlib.metadata.version("litellm")

    if args.status:
        host, port = args.status.rsplit(":", 1)
        server = http.server.ThreadingHTTPServer((host, int(port)), Status)
        threading.Thread(target=server.serve_forever, daemon=True).start()

    say(f"ready sdk={args.sdk} version={version} pid={os.getpid()} threads={args.threads}")
    if asyncio.iscoroutinefunction(call):
        asyncio.run(aworkers(args, client, call))
        return
    threads = [
        threading.Thread(target=worker, args=(i, args, client, call), daemon=True)
        for i in range(args.threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
