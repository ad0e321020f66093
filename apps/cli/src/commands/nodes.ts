import { toJson } from "@bufbuild/protobuf";
import { ListNodesResponseSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { nodeRow } from "../cluster-format.js";
import { type Command, parseCommandArgs } from "../command.js";
import { renderTable } from "../table.js";

export const command: Command = {
  name: "nodes",
  summary: "list the nodes of the cluster",
  usage: `Usage: llmgw nodes [options]\n\nLists nodes with their state, GPUs, allocation, agent version and last heartbeat.\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, ADMIN_FLAGS);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.listNodes({});
      if (ctx.json) {
        io.stdout.write(`${JSON.stringify(toJson(ListNodesResponseSchema, res), null, 2)}\n`);
        return 0;
      }
      const now = Date.now();
      io.stdout.write(
        renderTable(
          [
            "NODE",
            "HOSTNAME",
            "STATE",
            "GPUS",
            "ALLOCATED",
            "FABRICS",
            "ADDRESS",
            "VERSION",
            "HEARTBEAT",
          ],
          res.nodes.map((n) => nodeRow(n, now)),
        ),
      );
      return 0;
    });
  },
};
