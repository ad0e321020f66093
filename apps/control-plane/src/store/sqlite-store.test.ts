import { mkdtempSync, readFileSync, rmSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { isControlPlaneError } from "../errors.js";
import { fillDisk } from "../testing/full-disk.js";
import { MIGRATIONS } from "./migrations.js";
import { openSqliteStore } from "./sqlite-store.js";
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
