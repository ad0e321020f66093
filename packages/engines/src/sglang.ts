import { checkLaunch, distInitArgs, finishLaunchSpec, kvEventsArgs, opt } from "./common.js";
import type { EngineAdapter } from "./launch-spec.js";

/**
 * SGLang (`python3 -m sglang.launch_server`). `--tp-size` is the TOTAL tensor parallelism
 * across nodes; multi-node adds `--nnodes/--node-rank/--dist-init-addr host:port`. Only rank 0
 * runs the HTTP API; ranks ≥ 1 still get `--host/--port` (newer SGLang binds a health stub
 * there, and the default 30000 could collide) but no readiness, since older SGLang just blocks.
 * Metrics need `--enable-metrics`, cached tokens in usage `--enable-cache-report`.
 */
export const sglangAdapter: EngineAdapter = {
  engine: "sglang",
  buildLaunchSpec(input) {
    const checked = checkLaunch(input);
    const { deployment: d, placement, ports } = input;
    const { config } = checked;
    const serving = placement.rank === 0;
    const argv = [
      ...config.commands.sglang,
      "--model-path",
      d.model,
      "--served-model-name",
      d.servedModelName,
      "--host",
      config.bindHost,
      "--port",
      String(ports.api),
      "--tp-size",
      String(d.tensorParallel),
      "--pp-size",
      String(d.pipelineParallel),
      ...opt("--mem-fraction-static", d.gpuMemoryUtilization),
      ...opt("--context-length", d.maxModelLen),
      ...opt("--quantization", d.quantization),
      ...opt("--kv-cache-dtype", d.kvCacheDtype),
      ...opt("--dtype", d.dtype),
      ...opt("--download-dir", config.downloadDir),
      ...(d.trustRemoteCode ? ["--trust-remote-code"] : []),
      "--enable-metrics",
      // Cached prompt tokens in each answer's usage, as for vLLM.
      "--enable-cache-report",
      ...distInitArgs(input, checked),
      ...kvEventsArgs(input, serving),
      ...d.extraArgs,
    ];
    return finishLaunchSpec("sglang", input, checked, argv, {
      python: true,
      nccl: true,
      serving: serving,
    });
  },
};
