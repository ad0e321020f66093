import { toJson } from "@bufbuild/protobuf";
import { DeploymentStatusSchema, ListDeploymentsResponseSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { deploymentDetail, deploymentRow } from "../cluster-format.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { renderTable } from "../table.js";

export const command: Command = {
  name: "deployments",
  summary: "list deployments with ready replicas, rollouts and problems",
  usage: `Usage: llmgw deployments [NAME] [options]

Lists deployments: model, engine, class, ready/desired replicas, revision, and why
replicas cannot be placed or failed, or the rollout under way (r1 → r2) or rolled back
(with why). With NAME, shows that deployment: its latest rollout, every problem, and its
replicas with their state (a leaving one: waiting or draining, n in flight) and revision.

Options:
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length > 1)
      throw new UsageError(`expected at most one NAME, got ${positionals.length}`);
    const name = positionals[0];
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      if (name !== undefined) {
        const d = (await ctx.client.getDeployment({ name })).deployment;
        if (ctx.json)
          io.stdout.write(
            `${JSON.stringify(d ? toJson(DeploymentStatusSchema, d) : {}, null, 2)}\n`,
          );
        else if (d) io.stdout.write(deploymentDetail(d, Date.now()));
        return 0;
      }
      const res = await ctx.client.listDeployments({});
      if (ctx.json) {
        io.stdout.write(`${JSON.stringify(toJson(ListDeploymentsResponseSchema, res), null, 2)}\n`);
        return 0;
      }
      io.stdout.write(
        renderTable(
          ["NAME", "MODEL", "ENGINE", "CLASS", "READY", "REV", "STATUS"],
          res.deployments.map(deploymentRow),
        ),
      );
      return 0;
    });
  },
};
