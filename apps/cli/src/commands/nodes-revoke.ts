import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "nodes revoke",
  summary: "forget a node and revoke its credential; its replicas are placed elsewhere",
  usage: `Usage: llmgw nodes revoke NODE [options]

Forgets NODE and revokes its node credential: its replicas are placed elsewhere, its next
heartbeat is refused (LLMGW_CONTROL_PLANE_NODE_REVOKED), and its agent must join again with
the join token, as a new node. Use it for a node that will not come back (it also frees its
place under the control plane's --max-nodes), or one that must not be trusted any more.
NODE is a node id or hostname (see 'llmgw nodes').

Options:
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length !== 1) throw new UsageError("expected exactly one NODE");
    const node = positionals[0] as string;
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      // Resolve a hostname first, so the output names the id that was revoked.
      const found = (await ctx.client.getNode({ node })).node;
      const nodeId = found?.nodeId ?? node;
      await ctx.client.revokeNode({ node: nodeId });
      if (ctx.json) io.stdout.write(`${JSON.stringify({ nodeId })}\n`);
      else
        io.stdout.write(
          `revoked ${found?.hostname ?? node} (${nodeId}): its replicas move elsewhere; its agent must join again\n`,
        );
      return 0;
    });
  },
};
