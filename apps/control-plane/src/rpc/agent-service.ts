import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import { type AgentService, HeartbeatResponseSchema, RegisterResponseSchema } from "@llmgw/proto";
import { boundAgentRequest } from "../domain/agent-limits.js";
import type { Cluster } from "../domain/cluster.js";
import { ControlPlaneError } from "../errors.js";
import { bearerToken, requireToken } from "./auth.js";

/** `AgentService`: Register needs the join token, Heartbeat the node credential. */
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
      const credential = bearerToken(ctx.requestHeader);
      if (credential === undefined) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
          "missing Authorization: Bearer header; Heartbeat needs the node credential from Register",
        );
      }
      cluster.authenticateNode(req.nodeId, credential);
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
    reportLoad() {
      // Implemented with the control plane's load path (issue 17, same session).
      throw new ConnectError("ReportLoad is not served yet", Code.Unimplemented);
    },
  };
}
