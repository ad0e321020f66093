import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import {
  BudgetPeriod,
  ClusterService,
  GetUsageRequestSchema,
  ReportUsageRequestSchema,
  RouterService,
  UsageDimension,
  UsageGranularity,
  type UsageRecord,
  UsageRecordSchema,
} from "@llmgw/proto";
import { schedule } from "@llmgw/scheduler";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Cluster } from "../domain/cluster.js";
import { ClusterUsage } from "../domain/usage.js";
import { isControlPlaneError } from "../errors.js";
import { createRoutingPublisher, type RoutingPublisher } from "../routing/publisher.js";
import { createRouterRegistry } from "../routing/router-registry.js";
import { openSqliteStore, type SqliteStore } from "../store/sqlite-store.js";
import { createManualClock, type ManualClock } from "../testing/manual-clock.js";
import { createClusterService } from "./cluster-service.js";
import { errorMappingInterceptor } from "./errors.js";
import { createRouterService } from "./router-service.js";
import { validateGetUsageRequest, validateReportUsageRequest } from "./usage-requests.js";

const ROUTER_TOKEN = "llmgw-router-test";
const ADMIN_TOKEN = "llmgw-admin-test";
const HOUR = 3_600_000;
const DAY = 86_400_000;
/** 2026-12-03T00:00:00Z */
const D3 = Date.UTC(2026, 11, 3);
const NOW = D3 + 11 * HOUR;

function usageRecord(over: Partial<UsageRecord> = {}): UsageRecord {
  return create(UsageRecordSchema, {
    minuteUnixMs: BigInt(D3 + 10 * HOUR),
    keyId: "k1",
    tenant: "search",
    model: "chat",
    requests: 2n,
    promptTokens: 100n,
    cachedTokens: 40n,
    cachedReportedRequests: 1n,
    completionTokens: 20n,
    gpuMilliseconds: 1_500n,
    estimatedRequests: 1n,
    refusedUsage: 0n,
    ...over,
  });
}

const request = (records: UsageRecord[], over: { routerId?: string; batchId?: string } = {}) =>
  create(ReportUsageRequestSchema, {
    routerId: over.routerId ?? "r1",
    batchId: over.batchId ?? "r1-1",
    records,
  });

const MAX = 9_007_199_254_740_991n;

/** The error a call was refused with (a call that succeeds fails the test). */
const refused = (call: Promise<unknown>): Promise<ConnectError> =>
  call.then(
    () => {
      throw new Error("the call was expected to be refused");
    },
    (e: unknown) => ConnectError.from(e),
  );

