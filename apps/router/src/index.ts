export { createRouterHandler, type RouterHandler, type RouterHandlerOptions } from "./handler.js";
export { errorBody, FAILURE_HTTP, type HttpErrorSpec, REJECTION_HTTP } from "./http-errors.js";
export {
  createHttpListener,
  type HttpListenerOptions,
  type ResolvedHttpListenerOptions,
  resolveHttpListenerOptions,
} from "./http-listener.js";
export { createPrometheusRouterMetricsSink } from "./metrics.js";
export {
  type ResolvedRouterServiceOptions,
  type RouterServiceOptions,
  resolveRouterServiceOptions,
} from "./options.js";
export {
  type RouterServerOptions,
  type RunningRouterServer,
  startRouterServer,
} from "./server.js";
