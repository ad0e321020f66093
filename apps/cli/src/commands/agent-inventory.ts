import {
  collectInventory,
  formatInventoryTable,
  inventoryToJson,
  kernelLogPath,
} from "@llmgw/agent";
import { isDiscoveryError } from "@llmgw/discovery";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { LLMGW_VERSION } from "../version.js";

const USAGE = `Usage: llmgw agent inventory [--json] [--nvidia-smi PATH] [--amd-smi PATH]
                             [--rocm-smi PATH] [--sysfs-root DIR]
                             [--simulate SPEC] [--fabric-name DEV=ID ...]
                             [--kernel-log PATH|off]

Prints exactly what the scheduler would see of this node: GPUs (class, memory, health),
RDMA fabric ports, topology and the problems discovery met. Problems do not make it fail:
a node without nvidia-smi (and without AMD GPUs) prints an empty inventory with a
"nvidia-smi not found" problem.

Options:
  --json                the protobuf JSON form of llmgw.v1.NodeInventory (lowerCamelCase;
                        unreported values are absent, uint64 values are strings)
  --nvidia-smi PATH     nvidia-smi binary (default: nvidia-smi on PATH)
  --amd-smi PATH        amd-smi binary, for AMD GPUs (default: amd-smi on PATH)
  --rocm-smi PATH       rocm-smi, used when amd-smi is missing or fails (default: on PATH)
  --sysfs-root DIR      RDMA class tree (default /sys/class/infiniband)
  --simulate SPEC       a simulated node: <count>x<class>[,<count>x<class>...][@<fabric>],
                        e.g. "8xh100-80g@ib-a" or "2xh100-80g,1xl40s-45g"
  --fabric-name DEV=ID  name the fabric of an RDMA device, e.g. mlx5_0=rail-0 (repeatable)
  --kernel-log PATH     read NVIDIA Xid/SXid faults once from /dev/kmsg (default on a real
                        node), a file or a FIFO; "off" skips it (the default with --simulate).
                        Faulted GPUs show e.g. "xid-79" under HEALTH and "faults" in --json
`;

/** `DEV=ID` pairs → record; a malformed pair is a usage error naming it. */
export function parseFabricNames(pairs: readonly string[]): Record<string, string> {
  const names: Record<string, string> = {};
  for (const pair of pairs) {
    const at = pair.indexOf("=");
    const device = pair.slice(0, at).trim();
    const id = pair.slice(at + 1).trim();
    if (at < 0 || device === "" || id === "") {
      throw new UsageError(`--fabric-name expects DEV=ID (e.g. mlx5_0=rail-0), got "${pair}"`);
    }
    names[device] = id;
  }
  return names;
}

export const command: Command = {
  name: "agent inventory",
  summary: "print this node's GPUs, fabrics and problems as the scheduler sees them",
  usage: USAGE,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      json: { type: "boolean" },
      "nvidia-smi": { type: "string" },
      "amd-smi": { type: "string" },
      "rocm-smi": { type: "string" },
      "sysfs-root": { type: "string" },
      simulate: { type: "string" },
      "fabric-name": { type: "string", multiple: true },
      "kernel-log": { type: "string" },
    });
    const fabricNames = parseFabricNames(values["fabric-name"] ?? []);
    if (values["kernel-log"] === "") throw new UsageError('--kernel-log expects a path or "off"');
    const kernelLog = kernelLogPath({ kernelLog: values["kernel-log"], simulate: values.simulate });
    let inventory: Awaited<ReturnType<typeof collectInventory>>;
    try {
      inventory = await collectInventory({
        agentVersion: LLMGW_VERSION,
        fabricNames,
        ...(values["nvidia-smi"] === undefined ? {} : { nvidiaSmiPath: values["nvidia-smi"] }),
        ...(values["amd-smi"] === undefined ? {} : { amdSmiPath: values["amd-smi"] }),
        ...(values["rocm-smi"] === undefined ? {} : { rocmSmiPath: values["rocm-smi"] }),
        ...(values["sysfs-root"] === undefined ? {} : { sysfsRoot: values["sysfs-root"] }),
        ...(values.simulate === undefined ? {} : { simulate: values.simulate }),
        ...(kernelLog === undefined ? {} : { kernelLogPath: kernelLog }),
      });
    } catch (error) {
      if (isDiscoveryError(error)) throw new UsageError(error.message);
      throw error;
    }
    io.stdout.write(
      values.json ? `${inventoryToJson(inventory)}\n` : formatInventoryTable(inventory),
    );
    return 0;
  },
};
