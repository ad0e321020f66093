import { nodeActionCommand } from "../node-command.js";

export const command = nodeActionCommand(
  "drain",
  "cordon a node and move its replicas elsewhere",
  "Cordons the node and moves its replicas to other nodes (each is stopped here and started\nthere). Use before maintenance; 'llmgw uncordon' when done.",
  async (client, node) => (await client.drainNode({ node })).node,
);
