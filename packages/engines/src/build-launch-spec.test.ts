import { describe, expect, it } from "vitest";
import {
  amdNode,
  bondedRoceNode,
  cpuNode,
  IB_FABRIC,
  IB_FABRIC_B,
  ibH100Node,
  ROCE_FABRIC,
  renamedIbNode,
  roceH100Node,
  twelveHcaNode,
  twoFabricNode,
} from "../test/fixtures/inventories.js";
import { buildLaunchSpec, engineAdapters } from "./build-launch-spec.js";
import {
  type DeploymentSpecInput,
  ENGINES,
  engineSupportsMultiNode,
  parseDeploymentSpecOrThrow,
} from "./deployment-spec.js";
import { isEnginesError } from "./errors.js";
import type { BuildLaunchSpecInput, LaunchPlacement, NodeEngineConfig } from "./launch-spec.js";

const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);
const MODEL = "meta-llama/Llama-3.1-70B-Instruct";

function input(
  spec: Partial<DeploymentSpecInput> & Pick<DeploymentSpecInput, "engine">,
  placement: Partial<LaunchPlacement> & Pick<LaunchPlacement, "gpuIndices">,
  node = ibH100Node("gpu-a", "10.0.0.1"),
  nodeConfig?: NodeEngineConfig,
): BuildLaunchSpecInput {
  return {
    deployment: parseDeploymentSpecOrThrow({ name: "llama", model: MODEL, ...spec }),
    placement: { rank: 0, nnodes: 1, ...placement },
    ports: { api: 8000 },
    node,
    ...(nodeConfig === undefined ? {} : { nodeConfig }),
  };
}

const SINGLE_ENV = { PYTHONUNBUFFERED: "1", CUDA_DEVICE_ORDER: "PCI_BUS_ID" };

