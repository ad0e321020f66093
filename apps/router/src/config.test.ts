import { describe, expect, it } from "vitest";
import { parseRouterConfig, type RouterFlagValues } from "./config.js";
import { resolveHttpListenerOptions } from "./http-listener.js";
import { resolveRouterServiceOptions } from "./options.js";

const BASE: RouterFlagValues = {
  "control-plane": ["https://cp-a:7070"],
  "router-token-file": "/etc/llmgw/router-token",
};

const parse = (flags: RouterFlagValues, env: Record<string, string> = {}) =>
  parseRouterConfig({ ...BASE, ...flags }, { env, hostname: "node-9" });

describe("parseRouterConfig", () => {
  it("fills production defaults", () => {
    expect(parse({})).toEqual({
      controlPlanes: ["https://cp-a:7070"],
      routerToken: { kind: "file", path: "/etc/llmgw/router-token" },
      controlPlaneCaFile: undefined,
      listen: ":8080",
      metricsListen: "127.0.0.1:9464",
      tlsCertFile: undefined,
      tlsKeyFile: undefined,
      stateDir: "/var/lib/llmgw/router",
      routerId: undefined,
      address: "node-9:8080",
      maxStateAgeMs: undefined,
      shutdownGraceMs: 10_000,
      router: { noAuth: false, cacheIsolation: "none" },
      listener: {},
      peers: [],
      peerKey: undefined,
      peerCaFile: undefined,
    });
  });

  it("takes --max-state-age as ms", () => {
    expect(parse({ "max-state-age": "15m" }).maxStateAgeMs).toBe(900_000);
    expect(parse({ "max-state-age": "10s" }).maxStateAgeMs).toBe(10_000);
  });

  it("takes peers from --peer or LLMGW_ROUTER_PEERS, with a key from a file or the environment", () => {
    const flagged = parse({
      peer: ["http://10.0.0.8:8080/, http://10.0.0.9:8080", "http://10.0.0.8:8080"],
      "peer-key-file": "/etc/llmgw/peer-key",
    });
    expect([flagged.peers, flagged.peerKey]).toEqual([
      ["http://10.0.0.8:8080", "http://10.0.0.9:8080"],
      { kind: "file", path: "/etc/llmgw/peer-key" },
    ]);
    const fromEnv = parse(
      {},
      { LLMGW_ROUTER_PEERS: "https://r2:8443", LLMGW_ROUTER_PEER_KEY: "0123456789abcdef" },
    );
    expect([fromEnv.peers, fromEnv.peerKey]).toEqual([
      ["https://r2:8443"],
      { kind: "env", key: "0123456789abcdef" },
    ]);
    expect(() => parse({ peer: ["http://r2:8080"] })).toThrow(
      "--peer needs the key the routers share: --peer-key-file FILE",
    );
    expect(() =>
      parse({ "peer-key-file": "/k" }, { LLMGW_ROUTER_PEER_KEY: "0123456789abcdef" }),
    ).toThrow("give the peer key one way");
    expect(() => parse({ peer: ["ftp://r2"], "peer-key-file": "/k" })).toThrow(
      /--peer.*must be an http:\/\/ or https:\/\/ URL/,
    );
  });

  it("maps every option flag to its router or listener option", () => {
    const config = parse({
      "max-body": "16MiB",
      "too-large-drain": "2s",
      "too-large-drain-bytes": "1GiB",
      "queue-length": "0",
      "queue-timeout": "1m",
      "critical-headroom": "50",
      "critical-prefill-reserve": "2",
      "upstream-connect-timeout": "750ms",
      "upstream-headers-timeout": "10m",
      "upstream-body-timeout": "90",
      "client-stall-timeout": "45s",
      "upstream-connections": "64",
      "analyzer-threads": "4",
      "inline-analysis-bytes": "8KiB",
      "max-header-bytes": "32KiB",
      "headers-timeout": "10s",
      "request-timeout": "2m",
      "keep-alive-timeout": "1.5s",
      "max-connections": "20000",
      "max-connections-per-address": "20000",
      "shutdown-grace": "30s",
      "no-auth": true,
    });
    expect(config.router).toEqual({
      noAuth: true,
      maxBodyBytes: 16 * 1024 * 1024,
      tooLargeDrainMs: 2000,
      tooLargeDrainBytes: 1024 ** 3,
      maxQueueLength: 0,
      queueTimeoutMs: 60_000,
      criticalHeadroom: 0.5,
      criticalPrefillReserve: 2,
      upstreamConnectTimeoutMs: 750,
      upstreamHeadersTimeoutMs: 600_000,
      upstreamBodyTimeoutMs: 90_000,
      clientStallTimeoutMs: 45_000,
      upstreamConnections: 64,
      analyzer: { inlineThresholdBytes: 8192, pool: { minThreads: 1, maxThreads: 4 } },
      cacheIsolation: "none",
    });
    expect(config.listener).toEqual({
      maxHeaderBytes: 32 * 1024,
      headersTimeoutMs: 10_000,
      requestTimeoutMs: 120_000,
      keepAliveTimeoutMs: 1500,
      maxConnections: 20_000,
      maxConnectionsPerAddress: 20_000,
    });
    expect(config.shutdownGraceMs).toBe(30_000);
    // What the flags admit, the resolvers accept.
    expect(() => resolveRouterServiceOptions(config.router)).not.toThrow();
    expect(() => resolveHttpListenerOptions(config.listener)).not.toThrow();
  });

  it("isolates prefix caches by tenant or key with --cache-isolation", () => {
    for (const mode of ["none", "tenant", "key"] as const) {
      const config = parse({ "cache-isolation": mode });
      expect(config.router.cacheIsolation).toBe(mode);
      expect(resolveRouterServiceOptions(config.router).cacheIsolation).toBe(mode);
    }
    expect(() => resolveRouterServiceOptions({ noAuth: true, cacheIsolation: "tenant" })).toThrow(
      "invalid router option cacheIsolation: tenant needs API keys (noAuth is set)",
    );
    expect(() =>
      resolveRouterServiceOptions({ cacheIsolation: "tenants" as unknown as "tenant" }),
    ).toThrow(
      'invalid router option cacheIsolation: must be one of none, tenant, key, got "tenants"',
    );
  });

  it("analyses inline with --analyzer-threads 0", () => {
    expect(parse({ "analyzer-threads": "0" }).router.analyzer).toEqual({ pool: false });
  });

  it.each<[string, RouterFlagValues, Record<string, string>, Partial<ReturnType<typeof parse>>]>([
    [
      "several URLs, comma-separated and repeated, deduplicated, trailing slash dropped",
      { "control-plane": ["http://a:7070/, http://b:7070", "http://a:7070"] },
      {},
      { controlPlanes: ["http://a:7070", "http://b:7070"] },
    ],
    [
      "URLs from LLMGW_CONTROL_PLANE",
      { "control-plane": undefined },
      { LLMGW_CONTROL_PLANE: "http://a:7070,http://b:7070" },
      { controlPlanes: ["http://a:7070", "http://b:7070"] },
    ],
    [
      "the flag wins over LLMGW_CONTROL_PLANE",
      { "control-plane": ["http://c:7070"] },
      { LLMGW_CONTROL_PLANE: "http://a:7070" },
      { controlPlanes: ["http://c:7070"] },
    ],
    [
      "a token from LLMGW_ROUTER_TOKEN",
      { "router-token-file": undefined },
      { LLMGW_ROUTER_TOKEN: "rt-abc" },
      { routerToken: { kind: "env", token: "rt-abc" } },
    ],
    [
      "a token file from LLMGW_ROUTER_TOKEN_FILE",
      { "router-token-file": undefined },
      { LLMGW_ROUTER_TOKEN_FILE: "/run/secrets/rt" },
      { routerToken: { kind: "file", path: "/run/secrets/rt" } },
    ],
    [
      "a token on argv",
      { "router-token-file": undefined, "router-token": "rt-abc" },
      {},
      { routerToken: { kind: "flag", token: "rt-abc" } },
    ],
    [
      "the state dir from LLMGW_STATE_DIR",
      {},
      { LLMGW_STATE_DIR: "/srv/r" },
      { stateDir: "/srv/r" },
    ],
    ["--state-dir wins", { "state-dir": "/a" }, { LLMGW_STATE_DIR: "/b" }, { stateDir: "/a" }],
    ["metrics off", { "metrics-listen": "off" }, {}, { metricsListen: undefined }],
    [
      "the address from a specific listen host",
      { listen: "10.0.0.9:9000" },
      {},
      { address: "10.0.0.9:9000" },
    ],
    [
      "the address from the host name on 0.0.0.0",
      { listen: "0.0.0.0:80" },
      {},
      { address: "node-9:80" },
    ],
    ["an explicit address", { address: "lb-1.internal:443" }, {}, { address: "lb-1.internal:443" }],
    ["a router id", { "router-id": "router-eu.1" }, {}, { routerId: "router-eu.1" }],
    [
      "TLS files and a control-plane CA",
      { "tls-cert": "/c.pem", "tls-key": "/k.pem", "control-plane-ca": "/ca.pem" },
      {},
      { tlsCertFile: "/c.pem", tlsKeyFile: "/k.pem", controlPlaneCaFile: "/ca.pem" },
    ],
  ])("accepts %s", (_name, flags, env, expected) => {
    expect(parse(flags, env)).toMatchObject(expected);
  });

  it.each<[RouterFlagValues, Record<string, string>, string]>([
    [
      { "control-plane": [] },
      {},
      "--control-plane is required (or LLMGW_CONTROL_PLANE): the control plane's control URL",
    ],
    [
      { "control-plane": ["cp-a:7070"] },
      {},
      '--control-plane must be an http:// or https:// URL without credentials, query or fragment, e.g. https://10.0.0.1:7070 (got "cp-a:7070")',
    ],
    [
      { "control-plane": ["https://user:pw@cp:7070"] },
      {},
      "--control-plane must be an http:// or https:// URL without credentials",
    ],
    [
      { "control-plane": Array.from({ length: 17 }, (_, i) => `http://cp-${i}:7070`) },
      {},
      "--control-plane takes at most 16 URLs",
    ],
    [
      { "router-token-file": undefined },
      {},
      "--router-token-file FILE (or LLMGW_ROUTER_TOKEN, LLMGW_ROUTER_TOKEN_FILE) is required: print the token with 'llmgw control-plane token --router' on the control plane",
    ],
    [
      { "router-token": "rt-abc" },
      {},
      "give the router token one way: --router-token, --router-token-file, LLMGW_ROUTER_TOKEN or LLMGW_ROUTER_TOKEN_FILE",
    ],
    [{}, { LLMGW_ROUTER_TOKEN: "rt-abc" }, "give the router token one way"],
    [
      { "router-token-file": undefined },
      { LLMGW_ROUTER_TOKEN: "rt abc" },
      "LLMGW_ROUTER_TOKEN must not contain whitespace",
    ],
    [
      { listen: "8080" },
      {},
      '--listen expected HOST:PORT or :PORT, e.g. 0.0.0.0:8080 (got "8080")',
    ],
    [{ listen: ":70000" }, {}, '--listen port must be 0–65535 (got ":70000")'],
    [{ "metrics-listen": "on" }, {}, "--metrics-listen "],
    [{ "metrics-listen": ":8080" }, {}, "--metrics-listen (:8080) must not be --listen (:8080)"],
    [{ "tls-cert": "/c.pem" }, {}, "--tls-cert and --tls-key must be given together"],
    [
      { "router-id": "-bad" },
      {},
      `--router-id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got "-bad")`,
    ],
    [{ "router-id": "a".repeat(64) }, {}, "--router-id must be 1–63"],
    [{ address: "no-port" }, {}, '--address must be HOST:PORT, e.g. 10.0.0.9:8080 (got "no-port")'],
    [
      { "max-body": "8MB" },
      {},
      '--max-body must be a size like 65536, 64KiB, 8MiB or 1GiB (got "8MB")',
    ],
    [{ "max-body": "0" }, {}, '--max-body must be at least 1 bytes (got "0")'],
    [{ "max-body": "2GiB" }, {}, '--max-body must be at most 2147483647 bytes (got "2GiB")'],
    [{ "queue-length": "-1" }, {}, '--queue-length must be a whole number (got "-1")'],
    [{ "queue-length": "1000001" }, {}, '--queue-length must be at most 1000000 (got "1000001")'],
    [
      { "queue-timeout": "soon" },
      {},
      '--queue-timeout must be a duration like 500ms, 30s, 5m or 1h (got "soon")',
    ],
    [{ "queue-timeout": "0s" }, {}, '--queue-timeout must be at least 1ms (got "0s")'],
    [{ "critical-headroom": "0.5" }, {}, '--critical-headroom must be a whole number (got "0.5")'],
    [{ "critical-headroom": "401" }, {}, '--critical-headroom must be at most 400 (got "401")'],
    [
      { "critical-prefill-reserve": "65" },
      {},
      '--critical-prefill-reserve must be at most 64 (got "65")',
    ],
    [{ "queue-timeout": "2h" }, {}, '--queue-timeout must be at most 3600000ms (got "2h")'],
    [{ "upstream-connections": "0" }, {}, '--upstream-connections must be at least 1 (got "0")'],
    [{ "analyzer-threads": "65" }, {}, '--analyzer-threads must be at most 64 (got "65")'],
    [
      { "max-header-bytes": "512" },
      {},
      '--max-header-bytes must be at least 1024 bytes (got "512")',
    ],
    [
      { "headers-timeout": "2m", "request-timeout": "1m" },
      {},
      "--headers-timeout (120000ms) must not exceed --request-timeout (60000ms)",
    ],
    [
      { "headers-timeout": "90s" },
      {},
      "--headers-timeout (90000ms) must not exceed --request-timeout (60000ms)",
    ],
    [
      { "max-connections": "10", "max-connections-per-address": "11" },
      {},
      "--max-connections-per-address (11) must not exceed --max-connections (10)",
    ],
    [{ "shutdown-grace": "11m" }, {}, '--shutdown-grace must be at most 600000ms (got "11m")'],
    [{ "max-state-age": "5s" }, {}, '--max-state-age must be at least 10000ms (got "5s")'],
    [{ "max-state-age": "721h" }, {}, '--max-state-age must be at most 2592000000ms (got "721h")'],
    [{ "cache-isolation": "tenants" }, {}, "--cache-isolation must be one of none, tenant, key"],
    [
      { "cache-isolation": "key", "no-auth": true },
      {},
      "--cache-isolation key needs API keys: without them (--no-auth) no request says whose it is",
    ],
  ])("refuses %j %j, naming the flag", (flags, env, message) => {
    let error: unknown;
    try {
      parse(flags, env);
    } catch (e) {
      error = e;
    }
    expect(error).toMatchObject({ code: "LLMGW_ROUTER_CONFIG_INVALID" });
    expect((error as Error).message).toContain(message);
    expect((error as Error).message.startsWith("invalid llmgw router options: ")).toBe(true);
  });

  it("refuses a default address the control plane would refuse", () => {
    expect(() => parseRouterConfig(BASE, { hostname: "bad host", env: {} })).toThrow(
      'invalid llmgw router options: --address defaults to "bad host:8080" (host name and --listen port), which is not HOST:PORT; give --address',
    );
  });

  it("names every bad flag at once", () => {
    expect(() => parse({ "queue-length": "x", "max-body": "y" })).toThrow(
      /--max-body must be a size.*; --queue-length must be a whole number/,
    );
  });

  it("never echoes a token", () => {
    expect(() => parse({ "router-token-file": undefined, "router-token": "" })).toThrow(
      "--router-token must not be empty",
    );
    try {
      parse({ "router-token-file": undefined, "router-token": "rt secret" });
      expect.unreachable();
    } catch (error) {
      expect((error as Error).message).toContain("--router-token must not contain whitespace");
      expect((error as Error).message).not.toContain("secret");
    }
  });
});
