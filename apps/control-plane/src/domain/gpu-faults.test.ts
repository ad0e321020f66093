import {
  type Gpu,
  type GpuFault,
  type NodeInventory,
  type Port,
  simulateInventory,
} from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { schedule } from "@llmgw/scheduler";
import { gpuFaultKey } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import type { ClusterStore } from "../store/types.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { gpuReading, rankStatus } from "../testing/reports.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { Cluster } from "./cluster.js";
import { GpuFaults } from "./gpu-faults.js";

/** The replicas routers would route `model` to, from the routing membership. */
function routesOf(cluster: Cluster) {
  return {
    resolve: (model: string) => ({
      replicas: cluster.routingMembership().replicas.filter((r) => r.model === model),
    }),
  };
}

let store: ClusterStore;
let clock: ManualClock;
/** Deferred reconciles are held here and never run unless a test runs them. */
let deferred: (() => void)[];

function newCluster(): Cluster {
  return new Cluster({
    store,
    schedule,
    clock,
    heartbeatIntervalMs: 1_000,
    unreachableAfterMs: 3_000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
    defer: (run) => deferred.push(run),
  });
}

sqliteStoreEachTest("llmgw-faults-", (f) => {
  ({ store, clock } = f);
  deferred = [];
});

function join_(cluster: Cluster, hostname: string, sim: string, address: string) {
  const inventory = simulateInventory(sim, { hostname, addresses: [address], nowMs: clock.now() });
  const { nodeId } = cluster.register({ inventory, advertiseAddress: address, replicas: [] });
  for (const run of deferred.splice(0)) run();
  return { nodeId, inventory };
}

// Evidence verbatim from shared/reference/health-formats.md §1.3; the simulated GPU 0 sits
// on bus 01 (simulate.ts), so the Xid 31 line of an old driver naming PCI:0000:01:00 fits.
const XID79 = "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.";
const XID31 =
  "NVRM: Xid (PCI:0000:01:00): 31, Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ";

const fault = (extra: Partial<GpuFault> = {}): GpuFault => ({
  kind: "xid",
  code: 79,
  action: "reset-gpu",
  pciBusId: "00000000:01:00.0",
  count: 1,
  firstSeenUnixMs: 1_000,
  lastSeenUnixMs: 1_000,
  evidence: XID79,
  description: "GPU has fallen off the bus",
  ...extra,
});

const deploy = (cluster: Cluster, input: Record<string, unknown>) =>
  cluster.applyDeployment(
    parseDeploymentSpecOrThrow({
      engine: "vllm",
      model: "org/model",
      gpuClass: "h100-80g",
      ...input,
    }),
  );

function beat(
  cluster: Cluster,
  node: { nodeId: string; inventory: NodeInventory },
  opts: { faults?: GpuFault[]; ports?: Port[]; ready?: string[] } = {},
) {
  const gpu = node.inventory.gpus[0];
  return cluster.heartbeat(node.nodeId, {
    gpus: [
      gpuReading({
        index: 0,
        uuid: gpu?.uuid ?? "",
        healthy: (opts.faults ?? []).length === 0,
        healthProblems:
          (opts.faults ?? []).length === 0
            ? []
            : [
                {
                  code: "LLMGW_DISCOVERY_GPU_FAULT",
                  message: "kernel-log fault",
                  source: "kernel-log",
                },
              ],
        faults: opts.faults ?? [],
      }),
    ],
    replicas: (opts.ready ?? []).map((replicaId, i) =>
      rankStatus({
        replicaId,
        rank: 0,
        state: "ready",
        apiPort: 41_000 + i,
      }),
    ),
    problems: [],
    ports: opts.ports,
  });
}

const kinds = (cluster: Cluster) => cluster.events.list({ limit: 1_000 }).map((e) => e.kind);
const placedOn = (cluster: Cluster) =>
  cluster.placements().map((p) => `${p.replicaId}@${p.ranks.map((r) => r.nodeId).join("+")}`);

