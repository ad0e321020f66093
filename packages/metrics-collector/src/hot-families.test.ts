import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { HotCounter, HotGauge, HotHistogram } from "./hot-families.js";
import { parseExposition } from "./testing/exposition.js";

const buckets = [0.005, 0.01, 0.1, 1];

/** The same updates on prom-client's handles and on the hot families, each on its own registry. */
function bothWays(
  updates: (h: {
    counter: { inc(labels: { model: string; code: string }, v?: number): void };
    gauge: {
      set(labels: { model: string }, v: number): void;
      inc(labels: { model: string }, d?: number): void;
    };
    histogram: { observe(labels: { model: string }, v: number): void };
  }) => void,
) {
  const reference = new Registry();
  updates({
    counter: new Counter({
      name: "t_total",
      help: "h",
      labelNames: ["model", "code"],
      registers: [reference],
    }),
    gauge: new Gauge({ name: "t_gauge", help: "h", labelNames: ["model"], registers: [reference] }),
    histogram: new Histogram({
      name: "t_seconds",
      help: "h",
      labelNames: ["model"],
      buckets,
      registers: [reference],
    }),
  });
  const hot = new Registry();
  updates({
    counter: new HotCounter({ name: "t_total", help: "h", labelNames: ["model", "code"] }, hot),
    gauge: new HotGauge({ name: "t_gauge", help: "h", labelNames: ["model"] }, hot),
    histogram: new HotHistogram(
      { name: "t_seconds", help: "h", labelNames: ["model"], buckets },
      hot,
    ),
  });
  return { reference, hot };
}

const sorted = (text: string) =>
  parseExposition(text)
    .samples.map((s) => JSON.stringify([s.name, Object.entries(s.labels).sort(), s.value]))
    .sort();

describe("hot families", () => {
  it("expose exactly what prom-client's counter, gauge and histogram expose for the same updates", async () => {
    const { reference, hot } = bothWays(({ counter, gauge, histogram }) => {
      counter.inc({ model: "a", code: "200" });
      counter.inc({ model: "a", code: "200" }, 2.5);
      counter.inc({ model: "b", code: "429" }, 0);
      gauge.set({ model: "a" }, 7);
      gauge.inc({ model: "a" }, -3);
      gauge.inc({ model: 'quote"and\\slash\nnewline' });
      // On a bound, between bounds, above all, negative, exactly zero.
      for (const v of [0.005, 0.0051, 0.5, 3, -1, 0, 1]) histogram.observe({ model: "a" }, v);
      histogram.observe({ model: "b" }, 0.01);
    });
    const want = await reference.metrics();
    const got = await hot.metrics();
    expect(sorted(got)).toEqual(sorted(want));
    expect(parseExposition(got).types).toEqual(parseExposition(want).types);
  });

  it("shows no series until one is recorded (absent, not zero), and none after remove", async () => {
    const registry = new Registry();
    const c = new HotCounter({ name: "x_total", help: "h", labelNames: ["model"] }, registry);
    const h = new HotHistogram(
      { name: "x_seconds", help: "h", labelNames: ["model"], buckets },
      registry,
    );
    const bound = h.series({ model: "a" }); // binding alone records nothing
    expect(parseExposition(await registry.metrics()).samples).toEqual([]);
    c.inc({ model: "a" });
    bound.observe(0.2);
    expect(parseExposition(await registry.metrics()).samples.length).toBe(1 + buckets.length + 3);
    c.remove({ model: "a" });
    h.remove({ model: "a" });
    expect(parseExposition(await registry.metrics()).samples).toEqual([]);
  });

  it("removeWhere drops every series matching the given labels, whatever the others", async () => {
    const registry = new Registry();
    const c = new HotCounter(
      { name: "x_total", help: "h", labelNames: ["model", "replica", "kind"] },
      registry,
    );
    for (const kind of ["connect", "timeout", "not-known-in-advance"]) {
      c.inc({ model: "m", replica: "r-0", kind });
    }
    c.inc({ model: "m", replica: "r-1", kind: "connect" });
    c.inc({ model: "other", replica: "r-0", kind: "connect" });
    c.removeWhere({ model: "m", replica: "r-0" });
    const samples = parseExposition(await registry.metrics()).samples;
    expect(samples.map((s) => [s.labels.model, s.labels.replica])).toEqual([
      ["m", "r-1"],
      ["other", "r-0"],
    ]);
  });

  it("bound series keep counting after their series was removed or reset, from zero", async () => {
    const registry = new Registry();
    const c = new HotCounter({ name: "x_total", help: "h", labelNames: ["model"] }, registry);
    const a = c.series({ model: "a" });
    a.inc(5);
    c.remove({ model: "a" });
    a.inc();
    registry.resetMetrics();
    a.inc(2);
    const samples = parseExposition(await registry.metrics()).samples;
    expect(samples.map((s) => [s.labels.model, s.value])).toEqual([["a", 2]]);
  });

  it("keeps label sets apart whatever their values contain", async () => {
    const registry = new Registry();
    const c = new HotCounter({ name: "x_total", help: "h", labelNames: ["a", "b"] }, registry);
    c.inc({ a: "x\u0000", b: "" });
    c.inc({ a: "x", b: "\u0000" }, 2);
    c.inc({ a: "1:x", b: "" }, 4);
    c.inc({ a: "1", b: ":x" }, 8);
    const values = (await c.get()).values.map((v) => v.value);
    expect(values).toEqual([1, 2, 4, 8]);
  });

  it("refuses bad values and label sets with the family's name", () => {
    const registry = new Registry();
    const c = new HotCounter({ name: "x_total", help: "h", labelNames: ["model"] }, registry);
    const h = new HotHistogram(
      { name: "x_seconds", help: "h", labelNames: ["model"], buckets },
      registry,
    );
    expect(() => c.inc({ model: "a" }, -1)).toThrow("x_total: a counter only goes up");
    expect(() => c.inc({ model: "a" }, Number.NaN)).toThrow("x_total: a counter only goes up");
    expect(() => c.series({ model: "a" }).inc(Number.POSITIVE_INFINITY)).toThrow("x_total");
    expect(() => h.observe({ model: "a" }, Number.NaN)).toThrow("x_seconds: not a finite number");
    expect(() => c.inc({ model: "a", zone: "z" } as never)).toThrow(
      'x_total: label "zone" is not one of model',
    );
    expect(() => c.inc({} as never)).toThrow('x_total: label "model" is missing');
    expect(
      () => new HotHistogram({ name: "y", help: "h", labelNames: [], buckets: [1, 1] }, registry),
    ).toThrow("y: buckets must be distinct finite numbers");
    // Nothing half-made: the refused calls left no series behind.
    expect(registry.getSingleMetric("x_total")).toBeDefined();
  });

  it("registers like a prom-client metric: one name per registry", () => {
    const registry = new Registry();
    new HotGauge({ name: "g", help: "h", labelNames: [] }, registry);
    expect(() => new HotGauge({ name: "g", help: "h", labelNames: [] }, registry)).toThrow(
      "already been registered",
    );
  });
});