describe("validateReportUsageRequest", () => {
  it("turns a valid batch into plain records", () => {
    expect(validateReportUsageRequest(request([usageRecord()]), NOW)).toEqual({
      routerId: "r1",
      batchId: "r1-1",
      records: [
        {
          minuteMs: D3 + 10 * HOUR,
          keyId: "k1",
          tenant: "search",
          model: "chat",
          requests: 2,
          promptTokens: 100,
          cachedTokens: 40,
          cachedReported: 1,
          completionTokens: 20,
          gpuMs: 1_500,
          estimatedRequests: 1,
          refusedUsage: 0,
        },
      ],
    });
  });

  it("reads cached tokens without reported requests as a router from before the count", () => {
    // Unset: then every exact answer counted its cached tokens (absent as 0), an estimate none.
    const legacy = usageRecord({ requests: 5n, estimatedRequests: 2n });
    legacy.cachedReportedRequests = undefined;
    const none = usageRecord({ cachedTokens: 0n, cachedReportedRequests: 0n });
    const [old, unknown] = validateReportUsageRequest(request([legacy, none]), NOW).records;
    expect(old).toMatchObject({ requests: 5, cachedTokens: 40, cachedReported: 3 });
    expect(unknown).toMatchObject({ cachedTokens: 0, cachedReported: 0 });
  });

  it.each<[string, Parameters<typeof request>, string]>([
    [
      "a bad router id",
      [[], { routerId: "-r" }],
      "ReportUsageRequest.router_id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got \"-r\")",
    ],
    [
      "an empty batch id",
      [[], { batchId: "" }],
      'ReportUsageRequest.batch_id must be 1–128 printable characters without spaces (got "")',
    ],
    [
      "a batch id with a space",
      [[], { batchId: "a b" }],
      'ReportUsageRequest.batch_id must be 1–128 printable characters without spaces (got "a b")',
    ],
    [
      "a batch id of 129 characters",
      [[], { batchId: "x".repeat(129) }],
      `ReportUsageRequest.batch_id must be 1–128 printable characters without spaces (got "${"x".repeat(80)}…")`,
    ],
    [
      "a minute that is not whole",
      [[usageRecord({ minuteUnixMs: BigInt(D3 + 1_000) })]],
      `ReportUsageRequest.records[0].minute_unix_ms must be the start of a minute (got ${D3 + 1_000})`,
    ],
    [
      "a minute older than 7 days",
      [[usageRecord({ minuteUnixMs: BigInt(NOW - 7 * DAY - 60_000) })]],
      "ReportUsageRequest.records[0].minute_unix_ms 2026-11-26T10:59:00.000Z is outside the last 7 days or more than 5 minutes ahead of the control plane's clock (2026-12-03T11:00:00.000Z); older usage cannot be counted once for sure",
    ],
    [
      "a minute 6 minutes ahead",
      [[usageRecord({ minuteUnixMs: BigInt(NOW + 6 * 60_000) })]],
      "ReportUsageRequest.records[0].minute_unix_ms 2026-12-03T11:06:00.000Z is outside the last 7 days or more than 5 minutes ahead of the control plane's clock (2026-12-03T11:00:00.000Z); older usage cannot be counted once for sure",
    ],
    [
      "an empty key id",
      [[usageRecord(), usageRecord({ keyId: "" })]],
      'ReportUsageRequest.records[1].key_id must be 1–256 characters (got "")',
    ],
    [
      "a model of 257 characters",
      [[usageRecord({ model: "m".repeat(257) })]],
      `ReportUsageRequest.records[0].model must be 1–256 characters (got "${"m".repeat(80)}…")`,
    ],
    [
      "a tenant that is not a tenant name",
      [[usageRecord({ tenant: "Search" })]],
      "ReportUsageRequest.records[0].tenant must be a tenant name (1–63 lower-case letters, digits or '-') or empty (got \"Search\")",
    ],
    [
      "a count past 2^53-1",
      [[usageRecord({ requests: MAX + 1n })]],
      "ReportUsageRequest.records[0].requests must be at most 9007199254740991 (got 9007199254740992)",
    ],
    [
      "more cached than prompt tokens",
      [[usageRecord({ cachedTokens: 101n })]],
      "ReportUsageRequest.records[0].cached_tokens (101) is more than prompt_tokens (100)",
    ],
    [
      "more estimated requests than requests",
      [[usageRecord({ estimatedRequests: 3n })]],
      "ReportUsageRequest.records[0].estimated_requests (3) is more than requests (2)",
    ],
    [
      "more refused answers than requests",
      [[usageRecord({ refusedUsage: 3n })]],
      "ReportUsageRequest.records[0].refused_usage (3) is more than requests (2)",
    ],
    [
      "an estimate's cached tokens counted as reported",
      [[usageRecord({ cachedReportedRequests: 2n })]],
      "ReportUsageRequest.records[0].cached_reported_requests (2) is more than requests less estimated_requests (1): an estimate's cached tokens are unknown",
    ],
    [
      "cached tokens of no request that reported them",
      [[usageRecord({ cachedReportedRequests: 0n })]],
      "ReportUsageRequest.records[0].cached_tokens (40) with no request whose cached tokens were reported",
    ],
    [
      "cached tokens from a router before the count, of estimates only",
      [[usageRecord({ estimatedRequests: 2n, cachedReportedRequests: undefined })]],
      "ReportUsageRequest.records[0].cached_tokens (40) with no request whose cached tokens were reported",
    ],
    [
      "tokens without requests",
      [
        [
          usageRecord({
            requests: 0n,
            estimatedRequests: 0n,
            cachedTokens: 0n,
            cachedReportedRequests: 0n,
          }),
        ],
      ],
      "ReportUsageRequest.records[0]: 120 prompt + completion tokens for 0 requests is more than 16777216 per request",
    ],
    [
      "an absurd token count per request",
      [[usageRecord({ requests: 1n, estimatedRequests: 0n, completionTokens: 2n ** 24n })]],
      "ReportUsageRequest.records[0]: 16777316 prompt + completion tokens for 1 requests is more than 16777216 per request",
    ],
    [
      "an absurd GPU time per request",
      [[usageRecord({ gpuMilliseconds: 2n * 2n ** 33n + 1n })]],
      "ReportUsageRequest.records[0].gpu_milliseconds (17179869185) for 2 requests is more than 8589934592 per request",
    ],
  ])("refuses %s, naming the field", (_, args, message) => {
    const error = (() => {
      try {
        validateReportUsageRequest(request(...args), NOW);
      } catch (e) {
        return e;
      }
    })();
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");
    expect((error as Error).message).toBe(message);
  });

  it("refuses more than 10,000 records", () => {
    const records = Array.from({ length: 10_001 }, () => usageRecord());
    expect(() => validateReportUsageRequest(request(records), NOW)).toThrow(
      "ReportUsageRequest.records holds 10001 records, more than 10000; send them in several batches",
    );
    expect(validateReportUsageRequest(request(records.slice(1)), NOW).records).toHaveLength(10_000);
  });
});