describe("fail closed on kernel-log faults", () => {
  it("drains a replica off a faulted GPU in the heartbeat itself, and stops routing to it at once", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    const b = join_(cluster, "node-b", "1xh100-80g", "10.0.0.2");
    deploy(cluster, { name: "chat", servedModelName: "org/chat" });
    const [placed] = cluster.placements();
    const onA = placed?.ranks[0]?.nodeId === a.nodeId;
    const [serving, spare] = onA ? [a, b] : [b, a];
    beat(cluster, serving, { ready: ["chat-0"] });
    const table = routesOf(cluster);
    expect(table.resolve("org/chat").replicas.map((r) => r.id)).toEqual(["chat-0"]);

    const started = performance.now();
    const answer = beat(cluster, serving, { faults: [fault()], ready: ["chat-0"] });
    const elapsedMs = performance.now() - started;
    // No deferred reconcile ran, no tick: the heartbeat alone did it.
    expect(deferred).toHaveLength(0);
    expect(table.resolve("org/chat").replicas).toEqual([]);
    expect(answer.assignments).toEqual([]);
    // A replacement never takes the id of the replica it replaces (the scheduler's rule).
    expect(placedOn(cluster)).toEqual([`chat-1@${spare.nodeId}`]);
    expect(elapsedMs).toBeLessThan(1_000);
    const removed = cluster.events.list({ limit: 1_000 }).find((e) => e.kind === "replica.removed");
    expect(removed?.message).toBe(`GPU 0 on node ${serving.nodeId} is unhealthy`);
    const health = cluster.events.list({ limit: 1_000 }).find((e) => e.kind === "gpu.health");
    expect(health?.message).toBe(
      `GPU 0 on ${serving.inventory.hostname} is now unhealthy: Xid 79 (reset-gpu): GPU has fallen off the bus; evidence: ${XID79}`,
    );
  });

  it("announces each fault once per GPU, and an ignorable one without acting on it", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    const xid31 = fault({ code: 31, action: "ignore", evidence: XID31, description: "MMU fault" });
    beat(cluster, a, { faults: [xid31] });
    beat(cluster, a, { faults: [{ ...xid31, count: 5, lastSeenUnixMs: 9_000 }] });
    const faults = cluster.events.list({ limit: 1_000 }).filter((e) => e.kind === "gpu.fault");
    expect(faults.map((e) => [e.severity, e.message])).toEqual([
      ["info", `GPU 0 on node-a: Xid 31 (ignore), 1 record, MMU fault; evidence: ${XID31}`],
    ]);
    expect(cluster.getNode(a.nodeId).gpuReadings[0]?.healthy).toBe(true);
    expect(kinds(cluster)).not.toContain("gpu.health");
    const [snapshot] = cluster.nodeSnapshots();
    expect(snapshot?.faultTallies).toEqual([
      { gpu: 0, code: 31, kind: "xid", action: "ignore", count: 1 },
    ]);
  });

  it("escapes an evidence line's control characters in the event", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    beat(cluster, a, {
      faults: [fault({ evidence: `${XID79}\nforged 2026 error node.lost x: y` })],
    });
    const event = cluster.events.list({ limit: 1_000 }).find((e) => e.kind === "gpu.fault");
    expect(event?.message).not.toContain("\n");
    expect(event?.message).toContain(`${XID79}\\nforged`);
  });

  it("serves again after an operator's clear, across a restart, until a later record", () => {
    let cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    deploy(cluster, { name: "chat" });
    beat(cluster, a, { faults: [fault()] });
    expect(cluster.placements()).toEqual([]);
    expect(cluster.unschedulableReasons("chat")[0]?.code).toBe("no-gpu-class");

    expect(cluster.clearGpuFaults("node-a", 0)).toBe(1);
    expect(placedOn(cluster)).toEqual([`chat-0@${a.nodeId}`]);
    const cleared = cluster.events
      .list({ limit: 1_000 })
      .find((e) => e.kind === "gpu.fault_cleared");
    expect(cleared?.message).toBe(
      `GPU 0 (${a.inventory.gpus[0]?.uuid}) on node-a: 1 fault cleared by an operator (Xid 79); a record seen after this counts again`,
    );
    // The same record again (the agent still holds it) does not count, nor is it news.
    beat(cluster, a, { faults: [fault()] });
    expect(placedOn(cluster)).toEqual([`chat-0@${a.nodeId}`]);
    expect(cluster.getNode(a.nodeId).gpuReadings[0]?.faults).toEqual([]);
    expect(kinds(cluster).filter((k) => k === "gpu.fault")).toHaveLength(1);
    // Clearing again: nothing was counting.
    expect(cluster.clearGpuFaults(a.nodeId, 0)).toBe(0);

    // A restarted control plane remembers the clear.
    cluster = newCluster();
    beat(cluster, a, { faults: [fault()] });
    expect(cluster.getNode(a.nodeId).gpuReadings[0]?.healthy).toBe(true);
    expect(placedOn(cluster)).toEqual([`chat-0@${a.nodeId}`]);

    // A later record is a new fault: out again, however long after the clear. Never by time.
    clock.advance(24 * 3_600_000);
    beat(cluster, a, { faults: [fault({ count: 2, lastSeenUnixMs: 1_001 })] });
    expect(cluster.placements()).toEqual([]);
    expect(cluster.getNode(a.nodeId).gpuReadings[0]?.healthy).toBe(false);
    clock.advance(7 * 24 * 3_600_000);
    beat(cluster, a, { faults: [fault({ count: 2, lastSeenUnixMs: 1_001 })] });
    expect(cluster.placements()).toEqual([]);
  });

  it("a reboot is observed: the fault vanishes from the new boot's log and the GPU serves", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    deploy(cluster, { name: "chat" });
    beat(cluster, a, { faults: [fault()] });
    expect(cluster.placements()).toEqual([]);
    beat(cluster, a, { faults: [] });
    expect(placedOn(cluster)).toEqual([`chat-0@${a.nodeId}`]);
  });

  it("keeps a GPU out when the clear leaves another problem, and says so", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.heartbeat(a.nodeId, {
      gpus: [
        gpuReading({
          index: 0,
          uuid: a.inventory.gpus[0]?.uuid ?? "",
          healthy: false,
          healthProblems: [
            {
              code: "LLMGW_DISCOVERY_GPU_ROW_REMAP_FAILURE",
              message: "a row could not be remapped",
              source: "",
            },
          ],
          faults: [fault()],
        }),
      ],
      replicas: [],
      problems: [],
    });
    expect(cluster.clearGpuFaults("node-a", 0)).toBe(1);
    const cleared = cluster.events
      .list({ limit: 1_000 })
      .find((e) => e.kind === "gpu.fault_cleared");
    expect(cleared?.message).toMatch(/; it stays unhealthy: a row could not be remapped$/);
    expect(cluster.getNode(a.nodeId).gpuReadings[0]?.healthy).toBe(false);
  });

  it.each([
    ["an unknown node", "node-x", 0, "no node with id or hostname \"node-x\"; see 'llmgw nodes'"],
    [
      "an unknown GPU",
      "node-a",
      7,
      /^node node-a-[0-9a-f]{6} \(node-a\) has no GPU 7; its GPUs: 0$/,
    ],
  ])("refuses to clear %s", (_name, node, gpu, message) => {
    const cluster = newCluster();
    join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    expect(() => cluster.clearGpuFaults(node, gpu)).toThrow(
      expect.objectContaining({
        code: "LLMGW_CONTROL_PLANE_NOT_FOUND",
        message: typeof message === "string" ? message : expect.stringMatching(message),
      }),
    );
  });
});

