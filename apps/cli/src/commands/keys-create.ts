import { toJson } from "@bufbuild/protobuf";
import { escapeOutsideText } from "@llmgw/control-plane/client";
import { ApiKeySchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { parseBudgetFlags, parseLimitFlag, parsePriorityFlag } from "../tenant-flags.js";

export const command: Command = {
  name: "keys create",
  summary: "create an API key for the OpenAI-compatible API (shown once)",
  usage: `Usage: llmgw keys create --name N [--models a,b] [--rpm N] [--tpm N] [--max-concurrency N] [--tenant T] [--priority CLASS] [--budget P[:MODEL]=N ...] [options]\n\nCreates an API key and prints its secret once; only a hash is stored.\n\nOptions:\n  --name N             a name to recognise the key by (unique among active keys)\n  --models a,b         served model names the key may call (default: all)\n  --rpm N              requests per minute\n  --tpm N              tokens per minute\n  --max-concurrency N  concurrent requests\n  --tenant T           the tenant that owns the key (llmgw tenants create): its limits\n                       and budgets apply too\n  --priority CLASS     critical, standard or batch (default: the tenant's, else standard)\n  --budget P[:MODEL]=N most tokens per UTC day or month, e.g. day=1000000 or\n                       month:llama-3-8b=50000000 (repeat for several)\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      ...ADMIN_FLAGS,
      name: { type: "string" },
      models: { type: "string" },
      rpm: { type: "string" },
      tpm: { type: "string" },
      "max-concurrency": { type: "string" },
      tenant: { type: "string" },
      priority: { type: "string" },
      budget: { type: "string", multiple: true },
    });
    if (!values.name) throw new UsageError("--name is required");
    const request = {
      name: values.name,
      models: (values.models ?? "")
        .split(",")
        .map((m) => m.trim())
        .filter((m) => m !== ""),
      requestsPerMinute: parseLimitFlag(values.rpm, "--rpm"),
      tokensPerMinute: parseLimitFlag(values.tpm, "--tpm"),
      maxConcurrency: parseLimitFlag(values["max-concurrency"], "--max-concurrency"),
      tenant: values.tenant ?? "",
      priority: parsePriorityFlag(values.priority),
      budgets: parseBudgetFlags(values.budget),
    };
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.createApiKey(request);
      if (ctx.json) {
        io.stdout.write(
          `${JSON.stringify({ key: res.key ? toJson(ApiKeySchema, res.key) : null, secret: res.secret }, null, 2)}\n`,
        );
      } else {
        io.stdout.write(`${res.secret}\n`);
        io.stderr.write(
          `${escapeOutsideText(`created API key ${res.key?.name} (${res.key?.id}); the secret above is shown only once`)}\n`,
        );
      }
      return 0;
    });
  },
};
