import fc from "fast-check";
import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { createClusterCollector } from "./cluster-collector.js";
import {
  GPU_READING_REJECT_REASONS,
  sanitizeGpuReading,
  validateGpuReading,
} from "./gpu-reading.js";
import { boundLabelValue } from "./labels.js";
import { parseExposition } from "./testing/exposition.js";
import { FakeClusterView, h100Gpu, readyNode } from "./testing/index.js";

const anyNumber = fc.oneof(
  fc.double(),
  fc.integer(),
  fc.bigInt(),
  fc.constantFrom(Number.NaN, Number.POSITIVE_INFINITY, -0),
);
const rawReading = fc.record(
  {
    index: fc.oneof(fc.nat(2000), anyNumber, fc.string()),
    uuid: fc.oneof(fc.string({ maxLength: 300 }), fc.integer()),
    name: fc.string({ maxLength: 300 }),
    memoryUsedBytes: anyNumber,
    utilizationPercent: anyNumber,
    eccUncorrectedErrors: anyNumber,
    temperatureCelsius: anyNumber,
    powerWatts: anyNumber,
    healthy: fc.oneof(fc.boolean(), fc.string()),
  },
  { requiredKeys: [] },
);

describe("reading validation under arbitrary input", () => {
  it("never throws, and an accepted reading holds only finite, in-range values", () => {
    fc.assert(
      fc.property(fc.oneof(rawReading, fc.anything()), (raw) => {
        const result = validateGpuReading(raw);
        if (!result.ok) {
          expect(GPU_READING_REJECT_REASONS).toContain(result.reason);
          expect(result.message.length).toBeLessThan(300);
          return;
        }
        const r = result.reading;
        for (const v of [
          r.memoryUsedBytes,
          r.utilizationPercent,
          r.eccUncorrectedErrors,
          r.powerWatts,
        ]) {
          if (v !== undefined) expect(Number.isFinite(v) && v >= 0).toBe(true);
        }
        expect(r.uuid.length).toBeLessThanOrEqual(128);
        const sanitized = sanitizeGpuReading(raw);
        expect(sanitized.dropped).toEqual([]);
      }),
      { numRuns: 300 },
    );
  });

  it("boundLabelValue always yields a bounded, well-formed string", () => {
    fc.assert(
      fc.property(
        fc.string({ unit: "binary", maxLength: 400 }),
        fc.integer({ min: 8, max: 200 }),
        (s, max) => {
          const out = boundLabelValue(s, max);
          expect(out.length).toBeLessThanOrEqual(max);
          expect(
            /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(out),
          ).toBe(false);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("the scrape stays parseable whatever the view holds", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.string({ unit: "binary", maxLength: 200 }),
        fc.string({ unit: "binary", maxLength: 200 }),
        anyNumber.filter((v) => typeof v === "number"),
        async (hostname, gpuName, reading) => {
          const view = new FakeClusterView({
            nodes: [
              readyNode(
                "n1",
                [
                  h100Gpu(0, {
                    name: gpuName,
                    memoryUsedBytes: reading as number,
                    temperatureCelsius: reading as number,
                  }),
                ],
                { hostname },
              ),
            ],
          });
          const registry = new Registry();
          createClusterCollector(registry, view, { labelValueMaxLength: 64 });
          const { samples } = parseExposition(await registry.metrics());
          expect(samples.find((s) => s.name === "llmgw_node_info")?.labels.hostname).toBe(
            boundLabelValue(hostname, 64),
          );
          for (const s of samples) expect(Number.isNaN(s.value)).toBe(false);
        },
      ),
      { numRuns: 100 },
    );
  });
});
