import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { applyPlan } from "./apply-plan.js";
import { schedule } from "./schedule.js";
import { checkPlan, testDeployment, testNode } from "./testing/index.js";
import type { ScheduleInput, SchedulerDeployment, SchedulerNode } from "./types.js";

const classes = ["h100-80g", "a100-80g"] as const;

const nodeArb = fc.record({
  gpuCount: fc.constantFrom(0, 2, 4, 8, 8, 8),
  gpuClass: fc.constantFrom<string | undefined>("h100-80g", "h100-80g", "a100-80g", undefined),
  /** Per GPU: 0 = fine, 1 = unhealthy, 2 = MIG (weighted towards fine). */
  faults: fc.array(fc.constantFrom(0, 0, 0, 0, 0, 0, 0, 0, 1, 2), { minLength: 8, maxLength: 8 }),
  fabrics: fc.constantFrom<string[]>(["ib-a"], ["ib-a"], ["ib-b"], ["ib-a", "ib-b"], []),
  state: fc.constantFrom<SchedulerNode["state"]>(
    "ready",
    "ready",
    "ready",
    "ready",
    "unreachable",
    "lost",
  ),
  cordoned: fc.integer({ min: 0, max: 9 }).map((n) => n === 0),
  draining: fc.integer({ min: 0, max: 9 }).map((n) => n === 0),
  nvlinks: fc.array(
    fc.record({
      a: fc.integer({ min: 0, max: 7 }),
      b: fc.integer({ min: 0, max: 7 }),
      count: fc.integer({ min: 1, max: 18 }),
    }),
    { maxLength: 6 },
  ),
  nic: fc.array(fc.integer({ min: 0, max: 4 }), { minLength: 8, maxLength: 8 }),
});

type NodeSpec = typeof nodeArb extends fc.Arbitrary<infer T> ? T : never;

function toNodes(specs: readonly NodeSpec[], prefix = "n"): SchedulerNode[] {
  return specs.map((s, i) => ({
    id: `${prefix}${i}`,
    state: s.state,
    cordoned: s.cordoned,
    draining: s.draining,
    fabrics: s.fabrics,
    gpus: Array.from({ length: s.gpuCount }, (_, index) => ({
      index,
      uuid: `GPU-${prefix}${i}-${index}`,
      ...(s.gpuClass === undefined ? {} : { gpuClass: s.gpuClass }),
      healthy: s.faults[index] !== 1,
      migEnabled: s.faults[index] === 2,
    })),
    nvlinks: s.nvlinks,
    nicDistance: Object.fromEntries(s.nic.map((d, gpu) => [gpu, d])),
  }));
}

const deploymentArb = fc.record({
  gpusPerReplica: fc.constantFrom(0, 1, 1, 2, 4, 8, 16, 16),
  gpuClass: fc.constantFrom<string | undefined>(...classes, ...classes, undefined),
  replicas: fc.integer({ min: 0, max: 3 }),
  nodesPerReplica: fc.constantFrom<number | undefined>(...Array(6).fill(undefined), 1, 2, 3),
  fabric: fc.constantFrom<string | undefined>(undefined, undefined, undefined, "ib-a"),
  multiNode: fc.constantFrom(true, true, true, false),
  priority: fc.integer({ min: 0, max: 3 }),
  allowPreemption: fc.boolean(),
});

type DeploymentSpec = typeof deploymentArb extends fc.Arbitrary<infer T> ? T : never;

function toDeployments(specs: readonly DeploymentSpec[], prefix = "d"): SchedulerDeployment[] {
  return specs.map((s, i) => ({
    name: `${prefix}${i}`,
    revision: 1,
    ...(s.gpuClass === undefined ? {} : { gpuClass: s.gpuClass }),
    gpusPerReplica: s.gpusPerReplica,
    replicas: s.replicas,
    ...(s.nodesPerReplica === undefined ? {} : { nodesPerReplica: s.nodesPerReplica }),
    ...(s.fabric === undefined ? {} : { fabric: s.fabric }),
    multiNode: s.multiNode,
    priority: s.priority,
    allowPreemption: s.allowPreemption,
  }));
}

