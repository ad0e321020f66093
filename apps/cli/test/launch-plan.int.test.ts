import { execFile } from "node:child_process";
import { mkdtemp, rm, rmdir, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

// Builds the real `llmgw` bundle (into its own ignored folder, so a concurrent `pnpm build`
// cannot wipe it mid-test) and runs `llmgw launch-plan` on inventory JSON fixtures in the
// protobuf JSON shape `llmgw agent inventory --json` prints.
const run = promisify(execFile);
const here = dirname(fileURLToPath(import.meta.url));
const cliRoot = resolve(here, "..");
const fixtures = resolve(cliRoot, "../../packages/engines/test/fixtures");
const inv = (name: string) => join(fixtures, `inventory-${name}.json`);
let outDir: string;
let specs: string;

async function llmgw(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [join(outDir, "main.js"), ...args], {
      cwd: specs,
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

beforeAll(async () => {
  outDir = join(cliRoot, "test", "dist", `launch-plan-${process.pid}`);
  await run("npx", ["tsup", "--out-dir", outDir, "--no-sourcemap"], {
    cwd: cliRoot,
    timeout: 120_000,
  });
  specs = await mkdtemp(join(tmpdir(), "llmgw-launch-plan-"));
  await writeFile(
    join(specs, "vllm.yaml"),
    "name: llama-70b\nmodel: /models/Llama-3.1-70B-Instruct\nengine: vllm\ntensorParallel: 8\npipelineParallel: 2\nextraArgs: [--max-num-seqs, '64']\n",
  );
  await writeFile(
    join(specs, "sglang.json"),
    JSON.stringify({
      name: "qwen",
      model: "Qwen/Qwen2.5-72B-Instruct",
      engine: "sglang",
      tensorParallel: 16,
    }),
  );
  await writeFile(
    join(specs, "llama.yaml"),
    "name: tiny\nmodel: /var/cache/llmgw/models/tiny.gguf\nengine: llamacpp\nmaxModelLen: 4096\n",
  );
  await writeFile(
    join(specs, "fp8.json"),
    JSON.stringify({ name: "fp8", model: "org/m-FP8", engine: "vllm", quantization: "fp8" }),
  );
  await writeFile(
    join(specs, "bad.json"),
    JSON.stringify({ name: "Bad", model: "--x", engine: "vllm", extraArgs: ["--port=1"] }),
  );
}, 180_000);

afterAll(async () => {
  if (outDir) {
    await rm(outDir, { recursive: true, force: true });
    await rmdir(dirname(outDir)).catch(() => undefined); // only when no other build is in there
  }
  if (specs) await rm(specs, { recursive: true, force: true });
});

describe("llmgw launch-plan (built CLI)", () => {
  it("vLLM TP 8 × PP 2 over two IB nodes: both ranks, headless worker, exact NCCL_IB_HCA", async () => {
    const r = await llmgw(
      "launch-plan",
      "-f",
      "vllm.yaml",
      "--inventory",
      inv("h100-ib-a"),
      "--inventory",
      inv("h100-ib-b"),
    );
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(r.stdout).toContain(
      "    vllm serve /models/Llama-3.1-70B-Instruct --served-model-name llama-70b --host 0.0.0.0 --port 8000 --enable-prompt-tokens-details --tensor-parallel-size 8 --pipeline-parallel-size 2 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29501 --max-num-seqs 64\n",
    );
    expect(r.stdout).toContain(
      "    vllm serve /models/Llama-3.1-70B-Instruct --served-model-name llama-70b --tensor-parallel-size 8 --pipeline-parallel-size 2 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29501 --headless --max-num-seqs 64\n",
    );
    expect(r.stdout).toContain(
      "    NCCL_IB_HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1\n",
    );
    expect(r.stdout).toContain("rank 1 on gpu-b: GPUs 0,1,2,3,4,5,6,7, no API (worker rank)");
  }, 60_000);

  it("SGLang over two nodes as JSON: total TP and --dist-init-addr", async () => {
    const r = await llmgw(
      "launch-plan",
      "-f",
      "sglang.json",
      "--inventory",
      inv("h100-ib-a"),
      "--inventory",
      inv("h100-ib-b"),
      "--rank0-address",
      "gpu-a.example",
      "--rendezvous-port",
      "50000",
      "--json",
    );
    expect(r.code).toBe(0);
    const plan = JSON.parse(r.stdout) as {
      ok: boolean;
      ranks: { launch: { argv: string[]; env: Record<string, string> } }[];
    };
    expect(plan.ok).toBe(true);
    expect(plan.ranks.map((x) => x.launch.argv.slice(-10))).toEqual(
      [0, 1].map((rank) =>
        [
          "--tp-size",
          "16",
          "--pp-size",
          "1",
          "--enable-metrics",
          "--enable-cache-report",
          "--nnodes",
          "2",
          "--node-rank",
          String(rank),
          "--dist-init-addr",
          "gpu-a.example:50000",
        ].slice(-10),
      ),
    );
    expect(plan.ranks[1]?.launch.env.GLOO_SOCKET_IFNAME).toBe("ib0");
  }, 60_000);

  it("llama.cpp on a CPU node", async () => {
    const r = await llmgw("launch-plan", "-f", "llama.yaml", "--inventory", inv("cpu"));
    expect(r.code).toBe(0);
    expect(r.stdout).toContain(
      "    llama-server -m /var/cache/llmgw/models/tiny.gguf --host 0.0.0.0 --port 8000 --alias tiny -c 4096 -np 4 -t 1 --metrics\n",
    );
    expect(r.stdout).toContain("    CUDA_VISIBLE_DEVICES=''\n");
  }, 60_000);

  it("fp8 on A100: the violation names the GPU, exit 1", async () => {
    const r = await llmgw("launch-plan", "-f", "fp8.json", "--inventory", inv("a100"));
    expect(r.code).toBe(1);
    expect(r.stdout).toContain(
      "  LLMGW_ENGINES_FP8_UNSUPPORTED: quantization fp8 needs compute capability ≥ 8.9 for native FP8; GPU 0 (NVIDIA A100-SXM4-80GB) on gpu-a100 has 8.0 and would fall back to a slower path\n",
    );
    expect(r.stdout).not.toContain("argv:");
  }, 60_000);

  it("an invalid spec lists every field; a missing flag is a usage error", async () => {
    const bad = await llmgw("launch-plan", "-f", "bad.json", "--inventory", inv("cpu"));
    expect(bad.code).toBe(1);
    expect(bad.stderr).toContain(
      '  extraArgs[0]: "--port=…" would set --port, which llmgw owns for vllm (got "--port=…")',
    );
    expect(bad.stderr).toContain("  name: ");
    expect(bad.stderr).toContain("  model: ");
    const usage = await llmgw("launch-plan", "-f", "bad.json");
    expect(usage.code).toBe(2);
  }, 60_000);
});
