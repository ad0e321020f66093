import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { terminalText } from "../table.js";

export const command: Command = {
  name: "unavoid",
  summary: "let a deployment's replicas go to a node again after one kept failing there",
  usage: `Usage: llmgw unavoid DEPLOYMENT [NODE] [options]

When a replica's engine keeps failing on a node, the control plane moves it elsewhere
(llmgw control-plane --move-failed-after) and the deployment avoids that node: for an hour
after a first move, twice as long after each move in a row off the same node, at most a day.
'llmgw deployments DEPLOYMENT' lists the nodes it avoids. Once you have mended what failed
there (a driver, a full disk, a missing engine build), this lifts the avoidance at once and
the next move off that node counts as a first again. It moves no replica itself: new ones
may go to the node again, and a replica that stayed failing for want of another node is
offered to the scheduler again.
NODE is a node id or hostname; without it, every node the deployment avoids.

Options:
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length < 1 || positionals.length > 2)
      throw new UsageError("expected DEPLOYMENT and at most one NODE");
    const [deployment, node = ""] = positionals as [string, string?];
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const { nodeIds } = await ctx.client.unavoidNode({ deployment, node });
      if (ctx.json) io.stdout.write(`${JSON.stringify({ deployment, nodeIds })}\n`);
      else
        io.stdout.write(
          nodeIds.length === 0
            ? `${terminalText(deployment)} did not avoid ${node === "" ? "any node" : terminalText(node)}\n`
            : `${terminalText(deployment)} no longer avoids ${nodeIds.map(terminalText).join(", ")}\n`,
        );
      return 0;
    });
  },
};
