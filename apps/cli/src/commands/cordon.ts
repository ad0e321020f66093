import { nodeActionCommand } from "../node-command.js";

export const command = nodeActionCommand(
  "cordon",
  "stop placing new replicas on a node",
  "Stops placing new replicas on the node; replicas already there keep running.",
  async (client, node) => (await client.cordonNode({ node })).node,
);