/** What happens between two scheduler runs: nodes fail, GPUs break, deployments change. */
const changeArb = fc.record({
  lose: fc.array(fc.integer({ min: 0, max: 11 }), { maxLength: 2 }),
  drop: fc.array(fc.integer({ min: 0, max: 11 }), { maxLength: 1 }),
  drain: fc.array(fc.integer({ min: 0, max: 11 }), { maxLength: 2 }),
  breakGpu: fc.array(fc.tuple(fc.integer({ min: 0, max: 11 }), fc.integer({ min: 0, max: 7 })), {
    maxLength: 3,
  }),
  rescale: fc.array(fc.tuple(fc.integer({ min: 0, max: 7 }), fc.integer({ min: 0, max: 5 })), {
    maxLength: 3,
  }),
  bump: fc.array(fc.integer({ min: 0, max: 7 }), { maxLength: 2 }),
  remove: fc.array(fc.integer({ min: 0, max: 7 }), { maxLength: 1 }),
  addNodes: fc.array(nodeArb, { maxLength: 2 }),
  addDeployments: fc.array(deploymentArb, { maxLength: 3 }),
  /** The added deployments outrank everything and may preempt: exercises eviction. */
  urgent: fc.boolean(),
});

/** A fresh cluster, or one that was scheduled once and then changed (realistic placements). */
const inputArb = fc
  .record({
    nodes: fc.array(nodeArb, { minLength: 2, maxLength: 10 }),
    deployments: fc.array(deploymentArb, { maxLength: 5 }),
    change: changeArb,
    fresh: fc.boolean(),
  })
  .map(({ nodes: nodeSpecs, deployments: depSpecs, change, fresh }): ScheduleInput => {
    const nodes = toNodes(nodeSpecs);
    const deployments = toDeployments(depSpecs);
    if (fresh) return { nodes, deployments, placements: [] };
    const first = schedule({ nodes, deployments, placements: [] });
    const placements = applyPlan([], first);
    const changedNodes: SchedulerNode[] = nodes
      .filter((_, i) => !change.drop.includes(i))
      .map(
        (n, i): SchedulerNode => ({
          ...n,
          state: change.lose.includes(i) ? ("lost" as const) : n.state,
          draining: n.draining || change.drain.includes(i),
          gpus: n.gpus.map((g) =>
            change.breakGpu.some(([ni, gi]) => ni === i && gi === g.index)
              ? { ...g, healthy: false }
              : g,
          ),
        }),
      )
      .concat(toNodes(change.addNodes, "new"));
    const changedDeployments: SchedulerDeployment[] = deployments
      .filter((_, i) => !change.remove.includes(i))
      .map((d, i) => ({
        ...d,
        replicas: change.rescale.find(([di]) => di === i)?.[1] ?? d.replicas,
        revision: change.bump.includes(i) ? 2 : 1,
      }))
      .concat(
        toDeployments(change.addDeployments, "e").map((d) =>
          change.urgent ? { ...d, priority: 9, allowPreemption: true } : d,
        ),
      );
    return { nodes: changedNodes, deployments: changedDeployments, placements };
  });

/** A cluster filled by low-priority replicas, then asked for urgent ones that may preempt. */
const crowdedArb = fc
  .record({
    nodes: fc.integer({ min: 2, max: 6 }),
    unhealthy: fc.array(fc.tuple(fc.integer({ min: 0, max: 5 }), fc.integer({ min: 0, max: 7 })), {
      maxLength: 3,
    }),
    fillers: fc.array(
      fc.record({
        gpus: fc.constantFrom(1, 2, 4),
        replicas: fc.integer({ min: 1, max: 12 }),
        priority: fc.integer({ min: 0, max: 2 }),
      }),
      { minLength: 1, maxLength: 3 },
    ),
    urgent: fc.array(
      fc.record({
        gpus: fc.constantFrom(1, 2, 4, 8, 16),
        replicas: fc.integer({ min: 1, max: 2 }),
        priority: fc.integer({ min: 1, max: 5 }),
      }),
      { minLength: 1, maxLength: 2 },
    ),
  })
  .map(({ nodes: count, unhealthy, fillers, urgent }): ScheduleInput => {
    const nodes = Array.from({ length: count }, (_, i) =>
      testNode(`n${i}`, {
        fabrics: ["ib-a"],
        unhealthy: unhealthy.filter(([n]) => n === i).map(([, g]) => g),
      }),
    );
    const fill: SchedulerDeployment[] = fillers.map((f, i) =>
      testDeployment(`f${i}`, {
        gpusPerReplica: f.gpus,
        replicas: f.replicas,
        priority: f.priority,
      }),
    );
    const placements = applyPlan([], schedule({ nodes, deployments: fill, placements: [] }));
    const wants = urgent.map((u, i) =>
      testDeployment(`u${i}`, {
        gpusPerReplica: u.gpus,
        replicas: u.replicas,
        priority: u.priority,
        allowPreemption: true,
      }),
    );
    return { nodes, deployments: [...fill, ...wants], placements };
  });

function shuffle<T>(items: readonly T[], seed: number): T[] {
  const out = [...items];
  let s = seed >>> 0 || 1;
  for (let i = out.length - 1; i > 0; i--) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    const j = s % (i + 1);
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}

