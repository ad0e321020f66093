import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import {
  WAIT_FLAGS,
  WAIT_TIMEOUT_HELP,
  waitForReplicasGone,
  waitTimeoutMs,
} from "../lifecycle-wait.js";

export const command: Command = {
  name: "undeploy",
  summary: "delete a deployment and stop its replicas (--wait to follow)",
  usage: `Usage: llmgw undeploy NAME [--wait [--timeout S]] [options]

Deletes the deployment; each replica stops taking new requests, finishes those in flight
(up to the deployment's drainTimeoutSeconds) and stops. With --wait, shows each replica
draining (n in flight) → stopped until none is left.

Options:
  --wait               wait until every replica stopped (exit 1 on timeout)
  --timeout S          ${WAIT_TIMEOUT_HELP}
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, { ...ADMIN_FLAGS, ...WAIT_FLAGS }, true);
    if (positionals.length !== 1) throw new UsageError("expected exactly one deployment NAME");
    const timeoutMs = waitTimeoutMs(values);
    const name = positionals[0] as string;
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      await ctx.client.deleteDeployment({ name });
      io.stdout.write(ctx.json ? `${JSON.stringify({ deleted: name })}\n` : `deleted ${name}\n`);
      return values.wait ? waitForReplicasGone(ctx, io, { deployment: name, timeoutMs }) : 0;
    });
  },
};