describe("port health", () => {
  const port = (
    device: string,
    healthy: boolean,
    problem = "port left ACTIVE 4 times in 600 s",
  ): Port => ({
    device,
    port: 1,
    linkLayer: "infiniband",
    state: "ACTIVE",
    physState: "LinkUp",
    health: {
      healthy,
      flaps: healthy ? 0 : 4,
      flapWindowS: 600,
      problems: healthy
        ? []
        : [{ code: "LLMGW_DISCOVERY_PORT_FLAPPING", message: problem, source: "sysfs" }],
      counters: [],
    },
  });

  it("takes multi-node replicas off a node whose port on their fabric flaps, not single-node ones", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g@ib-a", "10.0.0.1");
    const b = join_(cluster, "node-b", "1xh100-80g@ib-a", "10.0.0.2");
    const c = join_(cluster, "node-c", "2xh100-80g@ib-a", "10.0.0.3");
    deploy(cluster, { name: "big", engine: "sim", tensorParallel: 2, nodesPerReplica: 2 });
    deploy(cluster, { name: "small", engine: "sim" });
    const big = () => cluster.placements().find((p) => p.deployment === "big");
    const small = () => cluster.placements().find((p) => p.deployment === "small");
    const bigNodes = big()?.ranks.map((r) => r.nodeId) ?? [];
    expect(bigNodes).toHaveLength(2);
    const victim = [a, b, c].find((n) => n.nodeId === bigNodes[0]) as typeof a;
    const smallBefore = small()?.replicaId;

    beat(cluster, victim, { ports: [port("mlx5_0", false)] });
    expect(deferred).toHaveLength(0);
    const removed = cluster.events
      .list({ limit: 1_000 })
      .filter((e) => e.kind === "replica.removed")
      .map((e) => e.message);
    expect(removed).toEqual([
      `node ${victim.nodeId} (rank 0): port mlx5_0/1 on fabric ib-a is unhealthy: port left ACTIVE 4 times in 600 s`,
    ]);
    // Re-placed on the two other nodes; nothing new lands on the victim over ib-a.
    expect(big()?.ranks.map((r) => r.nodeId)).not.toContain(victim.nodeId);
    expect(big()?.fabricId).toBe("ib-a");
    expect(small()?.replicaId).toBe(smallBefore);
    const ev = cluster.events.list({ limit: 1_000 }).find((e) => e.kind === "port.health");
    expect(ev?.message).toBe(
      `port mlx5_0/1 (fabric ib-a) on ${victim.inventory.hostname} is now unhealthy: port left ACTIVE 4 times in 600 s`,
    );

    // Healthy again: one event; the node may take gangs again (nothing moves by itself).
    beat(cluster, victim, { ports: [port("mlx5_0", true)] });
    expect(kinds(cluster).filter((k) => k === "port.health")).toHaveLength(2);
    const [snapshot] = cluster.nodeSnapshots().filter((n) => n.id === victim.nodeId);
    expect(snapshot?.ports).toEqual([
      { device: "mlx5_0", port: 1, fabrics: ["ib-a"], healthy: true },
    ]);
  });

  it("a fabric port that is DOWN (with calm counters) or no longer listed takes gangs off the node", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "2xh100-80g@ib-a", "10.0.0.1");
    join_(cluster, "node-b", "2xh100-80g@ib-a", "10.0.0.2");
    deploy(cluster, { name: "big", engine: "sim", tensorParallel: 2, nodesPerReplica: 2 });
    const big = () => cluster.placements().find((p) => p.deployment === "big");
    const onA = () => big()?.ranks.some((r) => r.nodeId === a.nodeId) ?? false;
    // Two nodes for a two-node gang: it is on node-a. A third node gives it somewhere to go.
    expect(onA()).toBe(true);
    join_(cluster, "node-c", "2xh100-80g@ib-a", "10.0.0.3");
    // A port that went down and stayed down never flaps: its monitor says healthy.
    const down: Port = {
      device: "mlx5_0",
      port: 1,
      linkLayer: "infiniband",
      state: "DOWN",
      physState: "Polling",
      health: { healthy: true, flaps: 0, flapWindowS: 600, problems: [], counters: [] },
    };
    beat(cluster, a, { ports: [down, port("mlx5_1", true)] });
    const [snapshot] = cluster.nodeSnapshots().filter((n) => n.id === a.nodeId);
    expect(snapshot?.ports.find((p) => p.device === "mlx5_0")).toEqual({
      device: "mlx5_0",
      port: 1,
      fabrics: ["ib-a"],
      healthy: false,
      problem: "port is DOWN/Polling (ACTIVE when the node registered)",
    });
    expect(onA()).toBe(false);
    expect(big()?.ranks).toHaveLength(2);
    // Back up, but now mlx5_1 is missing from the list: still not usable for gangs.
    beat(cluster, a, { ports: [port("mlx5_0", true)] });
    const [again] = cluster.nodeSnapshots().filter((n) => n.id === a.nodeId);
    expect(again?.ports.find((p) => p.device === "mlx5_1")).toMatchObject({
      healthy: false,
      problem: "port not reported by the agent (device gone, or its sysfs unreadable)",
    });
    expect(onA()).toBe(false);
  });

  it("says nothing about a port first reported healthy, and keeps the registered ports without a report", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g@ib-a", "10.0.0.1");
    beat(cluster, a, { ports: [port("mlx5_0", true)] });
    beat(cluster, a, {});
    expect(kinds(cluster)).not.toContain("port.health");
    expect(cluster.nodeSnapshots()[0]?.ports[0]?.healthy).toBe(true);
  });
});

