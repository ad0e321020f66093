import { create } from "@bufbuild/protobuf";
import {
  type DeploymentSpec,
  type EngineName,
  parseDeploymentSpecOrThrow,
  type RoutingPolicy as RoutingPolicyName,
} from "@llmgw/engines";
import { type Deployment, DeploymentSchema, Engine, RoutingPolicy } from "@llmgw/proto";

const ENGINE_BY_PROTO: Readonly<Record<number, EngineName>> = {
  [Engine.VLLM]: "vllm",
  [Engine.SGLANG]: "sglang",
  [Engine.LLAMACPP]: "llamacpp",
  [Engine.SIM]: "sim",
};
const ENGINE_TO_PROTO: Readonly<Record<EngineName, Engine>> = {
  vllm: Engine.VLLM,
  sglang: Engine.SGLANG,
  llamacpp: Engine.LLAMACPP,
  sim: Engine.SIM,
};
const POLICY_BY_PROTO: Readonly<Record<number, RoutingPolicyName>> = {
  [RoutingPolicy.LLMGW]: "llmgw",
  [RoutingPolicy.ROUND_ROBIN]: "round-robin",
  [RoutingPolicy.LEAST_LOADED]: "least-loaded",
};
const POLICY_TO_PROTO: Readonly<Record<RoutingPolicyName, RoutingPolicy>> = {
  llmgw: RoutingPolicy.LLMGW,
  "round-robin": RoutingPolicy.ROUND_ROBIN,
  "least-loaded": RoutingPolicy.LEAST_LOADED,
};

/** proto3 scalars cannot say "unset": treat the zero value as absent where zero is never valid. */
const nonZero = <T>(v: T): T | undefined => (v === 0 || v === "" ? undefined : v);

/**
 * Wire `Deployment` → plain input for `@llmgw/engines`' schema. Unset enums become absent
 * (so validation names them), `0` TP/PP fall back to the default, `replicas` keeps 0.
 */
export function deploymentInputFromProto(d: Deployment): Record<string, unknown> {
  return {
    name: d.name,
    model: d.model,
    servedModelName: nonZero(d.servedModelName),
    engine: ENGINE_BY_PROTO[d.engine],
    gpuClass: nonZero(d.gpuClass),
    tensorParallel: nonZero(d.tensorParallel),
    pipelineParallel: nonZero(d.pipelineParallel),
    replicas: d.replicas,
    quantization: d.quantization,
    kvCacheDtype: d.kvCacheDtype,
    maxModelLen: d.maxModelLen,
    gpuMemoryUtilization: d.gpuMemoryUtilization,
    modelSizeBytes: d.modelSizeBytes === undefined ? undefined : Number(d.modelSizeBytes),
    extraArgs: [...d.extraArgs],
    env: { ...d.env },
    routingPolicy: POLICY_BY_PROTO[d.routingPolicy],
    priority: d.priority,
    allowPreemption: d.allowPreemption,
    loadingDeadlineSeconds: d.loadingDeadlineSeconds,
    revision: Number(d.revision),
    dtype: d.dtype,
    trustRemoteCode: d.trustRemoteCode,
    fabric: d.fabric,
    maxConcurrencyPerReplica: d.maxConcurrencyPerReplica,
    nodesPerReplica: d.nodesPerReplica,
    gpusPerReplica: d.gpusPerReplica,
    maxSurge: d.maxSurge,
    maxUnavailable: d.maxUnavailable,
    drainTimeoutSeconds: d.drainTimeoutSeconds,
    kvEvents: d.kvEvents,
  };
}

/**
 * Validates a wire `Deployment` with `@llmgw/engines`' schema.
 * @throws EnginesError `LLMGW_ENGINES_INVALID_SPEC` naming every bad field.
 */
export function deploymentSpecFromProto(d: Deployment): DeploymentSpec {
  return parseDeploymentSpecOrThrow(deploymentInputFromProto(d));
}

/** Validated spec → wire `Deployment` (what agents and the admin API receive). */
export function deploymentSpecToProto(spec: DeploymentSpec): Deployment {
  return create(DeploymentSchema, {
    name: spec.name,
    model: spec.model,
    servedModelName: spec.servedModelName,
    engine: ENGINE_TO_PROTO[spec.engine],
    gpuClass: spec.gpuClass ?? "",
    tensorParallel: spec.tensorParallel,
    pipelineParallel: spec.pipelineParallel,
    replicas: spec.replicas,
    quantization: spec.quantization,
    kvCacheDtype: spec.kvCacheDtype,
    maxModelLen: spec.maxModelLen,
    gpuMemoryUtilization: spec.gpuMemoryUtilization,
    modelSizeBytes: spec.modelSizeBytes === undefined ? undefined : BigInt(spec.modelSizeBytes),
    extraArgs: [...spec.extraArgs],
    env: { ...spec.env },
    routingPolicy: POLICY_TO_PROTO[spec.routingPolicy],
    priority: spec.priority,
    allowPreemption: spec.allowPreemption,
    loadingDeadlineSeconds: spec.loadingDeadlineSeconds,
    revision: BigInt(spec.revision),
    dtype: spec.dtype,
    trustRemoteCode: spec.trustRemoteCode,
    fabric: spec.fabric,
    maxConcurrencyPerReplica: spec.maxConcurrencyPerReplica,
    nodesPerReplica: spec.nodesPerReplica,
    gpusPerReplica: spec.gpusPerReplica,
    maxSurge: spec.maxSurge,
    maxUnavailable: spec.maxUnavailable,
    drainTimeoutSeconds: spec.drainTimeoutSeconds,
    kvEvents: spec.kvEvents,
  });
}

/** A spec's identity: revision zeroed, env keys sorted (their order means nothing). */
const canonicalSpec = (s: DeploymentSpec): string =>
  JSON.stringify({
    ...s,
    revision: 0,
    env: Object.fromEntries(Object.entries(s.env).sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0))),
  });

/**
 * True when two specs ask for the same thing (the revision and the order of `env` keys are
 * ignored: re-applying a spec with its env written in another order must not roll replicas).
 */
export function sameDeploymentSpec(a: DeploymentSpec, b: DeploymentSpec): boolean {
  return canonicalSpec(a) === canonicalSpec(b);
}
