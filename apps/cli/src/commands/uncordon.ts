import { nodeActionCommand } from "../node-command.js";

export const command = nodeActionCommand(
  "uncordon",
  "allow new replicas on a node again",
  "Clears cordon and drain: the node takes new replicas again (moved replicas do not come back).",
  async (client, node) => (await client.uncordonNode({ node })).node,
);
