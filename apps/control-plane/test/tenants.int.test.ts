/**
 * Tenants through the real admin API on loopback (Connect, as the CLI calls it), and what a
 * router watching the control listener is handed: tenant grants, and keys with their tenant,
 * budgets and priority.
 */
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  BudgetPeriod,
  PriorityClass,
  RouterService,
  type WatchRoutingResponse,
} from "@llmgw/proto";
import type { KeyGrant, RoutingMessage, TenantGrant } from "@llmgw/router";
import { routingMessageFromProto } from "@llmgw/wire";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type ControlPlane, startControlPlane } from "../src/run.js";
import {
  postgresUnavailable,
  startTestPostgres,
  type TestPostgres,
} from "../src/testing/postgres.js";
import { adminClient, eventually, tempDir, whenServed } from "./helpers.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

/** What a router holds after applying every message of its stream so far. */
function heldBy(received: readonly RoutingMessage[]) {
  const tenants = new Map<string, TenantGrant>();
  const keys = new Map<string, KeyGrant>();
  for (const m of received) {
    if (m.kind === "snapshot") {
      tenants.clear();
      keys.clear();
      for (const t of m.tenants ?? []) tenants.set(t.name, t);
      for (const k of m.keys) keys.set(k.id, k);
    } else if (m.kind === "delta") {
      for (const t of m.upsertedTenants ?? []) tenants.set(t.name, t);
      for (const name of m.removedTenants ?? []) tenants.delete(name);
      for (const k of m.upsertedKeys) keys.set(k.id, k);
      for (const id of m.removedKeys) keys.delete(id);
    }
  }
  return { tenants: [...tenants.values()], keys: [...keys.values()] };
}

/** A refused call's Connect code, `llmgw-error-code` and message. */
async function refusal(call: Promise<unknown>) {
  const error = ConnectError.from(
    await call.then(
      () => new Error("expected a refusal"),
      (e) => e,
    ),
  );
  return {
    code: Code[error.code],
    llmgw: error.metadata.get("llmgw-error-code"),
    message: error.rawMessage,
  };
}