describe("a node-wide fault", () => {
  it("is cleared on every GPU of the node by one gpu clear, and a GPU-scoped one only on its GPU", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    const gpus = a.inventory.gpus;
    // Xid 79 says reboot: the agent attaches it to both GPUs. An Xid 48 (reset-gpu) sits on GPU 1.
    const xid79 = fault({ action: "reboot" });
    const xid48 = fault({
      code: 48,
      action: "reset-gpu",
      pciBusId: "00000000:02:00.0",
      description: "Double Bit ECC Error",
    });
    const reading = (index: number, faults: GpuFault[]) =>
      gpuReading({
        index,
        uuid: gpus[index]?.uuid ?? "",
        healthy: false,
        healthProblems: [
          { code: "LLMGW_DISCOVERY_GPU_FAULT", message: "kernel-log fault", source: "kernel-log" },
        ],
        faults,
      });
    cluster.heartbeat(a.nodeId, {
      gpus: [reading(0, [xid79]), reading(1, [xid79, xid48])],
      replicas: [],
      problems: [],
    });
    const healthy = () => cluster.getNode(a.nodeId).gpuReadings.map((g) => g.healthy);
    expect(healthy()).toEqual([false, false]);

    expect(cluster.clearGpuFaults("node-a", 0)).toBe(1);
    // GPU 0 is back; GPU 1 lost its Xid 79 too but keeps its own Xid 48.
    expect(healthy()).toEqual([true, false]);
    const cleared = cluster.events
      .list({ limit: 100 })
      .filter((e) => e.kind === "gpu.fault_cleared");
    expect(cleared.at(-1)?.message).toContain("(also on GPU 1)");
    expect(cluster.clearGpuFaults("node-a", 1)).toBe(1);
    expect(healthy()).toEqual([true, true]);
  });
});

