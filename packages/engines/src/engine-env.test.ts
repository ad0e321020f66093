import { NCCL_ENV_KEYS } from "@llmgw/nccl-env";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { IB_FABRIC, ibH100Node } from "../test/fixtures/inventories.js";
import { buildLaunchSpec } from "./build-launch-spec.js";
import {
  type DeploymentSpec,
  ENGINES,
  engineEnvRefusal,
  OWNED_ENV,
  parseDeploymentSpec,
  parseDeploymentSpecOrThrow,
} from "./deployment-spec.js";
import {
  ENGINE_ENV_ALLOWED,
  ENGINE_ENV_NEVER_ALLOWED,
  ENGINE_ENV_NEVER_ALLOWED_PATTERNS,
} from "./engine-env.js";
import { isEnginesError } from "./errors.js";
import type { NodeEngineConfig } from "./launch-spec.js";

const base = { name: "m", model: "meta-llama/Llama-3.1-8B-Instruct", engine: "vllm" } as const;
const node = ibH100Node("gpu-a", "10.0.0.1");

function build(deployment: DeploymentSpec, nodeConfig: NodeEngineConfig = {}) {
  return buildLaunchSpec({
    deployment,
    placement: { rank: 0, nnodes: 1, gpuIndices: [0] },
    ports: { api: 8000 },
    node,
    nodeConfig,
  });
}

function launchError(run: () => unknown): { code: string; message: string } | undefined {
  try {
    run();
    return undefined;
  } catch (error) {
    if (!isEnginesError(error)) throw error;
    return { code: error.code, message: error.message };
  }
}

describe("deployment env: what no node may allow", () => {
  it.each([
    ["PATH", "chooses which executables or configuration files the engine runs"],
    ["HOME", "chooses which executables or configuration files the engine runs"],
    ["LD_PRELOAD", "makes the engine load code"],
    ["LD_LIBRARY_PATH", "makes the engine load code"],
    ["PYTHONPATH", "makes the engine load code"],
    ["PYTHONSTARTUP", "makes the engine load code"],
    ["PYTHONWARNINGS", "makes the engine load code"],
    ["NODE_OPTIONS", "makes the engine load code"],
    ["BASH_ENV", "makes the engine load code"],
    ["NCCL_NET_PLUGIN", "makes the engine load code"],
    ["NCCL_TUNER_PLUGIN", "makes the engine load code"],
    ["VLLM_PLUGINS", "makes the engine load code"],
    ["VLLM_NCCL_SO_PATH", "makes the engine load code"],
    ["VLLM_LOGGING_CONFIG_PATH", "makes the engine load code"],
    ["LLAMA_ARG_HF_REPO", "is set by llmgw"],
    ["VLLM_API_KEY", "is set by llmgw"],
    ["NCCL_IB_HCA", "is set by llmgw"],
    ["HF_TOKEN", "is a secret"],
    ["CC", "chooses which executables"],
    ["CXX", "chooses which executables"],
    ["TRITON_PTXAS_PATH", "chooses which executables"],
    ["TRITON_CUOBJDUMP_PATH", "chooses which executables"],
    ["TRITON_NVDISASM_PATH", "chooses which executables"],
    ["OPENSSL_CONF", "makes the engine load code"],
    ["NCCL_CONF_FILE", "chooses which executables or configuration files"],
    ["REQUESTS_CA_BUNDLE", "decides which TLS certificates the engine trusts"],
    ["CURL_CA_BUNDLE", "decides which TLS certificates the engine trusts"],
    ["SSL_CERT_FILE", "decides which TLS certificates the engine trusts"],
    ["SSL_CERT_DIR", "decides which TLS certificates the engine trusts"],
    // The general rule: a name for a path, directory, file or config file.
    ["NCCL_TOPO_FILE", "chooses which executables or configuration files"],
    ["TRITON_CACHE_DIR", "chooses which executables or configuration files"],
    ["SOME_ENGINE_CONF", "chooses which executables or configuration files"],
    ["TORCHINDUCTOR_CACHE_DIR", "chooses which executables or configuration files"],
  ])("%s is refused by the schema (%s) and cannot be allowed by an operator", (key, why) => {
    const parsed = parseDeploymentSpec({ ...base, env: { [key]: "x" } });
    expect(parsed.ok).toBe(false);
    if (parsed.ok) return;
    expect(parsed.error.issues).toEqual([
      { field: `env.${key}`, message: expect.stringContaining(why) },
    ]);
    expect(parsed.error.issues[0]?.message).toContain("no deployment may set it");
    const allowed = launchError(() =>
      build(parseDeploymentSpecOrThrow(base), { allowedEngineEnv: [key] }),
    );
    expect(allowed).toEqual({
      code: "LLMGW_ENGINES_INVALID_CONFIG",
      message: expect.stringContaining(`cannot allow "${key}"`),
    });
  });
});