describe("tenants", () => {
  it("are created, listed, updated and deleted, and routers hold them with their keys", async () => {
    const tmp = tempDir("llmgw-tenants-");
    cleanups.push(tmp.cleanup);
    const cp = await startControlPlane({
      dataDir: tmp.dir,
      listen: "127.0.0.1:0",
      controlListen: "127.0.0.1:0",
      shutdownGraceMs: 1_000,
      routingKeepaliveMs: 200,
    });
    cleanups.push(() => cp.close().then(() => {}));
    const admin = adminClient(cp, cp.adminToken);

    const abort = new AbortController();
    cleanups.push(() => abort.abort());
    const router = createClient(
      RouterService,
      createConnectTransport({ httpVersion: "1.1", baseUrl: cp.controlUrl }),
    );
    const received: RoutingMessage[] = [];
    void (async () => {
      try {
        for await (const res of router.watchRouting(
          { routerId: "router-a", address: "127.0.0.1:9999", version: "0.1.0" },
          { headers: { authorization: `Bearer ${cp.routerToken}` }, signal: abort.signal },
        ))
          received.push(routingMessageFromProto(res as WatchRoutingResponse));
      } catch {}
    })();
    await eventually(() => (received.length > 0 ? true : undefined));

    const { tenant } = await admin.createTenant({
      tenant: {
        name: "search",
        tokensPerMinute: 100_000,
        budgets: [
          { period: BudgetPeriod.DAY, tokens: 1_000_000n },
          { period: BudgetPeriod.MONTH, model: "llama-3-8b", tokens: 50_000_000n },
        ],
        priority: PriorityClass.CRITICAL,
        // Ignored: the control plane counts.
        activeKeys: 9,
      },
    });
    expect(tenant).toMatchObject({
      name: "search",
      tokensPerMinute: 100_000,
      priority: PriorityClass.CRITICAL,
      weight: 1,
      activeKeys: 0,
    });
    expect(tenant?.requestsPerMinute).toBeUndefined();
    expect(tenant?.createdAtUnixMs).toBe(tenant?.updatedAtUnixMs);

    expect(await refusal(admin.createTenant({ tenant: { name: "Search" } }))).toEqual({
      code: "InvalidArgument",
      llmgw: "LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID",
      message: `tenant name must be 1–63 lower-case letters, digits or '-' (got "Search")`,
    });
    expect(
      await refusal(
        admin.createTenant({
          tenant: { name: "x", budgets: [{ period: 7 as BudgetPeriod, tokens: 1n }] },
        }),
      ),
    ).toEqual({
      code: "InvalidArgument",
      llmgw: "LLMGW_CONTROL_PLANE_BUDGET_INVALID",
      message: `tenant x budgets[0]: period must be day or month (got "7")`,
    });
    expect(
      await refusal(
        admin.createTenant({
          tenant: { name: "x", budgets: [{ period: BudgetPeriod.DAY, tokens: 2n ** 64n - 1n }] },
        }),
      ),
    ).toMatchObject({ llmgw: "LLMGW_CONTROL_PLANE_BUDGET_INVALID" });
    expect(
      await refusal(admin.createApiKey({ name: "app", tenant: "nobody", models: [] })),
    ).toEqual({
      code: "FailedPrecondition",
      llmgw: "LLMGW_CONTROL_PLANE_TENANT_UNKNOWN",
      message: `API key app: no tenant named "nobody"; create it first (llmgw tenants create)`,
    });

    const { key } = await admin.createApiKey({
      name: "app",
      tenant: "search",
      budgets: [{ period: BudgetPeriod.DAY, model: "chat", tokens: 5_000n }],
      priority: PriorityClass.BATCH,
    });
    expect(key).toMatchObject({
      tenant: "search",
      budgets: [{ period: BudgetPeriod.DAY, model: "chat", tokens: 5_000n }],
      priority: PriorityClass.BATCH,
    });
    expect((await admin.listApiKeys({})).keys.map((k) => [k.name, k.tenant, k.priority])).toEqual([
      ["app", "search", PriorityClass.BATCH],
    ]);
    expect((await admin.listTenants({})).tenants.map((t) => [t.name, t.activeKeys])).toEqual([
      ["search", 1],
    ]);

    // The router holds the tenant and the key's tenant, budgets and priority (the admin call
    // answers once the change is published).
    await eventually(() => (heldBy(received).keys.length === 1 ? true : undefined));
    expect(heldBy(received)).toMatchObject({
      tenants: [
        {
          name: "search",
          tpm: 100_000,
          budgets: [
            { period: "day", tokens: 1_000_000 },
            { period: "month", model: "llama-3-8b", tokens: 50_000_000 },
          ],
          priority: "critical",
          weight: 1,
        },
      ],
      keys: [
        {
          id: key?.id,
          tenant: "search",
          budgets: [{ period: "day", model: "chat", tokens: 5_000 }],
          priority: "batch",
        },
      ],
    });

    // Only the named fields change; a named field left unset is cleared.
    const { tenant: updated } = await admin.updateTenant({
      tenant: { name: "search", weight: 40, requestsPerMinute: 60 },
      fields: ["weight", "requests_per_minute", "tokens_per_minute", "budgets"],
    });
    expect(updated).toMatchObject({
      weight: 40,
      requestsPerMinute: 60,
      budgets: [],
      priority: PriorityClass.CRITICAL,
      activeKeys: 1,
    });
    expect(updated?.tokensPerMinute).toBeUndefined();
    expect(
      await refusal(
        admin.updateTenant({ tenant: { name: "search" }, fields: ["weight", "active_keys"] }),
      ),
    ).toEqual({
      code: "InvalidArgument",
      llmgw: "LLMGW_CONTROL_PLANE_TENANT_FIELD_UNKNOWN",
      message: `UpdateTenantRequest.fields: "active_keys" is not a field that can be changed; use requests_per_minute, tokens_per_minute, max_concurrency, budgets, priority, weight, cache_isolation`,
    });
    await eventually(() =>
      heldBy(received).tenants[0]?.weight === 40 ? heldBy(received).tenants : undefined,
    );
    expect(heldBy(received).tenants).toEqual([
      {
        name: "search",
        rpm: 60,
        priority: "critical",
        weight: 40,
        createdAtMs: expect.any(Number),
      },
    ]);

    expect(await refusal(admin.deleteTenant({ name: "search" }))).toEqual({
      code: "FailedPrecondition",
      llmgw: "LLMGW_CONTROL_PLANE_TENANT_HAS_KEYS",
      message:
        "tenant search has 1 active API key; revoke it first (llmgw keys list, llmgw keys revoke)",
    });
    await admin.revokeApiKey({ key: "app" });
    await admin.deleteTenant({ name: "search" });
    expect((await admin.listTenants({})).tenants).toEqual([]);
    await eventually(() => (heldBy(received).tenants.length === 0 ? true : undefined));
    expect(received.some((m) => m.kind === "delta" && m.removedTenants?.includes("search"))).toBe(
      true,
    );
    const events = (await admin.listEvents({ limit: 100 })).events.map((e) => e.kind);
    expect(events.filter((k) => k.startsWith("tenant."))).toEqual([
      "tenant.created",
      "tenant.updated",
      "tenant.deleted",
    ]);
  });
});

