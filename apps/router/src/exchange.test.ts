/**
 * Exchange and Attempt over a fake upstream dispatcher: each dispatch plays a script of undici's
 * handler callbacks (refused, sent, answered, reset mid-body, hung until aborted), and the client
 * side is a real HTTP server and client on loopback.
 */
import { createServer, request as httpRequest, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { simChatPrompt, simTokenIds } from "@llmgw/engine-sim";
import { MAX_SALT_LENGTH, saltKey, tokenBlockKeys } from "@llmgw/kv-events/token-blocks";
import {
  createInMemoryApiKeyStore,
  createStaticRouteTable,
  isolatedSalt,
  MAX_CACHE_SALT_LENGTH,
  type ReplicaRoute,
  type StaticRouteTable,
  UsageLedger,
} from "@llmgw/router";
import { createRecordingRouterMetrics, type RecordingRouterMetrics } from "@llmgw/router/testing";
import { afterEach, describe, expect, it } from "vitest";
import { ClientGoneError } from "./attempt.js";
import { createRouterHandlerFromCore } from "./handler.js";
import { type RouterServiceOptions, resolveRouterServiceOptions } from "./options.js";
import {
  createRouterCore,
  type RouterCore,
  type UpstreamHandler,
  type UpstreamPools,
  type UpstreamRequest,
} from "./router-core.js";

/** One step of a scripted upstream answer, each played on its own turn of the event loop. */
type Step =
  /** undici's `onRequestSent`: the request's last byte is written to the connection. */
  | { readonly sent: true }
  /** The engine holds the request this long before the next step. */
  | { readonly waitMs: number }
  | { readonly headers: number; readonly type: string; readonly length?: number }
  | { readonly data: string }
  | { readonly fail: string }
  | { readonly complete: true };

/** A script that ends without `fail` or `complete` hangs until the router aborts it. */
type Script = readonly Step[];

interface Dispatched {
  readonly baseUrl: string;
  readonly request: UpstreamRequest;
  /** What the router aborted the upstream with, once it did. */
  abortedWith: Error | undefined;
  /** True once the script (or an abort) delivered its last callback. */
  ended: boolean;
}

/** Upstream pools whose dispatches play the queued scripts, in dispatch order. */
class ScriptedUpstreams implements UpstreamPools {
  readonly dispatched: Dispatched[] = [];
  readonly #scripts: Script[] = [];
  closed = false;

  /** Queues the scripts the next dispatches play, one each. */
  play(...scripts: Script[]): void {
    this.#scripts.push(...scripts);
  }

  poolFor(baseUrl: string) {
    return {
      dispatch: (request: UpstreamRequest, handler: UpstreamHandler): boolean => {
        const script = this.#scripts.shift();
        if (script === undefined) throw new Error(`no script left for a dispatch to ${baseUrl}`);
        const call: Dispatched = { baseUrl, request, abortedWith: undefined, ended: false };
        this.dispatched.push(call);
        setImmediate(() => void playScript(script, handler, call));
        return true;
      },
    };
  }

  retain(): void {}

  async close(): Promise<void> {
    this.closed = true;
  }
}

const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

function raw(headers: Record<string, string>): Buffer[] {
  return Object.entries(headers).flatMap(([k, v]) => [Buffer.from(k), Buffer.from(v)]);
}

function codeError(code: string): Error {
  return Object.assign(new Error(`${code} (scripted)`), { code });
}

/** Plays `script` as undici would: `onConnect`, then each step; an abort ends it in `onError`. */
async function playScript(script: Script, h: UpstreamHandler, call: Dispatched): Promise<void> {
  h.onConnect((reason) => {
    if (call.ended) return;
    call.abortedWith = reason;
    call.ended = true;
    queueMicrotask(() => h.onError(reason));
  });
  for (const step of script) {
    await turn();
    if (call.ended) return;
    if ("sent" in step) {
      h.onRequestSent?.();
    } else if ("waitMs" in step) {
      await new Promise((resolve) => setTimeout(resolve, step.waitMs));
    } else if ("headers" in step) {
      const headers: Record<string, string> = { "content-type": step.type };
      if (step.length !== undefined) headers["content-length"] = String(step.length);
      h.onHeaders(step.headers, raw(headers), () => {});
    } else if ("data" in step) {
      h.onData(Buffer.from(step.data));
    } else if ("fail" in step) {
      call.ended = true;
      h.onError(codeError(step.fail));
    } else {
      call.ended = true;
      h.onComplete();
    }
  }
}

const JSON_TYPE = "application/json";
const SSE_TYPE = "text/event-stream";
const answer = (status: number, body: string): Script => [
  { headers: status, type: JSON_TYPE, length: Buffer.byteLength(body) },
  { data: body },
  { complete: true },
];
const refused: Script = [{ fail: "ECONNREFUSED" }];
const OK_BODY = JSON.stringify({
  id: "c1",
  choices: [{ message: { role: "assistant", content: "hi" } }],
  usage: { prompt_tokens: 5, completion_tokens: 1 },
});

const KEY = "sk-exchange";
/** Two GPUs each: a request alone on one holds 2 GPU-ms a millisecond. */
const replicas: ReplicaRoute[] = [
  {
    id: "a",
    baseUrl: "http://a.invalid:8000/prefix/",
    state: "ready",
    capacity: 4,
    apiKey: "ek-a",
    gpus: 2,
  },
  {
    id: "b",
    baseUrl: "http://b.invalid:8000",
    state: "ready",
    capacity: 4,
    apiKey: "ek-b",
    gpus: 2,
  },
];

interface Harness {
  readonly url: string;
  readonly core: RouterCore;
  readonly upstreams: ScriptedUpstreams;
  readonly metrics: RecordingRouterMetrics;
  readonly routes: StaticRouteTable;
  readonly events: Readonly<Record<string, unknown>>[];
  /** Requests in flight on each replica, as the picker books them. */
  inFlight(): Record<string, number>;
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** What a harness's one key is limited to, and where its usage is recorded (default: none). */
interface KeySetup {
  readonly tpm?: number;
  readonly usage?: UsageLedger;
  /** More keys beside KEY, by secret. */
  readonly keys?: Readonly<Record<string, { readonly id: string; readonly name: string }>>;
}

async function harness(options: RouterServiceOptions = {}, setup: KeySetup = {}): Promise<Harness> {
  const upstreams = new ScriptedUpstreams();
  const metrics = createRecordingRouterMetrics();
  const events: Readonly<Record<string, unknown>>[] = [];
  const routes = createStaticRouteTable({
    m: { deployment: "m", policy: "llmgw", loading: false, replicas },
  });
  const core = createRouterCore({
    routeTable: routes,
    apiKeys: createInMemoryApiKeyStore({
      [KEY]: { id: "k", name: "k", ...(setup.tpm === undefined ? {} : { tpm: setup.tpm }) },
      ...setup.keys,
    }),
    ...(setup.usage === undefined ? {} : { usage: setup.usage }),
    metrics,
    log: (event) => events.push(event),
    options: resolveRouterServiceOptions({ analyzer: { pool: false }, ...options }),
    pools: upstreams,
  });
  const server: Server = createServer(createRouterHandlerFromCore(core));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await core.close();
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    core,
    upstreams,
    metrics,
    routes,
    events,
    inFlight: () => Object.fromEntries(replicas.map((r) => [r.id, core.picker.inFlight.get(r.id)])),
  };
}

const chatBody = (stream = false): string =>
  JSON.stringify({ model: "m", stream, messages: [{ role: "user", content: "hello" }] });

function send(h: Harness, body = chatBody()): Promise<Response> {
  return fetch(`${h.url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${KEY}`,
      "content-type": JSON_TYPE,
      "x-request-id": "req-1",
    },
    body,
  });
}

