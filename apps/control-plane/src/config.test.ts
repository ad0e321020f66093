import { describe, expect, it } from "vitest";
import { resolveControlPlaneOptions, splitListenAddress } from "./config.js";

describe("resolveControlPlaneOptions", () => {
  it("fills secure-but-usable defaults", () => {
    expect(resolveControlPlaneOptions({ dataDir: "/d" })).toMatchObject({
      listen: ":8080",
      controlListen: "127.0.0.1:7070",
      heartbeatIntervalMs: 2_000,
      unreachableAfterMissed: 3,
      nodeLostAfterMs: 60_000,
      noAuth: false,
      cacheIsolation: "none",
      headersTimeoutMs: 30_000,
      requestTimeoutMs: 60_000,
      keepAliveTimeoutMs: 5_000,
      maxConnections: 4_096,
      maxControlConnections: 4_096,
      maxConnectionsPerAddress: 1_024,
      maxControlConnectionsPerAddress: 1_024,
      maxNodes: 10_000,
      publicApi: true,
      routingCoalesceMs: 25,
      routingLoadFlushMs: 100,
      routingKeepaliveMs: 2_000,
      routingMaxQueued: 512,
      agentStreamMs: 20_000,
      rolloutProgressDeadlineMs: 600_000,
    });
    // Load streams follow a shorter request timeout unless given, and stop below 2 s.
    const stream = (requestTimeoutMs: number) =>
      resolveControlPlaneOptions({ dataDir: "/d", requestTimeoutMs, headersTimeoutMs: 100 })
        .agentStreamMs;
    expect([stream(30_000), stream(2_000), stream(1_999)]).toEqual([15_000, 1_000, 0]);
    expect(resolveControlPlaneOptions({ dataDir: "/d", publicApi: false }).publicApi).toBe(false);
  });

  it("keeps each per-address cap a quarter of its listener's unless given", () => {
    expect(
      resolveControlPlaneOptions({ dataDir: "/d", maxConnections: 100, maxControlConnections: 8 }),
    ).toMatchObject({ maxConnectionsPerAddress: 25, maxControlConnectionsPerAddress: 2 });
    expect(
      resolveControlPlaneOptions({
        dataDir: "/d",
        maxControlConnections: 8,
        maxControlConnectionsPerAddress: 8,
      }),
    ).toMatchObject({ maxControlConnectionsPerAddress: 8 });
  });

  it.each<[Record<string, unknown>, string]>([
    [
      { controlListen: "7070" },
      'controlListen: expected HOST:PORT or :PORT, e.g. 127.0.0.1:7070 (got "7070")',
    ],
    [{ listen: ":70000" }, 'listen: port must be 0–65535 (got ":70000")'],
    [{ tlsCertFile: "/c.pem" }, "--tls-cert and --tls-key must be given together"],
    [{ heartbeatIntervalMs: 10 }, "heartbeatIntervalMs: Too small"],
    [{ dataDir: "" }, "dataDir:"],
    [
      { rendezvousPortMin: 30_000, rendezvousPortMax: 29_000 },
      "rendezvousPortMin: rendezvousPortMin must not exceed rendezvousPortMax (got 30000)",
    ],
    [
      { headersTimeoutMs: 90_000 },
      "headersTimeoutMs: headersTimeoutMs must not exceed requestTimeoutMs (got 90000)",
    ],
    [{ maxConnections: 0 }, "maxConnections: Too small"],
    [
      { maxConnections: 10, maxConnectionsPerAddress: 11 },
      "maxConnectionsPerAddress: maxConnectionsPerAddress must not exceed maxConnections (got 11)",
    ],
    [
      { maxControlConnectionsPerAddress: 5_000 },
      "maxControlConnectionsPerAddress: maxControlConnectionsPerAddress must not exceed maxControlConnections (got 5000)",
    ],
    [{ maxNodes: 0 }, "maxNodes: Too small"],
    [
      { agentStreamMs: 40_000 },
      "agentStreamMs: agentStreamMs must be 0 (no streams) or 1 s up to half of requestTimeoutMs (got 40000)",
    ],
    [
      { agentStreamMs: 500 },
      "agentStreamMs: agentStreamMs must be 0 (no streams) or 1 s up to half of requestTimeoutMs (got 500)",
    ],
    [{ publicApi: "no" }, 'publicApi: Invalid input: expected boolean, received string (got "no")'],
    [{ routingCoalesceMs: 0 }, "routingCoalesceMs: Too small"],
    [{ routingLoadFlushMs: 20_000 }, "routingLoadFlushMs: Too big"],
    [{ moveFailedAfterMs: -1 }, "moveFailedAfterMs: Too small"],
    [{ moveFailedAfterMs: 7 * 86_400_000 + 1 }, "moveFailedAfterMs: Too big"],
    [{ rolloutProgressDeadlineMs: -1 }, "rolloutProgressDeadlineMs: Too small"],
    [{ rolloutProgressDeadlineMs: 7 * 86_400_000 + 1 }, "rolloutProgressDeadlineMs: Too big"],
    [{ routingKeepaliveMs: 99 }, "routingKeepaliveMs: Too small"],
    [
      { routingMaxQueued: 1.5 },
      "routingMaxQueued: Invalid input: expected int, received number (got 1.5)",
    ],
    [
      { noAuth: true, cacheIsolation: "tenant" },
      "cacheIsolation: --cache-isolation needs API keys: without them (--no-auth) no request says whose it is",
    ],
    [{ cacheIsolation: "tenants" }, "cacheIsolation: Invalid option"],
    [
      { publicApi: false, cacheIsolation: "key" },
      "cacheIsolation: --cache-isolation sets the in-process router's mode, and --no-public-api runs none: give it to each llmgw router",
    ],
  ])("refuses %j", (bad, message) => {
    expect(() => resolveControlPlaneOptions({ dataDir: "/d", ...bad })).toThrow(message);
  });
});

describe("splitListenAddress", () => {
  it.each([
    [":8080", "", 8080],
    ["127.0.0.1:7070", "127.0.0.1", 7070],
    ["[::1]:7070", "::1", 7070],
    ["0.0.0.0:0", "0.0.0.0", 0],
  ])("%s", (address, host, port) => {
    expect(splitListenAddress(address)).toEqual({ host, port });
  });
});

describe("the store option", () => {
  it("defaults to sqlite: and takes postgres:// and postgresql:// URLs", () => {
    expect(resolveControlPlaneOptions({ dataDir: "/d" }).store).toBe("sqlite:");
    for (const store of ["postgres://u@db:5432/llmgw", "postgresql://db/llmgw"])
      expect(resolveControlPlaneOptions({ dataDir: "/d", store }).store).toBe(store);
  });

  it.each(["mysql://u:s3cret@db/x", "postgres://u:s3cret@db/with space", "sqlite:/tmp/x"])(
    "refuses %s without echoing it (it may hold a password)",
    (store) => {
      let message = "";
      try {
        resolveControlPlaneOptions({ dataDir: "/d", store });
      } catch (error) {
        expect((error as { code?: string }).code).toBe("LLMGW_CONTROL_PLANE_CONFIG_INVALID");
        message = (error as Error).message;
      }
      expect(message).toContain('store: must be "sqlite:" or a postgres:// URL');
      expect(message).not.toContain("s3cret");
      expect(message).not.toContain(store);
    },
  );
});