describe("a replica that reuses a freed replica id on the same node", () => {
  it("is not ready, nor routed to, on the word of the engine being stopped", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    deploy(cluster, { name: "chat", servedModelName: "org/chat" });
    const table = routesOf(cluster);
    const gpuOf = () => cluster.placements()[0]?.ranks[0]?.gpuIndices[0];
    const first = gpuOf();
    expect(first).toBeDefined();
    const status = (pid: number, port: number, replicaId = "chat-0") =>
      rankStatus({
        replicaId,
        rank: 0,
        state: "ready",
        pid,
        apiPort: port,
        startedAtMs: pid * 1_000,
      });
    const heartbeat = (faulted: number | undefined, replicas: ReturnType<typeof status>[]) =>
      cluster.heartbeat(a.nodeId, {
        gpus: a.inventory.gpus.map((g) =>
          gpuReading({
            index: g.index,
            uuid: g.uuid,
            healthy: g.index !== faulted,
            healthProblems:
              g.index === faulted
                ? [{ code: "LLMGW_DISCOVERY_GPU_FAULT", message: "Xid 48", source: "kernel-log" }]
                : [],
            faults:
              g.index === faulted
                ? [fault({ code: 48, pciBusId: g.pciBusId, description: "Double Bit ECC Error" })]
                : [],
          }),
        ),
        replicas,
        problems: [],
      });
    heartbeat(undefined, [status(100, 41_000)]);
    expect(table.resolve("org/chat").replicas.map((r) => r.baseUrl)).toEqual([
      "http://10.0.0.1:41000",
    ]);

    // GPU `first` faults: chat-0 goes, chat-1 takes the node's other GPU. The fault is
    // cleared and the deployment scaled up: chat-0's id is free again and is placed back on
    // `first`, while the agent still reports the old engine (pid 100) as READY until it has
    // stopped it.
    const other = first === 0 ? 1 : 0;
    heartbeat(first, [status(100, 41_000), status(300, 41_002, "chat-1")]);
    expect(cluster.placements().map((p) => [p.replicaId, p.ranks[0]?.gpuIndices[0]])).toEqual([
      ["chat-1", other],
    ]);
    expect(cluster.clearGpuFaults("node-a", first as number)).toBe(1);
    heartbeat(undefined, [status(100, 41_000), status(300, 41_002, "chat-1")]);
    cluster.scaleDeployment("chat", 2);
    const placed = cluster.placements().map((p) => [p.replicaId, p.ranks[0]?.gpuIndices[0]]);
    expect(placed.sort()).toEqual([
      ["chat-0", first],
      ["chat-1", other],
    ]);
    heartbeat(undefined, [status(100, 41_000), status(300, 41_002, "chat-1")]);
    expect(table.resolve("org/chat").replicas.map((r) => r.baseUrl)).toEqual([
      "http://10.0.0.1:41002",
    ]);
    expect(cluster.listReplicas().find((r) => r.replicaId === "chat-0")?.state).not.toBe("ready");

    // The new engine (pid 200) is READY on its own port: that one is routed to.
    heartbeat(undefined, [status(200, 41_001), status(300, 41_002, "chat-1")]);
    expect(table.resolve("org/chat").replicas.map((r) => r.baseUrl)).toEqual([
      "http://10.0.0.1:41001",
      "http://10.0.0.1:41002",
    ]);
  });

  it("is routable again when it comes back unchanged and the agent, having applied that set, keeps its engine", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    deploy(cluster, { name: "chat", servedModelName: "org/chat" });
    const table = routesOf(cluster);
    const gpu0 = a.inventory.gpus[0]!;
    const ready = rankStatus({
      replicaId: "chat-0",
      rank: 0,
      state: "ready",
      pid: 100,
      apiPort: 41_000,
      startedAtMs: 100_000,
    });
    const reading = (faulted: boolean) =>
      gpuReading({
        index: 0,
        uuid: gpu0.uuid,
        healthy: !faulted,
        healthProblems: faulted
          ? [{ code: "LLMGW_DISCOVERY_GPU_FAULT", message: "Xid 48", source: "kernel-log" }]
          : [],
        faults: faulted ? [fault({ code: 48, pciBusId: gpu0.pciBusId })] : [],
      });
    let applied = cluster.heartbeat(a.nodeId, {
      gpus: [reading(false)],
      replicas: [ready],
      problems: [],
    }).generation;
    // The fault removes chat-0 (no other GPU); an operator's clear brings it back, unchanged,
    // before the agent heard of either: it never stopped pid 100.
    cluster.heartbeat(a.nodeId, {
      gpus: [reading(true)],
      replicas: [ready],
      problems: [],
      generationSeen: applied,
    });
    cluster.clearGpuFaults("node-a", 0);
    expect(cluster.placements().map((p) => p.ranks[0]?.gpuIndices)).toEqual([[0]]);
    // Not yet answered: the agent reports what it had before seeing the new set.
    const answer = cluster.heartbeat(a.nodeId, {
      gpus: [reading(true)],
      replicas: [ready],
      problems: [],
      generationSeen: applied,
    });
    expect(table.resolve("org/chat").replicas).toEqual([]);
    // It applies that set (same assignment: it keeps pid 100) and says so.
    applied = answer.generation;
    cluster.heartbeat(a.nodeId, {
      gpus: [reading(true)],
      replicas: [ready],
      problems: [],
      generationSeen: applied,
    });
    expect(table.resolve("org/chat").replicas.map((r) => r.baseUrl)).toEqual([
      "http://10.0.0.1:41000",
    ]);
  });
});

