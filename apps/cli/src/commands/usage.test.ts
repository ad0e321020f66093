import { create } from "@bufbuild/protobuf";
import {
  type GetUsageRequest,
  GetUsageResponseSchema,
  UsageDimension,
  UsageGranularity,
  UsageRowSchema,
} from "@llmgw/proto";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { capturedIo, type FakeClusterService, startFakeClusterService } from "../testing.js";
import { command } from "./usage.js";

const D3 = Date.UTC(2026, 11, 3);

let service: FakeClusterService;
let asked: GetUsageRequest[];

beforeEach(async () => {
  asked = [];
  service = await startFakeClusterService({
    getUsage(req) {
      asked.push(req);
      return create(GetUsageResponseSchema, {
        rows: [
          create(UsageRowSchema, {
            startUnixMs: BigInt(D3),
            tenant: "search",
            keyId: "id-1",
            keyName: "ci",
            model: "chat",
            requests: 3n,
            promptTokens: 300n,
            cachedTokens: 100n,
            cachedReportedRequests: 3n,
            completionTokens: 60n,
            gpuSeconds: 4,
          }),
        ],
      });
    },
  });
});
afterEach(() => service.close());

describe("llmgw usage", () => {
  it("asks for the last 7 days by day, tenant and model, and prints a table with a total", async () => {
    const io = capturedIo(service.env);
    const before = Date.now();
    expect(await command.run([], io)).toBe(0);
    const [req] = asked;
    expect(req?.granularity).toBe(UsageGranularity.DAY);
    expect(req?.groupBy).toEqual([]);
    expect(req?.untilUnixMs).toBeUndefined();
    expect(Number(req?.sinceUnixMs)).toBeGreaterThanOrEqual(before - 7 * 86_400_000);
    expect(Number(req?.sinceUnixMs)).toBeLessThanOrEqual(Date.now() - 7 * 86_400_000);
    expect(io.out()).toBe(
      [
        "PERIOD      TENANT  MODEL  REQUESTS  PROMPT  CACHED  COMPLETION  GPU-SECONDS  ESTIMATED  REFUSED",
        "2026-12-03  search  chat   3         300     100     60          4.0          0          0",
        "TOTAL                      3         300     100     60          4.0          0          0",
        "",
      ].join("\n"),
    );
  });

  it("passes filters, period, granularity and groups, and writes CSV", async () => {
    const io = capturedIo(service.env);
    const code = await command.run(
      [
        "--tenant",
        "search",
        "--key",
        "ci",
        "--model",
        "chat",
        "--since",
        "2026-12-01",
        "--until",
        "2026-12-03T12:00:00Z",
        "--by",
        "hour",
        "--group",
        "key,model",
        "--csv",
      ],
      io,
    );
    expect(code).toBe(0);
    const [req] = asked;
    expect(req).toMatchObject({
      tenant: "search",
      key: "ci",
      model: "chat",
      sinceUnixMs: BigInt(Date.UTC(2026, 11, 1)),
      untilUnixMs: BigInt(Date.UTC(2026, 11, 3, 12)),
      granularity: UsageGranularity.HOUR,
      groupBy: [UsageDimension.KEY, UsageDimension.MODEL],
    });
    expect(io.out().split("\r\n")).toEqual([
      "period_start,tenant,key_id,key_name,model,requests,prompt_tokens,cached_tokens,completion_tokens,gpu_seconds,estimated_requests,refused_usage,cached_reported_requests",
      "2026-12-03T00:00:00.000Z,search,id-1,ci,chat,3,300,100,60,4,0,0,3",
      "",
    ]);
  });

  it("prints the response as JSON with --json", async () => {
    const io = capturedIo(service.env);
    expect(await command.run(["--json"], io)).toBe(0);
    expect(JSON.parse(io.out())).toEqual({
      rows: [
        {
          startUnixMs: String(D3),
          tenant: "search",
          keyId: "id-1",
          keyName: "ci",
          model: "chat",
          requests: "3",
          promptTokens: "300",
          cachedTokens: "100",
          completionTokens: "60",
          cachedReportedRequests: "3",
          gpuSeconds: 4,
        },
      ],
    });
  });

  it.each([
    [
      ["--since", "yesterday"],
      '--since must be a duration back from now (30m, 24h, 7d, 2w), a UTC date (2026-12-01) or an RFC 3339 time (2026-12-01T10:00:00Z), got "yesterday"',
    ],
    [["--since", "1d", "--until", "2d"], "--until (2d) must be after --since (1d)"],
    [["--by", "week"], '--by must be minute, hour or day, got "week"'],
    [
      ["--group", "tenant,team"],
      '--group must be tenant, key and/or model, comma-separated, each once, got "tenant,team"',
    ],
    [["--json", "--csv"], "--json and --csv exclude each other"],
  ])("refuses %j before calling", async (argv, message) => {
    const error = await command.run(argv, capturedIo(service.env)).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(UsageError);
    expect((error as Error).message).toBe(message);
    expect(asked).toEqual([]);
  });
});
