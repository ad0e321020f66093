import { describe, expect, it } from "vitest";
import {
  coresBetween,
  parseProcStatCpuSeconds,
  parseProcStatusBytes,
  sampleProc,
} from "./proc-stats.js";

// A real /proc/<pid>/stat line (cat reading its own), then the same with a command name
// holding spaces and parentheses, which is why fields are counted from the last ")".
const CAT_STAT =
  "17825 (cat) R 17821 17821 13777 0 -1 4194304 99 0 0 0 7 3 0 0 20 0 1 0 369398 3133440 405 18446744073709551615 94894636072960 94894636092841 140722254150144 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94894636108848 94894636110464 94895238742016 140722254158367 140722254158387 140722254158387 140722254159851 0\n";
const ODD_NAME_STAT = CAT_STAT.replace("(cat)", "(node (main) x)");

describe("parseProcStatCpuSeconds", () => {
  it.each([
    ["plain command name", CAT_STAT, 100, 0.1],
    ["name with spaces and parentheses", ODD_NAME_STAT, 100, 0.1],
    ["other clock tick rate", CAT_STAT, 250, 0.04],
  ])("%s", (_, text, ticks, seconds) => {
    expect(parseProcStatCpuSeconds(text, ticks)).toBeCloseTo(seconds, 10);
  });

  it("refuses text that is not a stat line", () => {
    expect(() => parseProcStatCpuSeconds("no parenthesis here", 100)).toThrow(/not a \/proc/);
    expect(() => parseProcStatCpuSeconds("1 (x) R 0", 100)).toThrow(/no utime/);
  });
});

describe("parseProcStatusBytes", () => {
  const status = "Name:\tnode\nVmHWM:\t  131072 kB\nVmRSS:\t   65536 kB\nThreads:\t11\n";
  it.each([
    ["VmRSS", 64 * 2 ** 20],
    ["VmHWM", 128 * 2 ** 20],
    ["VmSwap", undefined],
  ])("%s", (key, bytes) => {
    expect(parseProcStatusBytes(status, key)).toBe(bytes);
  });
});

describe("sampleProc on this process", () => {
  it("reads CPU time that grows with work, and a resident size", () => {
    const a = sampleProc(process.pid, 100, 0);
    const until = Date.now() + 60;
    let x = 0;
    while (Date.now() < until) x += Math.sqrt(x + 1);
    const b = sampleProc(process.pid, 100, 1_000);
    expect(x).toBeGreaterThan(0);
    expect(b.cpuSeconds).toBeGreaterThanOrEqual(a.cpuSeconds);
    expect(b.rssBytes).toBeGreaterThan(1024 * 1024);
    expect(b.peakRssBytes).toBeGreaterThanOrEqual(b.rssBytes);
    expect(coresBetween(a, b)).toBeGreaterThanOrEqual(0);
  });
});
