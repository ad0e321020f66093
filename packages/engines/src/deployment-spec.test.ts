import { NCCL_ENV_KEYS } from "@llmgw/nccl-env";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { IB_FABRIC, ibH100Node } from "../test/fixtures/inventories.js";
import { buildLaunchSpec } from "./build-launch-spec.js";
import {
  deploymentGpusPerReplica,
  ENGINES,
  type EngineName,
  OWNED_ENV,
  OWNED_FLAGS,
  ownedFlagIn,
  parseDeploymentSpec,
  parseDeploymentSpecOrThrow,
} from "./deployment-spec.js";
import { ENGINE_API_KEY_ENV_NAMES, SECRET_ENV_NAMES } from "./launch-spec.js";

const base = { name: "llama-8b", model: "meta-llama/Llama-3.1-8B-Instruct", engine: "vllm" };

describe("OWNED_ENV", () => {
  it("covers every NCCL/Gloo variable nccl-env may set and every secret", () => {
    for (const key of [...NCCL_ENV_KEYS, ...SECRET_ENV_NAMES]) expect(OWNED_ENV).toContain(key);
  });

  it.each(ENGINE_API_KEY_ENV_NAMES)(
    "refuses %s: a deployment cannot set an engine's API key",
    (key) => {
      expect(parseDeploymentSpec({ ...base, env: { [key]: "chosen-by-the-deployer" } }).ok).toBe(
        false,
      );
    },
  );

  it.each([
    ["vllm", "--api-key"],
    ["sglang", "--api-key"],
    ["llamacpp", "--api-key"],
    ["llamacpp", "--api-key-file"],
  ])("refuses %s extraArgs %s: the router holds the engine's only key", (engine, flag) => {
    const model = engine === "llamacpp" ? "/models/m.gguf" : base.model;
    expect(parseDeploymentSpec({ ...base, engine, model, extraArgs: [flag, "x"] }).ok).toBe(false);
  });
});

