import { create } from "@bufbuild/protobuf";
import { BudgetPeriod, ReportUsageResponseSchema } from "@llmgw/proto";
import type { UsageAnswer } from "@llmgw/router";
import { describe, expect, it } from "vitest";
import { usageAnswerFromProto, usageAnswerToProto, usageBatchToProto } from "./usage.js";

describe("usage on the wire", () => {
  it("round-trips an answer's standings", () => {
    const answer: UsageAnswer = {
      duplicate: true,
      asOfMs: 1_764_806_400_000,
      standings: [
        {
          tenant: "search",
          period: "day",
          model: "",
          periodStartMs: 1_764_806_400_000,
          usedTokens: 12,
        },
        {
          keyId: "k1",
          period: "month",
          model: "m",
          periodStartMs: 1_764_547_200_000,
          usedTokens: 0,
        },
      ],
    };
    expect(usageAnswerFromProto(usageAnswerToProto(answer))).toEqual(answer);
  });

  it("leaves out standings that make no sense, never trusts them", () => {
    const standing = {
      tenant: "t",
      keyId: "",
      period: BudgetPeriod.DAY,
      model: "",
      periodStartUnixMs: 1_000n,
      usedTokens: 5n,
    };
    const res = create(ReportUsageResponseSchema, {
      asOfUnixMs: 2_000n,
      standings: [
        standing,
        { ...standing, tenant: "" }, // no owner
        { ...standing, keyId: "k" }, // two owners
        { ...standing, period: BudgetPeriod.UNSPECIFIED },
        { ...standing, usedTokens: 2n ** 60n }, // beyond 2^53
        { ...standing, periodStartUnixMs: -(2n ** 60n) },
      ],
    });
    expect(usageAnswerFromProto(res)).toEqual({
      duplicate: false,
      asOfMs: 2_000,
      standings: [{ tenant: "t", period: "day", model: "", periodStartMs: 1_000, usedTokens: 5 }],
    });
  });

  it("sends GPU-seconds as whole milliseconds, never negative", () => {
    const record = {
      minuteMs: 60_000,
      keyId: "k",
      tenant: "",
      model: "m",
      requests: 1,
      promptTokens: 2,
      cachedTokens: 0,
      cachedReported: 1,
      completionTokens: 3,
      estimatedRequests: 0,
      refusedUsage: 0,
    };
    const req = usageBatchToProto("r1", {
      batchId: "b",
      records: [
        { ...record, gpuMs: 12.6 },
        { ...record, gpuMs: -1 },
      ],
    });
    expect(req.routerId).toBe("r1");
    expect(req.records.map((r) => r.gpuMilliseconds)).toEqual([13n, 0n]);
  });
});
