import { ENGINE_SIM_USAGE, runEngineSimCli } from "@llmgw/engine-sim";
import type { Command } from "../command.js";

/** `llmgw engine-sim`: the simulated inference engine, flags as the `sim` engine adapter emits them. */
export const command: Command = {
  name: "engine-sim",
  summary: "run a simulated vLLM/SGLang-like inference engine (scale, timing and fault tests)",
  usage: ENGINE_SIM_USAGE,
  run(argv, io) {
    return runEngineSimCli(argv, io);
  },
};
