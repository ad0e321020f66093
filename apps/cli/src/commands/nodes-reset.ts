import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "nodes reset",
  summary: "let the next agent registering as a node take it with the join token alone",
  usage: `Usage: llmgw nodes reset NODE [options]

An agent re-registering as a node the control plane still holds must prove the node's
credential (saved in its state dir): the join token alone never takes over another node.
When that credential is lost (a restored or copied state dir, a reinstalled host) the agent
is refused with LLMGW_CONTROL_PLANE_NODE_ID_TAKEN and keeps retrying. This command lets the
next Register naming NODE within 15 minutes take it with the join token alone, once,
keeping its placements; unused, the reset lapses. The node keeps working with its current
credential until then.
NODE is a node id or hostname (see 'llmgw nodes').

Options:
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length !== 1) throw new UsageError("expected exactly one NODE");
    const node = positionals[0] as string;
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      // Resolve a hostname to its id first, so the output names what the agent must send.
      const found = (await ctx.client.getNode({ node })).node;
      await ctx.client.resetNode({ node: found?.nodeId ?? node });
      if (ctx.json) io.stdout.write(`${JSON.stringify({ nodeId: found?.nodeId ?? node })}\n`);
      else
        io.stdout.write(
          `reset ${found?.hostname ?? node} (${found?.nodeId ?? node}): the next agent registering as it may take it with the join token alone, once\n`,
        );
      return 0;
    });
  },
};
