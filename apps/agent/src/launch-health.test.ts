import {
  applyKernelFaults,
  createKernelFaultTracker,
  type Gpu,
  type NodeInventory,
  ProblemCodes,
  simulateInventory,
} from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow, validateLaunch } from "@llmgw/engines";
import { describe, expect, it } from "vitest";
import { withoutKernelLogFaults } from "./launch-health.js";

/**
 * health-formats.md §1.3, verbatim but for its PCI id: `PCI:0000:06:00` rewritten to the
 * simulated GPU 0's bus (`00000000:01:00.0` in simulate.ts).
 */
const XID_79 = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.";
/** health-formats.md §1.3 (a restart-engine Xid: a fault record, no health problem). */
const XID_31 =
  "NVRM: Xid (PCI:0000:01:00): 31, Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ";

const ECC = {
  code: ProblemCodes.gpuEccUncorrected,
  message: "2 uncorrected ECC errors",
  source: "nvidia-smi",
};

/** A one-GPU node as the agent sees it: GPU 0 changed by `edit`, then the lines' faults applied. */
function node(lines: readonly string[], edit: (g: Gpu) => Gpu = (g) => g): NodeInventory {
  const base = simulateInventory("1xh100-80g", { hostname: "node-a" });
  const tracker = createKernelFaultTracker({ clock: () => 1_700_000_000_000 });
  for (const line of lines) tracker.add(line, true);
  const { gpus } = applyKernelFaults(base.gpus.map(edit), tracker.faults());
  return { ...base, gpus };
}

const codes = (n: NodeInventory) =>
  validateLaunch({
    deployment: parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "sim" }),
    ranks: [{ nodeId: n.hostname, node: n, gpuIndices: [0] }],
  }).map((v) => v.code);

describe("withoutKernelLogFaults", () => {
  it("lets the launch check pass a GPU whose only problem is a kernel-log fault", () => {
    const faulted = node([XID_79]);
    expect(faulted.gpus[0]?.healthy).toBe(false);
    // The bug it fixes: the plain check refuses the GPU forever, a clear notwithstanding.
    expect(codes(faulted)).toEqual(["LLMGW_ENGINES_GPU_UNHEALTHY"]);
    const seen = withoutKernelLogFaults(faulted);
    expect(seen.gpus[0]).toMatchObject({ healthy: true, healthProblems: [] });
    expect(seen.gpus[0]?.faults).toEqual(faulted.gpus[0]?.faults);
    expect(codes(seen)).toEqual([]);
  });

  it.each<[string, NodeInventory, string]>([
    [
      "another health problem beside the fault",
      node([XID_79], (g) => ({ ...g, healthy: false, healthProblems: [ECC] })),
      "LLMGW_ENGINES_GPU_UNHEALTHY",
    ],
    [
      "a lost GPU with a fault",
      node([XID_79], (g) => ({ ...g, healthy: false, lost: true })),
      "LLMGW_ENGINES_GPU_LOST",
    ],
    [
      "a fault problem without a fault record (nothing to clear)",
      node([], (g) => ({
        ...g,
        healthy: false,
        healthProblems: [{ code: ProblemCodes.gpuFault, message: "x", source: "kernel-log" }],
      })),
      "LLMGW_ENGINES_GPU_UNHEALTHY",
    ],
    [
      "healthy: false that no problem explains, beside a fault record",
      node([XID_31], (g) => ({ ...g, healthy: false })),
      "LLMGW_ENGINES_GPU_UNHEALTHY",
    ],
  ])("still refuses %s", (_, inventory, code) => {
    expect(codes(withoutKernelLogFaults(inventory))).toEqual([code]);
  });

  it("keeps the other problem's message and drops the fault's", () => {
    const gpu = withoutKernelLogFaults(
      node([XID_79], (g) => ({ ...g, healthy: false, healthProblems: [ECC] })),
    ).gpus[0];
    expect(gpu).toMatchObject({ healthy: false, healthProblems: [ECC] });
  });

  it("returns an inventory without faults as it was", () => {
    const clean = node([]);
    expect(withoutKernelLogFaults(clean)).toBe(clean);
  });
});
