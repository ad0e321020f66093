import type { HeartbeatRequest, NodeInventory, RegisterRequest, ReplicaStatus } from "@llmgw/proto";
import {
  engineLoadFromProto,
  gpuReadingFromProto,
  inventoryFromProto,
  portFromProto,
  problemFromProto,
} from "@llmgw/wire";
import type { HeartbeatInput, RegisterInput } from "../domain/cluster.js";
import { replicaStateFromProto } from "../domain/replica-state.js";
import type { RankStatus } from "../domain/views.js";

/*
 * Agents' reports as the cluster takes them: wire messages (already bounded by
 * `boundAgentRequest`) to plain values, once, as they arrive. Unset optionals stay undefined.
 */

const NO_LINES: readonly string[] = Object.freeze([]);

/** A rank's wire status → plain. */
export function rankStatusFromProto(s: ReplicaStatus): RankStatus {
  const exit = s.lastExit;
  return {
    replicaId: s.replicaId,
    rank: s.rank,
    state: replicaStateFromProto(s.state),
    stateSinceMs: Number(s.stateSinceUnixMs),
    ...(s.pid === undefined ? {} : { pid: s.pid }),
    ...(s.apiPort === undefined ? {} : { apiPort: s.apiPort }),
    ...(s.startedAtUnixMs === undefined ? {} : { startedAtMs: Number(s.startedAtUnixMs) }),
    restarts: s.restarts,
    ...(exit === undefined
      ? {}
      : {
          lastExit: {
            ...(exit.code === undefined ? {} : { code: exit.code }),
            ...(exit.signal === undefined ? {} : { signal: exit.signal }),
            timedOut: exit.timedOut,
            forced: exit.forced,
          },
        }),
    logTail: s.logTail.length === 0 ? NO_LINES : s.logTail,
    ...(s.load === undefined ? {} : { load: engineLoadFromProto(s.load) }),
    ...(s.loadScrapedAtUnixMs === undefined
      ? {}
      : { loadScrapedAtMs: Number(s.loadScrapedAtUnixMs) }),
    message: s.message,
    specHash: s.specHash,
    revision: Number(s.revision),
    adopted: s.adopted,
    ...(s.kvEventsPort === undefined ? {} : { kvEventsPort: s.kvEventsPort }),
  };
}

/** A Heartbeat (or a heartbeat stream's message) → what `Cluster.heartbeat` takes. */
export function heartbeatInputFromProto(req: HeartbeatRequest): HeartbeatInput {
  return {
    gpus: req.gpus.map(gpuReadingFromProto),
    replicas: req.replicas.map(rankStatusFromProto),
    problems: req.problems.map(problemFromProto),
    engineCredentials: req.engineCredentials.map((c) => ({
      replicaId: c.replicaId,
      apiKey: c.apiKey,
    })),
    ports: req.ports.map(portFromProto),
    generationSeen: req.generationSeen,
    // Both or neither: a sequence outside a session orders nothing.
    ...(req.sessionId === "" || req.sequence === undefined
      ? {}
      : { order: { sessionId: req.sessionId, sequence: req.sequence } }),
  };
}

/** A Register and its inventory (checked present) → what `Cluster.register` takes. */
export function registerInputFromProto(
  req: RegisterRequest,
  inventory: NodeInventory,
): RegisterInput {
  return {
    inventory: inventoryFromProto(inventory),
    previousNodeId: req.previousNodeId,
    previousNodeCredential: req.previousNodeCredential,
    advertiseAddress: req.advertiseAddress,
    replicas: req.replicas.map(rankStatusFromProto),
    engineCredentials: req.engineCredentials.map((c) => ({
      replicaId: c.replicaId,
      apiKey: c.apiKey,
    })),
  };
}
