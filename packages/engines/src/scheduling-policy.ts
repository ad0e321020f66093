import type { DeploymentSpec } from "./deployment-spec.js";

/**
 * Whether a deployment's engine schedules waiting requests by each request's `priority` field:
 * vLLM started with `--scheduling-policy priority` (or `=priority`, the `_` spelling its
 * parser also takes, or a prefix such as `--scheduling-pol`, which argparse expands when it is
 * unambiguous and refuses otherwise) in `extraArgs`; the last occurrence wins, as in argparse.
 * Missing an abbreviation would leave the client's own `priority` field in the body, so that
 * a key could raise its own class at the engine. Routers then
 * set `priority` from the request's priority class. Any other engine: false (SGLang's and
 * llama.cpp's servers take no per-request priority).
 */
export function schedulesByPriority(spec: Pick<DeploymentSpec, "engine" | "extraArgs">): boolean {
  if (spec.engine !== "vllm") return false;
  let policy: string | undefined;
  const args = spec.extraArgs;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] as string;
    if (!arg.startsWith("--")) continue;
    const eq = arg.indexOf("=");
    const flag = (eq < 0 ? arg : arg.slice(0, eq)).replaceAll("_", "-");
    if (flag === "--" || !"--scheduling-policy".startsWith(flag)) continue;
    policy = eq < 0 ? args[i + 1] : arg.slice(eq + 1);
  }
  return policy === "priority";
}
