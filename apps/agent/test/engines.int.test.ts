// The supervisor, readiness and engine adapters together against real engines: the simulated
// engine (`llmgw engine-sim`, from the built CLI) and the real `llama-server` with a generated
// tiny GGUF. Each replica is built the agent's way (deployment → buildLaunchSpec →
// ProcessSpec → createSupervisedReplica with the agent's probes, see engine-harness.ts), then:
// launch → ready through subscribe, the official openai client, /metrics → load signals,
// SIGKILL → restart with a new pid → ready, stop → empty process group, and a second
// supervisor adopting the engine a SIGKILLed previous supervisor (own process) left running.
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { ensureTinyModel, findLlamaServer } from "@llmgw/engine-sim";
import type { DeploymentSpecInput, NodeEngineConfig } from "@llmgw/engines";
import { createSupervisor, pidFilePath, type Supervisor } from "@llmgw/supervisor";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CLI_MAIN,
  type EngineHost,
  ensureCliBuilt,
  freePort,
  groupMembers,
  isAlive,
  type PreparedReplica,
  type PrepareReplicaInput,
  prepareReplica,
  scrapeLoad,
  startEngineHost,
  waitUntil,
} from "./engine-harness.js";

/** Load signals as the agent reports them. */
type Load = Awaited<ReturnType<typeof scrapeLoad>>;

/** One engine under test: how to deploy it and what its startup and metrics must show. */
interface EngineCase {
  readonly title: string;
  /** Why the case cannot run here (undefined = runs). */
  readonly skipReason: string | undefined;
  /** Deployment, node config and placement; called once in beforeAll. */
  setup(): Promise<{
    deployment: DeploymentSpecInput;
    nodeConfig: NodeEngineConfig;
    gpuIndices: readonly number[];
  }>;
  /** Extra body fields of every chat request (e.g. llama.cpp's ignore_eos). */
  readonly extraBody: Record<string, unknown>;
  /** Engine-specific checks of the first launch (argv pass-through, startup delay). */
  checkStartup(r: PreparedReplica): void;
  /** Checks the scraped load against the raw exposition text. */
  checkLoad(load: Load, raw: string): void;
}

/** Values of every sample of `name` (any labels) in Prometheus text, by a plain regex. */
function samples(raw: string, name: string): number[] {
  const escaped = name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const re = new RegExp(`^${escaped}(?:\\{[^}]*\\})? (\\S+)`, "gm");
  return [...raw.matchAll(re)].map((m) => Number(m[1]));
}

const maxOf = (xs: number[]): number | undefined => (xs.length ? Math.max(...xs) : undefined);
const sumOf = (xs: number[]): number => xs.reduce((a, b) => a + b, 0);

const LOAD_SECONDS = 1.5;
const cacheDir = process.env.LLMGW_CACHE_DIR || undefined;
const llamaServer = findLlamaServer({ cacheDir });

