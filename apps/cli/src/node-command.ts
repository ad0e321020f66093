import { toJson } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { escapeOutsideText } from "@llmgw/control-plane/client";
import { type ClusterService, type Node, NodeSchema } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "./admin-client.js";
import { nodeStateText } from "./cluster-format.js";
import { type Command, parseCommandArgs, UsageError } from "./command.js";

/**
 * Builds `llmgw cordon|uncordon|drain|nodes reset|nodes revoke NODE`: one RPC on a node by id
 * or hostname. `call` returns the node as it now is (or was, for a revoked one); `done`
 * words the outcome for humans (default: the node's state).
 */
export function nodeActionCommand(
  name: string,
  summary: string,
  explain: string,
  call: (client: Client<typeof ClusterService>, node: string) => Promise<Node | undefined>,
  done: (node: Node | undefined) => string = (node) => (node ? nodeStateText(node) : name),
): Command {
  return {
    name,
    summary,
    usage: `Usage: llmgw ${name} NODE [options]\n\n${explain}\nNODE is a node id or hostname (see 'llmgw nodes').\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
    async run(argv, io) {
      const { values, positionals } = parseCommandArgs(argv, ADMIN_FLAGS, true);
      if (positionals.length !== 1) throw new UsageError("expected exactly one NODE");
      const ctx = adminContext(values, io);
      return runAdmin(io, ctx, async () => {
        const node = await call(ctx.client, positionals[0] as string);
        if (ctx.json)
          io.stdout.write(`${JSON.stringify(node ? toJson(NodeSchema, node) : {}, null, 2)}\n`);
        else
          io.stdout.write(
            `${escapeOutsideText(`${node?.hostname ?? positionals[0]} (${node?.nodeId ?? ""}): ${done(node)}`)}\n`,
          );
        return 0;
      });
    },
  };
}
