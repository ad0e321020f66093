import { toJson } from "@bufbuild/protobuf";
import { DeploymentStatusSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { WAIT_FLAGS, WAIT_TIMEOUT_HELP, waitForRollout, waitTimeoutMs } from "../lifecycle-wait.js";

export const command: Command = {
  name: "scale",
  summary: "set the replica count of a deployment (--wait to follow)",
  usage: `Usage: llmgw scale NAME REPLICAS [--wait [--timeout S]] [options]

Sets how many replicas a deployment runs. Existing replicas are not restarted; scaling
down drains the newest first (they finish their in-flight requests, then stop). With --wait,
shows each new replica's progress and each removed one draining (n in flight) → stopped.

Options:
  --wait               wait until exactly REPLICAS are ready and removed ones are gone
                       (exit 1 on failure or timeout; with --json the final status)
  --timeout S          ${WAIT_TIMEOUT_HELP}
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, { ...ADMIN_FLAGS, ...WAIT_FLAGS }, true);
    const [name, count] = positionals;
    if (!name || count === undefined || positionals.length !== 2)
      throw new UsageError("expected NAME and REPLICAS");
    if (!/^\d+$/.test(count) || Number(count) > 100_000)
      throw new UsageError(`REPLICAS must be a whole number 0–100000, got "${count}"`);
    const timeoutMs = waitTimeoutMs(values);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.scaleDeployment({ name, replicas: Number(count) });
      const status = res.deployment;
      if (values.wait) {
        const revision = status?.spec?.revision;
        if (revision === undefined)
          throw new Error("the control plane answered the scale without the deployment's revision");
        io.stderr.write(`${name}: scaling to ${count} replica(s)\n`);
        return waitForRollout(ctx, io, { name, revision, timeoutMs, doing: "scaling" });
      }
      if (ctx.json && status)
        io.stdout.write(`${JSON.stringify(toJson(DeploymentStatusSchema, status), null, 2)}\n`);
      else
        io.stdout.write(
          `${name}: ${status?.readyReplicas ?? 0}/${status?.desiredReplicas ?? count} ready\n`,
        );
      return 0;
    });
  },
};