describe("parseDeploymentSpec", () => {
  it("fills the proto's implicit defaults", () => {
    expect(parseDeploymentSpecOrThrow(base)).toEqual({
      ...base,
      servedModelName: "llama-8b",
      tensorParallel: 1,
      pipelineParallel: 1,
      replicas: 1,
      extraArgs: [],
      env: {},
      routingPolicy: "llmgw",
      priority: 0,
      allowPreemption: false,
      revision: 0,
      trustRemoteCode: false,
      kvEvents: false,
    });
  });

  it("refuses kvEvents for an engine that publishes none", () => {
    expect(() =>
      parseDeploymentSpecOrThrow({ ...base, engine: "llamacpp", kvEvents: true }),
    ).toThrow(
      /kvEvents needs an engine that publishes KV-cache events \(vllm, sglang, sim\); llamacpp does not/,
    );
    expect(parseDeploymentSpecOrThrow({ ...base, kvEvents: true }).kvEvents).toBe(true);
  });

  it("takes protobuf-JSON uint64 strings and an empty gpuClass as unset", () => {
    const spec = parseDeploymentSpecOrThrow({
      ...base,
      modelSizeBytes: "16060522496",
      revision: "7",
      gpuClass: "",
    });
    expect([spec.modelSizeBytes, spec.revision, spec.gpuClass]).toEqual([
      16060522496,
      7,
      undefined,
    ]);
  });

  it.each([
    ["/models/Qwen3-8B-FP8", true],
    ["Qwen/Qwen2.5-0.5B-Instruct", true],
    ["/var/cache/llmgw/models/tiny-25m.Q8_0.gguf", true],
    ["hf.co/org/model:main", true],
    ["-m", false],
    ["--trust-remote-code", false],
    ["model with space", false],
    ["model;rm -rf /", false],
    ["$(id)", false],
    ["model\nINFO fake log line", false],
    ["", false],
  ])("model %j is accepted: %s", (model, ok) => {
    expect(parseDeploymentSpec({ ...base, model }).ok).toBe(ok);
  });

  it.each([
    { engine: "vllm", arg: "--max-num-seqs", owned: undefined },
    { engine: "vllm", arg: "16", owned: undefined },
    { engine: "vllm", arg: "-1", owned: undefined },
    { engine: "vllm", arg: "--enable-prefix-caching", owned: undefined },
    { engine: "vllm", arg: "--quantization-param-path=/x", owned: undefined },
    { engine: "vllm", arg: "--port", owned: "--port" },
    { engine: "vllm", arg: "--port=9", owned: "--port" },
    { engine: "vllm", arg: "--tensor_parallel_size=4", owned: "--tensor-parallel-size" },
    { engine: "vllm", arg: "--tensor-par", owned: "--tensor-parallel-size" },
    { engine: "vllm", arg: "-tp", owned: "-tp" },
    { engine: "vllm", arg: "-tp8", owned: "-tp" },
    { engine: "vllm", arg: "-q=fp8", owned: "-q" },
    { engine: "vllm", arg: "--headless", owned: "--headless" },
    { engine: "vllm", arg: "--master-addr=1.2.3.4", owned: "--master-addr" },
    { engine: "sglang", arg: "--tp", owned: "--tp-size" },
    { engine: "sglang", arg: "--dist-init-addr", owned: "--dist-init-addr" },
    { engine: "sglang", arg: "--nccl-init-addr=h:1", owned: "--nccl-init-addr" },
    { engine: "sglang", arg: "--base-gpu-id", owned: "--base-gpu-id" },
    { engine: "sglang", arg: "--schedule-policy", owned: undefined },
    { engine: "vllm", arg: "--tokenizer=x", owned: "--tokenizer" },
    { engine: "vllm", arg: "--hf-config-path=x", owned: "--hf-config-path" },
    { engine: "vllm", arg: "--lora-modules=x", owned: "--lora-modules" },
    { engine: "vllm", arg: "--speculative-config=x", owned: "--speculative-config" },
    { engine: "vllm", arg: "--generation-config=x", owned: "--generation-config" },
    { engine: "vllm", arg: "--model-loader-extra-config=x", owned: "--model-loader-extra-config" },
    { engine: "vllm", arg: "--chat-template=x", owned: "--chat-template" },
    { engine: "vllm", arg: "--reasoning-parser-plugin=x", owned: "--reasoning-parser-plugin" },
    { engine: "vllm", arg: "--worker-cls=x", owned: "--worker-cls" },
    { engine: "vllm", arg: "--kv-transfer-config=x", owned: "--kv-transfer-config" },
    { engine: "vllm", arg: "--ec-transfer-config=x", owned: "--ec-transfer-config" },
    { engine: "vllm", arg: "--log-config-file=x", owned: "--log-config-file" },
    { engine: "vllm", arg: "--compilation-config=x", owned: "--compilation-config" },
    { engine: "vllm", arg: "--profiler-config=x", owned: "--profiler-config" },
    { engine: "vllm", arg: "--tool-server=x", owned: "--tool-server" },
    { engine: "vllm", arg: "--otlp-traces-endpoint=x", owned: "--otlp-traces-endpoint" },
    { engine: "vllm", arg: "--download-dir=x", owned: "--download-dir" },
    { engine: "vllm", arg: "-cc", owned: "-cc" },
    // vLLM reads `--json-flag.key value` as `--json-flag '{"key": value}'`.
    {
      engine: "vllm",
      arg: "--kv-transfer-config.kv_connector_module_path=m",
      owned: "--kv-transfer-config",
    },
    { engine: "vllm", arg: "--kv-transfer.kv_connector=x", owned: "--kv-transfer-config" },
    { engine: "vllm", arg: "--speculative-config.model", owned: "--speculative-config" },
    { engine: "vllm", arg: "--compilation-config.cache_dir=/x", owned: "--compilation-config" },
    { engine: "vllm", arg: "--kv-events-config.endpoint=tcp://h:1", owned: "--kv-events-config" },
    { engine: "vllm", arg: "-cc.cache_dir=/x", owned: "-cc" },
    { engine: "vllm", arg: "--override-generation-config.temperature=0.5", owned: undefined },
    { engine: "vllm", arg: "--tokenizer-mode", owned: undefined },
    { engine: "vllm", arg: "--chat-template-content-format", owned: undefined },
    { engine: "vllm", arg: "--revision", owned: undefined },
    { engine: "sglang", arg: "--tokenizer-path", owned: "--tokenizer-path" },
    { engine: "sglang", arg: "--lora-paths", owned: "--lora-paths" },
    {
      engine: "sglang",
      arg: "--speculative-draft-model-path",
      owned: "--speculative-draft-model-path",
    },
    { engine: "sglang", arg: "--speculative-token-map", owned: "--speculative-token-map" },
    { engine: "sglang", arg: "--chat-template", owned: "--chat-template" },
    { engine: "sglang", arg: "--completion-template", owned: "--completion-template" },
    { engine: "sglang", arg: "--model-loader-extra-config", owned: "--model-loader-extra-config" },
    {
      engine: "sglang",
      arg: "--remote-instance-weight-loader-seed-instance-ip",
      owned: "--remote-instance-weight-loader-seed-instance-ip",
    },
    { engine: "sglang", arg: "--decrypted-config-file", owned: "--decrypted-config-file" },
    {
      engine: "sglang",
      arg: "--decrypted-draft-config-file",
      owned: "--decrypted-draft-config-file",
    },
    {
      engine: "sglang",
      arg: "--modelopt-checkpoint-restore-path",
      owned: "--modelopt-checkpoint-restore-path",
    },
    { engine: "sglang", arg: "--init-expert-location", owned: "--init-expert-location" },
    {
      engine: "sglang",
      arg: "--enable-custom-logit-processor",
      owned: "--enable-custom-logit-processor",
    },
    {
      engine: "sglang",
      arg: "--enable-priority-scheduling",
      owned: "--enable-priority-scheduling",
    },
    { engine: "sglang", arg: "--custom-weight-loader", owned: "--custom-weight-loader" },
    {
      engine: "sglang",
      arg: "--hicache-storage-backend-extra-config",
      owned: "--hicache-storage-backend-extra-config",
    },
    { engine: "sglang", arg: "--file-storage-path", owned: "--file-storage-path" },
    { engine: "sglang", arg: "--crash-dump-folder", owned: "--crash-dump-folder" },
    {
      engine: "sglang",
      arg: "--debug-tensor-dump-output-folder",
      owned: "--debug-tensor-dump-output-folder",
    },
    {
      engine: "sglang",
      arg: "--debug-tensor-dump-input-file",
      owned: "--debug-tensor-dump-input-file",
    },
    {
      engine: "sglang",
      arg: "--export-metrics-to-file-dir",
      owned: "--export-metrics-to-file-dir",
    },
    {
      engine: "sglang",
      arg: "--modelopt-checkpoint-save-path",
      owned: "--modelopt-checkpoint-save-path",
    },
    { engine: "sglang", arg: "--modelopt-export-path", owned: "--modelopt-export-path" },
    { engine: "sglang", arg: "--tool-server", owned: "--tool-server" },
    { engine: "sglang", arg: "--otlp-traces-endpoint", owned: "--otlp-traces-endpoint" },
    { engine: "sglang", arg: "--ssl-ca-certs", owned: "--ssl-ca-certs" },
    { engine: "sglang", arg: "--admin-api-key", owned: "--admin-api-key" },
    {
      engine: "sglang",
      arg: "--enable_custom_logit_processor",
      owned: "--enable-custom-logit-processor",
    },
    { engine: "sglang", arg: "--tokenizer-mode", owned: undefined },
    { engine: "llamacpp", arg: "-ngl", owned: "-ngl" },
    { engine: "llamacpp", arg: "--ctx-size=9", owned: "--ctx-size" },
    { engine: "llamacpp", arg: "-m", owned: "-m" },
    { engine: "llamacpp", arg: "--flash-attn", owned: undefined },
    { engine: "llamacpp", arg: "-c=4096", owned: "-c" },
    { engine: "llamacpp", arg: "-t", owned: "-t" },
    { engine: "llamacpp", arg: "-ctk", owned: undefined },
    { engine: "llamacpp", arg: "-tb", owned: undefined },
    { engine: "sim", arg: "--node-rank=3", owned: "--node-rank" },
    { engine: "sim", arg: "--load-seconds", owned: undefined },
  ] as const)("$engine extra arg $arg sets owned flag $owned", (c) => {
    expect(ownedFlagIn(c.engine, c.arg)).toBe(c.owned);
  });

  // vLLM's other short spellings of owned flags (vllm/engine/arg_utils.py: `--speculative-config
  // -sc`, `--nnodes -n`, `--node-rank -r`, and `--compilation-config -O` up to 0.11, whose
  // dotted form `-O.key v` FlexibleArgumentParser still builds), argparse's expansion of a
  // single-dash prefix (`-c` → `-cc`, `-s` → `-sc`), and flags that import Python by name: a
  // request body's logits processors (`--logits-processor-pattern`, then `qualname`, `args` and
  // `kwargs` are the caller's), the scheduler class, LoRA weights by path.
  it.each([
    { arg: "-sc", owned: "-sc" },
    { arg: "-sc=x", owned: "-sc" },
    { arg: "-sc.model", owned: "-sc" },
    { arg: "-s", owned: "-sc" },
    { arg: "-s.model", owned: "-sc" },
    { arg: "-c", owned: "-cc" },
    { arg: "-t", owned: "-tp" },
    { arg: "-n", owned: "-n" },
    { arg: "-n2", owned: "-n" },
    { arg: "-r=1", owned: "-r" },
    { arg: "-O", owned: "-O" },
    { arg: "-O.inductor_passes.x=y", owned: "-O" },
    { arg: "--logits-processor-pattern", owned: "--logits-processor-pattern" },
    { arg: "--logits_processor_pattern=.*", owned: "--logits-processor-pattern" },
    { arg: "--scheduler-cls=mod.Cls", owned: "--scheduler-cls" },
    { arg: "--default-mm-loras.audio", owned: "--default-mm-loras" },
    { arg: "--qlora-adapter-name-or-path", owned: "--qlora-adapter-name-or-path" },
    // Free: attention config, expert parallelism, a negative number, a lone "-".
    { arg: "-ac", owned: undefined },
    { arg: "-ep", owned: undefined },
    { arg: "-0.5", owned: undefined },
    { arg: "-", owned: undefined },
  ] as const)("vllm extra arg $arg sets owned flag $owned", (c) => {
    expect(ownedFlagIn("vllm", c.arg)).toBe(c.owned);
    expect(parseDeploymentSpec({ ...base, extraArgs: [c.arg] }).ok).toBe(c.owned === undefined);
  });

  it("reports every bad field, naming it and echoing the value", () => {
    const result = parseDeploymentSpec({
      name: "Llama_8B",
      model: "-x",
      engine: "vllm",
      tensorParallel: 0,
      extraArgs: ["--max-num-seqs", "8", "--host=1.2.3.4", "ok\u0000"],
      env: {
        HF_TOKEN: "hf_secret",
        lower: "x",
        CUDA_VISIBLE_DEVICES: "0",
        NCCL_DEBUG: "INFO",
        LLMGW_X: "1",
      },
      extra: true,
    });
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.error.code).toBe("LLMGW_ENGINES_INVALID_SPEC");
    expect(result.error.issues.map((i) => [i.field, i.value])).toEqual([
      ["name", "Llama_8B"],
      ["model", "-x"],
      ["tensorParallel", 0],
      ["extraArgs[3]", "ok\u0000"],
      ["extra", true],
      ["extraArgs[2]", "--host=…"],
      ["env.HF_TOKEN", undefined],
      ["env.lower", undefined],
      ["env.CUDA_VISIBLE_DEVICES", undefined],
      ["env.LLMGW_X", undefined],
    ]);
    expect(result.error.message).toContain("name: name must be a DNS label");
  });

  it("bounds env: at most 256 variables, each name at most 256 characters", () => {
    const many = Object.fromEntries(Array.from({ length: 257 }, (_, i) => [`OMP_${i}`, "1"]));
    const tooMany = parseDeploymentSpec({ ...base, env: many });
    expect(tooMany.ok ? [] : tooMany.error.issues).toEqual([
      { field: "env", message: "env may set at most 256 variables" },
    ]);
    const long = `A${"B".repeat(256)}`;
    const longName = parseDeploymentSpec({ ...base, env: { [long]: "1" } });
    expect(longName.ok ? [] : longName.error.issues).toEqual([
      { field: `env.${long}`, message: "env key must be at most 256 characters" },
    ]);
    expect(parseDeploymentSpec({ ...base, env: { [long.slice(0, 256)]: "1" } }).ok).toBe(true);
  });

  it("checks extra args and env once the shape is right", () => {
    const result = parseDeploymentSpec({
      ...base,
      extraArgs: ["--max-num-seqs", "8", "--host=1.2.3.4"],
      env: {
        HF_TOKEN: "hf_secret",
        lower: "x",
        CUDA_VISIBLE_DEVICES: "0",
        NCCL_DEBUG: "INFO",
        LLMGW_X: "1",
        A: "x\ny",
      },
    });
    expect(result.ok ? [] : result.error.issues).toEqual([
      {
        field: "extraArgs[2]",
        value: "--host=…",
        message: '"--host=…" would set --host, which llmgw owns for vllm',
      },
      {
        field: "env.HF_TOKEN",
        message: expect.stringContaining("agent's environment file"),
      },
      { field: "env.lower", message: "env key must match ^[A-Z_][A-Z0-9_]*$" },
      {
        field: "env.CUDA_VISIBLE_DEVICES",
        message: expect.stringContaining("is set by llmgw"),
      },
      { field: "env.LLMGW_X", message: expect.stringContaining("is set by llmgw") },
      { field: "env.A", message: "env value must not contain control characters" },
    ]);
  });

  it.each([
    { env: { HUGGING_FACE_HUB_TOKEN: "Zq8vLw2RkT9mN4xP7cY1" } },
    { env: { VLLM_API_KEY: "Zq8vLw2RkT9mN4xP7cY1" } },
    { env: { NCCL_DEBUG: "Zq8vLw2RkT9mN4xP7cY1\n" } },
    { extraArgs: ["--api-key=Zq8vLw2RkT9mN4xP7cY1"] },
    { extraArgs: ["--hf-token", "Zq8vLw2RkT9mN4xP7cY1"] },
  ])("refuses %j without repeating what may be a key", (fields) => {
    // The refusal reaches the agent's log, the replica's status and the control plane's answer;
    // the redactor knows hf_/sk- shapes, not every key.
    const result = parseDeploymentSpec({ ...base, ...fields });
    expect(result.ok).toBe(false);
    if (result.ok) return;
    expect(result.error.message).toMatch(/(env\.[A-Z_]+|extraArgs\[0\]): /);
    expect(JSON.stringify(result.error.issues)).not.toContain("Zq8vLw2RkT9mN4xP7cY1");
    expect(result.error.message).not.toContain("Zq8vLw2RkT9mN4xP7cY1");
  });

  it.each([
    { name: "a".repeat(63), ok: true },
    { name: "a".repeat(64), ok: false },
    { name: "-a", ok: false },
    { name: "a-", ok: false },
    { name: "a-b-0", ok: true },
  ])("name $name ok=$ok", ({ name, ok }) => {
    expect(parseDeploymentSpec({ ...base, name }).ok).toBe(ok);
  });

  it.each([
    { spec: { engine: "vllm", tensorParallel: 8, pipelineParallel: 2 }, gpus: 16 },
    { spec: { engine: "sim", tensorParallel: 4 }, gpus: 4 },
    { spec: { engine: "llamacpp" }, gpus: 0 },
    { spec: { engine: "llamacpp", gpusPerReplica: 1 }, gpus: 1 },
  ])("deploymentGpusPerReplica($spec) = $gpus", (c) => {
    expect(deploymentGpusPerReplica(parseDeploymentSpecOrThrow({ ...base, ...c.spec }))).toBe(
      c.gpus,
    );
  });

  it("refuses gpusPerReplica that contradicts TP × PP, and llama.cpp TP", () => {
    const r1 = parseDeploymentSpec({ ...base, tensorParallel: 2, gpusPerReplica: 3 });
    const r2 = parseDeploymentSpec({ ...base, engine: "llamacpp", tensorParallel: 2 });
    expect(r1.ok ? undefined : r1.error.issues[0]?.field).toBe("gpusPerReplica");
    expect(r2.ok ? undefined : r2.error.issues[0]?.field).toBe("tensorParallel");
  });
});

