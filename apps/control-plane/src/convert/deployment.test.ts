import { create } from "@bufbuild/protobuf";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { DeploymentSchema, Engine, RoutingPolicy } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  deploymentSpecFromProto,
  deploymentSpecToProto,
  sameDeploymentSpec,
} from "./deployment.js";

describe("deployment converter", () => {
  it.each([
    { name: "chat", model: "org/m", engine: "vllm" },
    {
      name: "big",
      model: "meta-llama/Llama-3.1-70B-Instruct",
      servedModelName: "llama-70b",
      engine: "sglang",
      gpuClass: "h100-80g",
      tensorParallel: 8,
      pipelineParallel: 2,
      replicas: 3,
      quantization: "fp8",
      kvCacheDtype: "fp8_e5m2",
      maxModelLen: 32768,
      gpuMemoryUtilization: 0.9,
      modelSizeBytes: 140_000_000_000,
      extraArgs: ["--max-running-requests", "128"],
      env: { NCCL_DEBUG: "INFO" },
      routingPolicy: "least-loaded",
      priority: 5,
      allowPreemption: true,
      loadingDeadlineSeconds: 1800,
      revision: 7,
      dtype: "bfloat16",
      trustRemoteCode: true,
      fabric: "ib-a",
      maxConcurrencyPerReplica: 32,
      nodesPerReplica: 2,
    },
    {
      name: "tiny",
      model: "/models/tiny.gguf",
      engine: "llamacpp",
      gpusPerReplica: 0,
      replicas: 0,
    },
  ])("round-trips $name through the wire type unchanged", (input) => {
    const spec = parseDeploymentSpecOrThrow(input);
    expect(deploymentSpecFromProto(deploymentSpecToProto(spec))).toEqual(spec);
  });

  it("maps enums and treats proto zero values as unset", () => {
    const spec = deploymentSpecFromProto(
      create(DeploymentSchema, {
        name: "x",
        model: "m",
        engine: Engine.SIM,
        routingPolicy: RoutingPolicy.ROUND_ROBIN,
        replicas: 2,
      }),
    );
    expect(spec).toMatchObject({
      engine: "sim",
      routingPolicy: "round-robin",
      tensorParallel: 1,
      servedModelName: "x",
      replicas: 2,
    });
    expect(spec.gpuClass).toBeUndefined();
  });

  it("refuses an invalid spec with the engines package's per-field message", () => {
    expect(() =>
      deploymentSpecFromProto(
        create(DeploymentSchema, { name: "x", model: "--evil", engine: Engine.UNSPECIFIED }),
      ),
    ).toThrow(/model: .*must not start with "-".*engine:/);
  });

  it("compares specs ignoring the revision", () => {
    const a = parseDeploymentSpecOrThrow({ name: "a", model: "m", engine: "vllm", revision: 1 });
    expect(sameDeploymentSpec(a, { ...a, revision: 9 })).toBe(true);
    expect(sameDeploymentSpec(a, { ...a, replicas: 2 })).toBe(false);
  });
});
