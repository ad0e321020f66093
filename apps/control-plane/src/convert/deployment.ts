import type { DeploymentSpec } from "@llmgw/engines";
import { isEnginesError, parseDeploymentSpec } from "@llmgw/engines";
import type { Deployment } from "@llmgw/proto";
import { deploymentSpecFromProto as wireDeploymentSpecFromProto } from "@llmgw/wire";
import { ControlPlaneError } from "../errors.js";

/*
 * The control plane's side of the deployment conversion: the conversion itself is
 * `@llmgw/wire`'s (shared with the agent and the CLI); here engines' validation errors become
 * the control plane's own codes, and the store's JSON is read back.
 */
export {
  deploymentInputFromProto,
  deploymentSpecToProto,
  sameDeploymentSpec,
} from "@llmgw/wire";

/**
 * Validates a wire `Deployment` with `@llmgw/engines`' schema. Throws
 * `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` carrying the engines error's per-field message.
 */
export function deploymentSpecFromProto(d: Deployment): DeploymentSpec {
  try {
    return wireDeploymentSpecFromProto(d);
  } catch (error) {
    if (isEnginesError(error)) {
      throw new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", error.message, {
        cause: error,
      });
    }
    throw error;
  }
}

/** Stored JSON → spec; the store only ever holds specs that passed validation. */
export function deploymentSpecFromJson(json: string): DeploymentSpec {
  const parsed = parseDeploymentSpec(JSON.parse(json));
  if (!parsed.ok) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
      `a stored deployment no longer validates: ${parsed.error.message}`,
      { cause: parsed.error },
    );
  }
  return parsed.spec;
}
