import {
  chmodSync,
  closeSync,
  ftruncateSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { KeyGrant, RoutingSnapshot } from "@llmgw/router";
import { afterAll, describe, expect, it } from "vitest";
import {
  CORRUPT_ROUTING_STATE_FILE,
  formatRoutingStateFile,
  MAX_ROUTING_STATE_BYTES,
  moveAsideRoutingStateFile,
  parseRoutingStateFile,
  prepareStateDir,
  ROUTING_STATE_FILE,
  ROUTING_STATE_FORMAT,
  readRoutingStateFile,
  resolveRouterId,
  writeRoutingStateFile,
} from "./state-file.js";

const SNAPSHOT: RoutingSnapshot = {
  kind: "snapshot",
  epoch: "e1",
  version: 7,
  models: [{ name: "llama", deployment: "llama-d", policy: "llmgw", loading: false }],
  replicas: [
    {
      id: "llama-d-0",
      model: "llama",
      deployment: "llama-d",
      baseUrl: "http://10.0.0.5:8000",
      state: "ready",
      capacity: 16,
      apiKey: "llmgw-engine-secret",
      load: { running: 2, waiting: 0, kvCacheUsage: 0.25 },
      loadReportedAtMs: 1_700_000_000_000,
    },
    {
      id: "llama-d-1",
      model: "llama",
      deployment: "llama-d",
      baseUrl: "http://10.0.0.6:8000",
      state: "draining",
      capacity: 16,
    },
  ],
  keys: [
    {
      id: "k1",
      name: "team-a",
      secretSha256: "a".repeat(64),
      models: ["llama"],
      rpm: 600,
    },
  ],
  routers: 2,
  sentAtMs: 1_700_000_000_500,
};

const SAVED = {
  savedAtMs: 1_700_000_001_000,
  lastHeardAtMs: 1_700_000_000_900,
  snapshot: SNAPSHOT,
};

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
const tempDir = () => {
  const d = mkdtempSync(join(tmpdir(), "llmgw-router-state-"));
  dirs.push(d);
  return d;
};

describe("the routing state file", () => {
  it("round-trips a snapshot, keys and load included", async () => {
    const dir = tempDir();
    await writeRoutingStateFile(dir, SAVED);
    expect(await readRoutingStateFile(dir)).toEqual(SAVED);
  });

  it("round-trips tenants and the keys' tenant, budgets and class", async () => {
    const dir = tempDir();
    const saved = {
      ...SAVED,
      snapshot: {
        ...SNAPSHOT,
        keys: [
          {
            ...(SNAPSHOT.keys[0] as KeyGrant),
            tenant: "search-team",
            budgets: [{ period: "month" as const, model: "llama", tokens: 5_000_000 }],
            priority: "critical" as const,
          },
        ],
        tenants: [
          {
            name: "search-team",
            tpm: 90_000,
            maxConcurrency: 40,
            budgets: [{ period: "day" as const, tokens: 1_000_000 }],
            priority: "batch" as const,
            weight: 3,
            createdAtMs: 1_700_000_000_000,
          },
        ],
      },
    };
    await writeRoutingStateFile(dir, saved);
    expect(await readRoutingStateFile(dir)).toEqual(saved);
  });

  it("reads a file a newer release wrote, skipping the fields it does not know (a rollback)", async () => {
    const dir = tempDir();
    const json = JSON.parse(formatRoutingStateFile(SAVED));
    json.snapshot.someFutureField = { nested: [1, 2] };
    json.snapshot.replicas[0].anotherFutureField = "x";
    // Whatever an unknown name holds (even an engine key), it is skipped, never quoted back.
    json.snapshot["llmgw-engine-secret"] = 1;
    writeFileSync(join(dir, ROUTING_STATE_FILE), JSON.stringify(json));
    expect(await readRoutingStateFile(dir)).toEqual(SAVED);
  });

  it("is 0600 in a 0700 dir, and leaves no temp file behind", async () => {
    const dir = join(tempDir(), "state");
    await prepareStateDir(dir, process.getuid?.());
    await writeRoutingStateFile(dir, SAVED);
    await writeRoutingStateFile(dir, { ...SAVED, savedAtMs: SAVED.savedAtMs + 1 });
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(join(dir, ROUTING_STATE_FILE)).mode & 0o777).toBe(0o600);
    expect(readdirSync(dir)).toEqual([ROUTING_STATE_FILE]);
  });

  it("holds the snapshot in protobuf JSON inside a versioned envelope", () => {
    const json = JSON.parse(formatRoutingStateFile(SAVED));
    expect(json).toMatchObject({
      format: ROUTING_STATE_FORMAT,
      savedAtMs: SAVED.savedAtMs,
      lastHeardAtMs: SAVED.lastHeardAtMs,
      snapshot: { epoch: "e1", version: "7", routers: 2 },
    });
    expect(json.snapshot.replicas[1].state).toBe("ROUTED_REPLICA_STATE_DRAINING");
  });

  it("is absent before the first save", async () => {
    expect(await readRoutingStateFile(tempDir())).toBeUndefined();
  });

  const good = JSON.parse(formatRoutingStateFile(SAVED)) as Record<string, unknown>;
  it.each<[string, string, string | RegExp]>([
    ["empty", "", ": it is not JSON (it ends before the JSON does)"],
    [
      "truncated",
      formatRoutingStateFile(SAVED).slice(0, 200),
      ": it is not JSON (a syntax error at position 200)",
    ],
    ["not an object", "[1,2]", ": it is not a JSON object"],
    [
      "another format",
      JSON.stringify({ ...good, format: "llmgw.routing-state.v9" }),
      ': its format is "llmgw.routing-state.v9", not "llmgw.routing-state.v1"',
    ],
    [
      "no format",
      JSON.stringify({ ...good, format: undefined }),
      ': its format is undefined, not "llmgw.routing-state.v1"',
    ],
    [
      "a negative time",
      JSON.stringify({ ...good, lastHeardAtMs: -1 }),
      ": lastHeardAtMs is not a time in epoch ms",
    ],
    [
      "a time that is a string",
      JSON.stringify({ ...good, savedAtMs: "yesterday" }),
      ": savedAtMs is not a time in epoch ms",
    ],
    [
      "a snapshot with an unknown field type",
      JSON.stringify({ ...good, snapshot: { version: "seven" } }),
      ": its snapshot is invalid: cannot decode field llmgw.v1.RoutingSnapshot.version from protobuf JSON",
    ],
    [
      "a replica without a URL",
      JSON.stringify({
        ...good,
        snapshot: {
          ...(good.snapshot as object),
          replicas: [{ id: "r", model: "llama", deployment: "llama-d", capacity: 1, state: 1 }],
        },
      }),
      ": its snapshot is invalid: replicas[0].baseUrl must be a string of 1..2048 characters",
    ],
  ])("refuses %s with LLMGW_ROUTER_STATE_CORRUPT naming the file", (_name, text, message) => {
    let error: unknown;
    try {
      parseRoutingStateFile(text, "/state/routing-state.json");
    } catch (e) {
      error = e;
    }
    expect(error).toMatchObject({ code: "LLMGW_ROUTER_STATE_CORRUPT" });
    expect((error as Error).message.startsWith("/state/routing-state.json: ")).toBe(true);
    if (typeof message === "string") expect((error as Error).message).toContain(message);
    else expect((error as Error).message).toMatch(message);
  });

  // The file holds engine keys: what is wrong is said by position or field, never quoted.
  const SECRET = "llmgw-engine-secret";
  const text = formatRoutingStateFile(SAVED);
  const withReplica = (patch: Record<string, unknown>) => {
    const snapshot = good.snapshot as { replicas: Record<string, unknown>[] };
    return JSON.stringify({
      ...good,
      snapshot: { ...snapshot, replicas: [{ ...snapshot.replicas[0], ...patch }] },
    });
  };
  it.each<[string, string, string]>([
    [
      "an unquoted engine key (V8 would quote the text around it)",
      text.replace(JSON.stringify(SECRET), SECRET),
      ": it is not JSON (an unexpected token)",
    ],
    [
      "an engine key where a number belongs (protobuf-es would quote it)",
      withReplica({ capacity: SECRET }),
      ": its snapshot is invalid: cannot decode field llmgw.v1.RoutedReplica.capacity from protobuf JSON",
    ],
    [
      "an engine key in a URL (the stream's checks would echo it)",
      withReplica({ baseUrl: `ftp://${SECRET}@10.0.0.5` }),
      ": its snapshot is invalid: replicas[0].baseUrl must be an http(s) URL",
    ],
    [
      "an engine key as the id of two replicas",
      (() => {
        const snapshot = good.snapshot as { replicas: Record<string, unknown>[] };
        const r = { ...snapshot.replicas[0], id: SECRET };
        return JSON.stringify({ ...good, snapshot: { ...snapshot, replicas: [r, r] } });
      })(),
      ": its snapshot is invalid: replicas[1].id repeats an earlier entry",
    ],
    [
      "an engine key as the format",
      JSON.stringify({ ...good, format: SECRET }),
      ': its format is not an llmgw format name (expected "llmgw.routing-state.v1")',
    ],
  ])("refuses %s without quoting it, and carries no cause", (_name, bad, message) => {
    expect(bad).toContain(SECRET);
    let error: unknown;
    try {
      parseRoutingStateFile(bad, "/state/routing-state.json");
    } catch (e) {
      error = e;
    }
    expect(error).toMatchObject({
      code: "LLMGW_ROUTER_STATE_CORRUPT",
      message: `/state/routing-state.json${message}`,
    });
    // The cause would carry the parser's message, value and all.
    expect((error as Error).cause).toBeUndefined();
    expect((error as Error).message).not.toContain("engine-secret");
  });

  it("reports a file it cannot open as LLMGW_ROUTER_STATE_FAILED, not corrupt", async () => {
    const dir = tempDir();
    // A symlink to itself: open fails (ELOOP) the way EACCES or EMFILE would, even as root.
    symlinkSync(ROUTING_STATE_FILE, join(dir, ROUTING_STATE_FILE));
    await expect(readRoutingStateFile(dir)).rejects.toMatchObject({
      code: "LLMGW_ROUTER_STATE_FAILED",
      message: `cannot open ${join(dir, ROUTING_STATE_FILE)}: ELOOP`,
    });
  });

  it("refuses a file over the size limit without reading it whole", async () => {
    const dir = tempDir();
    // Sparse: the size is what matters.
    const fd = openSync(join(dir, ROUTING_STATE_FILE), "w");
    ftruncateSync(fd, MAX_ROUTING_STATE_BYTES + 1);
    closeSync(fd);
    await expect(readRoutingStateFile(dir)).rejects.toMatchObject({
      code: "LLMGW_ROUTER_STATE_CORRUPT",
      message: expect.stringContaining(
        `it is ${MAX_ROUTING_STATE_BYTES + 1} bytes, over the ${MAX_ROUTING_STATE_BYTES} limit`,
      ),
    });
  });

  it("refuses a directory in place of the file", async () => {
    const dir = tempDir();
    mkdirSync(join(dir, ROUTING_STATE_FILE));
    await expect(readRoutingStateFile(dir)).rejects.toMatchObject({
      code: "LLMGW_ROUTER_STATE_CORRUPT",
    });
  });

  it("moves a corrupt file aside, replacing an older one", async () => {
    const dir = tempDir();
    writeFileSync(join(dir, CORRUPT_ROUTING_STATE_FILE), "older");
    writeFileSync(join(dir, ROUTING_STATE_FILE), "{garbage");
    expect(await moveAsideRoutingStateFile(dir)).toBe(join(dir, CORRUPT_ROUTING_STATE_FILE));
    expect(readdirSync(dir)).toEqual([CORRUPT_ROUTING_STATE_FILE]);
    expect(readFileSync(join(dir, CORRUPT_ROUTING_STATE_FILE), "utf8")).toBe("{garbage");
  });
});

