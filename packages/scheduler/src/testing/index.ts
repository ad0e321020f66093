/**
 * Builders and a plan checker for tests of the scheduler and of code that calls it (the
 * control plane). Import from `@llmgw/scheduler/testing`.
 */

import type {
  Placement,
  ScheduleInput,
  ScheduleResult,
  SchedulerDeployment,
  SchedulerNode,
} from "../types.js";

/** Shorthand for a node in tests; every field has a plain default. */
export interface TestNodeSpec {
  /** Number of GPUs; default 8. */
  readonly gpus?: number;
  /** Class of every GPU; default "h100-80g". `null` = unknown class. */
  readonly gpuClass?: string | null;
  readonly fabrics?: readonly string[];
  readonly state?: SchedulerNode["state"];
  readonly cordoned?: boolean;
  readonly draining?: boolean;
  /** GPU indices that are unhealthy. */
  readonly unhealthy?: readonly number[];
  /** GPU indices with MIG enabled. */
  readonly mig?: readonly number[];
  readonly nvlinks?: SchedulerNode["nvlinks"];
  readonly nicDistance?: SchedulerNode["nicDistance"];
  /** Vendor of every GPU; default absent (= nvidia). */
  readonly vendor?: "nvidia" | "amd";
  /** GPU indices that are AMD whatever `vendor` says. */
  readonly amd?: readonly number[];
  readonly fabricTrouble?: SchedulerNode["fabricTrouble"];
}

/** A {@link SchedulerNode} with GPUs `0..gpus-1`, uuids `GPU-<id>-<index>`. */
export function testNode(id: string, spec: TestNodeSpec = {}): SchedulerNode {
  const count = spec.gpus ?? 8;
  const cls = spec.gpuClass === undefined ? "h100-80g" : spec.gpuClass;
  return {
    id,
    state: spec.state ?? "ready",
    cordoned: spec.cordoned ?? false,
    draining: spec.draining ?? false,
    fabrics: spec.fabrics ?? [],
    gpus: Array.from({ length: count }, (_, index) => ({
      index,
      uuid: `GPU-${id}-${index}`,
      ...(cls === null ? {} : { gpuClass: cls }),
      healthy: !(spec.unhealthy ?? []).includes(index),
      migEnabled: (spec.mig ?? []).includes(index),
      ...((spec.amd ?? []).includes(index)
        ? { vendor: "amd" as const }
        : spec.vendor === undefined
          ? {}
          : { vendor: spec.vendor }),
    })),
    ...(spec.nvlinks === undefined ? {} : { nvlinks: spec.nvlinks }),
    ...(spec.nicDistance === undefined ? {} : { nicDistance: spec.nicDistance }),
    ...(spec.fabricTrouble === undefined ? {} : { fabricTrouble: spec.fabricTrouble }),
  };
}

/**
 * A {@link SchedulerDeployment}: revision 1, class "h100-80g", 1 GPU, 1 replica, multi-node
 * capable, priority 0, no preemption, unless overridden.
 */
export function testDeployment(
  name: string,
  spec: Partial<Omit<SchedulerDeployment, "name">> = {},
): SchedulerDeployment {
  return {
    name,
    revision: 1,
    gpuClass: "h100-80g",
    gpusPerReplica: 1,
    replicas: 1,
    multiNode: true,
    priority: 0,
    allowPreemption: false,
    ...spec,
  };
}

/**
 * A {@link Placement} from `[nodeId, gpuIndices]` pairs, rank 0 first. `deployment` defaults to
 * the replica id without its `-<n>` suffix; revision defaults to 1.
 */
export function testPlacement(
  replicaId: string,
  ranks: readonly (readonly [string, readonly number[]])[],
  options: { deployment?: string; revision?: number; fabricId?: string } = {},
): Placement {
  return {
    replicaId,
    deployment: options.deployment ?? replicaId.replace(/-[0-9]+$/, ""),
    revision: options.revision ?? 1,
    ranks: ranks.map(([nodeId, gpuIndices], rank) => ({ rank, nodeId, gpuIndices })),
    ...(options.fabricId === undefined ? {} : { fabricId: options.fabricId }),
  };
}

/**
 * Checks a plan against the scheduler's invariants and returns every violation as text (empty
 * = fine): removals refer to existing placements, no GPU is used twice after the plan, new
 * ranks use only healthy non-MIG GPUs of the right class on schedulable nodes, gangs have all
 * their ranks with equal GPU counts on one fabric and one class, replica counts never exceed the
 * deployment's, and preempted replicas have a lower priority than some deployment that gained.
 */
