import { execFileSync } from "node:child_process";
import {
  chmodSync,
  chownSync,
  closeSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  truncateSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { isControlPlaneError } from "../errors.js";
import { fillDisk } from "../testing/full-disk.js";
import { MIGRATIONS } from "./migrations.js";
import { openSqliteStore } from "./sqlite-store.js";
import {
  AVOIDED,
  DRAINING,
  deployment,
  LIFECYCLE,
  lifecycleKeys,
  node,
  placement,
  putAvoidedRecords,
  putLifecycleRecords,
  putTenancyRecords,
  revision,
  TENANCY,
  WAITING,
} from "./test-records.js";
import type { ClusterStore } from "./types.js";

let dir: string;
let file: string;
const open: ClusterStore[] = [];
const openStore = (opts: { eventsKept?: number; expectExisting?: boolean } = {}) => {
  const s = openSqliteStore({ file, ...opts });
  open.push(s);
  return s;
};

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "llmgw-store-"));
  file = join(dir, "state.db");
});
afterEach(() => {
  for (const s of open.splice(0)) s.close();
  rmSync(dir, { recursive: true, force: true });
});

function fill(store: ClusterStore): void {
  store.putDeployment({
    name: "chat",
    specJson: '{"name":"chat"}',
    revision: 2,
    createdAtMs: 1,
    updatedAtMs: 2,
  });
  store.putPlacement({
    replicaId: "chat-0",
    deployment: "chat",
    revision: 2,
    ranks: [{ rank: 0, nodeId: "a-1", gpuIndices: [0, 1] }],
    fabricId: "ib-a",
    rendezvousPort: 29500,
    createdAtMs: 3,
  });
  store.putApiKey({
    id: "key_1",
    name: "app",
    prefix: "sk-llmgw-abcd",
    secretHash: "ff",
    models: ["chat"],
    requestsPerMinute: 60,
    budgets: [],
    createdAtMs: 4,
  });
  store.putNode({
    id: "a-1",
    hostname: "a",
    credentialHash: "ee",
    inventory: new Uint8Array([1, 2, 3]),
    advertiseAddress: "10.0.0.1",
    cordoned: true,
    draining: false,
    revoked: false,
    registeredAtMs: 5,
  });
  for (let i = 0; i < 40; i++) {
    store.appendEvent({ atMs: i, kind: "test", subject: "s", message: `m${i}`, severity: "info" });
  }
}

function expectCorrupt(fn: () => unknown): string {
  try {
    fn();
  } catch (error) {
    expect(isControlPlaneError(error)).toBe(true);
    expect((error as { code: string }).code).toBe("LLMGW_CONTROL_PLANE_STORE_CORRUPT");
    expect((error as Error).message).toContain(file);
    expect((error as Error).message).toContain("restore the file from a backup");
    return (error as Error).message;
  }
  throw new Error("expected LLMGW_CONTROL_PLANE_STORE_CORRUPT");
}

