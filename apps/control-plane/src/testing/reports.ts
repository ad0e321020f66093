import type { GpuReading } from "@llmgw/discovery";
import type { RankStatus } from "../domain/views.js";

/**
 * A rank's status as the cluster takes it (after `convert/agent-reports.ts`), for tests that
 * drive `Cluster` directly; what is not given is what an agent leaves unset.
 */
export function rankStatus(
  init: Partial<RankStatus> & Pick<RankStatus, "replicaId" | "rank">,
): RankStatus {
  return {
    state: "starting",
    stateSinceMs: 0,
    restarts: 0,
    logTail: [],
    message: "",
    specHash: "",
    revision: 0,
    adopted: false,
    ...init,
  };
}

/** A GPU reading as the cluster takes it; sound unless told otherwise. */
export function gpuReading(
  init: Partial<GpuReading> & Pick<GpuReading, "index" | "uuid">,
): GpuReading {
  return { healthy: true, healthProblems: [], lost: false, ...init };
}
