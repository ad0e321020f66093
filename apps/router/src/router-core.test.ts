import { createStaticRouteTable } from "@llmgw/router";
import { describe, expect, it } from "vitest";
import { resolveRouterServiceOptions } from "./options.js";
import type { PeerSink } from "./peer-exchange.js";
import { createRouterCore } from "./router-core.js";

describe("RouterCore.timedPlacement", () => {
  const peers: PeerSink = { instance: "r-a:1", sent() {}, firstByte() {}, ended() {} };
  it.each<[string, { routers?: () => number; peers?: PeerSink }, boolean]>([
    ["alone", { routers: () => 1 }, true],
    ["one of two, without peers", { routers: () => 2 }, false],
    ["one of two, with peers", { routers: () => 2, peers }, true],
    ["an unknown count of routers", {}, false],
  ])("homes new hints by time when %s: %s", async (_, input, timed) => {
    const core = createRouterCore({
      routeTable: createStaticRouteTable(),
      options: resolveRouterServiceOptions({ noAuth: true, analyzer: { pool: false } }),
      ...input,
    });
    expect(core.timedPlacement()).toBe(timed);
    await core.close();
  });
});