describe("validateGetUsageRequest", () => {
  it("defaults to day rows by tenant and model, until now, from whole buckets", () => {
    expect(
      validateGetUsageRequest(
        create(GetUsageRequestSchema, { sinceUnixMs: BigInt(D3 + 5 * HOUR) }),
        NOW,
      ),
    ).toEqual({
      bucket: "day",
      sinceMs: D3,
      untilMs: NOW,
      groupBy: { tenant: true, key: false, model: true },
    });
  });

  it.each<[string, MessageInitShape<typeof GetUsageRequestSchema>, string]>([
    [
      "until before since",
      { sinceUnixMs: 10n, untilUnixMs: 10n },
      "GetUsageRequest.until_unix_ms must be after since_unix_ms (10) and at most 8640000000000000 (got 10)",
    ],
    [
      "a negative since",
      { sinceUnixMs: -1n },
      "GetUsageRequest.since_unix_ms must be 0–8640000000000000 (got -1)",
    ],
    [
      "an unknown dimension",
      { groupBy: [9 as UsageDimension] },
      "GetUsageRequest.group_by holds 9, not a known dimension",
    ],
    [
      "an unknown granularity",
      { granularity: 7 as UsageGranularity },
      "GetUsageRequest.granularity 7 is not a known granularity",
    ],
    [
      "a filter of 257 characters",
      { model: "m".repeat(257) },
      "GetUsageRequest.model must be at most 256 characters (got 257)",
    ],
  ])("refuses %s", (_, init, message) => {
    expect(() => validateGetUsageRequest(create(GetUsageRequestSchema, init), NOW)).toThrow(
      message,
    );
  });
});