describe("buildLaunchSpec: argv and env per engine (golden)", () => {
  it.each([
    {
      what: "vllm, 1 GPU",
      in: input({ engine: "vllm" }, { gpuIndices: [3] }),
      argv: [
        "vllm",
        "serve",
        MODEL,
        "--served-model-name",
        "llama",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--enable-prompt-tokens-details",
        "--tensor-parallel-size",
        "1",
        "--pipeline-parallel-size",
        "1",
      ],
      env: { ...SINGLE_ENV, CUDA_VISIBLE_DEVICES: "3" },
    },
    {
      what: "vllm, TP 8 on one IB node: no network variables at all",
      in: input({ engine: "vllm", tensorParallel: 8 }, { gpuIndices: range(0, 8) }),
      argv: [
        "vllm",
        "serve",
        MODEL,
        "--served-model-name",
        "llama",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--enable-prompt-tokens-details",
        "--tensor-parallel-size",
        "8",
        "--pipeline-parallel-size",
        "1",
      ],
      env: { ...SINGLE_ENV, CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7" },
    },
    {
      what: "sglang, 1 GPU: --enable-metrics, explicit host",
      in: input({ engine: "sglang" }, { gpuIndices: [0] }),
      argv: [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        MODEL,
        "--served-model-name",
        "llama",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tp-size",
        "1",
        "--pp-size",
        "1",
        "--enable-metrics",
        "--enable-cache-report",
      ],
      env: { ...SINGLE_ENV, CUDA_VISIBLE_DEVICES: "0" },
    },
    {
      what: "sglang, TP 8 on one node",
      in: input({ engine: "sglang", tensorParallel: 8 }, { gpuIndices: range(0, 8) }),
      argv: [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        MODEL,
        "--served-model-name",
        "llama",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tp-size",
        "8",
        "--pp-size",
        "1",
        "--enable-metrics",
        "--enable-cache-report",
      ],
      env: { ...SINGLE_ENV, CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7" },
    },
    {
      what: "llamacpp on CPU: GPUs hidden, no -ngl",
      in: input(
        { engine: "llamacpp", model: "/var/cache/llmgw/tiny.gguf" },
        { gpuIndices: [] },
        cpuNode("cpu-a", "10.0.0.9"),
      ),
      argv: [
        "llama-server",
        "-m",
        "/var/cache/llmgw/tiny.gguf",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--alias",
        "llama",
        "-c",
        "2048",
        "-np",
        "4",
        "-t",
        "1",
        "--metrics",
      ],
      env: { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "" },
    },
    {
      what: "llamacpp, 1 GPU: all layers offloaded",
      in: input(
        { engine: "llamacpp", model: "/models/q4.gguf", gpusPerReplica: 1, maxModelLen: 8192 },
        { gpuIndices: [5] },
      ),
      argv: [
        "llama-server",
        "-m",
        "/models/q4.gguf",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--alias",
        "llama",
        "-c",
        "8192",
        "-np",
        "4",
        "-t",
        "1",
        "--metrics",
        "-ngl",
        "999",
      ],
      env: { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "5" },
    },
    {
      what: "sim, 1 simulated GPU",
      in: input({ engine: "sim", maxModelLen: 4096 }, { gpuIndices: [0] }),
      argv: [
        "llmgw",
        "engine-sim",
        "--model",
        MODEL,
        "--served-model-name",
        "llama",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-model-len",
        "4096",
        "--enable-prompt-tokens-details",
      ],
      env: { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "0" },
    },
  ])("$what", (c) => {
    const spec = buildLaunchSpec(c.in);
    expect(spec.argv).toEqual(c.argv);
    expect(spec.env).toEqual(c.env);
    expect(spec.apiPort).toBe(8000);
    expect(spec.readiness).toEqual({
      healthPath: "/health",
      modelsPath: "/v1/models",
      expectedModelId: "llama",
    });
    expect(spec.metricsPath).toBe("/metrics");
    expect(spec.stopSignal).toBe("SIGTERM");
  });

  it("vllm: every optional flag from the spec and node config, in llmgw's order, extra args last", () => {
    const spec = buildLaunchSpec(
      input(
        {
          engine: "vllm",
          servedModelName: "llama-fp8",
          tensorParallel: 2,
          gpuMemoryUtilization: 0.85,
          maxModelLen: 32768,
          quantization: "fp8",
          kvCacheDtype: "fp8_e4m3",
          dtype: "bfloat16",
          trustRemoteCode: true,
          extraArgs: ["--max-num-seqs", "16"],
          env: { VLLM_LOGGING_LEVEL: "DEBUG" },
        },
        { gpuIndices: [6, 7] },
        undefined,
        {
          vllmCommand: ["/opt/venv/bin/vllm", "serve"],
          downloadDir: "/data/hf",
          hfHome: "/data/hf-home",
          offline: true,
          bindHost: "10.0.0.1",
        },
      ),
    );
    expect(spec.argv).toEqual([
      "/opt/venv/bin/vllm",
      "serve",
      MODEL,
      "--served-model-name",
      "llama-fp8",
      "--host",
      "10.0.0.1",
      "--port",
      "8000",
      "--enable-prompt-tokens-details",
      "--tensor-parallel-size",
      "2",
      "--pipeline-parallel-size",
      "1",
      "--gpu-memory-utilization",
      "0.85",
      "--max-model-len",
      "32768",
      "--quantization",
      "fp8",
      "--kv-cache-dtype",
      "fp8_e4m3",
      "--dtype",
      "bfloat16",
      "--download-dir",
      "/data/hf",
      "--trust-remote-code",
      "--max-num-seqs",
      "16",
    ]);
    expect(spec.env).toEqual({
      PYTHONUNBUFFERED: "1",
      VLLM_LOGGING_LEVEL: "DEBUG",
      CUDA_DEVICE_ORDER: "PCI_BUS_ID",
      CUDA_VISIBLE_DEVICES: "6,7",
      HF_HOME: "/data/hf-home",
      HF_HUB_OFFLINE: "1",
    });
    expect(spec.readiness?.expectedModelId).toBe("llama-fp8");
  });

  it("sglang: --mem-fraction-static and --context-length are SGLang's names", () => {
    const spec = buildLaunchSpec(
      input(
        {
          engine: "sglang",
          gpuMemoryUtilization: 0.8,
          maxModelLen: 262144,
          quantization: "fp8",
          dtype: "bfloat16",
        },
        { gpuIndices: [0] },
      ),
    );
    expect(spec.argv.slice(3)).toEqual([
      "--model-path",
      MODEL,
      "--served-model-name",
      "llama",
      "--host",
      "0.0.0.0",
      "--port",
      "8000",
      "--tp-size",
      "1",
      "--pp-size",
      "1",
      "--mem-fraction-static",
      "0.8",
      "--context-length",
      "262144",
      "--quantization",
      "fp8",
      "--dtype",
      "bfloat16",
      "--enable-metrics",
      "--enable-cache-report",
    ]);
  });

  it.each(["vllm", "sglang", "sim"] as const)(
    "%s: kvEvents publishes on the agent's endpoint, on the serving rank only",
    (engine) => {
      const endpoint = "ipc:///var/lib/llmgw/kv/r1.ipc";
      const spec = { engine, kvEvents: true };
      const serving = buildLaunchSpec({
        ...input(spec, { gpuIndices: [0] }),
        kvEventsEndpoint: endpoint,
      });
      const at = serving.argv.indexOf("--kv-events-config");
      expect(JSON.parse(serving.argv[at + 1] as string)).toEqual({
        enable_kv_cache_events: true,
        publisher: "zmq",
        endpoint,
        topic: "",
      });
      expect(serving.kvEventsEndpoint).toBe(endpoint);
      // Without kvEvents, no flag even with an endpoint; without an endpoint, a clear refusal.
      const plain = buildLaunchSpec({
        ...input({ engine }, { gpuIndices: [0] }),
        kvEventsEndpoint: endpoint,
      });
      expect(plain.argv).not.toContain("--kv-events-config");
      expect(plain.kvEventsEndpoint).toBeUndefined();
      expect(() => buildLaunchSpec(input(spec, { gpuIndices: [0] }))).toThrow(
        /kvEvents needs the agent's event endpoint/,
      );
      // A deployment may not choose where events go.
      expect(() =>
        parseDeploymentSpecOrThrow({
          name: "x",
          model: MODEL,
          engine,
          extraArgs: ["--kv-events-config", "{}"],
        }),
      ).toThrow(/--kv-events-config/);
    },
  );

  it("trust-remote-code only when asked", () => {
    expect(buildLaunchSpec(input({ engine: "vllm" }, { gpuIndices: [0] })).argv).not.toContain(
      "--trust-remote-code",
    );
    expect(buildLaunchSpec(input({ engine: "sglang" }, { gpuIndices: [0] })).argv).not.toContain(
      "--trust-remote-code",
    );
  });

  it("a deployment env that slipped past the schema is refused at launch, never merged", () => {
    const base = input({ engine: "vllm" }, { gpuIndices: [1] });
    const tampered = {
      ...base,
      deployment: {
        ...base.deployment,
        env: {
          CUDA_VISIBLE_DEVICES: "0,1,2",
          HF_TOKEN: "hf_x",
          LLMGW_NODE_ID: "x",
          NCCL_DEBUG: "INFO",
        },
      },
    };
    expect(() => buildLaunchSpec(tampered)).toThrow(
      "deployment env refused on this node: CUDA_VISIBLE_DEVICES is set by llmgw; HF_TOKEN is a secret that belongs in the agent's environment file; LLMGW_NODE_ID is set by llmgw",
    );
    const allowed = { ...base, deployment: { ...base.deployment, env: { NCCL_DEBUG: "INFO" } } };
    expect(buildLaunchSpec(allowed).env).toEqual({
      ...SINGLE_ENV,
      NCCL_DEBUG: "INFO",
      CUDA_VISIBLE_DEVICES: "1",
    });
  });

  it('with policy "report" (to adopt what an older release launched) only the node\'s own allow-list refuses', () => {
    const base = input({ engine: "vllm" }, { gpuIndices: [1] });
    const stored = {
      ...base,
      policy: "report" as const,
      deployment: { ...base.deployment, env: { HF_HUB_OFFLINE: "1", NCCL_DEBUG: "INFO" } },
    };
    // What no deployment may set is the spec's refusal, reported by the report parse.
    expect(buildLaunchSpec(stored).env).toMatchObject({ HF_HUB_OFFLINE: "1", NCCL_DEBUG: "INFO" });
    expect(() => buildLaunchSpec({ ...stored, policy: "enforce" })).toThrow(
      "deployment env refused on this node: HF_HUB_OFFLINE is set by llmgw",
    );
    const offList = { ...stored, deployment: { ...stored.deployment, env: { MY_FLAG: "1" } } };
    expect(() => buildLaunchSpec(offList)).toThrow(
      "deployment env refused on this node: MY_FLAG is not on this node's engine environment allow-list",
    );
  });
});

describe("buildLaunchSpec: multi-node ranks", () => {
  const a = ibH100Node("gpu-a", "10.0.0.1");
  const b = ibH100Node("gpu-b", "10.0.0.2");
  const multi = (rank: number) => ({
    rank,
    nnodes: 2,
    rank0Address: "10.0.0.1",
    rendezvousPort: 29501,
    fabricId: IB_FABRIC,
    gpuIndices: range(0, 8),
  });
  const IB_ENV = {
    NCCL_IB_HCA: "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1",
    NCCL_SOCKET_IFNAME: "=ib0",
    GLOO_SOCKET_IFNAME: "ib0",
  };

  it("vllm TP 8 × PP 2 across two IB nodes: rank 1 is --headless with no API", () => {
    const r0 = buildLaunchSpec(
      input(
        { engine: "vllm", model: "/models/M", tensorParallel: 8, pipelineParallel: 2 },
        multi(0),
        a,
      ),
    );
    const r1 = buildLaunchSpec(
      input(
        { engine: "vllm", model: "/models/M", tensorParallel: 8, pipelineParallel: 2 },
        multi(1),
        b,
      ),
    );
    // formats.md §4.2, plus served name, host/port and the explicit master port.
    expect(r0.argv).toEqual([
      "vllm",
      "serve",
      "/models/M",
      "--served-model-name",
      "llama",
      "--host",
      "0.0.0.0",
      "--port",
      "8000",
      "--enable-prompt-tokens-details",
      "--tensor-parallel-size",
      "8",
      "--pipeline-parallel-size",
      "2",
      "--nnodes",
      "2",
      "--node-rank",
      "0",
      "--master-addr",
      "10.0.0.1",
      "--master-port",
      "29501",
    ]);
    expect(r1.argv).toEqual([
      "vllm",
      "serve",
      "/models/M",
      "--served-model-name",
      "llama",
      "--tensor-parallel-size",
      "8",
      "--pipeline-parallel-size",
      "2",
      "--nnodes",
      "2",
      "--node-rank",
      "1",
      "--master-addr",
      "10.0.0.1",
      "--master-port",
      "29501",
      "--headless",
    ]);
    expect(r0.env).toEqual({ ...SINGLE_ENV, CUDA_VISIBLE_DEVICES: "0,1,2,3,4,5,6,7", ...IB_ENV });
    expect(r1.env).toEqual(r0.env);
    expect([r0.apiPort, r1.apiPort]).toEqual([8000, undefined]);
    expect(r1.readiness).toBeUndefined();
    expect(r0.reasons.join("\n")).toContain(IB_FABRIC);
  });

  it("vllm TP 8 × PP 2 on RoCE: GID index and the RoCE netdev", () => {
    const r = buildLaunchSpec(
      input(
        { engine: "vllm", tensorParallel: 8, pipelineParallel: 2 },
        { ...multi(1), fabricId: ROCE_FABRIC },
        roceH100Node("gpu-r", "192.168.211.11"),
      ),
    );
    expect(r.env).toMatchObject({
      NCCL_IB_HCA: "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1",
      NCCL_IB_GID_INDEX: "3",
      NCCL_SOCKET_IFNAME: "=rdma0",
      GLOO_SOCKET_IFNAME: "rdma0",
    });
  });

  it("sglang two nodes × 4 GPUs: --tp-size is the TOTAL, rendezvous via --dist-init-addr", () => {
    const place = (rank: number) => ({
      ...multi(rank),
      rendezvousPort: 50000,
      gpuIndices: range(4, 8),
    });
    const r0 = buildLaunchSpec(input({ engine: "sglang", tensorParallel: 8 }, place(0), a));
    const r1 = buildLaunchSpec(input({ engine: "sglang", tensorParallel: 8 }, place(1), b));
    const tail = (rank: number) => [
      "--tp-size",
      "8",
      "--pp-size",
      "1",
      "--enable-metrics",
      "--enable-cache-report",
      "--nnodes",
      "2",
      "--node-rank",
      String(rank),
      "--dist-init-addr",
      "10.0.0.1:50000",
    ];
    expect(r0.argv.slice(-12)).toEqual(tail(0));
    expect(r1.argv.slice(-12)).toEqual(tail(1));
    expect(r1.argv).toContain("--port");
    expect([r0.readiness?.healthPath, r1.readiness, r1.apiPort]).toEqual([
      "/health",
      undefined,
      undefined,
    ]);
    // GPUs 4-7 sit on the second NUMA half: their PIX NICs first, then the SYS ones.
    expect(r0.env.NCCL_IB_HCA).toBe(
      "=mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1,mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
    );
    expect(r0.env.NCCL_SOCKET_IFNAME).toBe("=ib4");
    expect(r0.env.CUDA_VISIBLE_DEVICES).toBe("4,5,6,7");
  });

  it("sim two nodes: SGLang-style flags and the same NCCL env a real engine would get", () => {
    const r1 = buildLaunchSpec(
      input({ engine: "sim", tensorParallel: 16 }, { ...multi(1), rendezvousPort: 41000 }, b),
    );
    expect(r1.argv).toEqual([
      "llmgw",
      "engine-sim",
      "--model",
      MODEL,
      "--served-model-name",
      "llama",
      "--host",
      "0.0.0.0",
      "--port",
      "8000",
      "--enable-prompt-tokens-details",
      "--nnodes",
      "2",
      "--node-rank",
      "1",
      "--dist-init-addr",
      "10.0.0.1:41000",
    ]);
    expect(r1.env).toMatchObject(IB_ENV);
    expect(r1.readiness).toBeUndefined();
  });

  it("an IPv6 rank-0 address is bracketed in host:port", () => {
    const r = buildLaunchSpec(
      input({ engine: "sglang", tensorParallel: 16 }, { ...multi(1), rank0Address: "fd00::1" }, b),
    );
    expect(r.argv).toContain("[fd00::1]:29501");
  });

  it.each([
    {
      what: "renamed device ibp12s0",
      node: renamedIbNode("gpu-c", "10.0.0.3"),
      fabric: IB_FABRIC,
      hca: "=ibp12s0:1",
      ifname: "ibs12",
      gid: undefined,
    },
    {
      what: "bonded device mlx5_bond_0",
      node: bondedRoceNode("gpu-d", "10.0.0.4"),
      fabric: ROCE_FABRIC,
      hca: "=mlx5_bond_0:1",
      ifname: "bond0",
      gid: "3",
    },
    {
      what: "mlx5_1 never matches mlx5_10",
      node: twelveHcaNode("gpu-e", "10.0.0.5"),
      fabric: IB_FABRIC,
      hca: "=mlx5_0:1,mlx5_1:1",
      ifname: "ib0",
      gid: undefined,
    },
    {
      what: "two IB fabrics, deployment on B",
      node: twoFabricNode("gpu-f", "10.0.0.6"),
      fabric: IB_FABRIC_B,
      hca: "=mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1",
      ifname: "ib4",
      gid: undefined,
    },
    {
      what: "two IB fabrics, deployment on A",
      node: twoFabricNode("gpu-f", "10.0.0.6"),
      fabric: IB_FABRIC,
      hca: "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
      ifname: "ib0",
      gid: undefined,
    },
  ])("$what", (c) => {
    const r = buildLaunchSpec(
      input(
        { engine: "vllm", tensorParallel: 8, pipelineParallel: 2 },
        { ...multi(1), fabricId: c.fabric },
        c.node,
      ),
    );
    expect(r.env.NCCL_IB_HCA).toBe(c.hca);
    expect(r.env.NCCL_SOCKET_IFNAME).toBe(`=${c.ifname}`);
    expect(r.env.GLOO_SOCKET_IFNAME).toBe(c.ifname);
    expect(r.env.NCCL_IB_GID_INDEX).toBe(c.gid);
  });
});

describe("buildLaunchSpec: refusals", () => {
  const b = ibH100Node("gpu-b", "10.0.0.2");
  it.each([
    {
      what: "llamacpp across nodes",
      in: input(
        { engine: "llamacpp", model: "/m.gguf" },
        { rank: 0, nnodes: 2, rank0Address: "10.0.0.1", rendezvousPort: 1, gpuIndices: [] },
      ),
      code: "LLMGW_ENGINES_UNSUPPORTED",
      message: "llamacpp cannot run one replica across nodes (asked for 2)",
    },
    {
      what: "llamacpp with quantization",
      in: input({ engine: "llamacpp", model: "/m.gguf", quantization: "fp8" }, { gpuIndices: [] }),
      code: "LLMGW_ENGINES_UNSUPPORTED",
      message:
        'llamacpp does not take quantization (got "fp8"): the GGUF file carries its own quantization',
    },
    {
      what: "multi-node without a rank-0 address",
      in: input(
        { engine: "vllm", tensorParallel: 16 },
        { rank: 1, nnodes: 2, rendezvousPort: 29501, fabricId: IB_FABRIC, gpuIndices: range(0, 8) },
        b,
      ),
      code: "LLMGW_ENGINES_INVALID_LAUNCH",
      message:
        "placement.rank0Address must be an IP address or host name when nnodes > 1 (got undefined)",
    },
    {
      what: "a rank-0 address that looks like a flag",
      in: input(
        { engine: "vllm", tensorParallel: 16 },
        {
          rank: 1,
          nnodes: 2,
          rank0Address: "--x",
          rendezvousPort: 29501,
          fabricId: IB_FABRIC,
          gpuIndices: range(0, 8),
        },
        b,
      ),
      code: "LLMGW_ENGINES_INVALID_LAUNCH",
      message:
        'placement.rank0Address must be an IP address or host name when nnodes > 1 (got "--x")',
    },
    {
      what: "rank out of range",
      in: input({ engine: "vllm" }, { rank: 2, nnodes: 2, gpuIndices: [0] }),
      code: "LLMGW_ENGINES_INVALID_LAUNCH",
      message: "placement.rank must be in [0, 1] (got 2)",
    },
    {
      what: "the chosen fabric is not on the node",
      in: input(
        { engine: "vllm", tensorParallel: 16 },
        {
          rank: 1,
          nnodes: 2,
          rank0Address: "10.0.0.1",
          rendezvousPort: 29501,
          fabricId: ROCE_FABRIC,
          gpuIndices: range(0, 8),
        },
        b,
      ),
      code: "LLMGW_ENGINES_NCCL_ENV",
      message: `rank 1 on gpu-b: fabric "${ROCE_FABRIC}" is not on this node (it has "${IB_FABRIC}")`,
    },
    {
      what: "a node config path that looks like a flag",
      in: input({ engine: "vllm" }, { gpuIndices: [0] }, b, { downloadDir: "--evil" }),
      code: "LLMGW_ENGINES_INVALID_CONFIG",
      message: `nodeConfig.downloadDir must be a path that does not start with '-' (got "--evil")`,
    },
    {
      what: "a bind host that looks like a flag",
      in: input({ engine: "vllm" }, { gpuIndices: [0] }, b, { bindHost: "-h" }),
      code: "LLMGW_ENGINES_INVALID_CONFIG",
      message: `nodeConfig.bindHost must be an IP address or host name (got "-h")`,
    },
  ])("$what", (c) => {
    let caught: unknown;
    try {
      buildLaunchSpec(c.in);
    } catch (error) {
      caught = error;
    }
    expect(isEnginesError(caught)).toBe(true);
    expect(caught).toMatchObject({ code: c.code, message: c.message });
  });
});

describe("engineAdapters", () => {
  it.each(ENGINES)("%s: the adapter is registered under its engine's name", (engine) => {
    expect(engineAdapters[engine].engine).toBe(engine);
    // One replica spans nodes with every engine but llama.cpp (llama-server is one process).
    expect(engineSupportsMultiNode(engine)).toBe(engine !== "llamacpp");
  });
});

describe("buildLaunchSpec: the engine API key travels by environment, never argv", () => {
  const gpuNode = ibH100Node("gpu-a", "10.0.0.1");
  it.each([
    { engine: "vllm", apiKeyEnv: "VLLM_API_KEY" },
    { engine: "llamacpp", apiKeyEnv: "LLAMA_API_KEY" },
    { engine: "sim", apiKeyEnv: "LLMGW_ENGINE_API_KEY" },
    // SGLang reads its key from argv only; it gets none rather than one every local user sees.
    { engine: "sglang", apiKeyEnv: undefined },
  ] as const)("$engine: rank 0 names $apiKeyEnv", ({ engine, apiKeyEnv }) => {
    const model = engine === "llamacpp" ? "/models/m.gguf" : MODEL;
    const spec = buildLaunchSpec(
      input({ engine, model }, { gpuIndices: [0] }, gpuNode, { bindHost: "10.0.0.1" }),
    );
    expect(spec.apiKeyEnv).toBe(apiKeyEnv);
    expect(spec.argv.some((a) => a.startsWith("--api-key"))).toBe(false);
    expect(spec.argv[spec.argv.indexOf("--host") + 1]).toBe("10.0.0.1");
  });

  it("ranks that serve no API get no key variable", () => {
    const spec = buildLaunchSpec(
      input(
        { engine: "sim", tensorParallel: 8, pipelineParallel: 2 },
        {
          rank: 1,
          nnodes: 2,
          rank0Address: "10.0.0.1",
          rendezvousPort: 29501,
          fabricId: IB_FABRIC,
          gpuIndices: range(0, 8),
        },
        ibH100Node("gpu-b", "10.0.0.2"),
      ),
    );
    expect(spec.apiKeyEnv).toBeUndefined();
  });
});

describe("buildLaunchSpec: AMD GPUs get ROCm's visibility variables, per engine", () => {
  const amd = amdNode("mi300x-a", "10.0.0.9");
  const AMD_ENV = {
    ROCR_VISIBLE_DEVICES: "4,5",
    HIP_VISIBLE_DEVICES: "0,1",
    CUDA_VISIBLE_DEVICES: "0,1",
  };
  it.each([
    [
      { engine: "vllm", tensorParallel: 2 },
      { PYTHONUNBUFFERED: "1", ...AMD_ENV },
    ],
    [
      { engine: "sglang", tensorParallel: 2 },
      { PYTHONUNBUFFERED: "1", ...AMD_ENV },
    ],
    [{ engine: "llamacpp", model: "/models/q4.gguf", gpusPerReplica: 2 }, AMD_ENV],
    [{ engine: "sim", tensorParallel: 2 }, AMD_ENV],
  ] as const)("%j on GPUs 4 and 5", (spec, env) => {
    const launch = buildLaunchSpec(input(spec, { gpuIndices: [4, 5] }, amd));
    expect(launch.env).toEqual(env);
    expect(launch.env.CUDA_DEVICE_ORDER).toBeUndefined();
  });

  it.each(["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"])(
    "a deployment cannot set %s",
    (name) => {
      const base = input({ engine: "vllm" }, { gpuIndices: [1] }, amd);
      const tampered = { ...base, deployment: { ...base.deployment, env: { [name]: "0" } } };
      expect(() => buildLaunchSpec(tampered)).toThrow(
        `deployment env refused on this node: ${name} is set by llmgw`,
      );
    },
  );
});
