import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import {
  type AgentService,
  HeartbeatResponseSchema,
  RegisterResponseSchema,
  ReportLoadResponseSchema,
} from "@llmgw/proto";
import { boundAgentRequest } from "../domain/agent-limits.js";
import { type Cluster, replicaLoadFromProto } from "../domain/cluster.js";
import { ControlPlaneError } from "../errors.js";
import { bearerToken, requireToken } from "./auth.js";

/** Checks the node credential of `nodeId` in the `Authorization: Bearer` header. */
function authenticateNode(cluster: Cluster, ctx: HandlerContext, nodeId: string, rpc: string) {
  const credential = bearerToken(ctx.requestHeader);
  if (credential === undefined) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
      `missing Authorization: Bearer header; ${rpc} needs the node credential from Register`,
    );
  }
  cluster.authenticateNode(nodeId, credential);
}

/** `AgentService`: Register needs the join token, Heartbeat and ReportLoad the node credential. */
export function createAgentService(
  cluster: Cluster,
  joinToken: string,
): ServiceImpl<typeof AgentService> {
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
      return create(HeartbeatResponseSchema, {
        generation: desired.generation,
        assignments: [...desired.assignments],
        heartbeatIntervalMs: desired.heartbeatIntervalMs,
      });
    },
    reportLoad(req, ctx) {
      authenticateNode(cluster, ctx, req.nodeId, "ReportLoad");
      boundAgentRequest("ReportLoadRequest", req, { nowMs: cluster.now() });
      cluster.reportLoad(
        req.nodeId,
        req.replicas.map((r) => ({
          replicaId: r.replicaId,
          load: replicaLoadFromProto(r.load),
          scrapedAtMs: Number(r.scrapedAtUnixMs),
        })),
      );
      // 0: the agent keeps its own interval (--load-interval).
      return create(ReportLoadResponseSchema, { loadIntervalMs: 0 });
    },
  };
}
