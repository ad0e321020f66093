import { nodeActionCommand } from "../node-command.js";

export const command = nodeActionCommand(
  "nodes reset",
  "let the next agent registering as a node take it with the join token alone",
  `An agent re-registering as a node the control plane still holds must prove the node's
credential (saved in its state dir): the join token alone never takes over another node.
When that credential is lost (a restored or copied state dir, a reinstalled host) the agent
is refused with LLMGW_CONTROL_PLANE_NODE_ID_TAKEN and keeps retrying. This command lets the
next Register naming NODE within 15 minutes take it with the join token alone, once,
keeping its placements; unused, the reset lapses. The node keeps working with its current
credential until then.`,
  async (client, node) => {
    // Resolved first, so the output names the id the agent must send.
    const found = (await client.getNode({ node })).node;
    await client.resetNode({ node: found?.nodeId ?? node });
    return found;
  },
  () => "the next agent registering as it may take it with the join token alone, once",
);
