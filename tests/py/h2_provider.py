#!/usr/bin/env python3
"""The testbed's provider over HTTP/2 (cleartext, prior knowledge): OpenAI's
chat completions streamed, any number of calls on one connection.

    h2_provider.py --listen HOST:PORT

Each `POST /v1/chat/completions` stream is answered at once with `200`,
the SSE headers and the first event (the role chunk), then thinks for the
model name's `think-MS` (default 200), then sends `tokens-N` (default 10)
chunks `gap-MS` (default 50) apart and `[DONE]`, as the HTTP/1.1 provider
(`selfheal-testbed provider`) paces them. Prints `listening HOST:PORT`,
then `call stream=ID model=MODEL` as each call starts thinking.

The frames are `h2`'s (the library httpx speaks HTTP/2 with): only the
server's loop is written here.
"""

import argparse
import asyncio
import json
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def pacing(model):
    words = model.split("-")
    p = {"think": 200, "gap": 50, "tokens": 10}
    for key, value in zip(words, words[1:]):
        if key in p and value.isdigit():
            p[key] = int(value)
    p["tokens"] = min(p["tokens"], 100_000)
    return p["think"] / 1000, p["gap"] / 1000, p["tokens"]


def chunk(model, delta, finish=None):
    event = {
        "id": "tb-h2",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return f"data: {json.dumps(event)}\n\n".encode()


class Connection:
    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.h2 = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.tasks = set()

    async def flush(self):
        data = self.h2.data_to_send()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    async def run(self):
        self.h2.initiate_connection()
        await self.flush()
        bodies = {}
        while True:
            data = await self.reader.read(65536)
            if not data:
                break
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    bodies[event.stream_id] = b""
                elif isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    body = bodies.pop(event.stream_id, b"")
                    task = asyncio.create_task(self.answer(event.stream_id, body))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            await self.flush()

    async def answer(self, stream, body):
        try:
            model = json.loads(body or b"{}").get("model", "")
        except ValueError:
            model = ""
        think, gap, tokens = pacing(model)
        self.h2.send_headers(
            stream,
            [(":status", "200"), ("content-type", "text/event-stream"), ("cache-control", "no-cache")],
        )
        self.h2.send_data(stream, chunk(model, {"role": "assistant", "content": ""}))
        await self.flush()
        say(f"call stream={stream} model={model}")
        await asyncio.sleep(think)
        for _ in range(tokens):
            self.h2.send_data(stream, chunk(model, {"content": "tok "}))
            await self.flush()
            await asyncio.sleep(gap)
        self.h2.send_data(stream, chunk(model, {}, "stop"))
        self.h2.send_data(stream, b"data: [DONE]\n\n", end_stream=True)
        await self.flush()


async def serve(host, port):
    async def on_connection(reader, writer):
        try:
            await Connection(reader, writer).run()
        except (ConnectionError, h2.exceptions.ProtocolError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, host, port)
    say(f"listening {host}:{port}")
    async with server:
        await server.serve_forever()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, help="HOST:PORT")
    args = p.parse_args()
    host, port = args.listen.rsplit(":", 1)
    asyncio.run(serve(host, int(port)))


if __name__ == "__main__":
    main()
