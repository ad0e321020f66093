import { toJson } from "@bufbuild/protobuf";
import { EventSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { eventLine } from "../cluster-format.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "events",
  summary: "show recent cluster events (--follow to stream)",
  usage: `Usage: llmgw events [--limit N] [--follow] [options]\n\nRecent events, oldest first: nodes joining and going unreachable, placements, replica\nstate changes, failures. --follow keeps streaming new ones until Ctrl-C.\n\nOptions:\n  --limit N            how many recent events (default 50)\n  --follow, -f         stream new events\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      ...ADMIN_FLAGS,
      limit: { type: "string" },
      follow: { type: "boolean", short: "f" },
    });
    // Digits only, as every count flag: Number() would also take "1e3", "0x10" and " 5 ".
    const limit = values.limit === undefined ? 50 : Number(values.limit);
    if ((values.limit !== undefined && !/^\d+$/.test(values.limit)) || limit < 1 || limit > 100_000)
      throw new UsageError(`--limit must be a whole number in 1–100000, got "${values.limit}"`);
    const ctx = adminContext(values, io);
    const print = (e: Parameters<typeof eventLine>[0]) =>
      io.stdout.write(
        ctx.json ? `${JSON.stringify(toJson(EventSchema, e))}\n` : `${eventLine(e)}\n`,
      );
    return runAdmin(io, ctx, async () => {
      if (!values.follow) {
        for (const e of (await ctx.client.listEvents({ limit })).events) print(e);
        return 0;
      }
      try {
        for await (const res of ctx.client.watchEvents({ backlog: limit }, { signal: io.signal })) {
          if (res.event) print(res.event);
        }
      } catch (error) {
        if (io.signal.aborted) return 0;
        throw error;
      }
      return 0;
    });
  },
};