// Every flag llmgw itself emits, per engine: anything else starting with "-" in llmgw's part of
// argv would be a user string in flag position.
const EMITTED: Record<EngineName, ReadonlySet<string>> = {
  vllm: new Set(OWNED_FLAGS.vllm),
  sglang: new Set(OWNED_FLAGS.sglang),
  llamacpp: new Set(["-m", "--host", "--port", "--alias", "-c", "-np", "-t", "--metrics", "-ngl"]),
  sim: new Set(OWNED_FLAGS.sim),
};

describe('parseDeploymentSpec with policy: "report"', () => {
  it("parses a spec whose only problems are policy ones, and returns them as refused", () => {
    // What an older release accepted before -O and env bounds were owned.
    const many = Object.fromEntries(Array.from({ length: 300 }, (_, i) => [`OMP_${i}`, "1"]));
    const input = { ...base, extraArgs: ["-O3", "--max-num-seqs", "8"], env: many };
    const strict = parseDeploymentSpec(input);
    expect(strict.ok).toBe(false);
    const stored = parseDeploymentSpec(input, { policy: "report" });
    expect(stored.ok).toBe(true);
    if (!stored.ok) return;
    expect(stored.spec.extraArgs).toEqual(["-O3", "--max-num-seqs", "8"]);
    expect(stored.spec.servedModelName).toBe("llama-8b");
    expect(stored.refused?.code).toBe("LLMGW_ENGINES_INVALID_SPEC");
    expect(stored.refused?.issues).toEqual([
      {
        field: "extraArgs[0]",
        value: "-O3",
        message: '"-O3" would set -O, which llmgw owns for vllm',
      },
      { field: "env", message: "env may set at most 256 variables" },
    ]);
    expect(stored.refused?.message).toBe(strict.ok ? "" : strict.error.message);
  });

  it("reports refused env names and leaves a clean spec unmarked", () => {
    const stored = parseDeploymentSpec(
      { ...base, env: { LD_PRELOAD: "/x.so", lower: "1" } },
      { policy: "report" },
    );
    expect(stored.ok && stored.refused?.issues.map((i) => i.field)).toEqual([
      "env.LD_PRELOAD",
      "env.lower",
    ]);
    const clean = parseDeploymentSpec(base, { policy: "report" });
    expect(clean.ok && clean.refused).toBeUndefined();
  });

  it("still fails a spec with anything else wrong, listing every issue", () => {
    for (const bad of [
      { ...base, extraArgs: ["-O3"], replicas: -1 },
      { ...base, extraArgs: ["-O3"], typo: 1 },
      { ...base, engine: "llamacpp", tensorParallel: 2 },
      { ...base, env: { A: "x\ny" } },
    ]) {
      const stored = parseDeploymentSpec(bad, { policy: "report" });
      const strict = parseDeploymentSpec(bad);
      expect(stored.ok).toBe(false);
      expect(stored.ok ? "" : stored.error.message).toBe(strict.ok ? "" : strict.error.message);
    }
  });
});

