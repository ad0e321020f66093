import { existsSync, realpathSync } from "node:fs";
import path from "node:path";
import { AgentError } from "./errors.js";

/**
 * Refuses a deployment model that is a local path outside the operator's `--model-root`.
 * Without it a deployment may point an engine (often running as root) at any file on the
 * node. Throws an {@link AgentError} `LLMGW_AGENT_MODEL_OUTSIDE_ROOT` naming the model, what
 * it resolves to, and the root.
 *
 * A local path is an absolute path, any name with a `.` or `..` segment or more than one `/`
 * (a Hugging Face id is `org/model` at most), any name that exists relative to the engine's
 * working directory, and every llama.cpp model (llama-server only loads files). The existence
 * check matters because vLLM and transformers load a local directory before asking the Hub:
 * `home/user/models/x`, or `etc` under systemd's cwd `/`, would otherwise pass as an id and
 * load from outside the root. Symlinks are resolved (realpath), so a link inside the root to
 * a file outside it is refused too; a path that does not exist is refused, since nothing can
 * be said about where it would point. Other names (`org/model`, `gpt2`) are Hub ids and pass.
 *
 * @param modelRoot the operator's root, already resolved with realpath.
 * @param cwd where the engine starts (a relative model resolves against it).
 */
export function checkModelRoot(
  model: string,
  engine: string,
  modelRoot: string,
  cwd: string = process.cwd(),
): void {
  const segments = model.split("/");
  const isPath =
    engine === "llamacpp" ||
    path.isAbsolute(model) ||
    segments.length > 2 ||
    segments.includes(".") ||
    segments.includes("..") ||
    existsSync(path.resolve(cwd, model));
  if (!isPath) return;
  let real: string;
  try {
    real = realpathSync(path.resolve(cwd, model));
  } catch (error) {
    throw new AgentError(
      "LLMGW_AGENT_MODEL_OUTSIDE_ROOT",
      `model ${JSON.stringify(model)} must be inside the model root ${modelRoot}, and it cannot be resolved: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
      { cause: error },
    );
  }
  const relative = path.relative(modelRoot, real);
  if (relative.startsWith("..") || path.isAbsolute(relative)) {
    throw new AgentError(
      "LLMGW_AGENT_MODEL_OUTSIDE_ROOT",
      `model ${JSON.stringify(model)} resolves to ${real}, outside the model root ${modelRoot} (llmgw agent --model-root)`,
    );
  }
}
