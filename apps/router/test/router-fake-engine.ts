/**
 * A tiny OpenAI-compatible upstream for router integration tests: a real HTTP server on
 * 127.0.0.1:0 that records what it received, can hold answers behind a gate, and can die
 * mid-stream. (The full simulated engine is `@llmgw/engine-sim`; this one exists so fault tests
 * control exactly which byte a failure follows.)
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface FakeEngineOptions {
  readonly name: string;
  /** Chunks per stream (default 4). */
  readonly chunks?: number;
  /** Destroy the socket after writing this many stream chunks. */
  readonly dieAfterChunks?: number;
  /** When set, each request waits for `gate.open()` before answering (streams: after the first chunk). */
  readonly gated?: boolean;
  /** With `gated`: a stream waits before its first chunk instead (its prefill, as the router sees it). */
  readonly gateFirstChunk?: boolean;
  /**
   * The engine's key: a request without `Authorization: Bearer <apiKey>` is answered 401, as a
   * real engine started with `--api-key` does.
   */
  readonly apiKey?: string;
  /**
   * The `usage` object's JSON text in answers (default
   * `{"prompt_tokens":7,"completion_tokens":<chunks>,"total_tokens":…}`): hostile values go
   * through as written.
   */
  readonly usage?: string;
  /** What ends each line of a stream (default `\n`; the SSE spec allows `\r\n` and `\r`). */
  readonly lineEnd?: "\n" | "\r\n" | "\r";
}

export interface ReceivedRequest {
  readonly path: string;
  readonly body: Record<string, unknown>;
  readonly requestId: string | undefined;
  /** The `Authorization` header the router sent (the engine's key), if any. */
  readonly authorization: string | undefined;
  /** True once the client side went away before the answer finished. */
  aborted: boolean;
  finished: boolean;
}

export interface FakeEngine {
  readonly url: string;
  readonly port: number;
  readonly name: string;
  readonly received: ReceivedRequest[];
  /** Exact bytes written per request, in order. */
  readonly written: Buffer[][];
  /** Releases every held request (now and until `closeGate`). */
  openGate(): void;
  closeGate(): void;
  /** Requests currently held at the gate. */
  held(): number;
  close(): Promise<void>;
}

