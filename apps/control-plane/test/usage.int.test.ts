/**
 * Usage on a real control plane, over SQLite and PostgreSQL: a router's batch sent, the
 * control plane restarted, the same batch sent again, counts once — in `GetUsage`, in budget
 * standings and in `/metrics`.
 */
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  ReportUsageRequestSchema,
  RouterService,
  UsageDimension,
  UsageRecordSchema,
} from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
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

function start(dataDir: string, store: string): Promise<ControlPlane> {
  return startControlPlane({
    dataDir,
    store,
    controlListen: "127.0.0.1:0",
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
