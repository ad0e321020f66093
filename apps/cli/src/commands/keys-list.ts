import { toJson } from "@bufbuild/protobuf";
import { ListApiKeysResponseSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs } from "../command.js";
import { renderTable } from "../table.js";
import { formatPriority } from "../tenant-flags.js";

export const command: Command = {
  name: "keys list",
  summary: "list API keys (never their secrets)",
  usage: `Usage: llmgw keys list [--all] [options]\n\nLists API keys with their limits. Secrets are never stored, only a prefix.\n\nOptions:\n  --all                include revoked keys\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, { ...ADMIN_FLAGS, all: { type: "boolean" } });
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.listApiKeys({ includeRevoked: values.all ?? false });
      if (ctx.json) {
        io.stdout.write(`${JSON.stringify(toJson(ListApiKeysResponseSchema, res), null, 2)}\n`);
        return 0;
      }
      const opt = (v: number | undefined) => (v === undefined ? "-" : String(v));
      io.stdout.write(
        renderTable(
          [
            "ID",
            "NAME",
            "PREFIX",
            "MODELS",
            "TENANT",
            "PRIORITY",
            "RPM",
            "TPM",
            "CONCURRENCY",
            "CREATED",
            "REVOKED",
          ],
          res.keys.map((k) => [
            k.id,
            k.name,
            `${k.prefix}…`,
            k.models.join(",") || "all",
            k.tenant || "-",
            // Unspecified: the tenant's class, else standard.
            formatPriority(k.priority, k.tenant ? "(tenant's)" : "standard"),
            opt(k.requestsPerMinute),
            opt(k.tokensPerMinute),
            opt(k.maxConcurrency),
            new Date(Number(k.createdAtUnixMs)).toISOString().slice(0, 19),
            k.revokedAtUnixMs === undefined
              ? "-"
              : new Date(Number(k.revokedAtUnixMs)).toISOString().slice(0, 19),
          ]),
        ),
      );
      return 0;
    });
  },
};