const skip = postgresUnavailable();

describe.skipIf(skip)(`tenants on followers${skip ? ` (skipped: ${skip})` : ""}`, () => {
  let server: TestPostgres;
  beforeAll(async () => {
    server = await startTestPostgres();
  });
  afterAll(() => server?.destroy());

  it("are listed by a follower from its warm copy, as keys are, and changed only on the leader", async () => {
    const url = await server.createDatabase();
    const tmp = tempDir("llmgw-tenants-ha-");
    cleanups.push(tmp.cleanup);
    const start = (): Promise<ControlPlane> =>
      startControlPlane({
        dataDir: tmp.dir,
        store: url,
        controlListen: "127.0.0.1:0",
        publicApi: false,
        shutdownGraceMs: 1_000,
      });
    const leader = await start();
    cleanups.push(() => leader.close().then(() => {}));
    // Started together, either may win the lease: the follower starts once the leader leads.
    await eventually(() => (leader.leading ? true : undefined), 20_000);
    const follower = await start();
    cleanups.push(() => follower.close().then(() => {}));
    const onLeader = adminClient(leader, leader.adminToken);
    const onFollower = adminClient(follower, follower.adminToken);
    await onLeader.createTenant({ tenant: { name: "search", weight: 3 } });
    await onLeader.createApiKey({ name: "app", tenant: "search" });

    let headers = new Headers();
    const listed = await eventually(async () => {
      const answer = await whenServed(() =>
        onFollower.listTenants(
          {},
          {
            onHeader: (h) => {
              headers = h;
            },
          },
        ),
      );
      return answer?.tenants[0]?.activeKeys === 1 ? answer.tenants : undefined;
    });
    expect(listed.map((t) => [t.name, t.weight, t.activeKeys])).toEqual([["search", 3, 1]]);
    expect(headers.get("llmgw-served-by")).toBe("follower");
    expect((await onFollower.listApiKeys({})).keys.map((k) => [k.name, k.tenant])).toEqual([
      ["app", "search"],
    ]);
    expect(await refusal(onFollower.deleteTenant({ name: "search" }))).toMatchObject({
      code: "Unavailable",
      llmgw: "LLMGW_CONTROL_PLANE_NOT_LEADER",
    });
  }, 60_000);
});
