import { createRouterTransport, type Interceptor, type Transport } from "@connectrpc/connect";
import { AgentService } from "@llmgw/proto";
import type { Cluster } from "../domain/cluster.js";
import { createAgentService } from "../rpc/agent-service.js";
import { errorMappingInterceptor } from "../rpc/errors.js";

/** Options of {@link createAgentServiceTransport}. */
export interface AgentServiceTransportOptions {
  /**
   * Interceptors run outside the control plane's error mapping (first = outermost), so they
   * see the Connect errors an agent sees; e.g. to record calls or to play an outage.
   */
  readonly interceptors?: readonly Interceptor[];
  /** `load_stream_ms` told to agents (0, the default: unary ReportLoad only). */
  readonly loadStreamMs?: number;
  /** Serve StreamHeartbeat and WatchDesired (with `loadStreamMs` > 0); default false. */
  readonly heartbeatStreams?: boolean;
  /** Aborted when "the control plane stops": open watches end. */
  readonly shutdown?: AbortSignal;
}

/**
 * The control plane's real `AgentService` over `cluster`, in memory, with the same error
 * mapping as the control listener: an agent's control loop can be tested against the real
 * rules (credentials, node ids, desired sets) without a listener or a network.
 */
export function createAgentServiceTransport(
  cluster: Cluster,
  joinToken: string,
  options: AgentServiceTransportOptions = {},
): Transport {
  return createRouterTransport(
    (router) => {
      router.service(
        AgentService,
        createAgentService(cluster, joinToken, {
          loadStreamMs: options.loadStreamMs ?? 0,
          heartbeatStreams: options.heartbeatStreams ?? false,
          ...(options.shutdown === undefined ? {} : { shutdown: options.shutdown }),
        }),
      );
    },
    { router: { interceptors: [...(options.interceptors ?? []), errorMappingInterceptor] } },
  );
}
