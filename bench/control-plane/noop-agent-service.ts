/**
 * The baseline target of the control-plane benchmark: a do-nothing `AgentService` on the same
 * Connect-over-HTTP/1.1 stack as the control plane, in its own process. Register hands out the
 * hostname as node id; Heartbeat decodes the request and answers an empty desired set. What it
 * costs at the fleet's heartbeat rate is the floor the transport, the protobuf codec and this
 * machine's load put under any control plane; the benchmark runs it side by side.
 *
 *   node --conditions=@llmgw/source --import tsx bench/control-plane/noop-agent-service.ts [INTERVAL_MS]
 *
 * Prints `{"url":"http://127.0.0.1:PORT"}` once listening; exits on SIGTERM.
 */
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { AgentService } from "@llmgw/proto";

const intervalMs = Number(process.argv[2] ?? 2_000);

const handler = connectNodeAdapter({
  routes: (router) =>
    router.service(AgentService, {
      register(req) {
        return {
          nodeId: req.inventory?.hostname ?? "node",
          nodeCredential: "noop",
          heartbeatIntervalMs: intervalMs,
        };
      },
      heartbeat(req) {
        return { generation: req.generationSeen, assignments: [], heartbeatIntervalMs: intervalMs };
      },
    }),
});

const server = createServer(handler);
server.listen(0, "127.0.0.1", () => {
  const { port } = server.address() as AddressInfo;
  process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${port}` })}\n`);
});
process.once("SIGTERM", () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
