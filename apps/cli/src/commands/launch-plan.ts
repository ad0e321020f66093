import { readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { fromJson } from "@bufbuild/protobuf";
import type * as plain from "@llmgw/discovery";
import {
  buildLaunchSpec,
  type DeploymentSpec,
  deploymentGpusPerReplica,
  isEnginesError,
  type LaunchSpec,
  type LaunchViolation,
  parseDeploymentSpec,
  validateLaunch,
} from "@llmgw/engines";
import { NodeInventorySchema } from "@llmgw/proto";
import { inventoryFromProto } from "@llmgw/wire";
import { parse as parseYaml } from "yaml";
import { type Command, parseCommandArgs, UsageError } from "../command.js";

const USAGE = `Usage: llmgw launch-plan -f SPEC.(json|yaml) --inventory NODE.json [--inventory NODE.json …]
                          [--rank0-address ADDR] [--api-port N] [--rendezvous-port N] [--json]

Dry run: prints, per rank, the exact argv and environment an agent would launch for a
deployment on the given nodes, or every reason it must not launch (exit 1). Nothing is started.

  -f, --file FILE          deployment spec (llmgw.v1.Deployment fields in camelCase), JSON or YAML
  --inventory FILE         a node's inventory as printed by \`llmgw agent inventory --json\`;
                           repeat once per node: one rank per inventory, in order
  --rank0-address ADDR     address other ranks use to reach rank 0 (default: rank 0's first address)
  --api-port N             API port of rank 0 (default 8000)
  --rendezvous-port N      rendezvous port on rank 0 (default 29501)
  --json                   machine-readable output

Placement here is naive (each inventory's first healthy GPUs, the fabric all nodes share);
the real placement is the scheduler's. Secrets (HF_TOKEN) are added by the agent at spawn
time and never shown.`;

/** One rank of the dry-run plan. */
export interface PlannedRank {
  readonly rank: number;
  readonly nodeId: string;
  readonly gpuIndices: readonly number[];
  readonly fabricId?: string;
  readonly launch?: LaunchSpec;
}

export const command: Command = {
  name: "launch-plan",
  summary: "dry run: the argv and env each rank of a deployment would run",
  usage: USAGE,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      file: { type: "string", short: "f" },
      inventory: { type: "string", multiple: true },
      "rank0-address": { type: "string" },
      "api-port": { type: "string" },
      "rendezvous-port": { type: "string" },
      json: { type: "boolean", default: false },
    });
    if (values.file === undefined) throw new UsageError("missing -f/--file SPEC");
    const inventoryFiles = values.inventory ?? [];
    if (inventoryFiles.length === 0)
      throw new UsageError("missing --inventory NODE.json (one per node)");
    const apiPort = portFlag("--api-port", values["api-port"], 8000);
    const rendezvousPort = portFlag("--rendezvous-port", values["rendezvous-port"], 29501);

    const fail = (message: string) => {
      io.stderr.write(`llmgw launch-plan: ${message}\n`);
      return 1;
    };
    let rawSpec: unknown;
    try {
      const text = await readFile(resolve(io.cwd, values.file), "utf8");
      rawSpec = /\.ya?ml$/i.test(values.file) ? parseYaml(text) : JSON.parse(text);
    } catch (error) {
      return fail(`cannot read spec ${values.file}: ${(error as Error).message}`);
    }
    const parsed = parseDeploymentSpec(rawSpec);
    if (!parsed.ok) {
      if (values.json) {
        io.stdout.write(
          `${JSON.stringify({ ok: false, specIssues: parsed.error.issues }, null, 2)}\n`,
        );
        return 1;
      }
      const lines = parsed.error.issues.map(
        (i) =>
          `  ${i.field || "(spec)"}: ${i.message}${"value" in i ? ` (got ${JSON.stringify(i.value)})` : ""}`,
      );
      return fail(`invalid deployment spec ${values.file}:\n${lines.join("\n")}`);
    }
    const deployment = parsed.spec;

    const nodes: plain.NodeInventory[] = [];
    for (const file of inventoryFiles) {
      try {
        nodes.push(
          inventoryFromProtoJson(JSON.parse(await readFile(resolve(io.cwd, file), "utf8"))),
        );
      } catch (error) {
        return fail(`cannot read inventory ${file}: ${(error as Error).message}`);
      }
    }

    const ranks = placeNaively(deployment, nodes);
    const violations = validateLaunch({
      deployment,
      ranks: ranks.map((r, i) => ({ ...r, node: nodes[i] as plain.NodeInventory })),
    });
    const rank0Address = values["rank0-address"] ?? nodes[0]?.addresses[0] ?? nodes[0]?.hostname;
    const planned: PlannedRank[] = [];
    let buildError: string | undefined;
    if (violations.length === 0) {
      for (const [i, r] of ranks.entries()) {
        try {
          const launch = buildLaunchSpec({
            deployment,
            placement: {
              rank: i,
              nnodes: ranks.length,
              gpuIndices: r.gpuIndices,
              ...(rank0Address === undefined ? {} : { rank0Address }),
              rendezvousPort,
              ...(r.fabricId === undefined ? {} : { fabricId: r.fabricId }),
            },
            ports: { api: apiPort },
            node: nodes[i] as plain.NodeInventory,
          });
          planned.push({ rank: i, ...r, launch });
        } catch (error) {
          if (!isEnginesError(error)) throw error;
          buildError = `${error.code}: ${error.message}`;
          break;
        }
      }
    }
    const ok = violations.length === 0 && buildError === undefined;
    if (values.json) {
      const out = ok
        ? { ok, deployment, ranks: planned }
        : {
            ok,
            deployment,
            ranks,
            violations,
            ...(buildError === undefined ? {} : { error: buildError }),
          };
      io.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
      return ok ? 0 : 1;
    }
    io.stdout.write(describePlan(deployment, ranks, violations));
    if (buildError !== undefined) return fail(buildError);
    if (!ok) return 1;
    for (const r of planned) io.stdout.write(describeRank(r));
    return 0;
  },
};

