import { describe, expect, it } from "vitest";
import { resolveGpuReadingLimits, sanitizeGpuReading, validateGpuReading } from "./gpu-reading.js";

// The H100 row of the reference nvidia-smi capture (formats.md): 19818 MiB used, 100 %,
// 59 °C, 631.95 W, as a protobuf-es GpuReading carries it (uint64 fields as bigint).
const MIB = 1024n * 1024n;
const h100 = {
  index: 0,
  uuid: "GPU-00000000-0000-0000-0000-000000000000",
  memoryUsedBytes: 19818n * MIB,
  utilizationPercent: 100,
  eccUncorrectedErrors: 0n,
  temperatureCelsius: 59,
  powerWatts: 631.95,
  healthy: true,
};

describe("validateGpuReading", () => {
  it("accepts a real reading and converts bigint counters", () => {
    expect(validateGpuReading(h100)).toEqual({
      ok: true,
      reading: {
        index: 0,
        uuid: "GPU-00000000-0000-0000-0000-000000000000",
        memoryUsedBytes: 19818 * 1024 * 1024,
        utilizationPercent: 100,
        eccUncorrectedErrors: 0,
        temperatureCelsius: 59,
        powerWatts: 631.95,
        healthy: true,
      },
    });
  });

  it("keeps unreported readings unset and a missing healthy flag unhealthy", () => {
    expect(validateGpuReading({ index: 3, uuid: "GPU-x" })).toEqual({
      ok: true,
      reading: { index: 3, uuid: "GPU-x", healthy: false },
    });
  });

  it.each<[string, unknown, string, string, string]>([
    ["null", null, "reading", "not_an_object", "reading must be an object, got null"],
    ["an array", [], "reading", "not_an_object", "reading must be an object, got array"],
    [
      "NaN utilisation",
      { ...h100, utilizationPercent: Number.NaN },
      "utilizationPercent",
      "non_finite",
      "utilizationPercent is not finite (NaN)",
    ],
    [
      "Infinity power",
      { ...h100, powerWatts: Number.POSITIVE_INFINITY },
      "powerWatts",
      "non_finite",
      "powerWatts is not finite (Infinity)",
    ],
    [
      "negative memory",
      { ...h100, memoryUsedBytes: -1 },
      "memoryUsedBytes",
      "negative",
      "memoryUsedBytes is negative (-1)",
    ],
    [
      "negative bigint memory",
      { ...h100, memoryUsedBytes: -5n },
      "memoryUsedBytes",
      "negative",
      "memoryUsedBytes is negative (-5)",
    ],
    [
      "absurd memory",
      { ...h100, memoryUsedBytes: 2n ** 60n },
      "memoryUsedBytes",
      "out_of_range",
      "memoryUsedBytes 1152921504606846976 is outside 0..4398046511104 (integer)",
    ],
    [
      "utilisation over 100",
      { ...h100, utilizationPercent: 250 },
      "utilizationPercent",
      "out_of_range",
      "utilizationPercent 250 is outside 0..100",
    ],
    [
      "absurd temperature",
      { ...h100, temperatureCelsius: 9000 },
      "temperatureCelsius",
      "out_of_range",
      "temperatureCelsius 9000 is outside -60..250",
    ],
    [
      "fractional index",
      { ...h100, index: 1.5 },
      "index",
      "out_of_range",
      "index 1.5 is outside 0..1023 (integer)",
    ],
    [
      "string memory",
      { ...h100, memoryUsedBytes: "lots" },
      "memoryUsedBytes",
      "wrong_type",
      "memoryUsedBytes must be a number, got string",
    ],
    [
      "numeric uuid",
      { ...h100, uuid: 7 },
      "uuid",
      "wrong_type",
      "uuid must be a string, got number",
    ],
    [
      "a 10 MB GPU name",
      { ...h100, name: "A".repeat(10 * 1024 * 1024) },
      "name",
      "label_too_long",
      "name is 10485760 chars, limit 128",
    ],
    [
      "a long uuid",
      { ...h100, uuid: "G".repeat(129) },
      "uuid",
      "label_too_long",
      "uuid is 129 chars, limit 128",
    ],
    [
      "healthy as a string",
      { ...h100, healthy: "yes" },
      "healthy",
      "wrong_type",
      "healthy must be a boolean, got string",
    ],
  ])("rejects %s", (_name, raw, field, reason, message) => {
    expect(validateGpuReading(raw)).toEqual({ ok: false, field, reason, message });
  });

  it("honours custom limits and refuses bad ones naming the option", () => {
    expect(validateGpuReading({ ...h100, powerWatts: 800 }, { maxPowerWatts: 700 })).toMatchObject({
      ok: false,
      reason: "out_of_range",
    });
    expect(() => resolveGpuReadingLimits({ maxPowerWatts: -1 })).toThrow(
      "maxPowerWatts must be a non-negative number, got -1",
    );
  });
});

describe("sanitizeGpuReading", () => {
  it("drops only the bad readings so they read as missing", () => {
    const result = sanitizeGpuReading({ ...h100, utilizationPercent: Number.NaN, powerWatts: -3 });
    expect(result.reading).toEqual({
      index: 0,
      uuid: "GPU-00000000-0000-0000-0000-000000000000",
      memoryUsedBytes: 19818 * 1024 * 1024,
      eccUncorrectedErrors: 0,
      temperatureCelsius: 59,
      healthy: true,
    });
    expect(result.dropped.map((d) => [d.field, d.reason])).toEqual([
      ["utilizationPercent", "non_finite"],
      ["powerWatts", "negative"],
    ]);
  });

  it("refuses a reading whose identity is unusable", () => {
    expect(sanitizeGpuReading({ ...h100, index: -1 })).toEqual({
      reading: undefined,
      dropped: [{ field: "index", reason: "negative", message: "index is negative (-1)" }],
    });
  });
});
