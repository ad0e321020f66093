import { probeReadiness, scrapeEngineLoad } from "@llmgw/readiness";
import type { EngineProbes } from "./replica-manager.js";

/**
 * The agent's readiness probes and load scrapes over HTTP (`@llmgw/readiness`): `/health`
 * says the process is up, `/v1/models` listing the served name says the weights loaded. Both
 * send the replica's engine API key when it has one.
 */
export function createEngineProbes(): EngineProbes {
  return {
    async probe(baseUrl, readiness, timeoutMs, apiKey) {
      const report = await probeReadiness(baseUrl, readiness.expectedModelId, {
        healthTimeoutMs: timeoutMs,
        modelsTimeoutMs: timeoutMs,
        ...(apiKey === undefined ? {} : { apiKey }),
      });
      return report.state;
    },
    async scrapeLoad(metricsUrl, timeoutMs, apiKey) {
      return scrapeEngineLoad(metricsUrl, {
        timeoutMs,
        ...(apiKey === undefined ? {} : { apiKey }),
      });
    },
  };
}
