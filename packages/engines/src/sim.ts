import { checkLaunch, distInitArgs, finishLaunchSpec, kvEventsArgs, opt } from "./common.js";
import type { EngineAdapter } from "./launch-spec.js";

/**
 * The simulated engine (`llmgw engine-sim`): `--model --served-model-name --host --port
 * [--max-model-len] --enable-prompt-tokens-details`, and for multi-node ranks `--nnodes --node-rank --dist-init-addr
 * host:port` like SGLang. It gets the same CUDA/NCCL environment a real engine would, so gang
 * behaviour and NCCL choices are testable without GPUs. Only rank 0 is probed.
 */
export const simAdapter: EngineAdapter = {
  engine: "sim",
  buildLaunchSpec(input) {
    const checked = checkLaunch(input);
    const { deployment: d, placement, ports } = input;
    const { config } = checked;
    const serving = placement.rank === 0;
    const argv = [
      ...config.commands.sim,
      "--model",
      d.model,
      "--served-model-name",
      d.servedModelName,
      "--host",
      config.bindHost,
      "--port",
      String(ports.api),
      ...opt("--max-model-len", d.maxModelLen),
      // As llmgw launches vLLM: usage carries cached prompt tokens (when there are some).
      "--enable-prompt-tokens-details",
      ...distInitArgs(input, checked),
      ...kvEventsArgs(input, serving),
      ...d.extraArgs,
    ];
    return finishLaunchSpec("sim", input, checked, argv, {
      python: false,
      nccl: true,
      serving: serving,
    });
  },
};
