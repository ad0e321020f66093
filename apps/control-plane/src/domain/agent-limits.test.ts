import { create } from "@bufbuild/protobuf";
import {
  GpuSchema,
  HeartbeatRequestSchema,
  NodeInventorySchema,
  RegisterRequestSchema,
  ReplicaStatusSchema,
} from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  AGENT_LIMITS,
  boundAgentRequest,
  gpuIndexProblem,
  loadWithinRange,
  portsWithinRange,
} from "./agent-limits.js";

const gpus = (n: number) =>
  Array.from({ length: n }, (_, i) => create(GpuSchema, { index: i, uuid: `GPU-${i}` }));

const register = (inventory: Parameters<typeof create<typeof NodeInventorySchema>>[1]) =>
  create(RegisterRequestSchema, {
    inventory: create(NodeInventorySchema, { hostname: "node-a", ...inventory }),
  });

describe("boundAgentRequest", () => {
  it.each([
    ["64 GPUs", register({ gpus: gpus(64) }), undefined],
    [
      "100,000 GPUs",
      register({ gpus: gpus(100_000) }),
      "RegisterRequest.inventory.gpus has 100000 entries; the limit is 64",
    ],
    [
      "a 254-character hostname",
      register({ hostname: "h".repeat(254) }),
      "RegisterRequest.inventory.hostname has 254 characters; the limit is 253",
    ],
    [
      "a release as its agent version",
      register({ agentVersion: "0.3.0-rc.1+g1a2b3c4" }),
      undefined,
    ],
    [
      "a 65-character agent version",
      register({ agentVersion: "9".repeat(65) }),
      "RegisterRequest.inventory.agentVersion has 65 characters; the limit is 64",
    ],
    [
      "an agent version with terminal escapes",
      register({ agentVersion: "9.9.9\u001b[2J\u001b[H" }),
      'RegisterRequest.inventory.agentVersion must be visible ASCII characters (no spaces or control characters), got "9.9.9\\u001b[2J\\u001b[H"',
    ],
    [
      "an agent version with a space",
      register({ agentVersion: "0.2.0 all good" }),
      'RegisterRequest.inventory.agentVersion must be visible ASCII characters (no spaces or control characters), got "0.2.0 all good"',
    ],
    [
      "a 300-character GPU name",
      register({ gpus: [create(GpuSchema, { name: "n".repeat(300) })] }),
      "RegisterRequest.inventory.gpus[0].name has 300 characters; the limit is 256",
    ],
    [
      "17 fabrics",
      register({ fabrics: Array.from({ length: 17 }, (_, i) => ({ id: `f${i}` })) }),
      "RegisterRequest.inventory.fabrics has 17 entries; the limit is 16",
    ],
    [
      "65 ports on a fabric",
      register({ fabrics: [{ id: "f", ports: Array.from({ length: 65 }, () => ({})) }] }),
      "RegisterRequest.inventory.fabrics[0].ports has 65 entries; the limit is 64",
    ],
    [
      "65 problems",
      register({ problems: Array.from({ length: 65 }, () => ({ code: "x" })) }),
      "RegisterRequest.inventory.problems has 65 entries; the limit is 64",
    ],
    [
      "129 replicas in a heartbeat",
      create(HeartbeatRequestSchema, {
        replicas: Array.from({ length: 129 }, () => create(ReplicaStatusSchema, {})),
      }),
      "HeartbeatRequest.replicas has 129 entries; the limit is 128",
    ],
    [
      "a heartbeat's session id drawn as a UUID",
      create(HeartbeatRequestSchema, {
        sessionId: "0b9e3f4c-6c1d-4f7e-9a55-2d1f0c8e7b63",
        sequence: 1n,
      }),
      undefined,
    ],
    [
      "a 65-character session id",
      create(HeartbeatRequestSchema, { sessionId: "s".repeat(65), sequence: 1n }),
      "HeartbeatRequest.sessionId has 65 characters; the limit is 64",
    ],
    [
      "65 GPU readings",
      create(HeartbeatRequestSchema, {
        gpus: Array.from({ length: 65 }, (_, i) => ({ index: i })),
      }),
      "HeartbeatRequest.gpus has 65 entries; the limit is 64",
    ],
    [
      "a reading of 2^64 - 1 bytes",
      create(HeartbeatRequestSchema, {
        gpus: [{ index: 0, memoryUsedBytes: 2n ** 64n - 1n }],
      }),
      "HeartbeatRequest.gpus[0].memoryUsedBytes is 18446744073709551615; the control plane keeps 64-bit values as numbers, exact up to 9007199254740991 either way",
    ],
    [
      "a rank status time past 2^53",
      create(HeartbeatRequestSchema, {
        replicas: [create(ReplicaStatusSchema, { replicaId: "r", stateSinceUnixMs: 2n ** 53n })],
      }),
      "HeartbeatRequest.replicas[0].stateSinceUnixMs is 9007199254740992; the control plane keeps 64-bit values as numbers, exact up to 9007199254740991 either way",
    ],
    [
      "a registered GPU's memory of 2^53 - 1 bytes (exact)",
      register({ gpus: [create(GpuSchema, { index: 0, memoryTotalBytes: 2n ** 53n - 1n })] }),
      undefined,
    ],
  ])("%s", (_name, request, refusal) => {
    const root =
      request.$typeName === "llmgw.v1.RegisterRequest" ? "RegisterRequest" : "HeartbeatRequest";
    const run = () => boundAgentRequest(root, request);
    if (refusal === undefined) expect(run).not.toThrow();
    else
      expect(run).toThrow(
        expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", message: refusal }),
      );
  });

  it("truncates free text with a marker instead of refusing it", () => {
    const request = create(HeartbeatRequestSchema, {
      problems: [{ code: "disk", message: "m".repeat(5_000) }],
      replicas: [
        create(ReplicaStatusSchema, {
          message: "ok",
          logTail: Array.from({ length: 100 }, (_, i) =>
            i === 99 ? "x".repeat(600) : `line ${i}`,
          ),
        }),
      ],
    });
    boundAgentRequest("HeartbeatRequest", request);
    expect(request.problems[0]?.message).toBe(`${"m".repeat(1_024)}… [3976 more characters]`);
    const tail = request.replicas[0]?.logTail ?? [];
    expect(tail).toHaveLength(AGENT_LIMITS.items["replicas.logTail"] as number);
    expect(tail[0]).toBe("[… 61 earlier lines dropped]");
    expect(tail[1]).toBe("line 61");
    expect(tail.at(-1)).toBe(`${"x".repeat(512)}… [88 more characters]`);
    expect(request.replicas[0]?.message).toBe("ok");
  });
});