describe("deployment env: the node's allow-list", () => {
  it.each(["NCCL_DEBUG", "VLLM_ATTENTION_BACKEND", "OMP_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF"])(
    "%s is on the built-in list and reaches the engine",
    (key) => {
      const spec = build(parseDeploymentSpecOrThrow({ ...base, env: { [key]: "1" } }));
      expect(spec.env[key]).toBe("1");
    },
  );

  // A proxy is an operator's call (it could see HF_TOKEN, but so does the operator's network).
  it.each(["HF_ENDPOINT", "VLLM_USAGE_STATS_SERVER", "HTTPS_PROXY", "TMPDIR", "MY_TUNING"])(
    "%s passes the schema (another node may allow it) but is refused at launch, naming the flag",
    (key) => {
      const deployment = parseDeploymentSpecOrThrow({ ...base, env: { [key]: "x" } });
      expect(launchError(() => build(deployment))).toEqual({
        code: "LLMGW_ENGINES_ENV_NOT_ALLOWED",
        message: `deployment env refused on this node: ${key} is not on this node's engine environment allow-list; an operator can allow it on a node with \`llmgw agent --allow-engine-env ${key}\` (or LLMGW_ALLOW_ENGINE_ENV=${key})`,
      });
      expect(build(deployment, { allowedEngineEnv: [key] }).env[key]).toBe("x");
    },
  );

  it("no built-in entry is owned, never allowed, or names a path, URL, file or plugin", () => {
    for (const key of Object.keys(ENGINE_ENV_ALLOWED)) {
      expect(engineEnvRefusal(key), key).toBeUndefined();
      expect(key).not.toMatch(/(_URL|_PATH|_FILE|_DIR|_ROOT|_SERVER|ENDPOINT|PLUGIN|_SO)$/);
    }
    for (const key of Object.keys(ENGINE_ENV_NEVER_ALLOWED)) {
      expect(ENGINE_ENV_ALLOWED[key], key).toBeUndefined();
    }
  });
});

// Everything llmgw itself may put in a launch spec's env.
const LLMGW_SET = new Set([
  "PYTHONUNBUFFERED",
  "CUDA_DEVICE_ORDER",
  "CUDA_VISIBLE_DEVICES",
  "HIP_VISIBLE_DEVICES",
  "ROCR_VISIBLE_DEVICES",
  "HF_HOME",
  "HF_HUB_OFFLINE",
  ...NCCL_ENV_KEYS,
]);

describe("property: nothing off the allow-list reaches a built launch spec's env", () => {
  const name = fc.oneof(
    fc.constantFrom(...Object.keys(ENGINE_ENV_ALLOWED)),
    fc.constantFrom(...Object.keys(ENGINE_ENV_NEVER_ALLOWED), ...OWNED_ENV),
    fc.constantFrom("NCCL_NET_PLUGIN", "LD_AUDIT", "PYTHONHOME", "LLMGW_X", "HF_ENDPOINT"),
    fc.stringMatching(/^[A-Z_][A-Z0-9_]{0,20}$/),
    fc.string({ maxLength: 12 }),
  );
  const extension = fc.array(
    fc.oneof(fc.stringMatching(/^[A-Z][A-Z0-9_]{0,12}$/), fc.constantFrom("HF_ENDPOINT")),
    { maxLength: 3 },
  );
  it("a launch either fails or its env holds only allowed names and llmgw's own", () => {
    fc.assert(
      fc.property(
        fc.constantFrom(...ENGINES),
        fc.dictionary(name, fc.string({ maxLength: 16 }), { maxKeys: 6 }),
        fc.array(fc.oneof(fc.string({ maxLength: 12 }), fc.constantFrom("--env", "-e")), {
          maxLength: 4,
        }),
        extension,
        fc.constantFrom(1, 2),
        (engine, env, extraArgs, extra, nnodes) => {
          const parsed = parseDeploymentSpec({
            ...base,
            engine,
            model: engine === "llamacpp" ? "/models/m.gguf" : base.model,
            env,
            extraArgs,
          });
          if (!parsed.ok) return;
          const multi = nnodes === 2 && engine !== "llamacpp";
          let spec: ReturnType<typeof buildLaunchSpec>;
          try {
            spec = buildLaunchSpec({
              deployment: parsed.spec,
              placement: multi
                ? {
                    rank: 0,
                    nnodes: 2,
                    rank0Address: "10.0.0.1",
                    rendezvousPort: 29501,
                    fabricId: IB_FABRIC,
                    gpuIndices: [0],
                  }
                : { rank: 0, nnodes: 1, gpuIndices: [0] },
              ports: { api: 8000 },
              node,
              nodeConfig: { allowedEngineEnv: extra, hfHome: "/data/hf", offline: true },
            });
          } catch (error) {
            if (!isEnginesError(error)) throw error;
            return;
          }
          const allowed = new Set(extra);
          for (const key of Object.keys(spec.env)) {
            const ok = Object.hasOwn(ENGINE_ENV_ALLOWED, key) || allowed.has(key);
            expect(ok || LLMGW_SET.has(key), key).toBe(true);
            expect(engineEnvRefusal(key) === undefined || LLMGW_SET.has(key), key).toBe(true);
          }
          // What the schema let through is never a name no node may allow.
          for (const key of Object.keys(parsed.spec.env)) {
            expect(engineEnvRefusal(key), key).toBeUndefined();
          }
        },
      ),
      { numRuns: 400 },
    );
  });
  it("patterns are anchored families, not substrings of allowed names", () => {
    for (const key of Object.keys(ENGINE_ENV_ALLOWED)) {
      for (const { pattern } of ENGINE_ENV_NEVER_ALLOWED_PATTERNS)
        expect(pattern.test(key)).toBe(false);
    }
  });
});
