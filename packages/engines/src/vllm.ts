import { checkLaunch, finishLaunchSpec, kvEventsArgs, opt } from "./common.js";
import type { EngineAdapter } from "./launch-spec.js";

/**
 * vLLM (`vllm serve <model>`). Multi-node uses vLLM's own multiprocessing launcher: the same
 * command on every node with `--nnodes/--node-rank/--master-addr/--master-port`, and
 * `--headless` (no API server, so no host/port, no readiness) on ranks ≥ 1.
 */
export const vllmAdapter: EngineAdapter = {
  engine: "vllm",
  buildLaunchSpec(input) {
    const checked = checkLaunch(input);
    const { deployment: d, placement, ports } = input;
    const { config } = checked;
    const serving = placement.rank === 0;
    const argv = [
      ...config.commands.vllm,
      d.model,
      "--served-model-name",
      d.servedModelName,
      ...(serving ? ["--host", config.bindHost, "--port", String(ports.api)] : []),
      // Cached prompt tokens in each answer's usage (off by default in vLLM): what usage
      // records and the router's prefix predictions read.
      ...(serving ? ["--enable-prompt-tokens-details"] : []),
      "--tensor-parallel-size",
      String(d.tensorParallel),
      "--pipeline-parallel-size",
      String(d.pipelineParallel),
      ...opt("--gpu-memory-utilization", d.gpuMemoryUtilization),
      ...opt("--max-model-len", d.maxModelLen),
      ...opt("--quantization", d.quantization),
      ...opt("--kv-cache-dtype", d.kvCacheDtype),
      ...opt("--dtype", d.dtype),
      ...opt("--download-dir", config.downloadDir),
      ...(d.trustRemoteCode ? ["--trust-remote-code"] : []),
      ...(checked.rendezvous === undefined
        ? []
        : [
            "--nnodes",
            String(placement.nnodes),
            "--node-rank",
            String(placement.rank),
            "--master-addr",
            checked.rendezvous.host,
            "--master-port",
            String(checked.rendezvous.port),
            ...(serving ? [] : ["--headless"]),
          ]),
      ...kvEventsArgs(input, serving),
      ...d.extraArgs,
    ];
    return finishLaunchSpec("vllm", input, checked, argv, {
      python: true,
      nccl: true,
      serving: serving,
    });
  },
};
