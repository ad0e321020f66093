import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "undeploy",
  summary: "delete a deployment and stop its replicas",
  usage: `Usage: llmgw undeploy NAME [options]\n\nDeletes the deployment; agents stop its replicas on their next heartbeat.\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length !== 1) throw new UsageError("expected exactly one deployment NAME");
    const name = positionals[0] as string;
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      await ctx.client.deleteDeployment({ name });
      io.stdout.write(ctx.json ? `${JSON.stringify({ deleted: name })}\n` : `deleted ${name}\n`);
      return 0;
    });
  },
};