describe("ReportUsage and GetUsage over Connect", () => {
  let dir: string;
  let store: SqliteStore;
  let clock: ManualClock;
  let cluster: Cluster;
  let publisher: RoutingPublisher;
  let routerClient: ReturnType<typeof createClient<typeof RouterService>>;
  let adminClient: ReturnType<typeof createClient<typeof ClusterService>>;
  const shutdown = new AbortController();
  const router = { headers: { authorization: `Bearer ${ROUTER_TOKEN}` } };
  const admin = { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } };

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), "llmgw-usage-rpc-"));
    store = openSqliteStore({ file: join(dir, "state.db") });
    clock = createManualClock(NOW);
    cluster = new Cluster({
      store,
      schedule,
      clock,
      heartbeatIntervalMs: 1_000,
      unreachableAfterMs: 3_000,
      nodeLostAfterMs: 10_000,
      rendezvousPortMin: 29_500,
      rendezvousPortMax: 29_999,
    });
    const registry = createRouterRegistry({});
    publisher = createRoutingPublisher(cluster, { routers: registry });
    const usage = new ClusterUsage({
      store: store.usage,
      clock,
      budgets: () => [{ tenant: "search", period: "day", model: "", tokens: 1_000 }],
    });
    const transport = createRouterTransport(
      (r) => {
        r.service(
          RouterService,
          createRouterService(publisher, registry, ROUTER_TOKEN, {
            shutdown: shutdown.signal,
            onUsage: (batch) => usage.report(batch),
            now: () => clock.now(),
          }),
        );
        r.service(
          ClusterService,
          createClusterService(cluster, ADMIN_TOKEN, {
            version: "test",
            shutdown: shutdown.signal,
            usage,
          }),
        );
      },
      { router: { interceptors: [errorMappingInterceptor] } },
    );
    routerClient = createClient(RouterService, transport);
    adminClient = createClient(ClusterService, transport);
  });
  afterEach(() => {
    publisher.close();
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("stores a batch once and answers the budgets' standings", async () => {
    const batch = request([usageRecord(), usageRecord({ keyId: "k2", model: "code" })]);
    const first = await routerClient.reportUsage(batch, router);
    expect(first.duplicate).toBe(false);
    expect(first.asOfUnixMs).toBe(BigInt(NOW));
    expect(first.standings.map((s) => [s.tenant, s.period, s.model, s.usedTokens])).toEqual([
      ["search", BudgetPeriod.DAY, "", 240n],
    ]);
    expect(first.standings[0]?.periodStartUnixMs).toBe(BigInt(D3));
    const again = await routerClient.reportUsage(batch, router);
    expect(again.duplicate).toBe(true);
    expect(again.standings[0]?.usedTokens).toBe(240n);
  });

  it("refuses a bad batch whole (InvalidArgument) and stores nothing of it", async () => {
    const error = await refused(
      routerClient.reportUsage(
        request([usageRecord(), usageRecord({ cachedTokens: 101n })]),
        router,
      ),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe(
      "ReportUsageRequest.records[1].cached_tokens (101) is more than prompt_tokens (100)",
    );
    expect(await store.usage.exportAll()).toEqual({ rollups: [], batches: [] });
    // The reserved id of the control plane's own router, and a missing token.
    const reserved = await refused(
      routerClient.reportUsage(request([], { routerId: "in-process" }), router),
    );
    expect(reserved.code).toBe(Code.InvalidArgument);
    const anonymous = await refused(routerClient.reportUsage(request([usageRecord()])));
    expect(anonymous.code).toBe(Code.Unauthenticated);
    expect(await store.usage.exportAll()).toEqual({ rollups: [], batches: [] });
  });

  it("answers GetUsage by filters and groups, with key names, a key found by name", async () => {
    const { key } = cluster.apiKeys.create({ name: "ci", models: [] });
    await routerClient.reportUsage(
      request([
        usageRecord({ keyId: key.id }),
        usageRecord({ keyId: key.id, model: "code" }),
        usageRecord({ keyId: "k2", tenant: "" }),
      ]),
      router,
    );
    const rows = async (init: MessageInitShape<typeof GetUsageRequestSchema>) =>
      (await adminClient.getUsage(init, admin)).rows.map((r) => [
        r.tenant,
        r.keyId === key.id ? "<ci>" : r.keyId,
        r.keyName,
        r.model,
        r.requests,
      ]);
    expect(await rows({ sinceUnixMs: BigInt(D3) })).toEqual([
      ["", "", "", "chat", 2n],
      ["search", "", "", "chat", 2n],
      ["search", "", "", "code", 2n],
    ]);
    expect(
      await rows({
        sinceUnixMs: BigInt(D3),
        key: "ci",
        groupBy: [UsageDimension.KEY],
        granularity: UsageGranularity.HOUR,
      }),
    ).toEqual([["", "<ci>", "ci", "", 4n]]);
    const [row] = (
      await adminClient.getUsage(
        { sinceUnixMs: BigInt(D3), key: key.id, model: "code", groupBy: [UsageDimension.MODEL] },
        admin,
      )
    ).rows;
    expect(row?.startUnixMs).toBe(BigInt(D3));
    expect(row?.gpuSeconds).toBe(1.5);
    expect(row?.cachedTokens).toBe(40n);
    // Rows are whole buckets starting in [since, until).
    const hours = (untilMs: number) =>
      rows({
        sinceUnixMs: BigInt(D3),
        untilUnixMs: BigInt(untilMs),
        granularity: UsageGranularity.HOUR,
        groupBy: [UsageDimension.TENANT],
      });
    expect(await hours(D3 + 10 * HOUR)).toEqual([]);
    expect(await hours(D3 + 10 * HOUR + 1)).toEqual([
      ["", "", "", "", 2n],
      ["search", "", "", "", 4n],
    ]);
  });
});
