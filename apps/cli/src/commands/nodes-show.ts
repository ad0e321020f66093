import { toJson } from "@bufbuild/protobuf";
import { NodeSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { nodeDetail } from "../cluster-format.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

export const command: Command = {
  name: "nodes show",
  summary: "show one node: its GPUs' health and kernel-log faults",
  usage: `Usage: llmgw nodes show NODE [options]

Shows one node: state, address, fabrics, each GPU's health as the control plane decides it,
and every kernel-log fault (Xid, SXid) that still counts or is reported, per GPU: code,
action, count, first seen and the kernel's own line. A GPU with an actionable fault
(reset-gpu, drain-node, reboot) takes no replicas until 'llmgw gpu clear NODE GPU' (after
the reset) or a reboot that the agent observes.
NODE is a node id or hostname (see 'llmgw nodes').

Options:
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length !== 1) throw new UsageError("expected exactly one NODE");
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const node = (await ctx.client.getNode({ node: positionals[0] as string })).node;
      if (ctx.json)
        io.stdout.write(`${JSON.stringify(node ? toJson(NodeSchema, node) : {}, null, 2)}\n`);
      else if (node) io.stdout.write(nodeDetail(node, Date.now()));
      return 0;
    });
  },
};
