export { FakeAgent, type FakeAgentOptions, type FakeRankReport } from "./fake-agent.js";
export { createManualClock, type ManualClock } from "./manual-clock.js";
