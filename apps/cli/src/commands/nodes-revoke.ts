import { nodeActionCommand } from "../node-command.js";

export const command = nodeActionCommand(
  "nodes revoke",
  "forget a node and revoke its credential; its replicas are placed elsewhere",
  `Forgets NODE and revokes its node credential: its replicas are placed elsewhere, its next
heartbeat is refused (LLMGW_CONTROL_PLANE_NODE_REVOKED), and its agent must join again with
the join token, as a new node. Use it for a node that will not come back (it also frees its
place under the control plane's --max-nodes), or one that must not be trusted any more.`,
  async (client, node) => {
    const found = (await client.getNode({ node })).node;
    await client.revokeNode({ node: found?.nodeId ?? node });
    return found;
  },
  () => "revoked; its replicas move elsewhere and its agent must join again",
);