describe("openSqliteStore", () => {
  it("creates an owner-only file at the latest schema version in WAL mode", () => {
    openStore().close();
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const db = new Database(file, { readonly: true });
    expect(db.pragma("user_version", { simple: true })).toBe(MIGRATIONS.length);
    expect(db.pragma("journal_mode", { simple: true })).toBe("wal");
    db.close();
  });

  it("keeps every record across a reopen", () => {
    const first = openStore({ eventsKept: 1000 });
    fill(first);
    first.close();
    const again = openStore({ expectExisting: true });
    expect(again.listDeployments()).toEqual([
      { name: "chat", specJson: '{"name":"chat"}', revision: 2, createdAtMs: 1, updatedAtMs: 2 },
    ]);
    expect(again.listPlacements()[0]).toEqual({
      replicaId: "chat-0",
      deployment: "chat",
      revision: 2,
      ranks: [{ rank: 0, nodeId: "a-1", gpuIndices: [0, 1] }],
      fabricId: "ib-a",
      rendezvousPort: 29500,
      createdAtMs: 3,
    });
    const [key] = again.listApiKeys();
    expect(key).toMatchObject({ id: "key_1", models: ["chat"], requestsPerMinute: 60 });
    expect(key?.tokensPerMinute).toBeUndefined();
    const [node] = again.listNodes();
    expect(node).toMatchObject({ id: "a-1", cordoned: true, draining: false, revoked: false });
    expect([...(node?.inventory ?? [])]).toEqual([1, 2, 3]);
    expect(again.listEvents({ limit: 3 }).map((e) => e.message)).toEqual(["m37", "m38", "m39"]);
  });

  it("keeps a node's recorded liveness, and leaves a node without one without", () => {
    const first = openStore();
    fill(first);
    expect(first.listNodes()[0]?.state).toBeUndefined();
    first.putNodeState("a-1", "unreachable", 77);
    first.putNodeState("not-stored", "ready", 78);
    first.close();
    const [node, ...rest] = openStore({ expectExisting: true }).listNodes();
    expect(node).toMatchObject({ id: "a-1", state: "unreachable", stateSinceMs: 77 });
    expect(rest).toEqual([]);
  });

  it("keeps a GPU's cleared faults across a reopen, and replaces them per GPU", () => {
    const store = openStore();
    const clear = (gpuUuid: string, faultKey: string, lastSeenUnixMs: number) => ({
      gpuUuid,
      faultKey,
      lastSeenUnixMs,
      clearedAtMs: 9,
    });
    store.replaceFaultClears("GPU-a", [
      clear("GPU-a", "xid:00000000:06:00.0:79", 2_000),
      clear("GPU-a", "xid:00000000:06:00.0:48", 1_500),
    ]);
    store.replaceFaultClears("GPU-b", [clear("GPU-b", "xid:00000000:07:00.0:79", 3_000)]);
    store.replaceFaultClears("GPU-a", [clear("GPU-a", "xid:00000000:06:00.0:79", 4_000)]);
    store.close();
    expect(openStore({ expectExisting: true }).listFaultClears()).toEqual([
      clear("GPU-a", "xid:00000000:06:00.0:79", 4_000),
      clear("GPU-b", "xid:00000000:07:00.0:79", 3_000),
    ]);
  });

  it("adds the fault-clear table to a store created before it existed", () => {
    const db = new Database(file);
    for (const m of MIGRATIONS.slice(0, 2)) db.exec(m);
    db.pragma("user_version = 2");
    db.close();
    const store = openStore({ expectExisting: true });
    expect(store.listFaultClears()).toEqual([]);
  });

  it("keeps replica statuses across a reopen, and deletes one rank or every rank", () => {
    const store = openStore();
    const status = (replicaId: string, rank: number, extra: Record<string, unknown> = {}) => ({
      replicaId,
      rank,
      nodeId: "a-1",
      state: "ready",
      stateSinceMs: 10,
      specHash: "h",
      revision: 2,
      ...extra,
    });
    store.putReplicaStatus(status("chat-0", 0, { apiPort: 8000, pid: 77, startedAtMs: 9 }));
    store.putReplicaStatus(status("chat-0", 1));
    store.putReplicaStatus(status("big-0", 0));
    store.putReplicaStatus(status("big-0", 1));
    store.putReplicaStatus(status("chat-0", 1, { state: "loading" }));
    store.close();
    const again = openStore({ expectExisting: true });
    expect(again.listReplicaStatuses()).toEqual([
      status("big-0", 0),
      status("big-0", 1),
      status("chat-0", 0, { apiPort: 8000, pid: 77, startedAtMs: 9 }),
      status("chat-0", 1, { state: "loading" }),
    ]);
    again.deleteReplicaStatuses("chat-0", 1);
    again.deleteReplicaStatuses("big-0");
    expect(again.listReplicaStatuses().map((r) => `${r.replicaId}#${r.rank}`)).toEqual([
      "chat-0#0",
    ]);
  });

  it("adds the replica-status table to a store of the schema before, keeping its data", () => {
    const db = new Database(file);
    for (const m of MIGRATIONS.slice(0, 3)) db.exec(m);
    db.pragma("user_version = 3");
    db.exec(
      `INSERT INTO deployments VALUES ('chat', '{"name":"chat"}', 2, 1, 2);
       INSERT INTO placements VALUES
         ('chat-0', 'chat', 2, '[{"rank":0,"nodeId":"a-1","gpuIndices":[0]}]', NULL, NULL, 3);
       INSERT INTO nodes VALUES ('a-1', 'a', 'ee', x'010203', '10.0.0.1', 0, 0, 0, 5, 0);
       INSERT INTO gpu_fault_clears VALUES ('GPU-a', 'xid:00000000:06:00.0:79', 2000, 9);`,
    );
    db.close();
    const store = openStore({ expectExisting: true });
    expect(store.listReplicaStatuses()).toEqual([]);
    expect(store.listDeployments().map((d) => d.name)).toEqual(["chat"]);
    expect(store.listPlacements().map((p) => p.ranks)).toEqual([
      [{ rank: 0, nodeId: "a-1", gpuIndices: [0] }],
    ]);
    expect(store.listNodes().map((n) => n.advertiseAddress)).toEqual(["10.0.0.1"]);
    expect(store.listFaultClears().map((c) => c.lastSeenUnixMs)).toEqual([2000]);
    store.close();
    const check = new Database(file, { readonly: true });
    expect(check.pragma("user_version", { simple: true })).toBe(MIGRATIONS.length);
    check.close();
  });

  it("counts a schema-8 usage row's answers other than estimates as cached-reported", async () => {
    const db = new Database(file);
    for (const m of MIGRATIONS.slice(0, 8)) db.exec(m);
    db.pragma("user_version = 8");
    // 5 requests, 2 of them estimates (their cached tokens unknown); the rest reported.
    db.exec(
      `INSERT INTO usage_rollups VALUES ('day', 0, 'search', 'k1', 'chat', 5, 500, 120, 50, 0, 2, 0);`,
    );
    db.close();
    const store = openStore({ expectExisting: true });
    const rows = await store.usage.query({
      bucket: "day",
      sinceMs: 0,
      untilMs: 1,
      groupBy: { tenant: true, key: true, model: true },
      limit: 10,
    });
    expect(rows).toEqual([
      expect.objectContaining({ requests: 5, cachedTokens: 120, cachedReported: 3 }),
    ]);
  });

  it("refuses a store whose version promises the replica-status table but lacks it", () => {
    openStore().close();
    const db = new Database(file);
    db.exec("DROP TABLE replica_statuses");
    db.close();
    const message = expectCorrupt(() => openStore({ expectExisting: true }));
    expect(message).toContain(
      `table replica_statuses is missing at schema version ${MIGRATIONS.length}`,
    );
  });

  it("creates, replaces and deletes avoided nodes, kept across a reopen (schema v8)", () => {
    const store = openStore();
    const want = putAvoidedRecords(store);
    expect(store.listAvoidedNodes()).toEqual(want);
    store.close();
    expect(openStore({ expectExisting: true }).listAvoidedNodes()).toEqual(AVOIDED);
  });

  it("keeps retirements, rollouts, who drained a node and revision specs across a reopen", () => {
    const first = openStore();
    putLifecycleRecords(first);
    first.close();
    const again = openStore({ expectExisting: true });
    expect(again.listDeployments()).toEqual(LIFECYCLE.deployments);
    expect(again.listDeploymentRevisions()).toEqual(LIFECYCLE.revisions);
    expect(again.listPlacements()).toEqual(LIFECYCLE.placements);
    expect(again.listNodes()).toEqual(LIFECYCLE.nodes);
    // Absent stays absent: no empty retirement, no "" for who drained.
    expect(lifecycleKeys(again)).toEqual(["chat", "chat-0", "chat-1", "a-1", "b-1"]);
  });

  it("replaces and clears the lifecycle fields, keeping a deployment's creation time", () => {
    const store = openStore();
    putLifecycleRecords(store);
    store.putDeployment(deployment("chat", { createdAtMs: 99, revision: 11 }));
    store.putPlacement(placement("chat-0"));
    store.putPlacement(placement("chat-2", { retirement: WAITING }));
    store.putPlacement(placement("chat-1", { retirement: { ...WAITING, ...DRAINING } }));
    store.putNode(node("a-1"));
    store.close();
    const again = openStore({ expectExisting: true });
    const [chat] = again.listDeployments();
    expect(chat).toEqual(deployment("chat", { revision: 11 }));
    expect(again.listPlacements().map((p) => p.retirement)).toEqual([undefined, DRAINING, WAITING]);
    expect(lifecycleKeys(again)).toEqual(["chat-1", "chat-2", "b-1"]);
  });

  it("creates, replaces and deletes revision specs, listed by name then revision", () => {
    const store = openStore();
    putLifecycleRecords(store);
    store.putDeploymentRevision({ ...revision("chat", 3), specJson: '{"replaced":true}' });
    store.putDeploymentRevision(revision("a", 7));
    store.deleteDeploymentRevision("chat", 10);
    // Deleting what is not there is no error.
    store.deleteDeploymentRevision("chat", 10);
    store.deleteDeploymentRevision("none", 1);
    expect(store.listDeploymentRevisions()).toEqual([
      revision("a", 7),
      { ...revision("chat", 3), specJson: '{"replaced":true}' },
      revision("code", 1),
    ]);
    store.transaction(() => {
      store.putDeploymentRevision(revision("chat", 4));
      store.deleteDeploymentRevision("a", 7);
    });
    expect(store.listDeploymentRevisions().map((r) => `${r.name}@${r.revision}`)).toEqual([
      "chat@3",
      "chat@4",
      "code@1",
    ]);
    expect(() =>
      store.transaction(() => {
        store.deleteDeploymentRevision("code", 1);
        throw new Error("boom");
      }),
    ).toThrow("boom");
    expect(store.listDeploymentRevisions()).toHaveLength(3);
  });

  it("keeps tenants and the keys' tenant, budgets and priority across a reopen", () => {
    const first = openStore();
    putTenancyRecords(first);
    expect(first.listTenants()).toEqual(TENANCY.tenants);
    first.close();
    const again = openStore({ expectExisting: true });
    expect(again.listTenants()).toEqual(TENANCY.tenants);
    expect(again.listApiKeys()).toEqual(TENANCY.keys);
    // Absent stays absent, not a key holding undefined: the routing grants compare by key.
    expect(Object.keys(again.listTenants()[0] ?? {}).sort()).toEqual([
      "budgets",
      "createdAtMs",
      "name",
      "updatedAtMs",
      "weight",
    ]);
    expect(again.listApiKeys()[1]).not.toHaveProperty("tenant");
    expect(again.listApiKeys()[1]).not.toHaveProperty("priority");
  });

  it("replaces a tenant keeping its creation time, and deletes it", () => {
    const store = openStore();
    putTenancyRecords(store);
    const [, search] = TENANCY.tenants;
    store.putTenant({
      name: "search",
      budgets: [],
      weight: 3,
      createdAtMs: 1,
      updatedAtMs: (search?.updatedAtMs ?? 0) + 10,
    });
    store.deleteTenant("batch-jobs");
    store.deleteTenant("none");
    store.close();
    expect(openStore({ expectExisting: true }).listTenants()).toEqual([
      {
        name: "search",
        budgets: [],
        weight: 3,
        createdAtMs: search?.createdAtMs,
        updatedAtMs: (search?.updatedAtMs ?? 0) + 10,
      },
    ]);
  });

  it.each([
    [
      "tenants",
      "budgets_json",
      '\'[{"period":"week","model":"","tokens":5}]\'',
      'the stored tenant search does not decode: tenants.budgets_json[0] field period is "week", not "day" or "month"',
    ],
    [
      "tenants",
      "budgets_json",
      "'{}'",
      "the stored tenant search does not decode: tenants.budgets_json is {}, not a list",
    ],
    [
      "tenants",
      "budgets_json",
      '\'[{"period":"day","model":"","tokens":0}]\'',
      "the stored tenant search does not decode: tenants.budgets_json[0] field tokens is 0, not at least 1",
    ],
    [
      "tenants",
      "priority",
      "'urgent'",
      'the stored tenant search does not decode: tenants.priority is "urgent", not "critical" or "standard" or "batch"',
    ],
    [
      "tenants",
      "cache_isolation",
      "'none'",
      'the stored tenant search does not decode: tenants.cache_isolation is "none", not "tenant" or "key"',
    ],
    [
      "api_keys",
      "priority",
      "'high'",
      'the stored API key key_a does not decode: api_keys.priority is "high", not "critical" or "standard" or "batch"',
    ],
    [
      "api_keys",
      "budgets_json",
      "'nope'",
      "the stored API key key_a does not decode: api_keys.budgets_json is not JSON",
    ],
  ])("refuses a %s row whose %s is %s, naming it", (table, column, value, message) => {
    const store = openStore();
    putTenancyRecords(store);
    store.close();
    const db = new Database(file);
    const where = table === "tenants" ? "name = 'search'" : "id = 'key_a'";
    db.exec(`UPDATE ${table} SET ${column} = ${value} WHERE ${where}`);
    db.close();
    const reopened = openStore({ expectExisting: true });
    const read = () => (table === "tenants" ? reopened.listTenants() : reopened.listApiKeys());
    expect(read).toThrow(
      expect.objectContaining({
        code: "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
        message: expect.stringContaining(message),
      }),
    );
  });

  it("upgrades a store of schema version 5: its rows read back with the new fields absent", () => {
    const db = new Database(file);
    for (const m of MIGRATIONS.slice(0, 5)) db.exec(m);
    db.pragma("user_version = 5");
    db.exec(
      `INSERT INTO deployments VALUES ('chat', '{"name":"chat"}', 2, 1, 2);
       INSERT INTO placements VALUES
         ('chat-0', 'chat', 2, '[{"rank":0,"nodeId":"a-1","gpuIndices":[0]}]', NULL, NULL, 3);
       INSERT INTO nodes VALUES ('a-1', 'a', 'ee', x'010203', '10.0.0.1', 0, 1, 0, 5, 0, 'ready', 6);
       INSERT INTO api_keys VALUES ('key_1', 'app', 'sk-llmgw-abcd', 'ff', '["chat"]', 60, NULL, NULL, 4, NULL);`,
    );
    db.close();
    const store = openStore({ expectExisting: true });
    // A key stored before v7: no tenant, no budgets, its priority inherited.
    expect(store.listApiKeys()).toEqual([
      {
        id: "key_1",
        name: "app",
        prefix: "sk-llmgw-abcd",
        secretHash: "ff",
        models: ["chat"],
        requestsPerMinute: 60,
        tokensPerMinute: undefined,
        maxConcurrency: undefined,
        createdAtMs: 4,
        revokedAtMs: undefined,
        budgets: [],
      },
    ]);
    expect(store.listTenants()).toEqual([]);
    expect(store.listDeployments()).toEqual([
      { name: "chat", specJson: '{"name":"chat"}', revision: 2, createdAtMs: 1, updatedAtMs: 2 },
    ]);
    expect(store.listPlacements().map((p) => p.replicaId)).toEqual(["chat-0"]);
    // A drain stored before v6: draining, by nobody recorded (the operator's).
    expect(store.listNodes()).toMatchObject([{ id: "a-1", draining: true, state: "ready" }]);
    expect(lifecycleKeys(store)).toEqual([]);
    expect(store.listDeploymentRevisions()).toEqual([]);
    store.close();
    const check = new Database(file, { readonly: true });
    expect(check.pragma("user_version", { simple: true })).toBe(MIGRATIONS.length);
    check.close();
  });

  it("rolls back an interrupted migration to version 6 and finishes it on the next start", () => {
    const db = new Database(file);
    for (const m of MIGRATIONS.slice(0, 5)) db.exec(m);
    // The last statement of version 6 fails after the others ran.
    db.exec("ALTER TABLE nodes ADD COLUMN drained_by TEXT");
    db.pragma("user_version = 5");
    db.close();
    expect(() => openStore({ expectExisting: true })).toThrow(
      expect.objectContaining({
        code: "LLMGW_CONTROL_PLANE_STORE_FAILED",
        message: `cannot open the state store ${file}: duplicate column name: drained_by`,
      }),
    );
    const after = new Database(file);
    expect(after.pragma("user_version", { simple: true })).toBe(5);
    const columns = (table: string) =>
      (after.pragma(`table_info(${table})`) as { name: string }[]).map((c) => c.name);
    expect(columns("placements")).not.toContain("retirement_json");
    expect(columns("deployments")).not.toContain("rollout_json");
    expect(
      after.prepare("SELECT name FROM sqlite_master WHERE name = 'deployment_revisions'").all(),
    ).toEqual([]);
    after.exec("ALTER TABLE nodes DROP COLUMN drained_by");
    after.close();
    const store = openStore({ expectExisting: true });
    putLifecycleRecords(store);
    expect(store.listNodes()).toEqual(LIFECYCLE.nodes);
  });

  it("refuses a store whose version promises the revision table but lacks it", () => {
    openStore().close();
    const db = new Database(file);
    db.exec("DROP TABLE deployment_revisions");
    db.close();
    expect(expectCorrupt(() => openStore({ expectExisting: true }))).toContain(
      `table deployment_revisions is missing at schema version ${MIGRATIONS.length}`,
    );
  });

  const jsonError = (text: string) => {
    try {
      JSON.parse(text);
    } catch (error) {
      return (error as Error).message;
    }
    throw new Error(`${text} is JSON`);
  };
  const undecodable = (row: string, column: string, detail: string) =>
    `the stored ${row} does not decode: ${column} ${detail}; refusing to guess what the cluster should do with it. Restore the store from a backup, or correct the column.`;
  const retirement = (fields: Record<string, unknown>) =>
    JSON.stringify({ code: "scale-down", message: "m", phase: "waiting", sinceMs: 1, ...fields });
  const rollout = (fields: Record<string, unknown>) =>
    JSON.stringify({
      state: "complete",
      fromRevision: 1,
      toRevision: 2,
      message: "",
      startedAtMs: 1,
      updatedAtMs: 2,
      ...fields,
    });
  it.each([
    ["placements", "retirement_json", "{", `is not JSON (${jsonError("{")})`],
    ["placements", "retirement_json", "[1]", "is [1], not an object"],
    ["placements", "retirement_json", "null", "is null, not an object"],
    [
      "placements",
      "retirement_json",
      retirement({ phase: "stopping" }),
      'field phase is "stopping", not "waiting" or "draining"',
    ],
    [
      "placements",
      "retirement_json",
      retirement({ code: "" }),
      'field code is "", not a non-empty string',
    ],
    [
      "placements",
      "retirement_json",
      retirement({ sinceMs: undefined }),
      "field sinceMs is missing, not a non-negative integer",
    ],
    [
      "placements",
      "retirement_json",
      retirement({ phase: "draining", deadlineMs: -5 }),
      "field deadlineMs is -5, not a non-negative integer",
    ],
    [
      "placements",
      "retirement_json",
      retirement({ message: "x".repeat(100), drainingSinceMs: "soon" }),
      'field drainingSinceMs is "soon", not a non-negative integer',
    ],
    [
      "deployments",
      "rollout_json",
      rollout({ state: "done" }),
      'field state is "done", not "in-progress" or "complete" or "rolled-back"',
    ],
    [
      "deployments",
      "rollout_json",
      rollout({ toRevision: 1.5 }),
      "field toRevision is 1.5, not a non-negative integer",
    ],
    ["deployments", "rollout_json", rollout({ message: 7 }), "field message is 7, not a string"],
    ["nodes", "drained_by", "robot", 'is "robot", not "operator" or "agent"'],
    ["nodes", "drained_by", "", 'is "", not "operator" or "agent"'],
  ])("refuses to read %s.%s holding %s, naming the row", (table, column, value, detail) => {
    const target = {
      placements: { where: "replica_id = 'chat-0'", row: "placement chat-0" },
      deployments: { where: "name = 'chat'", row: "deployment chat" },
      nodes: { where: "id = 'a-1'", row: "node a-1" },
    }[table as "placements" | "deployments" | "nodes"];
    const store = openStore();
    putLifecycleRecords(store);
    const db = new Database(file);
    db.prepare(`UPDATE ${table} SET ${column} = ? WHERE ${target.where}`).run(value);
    db.close();
    const list = () => {
      if (table === "placements") store.listPlacements();
      else if (table === "deployments") store.listDeployments();
      else store.listNodes();
    };
    expect(list).toThrow(
      expect.objectContaining({
        code: "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
        message: undecodable(target.row, `${table}.${column}`, detail),
      }),
    );
  });

  it("reads a retirement with fields it does not know, leaving them out", () => {
    const store = openStore();
    putLifecycleRecords(store);
    const db = new Database(file);
    db.prepare("UPDATE placements SET retirement_json = ? WHERE replica_id = 'chat-2'").run(
      retirement({ inFlight: 3 }),
    );
    db.close();
    expect(store.listPlacements()[2]?.retirement).toStrictEqual({
      code: "scale-down",
      message: "m",
      phase: "waiting",
      sinceMs: 1,
    });
  });

  it("keeps only the newest events beyond its bound", () => {
    const store = openStore({ eventsKept: 10 });
    fill(store);
    const all = store.listEvents({ limit: 1000 });
    expect(all).toHaveLength(10);
    expect(all[0]?.message).toBe("m30");
    expect(store.listEvents({ afterId: all[7]?.id, limit: 100 }).map((e) => e.message)).toEqual([
      "m38",
      "m39",
    ]);
  });

  it("pages events: after an id, the oldest ones next; without one, the newest", () => {
    const store = openStore();
    for (let i = 1; i <= 7; i++)
      store.appendEvent({ atMs: i, kind: "k", subject: "s", message: `m${i}`, severity: "info" });
    const ids = (q: { afterId?: number; limit: number }) => store.listEvents(q).map((e) => e.id);
    expect(ids({ limit: 3 })).toEqual([5, 6, 7]);
    expect(ids({ afterId: 0, limit: 3 })).toEqual([5, 6, 7]);
    expect(ids({ afterId: 1, limit: 3 })).toEqual([2, 3, 4]);
    expect(ids({ afterId: 4, limit: 3 })).toEqual([5, 6, 7]);
    expect(ids({ afterId: 6, limit: 3 })).toEqual([7]);
    expect(ids({ afterId: 7, limit: 3 })).toEqual([]);
  });

  it("rolls back every write of a failed transaction", () => {
    const store = openStore();
    expect(() =>
      store.transaction(() => {
        store.putDeployment({
          name: "x",
          specJson: "{}",
          revision: 1,
          createdAtMs: 0,
          updatedAtMs: 0,
        });
        throw new Error("boom");
      }),
    ).toThrow("boom");
    expect(store.listDeployments()).toEqual([]);
  });

  it("refuses a file of garbage bytes", () => {
    writeFileSync(file, Buffer.alloc(8192, 0x5a));
    const message = expectCorrupt(() => openStore());
    expect(message).toContain("file is not a database");
    // The bad file is left as it was, for the operator to inspect or restore.
    expect(readFileSync(file)[0]).toBe(0x5a);
  });

  it("refuses a truncated database", () => {
    const first = openStore();
    fill(first);
    for (let i = 0; i < 200; i++) {
      first.appendEvent({
        atMs: i,
        kind: "pad",
        subject: "s",
        message: "x".repeat(200),
        severity: "info",
      });
    }
    first.close();
    const db = new Database(file);
    db.pragma("wal_checkpoint(TRUNCATE)");
    db.close();
    truncateSync(file, Math.floor(statSync(file).size / 2));
    expectCorrupt(() => openStore());
  });

  it("refuses an empty database when the data dir was initialised before", () => {
    writeFileSync(file, "");
    const message = expectCorrupt(() => openStore({ expectExisting: true }));
    expect(message).toContain("no schema");
  });

  it("refuses a schema newer than this build", () => {
    openStore().close();
    const db = new Database(file);
    db.pragma(`user_version = ${MIGRATIONS.length + 1}`);
    db.close();
    expect(() => openStore()).toThrow(/newer than this build understands/);
  });

  it("turns a failed write into LLMGW_CONTROL_PLANE_STORE_FAILED naming the file", () => {
    const store = openStore();
    fill(store);
    const free = fillDisk(file);
    const append = () =>
      store.appendEvent({ atMs: 1, kind: "k", subject: "s", message: "m", severity: "info" });
    expect(append).toThrow(
      expect.objectContaining({
        code: "LLMGW_CONTROL_PLANE_STORE_FAILED",
        message: `the state store ${file} failed (appendEvent): database or disk is full (SQLITE_CONSTRAINT_TRIGGER)`,
      }),
    );
    expect(() => store.transaction(() => store.deletePlacement("chat-0"))).toThrow(
      /failed \(deletePlacement\): database or disk is full/,
    );
    // Reads still work, and nothing was half-written.
    expect(store.listPlacements().map((p) => p.replicaId)).toEqual(["chat-0"]);
    // A domain error thrown inside a transaction is not a store failure.
    free();
    const domain = new Error("not the store");
    expect(() =>
      store.transaction(() => {
        throw domain;
      }),
    ).toThrow(domain);
    expect(append().id).toBeGreaterThan(0);
  });
});

