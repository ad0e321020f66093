/**
 * Usage on a real control plane, over SQLite and PostgreSQL: a router's batch sent, the
 * control plane restarted, the same batch sent again, counts once — in `GetUsage`, in budget
 * standings and in `/metrics`. And a real router's reporter against it: a batch the control
 * plane refuses for good is set aside, one sent while it is down is kept and sent again.
 */
import { mkdir, readdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  ReportUsageRequestSchema,
  RouterService,
  UsageDimension,
  UsageRecordSchema,
} from "@llmgw/proto";
import type { UsageEntry } from "@llmgw/router";
import { type RunningRouter, startRouter } from "@llmgw/router-server";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { type ControlPlane, startControlPlane } from "../src/run.js";
import {
  postgresUnavailable,
  startTestPostgres,
  type TestPostgres,
} from "../src/testing/postgres.js";
import { adminClient, eventually, tempDir } from "./helpers.js";

const pgSkip = postgresUnavailable();
let server: TestPostgres | undefined;
beforeAll(async () => {
  if (!pgSkip) server = await startTestPostgres();
}, 60_000);
afterAll(() => server?.destroy());

function start(
  dataDir: string,
  store: string,
  controlListen = "127.0.0.1:0",
): Promise<ControlPlane> {
  return startControlPlane({
    dataDir,
    store,
    controlListen,
    publicApi: false,
    heartbeatIntervalMs: 200,
    nodeLostAfterMs: 60_000,
    leaseTtlMs: 3_000,
    shutdownGraceMs: 1_000,
  });
}

/** Waits until `cp` leads (at once over SQLite). */
async function leading(cp: ControlPlane): Promise<ControlPlane> {
  await eventually(() => (cp.leading ? true : undefined), 15_000);
  return cp;
}

function routerClient(cp: ControlPlane) {
  return createClient(
    RouterService,
    createConnectTransport({
      httpVersion: "1.1",
      baseUrl: cp.controlUrl,
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", `Bearer ${cp.routerToken}`);
          return next(req);
        },
      ],
    }),
  );
}

const minute = Math.floor(Date.now() / 60_000) * 60_000 - 60_000;
const batch = create(ReportUsageRequestSchema, {
  routerId: "edge-1",
  batchId: "edge-1-42",
  records: [
    create(UsageRecordSchema, {
      minuteUnixMs: BigInt(minute),
      keyId: "k-test",
      tenant: "",
      model: "chat",
      requests: 3n,
      promptTokens: 300n,
      cachedTokens: 100n,
      completionTokens: 60n,
      gpuMilliseconds: 4_000n,
    }),
  ],
});

