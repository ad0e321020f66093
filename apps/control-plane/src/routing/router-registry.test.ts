import { describe, expect, it } from "vitest";
import { isControlPlaneError } from "../errors.js";
import { createRouterRegistry, DISCONNECTED_ROUTERS_KEPT_MS } from "./router-registry.js";

function fixture(maxRouters?: number) {
  let nowMs = 1_000;
  const counts: number[] = [];
  const registry = createRouterRegistry({
    now: () => nowMs,
    ...(maxRouters === undefined ? {} : { maxRouters }),
  });
  registry.onConnectedChange((n) => counts.push(n));
  return {
    registry,
    counts,
    advance: (ms: number) => {
      nowMs += ms;
    },
  };
}

const delta = (version: number) =>
  ({
    kind: "delta",
    epoch: "e1",
    version,
    upsertedModels: [],
    removedModels: [],
    upsertedReplicas: [],
    removedReplicas: [],
    upsertedKeys: [],
    removedKeys: [],
    sentAtMs: 0,
  }) as const;

describe("createRouterRegistry", () => {
  it("lists routers with what was last sent, connected first, and counts the connected", () => {
    const { registry, counts, advance } = fixture();
    const a = registry.connect({ id: "router-a", address: "10.0.0.9:8080", version: "0.1.0" });
    const cp = registry.connect({
      id: "in-process",
      address: "",
      version: "0.1.0",
      inProcess: true,
    });
    expect(registry.connected).toBe(2);
    advance(500);
    a.sent(delta(7));
    advance(100);
    a.sent({ kind: "load", epoch: "e1", samples: [] });
    expect(registry.list()).toEqual([
      {
        id: "in-process",
        address: "",
        version: "0.1.0",
        inProcess: true,
        connected: true,
        connectedAtMs: 1_000,
        lastSeenMs: 1_000,
        epoch: "",
        stateVersion: 0,
      },
      {
        id: "router-a",
        address: "10.0.0.9:8080",
        version: "0.1.0",
        inProcess: false,
        connected: true,
        connectedAtMs: 1_000,
        lastSeenMs: 1_600,
        epoch: "e1",
        stateVersion: 7,
      },
    ]);
    advance(50);
    a.close();
    a.close();
    expect(registry.connected).toBe(1);
    expect(registry.list().map((r) => [r.id, r.connected, r.lastSeenMs])).toEqual([
      ["in-process", true, 1_000],
      ["router-a", false, 1_650],
    ]);
    cp.close();
    expect(counts).toEqual([1, 2, 1, 0]);
  });

  it("keeps a disconnected router listed for ten minutes", () => {
    const { registry, advance } = fixture();
    registry.connect({ id: "router-a", address: "", version: "v" }).close();
    advance(DISCONNECTED_ROUTERS_KEPT_MS);
    expect(registry.list().map((r) => r.id)).toEqual(["router-a"]);
    advance(1);
    expect(registry.list()).toEqual([]);
  });

  it("lets a newer stream of the same id win: the older one is told, the count holds", () => {
    const { registry, counts } = fixture();
    const older = registry.connect({ id: "router-a", address: "a:1", version: "1" });
    const newer = registry.connect({ id: "router-a", address: "a:2", version: "2" });
    expect(older.replaced.aborted).toBe(true);
    expect(older.replaced.reason).toMatchObject({
      code: "LLMGW_CONTROL_PLANE_ROUTER_REPLACED",
      message: "a newer stream of router router-a replaced this one",
    });
    expect(newer.replaced.aborted).toBe(false);
    older.sent(delta(3));
    older.close();
    expect(registry.connected).toBe(1);
    expect(registry.list()).toMatchObject([
      { id: "router-a", address: "a:2", version: "2", connected: true, stateVersion: 0 },
    ]);
    newer.close();
    expect(counts).toEqual([1, 0]);
  });

  it("forgets the oldest disconnected router to make room, and refuses past the cap", () => {
    const { registry, advance } = fixture(2);
    registry.connect({ id: "a", address: "", version: "" }).close();
    advance(10);
    registry.connect({ id: "b", address: "", version: "" }).close();
    registry.connect({ id: "c", address: "", version: "" });
    expect(registry.list().map((r) => r.id)).toEqual(["c", "b"]);
    registry.connect({ id: "d", address: "", version: "" });
    let refused: unknown;
    try {
      registry.connect({ id: "e", address: "", version: "" });
    } catch (error) {
      refused = error;
    }
    expect(isControlPlaneError(refused)).toBe(true);
    expect(refused).toMatchObject({
      code: "LLMGW_CONTROL_PLANE_ROUTER_LIMIT",
      message: "2 routers are connected already; this control plane streams to no more",
    });
    // A connected id reconnecting is a replacement, not one more.
    expect(() => registry.connect({ id: "d", address: "", version: "" })).not.toThrow();
  });
});
