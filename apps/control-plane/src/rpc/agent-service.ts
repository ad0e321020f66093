import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import {
  type AgentService,
  type HeartbeatRequest,
  type HeartbeatResponse,
  HeartbeatResponseSchema,
  RegisterResponseSchema,
  type ReplicaLoadReport,
  type ReportLoadRequest,
  type ReportLoadResponse,
  ReportLoadResponseSchema,
  SetLeavingResponseSchema,
  type StreamHeartbeatRequest,
  type StreamHeartbeatResponse,
  StreamHeartbeatResponseSchema,
  type StreamLoadRequest,
  type StreamLoadResponse,
  StreamLoadResponseSchema,
  WatchDesiredResponseSchema,
} from "@llmgw/proto";
import { heartbeatInputFromProto, registerInputFromProto } from "../convert/agent-reports.js";
import { assignmentsToProto } from "../convert/views.js";
import { boundAgentRequest } from "../domain/agent-limits.js";
import type { Cluster } from "../domain/cluster.js";
import { replicaLoadFromProto } from "../domain/replica-loads.js";
import { ControlPlaneError } from "../errors.js";
import { bearerToken, requireToken } from "./auth.js";

/**
 * Checks the node credential of `nodeId` in the `Authorization: Bearer` header; returns its
 * hash (see `Cluster.stillAuthenticated`).
 */
function authenticateNode(cluster: Cluster, headers: Headers, nodeId: string, rpc: string): string {
  const credential = bearerToken(headers);
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
  /**
   * Whether agents may send heartbeats on `StreamHeartbeat` and take desired sets from
   * `WatchDesired`, each open for `loadStreamMs` (told as `heartbeat_streams`). Default false;
   * off whenever `loadStreamMs` is 0.
   */
  readonly heartbeatStreams?: boolean;
  /** Aborted when the control plane stops: open watches end. */
  readonly shutdown?: AbortSignal;
  /**
   * Resolves once the state a desired set was built from is durable (`ClusterStore.flush`):
   * a watch never hands an agent a placement a failover could forget. Unary answers wait in
   * an interceptor instead. Default: nothing to wait for.
   */
  readonly durable?: () => Promise<void>;
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

/** One client stream's messages, taken one at a time as they arrive. */
export interface ClientStreamSession<I, O> {
  /**
   * Checks and takes one message, the credential included (an operator's reset revokes it
   * mid-stream); throws to end the stream with that error, what came before staying taken.
   */
  take(message: I): void;
  /** The answer once the client has ended the stream. */
  finish(): O;
}

/**
 * The agent's client streams, one session per request: the Connect handlers below and the
 * control listener's fast path (`agent-fast-path.ts`) feed the same sessions.
 */
export interface AgentStreams {
  streamLoad(headers: Headers): ClientStreamSession<StreamLoadRequest, StreamLoadResponse>;
  /** Throws `Unimplemented` when heartbeat streams are off. */
  streamHeartbeat(
    headers: Headers,
  ): ClientStreamSession<StreamHeartbeatRequest, StreamHeartbeatResponse>;
}

/** Whether `options` turn heartbeat streams on: asked for, and with a stream length. */
const heartbeatStreamsOn = (options: AgentServiceOptions) =>
  (options.loadStreamMs ?? 0) > 0 && options.heartbeatStreams === true;

/** What every heartbeat answer tells the agent of streams, resolved once from the options. */
interface StreamOffer {
  readonly loadStreamMs: number;
  readonly heartbeatStreams: boolean;
}

const streamOffer = (options: AgentServiceOptions): StreamOffer => ({
  loadStreamMs: options.loadStreamMs ?? 0,
  heartbeatStreams: heartbeatStreamsOn(options),
});

/** Refuses `rpc` with `Unimplemented` when heartbeat streams are off (`on` false). */
function requireHeartbeatStreams(on: boolean, rpc: string): void {
  if (!on) {
    throw new ConnectError(
      `${rpc} is turned off on this control plane (--agent-stream 0); send unary Heartbeat calls`,
      Code.Unimplemented,
    );
  }
}

/** Bounds and takes one heartbeat (credential already checked). */
function takeHeartbeat(cluster: Cluster, req: HeartbeatRequest) {
  boundAgentRequest("HeartbeatRequest", req);
  return cluster.heartbeat(req.nodeId, heartbeatInputFromProto(req));
}

/**
 * Keeps one stream to one node: the first message's node id holds for the whole stream, and
 * the credential hash the first message passed with is checked again for later ones without
 * hashing (an agent sends a few a second).
 */
function streamIdentity(cluster: Cluster, headers: Headers, field: string, rpc: string) {
  let nodeId: string | undefined;
  let passed: string | undefined;
  return (messageNodeId: string) => {
    if (nodeId !== undefined && messageNodeId !== nodeId) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `${field} changed from ${nodeId} to ${messageNodeId} within one stream`,
      );
    }
    if (passed === undefined || !cluster.stillAuthenticated(messageNodeId, passed)) {
      passed = authenticateNode(cluster, headers, messageNodeId, rpc);
    }
    nodeId = messageNodeId;
  };
}

