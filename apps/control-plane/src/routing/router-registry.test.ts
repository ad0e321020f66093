import { describe, expect, it } from "vitest";
import { isControlPlaneError } from "../errors.js";
import { createRouterRegistry, DISCONNECTED_ROUTERS_KEPT_MS } from "./router-registry.js";

function fixture(maxRouters?: number) {
  let nowMs = 1_000;
  const counts: number[] = [];
  const lines: string[] = [];
  const registry = createRouterRegistry({
    now: () => nowMs,
    keepaliveMs: 2_000,
    log: (line) => lines.push(line),
    ...(maxRouters === undefined ? {} : { maxRouters }),
  });
  registry.onConnectedChange((n) => counts.push(n));
  return {
    registry,
    counts,
    lines,
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
    const a = registry.connect({
      id: "router-a",
      address: "10.0.0.9:8080",
      version: "0.1.0",
      cacheIsolation: "tenant",
      appliesTenantCacheIsolation: true,
    });
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
        // Not said: "", and a router that does not say it applies tenants' isolation does not.
        cacheIsolation: "",
        appliesTenantCacheIsolation: false,
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
        cacheIsolation: "tenant",
        appliesTenantCacheIsolation: true,
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

  it.each([
    [
      "written to within a keepalive interval: a warning naming both ends",
      2_000,
      "warning: router router-a: a newer stream (from 10.0.0.2:40002, address a:2) replaces one written to 2000 ms ago (from 10.0.0.1:40001, address a:1); do two routers use this id?",
    ],
    [
      "quiet for longer (a reconnect the old stream did not notice)",
      2_001,
      "router router-a: a newer stream (from 10.0.0.2:40002, address a:2) replaces the open one (from 10.0.0.1:40001, address a:1)",
    ],
  ])("logs a takeover of a stream %s", (_name, quietMs, line) => {
    const { registry, lines, advance } = fixture();
    const older = registry.connect({
      id: "router-a",
      address: "a:1",
      version: "1",
      peer: "10.0.0.1:40001",
    });
    advance(5_000);
    older.sent(delta(2));
    advance(quietMs);
    registry.connect({ id: "router-a", address: "a:2", version: "1", peer: "10.0.0.2:40002" });
    expect(lines).toEqual(["router router-a connected from a:1", line]);
  });

  it("names a takeover's ends it does not know as such", () => {
    const { registry, lines } = fixture();
    registry.connect({ id: "router-a", address: "", version: "1" });
    registry.connect({ id: "router-a", address: "", version: "1" });
    expect(lines[1]).toBe(
      "warning: router router-a: a newer stream (from an unknown peer, no address) replaces one written to 0 ms ago (from an unknown peer, no address); do two routers use this id?",
    );
  });

  it("never lets a remote router and the in-process one replace each other", () => {
    const { registry, counts } = fixture();
    const cp = registry.connect({ id: "in-process", address: "", version: "v", inProcess: true });
    const refusal = {
      code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
      message:
        "router id in-process is the control plane's own router; a remote router needs another id",
    };
    expect(() => registry.connect({ id: "in-process", address: "", version: "v" })).toThrow(
      expect.objectContaining(refusal),
    );
    expect(cp.replaced.aborted).toBe(false);
    const remote = registry.connect({ id: "router-a", address: "", version: "v" });
    expect(() =>
      registry.connect({ id: "router-a", address: "", version: "v", inProcess: true }),
    ).toThrow(expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT" }));
    expect(remote.replaced.aborted).toBe(false);
    expect(registry.connected).toBe(2);
    // Once the in-process router is gone, its id is an ordinary disconnected entry.
    cp.close();
    registry.connect({ id: "in-process", address: "", version: "v" });
    expect(counts).toEqual([1, 2, 1, 2]);
  });

  it("adds the reason a session was closed to the log line", () => {
    const { registry, lines } = fixture();
    const a = registry.connect({ id: "router-a", address: "", version: "v" });
    a.close("cut off (LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW)");
    a.close("again");
    expect(lines).toEqual([
      "router router-a connected",
      "router router-a disconnected: cut off (LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW)",
    ]);
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
