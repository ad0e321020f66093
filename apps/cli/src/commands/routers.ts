import { toJson } from "@bufbuild/protobuf";
import { ListRoutersResponseSchema, type RouterInfo } from "@llmgw/proto";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs } from "../command.js";
import { formatDuration, renderTable } from "../table.js";

/**
 * One `llmgw routers` row: id, address, version, state, since, last seen, routing version,
 * state age, in-process, cache isolation ("-": a router that did not say).
 */
export function routerRow(r: RouterInfo, nowMs: number): string[] {
  const ago = (unixMs: bigint) =>
    unixMs > 0n ? `${formatDuration(nowMs - Number(unixMs))} ago` : "-";
  return [
    r.id,
    r.address || "-",
    r.version || "-",
    r.connected ? "connected" : "disconnected",
    r.connected ? ago(r.connectedAtUnixMs) : "-",
    r.connected ? "now" : ago(r.lastSeenUnixMs),
    r.epoch === "" ? "-" : `${r.stateVersion}`,
    r.epoch === "" ? "-" : formatDuration(Number(r.stateAgeMs)),
    r.inProcess ? "yes" : "no",
    r.cacheIsolation || "-",
  ];
}

export const command: Command = {
  name: "routers",
  summary: "list the routers watching the control plane",
  usage: `Usage: llmgw routers [options]\n\nLists the routers that watch this control plane's routing state: standalone 'llmgw router's\nand the control plane's own in-process router. A router that disconnected stays listed for\n10 minutes; while the control plane is down, routers keep serving from their saved state.\n\nColumns: CONNECTED (how long its stream has been open), LAST SEEN (when a disconnected\nrouter's stream closed), VERSION SENT (the routing version this control plane last sent it), STATE AGE (how long\nsince this control plane last sent it anything: a few seconds at most while connected),\nISOLATION (its --cache-isolation: none, tenant or key; "-" for a router that does not say).\n\nOptions:\n${ADMIN_FLAGS_USAGE}`,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, ADMIN_FLAGS);
    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.listRouters({});
      if (ctx.json) {
        io.stdout.write(`${JSON.stringify(toJson(ListRoutersResponseSchema, res), null, 2)}\n`);
        return 0;
      }
      const now = Date.now();
      io.stdout.write(
        renderTable(
          [
            "ROUTER",
            "ADDRESS",
            "LLMGW",
            "STATE",
            "CONNECTED",
            "LAST SEEN",
            "VERSION SENT",
            "STATE AGE",
            "IN-PROCESS",
            "ISOLATION",
          ],
          res.routers.map((r) => routerRow(r, now)),
        ),
      );
      return 0;
    });
  },
};