describe("the state dir", () => {
  it("is created 0700 and tightened when it exists wider", async () => {
    const dir = join(tempDir(), "a", "b");
    await prepareStateDir(dir, undefined);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    chmodSync(dir, 0o755);
    await prepareStateDir(dir, undefined);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
  });

  it("refuses a symlink and a dir owned by someone else", async () => {
    const base = tempDir();
    mkdirSync(join(base, "real"));
    symlinkSync(join(base, "real"), join(base, "link"));
    await expect(prepareStateDir(join(base, "link"), undefined)).rejects.toMatchObject({
      code: "LLMGW_ROUTER_STATE_FAILED",
      message: `state dir ${join(base, "link")} is a symbolic link; refusing to use it`,
    });
    const uid = statSync(base).uid;
    await expect(prepareStateDir(join(base, "real"), uid + 1)).rejects.toMatchObject({
      code: "LLMGW_ROUTER_STATE_FAILED",
      message: `state dir ${join(base, "real")} is owned by uid ${uid}, not the router's uid ${uid + 1}; refusing to use it`,
    });
  });
});

describe("the router id", () => {
  it("is made once and kept, 0600", async () => {
    const dir = tempDir();
    const id = await resolveRouterId(dir, undefined);
    expect(id).toMatch(/^router-[0-9a-f]{12}$/);
    expect(await resolveRouterId(dir, undefined)).toBe(id);
    expect(statSync(join(dir, "router-id")).mode & 0o777).toBe(0o600);
  });

  it("yields to --router-id, and a malformed file gets a new id", async () => {
    const dir = tempDir();
    expect(await resolveRouterId(dir, "edge-1")).toBe("edge-1");
    writeFileSync(join(dir, "router-id"), "not an id!\n");
    const id = await resolveRouterId(dir, undefined);
    expect(id).toMatch(/^router-[0-9a-f]{12}$/);
    expect(readFileSync(join(dir, "router-id"), "utf8")).toBe(`${id}\n`);
  });
});
