import { RouterServiceError } from "./errors.js";

/**
 * An integer option checked once, at resolve time: `value` if it is a safe integer in
 * [min, max], else `LLMGW_ROUTER_CONFIG_INVALID` naming the option and echoing the
 * value (`scope` says whose option: "router", "listener").
 */
export function optionInt(
  scope: string,
  name: string,
  value: number,
  min: number,
  max: number,
): number {
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `${scope} option ${name} must be an integer in [${min}, ${max}], got ${String(value)}`,
    );
  }
  return value;
}
