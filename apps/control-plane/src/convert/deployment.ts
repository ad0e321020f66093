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

/** A stored spec as this release reads it: see {@link deploymentSpecFromJson}. */
export interface StoredDeploymentSpec {
  readonly spec: DeploymentSpec;
  /**
   * Why this release refuses the spec, which an older one accepted and stored (an engine
   * flag or env name it has since taken over, an env bound it added): the engines error's
   * message, naming each field. Absent when the spec validates.
   */
  readonly refused?: string;
}

/**
 * Stored JSON → spec. The store only ever holds specs that passed the validation of the
 * release that wrote them; a later release refuses more (each one owns more engine flags and
 * env names), so the spec is read with the policy rules reported rather than enforced
 * (`parseDeploymentSpec`'s `policy: "report"`): a spec an older release accepted loads as
 * stored, with `refused` saying why this release would not accept it, and the control plane
 * starts (the cluster marks the deployment and launches nothing more for it).
 *
 * Anything else wrong still throws `LLMGW_CONTROL_PLANE_STORE_CORRUPT` naming `what`: JSON
 * that does not parse, a field of the wrong type or shape, an unknown field, a rule between
 * fields broken. No release writes such a record (those rules hold from the first release that
 * stored the field, and a change to the stored shape comes with a store migration), so it is
 * damage or a hand edit, and the control plane cannot tell what the deployment's replicas run,
 * how many GPUs they hold or what to show: guessing would be worse than stopping.
 */
export function deploymentSpecFromJson(
  json: string,
  what = "a stored deployment",
): StoredDeploymentSpec {
  let input: unknown;
  try {
    input = JSON.parse(json);
  } catch (cause) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
      `${what} is not JSON: ${(cause as Error).message}`,
      { cause },
    );
  }
  const parsed = parseDeploymentSpec(input, { policy: "report" });
  if (!parsed.ok) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
      `${what} no longer validates: ${parsed.error.message}`,
      { cause: parsed.error },
    );
  }
  return parsed.refused === undefined
    ? { spec: parsed.spec }
    : { spec: parsed.spec, refused: parsed.refused.message };
}
