import { parseKmsgRecord, parseXid } from "@llmgw/discovery";
import { describe, expect, it } from "vitest";
import {
  FAULT_CYCLE,
  FAULT_LINES,
  failuresInWindow,
  faultLine,
  isNodeWideAction,
  lastRoutedAfter,
  lineAction,
  type RequestRecord,
  replicasInScope,
  spread,
} from "./measure.js";

describe("faultLine", () => {
  it.each([
    [48, "00000000:01:00.0", "[  219.470994] NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>'"],
    [95, "00000000:02:00.0", "NVRM: Xid (PCI:0000:02:00): 95, pid=7062, Uncontained"],
    [119, "00000000:0A:00.0", "NVRM: Xid (PCI:0000:0a:00): 119, pid=2024380"],
    [120, "00000000:01:00.0", "[605633.376794] NVRM: Xid (PCI:0000:01:00): 120, GSP task"],
    [64, "00000000:02:00.0", "NVRM: Xid (PCI:0000:02:00): 64, pid='<unknown>'"],
    [79, "00000000:01:00.0", "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."],
  ])("rewrites only the PCI id of Xid %i for %s", (code, bus, expected) => {
    const line = faultLine(code, bus);
    expect(line).toContain(expected);
    // Everything but the PCI id is the reference's line.
    const original = FAULT_LINES.get(code) as string;
    expect(line.replace(/PCI:[0-9a-f:]+\)/, "")).toBe(original.replace(/PCI:[0-9a-f:]+\)/, ""));
    // Discovery maps it back to the GPU it was written for.
    const record = parseKmsgRecord(line);
    expect(record && parseXid(record.message)?.pciBusId).toBe(bus);
  });

  it("refuses a code without a real line and a bus id that is not nvidia-smi's form", () => {
    expect(() => faultLine(13, "00000000:01:00.0")).toThrow("no real line for Xid 13");
    expect(() => faultLine(48, "0000:01:00")).toThrow(
      "pciBusId must look like 00000000:01:00.0, got 0000:01:00",
    );
  });
});

describe("the fault cycle", () => {
  it.each([
    [48, "reset-gpu", false],
    [95, "reset-gpu", false],
    [119, "reset-gpu", false],
    [120, "reset-gpu", false],
    [64, "reset-gpu", false],
    [79, "reboot", true],
  ])("Xid %i is %s in discovery's catalog (node-wide: %s)", (code, action, nodeWide) => {
    const got = lineAction(faultLine(code, "00000000:01:00.0"));
    expect(got).toBe(action);
    expect(isNodeWideAction(got)).toBe(nodeWide);
  });

  it("cycles through every line, each once", () => {
    expect([...FAULT_CYCLE].sort()).toEqual([...FAULT_LINES.keys()].sort());
  });
});

describe("replicasInScope", () => {
  const ranks = [
    { replicaId: "r1", nodeId: "n1", gpuIndices: [0] },
    { replicaId: "r2", nodeId: "n1", gpuIndices: [1] },
    { replicaId: "r3", nodeId: "n2", gpuIndices: [0] },
  ];
  it.each([
    [{ nodeId: "n1", gpuIndex: 0 }, ["r1"]],
    [{ nodeId: "n1", gpuIndex: 1 }, ["r2"]],
    [{ nodeId: "n1" }, ["r1", "r2"]],
    [{ nodeId: "n3" }, []],
  ])("%o takes out %o", (scope, expected) => {
    expect(replicasInScope(ranks, scope)).toEqual(expected);
  });
});

const rec = (startMs: number, replica?: string, detail?: string): RequestRecord => ({
  startMs,
  endMs: startMs + 10,
  ...(replica === undefined ? {} : { replica }),
  ok: detail === undefined,
  ...(detail === undefined ? {} : { detail }),
});

describe("lastRoutedAfter", () => {
  it("is the last send to a faulted replica after t0, and 0 when there was none", () => {
    const records = [rec(90, "bad"), rec(120, "bad"), rec(150, "good"), rec(180, "bad"), rec(200)];
    expect(lastRoutedAfter(records, ["bad"], 100)).toBe(80);
    expect(lastRoutedAfter(records, ["bad"], 190)).toBe(0);
    expect(lastRoutedAfter(records, ["other"], 100)).toBe(0);
  });

  it("leaves out answers under a reused id once its replacement was READY", () => {
    const records = [rec(120, "bad"), rec(150, "bad"), rec(400, "bad")];
    expect(lastRoutedAfter(records, ["bad"], 100, new Map([["bad", 300]]))).toBe(50);
    expect(lastRoutedAfter(records, ["bad"], 100, new Map([["bad", 150]]))).toBe(20);
  });
});

describe("failuresInWindow", () => {
  it("counts overlapping requests and groups the failed ones by detail", () => {
    const records = [
      rec(0), // ended at 10, before the window
      rec(95, "a"), // in flight at 100
      rec(110, undefined, "503 no_ready_replica"),
      rec(120, undefined, "503 no_ready_replica"),
      rec(130, undefined, "ECONNRESET"),
      rec(300, undefined, "ECONNRESET"), // after the window
    ];
    expect(failuresInWindow(records, 100, 200)).toEqual({
      requests: 4,
      failed: 3,
      byDetail: { "503 no_ready_replica": 2, ECONNRESET: 1 },
    });
  });
});

describe("spread", () => {
  it("gives nearest-rank p50, p90 and the max, and nothing for no values", () => {
    expect(spread([5, 1, 4, 2, 3, 10, 6, 7, 8, 9])).toEqual({ p50: 5, p90: 9, max: 10 });
    expect(spread([])).toEqual({});
  });
});
