import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { terminalText } from "../table.js";

export const command: Command = {
  name: "gpu clear",
  summary: "declare a GPU's kernel-log faults dealt with, after resetting or replacing it",
  usage: `Usage: llmgw gpu clear NODE GPU [options]

A GPU whose kernel log holds an actionable fault (an Xid or SXid whose action is reset-gpu,
drain-node or reboot) takes no replicas. A reboot is observed (the agent reads only the new
boot's log), a GPU reset is not: the old records stay in the kernel log until the next boot.
After resetting or replacing the GPU, this command tells the control plane that its current
faults are dealt with; they stop counting (the clear survives a control-plane restart), and
a record of the same fault seen after this makes the GPU unhealthy again. Nothing clears a
fault by time. See the faults with 'llmgw nodes show NODE'.
NODE is a node id or hostname; GPU is the GPU's index on that node.

Options:
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
    if (positionals.length !== 2) throw new UsageError("expected NODE and GPU");
    const [node, gpuText] = positionals as [string, string];
    if (!/^(0|[1-9][0-9]{0,3})$/.test(gpuText))
      throw new UsageError(`GPU must be a GPU index (0, 1, …), got "${gpuText}"`);
    const gpuIndex = Number(gpuText);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const { cleared } = await ctx.client.clearGpuFaults({ node, gpuIndex });
      if (ctx.json) io.stdout.write(`${JSON.stringify({ node, gpuIndex, cleared })}\n`);
      else
        io.stdout.write(
          `${terminalText(node)} GPU ${gpuIndex}: ${
            cleared === 0
              ? "no fault was counting"
              : `${cleared} fault${cleared === 1 ? "" : "s"} cleared; a record seen after this counts again`
          }\n`,
        );
      return 0;
    });
  },
};