describe.each([
  ["SQLite", "sqlite:", undefined],
  ["PostgreSQL", "postgres", pgSkip],
] as const)("usage on a control plane over %s", (_, kind, skip) => {
  it.skipIf(skip)(
    "counts a batch once across a control-plane restart between two sends",
    async () => {
      const data = tempDir("llmgw-usage-int-");
      const store =
        kind === "sqlite:" ? "sqlite:" : await (server as TestPostgres).createDatabase();
      let cp = await leading(await start(data.dir, store));
      try {
        const { key } = await adminClient(cp, cp.adminToken).createApiKey({
          name: "ci",
          budgets: [{ period: 1, model: "", tokens: 1_000n }],
        });
        const records = batch.records.map((r) => ({ ...r, keyId: key?.id ?? "" }));
        const first = await routerClient(cp).reportUsage({ ...batch, records });
        expect(first.duplicate).toBe(false);
        expect(first.standings.map((s) => [s.keyId, s.usedTokens])).toEqual([[key?.id, 360n]]);
        const scrape = await (await fetch(`${cp.controlUrl}/metrics`)).text();
        expect(scrape).toContain(
          'llmgw_usage_tokens_total{tenant="(none)",model="chat",type="prompt"} 300',
        );
        expect(scrape).toContain('llmgw_usage_gpu_seconds_total{tenant="(none)",model="chat"} 4');

        await cp.close();
        cp = await leading(await start(data.dir, store));
        const again = await routerClient(cp).reportUsage({ ...batch, records });
        expect(again.duplicate).toBe(true);
        expect(again.standings.map((s) => [s.keyId, s.usedTokens])).toEqual([[key?.id, 360n]]);
        const { rows } = await adminClient(cp, cp.adminToken).getUsage({
          sinceUnixMs: BigInt(minute - 86_400_000),
          groupBy: [UsageDimension.KEY],
        });
        expect(rows.map((r) => [r.keyName, r.requests, r.promptTokens, r.gpuSeconds])).toEqual([
          ["ci", 3n, 300n, 4],
        ]);
        // Counted by the instance that stored it: the restarted one has nothing to add.
        const after = await (await fetch(`${cp.controlUrl}/metrics`)).text();
        expect(after).toContain("# TYPE llmgw_usage_requests_total counter");
        expect(after).not.toMatch(/^llmgw_usage_requests_total\{/m);
      } finally {
        await cp.close();
        data.cleanup();
      }
    },
    60_000,
  );
});

describe("a real router's usage reports to a real control plane (SQLite)", () => {
  const cleanups: (() => unknown)[] = [];
  afterEach(async () => {
    for (const fn of cleanups.splice(0).reverse()) await fn();
  });

  /** A control plane over SQLite in a temp dir, with one API key; closed after the test. */
  async function controlPlaneWithKey() {
    const data = tempDir("llmgw-usage-router-cp-");
    cleanups.push(data.cleanup);
    const cp = await leading(await start(data.dir, "sqlite:"));
    const { key } = await adminClient(cp, cp.adminToken).createApiKey({ name: "ci" });
    return { data, cp, keyId: key?.id ?? "" };
  }

  /**
   * A router state dir holding `batches` in `usage/`, as `startUsageReporter` writes them
   * (`<batchId>.json`: `{ batchId, records }`, the dir 0700, the files 0600).
   */
  async function stateDirWith(batches: Record<string, readonly UsageEntry[]>): Promise<string> {
    const state = tempDir("llmgw-usage-router-state-");
    cleanups.push(state.cleanup);
    const usage = path.join(state.dir, "usage");
    await mkdir(usage, { mode: 0o700 });
    for (const [batchId, records] of Object.entries(batches)) {
      await writeFile(path.join(usage, `${batchId}.json`), JSON.stringify({ batchId, records }), {
        mode: 0o600,
      });
    }
    return usage;
  }

  /** A router of id `edge-1` dialing `controlUrl`, reporting every 50 ms; its log kept. */
  async function router(controlUrl: string, routerToken: string, usageDir: string) {
    const events: Readonly<Record<string, unknown>>[] = [];
    const running: RunningRouter = await startRouter({
      routing: {
        controlPlanes: [controlUrl],
        routerToken,
        routerId: "edge-1",
        stateDir: path.dirname(usageDir),
        client: { initialBackoffMs: 50, maxBackoffMs: 200 },
      },
      usageReportIntervalMs: 50,
      log: (event) => events.push(event),
    });
    cleanups.push(() => running.close(0));
    const logged = (event: string) => events.filter((e) => e.event === event);
    return { running, logged };
  }

  /** One record of `keyId` in `minuteMs`: 2 requests, 200 + 20 tokens. */
  const entry = (keyId: string, minuteMs: number): UsageEntry => ({
    minuteMs,
    keyId,
    tenant: "",
    model: "chat",
    requests: 2,
    promptTokens: 200,
    cachedTokens: 0,
    cachedReported: 2,
    completionTokens: 20,
    gpuMs: 1_000,
    estimatedRequests: 0,
    refusedUsage: 0,
  });

  /** `GetUsage` by key since a day before `minute`: [key name, requests, prompt tokens]. */
  async function usageByKey(cp: ControlPlane) {
    const { rows } = await adminClient(cp, cp.adminToken).getUsage({
      sinceUnixMs: BigInt(minute - 86_400_000),
      groupBy: [UsageDimension.KEY],
    });
    return rows.map((r) => [r.keyName, r.requests, r.promptTokens]);
  }

  it("sets aside a batch the control plane refuses (a misaligned minute) and sends the one behind it", async () => {
    const { cp, keyId } = await controlPlaneWithKey();
    // Well-formed for the router (every count a safe integer ≥ 0), refused by the control
    // plane: the minute does not start a minute. Sorted first, so it is sent first.
    const usage = await stateDirWith({
      "a-misaligned": [entry(keyId, minute + 1_000)],
      "b-good": [entry(keyId, minute)],
    });
    const { logged } = await router(cp.controlUrl, cp.routerToken, usage);

    await eventually(async () =>
      (await readdir(usage)).join() === "a-misaligned.json.refused" ? true : undefined,
    );
    expect(logged("usage_batch_refused")).toEqual([
      {
        event: "usage_batch_refused",
        batchId: "a-misaligned",
        records: 1,
        message: `[invalid_argument] ReportUsageRequest.records[0].minute_unix_ms must be the start of a minute (got ${minute + 1_000}); set aside, not sent again`,
      },
    ]);
    // Refused for good, never taken for an outage.
    expect(logged("usage_report_failed")).toEqual([]);
    expect(await usageByKey(cp)).toEqual([["ci", 2n, 200n]]);
  }, 30_000);

  it("keeps a batch while the control plane is down and sends it once it is back", async () => {
    const first = await controlPlaneWithKey();
    const { controlUrl, routerToken } = first.cp;
    await first.cp.close();
    const usage = await stateDirWith({ "a-good": [entry(first.keyId, minute)] });
    const { running, logged } = await router(controlUrl, routerToken, usage);

    await eventually(() => (logged("usage_report_failed").length > 0 ? true : undefined));
    expect(logged("usage_report_failed")[0]).toMatchObject({
      code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
      pending: 1,
    });
    expect(await readdir(usage)).toEqual(["a-good.json"]);

    // The same data dir on the same address: the same router token, the router dials it again.
    const cp = await leading(await start(first.data.dir, "sqlite:", new URL(controlUrl).host));
    cleanups.push(() => cp.close());
    expect(cp.routerToken).toBe(routerToken);
    await eventually(async () => ((await readdir(usage)).length === 0 ? true : undefined));
    expect(logged("usage_batch_refused")).toEqual([]);
    expect(running.runtime.readiness().connected).toBe(true);
    expect(await usageByKey(cp)).toEqual([["ci", 2n, 200n]]);
  }, 30_000);
});
