import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { create, isFieldSet } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  type ConnectRouter,
  createClient,
  createRouterTransport,
  type HandlerContext,
  type ServiceImpl,
} from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { startControlPlane } from "@llmgw/control-plane";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import {
  AgentService,
  EngineLoadSchema,
  HeartbeatResponseSchema,
  RegisterResponseSchema,
  type ReplicaAssignment,
  type ReplicaLoadReport,
  ReplicaLoadReportSchema,
  ReportLoadResponseSchema,
  StreamLoadResponseSchema,
} from "@llmgw/proto";
import type { ReplicaLoadSample as RoutedLoadSample } from "@llmgw/router";
import { silentLogger } from "@llmgw/supervisor";
import { ManualClock, RecordingLogger } from "@llmgw/supervisor/testing";
import { inventoryToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { simReplicaAssignment } from "../test/assignments.js";
import { parseAgentConfig } from "./config.js";
import { ControlChannel, openLoadStream } from "./control-channel.js";
import {
  LoadReporter,
  loadReportToProto,
  MAX_LOAD_INTERVAL_MS,
  MIN_LOAD_INTERVAL_MS,
  planLoadReport,
} from "./load-reporter.js";
import { createEngineProbes } from "./probes.js";
import type { EngineLoadSignals, ReplicaLoadSample } from "./replica-manager.js";
import { type RunningAgent, startAgent } from "./run.js";

const JOIN = "join-token-0123456789abcdef";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

describe("planLoadReport", () => {
  const at = 1_700_000_000_000;
  const s = (replicaId: string, load: EngineLoadSignals | undefined): ReplicaLoadSample => ({
    replicaId,
    load,
    scrapedAtMs: at,
  });
  it.each<{
    what: string;
    acked: [string, EngineLoadSignals | undefined][];
    samples: ReplicaLoadSample[];
    changed: [string, EngineLoadSignals | undefined][];
    gone?: string[];
  }>([
    {
      what: "a replica never acknowledged, with known load, is a change",
      acked: [],
      samples: [s("a", { running: 0, waiting: 0 })],
      changed: [["a", { running: 0, waiting: 0 }]],
    },
    {
      what: "the same load again is nothing",
      acked: [["a", { running: 2, kvCacheUsage: 0.5 }]],
      samples: [s("a", { running: 2, kvCacheUsage: 0.5 })],
      changed: [],
    },
    {
      what: "one field moving is a change; the unchanged replica stays out",
      acked: [
        ["a", { running: 2 }],
        ["b", { running: 1 }],
      ],
      samples: [s("a", { running: 3 }), s("b", { running: 1 })],
      changed: [["a", { running: 3 }]],
    },
    {
      what: "a field appearing is a change (absent is not zero)",
      acked: [["a", { running: 0 }]],
      samples: [s("a", { running: 0, waiting: 0 })],
      changed: [["a", { running: 0, waiting: 0 }]],
    },
    {
      what: "known load becoming unknown is reported as unknown",
      acked: [["a", { running: 1 }]],
      samples: [s("a", undefined)],
      changed: [["a", undefined]],
    },
    {
      what: "load with no field is unknown load",
      acked: [["a", { running: 1 }]],
      samples: [s("a", {})],
      changed: [["a", undefined]],
    },
    {
      what: "unknown load never acknowledged is nothing to say",
      acked: [],
      samples: [s("a", undefined), s("b", {})],
      changed: [],
    },
    {
      what: "unknown load already reported as unknown is nothing",
      acked: [["a", undefined]],
      samples: [s("a", undefined)],
      changed: [],
    },
    {
      what: "a replica no longer ready is forgotten, not reported",
      acked: [["a", { running: 1 }]],
      samples: [],
      changed: [],
      gone: ["a"],
    },
  ])("$what", ({ acked, samples, changed, gone = [] }) => {
    const plan = planLoadReport(new Map(acked), samples);
    expect(plan.changed.map((c) => [c.replicaId, c.load])).toEqual(changed);
    expect(plan.gone).toEqual(gone);
  });
});

describe("loadReportToProto", () => {
  it("leaves unreported fields unset and unknown load without a load message", () => {
    const known = loadReportToProto({
      replicaId: "m-0",
      load: { running: 0, kvCacheUsage: 0.25 },
      scrapedAtMs: 1_700_000_000_123.4,
    });
    expect(known.scrapedAtUnixMs).toBe(1_700_000_000_123n);
    const load = known.load ?? create(EngineLoadSchema);
    expect(isFieldSet(load, EngineLoadSchema.field.running)).toBe(true);
    expect(load.running).toBe(0);
    expect(isFieldSet(load, EngineLoadSchema.field.waiting)).toBe(false);
    expect(isFieldSet(load, EngineLoadSchema.field.prefixCacheHitRate)).toBe(false);
    const unknown = loadReportToProto({ replicaId: "m-0", load: undefined, scrapedAtMs: 1 });
    expect(isFieldSet(unknown, ReplicaLoadReportSchema.field.load)).toBe(false);
  });
});

/** One ReportLoad the service accepted, in plain values. */
interface ReceivedReport {
  readonly nodeId: string;
  readonly credential: string;
  /** How it came: a unary ReportLoad call or a message of a StreamLoad request. */
  readonly via: "unary" | "stream";
  readonly replicas: { id: string; load: EngineLoadSignals | undefined; scrapedAtMs: number }[];
  readonly receivedAtMs: number;
}

/**
 * An AgentService that keeps the rules an agent relies on and records what it is sent:
 * Register takes the join token and issues a fresh credential; Heartbeat and ReportLoad take
 * only the node's current credential (`Unauthenticated` otherwise); `revoke()` drops it, as
 * a revoked node or a lost data dir would. ReportLoad can answer `Unimplemented` (an older
 * control plane), wait on a gate (a slow one), fail (`Unavailable`), or ask for an interval.
 * With `loadStreamMs` > 0 heartbeats offer StreamLoad, which records each message as it
 * arrives and can answer `Unimplemented` or fail after its first message.
 */
function honestAgentService(
  options: {
    heartbeatIntervalMs?: number;
    assignments?: ReplicaAssignment[];
    loadStreamMs?: number;
  } = {},
) {
  const credentials = new Map<string, string>();
  const svc = {
    registers: 0,
    heartbeats: 0,
    reports: [] as ReceivedReport[],
    /** ReportLoad calls that reached the service, answered or not. */
    reportCalls: 0,
    /** Every call fails with `Unavailable` (an outage). */
    down: false,
    inFlight: 0,
    peakInFlight: 0,
    mode: "serve" as "serve" | "unimplemented" | "unavailable",
    /** While set, ReportLoad waits for it before answering. */
    gate: undefined as Promise<void> | undefined,
    loadIntervalMs: 0,
    /** StreamLoad requests opened, and those that ended with the agent's end of the request. */
    streamsOpened: 0,
    streamsEnded: 0,
    streamMode: "serve" as "serve" | "unimplemented" | "fail-after-first",
    revoke(nodeId: string) {
      credentials.delete(nodeId);
    },
  };
  const authorize = (nodeId: string, ctx: HandlerContext) => {
    if (svc.down) throw new ConnectError("control plane down", Code.Unavailable);
    const bearer = ctx.requestHeader.get("authorization")?.replace(/^Bearer /, "") ?? "";
    if (credentials.get(nodeId) !== bearer) {
      throw new ConnectError("unknown node credential", Code.Unauthenticated);
    }
    return bearer;
  };
  const record = (
    via: ReceivedReport["via"],
    req: { nodeId: string; replicas: readonly ReplicaLoadReport[] },
    credential: string,
  ) => {
    svc.reports.push({
      nodeId: req.nodeId,
      credential,
      via,
      replicas: req.replicas.map((r) => ({
        id: r.replicaId,
        load: r.load === undefined ? undefined : plainLoad(r.load),
        scrapedAtMs: Number(r.scrapedAtUnixMs),
      })),
      receivedAtMs: Date.now(),
    });
  };
  const impl: Partial<ServiceImpl<typeof AgentService>> = {
    register(req, ctx) {
      if (svc.down) throw new ConnectError("control plane down", Code.Unavailable);
      if (ctx.requestHeader.get("authorization") !== `Bearer ${JOIN}`) {
        throw new ConnectError("join token required", Code.Unauthenticated);
      }
      svc.registers += 1;
      const nodeId = req.previousNodeId ?? "node-1";
      const credential = `node-credential-${svc.registers}`;
      credentials.set(nodeId, credential);
      return create(RegisterResponseSchema, {
        nodeId,
        nodeCredential: credential,
        heartbeatIntervalMs: options.heartbeatIntervalMs ?? 2_000,
      });
    },
    heartbeat(req, ctx) {
      authorize(req.nodeId, ctx);
      svc.heartbeats += 1;
      return create(HeartbeatResponseSchema, {
        generation: 1n,
        assignments: options.assignments ?? [],
        heartbeatIntervalMs: options.heartbeatIntervalMs ?? 2_000,
        loadStreamMs: options.loadStreamMs ?? 0,
      });
    },
    async streamLoad(requests, ctx) {
      if (svc.streamMode === "unimplemented") {
        throw new ConnectError("StreamLoad is not served", Code.Unimplemented);
      }
      svc.streamsOpened += 1;
      for await (const req of requests) {
        const credential = authorize(req.nodeId, ctx);
        record("stream", req, credential);
        if (svc.streamMode === "fail-after-first") {
          throw new ConnectError("overloaded", Code.Unavailable);
        }
      }
      svc.streamsEnded += 1;
      return create(StreamLoadResponseSchema, { loadIntervalMs: svc.loadIntervalMs });
    },
    async reportLoad(req, ctx) {
      svc.reportCalls += 1;
      const credential = authorize(req.nodeId, ctx);
      if (svc.mode === "unimplemented") {
        throw new ConnectError("ReportLoad is not served", Code.Unimplemented);
      }
      if (svc.mode === "unavailable") throw new ConnectError("overloaded", Code.Unavailable);
      svc.inFlight += 1;
      svc.peakInFlight = Math.max(svc.peakInFlight, svc.inFlight);
      try {
        await svc.gate;
      } finally {
        svc.inFlight -= 1;
      }
      record("unary", req, credential);
      return create(ReportLoadResponseSchema, { loadIntervalMs: svc.loadIntervalMs });
    },
  };
  return { svc, routes: (router: ConnectRouter) => router.service(AgentService, impl) };
}

/** The fields a report set, and only those. */
function plainLoad(load: {
  running?: number;
  waiting?: number;
  kvCacheUsage?: number;
  prefixCacheHitRate?: number;
}): EngineLoadSignals {
  return {
    ...(load.running === undefined ? {} : { running: load.running }),
    ...(load.waiting === undefined ? {} : { waiting: load.waiting }),
    ...(load.kvCacheUsage === undefined ? {} : { kvCacheUsage: load.kvCacheUsage }),
    ...(load.prefixCacheHitRate === undefined
      ? {}
      : { prefixCacheHitRate: load.prefixCacheHitRate }),
  };
}

const INTERVAL = 2_000;

/**
 * The real ControlChannel (manual clock: heartbeats only when the test advances it) against
 * {@link honestAgentService} in memory, and a LoadReporter on it whose samples the test sets.
 */
async function connectedReporter(options: { loadStreamMs?: number } = {}) {
  const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-load-reporter-"));
  cleanups.push(() => rmSync(stateDir, { recursive: true, force: true }));
  const { svc, routes } = honestAgentService({ heartbeatIntervalMs: INTERVAL, ...options });
  const clock = new ManualClock();
  const channel = new ControlChannel(
    {
      controlPlaneUrl: "http://control-plane.test:7070",
      joinToken: JOIN,
      stateDir,
      advertiseAddress: "10.0.0.1",
      initialBackoffMs: 500,
      maxBackoffMs: 4_000,
      callTimeoutMs: 5_000,
      transport: createRouterTransport(routes),
      clock,
      random: () => 0.5,
    },
    {
      inventory: async () =>
        inventoryToProto(simulateInventory("1xh100-80g", { hostname: "node-a" })),
      snapshot: async () => ({ gpus: [], replicas: [], problems: [] }),
      applyDesired: async () => {},
    },
  );
  const abort = new AbortController();
  const done = channel.run(abort.signal);
  cleanups.push(async () => {
    abort.abort();
    await done;
  });
  await expect.poll(() => channel.state).toBe("connected");
  const logger = new RecordingLogger();
  const samples: ReplicaLoadSample[] = [];
  const intervals: number[] = [];
  const reporter = new LoadReporter({
    sink: channel,
    samples: () => samples,
    logger,
    intervalMs: 500,
    onInterval: (ms) => intervals.push(ms),
  });
  cleanups.push(() => reporter.close());
  let now = 1_700_000_000_000;
  /** Sets replica `id`'s scraped load (undefined: the scrape failed; "gone": not ready). */
  const scrape = (id: string, load: EngineLoadSignals | undefined | "gone") => {
    const i = samples.findIndex((x) => x.replicaId === id);
    if (i >= 0) samples.splice(i, 1);
    now += 500;
    if (load !== "gone") samples.push({ replicaId: id, load, scrapedAtMs: now });
  };
  /** One scrape round's report, waited out. */
  const round = async () => {
    reporter.reportChanges();
    await reporter.idle();
  };
  /** What each accepted report carried: `id=running/waiting` or `id=?` for unknown load. */
  const sent = () =>
    svc.reports.map((r) =>
      r.replicas
        .map((x) => `${x.id}=${x.load === undefined ? "?" : `${x.load.running}/${x.load.waiting}`}`)
        .join(" "),
    );
  return { svc, clock, channel, reporter, logger, scrape, round, sent, intervals };
}

describe("LoadReporter with the control channel", () => {
  it("sends what changed since the last acknowledged report, and nothing when nothing did", async () => {
    const h = await connectedReporter();
    await h.round();
    expect(h.svc.reportCalls, "no load scraped yet: nothing to send").toBe(0);

    h.scrape("a", { running: 0, waiting: 0 });
    h.scrape("b", { running: 1, waiting: 0 });
    await h.round();
    await h.round();
    h.scrape("a", { running: 0, waiting: 0 }); // scraped again, same load
    await h.round();
    h.scrape("b", { running: 2, waiting: 1 });
    await h.round();
    h.scrape("a", undefined); // its scrape failed
    await h.round();
    h.scrape("b", "gone"); // not ready any more: the heartbeat says so
    await h.round();
    h.scrape("b", { running: 2, waiting: 1 }); // ready again: told afresh
    await h.round();

    expect(h.sent()).toEqual(["a=0/0 b=1/0", "b=2/1", "a=?", "b=2/1"]);
    expect(h.svc.reports.every((r) => r.nodeId === "node-1")).toBe(true);
    expect(h.svc.reports.map((r) => r.credential)).toEqual(Array(4).fill("node-credential-1"));
    expect(h.svc.reports[0]?.replicas[0]?.scrapedAtMs).toBe(1_700_000_000_500);
    expect(h.logger.lines).toEqual([]);
  });

  it("never has two reports in flight to a slow control plane, and sends the latest load after", async () => {
    const h = await connectedReporter();
    let release = () => {};
    h.svc.gate = new Promise((resolve) => {
      release = resolve;
    });
    h.scrape("a", { running: 1, waiting: 0 });
    h.reporter.reportChanges();
    await expect.poll(() => h.svc.inFlight).toBe(1);
    // Five rounds end while the first report hangs: each folds into one report after it.
    for (let running = 2; running <= 6; running++) {
      h.scrape("a", { running, waiting: 0 });
      h.reporter.reportChanges();
    }
    expect(h.svc.reportCalls).toBe(1);
    h.svc.gate = undefined;
    release();
    await h.reporter.idle();
    expect(h.svc.peakInFlight).toBe(1);
    expect(h.sent()).toEqual(["a=1/0", "a=6/0"]);
  });

  it("stops at Unimplemented until the channel registers again", async () => {
    const h = await connectedReporter();
    h.svc.mode = "unimplemented";
    h.scrape("a", { running: 1, waiting: 0 });
    await h.round();
    for (let running = 2; running <= 5; running++) {
      h.scrape("a", { running, waiting: 0 });
      await h.round();
    }
    expect(h.svc.reportCalls, "one try, then nothing until the next Register").toBe(1);
    expect(h.reporter.state).toBe("unsupported");
    expect(h.logger.lines).toEqual([
      {
        level: "warn",
        message:
          "load reporter active → unsupported: the control plane does not serve ReportLoad (an older version): engine load goes with heartbeats only until the agent registers again",
      },
    ]);

    // The control plane is upgraded and loses the node: the heartbeat re-registers.
    h.svc.mode = "serve";
    h.svc.revoke("node-1");
    h.clock.advance(INTERVAL);
    await expect.poll(() => h.svc.registers).toBe(2);
    await expect.poll(() => h.channel.state).toBe("connected");
    await h.round();
    expect(h.reporter.state).toBe("active");
    expect(h.sent()).toEqual(["a=5/0"]);
    expect(h.svc.reports[0]?.credential).toBe("node-credential-2");
  });

  it("logs a failure streak once, recovers, and leaves a refused credential to the heartbeat", async () => {
    const h = await connectedReporter();
    h.svc.mode = "unavailable";
    for (let running = 1; running <= 4; running++) {
      h.scrape("a", { running, waiting: 0 });
      await h.round();
    }
    expect(h.svc.reportCalls, "every round tries again").toBe(4);
    h.svc.mode = "serve";
    await h.round();
    expect(h.sent(), "the unacknowledged change goes with the next round").toEqual(["a=4/0"]);
    expect(h.logger.lines.map((l) => `${l.level} ${l.message} ${l.fields?.code ?? ""}`)).toEqual([
      "warn load report failed; engine load goes with heartbeats until reports go through again Unavailable",
      "info load reports go through again after 4 failed ",
    ]);

    // A revoked credential: the reporter says so once and never registers by itself.
    h.svc.revoke("node-1");
    h.scrape("a", { running: 7, waiting: 0 });
    await h.round();
    await h.round();
    expect(h.svc.registers).toBe(1);
    expect(h.logger.lines.at(-1)?.message).toBe(
      "the control plane refused a load report's credential; the heartbeat registers again, engine load goes with heartbeats meanwhile",
    );
    expect(h.logger.lines).toHaveLength(3);
    h.clock.advance(INTERVAL);
    await expect.poll(() => h.svc.registers).toBe(2);
    await expect.poll(() => h.channel.state).toBe("connected");
    await h.round();
    expect(h.sent()).toEqual(["a=4/0", "a=7/0"]);
    expect(h.svc.reports.at(-1)?.credential).toBe("node-credential-2");
  });

  it("sends nothing while the channel is not connected", async () => {
    const h = await connectedReporter();
    h.svc.down = true;
    h.clock.advance(INTERVAL);
    await expect.poll(() => h.channel.state).toBe("reconnecting");
    h.scrape("a", { running: 1, waiting: 0 });
    await h.round();
    expect(h.svc.reportCalls).toBe(0);
    expect(h.logger.lines, "the channel reports the outage, not the reporter").toEqual([]);
    // Back: the next heartbeat reconnects, and the next round sends the load.
    h.svc.down = false;
    h.clock.advance(4_000);
    await expect.poll(() => h.channel.state).toBe("connected");
    await h.round();
    expect(h.sent()).toEqual(["a=1/0"]);
  });

  it.each([
    [250, 250],
    [20, MIN_LOAD_INTERVAL_MS],
    [3_600_000, MAX_LOAD_INTERVAL_MS],
  ])(
    "follows a load interval of %i ms the control plane asks for as %i ms",
    async (asked, used) => {
      const h = await connectedReporter();
      h.svc.loadIntervalMs = asked;
      h.scrape("a", { running: 1, waiting: 0 });
      await h.round();
      h.scrape("a", { running: 2, waiting: 0 });
      await h.round();
      expect(h.intervals).toEqual([used]);
      expect(h.reporter.intervalMs).toBe(used);
      // 0 again: back to the agent's own.
      h.svc.loadIntervalMs = 0;
      h.scrape("a", { running: 3, waiting: 0 });
      await h.round();
      expect(h.intervals).toEqual([used, 500]);
    },
  );
});

/**
 * A stand-in engine (started by the agent's real supervisor with the sim adapter's flags):
 * `/metrics` shows vLLM's running and waiting gauges only (so KV usage and prefix hit rate
 * stay unreported), `/set?running=R&waiting=W` changes them, `/stats` counts scrapes.
 */
const settableEngine = `
const http = require("node:http");
const arg = (name) => process.argv[process.argv.indexOf(name) + 1];
let running = 0, waiting = 0, scrapes = 0;
http.createServer((req, res) => {
  const url = new URL(req.url, "http://x");
  if (url.pathname === "/set") {
    running = Number(url.searchParams.get("running"));
    waiting = Number(url.searchParams.get("waiting"));
    return res.end("ok");
  }
  if (url.pathname === "/stats") return res.end(JSON.stringify({ scrapes }));
  if (url.pathname !== "/metrics") { res.statusCode = 404; return res.end(); }
  scrapes++;
  res.end([
    "# TYPE vllm:num_requests_running gauge",
    'vllm:num_requests_running{engine="0",model_name="m"} ' + running,
    "# TYPE vllm:num_requests_waiting gauge",
    'vllm:num_requests_waiting{engine="0",model_name="m"} ' + waiting,
    "",
  ].join("\\n"));
}).listen(Number(arg("--port")), arg("--host"));
`;

describe("openLoadStream", () => {
  it("takes at most two reports the socket has not taken yet, and every one written arrives", async () => {
    let release = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const received: number[] = [];
    const routes = (router: ConnectRouter) =>
      router.service(AgentService, {
        async streamLoad(requests) {
          await gate; // a control plane that reads nothing yet
          for await (const req of requests) received.push(req.replicas[0]?.load?.running ?? -1);
          return create(StreamLoadResponseSchema, { loadIntervalMs: 0 });
        },
      });
    const client = createClient(AgentService, createRouterTransport(routes));
    const stream = openLoadStream(
      client,
      { nodeId: "node-1", credential: "c" },
      { timeoutMs: 5_000 },
    );
    const report = (running: number) => [
      create(ReplicaLoadReportSchema, {
        replicaId: "m-0",
        load: create(EngineLoadSchema, { running }),
        scrapedAtUnixMs: 1n,
      }),
    ];
    // The call takes the first message as it starts; then two may wait, a further one is refused.
    const taken = [1, 2, 3, 4, 5].map((n) => stream.write(report(n)));
    expect(taken.filter(Boolean).length).toBeLessThan(5);
    expect(taken.at(-1)).toBe(false);
    release();
    await expect.poll(() => received.length).toBe(taken.filter(Boolean).length);
    expect(stream.write(report(9))).toBe(true);
    await stream.end();
    expect(received).toEqual([...[1, 2, 3, 4, 5].filter((_, i) => taken[i]), 9]);
    expect(stream.write(report(10)), "ended").toBe(false);
  });
});

describe("LoadReporter over StreamLoad", () => {
  it("sends each round's changes as messages of one open stream, ended and opened again every load_stream_ms", async () => {
    const h = await connectedReporter({ loadStreamMs: 300 });
    expect(h.channel.loadStreamMs).toBe(300);
    h.scrape("a", { running: 1, waiting: 0 });
    h.scrape("b", { running: 0, waiting: 0 });
    h.reporter.reportChanges();
    await expect.poll(() => h.svc.reports.length).toBe(1);
    h.scrape("a", { running: 2, waiting: 1 });
    h.reporter.reportChanges();
    h.reporter.reportChanges(); // nothing changed since: nothing sent
    await expect.poll(() => h.svc.reports.length).toBe(2);
    expect([h.svc.streamsOpened, h.svc.reportCalls]).toEqual([1, 0]);
    // Ended by the reporter after load_stream_ms though no report came; the control plane
    // answered it, so what it carried stays acknowledged.
    await expect.poll(() => h.svc.streamsEnded, { timeout: 3_000 }).toBe(1);
    h.reporter.reportChanges();
    h.scrape("b", { running: 3, waiting: 0 });
    h.reporter.reportChanges();
    await expect.poll(() => h.svc.reports.length).toBe(3);
    expect(h.sent()).toEqual(["a=1/0 b=0/0", "a=2/1", "b=3/0"]);
    expect(h.svc.reports.map((r) => r.via)).toEqual(["stream", "stream", "stream"]);
    expect(h.svc.streamsOpened).toBe(2);
    expect(h.svc.reports.every((r) => r.credential === "node-credential-1")).toBe(true);
    expect(h.logger.lines).toEqual([]);
  });

  it("sends everything again on the next stream when one fails", async () => {
    const h = await connectedReporter({ loadStreamMs: 20_000 });
    h.svc.streamMode = "fail-after-first";
    h.scrape("a", { running: 1, waiting: 0 });
    h.reporter.reportChanges();
    await expect
      .poll(() => h.logger.lines.map((l) => `${l.level} ${l.message} ${l.fields?.code ?? ""}`))
      .toEqual([
        "warn load report failed; engine load goes with heartbeats until reports go through again Unavailable",
      ]);
    h.svc.streamMode = "serve";
    h.scrape("b", { running: 2, waiting: 0 });
    h.reporter.reportChanges();
    await expect.poll(() => h.svc.reports.length).toBe(2);
    expect(h.sent()).toEqual(["a=1/0", "a=1/0 b=2/0"]);
    expect([h.svc.streamsOpened, h.svc.reportCalls]).toEqual([2, 0]);
  });

  it("falls back to one ReportLoad call per report when StreamLoad is Unimplemented", async () => {
    const h = await connectedReporter({ loadStreamMs: 20_000 });
    h.svc.streamMode = "unimplemented";
    h.scrape("a", { running: 1, waiting: 0 });
    h.reporter.reportChanges();
    await expect.poll(() => h.logger.lines.length).toBe(1);
    expect(h.logger.lines[0]).toEqual({
      level: "warn",
      message:
        "the control plane does not serve StreamLoad: load reports go as one ReportLoad call each until the agent registers again",
    });
    await h.round();
    h.scrape("a", { running: 2, waiting: 0 });
    await h.round();
    expect(h.sent()).toEqual(["a=1/0", "a=2/0"]);
    expect(h.svc.reports.map((r) => r.via)).toEqual(["unary", "unary"]);
    expect(h.logger.lines).toHaveLength(1);
  });
});

describe("startAgent reports engine load between heartbeats", () => {
  it.each([
    ["one StreamLoad request", 20_000, "stream"],
    ["ReportLoad calls (streams off)", 0, "unary"],
  ] as const)(
    "gets a changed engine load to a real control-plane listener within the interval by %s",
    async (_name, loadStreamMs, via) => {
      const LOAD_INTERVAL = 500;
      const { svc, routes } = honestAgentService({
        loadStreamMs,
        // No heartbeat after the first during the test: load can only arrive as a load report.
        heartbeatIntervalMs: 600_000,
        assignments: [simReplicaAssignment()],
      });
      const server = createServer(connectNodeAdapter({ routes }));
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
      cleanups.push(() => new Promise<void>((resolve) => server.close(() => resolve())));
      server.unref();
      const port = (server.address() as AddressInfo).port;
      const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-load-report-"));
      cleanups.push(() => rmSync(stateDir, { recursive: true, force: true }));
      const agent: RunningAgent = await startAgent(
        parseAgentConfig({
          controlPlaneUrl: `http://127.0.0.1:${port}`,
          joinToken: JOIN,
          stateDir,
          simulate: "1xh100-80g",
          nodeName: "node-a",
          advertiseAddress: "127.0.0.1",
          probeIntervalMs: 50,
          loadScrapeIntervalMs: LOAD_INTERVAL,
          engines: { simCommand: [process.execPath, "-e", settableEngine, "--"] },
        }),
        {
          logger: silentLogger,
          // Readiness is not under test; the scrape is the agent's real one over HTTP.
          probes: { probe: async () => "ready", scrapeLoad: createEngineProbes().scrapeLoad },
          baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
          secretEnv: {},
          agentVersion: "test",
        },
      );
      cleanups.push(async () => {
        await agent.close({ stopEngines: true });
      });

      // The engine's first load (zeros are load; the fields it does not report stay unset).
      await expect.poll(() => svc.reports.length, { timeout: 15_000 }).toBe(1);
      expect(svc.reports[0]?.replicas).toEqual([
        { id: "m-0", load: { running: 0, waiting: 0 }, scrapedAtMs: expect.any(Number) },
      ]);
      expect(svc.heartbeats).toBe(1);
      const enginePort = agent.manager.statuses()[0]?.apiPort;
      const engine = async (pathAndQuery: string) =>
        (await fetch(`http://127.0.0.1:${enginePort}${pathAndQuery}`)).text();
      const scrapes = async () =>
        (JSON.parse(await engine("/stats")) as { scrapes: number }).scrapes;

      // Unchanged load: four more scrape rounds, no report.
      const before = await scrapes();
      await expect.poll(scrapes, { timeout: 10_000 }).toBeGreaterThanOrEqual(before + 4);
      expect(svc.reports).toHaveLength(1);

      // Changed load, several times: each reaches the control plane within the interval plus a
      // scrape, and leaves the agent right after its scrape.
      const engineToCp: number[] = [];
      const scrapeToCp: number[] = [];
      for (let i = 1; i <= 5; i++) {
        const changedAt = Date.now();
        await engine(`/set?running=${i}&waiting=${i - 1}`);
        await expect
          .poll(() => svc.reports.at(-1)?.replicas[0]?.load, { timeout: 5_000, interval: 5 })
          .toEqual({ running: i, waiting: i - 1 });
        const report = svc.reports.at(-1) as ReceivedReport;
        engineToCp.push(report.receivedAtMs - changedAt);
        scrapeToCp.push(report.receivedAtMs - (report.replicas[0]?.scrapedAtMs ?? 0));
      }
      expect(svc.reports).toHaveLength(6);
      expect(svc.reports.every((r) => r.via === via)).toBe(true);
      // Over a real HTTP/1.1 socket each message arrived as written, on one request.
      if (via === "stream") expect([svc.streamsOpened, svc.reportCalls]).toEqual([1, 0]);
      else expect(svc.peakInFlight).toBe(1);
      expect(Math.max(...engineToCp), `engine → control plane ms: ${engineToCp}`).toBeLessThan(
        1_000,
      );
      expect(Math.max(...scrapeToCp), `scrape → control plane ms: ${scrapeToCp}`).toBeLessThan(
        LOAD_INTERVAL / 2,
      );
      expect(svc.heartbeats, "it all went by ReportLoad").toBe(1);
    },
  );
});

describe("startAgent against the real control plane", () => {
  it("gets a changed engine load into the cluster's load by a load report, not by a heartbeat", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-load-report-cp-"));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const cp = await startControlPlane({
      dataDir: path.join(dir, "cp"),
      listen: "127.0.0.1:0",
      controlListen: "127.0.0.1:0",
      // After the first, no heartbeat within the test: load can only come by ReportLoad.
      heartbeatIntervalMs: 60_000,
    });
    cleanups.push(async () => {
      await cp.close();
    });
    // Placed at the agent's Register, so its first heartbeat already carries the replica.
    cp.cluster.applyDeployment(
      parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "sim" }),
    );
    const seen: (RoutedLoadSample & { atMs: number })[] = [];
    cp.cluster.onLoad((sample) => seen.push({ ...sample, atMs: Date.now() }));
    const logger = new RecordingLogger();
    const agent = await startAgent(
      parseAgentConfig({
        controlPlaneUrl: cp.controlUrl,
        joinToken: cp.joinToken,
        stateDir: path.join(dir, "agent"),
        simulate: "1xh100-80g",
        advertiseAddress: "127.0.0.1",
        probeIntervalMs: 50,
        engines: { simCommand: [process.execPath, "-e", settableEngine, "--"] },
      }),
      {
        logger,
        probes: { probe: async () => "ready", scrapeLoad: createEngineProbes().scrapeLoad },
        baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
        secretEnv: {},
        agentVersion: "test",
      },
    );
    cleanups.push(async () => {
      // Not a leave (heartbeats are a minute apart): the control plane goes too.
      await agent.close({ stopEngines: true, leaveTimeoutMs: 0 });
    });
    await expect
      .poll(() => seen.at(-1)?.load, { timeout: 15_000 })
      .toEqual({
        running: 0,
        waiting: 0,
      });
    const enginePort = agent.manager.statuses()[0]?.apiPort;
    const changedAt = Date.now();
    await fetch(`http://127.0.0.1:${enginePort}/set?running=4&waiting=2`);
    await expect
      .poll(() => seen.at(-1)?.load, { timeout: 5_000, interval: 5 })
      .toEqual({ running: 4, waiting: 2 });
    const sample = seen.at(-1) as RoutedLoadSample & { atMs: number };
    expect(sample.replicaId).toBe(agent.manager.statuses()[0]?.replicaId);
    expect(sample.atMs - changedAt, "engine → control plane ms").toBeLessThan(1_000);
    expect(logger.lines.filter((l) => l.level === "warn" && /load/.test(l.message))).toEqual([]);
  });
});