const CASES: readonly EngineCase[] = [
  {
    title: "the simulated engine (llmgw engine-sim, vLLM flavour)",
    skipReason: undefined,
    async setup() {
      ensureCliBuilt();
      return {
        deployment: {
          name: "sim-int",
          model: "meta-llama/Llama-3.1-8B-Instruct",
          engine: "sim",
          // Not owned by llmgw, so the sim adapter passes them through to the engine.
          extraArgs: ["--load-seconds", String(LOAD_SECONDS), "--time-scale", "20"],
        },
        nodeConfig: {
          simCommand: [process.execPath, CLI_MAIN, "engine-sim"],
          bindHost: "127.0.0.1",
        },
        gpuIndices: [0],
      };
    },
    extraBody: {},
    checkStartup(r) {
      const argv = r.launch.argv;
      expect(argv.slice(0, 3)).toEqual([process.execPath, CLI_MAIN, "engine-sim"]);
      expect(argv.join(" ")).toContain(`--load-seconds ${LOAD_SECONDS}`);
      expect(r.launch.env.CUDA_VISIBLE_DEVICES).toBe("0");
      // The port stays closed while "loading weights": the agent's probe sees `starting`
      // (connection refused) first, and ready comes no earlier than the load delay.
      const firstReady = r.outcomes.findIndex((o) => o.outcome === "ready");
      expect(r.outcomes.slice(0, firstReady).map((o) => o.outcome)).toContain("starting");
      const starting = r.transitions.find((t) => t.to === "starting");
      const ready = r.transitions.find((t) => t.to === "ready");
      expect(ready!.atMs - starting!.atMs).toBeGreaterThanOrEqual(LOAD_SECONDS * 1000 - 50);
      // The engine's own output reached the supervisor through its log file.
      const tail = r.replica.handle!.tail().join("\n");
      expect(tail).toMatch(/Loading weights took 1\.50 seconds/);
      expect(tail).toContain(`Starting vLLM API server 0 on http://127.0.0.1:${r.apiPort}`);
    },
    checkLoad(load, raw) {
      // vLLM names, as the sim renders them.
      expect(load.running).toBe(maxOf(samples(raw, "vllm:num_requests_running")));
      expect(load.waiting).toBe(maxOf(samples(raw, "vllm:num_requests_waiting")));
      expect(load.kvCacheUsage).toBe(maxOf(samples(raw, "vllm:kv_cache_usage_perc")));
      expect(load.running).toBe(0);
      expect(load.waiting).toBe(0);
      const queries = sumOf(samples(raw, "vllm:prefix_cache_queries_total"));
      const hits = sumOf(samples(raw, "vllm:prefix_cache_hits_total"));
      expect(queries).toBeGreaterThan(0);
      expect(load.prefixCacheHitRate).toBeCloseTo(hits / queries, 9);
      // The same long prompt was sent more than once: its blocks were cached.
      expect(load.prefixCacheHitRate).toBeGreaterThan(0);
    },
  },
  {
    title: `the real llama.cpp server with a tiny GGUF${
      llamaServer
        ? ""
        : " (skipped: llama-server is not built; run scripts/build-llamacpp.sh, CI builds it before tests)"
    }`,
    skipReason: llamaServer ? undefined : "llama-server is not built",
    async setup() {
      const model = await ensureTinyModel("tiny", { cacheDir });
      return {
        deployment: { name: "tiny", model, engine: "llamacpp", maxModelLen: 1024 },
        nodeConfig: {
          llamacppBinary: llamaServer!,
          llamacppThreads: 1,
          llamacppParallel: 2,
          bindHost: "127.0.0.1",
        },
        gpuIndices: [],
      };
    },
    // A random-weight model may pick end-of-generation at any point.
    extraBody: { ignore_eos: true, temperature: 0 },
    checkStartup(r) {
      expect(r.launch.argv[0]).toBe(llamaServer);
      expect(r.launch.argv).toContain("--metrics");
      expect(r.launch.argv).not.toContain("-ngl");
      expect(r.launch.env.CUDA_VISIBLE_DEVICES).toBe("");
      const firstReady = r.outcomes.findIndex((o) => o.outcome === "ready");
      for (const o of r.outcomes.slice(0, firstReady)) {
        expect(["starting", "loading"]).toContain(o.outcome);
      }
      const tail = r.replica.handle!.tail().join("\n");
      expect(tail).toMatch(/model loaded/);
      expect(tail).toContain(`listening on http://127.0.0.1:${r.apiPort}`);
    },
    checkLoad(load, raw) {
      expect(load.running).toBe(maxOf(samples(raw, "llamacpp:requests_processing")));
      expect(load.waiting).toBe(maxOf(samples(raw, "llamacpp:requests_deferred")));
      expect(load.running).toBe(0);
      expect(load.waiting).toBe(0);
      // Only older builds export the KV ratio; whatever this build reports is what we get.
      expect(load.kvCacheUsage).toBe(maxOf(samples(raw, "llamacpp:kv_cache_usage_ratio")));
      // llama.cpp exports no prefix-cache hit rate: absent, never 0.
      expect(load.prefixCacheHitRate).toBeUndefined();
      expect("prefixCacheHitRate" in load).toBe(false);
    },
  },
];

const LONG_PROMPT = `Summarise the following notes in one line. ${"The cluster routes requests by prefix. ".repeat(8)}`;

