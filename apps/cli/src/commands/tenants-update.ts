import { toJson } from "@bufbuild/protobuf";
import { escapeOutsideText } from "@llmgw/control-plane/client";
import { TenantSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { tenantFromFlags } from "../tenant-flags.js";
import { TENANT_FLAGS, TENANT_FLAGS_USAGE } from "./tenants-create.js";

/**
 * `--clear-X` flags: each clears one field (a limit to none, budgets to none, priority to
 * standard, cache isolation to each router's own).
 */
const CLEAR_FLAGS = {
  "clear-rpm": { type: "boolean" },
  "clear-tpm": { type: "boolean" },
  "clear-max-concurrency": { type: "boolean" },
  "clear-budgets": { type: "boolean" },
  "clear-priority": { type: "boolean" },
  "clear-cache-isolation": { type: "boolean" },
} as const;

export const command: Command = {
  name: "tenants update",
  summary: "change a tenant's limits, budgets, priority, weight or cache isolation",
  usage: `Usage: llmgw tenants update NAME [flags of tenants create] [--clear-rpm] [--clear-tpm] [--clear-max-concurrency] [--clear-budgets] [--clear-priority] [--clear-cache-isolation] [options]\n\nChanges only the fields given; the others keep their values. --budget replaces every\nbudget with those given.\n\nOptions:\n${TENANT_FLAGS_USAGE}  --clear-rpm, --clear-tpm, --clear-max-concurrency\n                       remove that limit\n  --clear-budgets      remove every budget\n  --clear-priority     back to standard\n  --clear-cache-isolation\n                       back to each router's own --cache-isolation\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(
      argv,
      { ...ADMIN_FLAGS, ...TENANT_FLAGS, ...CLEAR_FLAGS },
      true,
    );
    if (positionals.length !== 1) throw new UsageError("expected exactly one tenant NAME");
    const fields: string[] = [];
    /** The field set by `flag` or cleared by `--clear-…`; both is a usage error. */
    const change = (field: string, flag: string, set: boolean, clear?: string) => {
      if (set && clear !== undefined && values[clear as keyof typeof CLEAR_FLAGS])
        throw new UsageError(`--${flag} and --${clear} contradict each other`);
      if (set || (clear !== undefined && values[clear as keyof typeof CLEAR_FLAGS]))
        fields.push(field);
    };
    change("requests_per_minute", "rpm", values.rpm !== undefined, "clear-rpm");
    change("tokens_per_minute", "tpm", values.tpm !== undefined, "clear-tpm");
    change(
      "max_concurrency",
      "max-concurrency",
      values["max-concurrency"] !== undefined,
      "clear-max-concurrency",
    );
    change("budgets", "budget", values.budget !== undefined, "clear-budgets");
    change("priority", "priority", values.priority !== undefined, "clear-priority");
    change("weight", "weight", values.weight !== undefined);
    change(
      "cache_isolation",
      "cache-isolation",
      values["cache-isolation"] !== undefined,
      "clear-cache-isolation",
    );
    if (fields.length === 0)
      throw new UsageError("nothing to change: give at least one of the flags below");
    const tenant = tenantFromFlags(positionals[0] as string, values);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.updateTenant({ tenant, fields });
      if (ctx.json && res.tenant)
        io.stdout.write(`${JSON.stringify(toJson(TenantSchema, res.tenant), null, 2)}\n`);
      else
        io.stdout.write(
          `updated tenant ${escapeOutsideText(res.tenant?.name ?? "")} (${fields.join(", ")})\n`,
        );
      return 0;
    });
  },
};
