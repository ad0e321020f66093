import type { Placement, ScheduleResult } from "./types.js";

/**
 * The placements after a plan is carried out: `current` minus `result.remove`, with
 * `result.revised` replacing their older revisions, plus `result.add`, sorted by replica id.
 * Pure; for the control plane's bookkeeping, simulations and tests ("applying the plan and
 * scheduling again changes nothing").
 */
export function applyPlan(current: readonly Placement[], result: ScheduleResult): Placement[] {
  const removed = new Set(result.remove.map((r) => r.replicaId));
  const revised = new Map(result.revised.map((p) => [p.replicaId, p]));
  return [
    ...current.filter((p) => !removed.has(p.replicaId)).map((p) => revised.get(p.replicaId) ?? p),
    ...result.add,
  ].sort((a, b) => (a.replicaId < b.replicaId ? -1 : a.replicaId > b.replicaId ? 1 : 0));
}