describe("property: no unvalidated user string in flag position", () => {
  const userString = fc.oneof(
    fc.string({ maxLength: 24 }),
    fc.constantFrom(
      "--port",
      "--port=1",
      "-tp8",
      "--tensor_parallel_size",
      "--host",
      "-m",
      "--tp",
      "--headless",
      "-ngl",
      "--hos",
    ),
    fc.stringMatching(/^-{1,2}[a-z_-]{1,20}(=[0-9]{1,3})?$/),
  );
  it("argv (single and multi-node ranks) = command, llmgw flags with user values only in value slots, then extra args none of which set an owned flag", () => {
    fc.assert(
      fc.property(
        fc.record({
          engine: fc.constantFrom(...ENGINES),
          model: userString,
          servedModelName: userString,
          quantization: userString,
          dtype: userString,
          extraArgs: fc.array(userString, { maxLength: 6 }),
        }),
        fc.constantFrom(0, 1),
        (raw, rank) => {
          const parsed = parseDeploymentSpec({
            name: "m",
            ...raw,
            ...(raw.engine === "llamacpp" ? { quantization: undefined, dtype: undefined } : {}),
          });
          if (!parsed.ok) return;
          const spec = parsed.spec;
          const ls = buildLaunchSpec({
            deployment: spec,
            placement:
              spec.engine === "llamacpp"
                ? { rank: 0, nnodes: 1, gpuIndices: [] }
                : {
                    rank,
                    nnodes: 2,
                    rank0Address: "10.0.0.1",
                    rendezvousPort: 29501,
                    fabricId: IB_FABRIC,
                    gpuIndices: [0],
                  },
            ports: { api: 8000 },
            node: ibH100Node("n", "10.0.0.1"),
          });
          const commandLength = { vllm: 2, sglang: 3, llamacpp: 1, sim: 2 }[spec.engine];
          const own = ls.argv.slice(commandLength, ls.argv.length - spec.extraArgs.length);
          const extra = ls.argv.slice(ls.argv.length - spec.extraArgs.length);
          expect(extra).toEqual(spec.extraArgs);
          for (const token of own) {
            if (token.startsWith("-")) expect(EMITTED[spec.engine].has(token), token).toBe(true);
          }
          for (const value of [spec.model, spec.servedModelName, spec.quantization, spec.dtype]) {
            if (value !== undefined) expect(value.startsWith("-")).toBe(false);
          }
          for (const token of extra) expect(ownedFlagIn(spec.engine, token)).toBeUndefined();
        },
      ),
      { numRuns: 500 },
    );
  });
});
