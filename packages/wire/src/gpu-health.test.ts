import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { type GpuFault, GpuFaultSchema, GpuReadingSchema } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  gpuFaultFromProto,
  gpuFaultKey,
  gpuHealthVerdict,
  gpuHealthy,
  gpuReadingFromProto,
} from "./index.js";

const gpu = simulateInventory("1xh100-80g", { hostname: "n1", nowMs: 1 }).gpus[0];
if (!gpu) throw new Error("no gpu");

// Evidence lines verbatim from shared/reference/health-formats.md §1.3.
const fault = (code: number, action: string, evidence: string, lastSeen = 2_000): GpuFault =>
  create(GpuFaultSchema, {
    kind: "xid",
    code,
    action,
    pciBusId: "00000000:06:00.0",
    count: 1,
    firstSeenUnixMs: 1_000n,
    lastSeenUnixMs: BigInt(lastSeen),
    evidence,
  });
const XID79 = fault(79, "reset-gpu", "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.");
const XID13 = fault(
  13,
  "ignore",
  "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
);
const faultProblem = { code: "LLMGW_DISCOVERY_GPU_FAULT", message: "Xid 79", source: "kernel-log" };
// Built as the agent sends it, read as the control plane takes it.
const reading = (extra: Parameters<typeof create<typeof GpuReadingSchema>>[1]) =>
  gpuReadingFromProto(
    create(GpuReadingSchema, { index: 0, uuid: gpu.uuid, healthy: true, ...extra }),
  );

describe("gpuHealthVerdict", () => {
  it.each([
    ["no faults", reading({}), undefined, true],
    ["an ignorable fault", reading({ faults: [XID13] }), undefined, true],
    [
      "an actionable fault the agent flagged",
      reading({ healthy: false, healthProblems: [faultProblem], faults: [XID79] }),
      undefined,
      false,
    ],
    ["an actionable fault the agent did not flag", reading({ faults: [XID79] }), undefined, false],
    [
      "a cleared fault",
      reading({ healthy: false, healthProblems: [faultProblem], faults: [XID79] }),
      new Map([[gpuFaultKey(XID79), 2_000]]),
      true,
    ],
    [
      "a cleared fault seen again (a later record)",
      reading({ faults: [{ ...XID79, lastSeenUnixMs: 2_001n }] }),
      new Map([[gpuFaultKey(XID79), 2_000]]),
      false,
    ],
    [
      "a cleared fault next to another problem",
      reading({
        healthy: false,
        healthProblems: [faultProblem, { code: "LLMGW_DISCOVERY_GPU_ECC", message: "2 ECC" }],
        faults: [XID79],
      }),
      new Map([[gpuFaultKey(XID79), 2_000]]),
      false,
    ],
    [
      "a fault problem with no fault to clear",
      reading({ healthy: false, healthProblems: [faultProblem] }),
      undefined,
      false,
    ],
    ["healthy: false without any reason", reading({ healthy: false }), undefined, false],
    ["lost", reading({ lost: true }), undefined, false],
    [
      "an action this build does not know",
      reading({ faults: [{ ...XID79, action: "replace-board" }] }),
      undefined,
      false,
    ],
  ])("%s", (_name, r, cleared, healthy) => {
    expect(gpuHealthVerdict(gpu, r, cleared).healthy).toBe(healthy);
    expect(gpuHealthy(gpu, r, cleared)).toBe(healthy);
  });

  it("names what counts: non-fault problems and uncleared actionable faults", () => {
    const v = gpuHealthVerdict(
      gpu,
      reading({
        healthy: false,
        healthProblems: [faultProblem, { code: "X", message: "other" }],
        faults: [XID79, XID13],
      }),
    );
    expect(v.problems.map((p) => p.code)).toEqual(["X"]);
    expect(v.faults.map((f) => f.code)).toEqual([79]);
  });

  it("reads registration's faults until a reading arrives", () => {
    const faulted = { ...gpu, faults: [gpuFaultFromProto(XID79)] };
    expect(gpuHealthy(faulted, undefined)).toBe(false);
    expect(gpuHealthy(faulted, reading({}))).toBe(true);
  });
});