export function checkPlan(input: ScheduleInput, result: ScheduleResult): string[] {
  const problems: string[] = [];
  const nodes = new Map(input.nodes.map((n) => [n.id, n]));
  const deployments = new Map(input.deployments.map((d) => [d.name, d]));
  const existing = new Map(input.placements.map((p) => [p.replicaId, p]));
  const held = new Map((input.held ?? []).map((p) => [p.replicaId, p]));
  for (const r of result.remove) {
    if (!existing.has(r.replicaId) && !held.has(r.replicaId))
      problems.push(`removes unknown replica ${r.replicaId}`);
  }
  const removed = new Set(result.remove.map((r) => r.replicaId));
  for (const p of result.revised) {
    const before = existing.get(p.replicaId);
    if (before === undefined || removed.has(p.replicaId))
      problems.push(`revises a replica that is not kept: ${p.replicaId}`);
    else if (JSON.stringify(before.ranks) !== JSON.stringify(p.ranks))
      problems.push(`${p.replicaId}: revised with other ranks`);
    if (p.revision !== deployments.get(p.deployment)?.revision)
      problems.push(`${p.replicaId}: revised to another revision than its deployment's`);
  }
  const after = [...input.placements.filter((p) => !removed.has(p.replicaId)), ...result.add];
  const heldAfter = [...held.values()].filter((p) => !removed.has(p.replicaId));
  const owners = new Map<string, string>();
  for (const p of [...heldAfter, ...after]) {
    for (const rank of p.ranks) {
      for (const gpu of rank.gpuIndices) {
        const key = `${rank.nodeId}/${gpu}`;
        const owner = owners.get(key);
        if (owner !== undefined) problems.push(`GPU ${key} used by ${owner} and ${p.replicaId}`);
        owners.set(key, p.replicaId);
      }
    }
  }
  for (const p of result.add) {
    const d = deployments.get(p.deployment);
    if (d === undefined) {
      problems.push(`${p.replicaId}: added for unknown deployment`);
      continue;
    }
    if ((existing.has(p.replicaId) || held.has(p.replicaId)) && !removed.has(p.replicaId)) {
      problems.push(`${p.replicaId}: id already in use`);
    }
    if (p.revision !== d.revision) problems.push(`${p.replicaId}: wrong revision`);
    const classes = new Set<string | undefined>();
    const fabricsOk = new Set<boolean>();
    const sizes = new Set(p.ranks.map((r) => r.gpuIndices.length));
    if (sizes.size > 1) problems.push(`${p.replicaId}: uneven ranks`);
    const total = p.ranks.reduce((s, r) => s + r.gpuIndices.length, 0);
    if (total !== d.gpusPerReplica) {
      problems.push(`${p.replicaId}: ${total} GPUs, wants ${d.gpusPerReplica}`);
    }
    if (new Set(p.ranks.map((r) => r.nodeId)).size !== p.ranks.length) {
      problems.push(`${p.replicaId}: two ranks on one node`);
    }
    for (const rank of p.ranks) {
      const node = nodes.get(rank.nodeId);
      if (node === undefined) {
        problems.push(`${p.replicaId}: unknown node ${rank.nodeId}`);
        continue;
      }
      if (node.state !== "ready" || node.cordoned || node.draining) {
        problems.push(`${p.replicaId}: placed on unschedulable node ${node.id}`);
      }
      if (p.ranks.length > 1) {
        fabricsOk.add(p.fabricId !== undefined && node.fabrics.includes(p.fabricId));
      }
      for (const index of rank.gpuIndices) {
        const gpu = node.gpus.find((g) => g.index === index);
        if (gpu === undefined || !gpu.healthy || gpu.migEnabled || gpu.gpuClass === undefined) {
          problems.push(`${p.replicaId}: unusable GPU ${node.id}/${index}`);
          continue;
        }
        classes.add(gpu.gpuClass);
      }
    }
    if (classes.size > 1) problems.push(`${p.replicaId}: mixes GPU classes`);
    if (d.gpuClass !== undefined && classes.size === 1 && !classes.has(d.gpuClass)) {
      problems.push(`${p.replicaId}: wrong GPU class`);
    }
    if (fabricsOk.has(false)) problems.push(`${p.replicaId}: gang crosses fabrics`);
  }
  const counts = new Map<string, number>();
  for (const p of after) counts.set(p.deployment, (counts.get(p.deployment) ?? 0) + 1);
  for (const [name, n] of counts) {
    const d = deployments.get(name);
    if (d === undefined) problems.push(`${name}: deleted but still has ${n} replicas`);
    else if (n > d.replicas) problems.push(`${name}: ${n} replicas, wants ${d.replicas}`);
  }
  const gained = new Set(result.add.map((p) => p.deployment));
  const maxGainPriority = Math.max(
    Number.NEGATIVE_INFINITY,
    ...[...gained].map((n) => deployments.get(n)?.priority ?? Number.NEGATIVE_INFINITY),
  );
  for (const r of result.remove) {
    if (r.reason.code !== "preempted") continue;
    const victim = deployments.get(r.deployment);
    if (victim === undefined || victim.priority >= maxGainPriority) {
      problems.push(`${r.replicaId}: preempted without a higher-priority gainer`);
    }
  }
  return problems;
}
