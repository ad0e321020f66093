// Tenants and the keys' tenant, budgets and priority: what is refused (each refusal with its
// code and message), what is kept across a restart, and what routers are handed.
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { schedule } from "@llmgw/scheduler";
import { describe, expect, it } from "vitest";
import type { ClusterStore } from "../store/types.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { Cluster } from "./cluster.js";
import type { TenantInput } from "./tenants.js";

let store: ClusterStore;
let clock: ManualClock;

sqliteStoreEachTest("llmgw-tenants-", (f) => {
  ({ store, clock } = f);
});

function cluster(): Cluster {
  return new Cluster({
    store,
    schedule,
    clock,
    heartbeatIntervalMs: 1000,
    unreachableAfterMs: 3000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
}

/** What `fn` throws: its code and message. */
function refusal(fn: () => unknown): { code: string; message: string } {
  try {
    fn();
  } catch (error) {
    return { code: (error as { code: string }).code, message: (error as Error).message };
  }
  throw new Error("expected a refusal");
}

const day = (tokens: number, model?: string) => ({ period: "day", model, tokens });

describe("Tenants.create refuses", () => {
  it.each<[string, string, TenantInput, string, string]>([
    [
      "an upper-case name",
      "Search",
      {},
      "LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID",
      `tenant name must be 1–63 lower-case letters, digits or '-' (got "Search")`,
    ],
    [
      "an empty name",
      "",
      {},
      "LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID",
      `tenant name must be 1–63 lower-case letters, digits or '-' (got "")`,
    ],
    [
      "a name of 64 characters",
      "a".repeat(64),
      {},
      "LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID",
      `tenant name must be 1–63 lower-case letters, digits or '-' (got "${"a".repeat(64)}")`,
    ],
    [
      "a name with '_'",
      "search_team",
      {},
      "LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID",
      `tenant name must be 1–63 lower-case letters, digits or '-' (got "search_team")`,
    ],
    [
      "a weight over 1000",
      "search",
      { weight: 1001 },
      "LLMGW_CONTROL_PLANE_TENANT_WEIGHT_INVALID",
      "tenant search weight must be a whole number in 1–1000 (0 reads as 1; got 1001)",
    ],
    [
      "a fractional weight",
      "search",
      { weight: 1.5 },
      "LLMGW_CONTROL_PLANE_TENANT_WEIGHT_INVALID",
      "tenant search weight must be a whole number in 1–1000 (0 reads as 1; got 1.5)",
    ],
    [
      "a cache isolation that is not tenant or key",
      "search",
      { cacheIsolation: "none" },
      "LLMGW_CONTROL_PLANE_TENANT_CACHE_ISOLATION_INVALID",
      `tenant search cache_isolation must be one of tenant, key, or empty for each router's own --cache-isolation (got "none")`,
    ],
    [
      "a rate of 0",
      "search",
      { requestsPerMinute: 0 },
      "LLMGW_CONTROL_PLANE_TENANT_LIMIT_INVALID",
      "tenant search requests_per_minute must be a whole number in 1–4294967295, or unset for no limit (got 0)",
    ],
    [
      "a concurrency past 2³²−1",
      "search",
      { maxConcurrency: 2 ** 32 },
      "LLMGW_CONTROL_PLANE_TENANT_LIMIT_INVALID",
      "tenant search max_concurrency must be a whole number in 1–4294967295, or unset for no limit (got 4294967296)",
    ],
    [
      "an unknown priority",
      "search",
      { priority: "urgent" },
      "LLMGW_CONTROL_PLANE_PRIORITY_INVALID",
      `tenant search priority must be one of critical, standard, batch or unset (got "urgent")`,
    ],
    [
      "a budget without a period",
      "search",
      { budgets: [{ tokens: 5 }] },
      "LLMGW_CONTROL_PLANE_BUDGET_INVALID",
      "tenant search budgets[0]: period must be day or month (got none)",
    ],
    [
      "a budget per week",
      "search",
      { budgets: [{ period: "week", tokens: 5 }] },
      "LLMGW_CONTROL_PLANE_BUDGET_INVALID",
      `tenant search budgets[0]: period must be day or month (got "week")`,
    ],
    [
      "a budget of 0 tokens",
      "search",
      { budgets: [day(1), day(0, "chat")] },
      "LLMGW_CONTROL_PLANE_BUDGET_INVALID",
      "tenant search budgets[1]: tokens must be a whole number in 1–9007199254740991 (got 0)",
    ],
    [
      "a budget past 2⁵³−1 tokens",
      "search",
      { budgets: [day(2 ** 53)] },
      "LLMGW_CONTROL_PLANE_BUDGET_INVALID",
      "tenant search budgets[0]: tokens must be a whole number in 1–9007199254740991 (got 9007199254740992)",
    ],
    [
      "a budget whose model name is over 256 characters",
      "search",
      { budgets: [day(5, "m".repeat(257))] },
      "LLMGW_CONTROL_PLANE_BUDGET_INVALID",
      `tenant search budgets[0]: model must be a served model name of at most 256 characters (got "${"m".repeat(63)}… (259 characters))`,
    ],
    [
      "two budgets for the same period and model",
      "search",
      { budgets: [day(5, "chat"), { period: "month", model: "chat", tokens: 9 }, day(6, "chat")] },
      "LLMGW_CONTROL_PLANE_BUDGET_DUPLICATE",
      `tenant search has two day budgets for model "chat"; keep one`,
    ],
    [
      "two budgets for all models in one period",
      "search",
      { budgets: [day(5), { period: "day", model: "", tokens: 6 }] },
      "LLMGW_CONTROL_PLANE_BUDGET_DUPLICATE",
      "tenant search has two day budgets for all models; keep one",
    ],
    [
      "33 budgets",
      "search",
      { budgets: Array.from({ length: 33 }, (_, i) => day(5, `m${i}`)) },
      "LLMGW_CONTROL_PLANE_BUDGET_TOO_MANY",
      "tenant search may have at most 32 budgets (got 33)",
    ],
  ])("%s", (_what, name, input, code, message) => {
    const c = cluster();
    expect(refusal(() => c.tenants.create(name, input))).toEqual({ code, message });
    expect(c.tenants.list()).toEqual([]);
    expect(store.listTenants()).toEqual([]);
  });

  it("a name already taken", () => {
    const c = cluster();
    c.tenants.create("search", {});
    expect(refusal(() => c.tenants.create("search", { weight: 2 }))).toEqual({
      code: "LLMGW_CONTROL_PLANE_ALREADY_EXISTS",
      message: "a tenant named search already exists",
    });
  });
});

describe("Tenants", () => {
  it("creates with weight 1 for 0 or none, 32 budgets at most, and keeps them across a restart", () => {
    const c = cluster();
    const search = c.tenants.create("search", {
      requestsPerMinute: 600,
      tokensPerMinute: 100_000,
      budgets: [
        ...Array.from({ length: 31 }, (_, i) => day(5, `m${i}`)),
        { period: "month", model: "", tokens: Number.MAX_SAFE_INTEGER },
      ],
      priority: "critical",
      weight: 0,
      cacheIsolation: "key",
    });
    expect(search).toMatchObject({
      name: "search",
      weight: 1,
      priority: "critical",
      cacheIsolation: "key",
    });
    expect(search.budgets).toHaveLength(32);
    // "" is every model: held as absent.
    expect(search.budgets[31]).toEqual({ period: "month", tokens: Number.MAX_SAFE_INTEGER });
    // "" asks for nothing: held as absent.
    expect(c.tenants.create("a-1", { weight: 1000, cacheIsolation: "" })).not.toHaveProperty(
      "cacheIsolation",
    );
    expect(c.tenants.list().map((t) => [t.name, t.weight])).toEqual([
      ["a-1", 1000],
      ["search", 1],
    ]);
    expect(c.events.list().map((e) => [e.kind, e.subject, e.message])).toEqual([
      ["tenant.created", "search", "tenant search created"],
      ["tenant.created", "a-1", "tenant a-1 created"],
    ]);
    expect(cluster().tenants.list()).toEqual(c.tenants.list());
  });

  it("updates the named fields: set, or cleared when left unset; the others stay", () => {
    const c = cluster();
    c.tenants.create("search", {
      requestsPerMinute: 600,
      tokensPerMinute: 100_000,
      budgets: [day(5)],
      priority: "batch",
      weight: 7,
      cacheIsolation: "tenant",
    });
    clock.advance(1000);
    const updated = c.tenants.update(
      "search",
      { tokensPerMinute: 50, maxConcurrency: 4, weight: 9 },
      ["tokens_per_minute", "requests_per_minute", "priority", "max_concurrency"],
    );
    expect(updated).toEqual({
      name: "search",
      tokensPerMinute: 50,
      maxConcurrency: 4,
      budgets: [{ period: "day", tokens: 5 }],
      weight: 7,
      cacheIsolation: "tenant",
      createdAtMs: clock.now() - 1000,
      updatedAtMs: clock.now(),
    });
    const cleared = c.tenants.update("search", {}, ["budgets", "weight", "cache_isolation"]);
    expect(cleared).toMatchObject({ budgets: [], weight: 1 });
    expect(cleared).not.toHaveProperty("cacheIsolation");
    expect(cluster().tenants.get("search")).toEqual(c.tenants.get("search"));
    // No fields: nothing changes, nothing is written or told.
    const held = c.tenants.get("search");
    clock.advance(1000);
    expect(c.tenants.update("search", { weight: 99 }, [])).toBe(held);
    expect(c.events.list().map((e) => e.message)).toEqual([
      "tenant search created",
      "tenant search updated (tokens_per_minute, requests_per_minute, priority, max_concurrency)",
      "tenant search updated (budgets, weight, cache_isolation)",
    ]);
  });

  it("refuses an update naming a field that cannot change, or a tenant that does not exist", () => {
    const c = cluster();
    c.tenants.create("search", { weight: 2 });
    expect(refusal(() => c.tenants.update("search", {}, ["weight", "name"]))).toEqual({
      code: "LLMGW_CONTROL_PLANE_TENANT_FIELD_UNKNOWN",
      message: `UpdateTenantRequest.fields: "name" is not a field that can be changed; use requests_per_minute, tokens_per_minute, max_concurrency, budgets, priority, weight, cache_isolation`,
    });
    expect(refusal(() => c.tenants.update("search", { weight: 5000 }, ["weight"]))).toEqual({
      code: "LLMGW_CONTROL_PLANE_TENANT_WEIGHT_INVALID",
      message: "tenant search weight must be a whole number in 1–1000 (0 reads as 1; got 5000)",
    });
    expect(refusal(() => c.tenants.update("other", {}, ["weight"]))).toEqual({
      code: "LLMGW_CONTROL_PLANE_NOT_FOUND",
      message: `no tenant named "other"; known: search`,
    });
    expect(c.tenants.get("search")?.weight).toBe(2);
  });

  it("updates only a tenant as its reader saw it, when asked to", () => {
    const c = cluster();
    const read = c.tenants.create("search", { weight: 2 });
    // Two changes within one millisecond are still told apart.
    const first = c.tenants.update("search", { weight: 3 }, ["weight"], read.updatedAtMs);
    expect(first.updatedAtMs).toBe(read.updatedAtMs + 1);
    // Another change made since `read`: refused, nothing written.
    expect(
      refusal(() => c.tenants.update("search", { weight: 4 }, ["weight"], read.updatedAtMs)),
    ).toEqual({
      code: "LLMGW_CONTROL_PLANE_TENANT_CHANGED",
      message: `tenant search changed since it was read (last changed ${new Date(first.updatedAtMs).toISOString()}, not ${new Date(read.updatedAtMs).toISOString()}); read it again`,
    });
    expect(c.tenants.get("search")?.weight).toBe(3);
    // Deleted and created again: another tenant, however recently read.
    c.tenants.delete("search");
    clock.advance(5);
    c.tenants.create("search", { weight: 2 });
    expect(refusal(() => c.tenants.update("search", {}, ["weight"], first.updatedAtMs)).code).toBe(
      "LLMGW_CONTROL_PLANE_TENANT_CHANGED",
    );
  });

  it("deletes a tenant only once it has no active keys", () => {
    const c = cluster();
    c.tenants.create("search", {});
    c.apiKeys.create({ name: "a", models: [], tenant: "search" });
    c.apiKeys.create({ name: "b", models: [], tenant: "search" });
    c.apiKeys.create({ name: "c", models: [] });
    expect(refusal(() => c.tenants.delete("search"))).toEqual({
      code: "LLMGW_CONTROL_PLANE_TENANT_HAS_KEYS",
      message:
        "tenant search has 2 active API keys; revoke them first (llmgw keys list, llmgw keys revoke)",
    });
    c.apiKeys.revoke("a");
    expect(refusal(() => c.tenants.delete("search"))).toEqual({
      code: "LLMGW_CONTROL_PLANE_TENANT_HAS_KEYS",
      message:
        "tenant search has 1 active API key; revoke it first (llmgw keys list, llmgw keys revoke)",
    });
    c.apiKeys.revoke("b");
    c.tenants.delete("search");
    expect(c.tenants.list()).toEqual([]);
    expect(store.listTenants()).toEqual([]);
    expect(c.events.list().at(-1)).toMatchObject({
      kind: "tenant.deleted",
      subject: "search",
      message: "tenant search deleted",
    });
    expect(refusal(() => c.tenants.delete("search"))).toEqual({
      code: "LLMGW_CONTROL_PLANE_NOT_FOUND",
      message: `no tenant named "search"`,
    });
  });
});

describe("API keys of tenants", () => {
  it("refuses a key naming a tenant that does not exist, and bad budgets or priority", () => {
    const c = cluster();
    expect(refusal(() => c.apiKeys.create({ name: "app", models: [], tenant: "search" }))).toEqual({
      code: "LLMGW_CONTROL_PLANE_TENANT_UNKNOWN",
      message: `API key app: no tenant named "search"; create it first (llmgw tenants create)`,
    });
    expect(
      refusal(() => c.apiKeys.create({ name: "app", models: [], budgets: [day(5), day(6)] })),
    ).toEqual({
      code: "LLMGW_CONTROL_PLANE_BUDGET_DUPLICATE",
      message: "API key app has two day budgets for all models; keep one",
    });
    expect(refusal(() => c.apiKeys.create({ name: "app", models: [], priority: "3" }))).toEqual({
      code: "LLMGW_CONTROL_PLANE_PRIORITY_INVALID",
      message: `API key app priority must be one of critical, standard, batch or unset (got "3")`,
    });
    expect(c.apiKeys.list()).toEqual([]);
  });

  it("keeps a key's tenant, budgets and priority, and hands them to routers", () => {
    const c = cluster();
    const createdAtMs = clock.now();
    c.tenants.create("search", { tokensPerMinute: 1000, priority: "critical", weight: 3 });
    const { key } = c.apiKeys.create({
      name: "app",
      models: [],
      tenant: "search",
      budgets: [{ period: "month", model: "chat", tokens: 50_000_000 }],
      priority: "batch",
    });
    expect(key).toMatchObject({
      tenant: "search",
      budgets: [{ period: "month", model: "chat", tokens: 50_000_000 }],
      priority: "batch",
    });
    clock.advance(1);
    const plain = c.apiKeys.create({ name: "plain", models: [], tenant: "" }).key;
    expect(plain).not.toHaveProperty("tenant");
    const again = cluster();
    expect(again.apiKeys.list()).toEqual(c.apiKeys.list());
    const m = again.routingMembership();
    expect(m.keys.map(({ secretSha256: _, id: __, ...k }) => k)).toEqual([
      {
        name: "app",
        tenant: "search",
        budgets: [{ period: "month", model: "chat", tokens: 50_000_000 }],
        priority: "batch",
      },
      { name: "plain" },
    ]);
    expect(m.tenants).toEqual([
      { name: "search", tpm: 1000, priority: "critical", weight: 3, createdAtMs },
    ]);
  });
});

describe("routing", () => {
  it("moves on tenant create, update and delete, on the keys' path", () => {
    const c = cluster();
    let bumps = 0;
    c.onRoutingChange(() => bumps++);
    const topology = c.routingTopologyVersion;
    const createdAtMs = clock.now();
    c.tenants.create("search", { budgets: [day(5)] });
    expect(bumps).toBe(1);
    expect(c.routingTenants()).toEqual([
      { name: "search", budgets: [{ period: "day", tokens: 5 }], weight: 1, createdAtMs },
    ]);
    clock.advance(1000);
    c.tenants.update("search", { weight: 4 }, ["weight", "budgets"]);
    expect(bumps).toBe(2);
    // An update keeps the creation time: the same tenant, the same cache scope.
    expect(c.routingTenants()).toEqual([{ name: "search", weight: 4, createdAtMs }]);
    c.tenants.delete("search");
    expect(bumps).toBe(3);
    expect(c.routingTenants()).toEqual([]);
    // Replicas and models are not rebuilt for a tenant change.
    expect(c.routingTopologyVersion).toBe(topology);
    // Created again under its name, it is another tenant to routers (cache isolation), even
    // within the same clock tick.
    clock.advance(1000);
    c.tenants.create("search", {});
    expect(c.routingTenants()).toEqual([
      { name: "search", weight: 1, createdAtMs: createdAtMs + 2000 },
    ]);
    c.tenants.delete("search");
    c.tenants.create("search", {});
    expect(c.routingTenants()).toEqual([
      { name: "search", weight: 1, createdAtMs: createdAtMs + 2001 },
    ]);
  });

  it("marks a vLLM deployment scheduling by priority: enginePriority", () => {
    const c = cluster();
    const spec = (name: string, engine: string, extraArgs: string[]) =>
      parseDeploymentSpecOrThrow({ name, engine, model: "org/m", replicas: 0, extraArgs });
    c.applyDeployment(spec("a", "vllm", ["--scheduling-policy", "priority"]));
    c.applyDeployment(spec("b", "vllm", ["--scheduling-policy=priority"]));
    c.applyDeployment(spec("c", "vllm", ["--scheduling-policy", "fcfs"]));
    c.applyDeployment(spec("d", "sglang", []));
    expect(c.routingMembership().models.map((m) => [m.name, m.enginePriority ?? false])).toEqual([
      ["a", true],
      ["b", true],
      ["c", false],
      ["d", false],
    ]);
  });

  it("tells routers how each engine keeps a request's cache apart", () => {
    const c = cluster();
    for (const engine of ["vllm", "sglang", "llamacpp", "sim"]) {
      c.applyDeployment(
        parseDeploymentSpecOrThrow({
          name: engine,
          engine,
          model: engine === "llamacpp" ? "/models/m.gguf" : "org/m",
          replicas: 0,
        }),
      );
    }
    expect(c.routingMembership().models.map((m) => [m.name, m.cacheIsolation])).toEqual([
      ["llamacpp", "no-reuse"],
      ["sglang", "salt"],
      ["sim", "salt"],
      ["vllm", "salt"],
    ]);
  });
});