async function chatBothWays(
  baseUrl: string,
  model: string,
  extraBody: Record<string, unknown>,
  apiKey: string | undefined,
): Promise<void> {
  const client = new OpenAI({
    baseURL: `${baseUrl}/v1`,
    apiKey: apiKey ?? "unused",
    maxRetries: 0,
  });
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: LONG_PROMPT }],
    max_tokens: 8,
    ...extraBody,
  } as OpenAI.ChatCompletionCreateParamsNonStreaming);
  expect(r.object).toBe("chat.completion");
  expect(r.choices).toHaveLength(1);
  expect(r.choices[0]?.message.role).toBe("assistant");
  expect(typeof r.choices[0]?.message.content).toBe("string");
  expect(r.choices[0]?.finish_reason).toMatch(/^(stop|length)$/);
  expect(r.usage?.prompt_tokens).toBeGreaterThan(0);
  expect(r.usage?.completion_tokens).toBeGreaterThan(0);
  expect(r.usage?.completion_tokens).toBeLessThanOrEqual(8);

  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: LONG_PROMPT }],
    max_tokens: 8,
    stream: true,
    stream_options: { include_usage: true },
    ...extraBody,
  } as OpenAI.ChatCompletionCreateParamsStreaming);
  let text = "";
  let chunks = 0;
  let finish: string | null | undefined;
  let usage: OpenAI.CompletionUsage | null | undefined;
  for await (const chunk of stream) {
    chunks += 1;
    expect(chunk.object).toBe("chat.completion.chunk");
    text += chunk.choices[0]?.delta.content ?? "";
    finish = chunk.choices[0]?.finish_reason ?? finish;
    usage = chunk.usage ?? usage;
  }
  expect(chunks).toBeGreaterThan(2);
  expect(text.length).toBeGreaterThan(0);
  expect(finish).toMatch(/^(stop|length)$/);
  expect(usage?.completion_tokens).toBeGreaterThan(0);
}

