export {
  detectEngineKind,
  type EngineKind,
  type EngineLoad,
  extractEngineLoad,
} from "./engine-load.js";
export { isReadinessError, ReadinessError, type ReadinessErrorCode } from "./errors.js";
export {
  type CheckReport,
  createReadinessProbe,
  type FetchLike,
  type ProbeOptions,
  probeHealth,
  probeModels,
  probeReadiness,
  type ReadinessProbeOptions,
  type ReadinessReport,
  type ReadinessState,
  type WaitForReadinessOptions,
  waitForReadiness,
} from "./probes.js";
export { type PrometheusSample, parsePrometheusText } from "./prometheus.js";
export { type ScrapeOptions, scrapeEngineLoad } from "./scrape.js";
