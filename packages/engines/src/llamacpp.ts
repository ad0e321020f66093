import { checkLaunch, finishLaunchSpec } from "./common.js";
import { EnginesError } from "./errors.js";
import type { EngineAdapter } from "./launch-spec.js";

/** Context size when the deployment sets no `maxModelLen`. */
export const LLAMACPP_DEFAULT_CONTEXT = 2048;

/**
 * llama.cpp's `llama-server` (GGUF, one process, single node, CPU or GPU):
 * `<bin> -m <model> --host H --port P --alias <served> -c <ctx> -np <parallel> -t <threads>
 * --metrics`, plus `-ngl 999` (all layers on GPU) when GPUs are assigned; with none,
 * `CUDA_VISIBLE_DEVICES` is empty so a CUDA build cannot grab a GPU it was not given.
 * `quantization`/`kvCacheDtype`/`dtype` are refused: a GGUF file carries its own quantization.
 */
export const llamacppAdapter: EngineAdapter = {
  engine: "llamacpp",
  buildLaunchSpec(input) {
    const checked = checkLaunch(input);
    const { deployment: d, placement, ports } = input;
    const { config } = checked;
    for (const field of ["quantization", "kvCacheDtype", "dtype"] as const) {
      if (d[field] !== undefined) {
        throw new EnginesError(
          "LLMGW_ENGINES_UNSUPPORTED",
          `llamacpp does not take ${field} (got ${JSON.stringify(d[field])}): the GGUF file carries its own quantization`,
        );
      }
    }
    const argv = [
      ...config.commands.llamacpp,
      "-m",
      d.model,
      "--host",
      config.bindHost,
      "--port",
      String(ports.api),
      "--alias",
      d.servedModelName,
      "-c",
      String(d.maxModelLen ?? LLAMACPP_DEFAULT_CONTEXT),
      "-np",
      String(config.llamacppParallel),
      "-t",
      String(config.llamacppThreads),
      "--metrics",
      ...(placement.gpuIndices.length > 0 ? ["-ngl", "999"] : []),
      ...d.extraArgs,
    ];
    return finishLaunchSpec("llamacpp", input, checked, argv, {
      python: false,
      nccl: false,
      serving: true,
    });
  },
};
