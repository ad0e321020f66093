export { clientAddressKey } from "./client-address-key.js";
export {
  DEFAULT_ROUTER_STATE_DIR,
  MAX_CONTROL_PLANES,
  parseRouterConfig,
  ROUTER_ENV,
  ROUTER_FLAGS,
  ROUTER_ID_PATTERN,
  type RouterConfig,
  type RouterConfigEnv,
  type RouterFlag,
  type RouterFlagValues,
  type RouterTokenSource,
} from "./config.js";
export {
  isRouterServiceError,
  RouterServiceError,
  type RouterServiceErrorCode,
} from "./errors.js";
export { createRouterHandler, type RouterHandler, type RouterHandlerOptions } from "./handler.js";
export { errorBody, FAILURE_HTTP, type HttpErrorSpec, REJECTION_HTTP } from "./http-errors.js";
export {
  createHttpListener,
  type HttpListenerOptions,
  LISTENER_OPTION_LIMITS,
  type ResolvedHttpListenerOptions,
  resolveHttpListenerOptions,
} from "./http-listener.js";
export {
  createPrometheusRouterMetricsSink,
  ROUTING_STATE_FAMILIES,
  type RoutingStateSample,
  registerRoutingStateMetrics,
} from "./metrics.js";
export {
  type ResolvedRouterServiceOptions,
  ROUTER_OPTION_LIMITS,
  type RouterServiceOptions,
  resolveRouterServiceOptions,
} from "./options.js";
export {
  MAX_PEER_LINE_BYTES,
  PEER_EVENTS_PATH,
  type PeerEvent,
  type PeerExchange,
  type PeerExchangeOptions,
  type PeerSink,
  parsePeerEvent,
  startPeerExchange,
} from "./peer-exchange.js";
export {
  type RoutingClient,
  type RoutingClientOptions,
  type RoutingClientState,
  startRoutingClient,
} from "./routing-client.js";
export {
  type RouterDaemon,
  type RouterDaemonDeps,
  startRouterDaemon,
} from "./run.js";
export {
  type RoutingReadiness,
  type RoutingRuntime,
  type RoutingRuntimeOptions,
  startRoutingRuntime,
} from "./runtime.js";
export {
  type RouterStopReport,
  type RunningRouter,
  type StartRouterOptions,
  splitListen,
  startRouter,
} from "./server.js";
export {
  CORRUPT_ROUTING_STATE_FILE,
  MAX_ROUTING_STATE_BYTES,
  ROUTER_ID_FILE,
  ROUTING_STATE_FILE,
  ROUTING_STATE_FORMAT,
  type SavedRoutingState,
} from "./state-file.js";
