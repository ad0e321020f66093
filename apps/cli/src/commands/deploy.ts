import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { toJson } from "@bufbuild/protobuf";
import { deploymentSpecToProto } from "@llmgw/control-plane/client";
import { ENGINES, parseDeploymentSpec } from "@llmgw/engines";
import { DeploymentStatusSchema } from "@llmgw/proto";
import { parse as parseYaml } from "yaml";
import { ADMIN_FLAGS, ADMIN_FLAGS_USAGE, adminContext, runAdmin } from "../admin-client.js";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import {
  callAgainAfterBreak,
  parseWaitTimeoutMs,
  WAIT_TIMEOUT_HELP,
  waitForRollout,
} from "../lifecycle-wait.js";

const USAGE = `Usage: llmgw deploy NAME --model M --engine E [options]
       llmgw deploy -f spec.yaml|spec.json [NAME] [options]

Creates or updates a deployment. With --wait, shows each replica's progress (placed →
starting → loading → ready), the reason it cannot be placed, or why it failed; during an
update, each old replica waiting for its replacement, draining (n in flight) and stopped,
with a progress line ("2/4 ready at revision 3, 1 draining").

Options:
  --model M               Hugging Face id, a path on the nodes, or a GGUF file
  --engine E              ${ENGINES.join(" | ")}
  --gpu-class C           e.g. h100-80g (default: any class)
  --tp N                  tensor parallel size (default 1)
  --pp N                  pipeline parallel size (default 1)
  --replicas N            replicas (default 1)
  --nodes-per-replica N   nodes each replica spans (default: 1 when it fits)
  --max-model-len N       context length
  --served-model-name S   model id clients send (default NAME)
  --extra-arg A           engine flag appended after llmgw's own (repeatable)
  -f, --file F            spec file (YAML or JSON, fields as in the deployment spec)
  --wait                  wait until every replica runs the new revision and is ready, and
                          replaced ones are gone (exit 1 on failure, rollback or timeout)
  --timeout S             ${WAIT_TIMEOUT_HELP}
${ADMIN_FLAGS_USAGE}`;

function count(value: string | undefined, flag: string): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value)) throw new UsageError(`${flag} must be a whole number, got "${value}"`);
  return Number(value);
}

function readSpecFile(file: string, cwd: string): Record<string, unknown> {
  const path = resolve(cwd, file);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new UsageError(`cannot read ${path}: ${(error as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = parseYaml(text);
  } catch (error) {
    throw new UsageError(`${path} is neither YAML nor JSON: ${(error as Error).message}`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new UsageError(`${path} must hold one deployment spec object`);
  }
  return parsed as Record<string, unknown>;
}

export const command: Command = {
  name: "deploy",
  summary: "create or update a deployment (--wait to follow the rollout)",
  usage: USAGE,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(
      argv,
      {
        ...ADMIN_FLAGS,
        model: { type: "string" },
        engine: { type: "string" },
        "gpu-class": { type: "string" },
        tp: { type: "string" },
        pp: { type: "string" },
        replicas: { type: "string" },
        "nodes-per-replica": { type: "string" },
        "max-model-len": { type: "string" },
        "served-model-name": { type: "string" },
        "extra-arg": { type: "string", multiple: true },
        file: { type: "string", short: "f" },
        wait: { type: "boolean" },
        timeout: { type: "string" },
      },
      true,
    );
    if (positionals.length > 1)
      throw new UsageError(`expected one NAME, got ${positionals.length}`);
    const input: Record<string, unknown> = values.file ? readSpecFile(values.file, io.cwd) : {};
    const set = (key: string, value: unknown) => {
      if (value !== undefined) input[key] = value;
    };
    set("name", positionals[0]);
    set("model", values.model);
    set("engine", values.engine);
    set("gpuClass", values["gpu-class"]);
    set("tensorParallel", count(values.tp, "--tp"));
    set("pipelineParallel", count(values.pp, "--pp"));
    set("replicas", count(values.replicas, "--replicas"));
    set("nodesPerReplica", count(values["nodes-per-replica"], "--nodes-per-replica"));
    set("maxModelLen", count(values["max-model-len"], "--max-model-len"));
    set("servedModelName", values["served-model-name"]);
    if (values["extra-arg"]) set("extraArgs", values["extra-arg"]);
    if (input.name === undefined)
      throw new UsageError("NAME is required (or a name in the -f file)");
    if (input.model === undefined)
      throw new UsageError("--model is required (or model in the -f file)");
    if (input.engine === undefined)
      throw new UsageError(`--engine is required: ${ENGINES.join(", ")}`);
    const parsed = parseDeploymentSpec(input);
    if (!parsed.ok) throw new UsageError(parsed.error.message);
    const timeoutMs = parseWaitTimeoutMs(values.timeout);

    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      // Applying the same spec twice changes nothing, so a call whose answer was lost with
      // the leader is asked again of the next one.
      const res = await callAgainAfterBreak(io, "the apply", () =>
        ctx.client.applyDeployment({ deployment: deploymentSpecToProto(parsed.spec) }),
      );
      const status = res.deployment;
      if (!values.wait) {
        if (ctx.json && status)
          io.stdout.write(`${JSON.stringify(toJson(DeploymentStatusSchema, status), null, 2)}\n`);
        else
          io.stdout.write(
            `${res.changed ? "applied" : "unchanged"} ${parsed.spec.name} (revision ${status?.spec?.revision ?? "?"}): ${status?.desiredReplicas ?? 0} replica(s); follow with 'llmgw deploy ${parsed.spec.name} … --wait' or 'llmgw replicas --deployment ${parsed.spec.name}'\n`,
          );
        return 0;
      }
      io.stderr.write(
        `${res.changed ? "applied" : "unchanged"} ${parsed.spec.name} (revision ${status?.spec?.revision ?? "?"}); waiting for ${status?.desiredReplicas ?? 0} replica(s)\n`,
      );
      const revision = status?.spec?.revision;
      if (revision === undefined)
        throw new Error("the control plane answered the apply without the deployment's revision");
      return waitForRollout(ctx, io, {
        name: parsed.spec.name,
        revision,
        timeoutMs,
        doing: "rolling out",
      });
    });
  },
};
