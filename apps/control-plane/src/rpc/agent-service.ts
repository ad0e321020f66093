import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import {
  type AgentService,
  HeartbeatResponseSchema,
  RegisterResponseSchema,
  type ReplicaLoadReport,
  ReportLoadResponseSchema,
  StreamLoadResponseSchema,
} from "@llmgw/proto";
import { boundAgentRequest } from "../domain/agent-limits.js";
import { type Cluster, replicaLoadFromProto } from "../domain/cluster.js";
import { ControlPlaneError } from "../errors.js";
import { bearerToken, requireToken } from "./auth.js";

/**
 * Checks the node credential of `nodeId` in the `Authorization: Bearer` header; returns its
 * hash (see `Cluster.stillAuthenticated`).
 */
function authenticateNode(
  cluster: Cluster,
  ctx: HandlerContext,
  nodeId: string,
  rpc: string,
): string {
  const credential = bearerToken(ctx.requestHeader);
  if (credential === undefined) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
      `missing Authorization: Bearer header; ${rpc} needs the node credential from Register`,
    );
  }
  return cluster.authenticateNode(nodeId, credential);
}

/** Options of {@link createAgentService}. */
export interface AgentServiceOptions {
  /**
   * How long an agent keeps one `StreamLoad` request open, ms, told in every heartbeat answer
   * (`load_stream_ms`); 0: agents send load as unary `ReportLoad` calls only. Default 0.
   */
  readonly loadStreamMs?: number;
}

/** Applies one load report of `nodeId` (credential and bounds already checked). */
function applyLoadReports(
  cluster: Cluster,
  nodeId: string,
  replicas: readonly ReplicaLoadReport[],
) {
  cluster.reportLoad(
    nodeId,
    replicas.map((r) => ({
      replicaId: r.replicaId,
      load: replicaLoadFromProto(r.load),
      scrapedAtMs: Number(r.scrapedAtUnixMs),
    })),
  );
}

/**
 * `AgentService`: Register needs the join token; Heartbeat, ReportLoad and StreamLoad the node
 * credential.
 */
export function createAgentService(
  cluster: Cluster,
  joinToken: string,
  options: AgentServiceOptions = {},
): ServiceImpl<typeof AgentService> {
  const loadStreamMs = options.loadStreamMs ?? 0;
  return {
    register(req, ctx) {
      requireToken(ctx.requestHeader, joinToken, "the join token (llmgw control-plane token)");
      boundAgentRequest("RegisterRequest", req);
      if (!req.inventory) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          "RegisterRequest.inventory is required",
        );
      }
      if (!req.inventory.hostname) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          "RegisterRequest.inventory.hostname is required",
        );
      }
      const result = cluster.register({
        inventory: req.inventory,
        previousNodeId: req.previousNodeId,
        previousNodeCredential: req.previousNodeCredential,
        advertiseAddress: req.advertiseAddress,
        replicas: req.replicas,
        engineCredentials: req.engineCredentials,
      });
      return create(RegisterResponseSchema, {
        nodeId: result.nodeId,
        nodeCredential: result.nodeCredential,
        heartbeatIntervalMs: result.heartbeatIntervalMs,
      });
    },
    heartbeat(req, ctx) {
      authenticateNode(cluster, ctx, req.nodeId, "Heartbeat");
      boundAgentRequest("HeartbeatRequest", req);
      const desired = cluster.heartbeat(req.nodeId, {
        gpus: req.gpus,
        replicas: req.replicas,
        problems: req.problems,
        engineCredentials: req.engineCredentials,
        ports: req.ports,
        generationSeen: req.generationSeen,
      });
      // The set the agent applied already: its generation says so, the set is not sent again
      // (encoding every node's full set on every beat was 8% of the control plane's CPU).
      const unchanged = req.generationSeen !== 0n && req.generationSeen === desired.generation;
      return create(HeartbeatResponseSchema, {
        generation: desired.generation,
        assignments: unchanged ? [] : [...desired.assignments],
        unchanged,
        heartbeatIntervalMs: desired.heartbeatIntervalMs,
        loadStreamMs,
      });
    },
    reportLoad(req, ctx) {
      authenticateNode(cluster, ctx, req.nodeId, "ReportLoad");
      boundAgentRequest("ReportLoadRequest", req, { nowMs: cluster.now() });
      applyLoadReports(cluster, req.nodeId, req.replicas);
      // 0: the agent keeps its own interval (--load-interval).
      return create(ReportLoadResponseSchema, { loadIntervalMs: 0 });
    },
    async streamLoad(requests, ctx) {
      // Each report is checked and applied as it arrives, the credential included (an
      // operator's reset revokes it mid-stream); a bad one ends the request with its error,
      // the reports before it stay applied.
      let nodeId: string | undefined;
      // The hash of the credential the first message passed with: later ones are checked
      // against it without hashing again (an agent sends a few a second).
      let passed: string | undefined;
      for await (const req of requests) {
        if (nodeId !== undefined && req.nodeId !== nodeId) {
          throw new ControlPlaneError(
            "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
            `StreamLoadRequest.nodeId changed from ${nodeId} to ${req.nodeId} within one stream`,
          );
        }
        if (passed === undefined || !cluster.stillAuthenticated(req.nodeId, passed)) {
          passed = authenticateNode(cluster, ctx, req.nodeId, "StreamLoad");
        }
        nodeId = req.nodeId;
        boundAgentRequest("StreamLoadRequest", req, { nowMs: cluster.now() });
        applyLoadReports(cluster, req.nodeId, req.replicas);
      }
      return create(StreamLoadResponseSchema, { loadIntervalMs: 0 });
    },
  };
}