/** The sessions of {@link AgentStreams} over `cluster`. */
export function createAgentStreams(
  cluster: Cluster,
  options: AgentServiceOptions = {},
): AgentStreams {
  const heartbeatStreams = heartbeatStreamsOn(options);
  return {
    streamLoad(headers) {
      const check = streamIdentity(cluster, headers, "StreamLoadRequest.nodeId", "StreamLoad");
      return {
        take(req) {
          check(req.nodeId);
          boundAgentRequest("StreamLoadRequest", req, { nowMs: cluster.now() });
          applyLoadReports(cluster, req.nodeId, req.replicas);
        },
        finish: () => create(StreamLoadResponseSchema, { loadIntervalMs: 0 }),
      };
    },
    streamHeartbeat(headers) {
      requireHeartbeatStreams(heartbeatStreams, "StreamHeartbeat");
      const check = streamIdentity(
        cluster,
        headers,
        "StreamHeartbeatRequest.heartbeat.nodeId",
        "StreamHeartbeat",
      );
      return {
        take({ heartbeat }) {
          if (!heartbeat) {
            throw new ControlPlaneError(
              "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
              "StreamHeartbeatRequest.heartbeat is required",
            );
          }
          check(heartbeat.nodeId);
          takeHeartbeat(cluster, heartbeat);
        },
        finish: () => create(StreamHeartbeatResponseSchema, {}),
      };
    },
  };
}

/**
 * The agent's two frequent unary calls, answered synchronously (the caller waits for
 * durability before sending the answer): the Connect handlers below and the control
 * listener's fast path (`agent-fast-path.ts`) run the same code.
 */
export interface AgentCalls {
  heartbeat(req: HeartbeatRequest, headers: Headers): HeartbeatResponse;
  reportLoad(req: ReportLoadRequest, headers: Headers): ReportLoadResponse;
}

/** The answer to an agent that last applied `generationSeen` (0: none). */
function desiredResponse(
  desired: ReturnType<Cluster["desiredSet"]>,
  generationSeen: bigint,
  offer: StreamOffer,
): HeartbeatResponse {
  // The set the agent applied already: its generation says so, the set is not sent again
  // (encoding every node's full set on every beat was 8% of the control plane's CPU).
  const unchanged = generationSeen !== 0n && generationSeen === desired.generation;
  return create(HeartbeatResponseSchema, {
    generation: desired.generation,
    assignments: unchanged ? [] : [...assignmentsToProto(desired.assignments)],
    unchanged,
    heartbeatIntervalMs: desired.heartbeatIntervalMs,
    loadStreamMs: offer.loadStreamMs,
    heartbeatStreams: offer.heartbeatStreams,
  });
}

/** {@link AgentCalls} over `cluster`. */
export function createAgentCalls(cluster: Cluster, options: AgentServiceOptions = {}): AgentCalls {
  const offer = streamOffer(options);
  return {
    heartbeat(req, headers) {
      authenticateNode(cluster, headers, req.nodeId, "Heartbeat");
      return desiredResponse(takeHeartbeat(cluster, req), req.generationSeen, offer);
    },
    reportLoad(req, headers) {
      authenticateNode(cluster, headers, req.nodeId, "ReportLoad");
      boundAgentRequest("ReportLoadRequest", req, { nowMs: cluster.now() });
      applyLoadReports(cluster, req.nodeId, req.replicas);
      // 0: the agent keeps its own interval (--load-interval).
      return create(ReportLoadResponseSchema, { loadIntervalMs: 0 });
    },
  };
}

