import { toJson } from "@bufbuild/protobuf";
import { GetUsageResponseSchema, UsageGranularity } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { renderTable } from "../table.js";
import {
  parseUsageGranularity,
  parseUsageGroups,
  parseUsageTime,
  USAGE_TIME_FORMS,
  usageCsv,
  usageTable,
} from "../usage-format.js";

export const command: Command = {
  name: "usage",
  summary: "show tokens, requests and GPU-seconds used, per tenant, key and model",
  usage: `Usage: llmgw usage [--tenant T] [--key K] [--model M] [--since WHEN] [--until WHEN]
                  [--by minute|hour|day] [--group tenant,key,model] [--json|--csv] [options]

What the routers counted: requests, prompt tokens (of which cached, where the engine
reported them: "-" where none did), completion tokens, GPU-seconds, requests charged an
estimate and answers whose usage was refused, per period and group, with a TOTAL row. Days are UTC days, as budgets count them. Minute rows are kept
48 hours, hour rows 90 days, day rows for good.

Options:
  --tenant T           only this tenant's usage
  --key K              only this key's (its id or name)
  --model M            only this served model's
  --since WHEN         period start (default 7d): ${USAGE_TIME_FORMS}
  --until WHEN         period end, exclusive (default now)
  --by G               rows per minute, hour or day (default day)
  --group DIMS         kept apart, comma-separated: tenant, key, model (default tenant,model);
                       the others are summed over
  --csv                CSV (RFC 4180) with a header row, one line per row, no total; a
                       name starting with =, +, -, @, tab or CR gets a leading ' so that a
                       spreadsheet shows it as text instead of running it as a formula
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      ...ADMIN_FLAGS,
      tenant: { type: "string" },
      key: { type: "string" },
      model: { type: "string" },
      since: { type: "string" },
      until: { type: "string" },
      by: { type: "string" },
      group: { type: "string" },
      csv: { type: "boolean" },
    });
    if (values.json && values.csv) throw new UsageError("--json and --csv exclude each other");
    const now = Date.now();
    const time = (flag: string, text: string) => {
      const ms = parseUsageTime(text, now);
      if (ms === undefined)
        throw new UsageError(`--${flag} must be ${USAGE_TIME_FORMS}, got "${text}"`);
      return ms;
    };
    const since = time("since", values.since ?? "7d");
    const until = values.until === undefined ? undefined : time("until", values.until);
    if (until !== undefined && until <= since)
      throw new UsageError(
        `--until (${values.until}) must be after --since (${values.since ?? "7d"})`,
      );
    const granularity =
      values.by === undefined ? UsageGranularity.DAY : parseUsageGranularity(values.by);
    if (granularity === undefined)
      throw new UsageError(`--by must be minute, hour or day, got "${values.by}"`);
    const groups = values.group === undefined ? [] : parseUsageGroups(values.group);
    if (groups === undefined)
      throw new UsageError(
        `--group must be tenant, key and/or model, comma-separated, each once, got "${values.group}"`,
      );
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.getUsage({
        tenant: values.tenant ?? "",
        key: values.key ?? "",
        model: values.model ?? "",
        sinceUnixMs: BigInt(since),
        ...(until === undefined ? {} : { untilUnixMs: BigInt(until) }),
        granularity,
        groupBy: groups,
      });
      if (ctx.json) {
        io.stdout.write(`${JSON.stringify(toJson(GetUsageResponseSchema, res), null, 2)}\n`);
        return 0;
      }
      if (values.csv) {
        io.stdout.write(usageCsv(res.rows));
        return 0;
      }
      const table = usageTable(res.rows, groups, granularity);
      io.stdout.write(renderTable(table.headers, table.rows));
      return 0;
    });
  },
};
