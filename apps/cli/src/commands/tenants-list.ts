import { toJson } from "@bufbuild/protobuf";
import { ListTenantsResponseSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs } from "../command.js";
import { renderTable } from "../table.js";
import { formatBudget, formatPriority } from "../tenant-flags.js";

export const command: Command = {
  name: "tenants list",
  summary: "list tenants with their limits, budgets, priority and active keys",
  usage: `Usage: llmgw tenants list [options]\n\nLists tenants: limits, budgets (as --budget spells them), priority, weight, the cache\nisolation they ask of every router ("-": each router's own) and how many of their API\nkeys are active.\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, ADMIN_FLAGS);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.listTenants({});
      if (ctx.json) {
        io.stdout.write(`${JSON.stringify(toJson(ListTenantsResponseSchema, res), null, 2)}\n`);
        return 0;
      }
      const opt = (v: number | undefined) => (v === undefined ? "-" : String(v));
      io.stdout.write(
        renderTable(
          [
            "NAME",
            "RPM",
            "TPM",
            "CONCURRENCY",
            "BUDGETS",
            "PRIORITY",
            "WEIGHT",
            "ISOLATION",
            "KEYS",
          ],
          res.tenants.map((t) => [
            t.name,
            opt(t.requestsPerMinute),
            opt(t.tokensPerMinute),
            opt(t.maxConcurrency),
            t.budgets.map(formatBudget).join(",") || "-",
            formatPriority(t.priority, "standard"),
            String(t.weight),
            // "-": each router's own --cache-isolation.
            t.cacheIsolation || "-",
            String(t.activeKeys),
          ]),
        ),
      );
      return 0;
    });
  },
};
