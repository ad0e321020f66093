import { cp, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import fc from "fast-check";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { isDiscoveryError } from "./errors.js";
import {
  createPortHealthMonitor,
  createPortHealthTracker,
  DEFAULT_PORT_THRESHOLDS,
  type PortHealthMonitorOptions,
  type PortHealthReport,
  parsePortThresholds,
  resolvePortThresholds,
} from "./port-health.js";
import {
  PORT_ERROR_COUNTERS,
  type PortCounterFailure,
  type PortStateSample,
  readSysfsFile,
  type SysfsFileReader,
} from "./sysfs.js";
import { writeTree } from "./testing/index.js";
import type { Port } from "./types.js";

/** The real H100 tree of health-formats.md §3.1 (see test/fixtures/sys-class-infiniband-h100.md). */
const H100_TREE = fileURLToPath(
  new URL("../test/fixtures/sys-class-infiniband-h100", import.meta.url),
);

const HOLD = "unhealthy until 600 s pass without another";

function thresholdError(run: () => unknown): string {
  try {
    run();
  } catch (error) {
    expect(isDiscoveryError(error)).toBe(true);
    expect((error as { code: string }).code).toBe("LLMGW_DISCOVERY_INVALID_OPTION");
    return (error as Error).message;
  }
  throw new Error("expected a DiscoveryError");
}

describe("port thresholds", () => {
  it("defaults: 3 flaps in 600 s, 600 s hold, NVSentinel's counter limits (§3.3)", () => {
    expect(DEFAULT_PORT_THRESHOLDS).toEqual({
      flapCount: 3,
      flapWindowS: 600,
      holdS: 600,
      saturatedUnhealthy: true,
      counters: {
        symbol_error: { maxIncrease: 10, windowS: 1, activeOnly: false },
        link_downed: { maxIncrease: 0, windowS: 1, activeOnly: true },
        link_error_recovery: { maxIncrease: 5, windowS: 60, activeOnly: false },
        port_rcv_errors: null,
        local_link_integrity_errors: { maxIncrease: 0, windowS: 1, activeOnly: false },
        excessive_buffer_overrun_errors: { maxIncrease: 0, windowS: 1, activeOnly: false },
        port_xmit_discards: null,
      },
    });
    expect(Object.keys(DEFAULT_PORT_THRESHOLDS.counters)).toEqual(
      PORT_ERROR_COUNTERS.map((c) => c.name),
    );
    expect(resolvePortThresholds()).toEqual(DEFAULT_PORT_THRESHOLDS);
  });

  it("operator JSON merges over the defaults; partial counters keep their default window", () => {
    const t = parsePortThresholds(
      JSON.stringify({
        flapCount: 5,
        holdS: 120,
        minActiveRateGbps: 400,
        counters: {
          symbol_error: { maxIncrease: 120, windowS: 3600 },
          link_error_recovery: { maxIncrease: 2 },
          port_rcv_errors: { maxIncrease: 100, windowS: 60 },
          link_downed: null,
        },
      }),
    );
    expect(t).toEqual({
      ...DEFAULT_PORT_THRESHOLDS,
      flapCount: 5,
      holdS: 120,
      minActiveRateGbps: 400,
      counters: {
        ...DEFAULT_PORT_THRESHOLDS.counters,
        symbol_error: { maxIncrease: 120, windowS: 3600, activeOnly: false },
        link_error_recovery: { maxIncrease: 2, windowS: 60, activeOnly: false },
        port_rcv_errors: { maxIncrease: 100, windowS: 60, activeOnly: false },
        link_downed: null,
      },
    });
    expect(parsePortThresholds('{"minActiveRateGbps":null}')).toEqual(DEFAULT_PORT_THRESHOLDS);
    expect(
      resolvePortThresholds({ minActiveRateGbps: null }, { ...t, minActiveRateGbps: 400 }),
    ).not.toHaveProperty("minActiveRateGbps");
  });

  it.each([
    ["{", /^port thresholds: not JSON \(.+\): "\{"$/],
    ["[]", "port thresholds: must be a JSON object, got []"],
    ["3", "port thresholds: must be a JSON object, got 3"],
    [
      '{"flapcount":3}',
      'port thresholds: unknown key "flapcount" (known: flapCount, flapWindowS, holdS, saturatedUnhealthy, minActiveRateGbps, counters)',
    ],
    ['{"flapCount":0}', "port thresholds: flapCount must be an integer from 1 to 1000, got 0"],
    ['{"flapCount":2.5}', "port thresholds: flapCount must be an integer from 1 to 1000, got 2.5"],
    [
      '{"flapWindowS":"600"}',
      'port thresholds: flapWindowS must be an integer from 1 to 86400, got "600"',
    ],
    ['{"holdS":0}', "port thresholds: holdS must be an integer from 1 to 86400, got 0"],
    [
      '{"saturatedUnhealthy":"no"}',
      'port thresholds: saturatedUnhealthy must be true or false, got "no"',
    ],
    [
      '{"minActiveRateGbps":-1}',
      "port thresholds: minActiveRateGbps must be a number above 0 (Gb/s) or null, got -1",
    ],
    ['{"counters":[]}', "port thresholds: counters must be an object, got []"],
    [
      '{"counters":{"VL15_dropped":null}}',
      'port thresholds: unknown counter "VL15_dropped" (known: symbol_error, link_downed, link_error_recovery, port_rcv_errors, local_link_integrity_errors, excessive_buffer_overrun_errors, port_xmit_discards)',
    ],
    [
      '{"counters":{"symbol_error":5}}',
      "port thresholds: counters.symbol_error must be an object or null, got 5",
    ],
    [
      '{"counters":{"symbol_error":{"max":5}}}',
      'port thresholds: unknown key "max" in counters.symbol_error (known: maxIncrease, windowS, activeOnly)',
    ],
    [
      '{"counters":{"symbol_error":{"maxIncrease":-1}}}',
      "port thresholds: counters.symbol_error.maxIncrease must be an integer from 0 to 1000000000, got -1",
    ],
    [
      '{"counters":{"link_downed":{"windowS":0}}}',
      "port thresholds: counters.link_downed.windowS must be an integer from 1 to 86400, got 0",
    ],
    [
      '{"counters":{"link_downed":{"activeOnly":1}}}',
      "port thresholds: counters.link_downed.activeOnly must be true or false, got 1",
    ],
    [
      '{"counters":{"port_rcv_errors":{"maxIncrease":5}}}',
      "port thresholds: counters.port_rcv_errors has no default: give both maxIncrease and windowS",
    ],
    [" ".repeat(16_385), "port thresholds: longer than 16384 characters"],
  ])("parsePortThresholds(%j) is refused", (text, message) => {
    const got = thresholdError(() => parsePortThresholds(text));
    if (typeof message === "string") expect(got).toBe(message);
    else expect(got).toMatch(message);
  });

  it("parsePortThresholds on arbitrary text returns thresholds or a DiscoveryError, nothing else", () => {
    const json = fc.oneof(
      fc.string(),
      fc.json(),
      fc
        .record({
          flapCount: fc.anything(),
          counters: fc.dictionary(
            fc.constantFrom("symbol_error", "link_downed", "x"),
            fc.anything(),
          ),
        })
        .map((v) => JSON.stringify(v)),
    );
    fc.assert(
      fc.property(json, (text) => {
        try {
          parsePortThresholds(text);
        } catch (error) {
          expect(isDiscoveryError(error)).toBe(true);
        }
      }),
    );
  });
});

/** A manual monotonic clock in milliseconds. */
function manualClock(start = 1_000_000) {
  let now = start;
  return {
    now: () => now,
    advance: (ms: number) => {
      now += ms;
    },
  };
}

const byName = (port: Port | undefined, name: string) =>
  port?.health?.counters.find((c) => c.name === name);

describe("createPortHealthMonitor over the real H100 tree (§3.1)", () => {
  let root: string;
  let clock: ReturnType<typeof manualClock>;
  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), "llmgw-port-health-"));
    await cp(H100_TREE, root, { recursive: true });
    clock = manualClock();
  });
  afterEach(async () => {
    await rm(root, { recursive: true, force: true });
  });

  const monitor = (options: Partial<PortHealthMonitorOptions> = {}) =>
    createPortHealthMonitor({ sysfsRoot: root, clock: clock.now, ...options });
  const counters = (device: string, values: Record<string, string>) =>
    writeTree(
      root,
      Object.fromEntries(
        Object.entries(values).map(([k, v]) => [`${device}/ports/1/counters/${k}`, `${v}\n`]),
      ),
    );
  const states = (device: string, state: string, phys: string, rate?: string) =>
    writeTree(root, {
      [`${device}/ports/1/state`]: `${state}\n`,
      [`${device}/ports/1/phys_state`]: `${phys}\n`,
      ...(rate === undefined ? {} : { [`${device}/ports/1/rate`]: `${rate}\n` }),
    });
  const find = (report: PortHealthReport, device: string) =>
    report.ports.find((p) => p.device === device);
  /** Puts mlx5_0 in a clean state: its saturated counter reset (as `perfquery -x -R` would). */
  const resetSaturated = () => counters("mlx5_0", { excessive_buffer_overrun_errors: "0" });

  it("first read: saturated excessive_buffer_overrun_errors (15) and link_downed (255) are problems, no rates", async () => {
    const report = await monitor().read();
    const mlx50 = find(report, "mlx5_0");
    expect(mlx50).toEqual({
      device: "mlx5_0",
      port: 1,
      linkLayer: "infiniband",
      state: "ACTIVE",
      physState: "LinkUp",
      rateGbps: 400,
      health: {
        healthy: false,
        problems: [
          {
            code: "LLMGW_DISCOVERY_PORT_COUNTER_SATURATED",
            source: "sysfs",
            message:
              "mlx5_0 port 1: excessive_buffer_overrun_errors is at 15, the most its 4-bit counter holds; new errors are hidden until the counters are reset (perfquery -x -R, or a reboot)",
          },
        ],
        flaps: 0,
        flapWindowS: 600,
        counters: [
          { name: "symbol_error", value: 0, saturated: false },
          { name: "link_downed", value: 0, saturated: false },
          { name: "link_error_recovery", value: 0, saturated: false },
          { name: "port_rcv_errors", value: 14, saturated: false },
          { name: "local_link_integrity_errors", value: 0, saturated: false },
          { name: "excessive_buffer_overrun_errors", value: 15, saturated: true },
          { name: "port_xmit_discards", value: 0, saturated: false },
        ],
      },
    });
    const mlx51 = find(report, "mlx5_1");
    expect(mlx51?.health?.healthy).toBe(false);
    expect(mlx51?.health?.problems.map((p) => p.message)).toEqual([
      "mlx5_1 port 1: link_downed is at 255, the most its 8-bit counter holds; new errors are hidden until the counters are reset (perfquery -x -R, or a reboot)",
    ]);
    expect(byName(mlx51, "symbol_error")).toEqual({ name: "symbol_error", saturated: false });
    // The bond has no counters/ at all: nothing to judge, nothing unreadable.
    expect(find(report, "mlx5_bond_0")?.health).toEqual({
      healthy: true,
      problems: [],
      flaps: 0,
      flapWindowS: 600,
      counters: [],
    });
    expect(report.problems).toEqual([
      {
        code: "LLMGW_DISCOVERY_PORT_COUNTERS_UNREADABLE",
        source: "sysfs",
        message:
          "mlx5_1 port 1: counters symbol_error (ENOENT), link_error_recovery (ENOENT), port_rcv_errors (ENOENT), local_link_integrity_errors (ENOENT), excessive_buffer_overrun_errors (ENOENT), port_xmit_discards (ENOENT) unreadable; errors there are unknown",
      },
    ]);
  });

  it("saturatedUnhealthy: false leaves a saturated counter flagged but the port healthy", async () => {
    const report = await monitor({ thresholds: { saturatedUnhealthy: false } }).read();
    expect(find(report, "mlx5_0")?.health?.healthy).toBe(true);
    expect(byName(find(report, "mlx5_0"), "excessive_buffer_overrun_errors")?.saturated).toBe(true);
  });

  it("rates per second between reads; a saturated counter is never diffed to 0 new errors", async () => {
    const m = monitor();
    await m.read();
    clock.advance(2000);
    await counters("mlx5_0", { port_rcv_errors: "20", port_xmit_discards: "1" });
    const report = await m.read();
    const mlx50 = find(report, "mlx5_0");
    expect(byName(mlx50, "port_rcv_errors")).toEqual({
      name: "port_rcv_errors",
      value: 20,
      ratePerSecond: 3,
      saturated: false,
    });
    expect(byName(mlx50, "port_xmit_discards")?.ratePerSecond).toBe(0.5);
    expect(byName(mlx50, "symbol_error")?.ratePerSecond).toBe(0);
    // Still 15: not "0 per second" but unknown, and still a problem.
    expect(byName(mlx50, "excessive_buffer_overrun_errors")).toEqual({
      name: "excessive_buffer_overrun_errors",
      value: 15,
      saturated: true,
    });
    expect(mlx50?.health?.problems.map((p) => p.code)).toEqual([
      "LLMGW_DISCOVERY_PORT_COUNTER_SATURATED",
    ]);
  });

  it("a counter that decreases was reset: the new errors are the value read", async () => {
    const m = monitor();
    await m.read();
    clock.advance(2000);
    // Operator reset: the saturated 15 reads 0, port_rcv_errors 14 reads 3.
    await counters("mlx5_0", { excessive_buffer_overrun_errors: "0", port_rcv_errors: "3" });
    const report = await m.read();
    const mlx50 = find(report, "mlx5_0");
    expect(byName(mlx50, "excessive_buffer_overrun_errors")).toEqual({
      name: "excessive_buffer_overrun_errors",
      value: 0,
      ratePerSecond: 0,
      saturated: false,
    });
    expect(byName(mlx50, "port_rcv_errors")?.ratePerSecond).toBe(1.5);
    expect(mlx50?.health?.healthy).toBe(true);
    // A reset counter that already shows errors counts them (any increase is a problem here).
    clock.advance(2000);
    await counters("mlx5_0", { local_link_integrity_errors: "2" });
    await m.read();
    clock.advance(2000);
    await counters("mlx5_0", { local_link_integrity_errors: "1" });
    const after = find(await m.read(), "mlx5_0");
    expect(byName(after, "local_link_integrity_errors")?.ratePerSecond).toBe(0.5);
    expect(after?.health?.problems.at(-1)?.message).toBe(
      `mlx5_0 port 1: local_link_integrity_errors rose by 1 in 2 s (0.5/s), above the threshold (any increase); ${HOLD}`,
    );
  });

  it("the §3.2 flap sequence three times is flapping; flaps age out of the 600 s window", async () => {
    await resetSaturated();
    const m = monitor();
    const seen: Array<[number, boolean]> = [];
    let linkDowned = 0;
    let retrains = 0;
    const step = async () => {
      clock.advance(2000);
      const port = find(await m.read(), "mlx5_0");
      seen.push([port?.health?.flaps ?? -1, port?.health?.healthy ?? false]);
      return port;
    };
    await m.read();
    for (let cycle = 0; cycle < 3; cycle++) {
      // health-formats.md §3.2; the DOWN rate string is marked [uncertain] there.
      linkDowned += 1;
      await states("mlx5_0", "1: DOWN", "2: Polling", "10 Gb/sec (4X)");
      await counters("mlx5_0", { link_downed: String(linkDowned) });
      await step();
      retrains += 1;
      await states("mlx5_0", "2: INIT", "5: LinkUp", "400 Gb/sec (4X NDR)");
      await counters("mlx5_0", { link_error_recovery: String(retrains) });
      await step();
      await states("mlx5_0", "4: ACTIVE", "5: LinkUp");
      await step();
    }
    expect(seen).toEqual([
      [1, true],
      [1, true],
      [1, true],
      [2, true],
      [2, true],
      [2, true],
      [3, false],
      [3, false],
      [3, false],
    ]);
    let port = find(await m.read(), "mlx5_0");
    // link_downed rose only while the port was down: the drops are flaps, not portErrors.
    expect(port?.health?.problems).toEqual([
      {
        code: "LLMGW_DISCOVERY_PORT_FLAPPING",
        source: "sysfs",
        message:
          "mlx5_0 port 1 left ACTIVE 3 times in the last 600 s (threshold: 3); unhealthy until fewer remain in the window",
      },
    ]);
    // First drop at +2 s; 600 s after it that flap leaves the window.
    clock.advance(2000 + 600_000 - 18_000 - 1);
    port = find(await m.read(), "mlx5_0");
    expect(port?.health?.flaps).toBe(3);
    clock.advance(1);
    port = find(await m.read(), "mlx5_0");
    expect(port?.health).toMatchObject({ flaps: 2, healthy: true, problems: [] });
  });

  it("link_downed +1 while ACTIVE (dropped and back between reads) is a flap and an error, held 600 s", async () => {
    await resetSaturated();
    const m = monitor();
    await m.read();
    clock.advance(2000);
    await counters("mlx5_0", { link_downed: "1" });
    let port = find(await m.read(), "mlx5_0");
    expect(port?.health).toMatchObject({
      healthy: false,
      flaps: 1,
      problems: [
        {
          code: "LLMGW_DISCOVERY_PORT_ERRORS",
          message: `mlx5_0 port 1: link_downed rose by 1 in 2 s (0.5/s) while ACTIVE, above the threshold (any increase); ${HOLD}`,
        },
      ],
    });
    clock.advance(600_000 - 1);
    port = find(await m.read(), "mlx5_0");
    expect(port?.health?.healthy).toBe(false);
    clock.advance(1);
    port = find(await m.read(), "mlx5_0");
    expect(port?.health).toMatchObject({ healthy: true, flaps: 0, problems: [] });
  });

  it.each([
    [
      "30",
      true,
      `mlx5_0 port 1: symbol_error rose by 30 in 2 s (15/s), above the threshold (10 per 1 s); ${HOLD}`,
    ],
    ["20", false, undefined],
  ])("symbol_error 0 → %s in 2 s: unhealthy %s (threshold > 10/s)", async (value, bad, message) => {
    await resetSaturated();
    const m = monitor();
    await m.read();
    clock.advance(2000);
    await counters("mlx5_0", { symbol_error: value });
    const port = find(await m.read(), "mlx5_0");
    expect(port?.health?.healthy).toBe(!bad);
    expect(port?.health?.problems[0]?.message).toBe(message);
  });

  it("link_error_recovery: 6 retrains in 12 s cross 5/min; one every 15 s never does", async () => {
    await resetSaturated();
    const fast = monitor();
    await fast.read();
    const healthy: boolean[] = [];
    for (let i = 1; i <= 6; i++) {
      clock.advance(2000);
      await counters("mlx5_0", { link_error_recovery: String(i) });
      healthy.push(find(await fast.read(), "mlx5_0")?.health?.healthy ?? false);
    }
    expect(healthy).toEqual([true, true, true, true, true, false]);

    await counters("mlx5_0", { link_error_recovery: "0" });
    const slow = monitor();
    await slow.read();
    const slowHealthy: boolean[] = [];
    for (let i = 1; i <= 12; i++) {
      clock.advance(15_000);
      await counters("mlx5_0", { link_error_recovery: String(i) });
      slowHealthy.push(find(await slow.read(), "mlx5_0")?.health?.healthy ?? false);
    }
    expect(slowHealthy.every(Boolean)).toBe(true);
  });

  it("EINVAL counters (restricted PF) are unknown, reported once per read, and read only once", async () => {
    await resetSaturated();
    const calls: string[] = [];
    const readFile: SysfsFileReader = async (path) => {
      calls.push(path);
      if (path.endsWith("mlx5_0/ports/1/counters/symbol_error")) {
        throw Object.assign(new Error("EINVAL"), { code: "EINVAL" });
      }
      return readSysfsFile(path);
    };
    const m = monitor({ readFile });
    for (let i = 0; i < 3; i++) {
      clock.advance(2000);
      const report = await m.read();
      const port = find(report, "mlx5_0");
      expect(byName(port, "symbol_error")).toEqual({ name: "symbol_error", saturated: false });
      expect(port?.health?.healthy).toBe(true);
      expect(report.problems.map((p) => p.message)).toContain(
        "mlx5_0 port 1: counters symbol_error (EINVAL) unreadable; errors there are unknown",
      );
    }
    expect(calls.filter((p) => p.endsWith("mlx5_0/ports/1/counters/symbol_error"))).toHaveLength(1);
  });

  it("a counter that then cannot be read keeps its held crossing and its saturation: no flicker to healthy", async () => {
    let failing = false;
    const readFile: SysfsFileReader = async (path) => {
      if (
        failing &&
        /mlx5_0\/ports\/1\/counters\/(local_link_integrity|excessive_buffer_overrun)_errors$/.test(
          path,
        )
      ) {
        throw Object.assign(new Error("EIO"), { code: "EIO" });
      }
      return readSysfsFile(path);
    };
    const m = monitor({ readFile });
    await m.read();
    clock.advance(5000);
    await counters("mlx5_0", { local_link_integrity_errors: "3" });
    const messages = [
      `mlx5_0 port 1: local_link_integrity_errors rose by 3 in 5 s (0.6/s), above the threshold (any increase); ${HOLD}`,
      "mlx5_0 port 1: excessive_buffer_overrun_errors is at 15, the most its 4-bit counter holds; new errors are hidden until the counters are reset (perfquery -x -R, or a reboot)",
    ];
    const health = (report: PortHealthReport) => {
      const port = find(report, "mlx5_0");
      return [port?.health?.healthy, port?.health?.problems.map((p) => p.message)];
    };
    expect(health(await m.read())).toEqual([false, messages]);
    failing = true;
    clock.advance(5000);
    const unreadable = await m.read();
    expect(health(unreadable)).toEqual([false, messages]);
    expect(unreadable.problems.map((p) => p.message)).toContain(
      "mlx5_0 port 1: counters local_link_integrity_errors (EIO), excessive_buffer_overrun_errors (EIO) unreadable; errors there are unknown",
    );
    // Past the hold the crossing ends even unread; the saturated value stays until a read says otherwise.
    clock.advance(600_000);
    expect(health(await m.read())).toEqual([false, messages.slice(1)]);
    failing = false;
    await resetSaturated();
    clock.advance(5000);
    expect(health(await m.read())).toEqual([true, []]);
  });

  it("a DOWN port's 10 Gb/s is not degraded; an ACTIVE port below minActiveRateGbps is, held 600 s", async () => {
    await resetSaturated();
    await states("mlx5_0", "1: DOWN", "2: Polling", "10 Gb/sec (4X)");
    const m = monitor({ thresholds: { minActiveRateGbps: 400 } });
    let report = await m.read();
    expect(find(report, "mlx5_0")?.health).toMatchObject({ healthy: true, problems: [] });
    expect(find(report, "mlx5_0")?.rateGbps).toBe(10);
    // The real bond runs at 200 Gb/s (2X NDR): below the operator's 400.
    expect(find(report, "mlx5_bond_0")?.health?.problems).toEqual([
      {
        code: "LLMGW_DISCOVERY_PORT_RATE_DEGRADED",
        source: "sysfs",
        message:
          "mlx5_bond_0 port 1 is ACTIVE at 200 Gb/s, below the minimum of 400 Gb/s; unhealthy until 600 s pass at full rate",
      },
    ]);
    await states("mlx5_bond_0", "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)");
    clock.advance(599_999);
    report = await m.read();
    expect(find(report, "mlx5_bond_0")?.health?.healthy).toBe(false);
    clock.advance(1);
    report = await m.read();
    expect(find(report, "mlx5_bond_0")?.health?.healthy).toBe(true);
  });

  it("a port that disappears is forgotten: when it returns, its first read has no rates", async () => {
    const m = monitor();
    await m.read();
    await rm(join(root, "mlx5_0"), { recursive: true });
    clock.advance(2000);
    expect(find(await m.read(), "mlx5_0")).toBeUndefined();
    await cp(join(H100_TREE, "mlx5_0"), join(root, "mlx5_0"), { recursive: true });
    clock.advance(2000);
    const port = find(await m.read(), "mlx5_0");
    expect(byName(port, "port_rcv_errors")).toEqual({
      name: "port_rcv_errors",
      value: 14,
      saturated: false,
    });
  });

  it("a read while one is in flight shares it; a missing root is no ports and no problem", async () => {
    const m = monitor();
    const a = m.read();
    expect(m.read()).toBe(a);
    await a;
    expect(m.read()).not.toBe(a);
    expect(await monitor({ sysfsRoot: join(root, "missing") }).read()).toEqual({
      ports: [],
      problems: [],
    });
  });

  it("bad thresholds throw when the monitor is created", () => {
    expect(thresholdError(() => monitor({ thresholds: { flapCount: -1 } }))).toBe(
      "port thresholds: flapCount must be an integer from 1 to 1000, got -1",
    );
  });
});

