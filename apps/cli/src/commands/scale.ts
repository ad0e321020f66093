import { toJson } from "@bufbuild/protobuf";
import { DeploymentStatusSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "scale",
  summary: "set the replica count of a deployment",
  usage: `Usage: llmgw scale NAME REPLICAS [options]\n\nSets how many replicas a deployment runs. Existing replicas are not restarted; scaling\ndown stops the newest first.\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    const [name, count] = positionals;
    if (!name || count === undefined || positionals.length !== 2)
      throw new UsageError("expected NAME and REPLICAS");
    if (!/^\d+$/.test(count) || Number(count) > 100_000)
      throw new UsageError(`REPLICAS must be a whole number 0–100000, got "${count}"`);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.scaleDeployment({ name, replicas: Number(count) });
      if (ctx.json && res.deployment)
        io.stdout.write(
          `${JSON.stringify(toJson(DeploymentStatusSchema, res.deployment), null, 2)}\n`,
        );
      else
        io.stdout.write(
          `${name}: ${res.deployment?.readyReplicas ?? 0}/${res.deployment?.desiredReplicas ?? count} ready\n`,
        );
      return 0;
    });
  },
};