for (const c of CASES) {
  describe.skipIf(c.skipReason !== undefined)(c.title, () => {
    let dir: string;
    let pidsDir: string;
    let supervisor: Supervisor;
    let input: PrepareReplicaInput;
    let first: PreparedReplica;
    let adopted: PreparedReplica | undefined;
    let host: EngineHost | undefined;
    const pgids = new Set<number>();
    let extraBody: Record<string, unknown>;

    beforeAll(async () => {
      dir = mkdtempSync(path.join(tmpdir(), "llmgw-engines-int-"));
      pidsDir = path.join(dir, "pids");
      supervisor = createSupervisor({ stateDir: pidsDir, logPollIntervalMs: 200 });
      const s = await c.setup();
      extraBody = c.extraBody;
      input = {
        supervisor,
        stateDir: dir,
        replicaId: `${s.deployment.name}-0`,
        deployment: s.deployment,
        nodeConfig: s.nodeConfig,
        simulate: "1xh100-80g",
        gpuIndices: s.gpuIndices,
        apiPort: await freePort(),
        probeIntervalMs: 200,
        probeTimeoutMs: 2000,
        loadingDeadlineMs: 30_000,
      };
      first = prepareReplica(input);
    });

    afterAll(async () => {
      for (const r of [first, adopted]) await r?.replica.stop().catch(() => undefined);
      host?.child.kill("SIGKILL");
      for (const pgid of pgids) {
        if (groupMembers(pgid).length === 0) continue;
        try {
          process.kill(-pgid, "SIGKILL");
        } catch {
          // gone meanwhile
        }
      }
      if (dir) rmSync(dir, { recursive: true, force: true });
    });

    it("launches the adapter's spec and goes starting → ready, seen through subscribe", async () => {
      await first.replica.start({ adopt: true }); // as the agent does: nothing to adopt here
      const pid = first.replica.handle!.pid;
      pgids.add(first.replica.handle!.pgid);
      expect(first.replica.handle!.adopted).toBe(false);
      await first.waitForState("ready", 30_000);
      const path = first.transitions.map((t) => t.to);
      expect(first.transitions[0]).toMatchObject({ from: "exited", to: "starting" });
      expect(path.at(-1)).toBe("ready");
      // Only forward steps of the loading sequence before the first ready.
      for (const s of path) expect(["starting", "loading", "ready"]).toContain(s);
      expect(first.replica.state).toBe("ready");
      expect(first.replica.handle!.pid).toBe(pid);
      c.checkStartup(first);
      // Output goes to the replica's log file under the agent's state dir, never a pipe; the
      // pid file describing the process is owner-only.
      expect(readFileSync(first.spec.logFile, "utf8").length).toBeGreaterThan(0);
      const pidFile = pidFilePath(pidsDir, input.replicaId);
      expect(statSync(pidFile).mode & 0o777).toBe(0o600);
      expect(JSON.parse(readFileSync(pidFile, "utf8"))).toMatchObject({
        pid,
        specHash: first.specHash,
      });
    }, 40_000);

    it("answers the official openai client, plain and streaming", async () => {
      const served = first.launch.readiness!.expectedModelId;
      await chatBothWays(first.baseUrl, served, extraBody, first.apiKey());
    }, 30_000);

    it("refuses callers without the engine's key, which never appears on its argv", async () => {
      const key = first.apiKey();
      expect(key).toMatch(/^llmgw-engine-[A-Za-z0-9_-]{43}$/);
      for (const authorization of [undefined, "Bearer llmgw-engine-wrong"]) {
        const res = await fetch(`${first.baseUrl}/v1/models`, {
          ...(authorization === undefined ? {} : { headers: { authorization } }),
        });
        expect(res.status).toBe(401);
        await res.arrayBuffer();
      }
      const pid = first.replica.handle!.pid;
      expect(readFileSync(`/proc/${pid}/cmdline`, "utf8")).not.toContain(key!);
      expect(readFileSync(`/proc/${pid}/environ`, "utf8")).toContain(
        `${first.launch.apiKeyEnv}=${key}`,
      );
    }, 20_000);

    it("reports /metrics as load signals, absent when the engine does not export them", async () => {
      const load = await scrapeLoad(first.metricsUrl, 5000, first.apiKey());
      const raw = await (
        await fetch(first.metricsUrl, { headers: { authorization: `Bearer ${first.apiKey()}` } })
      ).text();
      c.checkLoad(load, raw);
    }, 20_000);

    it("restarts the engine with a new pid after SIGKILL and becomes ready again", async () => {
      const old = first.replica.handle!.pid;
      const oldKey = first.apiKey();
      const from = first.transitions.length;
      process.kill(old, "SIGKILL");
      const exited = await first.waitForState("exited", 15_000, from);
      expect(exited.from).toBe("ready");
      expect(exited.reason).toMatch(/signal=SIGKILL/);
      const ready = await first.waitForState("ready", 40_000, from);
      expect(ready.from).toMatch(/^(starting|loading)$/);
      const restarted = first.transitions.slice(from).find((t) => t.to === "starting");
      expect(restarted?.reason).toMatch(/^restart after 1 quick failure/);
      const now = first.replica.handle!.pid;
      pgids.add(first.replica.handle!.pgid);
      expect(now).not.toBe(old);
      expect(isAlive(old)).toBe(false);
      expect(first.replica.handle!.adopted).toBe(false);
      // The key rotated with the process: the old one no longer opens the engine.
      expect(first.apiKey()).not.toBe(oldKey);
      const stale = await fetch(`${first.baseUrl}/v1/models`, {
        headers: { authorization: `Bearer ${oldKey}` },
      });
      expect(stale.status).toBe(401);
      await stale.arrayBuffer();
      await chatBothWays(
        first.baseUrl,
        first.launch.readiness!.expectedModelId,
        extraBody,
        first.apiKey(),
      );
    }, 60_000);

    it("stops the whole process group and removes the pid file", async () => {
      const pgid = first.replica.handle!.pgid;
      expect(groupMembers(pgid).length).toBeGreaterThan(0);
      const report = await first.replica.stop();
      expect(report).toMatchObject({ forced: false, timedOut: false });
      expect(first.replica.state).toBe("exited");
      expect(groupMembers(pgid)).toEqual([]);
      expect(existsSync(pidFilePath(pidsDir, input.replicaId))).toBe(false);
    }, 30_000);

    it("a second supervisor adopts the engine a SIGKILLed supervisor left (same pid), then stops its group", async () => {
      // A previous agent launches the same ProcessSpec from its own process and dies.
      // With its own key, which the next agent knows from the replica record.
      const hostKey = "llmgw-engine-left-by-the-previous-agent";
      host = await startEngineHost(
        pidsDir,
        input.replicaId,
        { ...first.spec, env: { ...first.spec.env, [first.launch.apiKeyEnv!]: hostKey } },
        30_000,
      );
      pgids.add(host.pgid);
      expect(host.pgid).toBe(host.pid);
      host.child.kill("SIGKILL");
      await host.exited;
      expect(isAlive(host.pid)).toBe(true);

      const second = createSupervisor({ stateDir: pidsDir, logPollIntervalMs: 200 });
      adopted = prepareReplica({ ...input, supervisor: second, adoptedApiKey: hostKey });
      expect(adopted.specHash).toBe(first.specHash);
      await adopted.replica.start({ adopt: true });
      expect(adopted.replica.handle?.adopted).toBe(true);
      expect(adopted.replica.handle?.pid).toBe(host.pid);
      expect(adopted.transitions[0]).toMatchObject({
        from: "exited",
        to: "starting",
        reason: "adopted a running process",
      });
      await adopted.waitForState("ready", 30_000);
      expect(adopted.replica.handle?.pid).toBe(host.pid); // not relaunched
      expect(adopted.apiKey()).toBe(hostKey);
      await chatBothWays(
        adopted.baseUrl,
        adopted.launch.readiness!.expectedModelId,
        extraBody,
        hostKey,
      );

      const report = await adopted.replica.stop();
      expect(report?.timedOut).toBe(false);
      await waitUntil(
        "the adopted group to be empty",
        () => groupMembers(host!.pgid).length === 0,
        5000,
      );
      expect(isAlive(host.pid)).toBe(false);
      expect(existsSync(pidFilePath(pidsDir, input.replicaId))).toBe(false);
    }, 60_000);
  });
}

