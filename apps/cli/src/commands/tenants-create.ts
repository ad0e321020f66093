import { toJson } from "@bufbuild/protobuf";
import { escapeOutsideText } from "@llmgw/control-plane/client";
import { TenantSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { tenantFromFlags } from "../tenant-flags.js";

/** The flags that set a tenant's fields, shared by `tenants create` and `tenants update`. */
export const TENANT_FLAGS = {
  rpm: { type: "string" },
  tpm: { type: "string" },
  "max-concurrency": { type: "string" },
  budget: { type: "string", multiple: true },
  priority: { type: "string" },
  weight: { type: "string" },
  "cache-isolation": { type: "string" },
} as const;

export const TENANT_FLAGS_USAGE = `  --rpm N              requests per minute, all the tenant's keys together
  --tpm N              tokens per minute, all its keys together
  --max-concurrency N  concurrent requests, all its keys together
  --budget P[:MODEL]=N most tokens per UTC day or month, e.g. day=1000000 or
                       month:llama-3-8b=50000000 (repeat for several; no MODEL: every model)
  --priority CLASS     critical, standard (the default) or batch: served in that order when
                       a deployment is at capacity; its keys inherit it
  --weight N           1–1000 (default 1): its share of its class under contention
  --cache-isolation M  tenant or key: every router keeps this tenant's engine prefix caches
                       apart, whatever its own --cache-isolation (tenant: its keys share one
                       cache no other tenant's requests reach; key: each key alone)
`;

export const command: Command = {
  name: "tenants create",
  summary: "create a tenant: a team whose limits bound all its API keys together",
  usage: `Usage: llmgw tenants create NAME [--rpm N] [--tpm N] [--max-concurrency N] [--budget P[:MODEL]=N ...] [--priority CLASS] [--weight N] [--cache-isolation tenant|key] [options]\n\nCreates a tenant. Keys created with --tenant NAME then count against its limits and\nbudgets as well as their own.\n\nNAME: lower-case letters, digits and '-', at most 63 characters.\n\nOptions:\n${TENANT_FLAGS_USAGE}${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(
      argv,
      { ...ADMIN_FLAGS, ...TENANT_FLAGS },
      true,
    );
    if (positionals.length !== 1) throw new UsageError("expected exactly one tenant NAME");
    const tenant = tenantFromFlags(positionals[0] as string, values);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.createTenant({ tenant });
      if (ctx.json && res.tenant)
        io.stdout.write(`${JSON.stringify(toJson(TenantSchema, res.tenant), null, 2)}\n`);
      else io.stdout.write(`created tenant ${escapeOutsideText(res.tenant?.name ?? "")}\n`);
      return 0;
    });
  },
};
