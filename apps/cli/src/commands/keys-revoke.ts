import { toJson } from "@bufbuild/protobuf";
import { escapeOutsideText } from "@llmgw/control-plane/client";
import { ApiKeySchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "keys revoke",
  summary: "revoke an API key by id or name",
  usage: `Usage: llmgw keys revoke ID|NAME [options]\n\nRevokes the key; requests with it are refused from now on.\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length !== 1) throw new UsageError("expected exactly one key ID or NAME");
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.revokeApiKey({ key: positionals[0] as string });
      if (ctx.json && res.key)
        io.stdout.write(`${JSON.stringify(toJson(ApiKeySchema, res.key), null, 2)}\n`);
      else
        io.stdout.write(
          `${escapeOutsideText(`revoked API key ${res.key?.name} (${res.key?.id})`)}\n`,
        );
      return 0;
    });
  },
};
