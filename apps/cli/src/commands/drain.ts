import { toJson } from "@bufbuild/protobuf";
import { escapeOutsideText } from "@llmgw/control-plane/client";
import { NodeSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { nodeStateText } from "../cluster-format.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { WAIT_FLAGS, WAIT_TIMEOUT_HELP, waitForDrain, waitTimeoutMs } from "../lifecycle-wait.js";

export const command: Command = {
  name: "drain",
  summary: "cordon a node and move its replicas elsewhere (--wait to follow)",
  usage: `Usage: llmgw drain NODE [--wait [--timeout S]] [options]

Cordons the node and moves its replicas to other nodes: each replacement starts elsewhere,
then the node's replica stops taking new requests, finishes those in flight (up to its
deployment's drainTimeoutSeconds) and stops. Use before maintenance; 'llmgw uncordon' when
done. With --wait, shows each replacement (placed → ready) and each of the node's replicas
(waiting → draining, n in flight → stopped) until none is left on the node.
NODE is a node id or hostname (see 'llmgw nodes').

Options:
  --wait               wait until no replica runs on the node (exit 1 on timeout)
  --timeout S          ${WAIT_TIMEOUT_HELP}
${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(argv, { ...ADMIN_FLAGS, ...WAIT_FLAGS }, true);
    if (positionals.length !== 1) throw new UsageError("expected exactly one NODE");
    const timeoutMs = waitTimeoutMs(values);
    const name = positionals[0] as string;
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const node = (await ctx.client.drainNode({ node: name })).node;
      if (ctx.json)
        io.stdout.write(`${JSON.stringify(node ? toJson(NodeSchema, node) : {}, null, 2)}\n`);
      else
        io.stdout.write(
          `${escapeOutsideText(`${node?.hostname ?? name} (${node?.nodeId ?? ""}): ${node ? nodeStateText(node) : "drain"}`)}\n`,
        );
      if (!values.wait) return 0;
      if (!node)
        throw new Error(`the control plane answered the drain of ${name} without the node`);
      return waitForDrain(ctx, io, { node, timeoutMs });
    });
  },
};
