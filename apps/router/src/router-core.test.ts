import { createStaticRouteTable, type RouteResolution } from "@llmgw/router";
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

describe("RouterCore: the route-table listener", () => {
  const route = (ids: readonly string[]): RouteResolution => ({
    deployment: "d",
    policy: "llmgw",
    loading: false,
    replicas: ids.map((id) => ({ id, baseUrl: `http://${id}:8000`, state: "ready", capacity: 4 })),
  });

  it("keeps the books of a replica that left and came back while a request ran there", async () => {
    const routeTable = createStaticRouteTable({ m: route(["a", "b"]) });
    const core = createRouterCore({
      routeTable,
      options: resolveRouterServiceOptions({
        noAuth: true,
        analyzer: { pool: false },
        picker: { health: { failureThreshold: 3 } },
      }),
    });
    const { picker } = core;
    // What a request to `a` books (attempt.ts), left running while `a` flaps.
    core.seenModels.add("m");
    core.replicaModel.set("a", "m");
    picker.dispatched("a", []);
    routeTable.update("m", route(["b"]));
    routeTable.update("m", route(["a", "b"]));
    // Back: its circuit opens; then the request from before it left ends.
    for (let i = 0; i < 3; i++) {
      picker.dispatched("a", []);
      picker.finished("a", "failure");
    }
    picker.finished("a", "abandoned");
    expect(picker.health.isRoutable("a")).toBe(false);
    // It leaves again: forgotten, its circuit with it.
    routeTable.update("m", route(["b"]));
    expect(picker.health.isRoutable("a")).toBe(true);
    expect(core.replicaModel.has("a")).toBe(false);
    await core.close();
  });

  it("forgets that a replica's engine reports cached tokens when it leaves the table", async () => {
    const routeTable = createStaticRouteTable({ m: route(["a", "b"]) });
    const core = createRouterCore({
      routeTable,
      options: resolveRouterServiceOptions({ noAuth: true, analyzer: { pool: false } }),
    });
    core.seenModels.add("m");
    for (const id of ["a", "b"]) {
      core.replicaModel.set(id, "m");
      core.reportsCached.set(id, `http://${id}:8000`);
    }
    routeTable.update("m", route(["b"]));
    expect([...core.reportsCached.keys()]).toEqual(["b"]);
    await core.close();
  });
});
