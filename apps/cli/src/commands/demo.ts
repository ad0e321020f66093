import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import {
  createEngineProbes,
  freePort,
  parseAgentConfig,
  type RunningAgent,
  startAgent,
} from "@llmgw/agent";
import { type ControlPlane, startControlPlane } from "@llmgw/control-plane";
import { ensureLlamaServer, ensureTinyModel } from "@llmgw/engine-sim";
import {
  type ClusterService,
  DeploymentSchema,
  type DeploymentStatus,
  Engine,
  ReplicaState,
} from "@llmgw/proto";
import { adminContext } from "../admin-client.js";
import { type CliIo, type Command, parseCommandArgs } from "../command.js";
import { createConsoleLogger } from "../logger.js";
import { formatDuration, terminalText } from "../table.js";
import { LLMGW_VERSION } from "../version.js";
import { selfCommand } from "./agent.js";
import { parseDurationMs } from "./control-plane.js";
import { portFlag } from "./launch-plan.js";

const USAGE = `Usage: llmgw demo [--no-llamacpp] [--exit-after-check] [--port P] [--control-port P]

The one-command tour, on this machine, no GPU needed: an embedded control plane (temporary
data dir), a local agent on a simulated node (2 × h100-80g), and two deployments — a model on
the simulated engine and a real llama.cpp model on CPU (llama-server is built on first use,
about 6 minutes on 2 cores, then cached). It waits until both are ready, creates an API key,
sends real chat completions through the router (one streamed), and prints what to try next.
It keeps running until Ctrl-C, then stops everything it started.

Options:
  --no-llamacpp        skip the llama.cpp deployment (and its build)
  --exit-after-check   run every step, then stop; exit 0 only if every step worked (CI)
  --port P             public (OpenAI) port (default 8080, or a free one if taken)
  --control-port P     control port: admin API, agents, /metrics (default 7070, or a free one)
  --timeout D          how long to wait for deployments to become ready: 600 (seconds), 30s,
                       10m, 1h (default 600)
`;

const SIM_MODEL = "llama-3-8b-sim";
const LLAMA_MODEL = "tiny-llama";

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

async function pickPort(preferred: number, explicit: boolean): Promise<number> {
  if (explicit || (await portFree(preferred))) return preferred;
  return freePort();
}

class Step {
  ok = true;
  constructor(private readonly io: CliIo) {}
  say(line: string): void {
    this.io.stdout.write(`${line}\n`);
  }
  fail(line: string): void {
    this.ok = false;
    this.io.stdout.write(`✗ ${line}\n`);
  }
}

async function waitReady(
  admin: Client<typeof ClusterService>,
  names: string[],
  timeoutMs: number,
  step: Step,
  signal: AbortSignal,
): Promise<boolean> {
  const started = Date.now();
  const last = new Map<string, string>();
  while (Date.now() - started < timeoutMs && !signal.aborted) {
    const { deployments } = await admin.listDeployments({});
    const wanted = deployments.filter((d) => d.spec && names.includes(d.spec.name));
    for (const d of wanted) {
      for (const line of progressLines(d, Date.now() - started)) {
        const key = line.split(" ")[0] ?? line;
        const text = line.slice(key.length);
        if (last.get(key) !== text.replace(/\d+s$/, "")) {
          last.set(key, text.replace(/\d+s$/, ""));
          step.say(`  ${line}`);
        }
      }
      const failed = d.replicas.find((r) => r.state === ReplicaState.FAILED);
      if (failed) {
        const rank = failed.ranks.find((k) => k.status?.state === ReplicaState.FAILED);
        step.fail(
          terminalText(
            `${failed.replicaId} failed: ${rank?.status?.message ?? "unknown"}\n${(rank?.status?.logTail ?? []).slice(-10).join("\n")}`,
          ),
        );
        return false;
      }
    }
    if (
      wanted.length === names.length &&
      wanted.every((d) => d.readyReplicas === d.desiredReplicas && d.desiredReplicas > 0)
    ) {
      return true;
    }
    await new Promise((r) => setTimeout(r, 300));
  }
  step.fail(`not ready after ${formatDuration(Date.now() - started)}`);
  return false;
}

function progressLines(d: DeploymentStatus, elapsedMs: number): string[] {
  if (d.replicas.length === 0 && d.unschedulable.length > 0) {
    return [
      `${d.spec?.name} cannot be placed: ${d.unschedulable.map((u) => u.message).join("; ")}`,
    ];
  }
  return d.replicas.map((r) => {
    const state = ReplicaState[r.state].toLowerCase();
    const where = r.endpoint ? ` at ${r.endpoint}` : "";
    const time = r.state === ReplicaState.READY ? "" : ` ${Math.round(elapsedMs / 1000)}s`;
    return `${r.replicaId} ${state}${where}${time}`;
  });
}