describe("boundAgentRequest: faults and ports (issue 20)", () => {
  // Evidence verbatim from shared/reference/health-formats.md §1.3.
  const XID79 = "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.";
  const fault = (extra: Record<string, unknown> = {}) => ({
    kind: "xid",
    code: 79,
    action: "reset-gpu",
    pciBusId: "00000000:06:00.0",
    count: 1,
    firstSeenUnixMs: 1_000n,
    lastSeenUnixMs: 2_000n,
    evidence: XID79,
    ...extra,
  });
  const beat = (init: Parameters<typeof create<typeof HeartbeatRequestSchema>>[1]) =>
    create(HeartbeatRequestSchema, init);
  const port = (extra: Record<string, unknown> = {}) => ({ device: "mlx5_0", port: 1, ...extra });

  it.each([
    [
      "64 faults on a GPU",
      beat({ gpus: [{ faults: Array.from({ length: 64 }, () => fault()) }] }),
      undefined,
    ],
    [
      "65 faults on a GPU",
      beat({ gpus: [{ faults: Array.from({ length: 65 }, () => fault()) }] }),
      "HeartbeatRequest.gpus[0].faults has 65 entries; the limit is 64",
    ],
    [
      "65 faults on a registered GPU",
      register({
        gpus: [create(GpuSchema, { faults: Array.from({ length: 65 }, () => fault()) })],
      }),
      "RegisterRequest.inventory.gpus[0].faults has 65 entries; the limit is 64",
    ],
    [
      "a 300-character fault kind",
      beat({ gpus: [{ faults: [fault({ kind: "k".repeat(300) })] }] }),
      "HeartbeatRequest.gpus[0].faults[0].kind has 300 characters; the limit is 256",
    ],
    [
      "a fault without a device",
      beat({ gpus: [{ faults: [fault({ pciBusId: "" })] }] }),
      "HeartbeatRequest.gpus[0].faults[0].pciBusId is required",
    ],
    [
      "a fault whose last sighting precedes its first",
      beat({ gpus: [{ faults: [fault({ lastSeenUnixMs: 999n })] }] }),
      "HeartbeatRequest.gpus[0].faults[0] has firstSeenUnixMs 1000 and lastSeenUnixMs 999; times must be ≥ 0 and not run backwards",
    ],
    [
      "an action a newer agent knows",
      beat({ gpus: [{ faults: [fault({ action: "replace-board" })] }] }),
      undefined,
    ],
    ["192 ports", beat({ ports: Array.from({ length: 192 }, () => port()) }), undefined],
    [
      "193 ports",
      beat({ ports: Array.from({ length: 193 }, () => port()) }),
      "HeartbeatRequest.ports has 193 entries; the limit is 192",
    ],
    [
      "33 counters on a port",
      beat({
        ports: [
          port({
            health: { healthy: true, counters: Array.from({ length: 33 }, () => ({ name: "c" })) },
          }),
        ],
      }),
      "HeartbeatRequest.ports[0].health.counters has 33 entries; the limit is 32",
    ],
    [
      "17 problems on a port",
      beat({
        ports: [
          port({
            health: { healthy: false, problems: Array.from({ length: 17 }, () => ({ code: "x" })) },
          }),
        ],
      }),
      "HeartbeatRequest.ports[0].health.problems has 17 entries; the limit is 16",
    ],
    [
      "a 300-character port device",
      beat({ ports: [port({ device: "d".repeat(300) })] }),
      "HeartbeatRequest.ports[0].device has 300 characters; the limit is 256",
    ],
  ])("%s", (_name, request, refusal) => {
    const root =
      request.$typeName === "llmgw.v1.RegisterRequest" ? "RegisterRequest" : "HeartbeatRequest";
    const run = () => boundAgentRequest(root, request);
    if (refusal === undefined) expect(run).not.toThrow();
    else
      expect(run).toThrow(
        expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", message: refusal }),
      );
  });

  it("truncates a long evidence line, description or port problem with a marker", () => {
    const request = beat({
      gpus: [{ faults: [fault({ evidence: "e".repeat(2_000), description: "d".repeat(300) })] }],
      ports: [
        port({ health: { healthy: false, problems: [{ code: "p", message: "m".repeat(1_100) }] } }),
      ],
    });
    boundAgentRequest("HeartbeatRequest", request);
    const f = request.gpus[0]?.faults[0];
    expect(f?.evidence).toBe(`${"e".repeat(1_024)}… [976 more characters]`);
    expect(f?.description).toBe(`${"d".repeat(256)}… [44 more characters]`);
    expect(request.ports[0]?.health?.problems[0]?.message).toBe(
      `${"m".repeat(1_024)}… [76 more characters]`,
    );
  });
});