/** A `--*-port` flag: `fallback` when absent, else 1–65535 or a usage error. */
export function portFlag(flag: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!/^\d+$/.test(value) || n < 1 || n > 65_535)
    throw new UsageError(`${flag} must be a TCP port 1-65535, got ${JSON.stringify(value)}`);
  return n;
}

/**
 * One rank per inventory, in order: GPUs per node = GPUs per replica / nodes, the node's first
 * healthy (not lost, not MIG) GPUs first, topped up with others so validation names them when
 * a node is short; multi-node ranks share `deployment.fabric`, else the first fabric every
 * node has, else rank 0's first fabric (so validation names the node that lacks it).
 */
export function placeNaively(
  deployment: DeploymentSpec,
  nodes: readonly plain.NodeInventory[],
): { nodeId: string; gpuIndices: number[]; fabricId?: string }[] {
  const per = Math.ceil(deploymentGpusPerReplica(deployment) / Math.max(nodes.length, 1));
  let fabricId: string | undefined;
  if (nodes.length > 1) {
    const ids = (n: plain.NodeInventory) =>
      n.fabrics.filter((f) => f.ports.some((p) => p.state === "ACTIVE")).map((f) => f.id);
    const shared = ids(nodes[0] as plain.NodeInventory).filter((id) =>
      nodes.every((n) => ids(n).includes(id)),
    );
    fabricId = deployment.fabric ?? shared[0] ?? ids(nodes[0] as plain.NodeInventory)[0];
  }
  return nodes.map((n) => {
    const usable = (g: plain.Gpu) => g.healthy && !g.lost && !g.migEnabled;
    const ordered = [...n.gpus.filter(usable), ...n.gpus.filter((g) => !usable(g))];
    return {
      nodeId: n.hostname,
      gpuIndices: ordered.slice(0, per).map((g) => g.index),
      ...(fabricId === undefined ? {} : { fabricId }),
    };
  });
}

function describePlan(
  d: DeploymentSpec,
  ranks: readonly { nodeId: string; gpuIndices: readonly number[]; fabricId?: string }[],
  violations: readonly LaunchViolation[],
): string {
  const lines = [
    `deployment ${d.name}: ${d.engine} ${d.model} as "${d.servedModelName}", TP ${d.tensorParallel} × PP ${d.pipelineParallel}, ${ranks.length} rank(s)${ranks[0]?.fabricId ? ` on fabric ${ranks[0].fabricId}` : ""}`,
    "(naive placement: one rank per inventory, first healthy GPUs; the scheduler decides the real one)",
  ];
  if (violations.length > 0) {
    lines.push("", `refused: ${violations.length} violation(s)`);
    for (const v of violations) lines.push(`  ${v.code}: ${v.message}`);
  }
  return `${lines.join("\n")}\n`;
}

function describeRank(r: PlannedRank): string {
  const l = r.launch as LaunchSpec;
  const env = Object.entries(l.env);
  const lines = [
    "",
    `rank ${r.rank} on ${r.nodeId}: GPUs ${r.gpuIndices.length > 0 ? r.gpuIndices.join(",") : "none"}${l.apiPort === undefined ? ", no API (worker rank)" : `, API port ${l.apiPort}`}`,
    "  env:",
    ...env.map(([k, v]) => `    ${k}=${shellQuote(v)}`),
    "  argv:",
    `    ${l.argv.map(shellQuote).join(" ")}`,
    "  as one shell line:",
    `    env ${env.map(([k, v]) => `${k}=${shellQuote(v)}`).join(" ")} ${l.argv.map(shellQuote).join(" ")}`,
  ];
  if (l.readiness !== undefined) {
    lines.push(
      `  ready when: GET ${l.readiness.healthPath} is 200 and ${l.readiness.modelsPath} lists "${l.readiness.expectedModelId}"`,
    );
  }
  if (l.reasons.length > 0) lines.push("  why:", ...l.reasons.map((s) => `    - ${s}`));
  return `${lines.join("\n")}\n`;
}

/** Quotes a word for a POSIX shell only when it needs it (for reading; engines never run via a shell). */
export function shellQuote(word: string): string {
  if (word !== "" && /^[A-Za-z0-9_/.:,=@%+-]+$/.test(word)) return word;
  return `'${word.replaceAll("'", `'\\''`)}'`;
}

/**
 * An inventory in the protobuf JSON form `llmgw agent inventory --json` prints → discovery's
 * plain types (through `@llmgw/wire`, the converter the daemons use). Unknown fields throw.
 */
export function inventoryFromProtoJson(json: unknown): plain.NodeInventory {
  return inventoryFromProto(fromJson(NodeInventorySchema, json as Parameters<typeof fromJson>[1]));
}