async function chat(
  publicUrl: string,
  key: string,
  model: string,
  stream: boolean,
  out: (text: string) => void,
): Promise<{ replica: string | null; text: string }> {
  const response = await fetch(`${publicUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({
      model,
      stream,
      max_tokens: 24,
      messages: [
        { role: "system", content: "You are a helpful assistant." },
        { role: "user", content: "Say hello to the llmgw demo." },
      ],
    }),
  });
  const replica = response.headers.get("x-llmgw-replica");
  if (!response.ok) {
    throw new Error(`HTTP ${response.status}: ${await response.text()}`);
  }
  if (!stream) {
    const body = (await response.json()) as { choices?: { message?: { content?: string } }[] };
    const text = body.choices?.[0]?.message?.content ?? "";
    out(text);
    return { replica, text };
  }
  let text = "";
  let buffer = "";
  const decoder = new TextDecoder();
  for await (const chunk of response.body as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let newline = buffer.indexOf("\n");
    while (newline !== -1) {
      const line = buffer.slice(0, newline).trim();
      buffer = buffer.slice(newline + 1);
      newline = buffer.indexOf("\n");
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") continue;
      const event = JSON.parse(data) as {
        choices?: { delta?: { content?: string } }[];
        error?: { message?: string };
      };
      if (event.error) throw new Error(`stream error: ${event.error.message}`);
      const piece = event.choices?.[0]?.delta?.content ?? "";
      text += piece;
      out(piece);
    }
  }
  return { replica, text };
}

export const command: Command = {
  name: "demo",
  summary: "a working cluster on this machine and a real request through it",
  usage: USAGE,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      "no-llamacpp": { type: "boolean" },
      "exit-after-check": { type: "boolean" },
      port: { type: "string" },
      "control-port": { type: "string" },
      timeout: { type: "string" },
    });
    const step = new Step(io);
    const withLlama = !values["no-llamacpp"];
    const timeoutMs = parseDurationMs(values.timeout ?? "600", "--timeout");
    const preferredPublic = portFlag("--port", values.port, 8080);
    const preferredControl = portFlag("--control-port", values["control-port"], 7070);
    const root = mkdtempSync(path.join(tmpdir(), "llmgw-demo-"));
    const logFile = createConsoleLogger({ write: () => true }, "demo");
    let cp: ControlPlane | undefined;
    let agent: RunningAgent | undefined;
    try {
      step.say(`llmgw ${LLMGW_VERSION} demo — everything runs on this machine, data in ${root}`);
      let llamaServer: string | undefined;
      let tinyModel: string | undefined;
      if (withLlama) {
        step.say("• preparing llama.cpp (builds llama-server once, then reuses the cache)…");
        // The cache the README's set-up and `llmgw agent` use: $LLMGW_CACHE_DIR, else ~/.cache/llmgw.
        const cache = io.env.LLMGW_CACHE_DIR ? { cacheDir: io.env.LLMGW_CACHE_DIR } : {};
        llamaServer = await ensureLlamaServer({
          ...cache,
          onProgress: (line: string) => step.say(`    ${line}`),
        });
        tinyModel = await ensureTinyModel("tiny", cache);
        step.say(`  llama-server: ${llamaServer}\n  model: ${tinyModel}`);
      }
      step.say("• starting the control plane");
      // Ports are chosen just before they are bound: a free port picked before the llama.cpp
      // build could be taken by then.
      const publicPort = await pickPort(preferredPublic, values.port !== undefined);
      const controlPort = await pickPort(preferredControl, values["control-port"] !== undefined);
      cp = await startControlPlane({
        dataDir: path.join(root, "control-plane"),
        listen: `127.0.0.1:${publicPort}`,
        controlListen: `127.0.0.1:${controlPort}`,
        heartbeatIntervalMs: 500,
      });
      const publicUrl = cp.publicUrl;
      if (publicUrl === undefined) throw new Error("the demo's control plane serves no public API");
      step.say(`  public (OpenAI) API ${publicUrl}   control ${cp.controlUrl}`);
      step.say("• starting an agent on a simulated node: 2 × h100-80g on fabric demo-ib");
      agent = await startAgent(
        parseAgentConfig({
          controlPlaneUrl: cp.controlUrl,
          joinToken: cp.joinToken,
          stateDir: path.join(root, "agent"),
          simulate: "2xh100-80g@demo-ib",
          nodeName: "demo-node",
          advertiseAddress: "127.0.0.1",
          stopEngines: true,
          probeIntervalMs: 250,
          engines: {
            simCommand: [...selfCommand(), "engine-sim"],
            ...(llamaServer ? { llamacppBinary: llamaServer } : {}),
          },
        }),
        {
          logger: logFile,
          probes: createEngineProbes(),
          baseEnv: { PATH: io.env.PATH ?? "/usr/bin:/bin", HOME: io.env.HOME ?? root },
          secretEnv: {},
          agentVersion: LLMGW_VERSION,
        },
      );
      const token = cp.adminToken;
      // The token as LLMGW_ADMIN_TOKEN would give it: `token` in the flags reads as --token.
      const admin = adminContext(
        { "control-plane": cp.controlUrl },
        { ...io, env: { ...io.env, LLMGW_ADMIN_TOKEN: token } },
      ).client;
      step.say("• deploying");
      await admin.applyDeployment({
        deployment: create(DeploymentSchema, {
          name: "sim-chat",
          model: "sim/llama-3-8b-instruct",
          servedModelName: SIM_MODEL,
          engine: Engine.SIM,
          gpuClass: "h100-80g",
          replicas: 2,
        }),
      });
      step.say(`  sim-chat: ${SIM_MODEL} on the simulated engine, 2 replicas × 1 h100-80g`);
      const names = ["sim-chat"];
      if (tinyModel) {
        await admin.applyDeployment({
          deployment: create(DeploymentSchema, {
            name: LLAMA_MODEL,
            model: tinyModel,
            engine: Engine.LLAMACPP,
            replicas: 1,
            gpusPerReplica: 0,
            maxModelLen: 2048,
          }),
        });
        step.say(`  ${LLAMA_MODEL}: a real llama.cpp server on CPU (tiny random-weight model)`);
        names.push(LLAMA_MODEL);
      }
      step.say("• waiting for replicas (placed → starting → loading → ready)");
      if (!(await waitReady(admin, names, timeoutMs, step, io.signal))) {
        return 1;
      }
      step.say("• creating an API key");
      const { secret } = await admin.createApiKey({ name: "demo" });
      step.say(`  ${secret}`);

      step.say(`• POST /v1/chat/completions model=${SIM_MODEL} (not streamed)`);
      const first = await chat(publicUrl, secret, SIM_MODEL, false, () => {});
      step.say(`  served by ${first.replica}: ${JSON.stringify(first.text.slice(0, 120))}`);
      if (tinyModel) {
        step.say(
          `• POST /v1/chat/completions model=${LLAMA_MODEL} (streamed, printed as it arrives)`,
        );
        io.stdout.write("  ");
        const second = await chat(publicUrl, secret, LLAMA_MODEL, true, (piece) =>
          io.stdout.write(piece.replace(/\s+/g, " ")),
        );
        io.stdout.write("\n");
        step.say(
          `  served by ${second.replica} (${second.text.length} characters; random weights, so gibberish)`,
        );
      }
      const metrics = await (await fetch(`${cp.controlUrl}/metrics`)).text();
      for (const family of ["llmgw_router_requests_total", "llmgw_gpu_memory_total_bytes"]) {
        if (!metrics.includes(family)) step.fail(`/metrics has no ${family}`);
      }
      const consoleUrl = cp.consoleUrl;
      if (consoleUrl === undefined) step.fail("the demo's control plane serves no web console");
      else {
        const page = await fetch(consoleUrl);
        const html = await page.text();
        if (!page.ok || !html.includes('<div id="app">'))
          step.fail(
            `the web console at ${consoleUrl} answered ${page.status}: ${html.slice(0, 200)}`,
          );
      }
      step.say(`
Your cluster is running. Try:

  open ${consoleUrl}   # the web console: log in with the admin token below

  curl ${publicUrl}/v1/chat/completions \\
    -H "Authorization: Bearer ${secret}" -H "Content-Type: application/json" \\
    -d '{"model":"${SIM_MODEL}","messages":[{"role":"user","content":"hi"}]}'

  # any OpenAI SDK
  import OpenAI from "openai";
  const client = new OpenAI({ baseURL: "${publicUrl}/v1", apiKey: "${secret}" });

  LLMGW_CONTROL_PLANE=${cp.controlUrl} LLMGW_ADMIN_TOKEN=${token} llmgw status
  curl ${cp.controlUrl}/metrics      # Prometheus: traffic and hardware
`);
      if (!step.ok) return 1;
      if (values["exit-after-check"]) {
        step.say("✓ every step worked");
        return 0;
      }
      step.say("Press Ctrl-C to stop everything.");
      await new Promise<void>((resolve) => {
        if (io.signal.aborted) resolve();
        io.signal.addEventListener("abort", () => resolve(), { once: true });
      });
      return 0;
    } catch (error) {
      step.fail((error as Error).message);
      return 1;
    } finally {
      step.say("• stopping the agent, its engines and the control plane");
      // The whole demo cluster goes: nothing to drain to.
      await agent?.close({ stopEngines: true, leaveTimeoutMs: 0 }).catch(() => {});
      await cp?.close().catch(() => {});
      rmSync(root, { recursive: true, force: true });
    }
  },
};