export async function startFakeEngine(options: FakeEngineOptions): Promise<FakeEngine> {
  const received: ReceivedRequest[] = [];
  const written: Buffer[][] = [];
  let gateOpen = options.gated !== true;
  let waiters: (() => void)[] = [];
  const gate = (): Promise<void> =>
    gateOpen ? Promise.resolve() : new Promise<void>((resolve) => waiters.push(resolve));

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as Record<string, unknown>;
    const rec: ReceivedRequest = {
      path: req.url ?? "",
      body,
      requestId: req.headers["x-request-id"] as string | undefined,
      authorization: req.headers.authorization,
      aborted: false,
      finished: false,
    };
    received.push(rec);
    if (options.apiKey !== undefined && rec.authorization !== `Bearer ${options.apiKey}`) {
      const json = JSON.stringify({ error: { message: "Invalid API key", type: "auth_error" } });
      res.writeHead(401, {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(json),
      });
      res.end(json);
      rec.finished = true;
      return;
    }
    const out: Buffer[] = [];
    written.push(out);
    res.on("close", () => {
      if (!res.writableFinished) rec.aborted = true;
    });
    const write = (text: string): void => {
      const b = Buffer.from(text);
      out.push(b);
      res.write(b);
    };
    /** A whole JSON answer with a declared length, written in one piece. */
    const answerJson = (json: string): void => {
      res.writeHead(200, {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(json),
      });
      write(json);
      res.end();
      rec.finished = true;
    };
    const model = String(body.model);
    if (req.url === "/v1/embeddings" && typeof body.dimensions === "number") {
      // A large answer with a declared length, written in one piece (it leaves in many reads).
      const embedding = Array.from({ length: body.dimensions }, (_, i) => (i % 997) / 997);
      answerJson(
        JSON.stringify({
          object: "list",
          data: [{ object: "embedding", index: 0, embedding }],
          model,
          usage: { prompt_tokens: 1, total_tokens: 1 },
        }),
      );
      return;
    }
    if (req.url === "/v1/embeddings") {
      await gate();
      const json = JSON.stringify({
        object: "list",
        data: [
          {
            object: "embedding",
            index: 0,
            embedding:
              body.encoding_format === "base64"
                ? Buffer.from(new Float32Array([0.5, 0.25, 0.125]).buffer).toString("base64")
                : [0.5, 0.25, 0.125],
          },
        ],
        model,
        usage: { prompt_tokens: 3, total_tokens: 3 },
      });
      res.writeHead(200, { "content-type": "application/json" });
      write(json);
      res.end();
      rec.finished = true;
      return;
    }
    const chat = req.url === "/v1/chat/completions";
    const n = options.chunks ?? 4;
    const usageJson =
      options.usage ?? `{"prompt_tokens":7,"completion_tokens":${n},"total_tokens":${7 + n}}`;
    if (body.stream === true) {
      const end = (options.lineEnd ?? "\n").repeat(2);
      res.writeHead(200, { "content-type": "text/event-stream" });
      if (options.gateFirstChunk === true) await gate();
      for (let i = 0; i < n; i++) {
        if (res.destroyed) return;
        const delta = chat
          ? { index: 0, delta: { content: `tok${i} ` }, finish_reason: null }
          : { index: 0, text: `tok${i} `, finish_reason: null };
        write(
          `data: ${JSON.stringify({ id: "x", object: chat ? "chat.completion.chunk" : "text_completion", created: 1, model, choices: [delta] })}${end}`,
        );
        if (options.dieAfterChunks !== undefined && i + 1 >= options.dieAfterChunks) {
          // Let the bytes already written leave before the "crash".
          await new Promise((r) => setTimeout(r, 20));
          res.socket?.destroy();
          return;
        }
        if (i === 0 && options.gateFirstChunk !== true) await gate();
        else await new Promise((r) => setTimeout(r, 2));
      }
      const usage = (body.stream_options as { include_usage?: boolean } | undefined)?.include_usage;
      if (usage === true) {
        write(
          `data: ${JSON.stringify({ id: "x", object: "chat.completion.chunk", created: 1, model, choices: [] }).slice(0, -1)},"usage":${usageJson}}${end}`,
        );
      }
      write(`data: [DONE]${end}`);
      res.end();
      rec.finished = true;
      return;
    }
    await gate();
    const text = Array.from({ length: n }, (_, i) => `tok${i}`).join(" ");
    const json = JSON.stringify({
      id: "x",
      object: chat ? "chat.completion" : "text_completion",
      created: 1,
      model,
      choices: [
        chat
          ? { index: 0, message: { role: "assistant", content: text }, finish_reason: "stop" }
          : { index: 0, text, finish_reason: "stop" },
      ],
    }).slice(0, -1);
    answerJson(`${json},"usage":${usageJson}}`);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch(() => res.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    name: options.name,
    received,
    written,
    openGate() {
      gateOpen = true;
      const w = waiters;
      waiters = [];
      for (const resolve of w) resolve();
    },
    closeGate() {
      gateOpen = false;
    },
    held: () => waiters.length,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

/** A port on 127.0.0.1 that refuses connections (bound, then closed). */
export async function refusedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** Polls `predicate` every 10 ms until true or `timeoutMs` passes (then throws). */
export async function waitFor(
  predicate: () => boolean,
  timeoutMs = 5000,
  what = "condition",
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * A stream as the engine wrote it, without the usage event (its `choices` empty): what a
 * client that did not ask for usage receives through the router, which asked for it.
 */
export function withoutUsageEvent(stream: string): string {
  return stream
    .split(/(?<=\n\n)/)
    .filter((event) => !(event.includes('"choices":[]') && event.includes('"usage"')))
    .join("");
}