describe("the simulated engine failing through the same path", () => {
  let dir: string;
  let supervisor: Supervisor;
  const prepared: PreparedReplica[] = [];

  beforeAll(() => {
    ensureCliBuilt();
    dir = mkdtempSync(path.join(tmpdir(), "llmgw-engines-fail-"));
    supervisor = createSupervisor({ stateDir: path.join(dir, "pids"), logPollIntervalMs: 200 });
  });

  afterAll(async () => {
    for (const r of prepared) await r.replica.stop().catch(() => undefined);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const simReplica = async (
    name: string,
    extraArgs: string[],
    more: Partial<PrepareReplicaInput> = {},
  ): Promise<PreparedReplica> => {
    const r = prepareReplica({
      supervisor,
      stateDir: dir,
      replicaId: `${name}-0`,
      deployment: { name, model: "meta-llama/Llama-3.1-8B-Instruct", engine: "sim", extraArgs },
      nodeConfig: { simCommand: [process.execPath, CLI_MAIN, "engine-sim"], bindHost: "127.0.0.1" },
      simulate: "1xh100-80g",
      gpuIndices: [0],
      apiPort: await freePort(),
      probeIntervalMs: 200,
      probeTimeoutMs: 2000,
      loadingDeadlineMs: 30_000,
      ...more,
    });
    prepared.push(r);
    return r;
  };

  it("an engine still loading past the deployment's deadline is stopped and failed with its log tail", async () => {
    const r = await simReplica("sim-slow", ["--load-seconds", "120"], { loadingDeadlineMs: 2500 });
    await r.replica.start({ adopt: true });
    const pgid = r.replica.handle!.pgid;
    const failed = await r.waitForState("failed", 20_000);
    // engine-sim defers SIGTERM until its simulated load ends, so this stop is the forced
    // one (SIGKILL to the group after the sim adapter's 5 s grace).
    expect(r.transitions.map((t) => t.to)).toEqual(["starting", "stopping", "failed"]);
    expect(r.transitions.find((t) => t.to === "stopping")?.reason).toMatch(
      /not ready within the loading deadline of 2500 ms/,
    );
    expect(r.transitions.some((t) => t.to === "ready")).toBe(false);
    expect(r.outcomes.length).toBeGreaterThan(0);
    expect(new Set(r.outcomes.map((o) => o.outcome))).toEqual(new Set(["starting"]));
    expect(failed.tail?.join("\n")).toMatch(
      /Loading weights for meta-llama\/Llama-3\.1-8B-Instruct/,
    );
    expect(r.replica.failure?.reason).toMatch(/loading deadline/);
    expect(groupMembers(pgid)).toEqual([]);
  }, 30_000);

  it("an engine that fails every load ends failed with its last lines once the restart policy gives up", async () => {
    const r = await simReplica("sim-oom", ["--fail-load"], {
      restartPolicy: { initialDelayMs: 100, maxQuickFailures: 2 },
    });
    await r.replica.start({ adopt: true });
    const failed = await r.waitForState("failed", 30_000);
    const launches = r.transitions.filter((t) => t.to === "starting");
    expect(launches.map((t) => t.reason)).toEqual([
      "start requested",
      "restart after 1 quick failure(s)",
    ]);
    expect(failed.reason).toMatch(/^restart policy gave up: 2 consecutive runs/);
    expect(failed.tail?.join("\n")).toMatch(/torch\.OutOfMemoryError: CUDA out of memory/);
    expect(r.replica.history).toHaveLength(2);
    expect(r.replica.handle).toBeUndefined();
  }, 40_000);
});