describe("createPortHealthTracker", () => {
  const failures: PortCounterFailure[] = ["EINVAL", "EPERM", "ENOENT", "no-pma", "invalid"];
  const sample = fc.record({
    device: fc.constantFrom("mlx5_0", "mlx5_1"),
    port: fc.constantFrom(1, 2),
    stateCode: fc.option(fc.integer({ min: 0, max: 6 }), { nil: undefined }),
    rateGbps: fc.option(fc.double({ min: 0, max: 1000, noNaN: true }), { nil: undefined }),
    values: fc.array(
      fc.oneof(fc.constantFrom(0, 1, 15, 255, 65535), fc.nat(), fc.constantFrom(...failures)),
      { minLength: 7, maxLength: 7 },
    ),
  });

  it("never throws on arbitrary reads at arbitrary times; rates are finite and never negative", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.tuple(fc.array(sample, { maxLength: 4 }), fc.integer({ min: -1e6, max: 1e7 })),
          {
            maxLength: 20,
          },
        ),
        (reads) => {
          const tracker = createPortHealthTracker(
            resolvePortThresholds({ minActiveRateGbps: 100 }),
          );
          for (const [samples, atMs] of reads) {
            const ports: PortStateSample[] = samples.map((s) => ({
              device: s.device,
              port: s.port,
              linkLayer: "infiniband",
              state: "X",
              physState: "Y",
              ...(s.stateCode === undefined ? {} : { stateCode: s.stateCode }),
              ...(s.rateGbps === undefined ? {} : { rateGbps: s.rateGbps }),
              counters: PORT_ERROR_COUNTERS.map(({ name }, i) => {
                const v = s.values[i]!;
                return typeof v === "number" ? { name, value: v } : { name, failure: v };
              }),
            }));
            for (const port of tracker.observe(ports, atMs).ports) {
              expect(port.health!.flaps).toBeGreaterThanOrEqual(0);
              expect(port.health!.healthy).toBe(port.health!.problems.length === 0);
              for (const c of port.health!.counters) {
                if (c.ratePerSecond !== undefined) {
                  expect(Number.isFinite(c.ratePerSecond)).toBe(true);
                  expect(c.ratePerSecond).toBeGreaterThanOrEqual(0);
                  expect(c.saturated).toBe(false);
                }
              }
            }
          }
        },
      ),
    );
  });
});