async function waitFor(predicate: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** The other replica's id. */
const other = (id: string | undefined): string => (id === "a" ? "b" : "a");

describe("Exchange and Attempt over a scripted upstream", () => {
  it("sends the body to the replica with its engine key and base path, and relays the answer", async () => {
    const h = await harness();
    h.upstreams.play(answer(200, OK_BODY));
    const res = await send(h);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(OK_BODY);
    const [call] = h.upstreams.dispatched;
    const replica = replicas.find((r) => r.baseUrl === call?.baseUrl);
    expect(res.headers.get("x-llmgw-replica")).toBe(replica?.id);
    expect(res.headers.get("x-request-id")).toBe("req-1");
    expect(call?.request).toMatchObject({
      method: "POST",
      path: replica?.id === "a" ? "/prefix/v1/chat/completions" : "/v1/chat/completions",
      headers: {
        "content-type": JSON_TYPE,
        "x-request-id": expect.stringMatching(/^req-1\.[0-9a-f]{16}$/),
        authorization: `Bearer ek-${replica?.id}`,
      },
    });
    expect(Buffer.from(call?.request.body ?? []).toString()).toBe(chatBody());
    expect(h.metrics.of("tokens")).toEqual([
      ["m", "prompt", 5],
      ["m", "completion", 1],
    ]);
    await waitFor(() => h.inFlight().a === 0 && h.inFlight().b === 0, "in-flight back to 0");
  });

  it("retries a refused connection once on the next-best replica and answers from it", async () => {
    const h = await harness();
    h.upstreams.play(refused, answer(200, OK_BODY));
    const res = await send(h);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(OK_BODY);
    const [first, second] = h.upstreams.dispatched.map(
      (d) => replicas.find((r) => r.baseUrl === d.baseUrl)?.id,
    );
    expect(h.upstreams.dispatched).toHaveLength(2);
    expect(second).toBe(other(first));
    expect(res.headers.get("x-llmgw-replica")).toBe(second);
    expect(h.metrics.of("retry")).toEqual([["m"]]);
    expect(h.metrics.of("upstreamError")).toEqual([["m", first, "connect"]]);
    expect(h.events).toContainEqual({
      event: "upstream_error",
      replica: first,
      kind: "connect",
      code: "ECONNREFUSED",
      requestId: "req-1",
    });
  });

  it("answers 502 when the retry is refused too, and tries no third time", async () => {
    const h = await harness();
    h.upstreams.play(refused, refused);
    const res = await send(h);
    expect(res.status).toBe(502);
    const second = replicas.find((r) => r.baseUrl === h.upstreams.dispatched[1]?.baseUrl)?.id;
    expect(await res.json()).toEqual({
      error: {
        message: `no replica of model m could be reached: replica ${second} failed before responding (ECONNREFUSED)`,
        type: "upstream_error",
        code: "upstream_unavailable",
        param: null,
      },
    });
    expect(h.upstreams.dispatched).toHaveLength(2);
  });

  it("answers 504 for a headers timeout, without a retry (the engine may be working on it)", async () => {
    const h = await harness();
    h.upstreams.play([{ fail: "UND_ERR_HEADERS_TIMEOUT" }]);
    const res = await send(h);
    expect(res.status).toBe(504);
    expect(await res.json()).toMatchObject({ error: { code: "upstream_timeout" } });
    expect(h.upstreams.dispatched).toHaveLength(1);
  });

  it("passes a 5xx to the client as is and counts it as a failure for the circuit", async () => {
    const h = await harness({ picker: { health: { failureThreshold: 1 } } });
    const busy = JSON.stringify({ error: { message: "engine overloaded" } });
    h.upstreams.play(answer(503, busy));
    const res = await send(h);
    expect(res.status).toBe(503);
    expect(res.headers.get("content-type")).toBe(JSON_TYPE);
    expect(await res.text()).toBe(busy);
    expect(h.upstreams.dispatched).toHaveLength(1);
    const id = res.headers.get("x-llmgw-replica") ?? "";
    expect(h.metrics.of("upstreamError")).toEqual([["m", id, "status_5xx"]]);
    expect(h.events).toContainEqual({ event: "circuit", replica: id, from: "closed", to: "open" });
    expect(h.core.picker.health.state(id)).toBe("open");
  });

  it("destroys the client's socket when a JSON answer is cut after its first byte", async () => {
    const h = await harness();
    h.upstreams.play([
      { headers: 200, type: JSON_TYPE, length: OK_BODY.length },
      { data: OK_BODY.slice(0, 10) },
      { fail: "ECONNRESET" },
    ]);
    const res = await send(h);
    expect(res.status).toBe(200);
    await expect(res.text()).rejects.toThrow();
    const id = res.headers.get("x-llmgw-replica");
    expect(h.metrics.of("upstreamError")).toEqual([["m", id, "reset_mid_body"]]);
    expect(h.upstreams.dispatched).toHaveLength(1);
    await waitFor(() => h.inFlight().a === 0 && h.inFlight().b === 0, "in-flight back to 0");
  });

  /** The error event the router ends a stream with when replica `id` fails mid-stream. */
  const midStreamError = (id: string | null) =>
    JSON.stringify({
      error: {
        message: `replica ${id} failed mid-stream (ECONNRESET); the response is incomplete`,
        type: "upstream_error",
        code: "upstream_unavailable",
        param: null,
      },
    });

  it("ends an SSE answer cut mid-stream with an error event", async () => {
    const h = await harness();
    const event = `data: ${JSON.stringify({ choices: [{ delta: { content: "hi" } }] })}\n\n`;
    h.upstreams.play([{ headers: 200, type: SSE_TYPE }, { data: event }, { fail: "ECONNRESET" }]);
    const res = await send(h, chatBody(true));
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe(SSE_TYPE);
    const id = res.headers.get("x-llmgw-replica");
    const error = midStreamError(id);
    expect(await res.text()).toBe(`${event}data: ${error}\n\n`);
    expect(h.upstreams.dispatched).toHaveLength(1);
  });

  it.each([
    { cut: "mid-event", hideUsage: false },
    { cut: "inside the usage event it hides", hideUsage: true },
  ])(
    "ends an SSE answer cut $cut with an error event the client can parse",
    async ({ hideUsage }) => {
      const h = await harness({}, hideUsage ? { usage: new UsageLedger() } : {});
      const event = `data: ${JSON.stringify({ choices: [{ delta: { content: "hi" } }] })}\n\n`;
      const partial = hideUsage
        ? 'data: {"choices":[],"usage":{"prompt_tokens":5,'
        : 'data: {"choices":[{"delta"';
      h.upstreams.play([
        { headers: 200, type: SSE_TYPE },
        { data: event },
        { data: partial },
        { fail: "ECONNRESET" },
      ]);
      const res = await send(h, chatBody(true));
      const id = res.headers.get("x-llmgw-replica");
      const error = midStreamError(id);
      // The partial event the client got already stays unparseable; the error event after it
      // stands alone. A hidden usage event is not shown, not even in part.
      expect(await res.text()).toBe(
        hideUsage ? `${event}data: ${error}\n\n` : `${event}${partial}\n\ndata: ${error}\n\n`,
      );
    },
  );

  it("reads usage followed by more than 4 KiB (vLLM's prompt_logprobs, prompt_token_ids)", async () => {
    const h = await harness();
    const body = `${OK_BODY.slice(0, -1)},"prompt_token_ids":[${"1,".repeat(4000)}1],"kv_transfer_params":null}`;
    h.upstreams.play([
      { headers: 200, type: JSON_TYPE, length: body.length },
      { data: body.slice(0, 3000) },
      { data: body.slice(3000) },
      { complete: true },
    ]);
    const res = await send(h);
    expect(await res.text()).toBe(body);
    // The client has the whole body by its length before the upstream completes.
    await waitFor(() => h.metrics.of("tokens").length > 0, "the usage");
    expect(h.metrics.of("tokens")).toEqual([
      ["m", "prompt", 5],
      ["m", "completion", 1],
    ]);
  });

  it("reads a stream's usage event split over several chunks", async () => {
    const h = await harness();
    const usage = 'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n';
    h.upstreams.play([
      { headers: 200, type: SSE_TYPE },
      { data: usage.slice(0, 20) },
      { data: usage.slice(20, 40) },
      { data: usage.slice(40) },
      { data: "data: [DONE]\n\n" },
      { complete: true },
    ]);
    const res = await send(h, chatBody(true));
    expect(await res.text()).toBe(`${usage}data: [DONE]\n\n`);
    expect(h.metrics.of("tokens")).toEqual([
      ["m", "prompt", 5],
      ["m", "completion", 1],
    ]);
  });

  it("tries elsewhere when the engine refuses the router's key (401), dropping its body", async () => {
    const h = await harness();
    h.upstreams.play(answer(401, '{"error":"Invalid API key"}'), answer(200, OK_BODY));
    const res = await send(h);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(OK_BODY);
    const [first, second] = h.upstreams.dispatched.map(
      (d) => replicas.find((r) => r.baseUrl === d.baseUrl)?.id,
    );
    expect(second).toBe(other(first));
    expect(h.metrics.of("upstreamError")).toEqual([["m", first, "key_refused"]]);
  });

  it("answers 503 with Retry-After when every replica tried refused the key", async () => {
    const h = await harness();
    h.upstreams.play(answer(401, "{}"), answer(401, "{}"));
    const res = await send(h);
    expect(res.status).toBe(503);
    expect(res.headers.get("retry-after")).toBe("1");
    expect(await res.json()).toMatchObject({ error: { code: "upstream_key_refused" } });
    expect(h.upstreams.dispatched).toHaveLength(2);
  });

  it.each([
    { phase: "streaming", script: [{ headers: 200, type: SSE_TYPE }, { data: "data: {}\n\n" }] },
    { phase: "before_first_byte", script: [] },
  ] as const)(
    "aborts the upstream when the client goes away ($phase)",
    async ({ phase, script }) => {
      const h = await harness();
      h.upstreams.play(script);
      const body = chatBody(true);
      const req = httpRequest(`${h.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${KEY}`,
          "content-type": JSON_TYPE,
          "content-length": Buffer.byteLength(body),
        },
      });
      req.on("error", () => {}); // destroyed on purpose
      req.on("response", (res) => res.once("data", () => req.destroy()));
      req.end(body);
      if (phase === "before_first_byte") {
        await waitFor(() => h.upstreams.dispatched.length === 1, "the dispatch");
        req.destroy();
      }
      await waitFor(() => h.upstreams.dispatched[0]?.abortedWith !== undefined, "the abort");
      expect(h.upstreams.dispatched[0]?.abortedWith).toBeInstanceOf(ClientGoneError);
      await waitFor(() => h.metrics.of("clientDisconnect").length > 0, "the disconnect metric");
      expect(h.metrics.of("clientDisconnect")).toEqual([["m", phase]]);
      await waitFor(() => h.inFlight().a === 0 && h.inFlight().b === 0, "in-flight back to 0");
      expect(h.metrics.of("upstreamError")).toEqual([]);
    },
  );

  // Each request reserves ~260 tokens (the prompt and 256 for an answer without max_tokens):
  // against a 400-tpm key, a second request is admitted only if the first was not charged it.
  const expectAdmittedAgain = async (h: Awaited<ReturnType<typeof harness>>) => {
    h.upstreams.play(answer(200, OK_BODY));
    const next = await send(h);
    expect(next.headers.get("x-llmgw-limit")).toBe(null);
    expect(next.status).toBe(200);
    await next.text();
  };
  it("charges nothing for a request no replica answered (both refused the connection)", async () => {
    const h = await harness({}, { tpm: 400 });
    h.upstreams.play(refused, refused);
    const failed = await send(h);
    expect(failed.status).toBe(502);
    await failed.text();
    await expectAdmittedAgain(h);
  });

  /** A stream request whose client leaves when `leave()` is called (resolved once it has). */
  const leavable = (h: Harness) => {
    const controller = new AbortController();
    const gone = fetch(`${h.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": JSON_TYPE },
      body: chatBody(true),
      signal: controller.signal,
    }).then(
      (res) => res.text(),
      () => undefined,
    );
    return {
      leave: async () => {
        controller.abort();
        await gone.catch(() => undefined);
      },
    };
  };

  it.each([
    { when: "before it was sent upstream: charged nothing", script: [], charged: false },
    {
      when: "after it was sent: its reservation kept, as a cut stream's",
      script: [{ sent: true }],
      charged: true,
    },
  ] as const)("settles the tpm of a client that left $when", async ({ script, charged }) => {
    const h = await harness({}, { tpm: 400 });
    h.upstreams.play(script);
    const request = leavable(h);
    await waitFor(() => h.upstreams.dispatched.length === 1, "the dispatch");
    await request.leave();
    await waitFor(() => h.upstreams.dispatched[0]?.abortedWith !== undefined, "the abort");
    await waitFor(() => h.inFlight().a === 0 && h.inFlight().b === 0, "in-flight back to 0");
    if (!charged) {
      await expectAdmittedAgain(h);
      return;
    }
    // ~260 tokens of 400 kept: the next request's ~260 do not fit.
    h.upstreams.play(answer(200, OK_BODY)); // its answer, were it admitted
    const next = await send(h);
    expect(next.status).toBe(429);
    expect(next.headers.get("x-llmgw-limit")).toBe("key-tpm");
    await next.text();
  });

  it.each([400, 503])(
    "records and charges an error answer (%i) without usage as zero tokens",
    async (status) => {
      const usage = new UsageLedger();
      const h = await harness({}, { tpm: 400, usage });
      h.upstreams.play(answer(status, '{"error":{"message":"no"}}'));
      const failed = await send(h);
      expect(failed.status).toBe(status);
      await failed.text();
      await waitFor(() => usage.size === 1, "the usage record");
      expect(usage.seal()).toMatchObject([
        { requests: 1, promptTokens: 0, completionTokens: 0, estimatedRequests: 0 },
      ]);
      await expectAdmittedAgain(h);
    },
  );

  it("counts a chat answer's missing cached tokens as 0 once its engine was seen to report them, an embedding's never", async () => {
    const usage = new UsageLedger();
    const h = await harness({}, { usage });
    // One replica, so that every answer is its engine's.
    h.routes.update("m", {
      deployment: "m",
      policy: "llmgw",
      loading: false,
      replicas: [replicas[0] as ReplicaRoute],
    });
    const cachedBody = JSON.stringify({
      id: "c2",
      choices: [{ message: { role: "assistant", content: "hi" } }],
      usage: {
        prompt_tokens: 40,
        completion_tokens: 1,
        prompt_tokens_details: { cached_tokens: 32 },
      },
    });
    const embedding = JSON.stringify({
      object: "list",
      data: [{ object: "embedding", index: 0, embedding: [0.5] }],
      usage: { prompt_tokens: 3, total_tokens: 3 },
    });
    const embed = () =>
      fetch(`${h.url}/v1/embeddings`, {
        method: "POST",
        headers: { authorization: `Bearer ${KEY}`, "content-type": JSON_TYPE },
        body: JSON.stringify({ model: "m", input: "hello" }),
      });
    /** The records since the last call, summed (a minute may end between two requests). */
    const settled = async (requests: number) => {
      await waitFor(
        () => usage.size > 0 && h.core.admission.stats("m").inFlight === 0,
        "the usage records",
      );
      const sum = { requests: 0, promptTokens: 0, cachedTokens: 0, cachedReported: 0 };
      for (const r of usage.seal())
        for (const k of Object.keys(sum) as (keyof typeof sum)[]) sum[k] += r[k];
      expect(sum.requests).toBe(requests);
      return sum;
    };
    // Not yet seen to report them: unknown (an engine launched without the flag looks the same).
    h.upstreams.play(answer(200, OK_BODY));
    await (await send(h)).text();
    expect(await settled(1)).toMatchObject({ cachedTokens: 0, cachedReported: 0 });
    // Nor is it a miss to the router's prefix prediction.
    expect(h.metrics.of("prefixPrediction")).toEqual([]);
    // Seen: vLLM leaves a 0 out, so an answer without them had none.
    h.upstreams.play(answer(200, cachedBody), answer(200, OK_BODY), answer(200, embedding));
    for (let i = 0; i < 2; i++) await (await send(h)).text();
    await (await embed()).text();
    expect(await settled(3)).toMatchObject({
      promptTokens: 48,
      cachedTokens: 32,
      cachedReported: 2,
    });
    // The reported count and the known 0 score the prediction (32 tokens are less than a block:
    // both misses, as expected on a first sight of the prompt); the embedding does not.
    expect(h.metrics.of("prefixPrediction").map(([, , outcome]) => outcome)).toEqual([
      "miss",
      "miss",
    ]);
  });

  // What a stream cut before its first chunk is charged: the estimated prompt, nothing
  // streamed, flagged. A request an engine held without answering is charged the same.
  const cutBeforeFirstChunk = async (usage: UsageLedger) => {
    const h = await harness({}, { usage });
    h.upstreams.play([{ headers: 200, type: SSE_TYPE }, { fail: "ECONNRESET" }]);
    const cut = await send(h, chatBody(true));
    expect(cut.status).toBe(200);
    await cut.text();
    await waitFor(() => usage.size === 1, "the cut stream's usage record");
    const [record] = usage.seal();
    expect(record).toMatchObject({ requests: 1, completionTokens: 0, estimatedRequests: 1 });
    expect(record?.promptTokens).toBeGreaterThan(0);
    return record?.promptTokens;
  };

  it.each([
    { ending: "a headers timeout", scripts: [[{ fail: "UND_ERR_HEADERS_TIMEOUT" }]], status: 504 },
    {
      ending: "a headers timeout on the retry after a refused connection",
      scripts: [refused, [{ fail: "UND_ERR_HEADERS_TIMEOUT" }]],
      status: 504,
    },
    {
      ending: "a head no HTTP parser reads",
      scripts: [[{ fail: "HPE_INVALID_CONSTANT" }]],
      status: 502,
    },
  ] as const)(
    "records $ending once, charged as a stream cut before its first chunk",
    async ({ scripts, status }) => {
      const usage = new UsageLedger();
      const promptTokens = await cutBeforeFirstChunk(usage);
      const h = await harness({}, { usage });
      h.upstreams.play(...scripts);
      const failed = await send(h, chatBody(true));
      expect(failed.status).toBe(status);
      await failed.text();
      expect(h.upstreams.dispatched).toHaveLength(scripts.length);
      await waitFor(() => usage.size === 1, "the usage record");
      expect(usage.seal()).toMatchObject([
        {
          requests: 1,
          promptTokens,
          cachedTokens: 0,
          cachedReported: 0,
          completionTokens: 0,
          estimatedRequests: 1,
          refusedUsage: 0,
        },
      ]);
    },
  );

  it("keeps the tpm reservation of a headers timeout, as of a stream cut before its first chunk", async () => {
    const h = await harness({}, { tpm: 400 });
    // The answer is for the next request, were it admitted.
    h.upstreams.play([{ fail: "UND_ERR_HEADERS_TIMEOUT" }], answer(200, OK_BODY));
    const failed = await send(h, chatBody(true));
    expect(failed.status).toBe(504);
    await failed.text();
    // ~260 tokens of 400 kept: the next request's ~260 do not fit.
    const next = await send(h);
    expect(next.status).toBe(429);
    expect(next.headers.get("x-llmgw-limit")).toBe("key-tpm");
    await next.text();
  });

  it("charges a client that left after its request was sent as a stream cut before its first chunk, with the GPU time held; one that left while queued, nothing", async () => {
    const usage = new UsageLedger();
    const promptTokens = await cutBeforeFirstChunk(usage);
    const h = await harness({}, { usage });
    // One replica with room for one: a second request waits in admission.
    h.routes.update("m", {
      deployment: "m",
      policy: "llmgw",
      loading: false,
      replicas: [{ ...(replicas[0] as ReplicaRoute), capacity: 1 }],
    });
    h.upstreams.play([{ sent: true }]);
    const held = leavable(h);
    await waitFor(() => h.upstreams.dispatched.length === 1, "the dispatch");
    const dispatchedBy = performance.now();
    const queued = leavable(h);
    await waitFor(() => h.core.admission.stats("m").queued === 1, "the second request queued");
    await queued.leave();
    await waitFor(() => h.metrics.of("clientDisconnect").length === 1, "the queued one gone");
    expect(h.metrics.of("clientDisconnect")).toEqual([["m", "queued"]]);
    await new Promise((resolve) => setTimeout(resolve, 150 - (performance.now() - dispatchedBy)));
    const leftAt = performance.now();
    await held.leave();
    await waitFor(() => h.upstreams.dispatched[0]?.abortedWith !== undefined, "the abort");
    await waitFor(() => usage.size === 1, "the usage record");
    const [record] = usage.seal();
    // The one the engine had, alone: the queued one reached no engine.
    expect(record).toMatchObject({
      requests: 1,
      promptTokens,
      cachedTokens: 0,
      cachedReported: 0,
      completionTokens: 0,
      estimatedRequests: 1,
      refusedUsage: 0,
    });
    // Two GPUs, alone on the replica from dispatch until the client left.
    expect(record?.gpuMs).toBeGreaterThanOrEqual(2 * (leftAt - dispatchedBy) - 10);
  });

  it("adds the GPU time of a try whose engine dropped the request after it was sent to the retry's exact usage", async () => {
    const usage = new UsageLedger();
    const h = await harness({}, { usage });
    // The engine had it for 150 ms (queued, prefilling), then its connection closed: a crash.
    h.upstreams.play(
      [{ sent: true }, { waitMs: 150 }, { fail: "UND_ERR_SOCKET" }],
      answer(200, OK_BODY),
    );
    const startedAt = performance.now();
    const res = await send(h);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe(OK_BODY);
    expect(h.upstreams.dispatched).toHaveLength(2);
    await waitFor(() => usage.size === 1, "the usage record");
    const [record] = usage.seal();
    // One record for the request, the answer's own counts, and both tries' GPU time.
    expect(record).toMatchObject({
      requests: 1,
      promptTokens: 5,
      completionTokens: 1,
      estimatedRequests: 0,
      refusedUsage: 0,
    });
    expect(record?.gpuMs).toBeGreaterThanOrEqual(2 * 150 - 10);
    expect(record?.gpuMs).toBeLessThanOrEqual(2 * (performance.now() - startedAt) + 10);
  });

  it("charges a request every try of which was dropped after it was sent as a stream cut before its first chunk, with their GPU time", async () => {
    const usage = new UsageLedger();
    const promptTokens = await cutBeforeFirstChunk(usage);
    const h = await harness({}, { usage });
    h.upstreams.play(
      [{ sent: true }, { waitMs: 100 }, { fail: "UND_ERR_SOCKET" }],
      [{ sent: true }, { waitMs: 100 }, { fail: "ECONNRESET" }],
    );
    const failed = await send(h, chatBody(true));
    expect(failed.status).toBe(502);
    await failed.text();
    expect(h.upstreams.dispatched).toHaveLength(2);
    await waitFor(() => usage.size === 1, "the usage record");
    const [record] = usage.seal();
    expect(record).toMatchObject({
      requests: 1,
      promptTokens,
      cachedTokens: 0,
      cachedReported: 0,
      completionTokens: 0,
      estimatedRequests: 1,
      refusedUsage: 0,
    });
    expect(record?.gpuMs).toBeGreaterThanOrEqual(2 * 2 * 100 - 10);
  });

  it.each(["ECONNREFUSED", "ECONNRESET", "UND_ERR_SOCKET"])(
    "records nothing for a request whose tries failed (%s) before it was sent",
    async (code) => {
      const usage = new UsageLedger();
      const h = await harness({}, { tpm: 400, usage });
      h.upstreams.play([{ fail: code }], [{ fail: code }]);
      const failed = await send(h);
      expect(failed.status).toBe(502);
      await failed.text();
      expect(h.upstreams.dispatched).toHaveLength(2);
      await expectAdmittedAgain(h);
      // Only the answered request after it.
      expect(usage.seal()).toMatchObject([{ requests: 1, promptTokens: 5, completionTokens: 1 }]);
    },
  );

  it("closes its pools with the handler", async () => {
    const h = await harness();
    await h.core.close();
    expect(h.upstreams.closed).toBe(true);
  });
});

describe("Exchange under cache isolation", () => {
  it("scopes a request's affinity hint by its principal, and its body's salt", async () => {
    const homes: number[] = [];
    for (const mode of ["none", "key"] as const) {
      const h = await harness(
        { cacheIsolation: mode },
        { keys: { "sk-2": { id: "k2", name: "k2" } } },
      );
      h.upstreams.play(answer(200, OK_BODY), answer(200, OK_BODY));
      // Two keys with the same `user`: one hint, unless each key's is its own.
      for (const secret of [KEY, "sk-2"]) {
        const res = await fetch(`${h.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${secret}`, "content-type": JSON_TYPE },
          body: JSON.stringify({
            model: "m",
            user: "u-1",
            messages: [{ role: "user", content: "hi" }],
          }),
        });
        expect(res.status).toBe(200);
        await res.text();
      }
      homes.push(h.core.picker.hintHomes.size("m"));
      const sent = JSON.parse(
        Buffer.from(h.upstreams.dispatched[0]?.request.body ?? []).toString(),
      );
      expect(sent.cache_salt).toBe(mode === "none" ? undefined : isolatedSalt("key\0k", undefined));
    }
    expect(homes).toEqual([1, 2]);
  });
});

describe("Exchange: a request's cache_salt", () => {
  // ~5.8 KB: five 1 KiB prefix blocks, and well over one 16-token engine block.
  const content = "The same long system prompt, word for word. ".repeat(130);
  const chat = (salt?: string): string =>
    JSON.stringify({
      model: "m",
      messages: [{ role: "user", content }],
      ...(salt === undefined ? {} : { cache_salt: salt }),
    });
  const decisions = (h: Harness) =>
    h.metrics.of("decision").map(([d]) => d as { prefixBlocks: number; preciseFallback?: string });
  const replicaOf = (d: Dispatched | undefined) =>
    replicas.find((r) => r.baseUrl === d?.baseUrl)?.id;
  /** Sends each body once the one before has finished, each answered 200. */
  const sendInTurn = async (h: Harness, bodies: readonly string[]) => {
    h.upstreams.play(...bodies.map(() => answer(200, OK_BODY)));
    for (const body of bodies) {
      const res = await send(h, body);
      expect(res.status).toBe(200);
      await res.text();
      await waitFor(() => h.inFlight().a === 0 && h.inFlight().b === 0, "in-flight back to 0");
    }
  };

  it("predicts no prefix where the same prompt went under another salt or none", async () => {
    const h = await harness();
    const bodies = [chat("tenant-a"), chat("tenant-b"), chat(), chat("tenant-a")];
    await sendInTurn(h, bodies);
    const predicted = decisions(h).map((d) => d.prefixBlocks);
    expect(predicted.slice(0, 3)).toEqual([0, 0, 0]);
    expect(predicted[3]).toBeGreaterThanOrEqual(5);
    expect(replicaOf(h.upstreams.dispatched[3])).toBe(replicaOf(h.upstreams.dispatched[0]));
    // Forwarded as sent: the engine keys its own blocks under the salt.
    expect(h.upstreams.dispatched.map((d) => Buffer.from(d.request.body ?? []).toString())).toEqual(
      bodies,
    );
  });

  it("matches a salted request of a precise-mode deployment on its token blocks under the salt", async () => {
    // An agent that takes the watch and never answers: the feeds stay as applied below.
    const agent = createServer(() => {});
    await new Promise<void>((resolve) => agent.listen(0, "127.0.0.1", resolve));
    cleanups.push(async () => {
      agent.closeAllConnections();
      await new Promise<void>((resolve) => agent.close(() => resolve()));
    });
    const h = await harness();
    const kvEventsUrl = `http://127.0.0.1:${(agent.address() as AddressInfo).port}`;
    h.routes.update("m", {
      deployment: "m",
      policy: "llmgw",
      loading: false,
      tokenizer: "sim",
      replicas: replicas.map((r) => ({ ...r, kvEventsUrl })),
    });
    // Replica a holds the prompt's blocks under tenant-a's salt (what its engine's events give
    // once keyed by the agent's block set), replica b the same tokens unsalted.
    const tokens = simTokenIds(simChatPrompt([{ role: "user", content }]));
    const keys = (salt?: string) =>
      [...tokenBlockKeys(tokens, 16, salt === undefined ? undefined : saltKey(salt))].slice(0, 8);
    const index = h.core.picker.preciseIndex;
    for (const [id, added] of [
      ["a", keys("tenant-a")],
      ["b", keys()],
    ] as const) {
      index.apply(id, {
        epoch: "e",
        version: 1,
        snapshot: true,
        added,
        removed: [],
        blockSizeTokens: 16,
        stale: false,
      });
    }
    const bodies = [chat("tenant-a"), chat(), chat("tenant-b")];
    await sendInTurn(h, bodies);
    const [salted, plain, other] = h.upstreams.dispatched.map(replicaOf);
    expect([salted, plain]).toEqual(["a", "b"]);
    const d = decisions(h);
    expect(d.map((x) => x.preciseFallback)).toEqual([undefined, undefined, undefined]);
    expect(d.map((x) => x.prefixBlocks)).toEqual([8, 8, 0]);
    expect(other).toBeDefined();
  });

  it("keys the blocks of every salt it accepts: the router's bound is the block keys' bound", () => {
    // Past saltKey's bound a salted request would fall back to load ("unsupported_request");
    // the router refuses such salts first, as long as the two bounds agree.
    expect(MAX_CACHE_SALT_LENGTH).toBe(MAX_SALT_LENGTH);
    expect(saltKey("s".repeat(MAX_CACHE_SALT_LENGTH))).toBeDefined();
  });
});