/**
 * `AgentService`: Register needs the join token; Heartbeat, ReportLoad, StreamLoad,
 * StreamHeartbeat, WatchDesired and SetLeaving the node credential.
 */
export function createAgentService(
  cluster: Cluster,
  joinToken: string,
  options: AgentServiceOptions = {},
): ServiceImpl<typeof AgentService> {
  const offer = streamOffer(options);
  const { loadStreamMs, heartbeatStreams } = offer;
  const streams = createAgentStreams(cluster, options);
  const calls = createAgentCalls(cluster, options);
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
      const result = cluster.register(registerInputFromProto(req, req.inventory));
      return create(RegisterResponseSchema, {
        nodeId: result.nodeId,
        nodeCredential: result.nodeCredential,
        heartbeatIntervalMs: result.heartbeatIntervalMs,
      });
    },
    heartbeat: (req, ctx) => calls.heartbeat(req, ctx.requestHeader),
    reportLoad: (req, ctx) => calls.reportLoad(req, ctx.requestHeader),
    setLeaving(req, ctx) {
      authenticateNode(cluster, ctx.requestHeader, req.nodeId, "SetLeaving");
      const nodeId = req.nodeId;
      // The agent stopping with its engines drains its node (leaving), or ends the drain its
      // own leave began when it starts again; the cluster refuses to end an operator's.
      const replicas = cluster.setNodeLeaving(nodeId, req.leaving);
      return create(SetLeavingResponseSchema, { replicas });
    },
    async streamLoad(requests, ctx) {
      const session = streams.streamLoad(ctx.requestHeader);
      for await (const req of requests) session.take(req);
      return session.finish();
    },
    async streamHeartbeat(requests, ctx) {
      const session = streams.streamHeartbeat(ctx.requestHeader);
      for await (const req of requests) session.take(req);
      return session.finish();
    },
    async *watchDesired(req, ctx) {
      requireHeartbeatStreams(heartbeatStreams, "WatchDesired");
      const passed = authenticateNode(cluster, ctx.requestHeader, req.nodeId, "WatchDesired");
      let wake: (() => void) | undefined;
      let changed = true;
      let over = false;
      const end = () => {
        over = true;
        wake?.();
      };
      const unsubscribe = cluster.onDesiredChange(req.nodeId, () => {
        changed = true;
        wake?.();
      });
      // Ends on time, and the agent opens the next: no proxy timeout ever sees an older one.
      const timer = setTimeout(end, loadStreamMs);
      const signal = AbortSignal.any(
        options.shutdown === undefined ? [ctx.signal] : [ctx.signal, options.shutdown],
      );
      if (signal.aborted) over = true;
      signal.addEventListener("abort", end, { once: true });
      let first = true;
      let sent = req.generationSeen;
      try {
        while (!over) {
          if (changed) {
            changed = false;
            if (!cluster.stillAuthenticated(req.nodeId, passed)) {
              throw new ControlPlaneError(
                "LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
                `node ${req.nodeId} opened this WatchDesired with a credential that no longer holds (registered again, or revoked); register again with the join token`,
              );
            }
            const desired = cluster.desiredSet(req.nodeId);
            // The first answer always goes: it tells the agent the watch is open.
            if (first || desired.generation !== sent) {
              if (options.durable) await options.durable();
              yield create(WatchDesiredResponseSchema, {
                desired: desiredResponse(desired, sent, offer),
              });
              first = false;
              sent = desired.generation;
            }
            continue;
          }
          await new Promise<void>((resolve) => {
            wake = resolve;
          });
          wake = undefined;
        }
        // Not an end on time: the agent must not open the next watch here, but go on with
        // heartbeat calls (to the next control plane).
        if (options.shutdown?.aborted) {
          throw new ControlPlaneError(
            "LLMGW_CONTROL_PLANE_SHUTTING_DOWN",
            "the control plane is shutting down",
          );
        }
      } finally {
        clearTimeout(timer);
        signal.removeEventListener("abort", end);
        unsubscribe();
      }
    },
  };
}