/**
 * Runs `fn` unable to create files in `inDir` while `files` in it stay writable: as root
 * (whom permissions do not stop) with the effective uid of nobody, who then owns `files`;
 * otherwise with the directory made read-only.
 */
function withoutWriteAccess<T>(inDir: string, files: readonly string[], fn: () => T): T {
  if (process.getuid?.() !== 0) {
    chmodSync(inDir, 0o555);
    try {
      return fn();
    } finally {
      chmodSync(inDir, 0o700);
    }
  }
  const nobody = 65534;
  chmodSync(inDir, 0o755);
  for (const f of files) chownSync(f, nobody, nobody);
  process.seteuid?.(nobody);
  try {
    return fn();
  } finally {
    process.seteuid?.(0);
  }
}

function canMountTmpfs(): boolean {
  return process.platform === "linux" && process.getuid?.() === 0;
}

describe("migrating an older store", () => {
  /** A store as a release with `version` schema versions left it, holding one deployment. */
  function olderStore(version: number, extraSql = ""): void {
    const db = new Database(file);
    for (const sql of MIGRATIONS.slice(0, version)) db.exec(sql);
    db.pragma(`user_version = ${version}`);
    db.prepare(
      "INSERT INTO deployments (name, spec_json, revision, created_at_ms, updated_at_ms) VALUES ('chat', '{\"name\":\"chat\"}', 3, 1, 2)",
    ).run();
    if (extraSql) db.exec(extraSql);
    db.close();
  }
  const NOW = new Date("2026-12-02T10:11:12.345Z");
  const backupName = (v: number) => `${file}.schema-${v}-20261202T101112Z.bak`;
  const backups = () => readdirSync(dir).filter((f) => f.endsWith(".bak"));

  it("copies the file at its old schema before the first migration, then never again", () => {
    const from = MIGRATIONS.length - 2;
    olderStore(from);
    const told: [string, number, number][] = [];
    const store = openSqliteStore({ file, now: () => NOW, onBackup: (...a) => told.push(a) });
    open.push(store);
    expect(told).toEqual([[backupName(from), from, MIGRATIONS.length]]);
    expect(store.listDeployments().map((d) => d.name)).toEqual(["chat"]);
    expect(statSync(backupName(from)).mode & 0o777).toBe(0o600);
    const copy = new Database(backupName(from), { readonly: true });
    expect(copy.pragma("user_version", { simple: true })).toBe(from);
    expect(copy.prepare("SELECT name, revision FROM deployments").all()).toEqual([
      { name: "chat", revision: 3 },
    ]);
    copy.close();
    store.close();
    open.pop();
    // At the latest schema: nothing to migrate, nothing copied.
    const again = openSqliteStore({ file, onBackup: () => told.push(["again", 0, 0]) });
    open.push(again);
    expect(told).toHaveLength(1);
    expect(backups()).toEqual([backupName(from).split("/").pop()]);
  });

  it("copies nothing for a new store", () => {
    openStore().close();
    open.pop();
    expect(backups()).toEqual([]);
  });

  it.skipIf(!canMountTmpfs())(
    `stops with the store untouched when the disk is too full for the copy${canMountTmpfs() ? "" : " (skipped: mounting a tmpfs needs root)"}`,
    () => {
      // A real full disk: a 1 MiB tmpfs holding the store and a file that takes the rest.
      const disk = join(dir, "disk");
      mkdirSync(disk);
      execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", disk]);
      try {
        file = join(disk, "state.db");
        olderStore(1);
        const filler = openSync(join(disk, "filler"), "w");
        try {
          const chunk = Buffer.alloc(4096);
          for (;;) writeSync(filler, chunk);
        } catch (error) {
          expect((error as NodeJS.ErrnoException).code).toBe("ENOSPC");
        } finally {
          closeSync(filler);
        }
        const before = readFileSync(file);
        expect(() => openSqliteStore({ file, now: () => NOW })).toThrow(
          expect.objectContaining({
            code: "LLMGW_CONTROL_PLANE_STORE_FAILED",
            message: expect.stringMatching(
              new RegExp(
                `^cannot back up the state store ${file} to ${file}\\.schema-1-20261202T101112Z\\.bak before migrating it from schema 1 to ${MIGRATIONS.length}: .*full.*; nothing was migrated`,
              ),
            ),
          }),
        );
        expect(readFileSync(file).equals(before)).toBe(true);
        expect(readdirSync(disk).sort()).toEqual(["filler", "state.db"]);
      } finally {
        execFileSync("umount", [disk]);
      }
    },
  );

  it("stops with the store untouched when the directory cannot take the copy", () => {
    olderStore(1);
    const before = readFileSync(file);
    const thrown = withoutWriteAccess(dir, [file], () => {
      try {
        openSqliteStore({ file, now: () => NOW });
      } catch (error) {
        return error;
      }
      return undefined;
    });
    expect(thrown).toMatchObject({
      code: "LLMGW_CONTROL_PLANE_STORE_FAILED",
      message: expect.stringMatching(
        new RegExp(
          `^cannot back up the state store ${file} to ${file}\\.schema-1-20261202T101112Z\\.bak before migrating it from schema 1 to ${MIGRATIONS.length}: EACCES: permission denied.*; nothing was migrated`,
        ),
      ),
    });
    expect(readFileSync(file).equals(before)).toBe(true);
    expect(readdirSync(dir)).toEqual(["state.db"]);
  });

  it("leaves the previous schema and data intact when a migration fails halfway", () => {
    // Migration 7 (tenancy) adds tables and three columns in one transaction; a table named
    // as its last one already there makes it fail after the rest of it ran.
    const from = 6;
    olderStore(from, "CREATE TABLE usage_batches (x INTEGER);");
    expect(() => openSqliteStore({ file, now: () => NOW })).toThrow(
      expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_STORE_FAILED" }),
    );
    const db = new Database(file, { readonly: true });
    expect(db.pragma("user_version", { simple: true })).toBe(from);
    const columns = (db.prepare("PRAGMA table_info(api_keys)").all() as { name: string }[]).map(
      (c) => c.name,
    );
    expect(columns).not.toContain("tenant");
    expect(columns).not.toContain("budgets_json");
    expect(
      db.prepare("SELECT name FROM sqlite_master WHERE name IN ('tenants', 'usage_rollups')").all(),
    ).toEqual([]);
    expect(db.prepare("SELECT name FROM deployments").all()).toEqual([{ name: "chat" }]);
    db.close();
    // The copy was made before the failed attempt, at the old schema.
    expect(backups()).toEqual([backupName(from).split("/").pop()]);
  });
});
