import { toJson } from "@bufbuild/protobuf";
import { ListDeploymentsResponseSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { deploymentRow } from "../cluster-format.js";
import { type Command, parseCommandArgs } from "../command.js";
import { renderTable } from "../table.js";

export const command: Command = {
  name: "deployments",
  summary: "list deployments with ready replicas and problems",
  usage: `Usage: llmgw deployments [options]\n\nLists deployments: model, engine, class, ready/desired replicas, revision, and why\nreplicas cannot be placed or failed.\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, ADMIN_FLAGS);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
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
