import { create } from "@bufbuild/protobuf";
import { UsageDimension, UsageGranularity, UsageRowSchema } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  csvField,
  csvText,
  formatUsagePeriod,
  parseUsageGroups,
  parseUsageTime,
  usageCsv,
  usageTable,
} from "./usage-format.js";

/** 2026-12-03T11:00:00Z */
const NOW = Date.UTC(2026, 11, 3, 11);
const D3 = Date.UTC(2026, 11, 3);

describe("parseUsageTime", () => {
  it.each<[string, number | undefined]>([
    ["30m", NOW - 30 * 60_000],
    ["24h", NOW - 86_400_000],
    ["7d", NOW - 7 * 86_400_000],
    ["2w", NOW - 14 * 86_400_000],
    ["2026-12-01", Date.UTC(2026, 11, 1)],
    ["2026-12-01T10:00:00Z", Date.UTC(2026, 11, 1, 10)],
    ["2026-12-01T10:00Z", Date.UTC(2026, 11, 1, 10)],
    ["2026-12-01T10:00:00.5+02:00", Date.UTC(2026, 11, 1, 8, 0, 0, 500)],
    ["2026-02-30", undefined],
    ["2026-02-30T10:00:00Z", undefined],
    ["2025-02-29 10:00Z", undefined],
    ["2028-02-29T10:00:00Z", Date.UTC(2028, 1, 29, 10)],
    ["2026-04-31T10:00:00+02:00", undefined],
    ["2026-12-01T24:00:00Z", undefined],
    ["2026-12-01T23:60:00Z", undefined],
    ["2026-12-01T10:00:00", undefined],
    ["7 days", undefined],
    ["-7d", undefined],
    ["", undefined],
  ])("%j → %s", (text, ms) => {
    expect(parseUsageTime(text, NOW)).toBe(ms);
  });
});

describe("parseUsageGroups", () => {
  it.each<[string, UsageDimension[] | undefined]>([
    ["tenant", [UsageDimension.TENANT]],
    ["key,model", [UsageDimension.KEY, UsageDimension.MODEL]],
    ["tenant, key, model", [UsageDimension.TENANT, UsageDimension.KEY, UsageDimension.MODEL]],
    ["key,key", undefined],
    ["team", undefined],
    ["", undefined],
  ])("%j → %j", (text, dims) => {
    expect(parseUsageGroups(text)).toEqual(dims);
  });
});

const rows = [
  create(UsageRowSchema, {
    startUnixMs: BigInt(D3),
    tenant: "search",
    model: "chat",
    requests: 10n,
    promptTokens: 1_000n,
    cachedTokens: 400n,
    cachedReportedRequests: 9n,
    completionTokens: 200n,
    gpuSeconds: 12.25,
    estimatedRequests: 1n,
  }),
  create(UsageRowSchema, {
    startUnixMs: BigInt(D3),
    tenant: "",
    model: 'odd,"model"',
    requests: 2n,
    promptTokens: 20n,
    completionTokens: 5n,
    gpuSeconds: 0.5,
    refusedUsage: 1n,
  }),
];

describe("usageTable", () => {
  it("shows the dimensions grouped by (tenant and model by default) and a TOTAL row", () => {
    expect(usageTable(rows, [], UsageGranularity.DAY)).toEqual({
      headers: [
        "PERIOD",
        "TENANT",
        "MODEL",
        "REQUESTS",
        "PROMPT",
        "CACHED",
        "COMPLETION",
        "GPU-SECONDS",
        "ESTIMATED",
        "REFUSED",
      ],
      rows: [
        ["2026-12-03", "search", "chat", "10", "1000", "400", "200", "12.3", "1", "0"],
        // No engine reported its cached tokens: unknown, not 0.
        ["2026-12-03", "-", 'odd,"model"', "2", "20", "-", "5", "0.5", "0", "1"],
        ["TOTAL", "", "", "12", "1020", "400", "205", "12.8", "1", "1"],
      ],
    });
  });

  it("names keys by name, by id when they have none", () => {
    const keyed = [
      create(UsageRowSchema, { startUnixMs: BigInt(D3 + 3_600_000), keyId: "id-1", keyName: "ci" }),
      create(UsageRowSchema, { startUnixMs: BigInt(D3 + 3_600_000), keyId: "id-2" }),
    ];
    const table = usageTable(keyed, [UsageDimension.KEY], UsageGranularity.HOUR);
    expect(table.headers.slice(0, 3)).toEqual(["PERIOD", "KEY", "REQUESTS"]);
    expect(table.rows.map((r) => r.slice(0, 2))).toEqual([
      ["2026-12-03 01:00", "ci"],
      ["2026-12-03 01:00", "id-2"],
      ["TOTAL", ""],
    ]);
  });

  it("formats periods by granularity", () => {
    expect(formatUsagePeriod(D3 + 61_000, UsageGranularity.MINUTE)).toBe("2026-12-03 00:01");
    expect(formatUsagePeriod(D3, UsageGranularity.DAY)).toBe("2026-12-03");
  });
});

describe("usageCsv", () => {
  it("writes RFC 4180: a header row, CRLF, quoted fields with doubled quotes", () => {
    expect(usageCsv(rows)).toBe(
      [
        "period_start,tenant,key_id,key_name,model,requests,prompt_tokens,cached_tokens,completion_tokens,gpu_seconds,estimated_requests,refused_usage,cached_reported_requests",
        "2026-12-03T00:00:00.000Z,search,,,chat,10,1000,400,200,12.25,1,0,9",
        '2026-12-03T00:00:00.000Z,,,,"odd,""model""",2,20,,5,0.5,0,1,0',
        "",
      ].join("\r\n"),
    );
  });

  it("defuses names a spreadsheet would run as a formula (=, +, -, @, tab, CR first)", () => {
    const hostile = create(UsageRowSchema, {
      startUnixMs: BigInt(D3),
      tenant: "-team",
      keyId: "@SUM(A1)",
      keyName: "+1+1",
      model: '=HYPERLINK("http://evil","x")',
      requests: 1n,
    });
    const line = usageCsv([hostile]).split("\r\n")[1];
    expect(line).toBe(
      `2026-12-03T00:00:00.000Z,'-team,'@SUM(A1),'+1+1,"'=HYPERLINK(""http://evil"",""x"")",1,0,,0,0,0,0,0`,
    );
    for (const lead of ["=", "+", "-", "@", "\t", "\r"])
      expect(csvText(`${lead}x`).replace(/^"/, "").startsWith("'")).toBe(true);
    expect(csvText("chat")).toBe("chat");
  });

  it.each([
    ["plain", "plain"],
    ["a,b", '"a,b"'],
    ['say "hi"', '"say ""hi"""'],
    ["two\nlines", '"two\nlines"'],
    ["cr\r", '"cr\r"'],
  ])("quotes %j as %j", (value, field) => {
    expect(csvField(value)).toBe(field);
  });
});
