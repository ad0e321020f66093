export {
  type AgentServiceTransportOptions,
  createAgentServiceTransport,
} from "./agent-service-transport.js";
export { FakeAgent, type FakeAgentOptions, type FakeRankReport } from "./fake-agent.js";
export { createManualClock, type ManualClock } from "./manual-clock.js";
export {
  postgresBinDir,
  postgresUnavailable,
  startTestPostgres,
  type TestPostgres,
} from "./postgres.js";
export { gpuReading, rankStatus } from "./reports.js";
export { hasOpenssl, selfSignedCert } from "./self-signed.js";