const runs = { numRuns: 300 };

describe.each([
  ["clusters scheduled once, then changed", inputArb],
  ["crowded clusters with urgent preempting deployments", crowdedArb],
])("schedule properties over %s", (_name, inputArb) => {
  it("never double-allocates, crosses fabrics or classes, uses bad GPUs or splits gangs", () => {
    fc.assert(
      fc.property(inputArb, (input) => {
        expect(checkPlan(input, schedule(input))).toEqual([]);
      }),
      runs,
    );
  });

  it("gives the identical plan for shuffled input", () => {
    fc.assert(
      fc.property(inputArb, fc.integer(), (input, seed) => {
        const shuffled: ScheduleInput = {
          nodes: shuffle(input.nodes, seed).map((n, i) => ({
            ...n,
            gpus: shuffle(n.gpus, seed + i),
            fabrics: shuffle(n.fabrics, seed - i),
            ...(n.nvlinks === undefined ? {} : { nvlinks: shuffle(n.nvlinks, seed ^ i) }),
          })),
          deployments: shuffle(input.deployments, seed + 1),
          placements: shuffle(input.placements, seed + 2),
        };
        expect(schedule(shuffled)).toEqual(schedule(input));
      }),
      runs,
    );
  });

  it("is idempotent: applying the plan and re-running changes nothing", () => {
    fc.assert(
      fc.property(inputArb, (input) => {
        const result = schedule(input);
        const next = schedule({ ...input, placements: applyPlan(input.placements, result) });
        expect({ add: next.add, remove: next.remove }).toEqual({ add: [], remove: [] });
        expect(next.unschedulable.map((u) => [u.deployment, u.missingReplicas])).toEqual(
          result.unschedulable.map((u) => [u.deployment, u.missingReplicas]),
        );
      }),
      runs,
    );
  });

  it("is stable: adding empty nodes removes nothing", () => {
    fc.assert(
      fc.property(inputArb, (input) => {
        const settled = applyPlan(input.placements, schedule(input));
        const grown = schedule({
          ...input,
          nodes: [
            ...input.nodes,
            testNode("zz-new-1"),
            testNode("zz-new-2", { gpuClass: "a100-80g" }),
          ],
          placements: settled,
        });
        expect(grown.remove).toEqual([]);
      }),
      runs,
    );
  });
});

/** A deep copy of every node: objects the scheduler has never seen, so nothing is cached. */
function freshNodes(nodes: readonly SchedulerNode[]): SchedulerNode[] {
  return nodes.map((n) => JSON.parse(JSON.stringify(n)) as SchedulerNode);
}

describe("schedule caches per node object without changing the plan", () => {
  it("gives the same plan for reused and fresh node objects, as placements and flags change", () => {
    fc.assert(
      fc.property(inputArb, fc.integer({ min: 0, max: 11 }), (input, toggle) => {
        // Warm the cache with these node objects, then reuse them with other placements (the
        // plan applied: the same node objects now carry other replicas), then with one node's
        // object replaced (cordon toggled) and the rest reused, as the control plane does.
        const first = schedule(input);
        expect(schedule({ ...input, nodes: freshNodes(input.nodes) })).toEqual(first);
        const applied: ScheduleInput = {
          ...input,
          placements: applyPlan(input.placements, first),
        };
        expect(schedule(applied)).toEqual(
          schedule({ ...applied, nodes: freshNodes(applied.nodes) }),
        );
        // The same node objects with fewer replicas on them (every other one gone).
        const fewer: ScheduleInput = {
          ...applied,
          placements: applied.placements.filter((_, i) => i % 2 === 0),
        };
        expect(schedule(fewer)).toEqual(schedule({ ...fewer, nodes: freshNodes(fewer.nodes) }));
        const toggled: ScheduleInput = {
          ...applied,
          nodes: applied.nodes.map((n, i) =>
            i === toggle % applied.nodes.length ? { ...n, cordoned: !n.cordoned } : n,
          ),
        };
        const warm = schedule(toggled);
        expect(checkPlan(toggled, warm)).toEqual([]);
        expect(warm).toEqual(schedule({ ...toggled, nodes: freshNodes(toggled.nodes) }));
        // And back: the reused objects again, after the toggled one was seen.
        const back = { ...toggled, placements: applyPlan(toggled.placements, warm) };
        const restored = { ...back, nodes: applied.nodes };
        const again = schedule(restored);
        expect(checkPlan(restored, again)).toEqual([]);
        expect(again).toEqual(schedule({ ...restored, nodes: freshNodes(restored.nodes) }));
      }),
      runs,
    );
  });
});
