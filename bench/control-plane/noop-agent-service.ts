/**
 * The baseline target of the control-plane benchmark: a do-nothing `AgentService` on the same
 * Connect-over-HTTP/1.1 stack as the control plane, in its own process. Register hands out the
 * hostname as node id; Heartbeat decodes the request and answers an empty desired set. What it
 * costs at the fleet's heartbeat rate is the floor the transport, the protobuf codec and this
 * machine's load put under any control plane; the benchmark runs it side by side.
 *
 * With `fast`, the same do-nothing answers go through the control plane's own fast path
 * (`createAgentFastPath`: Heartbeat, ReportLoad and the two agent streams read off the
 * socket, Connect's handler for the rest): the floor of llmgw's transport, so that the control
 * plane's ratio against it is what its own handling costs.
 *
 *   node --conditions=@llmgw/source --import tsx bench/control-plane/noop-agent-service.ts [INTERVAL_MS] [fast]
 *
 * Prints `{"url":"http://127.0.0.1:PORT"}` once listening; exits on SIGTERM.
 */
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { createAgentFastPath } from "@llmgw/control-plane";
import {
  AgentService,
  HeartbeatResponseSchema,
  ReportLoadResponseSchema,
  StreamHeartbeatResponseSchema,
  StreamLoadResponseSchema,
} from "@llmgw/proto";

const intervalMs = Number(process.argv[2] ?? 2_000);
const fast = process.argv[3] === "fast";

const connect = connectNodeAdapter({
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

/** Sessions that take every message and do nothing with it. */
const nothing = <O>(finish: () => O) => ({ take() {}, finish });
const fastPath = createAgentFastPath({
  streams: {
    streamLoad: () => nothing(() => create(StreamLoadResponseSchema, {})),
    streamHeartbeat: () => nothing(() => create(StreamHeartbeatResponseSchema, {})),
  },
  calls: {
    heartbeat: (req) =>
      create(HeartbeatResponseSchema, {
        generation: req.generationSeen,
        heartbeatIntervalMs: intervalMs,
      }),
    reportLoad: () => create(ReportLoadResponseSchema, {}),
  },
  durable: () => Promise.resolve(),
  readMaxBytes: 4 * 1024 * 1024,
});

const server = createServer(
  fast
    ? (req, res) => {
        if (!fastPath(req, res)) connect(req, res);
      }
    : connect,
);
server.listen(0, "127.0.0.1", () => {
  const { port } = server.address() as AddressInfo;
  process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${port}` })}\n`);
});
process.once("SIGTERM", () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
