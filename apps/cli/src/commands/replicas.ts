import { toJson } from "@bufbuild/protobuf";
import { ListReplicasResponseSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { replicaRow } from "../cluster-format.js";
import { type Command, parseCommandArgs } from "../command.js";
import { renderTable } from "../table.js";

export const command: Command = {
  name: "replicas",
  summary: "list replicas with state, placement and endpoint",
  usage: `Usage: llmgw replicas [--deployment D] [--node N] [options]\n\nLists replicas: state (least advanced of its ranks; a leaving replica adds waiting (serves\nuntil its replacement is ready) or draining, why it leaves, its requests in flight and the\ntime left before it is stopped anyway), where each rank runs, endpoint.\n\nOptions:\n  --deployment D       only this deployment\n  --node N             only replicas with a rank on this node (id or hostname)\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      ...ADMIN_FLAGS,
      deployment: { type: "string" },
      node: { type: "string" },
    });
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.listReplicas({
        deployment: values.deployment ?? "",
        node: values.node ?? "",
      });
      if (ctx.json) {
        io.stdout.write(`${JSON.stringify(toJson(ListReplicasResponseSchema, res), null, 2)}\n`);
        return 0;
      }
      const now = Date.now();
      io.stdout.write(
        renderTable(
          ["REPLICA", "DEPLOYMENT", "STATE", "PLACEMENT", "ENDPOINT", "AGE"],
          res.replicas.map((r) => replicaRow(r, now)),
        ),
      );
      return 0;
    });
  },
};
