#!/usr/bin/env node
// An agent that calls an LLM through the REAL official Node SDK, in a loop:
// the Node twin of tests/py/sdk_runner.py, with the same arguments and the
// same lines on stdout.
//
//     node sdk_runner.mjs --name NAME --sdk openai|anthropic --base-url URL \
//         --model MODEL [--model MODEL ...] [--then-model MODEL] \
//         [--threads N] [--calls N] [--status HOST:PORT] [--pause-ms MS]
//
// `--name` comes first so that a config can match the process by
// `cmdline = "sdk_runner.mjs --name NAME "`. One event loop (undici under
// the SDK's fetch, waiting in epoll_wait), a caller per `--threads`; caller
// i streams with the i-th `--model` (cycling), later calls with
// `--then-model`; a `{n}` in a model is replaced by the call's number N.
// Every call prints one line, as it happens:
//
//     call N start
//     call N done tokens=K
//     call N failed: ErrorName: message
//
// The clients are the SDKs' defaults except `maxRetries: 0`.

import http from "node:http";
import process from "node:process";

const args = { model: [], threads: 1, calls: 0, pauseMs: 200 };
for (let i = 2; i < process.argv.length; i++) {
  const key = process.argv[i];
  const value = process.argv[++i];
  switch (key) {
    case "--name": args.name = value; break;
    case "--sdk": args.sdk = value; break;
    case "--base-url": args.baseUrl = value; break;
    case "--model": args.model.push(value); break;
    case "--then-model": args.thenModel = value; break;
    case "--threads": args.threads = Number(value); break;
    case "--calls": args.calls = Number(value); break;
    case "--status": args.status = value; break;
    case "--pause-ms": args.pauseMs = Number(value); break;
    default:
      console.error(`unknown argument ${key}`);
      process.exit(2);
  }
}
if (!args.name || !args.baseUrl || args.model.length === 0 || !["openai", "anthropic"].includes(args.sdk)) {
  console.error("usage: sdk_runner.mjs --name NAME --sdk openai|anthropic --base-url URL --model MODEL ...");
  process.exit(2);
}

const say = (line) => process.stdout.write(line + "\n");
const oneLine = (text) => String(text).split(/\s+/).filter(Boolean).join(" ");
const inFlight = new Map(); // call number -> caller index
const counts = { done: 0, failed: 0 };
let next = 1;

let client, call, version;
if (args.sdk === "openai") {
  const { default: OpenAI } = await import("openai");
  const { VERSION } = await import("openai/version");
  client = new OpenAI({ baseURL: args.baseUrl, apiKey: "x", maxRetries: 0 });
  version = VERSION;
  call = async (model) => {
    const stream = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: "Say something." }],
      stream: true,
    });
    let tokens = 0;
    for await (const chunk of stream) {
      if (chunk.choices?.[0]?.delta?.content) tokens++;
    }
    return tokens;
  };
} else {
  const { default: Anthropic } = await import("@anthropic-ai/sdk");
  const { VERSION } = await import("@anthropic-ai/sdk/version");
  client = new Anthropic({ baseURL: args.baseUrl, apiKey: "x", maxRetries: 0 });
  version = VERSION;
  call = async (model) => {
    const stream = await client.messages.create({
      model,
      max_tokens: 1024,
      messages: [{ role: "user", content: "Say something." }],
      stream: true,
    });
    let tokens = 0;
    for await (const event of stream) {
      if (event.type === "content_block_delta" && event.delta?.type === "text_delta") tokens++;
    }
    return tokens;
  };
}

if (args.status) {
  const [host, port] = [args.status.slice(0, args.status.lastIndexOf(":")), Number(args.status.slice(args.status.lastIndexOf(":") + 1))];
  const server = http.createServer((req, res) => {
      if (req.url !== "/status") {
        res.writeHead(404).end();
        return;
      }
      const calls = [...inFlight.keys()].sort((a, b) => a - b);
      const body = JSON.stringify({
        status: "ok",
        current_task: calls.length ? `call ${calls[0]}` : null,
        in_flight: calls.length,
        ...counts,
      });
      res.writeHead(200, { "Content-Type": "application/json" }).end(body);
    });
  // Listening before `ready`: a check right after must find the port.
  await new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, resolve);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function worker(index) {
  let model = args.model[index % args.model.length];
  for (let made = 0; args.calls === 0 || made < args.calls; made++) {
    const n = next++;
    inFlight.set(n, index);
    say(`call ${n} start`);
    let outcome;
    try {
      const tokens = await call(model.replaceAll("{n}", String(n)));
      say(`call ${n} done tokens=${tokens}`);
      outcome = "done";
    } catch (e) {
      say(`call ${n} failed: ${e?.constructor?.name ?? "Error"}: ${oneLine(e?.message ?? e)}`);
      outcome = "failed";
    }
    inFlight.delete(n);
    counts[outcome]++;
    model = args.thenModel ?? model;
    await sleep(args.pauseMs);
  }
}

say(`ready sdk=${args.sdk} version=${version} pid=${process.pid} threads=${args.threads}`);
await Promise.all(Array.from({ length: args.threads }, (_, i) => worker(i)));
