import type { Command } from "./command.js";

/**
 * Every `llmgw` subcommand, loaded lazily so that `llmgw agent inventory` does not pay for
 * the control plane's imports. Keys are the words after `llmgw`; the longest match wins.
 */
export const commands: Record<string, () => Promise<Command>> = {
  version: async () => (await import("./commands/version.js")).command,
  "agent inventory": async () => (await import("./commands/agent-inventory.js")).command,
  "engine-sim": async () => (await import("./commands/engine-sim.js")).command,
  "launch-plan": async () => (await import("./commands/launch-plan.js")).command,
};
