import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "tenants delete",
  summary: "delete a tenant that has no active API keys",
  usage: `Usage: llmgw tenants delete NAME [options]\n\nDeletes a tenant. Refused while any of its API keys is active: revoke them first\n(llmgw keys list shows each key's tenant).\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length !== 1) throw new UsageError("expected exactly one tenant NAME");
    const name = positionals[0] as string;
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      await ctx.client.deleteTenant({ name });
      if (ctx.json) io.stdout.write(`${JSON.stringify({ deleted: name })}\n`);
      else io.stdout.write(`deleted tenant ${name}\n`);
      return 0;
    });
  },
};