describe("GpuFaults (the cluster's fault memory on its own)", () => {
  const gpu = () => simulateInventory("1xh100-80g", { hostname: "n" }).gpus[0] as Gpu;

  it("announces each fault once, not while cleared, and again when seen after its clear", () => {
    const faults = new GpuFaults(store);
    const g = gpu();
    const f = fault();
    const reading = gpuReading({ index: g.index, uuid: g.uuid, faults: [f] });
    expect(faults.takeNew("n-1", g, [f])).toEqual([f]);
    expect(faults.takeNew("n-1", g, [f])).toEqual([]);
    // The same fault on another node's GPU of that index is that node's own news.
    expect(faults.takeNew("n-2", g, [f])).toEqual([f]);
    expect(faults.tallies("n-1")).toEqual([
      { gpu: g.index, code: 79, kind: "xid", action: "reset-gpu", count: 1 },
    ]);
    expect(faults.verdict(g, reading).healthy).toBe(false);

    faults.clear("n-1", g, [f], 5_000);
    expect(faults.cleared(g.uuid)?.get(gpuFaultKey(f))).toBe(1_000);
    expect(faults.verdict(g, reading).healthy).toBe(true);
    expect(faults.takeNew("n-1", g, [f])).toEqual([]);
    const again = fault({ lastSeenUnixMs: 6_000, count: 2 });
    expect(faults.takeNew("n-1", g, [again])).toEqual([again]);
    expect(faults.tallies("n-1")[0]?.count).toBe(2);
  });

  it("keeps clears in the store (a new instance reads them) and writes the store first", () => {
    const g = gpu();
    new GpuFaults(store).clear("n-1", g, [fault()], 5_000);
    expect(new GpuFaults(store).cleared(g.uuid)?.size).toBe(1);

    const refusing: ClusterStore = {
      ...store,
      listFaultClears: () => store.listFaultClears(),
      replaceFaultClears: () => {
        throw new Error("disk full");
      },
    };
    const faults = new GpuFaults(refusing);
    const other = fault({ code: 31, kind: "xid", action: "restart-engine" });
    expect(() => faults.clear("n-1", g, [other], 6_000)).toThrow("disk full");
    expect(faults.cleared(g.uuid)?.has(gpuFaultKey(other))).toBe(false);
  });

  it("bounds the tally per node, logging what it no longer counts", () => {
    const lines: string[] = [];
    const faults = new GpuFaults(store, (line) => lines.push(line));
    const g = gpu();
    const many = Array.from({ length: 257 }, (_, i) => fault({ code: 1_000 + i }));
    expect(faults.takeNew("n-1", g, many)).toHaveLength(257);
    expect(faults.tallies("n-1")).toHaveLength(256);
    expect(lines).toEqual([
      `fault tally of node n-1 is full; Xid 1256 on GPU ${g.index} not counted`,
    ]);
    expect(faults.tallies("n-2")).toEqual([]);
  });
});
