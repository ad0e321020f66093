import type { Command } from "./command.js";

/**
 * Every `llmgw` subcommand, loaded lazily so that `llmgw agent inventory` does not pay for
 * the control plane's imports. Keys are the words after `llmgw`; the longest match wins.
 */
export const commands: Record<string, () => Promise<Command>> = {
  agent: async () => (await import("./commands/agent.js")).command,
  demo: async () => (await import("./commands/demo.js")).command,
  version: async () => (await import("./commands/version.js")).command,
  "agent inventory": async () => (await import("./commands/agent-inventory.js")).command,
  "engine-sim": async () => (await import("./commands/engine-sim.js")).command,
  "launch-plan": async () => (await import("./commands/launch-plan.js")).command,
  "control-plane": async () => (await import("./commands/control-plane.js")).command,
  "control-plane token": async () => (await import("./commands/control-plane-token.js")).command,
  "control-plane migrate-store": async () =>
    (await import("./commands/control-plane-migrate-store.js")).command,
  deploy: async () => (await import("./commands/deploy.js")).command,
  deployments: async () => (await import("./commands/deployments.js")).command,
  replicas: async () => (await import("./commands/replicas.js")).command,
  nodes: async () => (await import("./commands/nodes.js")).command,
  "nodes reset": async () => (await import("./commands/nodes-reset.js")).command,
  "nodes revoke": async () => (await import("./commands/nodes-revoke.js")).command,
  "nodes show": async () => (await import("./commands/nodes-show.js")).command,
  "gpu clear": async () => (await import("./commands/gpu-clear.js")).command,
  status: async () => (await import("./commands/status.js")).command,
  scale: async () => (await import("./commands/scale.js")).command,
  undeploy: async () => (await import("./commands/undeploy.js")).command,
  cordon: async () => (await import("./commands/cordon.js")).command,
  uncordon: async () => (await import("./commands/uncordon.js")).command,
  unavoid: async () => (await import("./commands/unavoid.js")).command,
  drain: async () => (await import("./commands/drain.js")).command,
  events: async () => (await import("./commands/events.js")).command,
  "keys create": async () => (await import("./commands/keys-create.js")).command,
  "keys list": async () => (await import("./commands/keys-list.js")).command,
  "keys revoke": async () => (await import("./commands/keys-revoke.js")).command,
  "tenants create": async () => (await import("./commands/tenants-create.js")).command,
  "tenants list": async () => (await import("./commands/tenants-list.js")).command,
  "tenants update": async () => (await import("./commands/tenants-update.js")).command,
  "tenants delete": async () => (await import("./commands/tenants-delete.js")).command,
  router: async () => (await import("./commands/router.js")).command,
  routers: async () => (await import("./commands/routers.js")).command,
  usage: async () => (await import("./commands/usage.js")).command,
};
