import type { CommandRunner } from "./command-runner.js";
import { classifyNvidiaSmiFailure } from "./nvidia-smi.js";
import type { ParseResult } from "./nvidia-smi-parse.js";
import { ProblemCodes, problem } from "./problem-codes.js";
import type { GpuAffinity, GpuLink, GpuNicAffinity, Problem, Topology } from "./types.js";

const ANSI = /\x1b\[[0-9;]*m/g;
const DEVICE = /^(GPU|NIC)(\d+)$/;

/** An empty topology: what a node without nvidia-smi (or with one GPU and no NICs) has. */
export const EMPTY_TOPOLOGY: Topology = { gpuLinks: [], gpuNics: [], gpuAffinity: [] };

function splitRow(line: string): string[] {
  // Real output is tab-separated; copies pasted into issues have tabs turned into spaces.
  return line.includes("\t") ? line.split("\t").map((c) => c.trim()) : line.trim().split(/\s{2,}/);
}

/**
 * Parses `nvidia-smi topo -m`: tab-separated matrix with an ANSI-underlined header, ` X ` on
 * the diagonal, `NV#` for bonded NVLinks, `CPU Affinity` / `NUMA Affinity` / `GPU NUMA ID`
 * after the matrix on GPU rows (preceded by an empty cell), NIC rows without them, and a
 * `NIC Legend` naming the RDMA devices. Each GPU pair appears once (`gpuA < gpuB`).
 */
export function parseTopology(text: string): ParseResult<Topology> {
  const all = text.replace(ANSI, "").split(/\r?\n/);
  // The header is the only line that starts with blank space and then names GPU0.
  const headerAt = all.findIndex((line) => /^\s+GPU0(\s|$)/.test(line));
  if (headerAt < 0) {
    return {
      value: EMPTY_TOPOLOGY,
      problems: [
        problem(
          ProblemCodes.topologyFailed,
          "topology",
          "nvidia-smi topo -m printed no GPU matrix",
        ),
      ],
    };
  }
  const header = splitRow(all[headerAt] ?? "").filter((c) => c !== "");
  const columns = header.filter((c) => DEVICE.test(c));
  const legend = new Map<string, string>();
  for (const line of all) {
    const match = /^\s*(NIC\d+):\s*(\S+)\s*$/.exec(line);
    if (match?.[1] && match[2]) legend.set(match[1], match[2]);
  }
  const gpuLinks: GpuLink[] = [];
  const gpuNics: GpuNicAffinity[] = [];
  const gpuAffinity: GpuAffinity[] = [];
  for (const line of all.slice(headerAt + 1)) {
    const cells = splitRow(line);
    const rowMatch = DEVICE.exec(cells[0] ?? "");
    if (rowMatch === null || rowMatch[1] !== "GPU") continue;
    const gpu = Number.parseInt(rowMatch[2] ?? "", 10);
    const matrix = cells.slice(1, 1 + columns.length);
    columns.forEach((column, i) => {
      const cell = (matrix[i] ?? "").trim();
      const col = DEVICE.exec(column);
      if (!col || cell === "" || cell === "X") return;
      const other = Number.parseInt(col[2] ?? "", 10);
      if (col[1] === "GPU") {
        if (other <= gpu) return;
        const nv = /^NV(\d+)$/.exec(cell);
        gpuLinks.push({ gpuA: gpu, gpuB: other, path: cell, nvlinks: nv ? Number(nv[1]) : 0 });
      } else {
        gpuNics.push({ gpu, nic: legend.get(column) ?? column, path: cell });
      }
    });
    const rest = cells.slice(1 + columns.length).filter((c) => c !== "");
    const cpuAffinity = rest[0];
    if (cpuAffinity !== undefined) {
      const numa = rest[1];
      const numaNode = numa !== undefined && /^\d+$/.test(numa) ? Number(numa) : undefined;
      gpuAffinity.push({
        gpu,
        cpuAffinity: cpuAffinity === "N/A" ? "" : cpuAffinity,
        ...(numaNode === undefined ? {} : { numaNode }),
      });
    }
  }
  return { value: { gpuLinks, gpuNics, gpuAffinity }, problems: [] };
}

/** Runs `nvidia-smi topo -m` and parses it; failures become problems and an empty topology. */
export async function queryTopology(ctx: {
  readonly runner: CommandRunner;
  readonly nvidiaSmiPath: string;
  readonly timeoutMs: number;
}): Promise<{ topology: Topology; problems: Problem[] }> {
  const result = await ctx.runner.run(ctx.nvidiaSmiPath, ["topo", "-m"], {
    timeoutMs: ctx.timeoutMs,
  });
  const failure = classifyNvidiaSmiFailure(ctx.nvidiaSmiPath, "topo -m", result, ctx.timeoutMs);
  if (failure) {
    return {
      topology: EMPTY_TOPOLOGY,
      problems: [problem(ProblemCodes.topologyFailed, "topology", failure.message)],
    };
  }
  const parsed = parseTopology(result.stdout);
  return { topology: parsed.value, problems: [...parsed.problems] };
}