describe("loadWithinRange", () => {
  it.each([
    ["in range", { running: 3, waiting: 0, kvCacheUsage: 1, prefixCacheHitRate: 0 }, [], []],
    ["nothing reported", {}, [], []],
    [
      "an engine's raw KV usage over 1 and a negative queue",
      { running: -3, waiting: 2, kvCacheUsage: 1.02 },
      ["running", "kvCacheUsage"],
      ["running=-3", "kvCacheUsage=1.02"],
    ],
    [
      "NaN, infinity and a queue over the limit",
      {
        running: Number.NaN,
        waiting: AGENT_LIMITS.maxQueuedRequests + 1,
        prefixCacheHitRate: Number.POSITIVE_INFINITY,
      },
      ["running", "waiting", "prefixCacheHitRate"],
      ["running=NaN", "waiting=1000001", "prefixCacheHitRate=Infinity"],
    ],
    [
      "a negative hit rate",
      { prefixCacheHitRate: -0.1 },
      ["prefixCacheHitRate"],
      ["prefixCacheHitRate=-0.1"],
    ],
  ])("%s", (_name, load, gone, dropped) => {
    const out = loadWithinRange(load);
    expect(out.dropped).toEqual(dropped);
    const kept = { ...load } as Record<string, number>;
    for (const f of gone) delete kept[f];
    // Left out means unreported (absent), never 0.
    expect(out.load).toEqual(kept);
    for (const f of gone) expect(out.load).not.toHaveProperty(f);
    if (gone.length === 0) expect(out.load).toBe(load);
  });
});

describe("gpuIndexProblem", () => {
  it.each<[string, number[], string | undefined]>([
    ["distinct indices", [0, 1, 7], undefined],
    ["none", [], undefined],
    ["the largest index", [AGENT_LIMITS.maxGpuIndex], undefined],
    [
      "a repeat",
      [0, 1, 1],
      "gpus[2].index is 1, the same as gpus[1].index; each GPU needs its own index",
    ],
    ["a negative index", [-1], "gpus[0].index is -1; it must be a whole number within [0, 1023]"],
    ["a fraction", [0.5], "gpus[0].index is 0.5; it must be a whole number within [0, 1023]"],
    [
      "an index past any host",
      [0, 1024],
      "gpus[1].index is 1024; it must be a whole number within [0, 1023]",
    ],
  ])("%s", (_name, indices, problem) => {
    expect(
      gpuIndexProblem(
        indices.map((index) => ({ index })),
        "gpus",
      ),
    ).toBe(problem);
  });
});

describe("portsWithinRange", () => {
  it.each<
    [
      string,
      { apiPort?: number; kvEventsPort?: number },
      { apiPort?: number; kvEventsPort?: number },
    ]
  >([
    ["both in range", { apiPort: 1, kvEventsPort: 65_535 }, { apiPort: 1, kvEventsPort: 65_535 }],
    ["none reported", {}, {}],
    ["a zero API port", { apiPort: 0, kvEventsPort: 9000 }, { kvEventsPort: 9000 }],
    ["a uint32 API port", { apiPort: 4_000_000_000 }, {}],
    ["a KV events port past 65535", { apiPort: 8000, kvEventsPort: 65_536 }, { apiPort: 8000 }],
  ])("%s", (_name, status, kept) => {
    const out = portsWithinRange({ replicaId: "chat-0", ...status });
    // Left out means unset (absent), never 0.
    expect(out).toEqual({ replicaId: "chat-0", ...kept });
    if (!("apiPort" in kept)) expect(out).not.toHaveProperty("apiPort");
    if (!("kvEventsPort" in kept)) expect(out).not.toHaveProperty("kvEventsPort");
  });
});
