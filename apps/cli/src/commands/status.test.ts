import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { NodeSchema, NodeState, RouterInfoSchema } from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import { runCli } from "../cli.js";
import { capturedIo, type FakeClusterService, startFakeClusterService } from "../testing.js";
import { isolationWarning } from "./status.js";

// What agents report reaches the operator's terminal: an agent version or hostname holding
// escapes must not clear the screen or forge a line, in the summaries as in the tables.

let fake: FakeClusterService | undefined;
afterEach(async () => {
  await fake?.close();
  fake = undefined;
});

const EVIL = "9.9.9\u001b[2J\u001b[H\nforged line";

const node = (nodeId: string, version: string, hostname = nodeId) =>
  create(NodeSchema, {
    nodeId,
    hostname,
    state: NodeState.READY,
    inventory: { agentVersion: version },
  });

describe("outside text in the commands' own lines", () => {
  it("llmgw status escapes every agent's version in the versions line", async () => {
    fake = await startFakeClusterService({
      getClusterStatus: () => ({ version: "0.2.0", nodesTotal: 2, nodesReady: 2 }),
      listDeployments: () => ({}),
      listNodes: () => ({ nodes: [node("node-a", "0.2.0"), node("node-b", EVIL)] }),
      listRouters: () => ({}),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(["status"], io), io.err()).toBe(0);
    expect(io.out()).not.toContain("\u001b");
    const versions = io
      .out()
      .split("\n")
      .filter((l) => l.startsWith("versions") || l.includes("forged"));
    expect(versions).toEqual([
      `versions     mixed: 9.9.9\\u001b[2J\\u001b[H\\nforged line (agent node-b), 0.2.0 (control plane ${fake.url}, agent node-a)`,
    ]);
  });

  it.each([
    ["cordon", { cordonNode: () => ({ node: node("n-1", "0.2.0", EVIL) }) }],
    ["drain", { drainNode: () => ({ node: node("n-1", "0.2.0", EVIL) }) }],
  ] as const)("llmgw %s escapes the node's hostname", async (verb, routes) => {
    fake = await startFakeClusterService(routes);
    const io = capturedIo(fake.env);
    expect(await runCli([verb, "n-1"], io), io.err()).toBe(0);
    expect(io.out()).not.toContain("\u001b");
    expect(io.out().trimEnd().split("\n")).toHaveLength(1);
  });

  it("a refusal's message is escaped too", async () => {
    fake = await startFakeClusterService({
      cordonNode: (req) => {
        throw new ConnectError(`node ${req.node} not found`, Code.NotFound);
      },
    });
    const io = capturedIo(fake.env);
    expect(await runCli(["cordon", EVIL], io)).toBe(1);
    expect(io.err()).toBe("llmgw: node 9.9.9\\u001b[2J\\u001b[H\\nforged line not found\n");
  });
});

describe("isolationWarning", () => {
  const router = (id: string, cacheIsolation: string, connected = true) =>
    create(RouterInfoSchema, { id, cacheIsolation, connected });

  it.each([
    ["all agree", [router("a", "tenant"), router("b", "tenant")], []],
    ["one says nothing (an older router)", [router("a", "tenant"), router("b", "")], []],
    ["the one that differs is disconnected", [router("a", "key"), router("b", "none", false)], []],
    [
      "they differ",
      [router("a", "tenant"), router("b", "none"), router("c", "tenant")],
      ["isolation    routers differ in --cache-isolation (tenant: a, c; none: b)"],
    ],
  ])("%s", (_, routers, lines) => {
    expect(isolationWarning(routers)).toEqual(lines);
  });

  const applying = (id: string, applies: boolean, connected = true, cacheIsolation = "") =>
    create(RouterInfoSchema, {
      id,
      connected,
      appliesTenantCacheIsolation: applies,
      cacheIsolation,
    });
  const asking = [
    { name: "search", cacheIsolation: "tenant" },
    { name: "ads", cacheIsolation: "" },
    { name: "legal", cacheIsolation: "key" },
  ];
  it.each([
    ["no tenant asks", [applying("old", false)], asking.slice(1, 2), []],
    [
      "every connected router applies it",
      [applying("a", true), applying("old", false, false)],
      asking,
      [],
    ],
    [
      "an older router is connected while tenants ask",
      [applying("a", true), applying("old", false)],
      asking,
      [
        "isolation    tenants search, legal ask for cache isolation; router old does not apply it (--no-auth, or a release before it)",
      ],
    ],
    [
      "an older router whose own flag isolates at least as much as one tenant asks",
      [applying("old", false, true, "tenant")],
      asking,
      [
        "isolation    tenant legal asks for cache isolation; router old does not apply it (--no-auth, or a release before it)",
      ],
    ],
    ["an older router that isolates every key", [applying("old", false, true, "key")], asking, []],
  ])("tenants' own isolation: %s", (_, routers, tenants, lines) => {
    expect(isolationWarning(routers, tenants)).toEqual(lines);
  });
});
