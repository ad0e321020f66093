import type { EngineName } from "./deployment-spec.js";
import type { BuildLaunchSpecInput, EngineAdapter, LaunchSpec } from "./launch-spec.js";
import { llamacppAdapter } from "./llamacpp.js";
import { sglangAdapter } from "./sglang.js";
import { simAdapter } from "./sim.js";
import { vllmAdapter } from "./vllm.js";

/** Every engine adapter by engine name. */
export const engineAdapters: Readonly<Record<EngineName, EngineAdapter>> = {
  vllm: vllmAdapter,
  sglang: sglangAdapter,
  llamacpp: llamacppAdapter,
  sim: simAdapter,
};

/**
 * Builds the launch spec of one rank with the adapter of `deployment.engine`.
 * @throws EnginesError see {@link EngineAdapter.buildLaunchSpec}.
 */
export function buildLaunchSpec(input: BuildLaunchSpecInput): LaunchSpec {
  return engineAdapters[input.deployment.engine].buildLaunchSpec(input);
}
