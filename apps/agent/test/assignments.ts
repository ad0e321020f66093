import { create } from "@bufbuild/protobuf";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { type ReplicaAssignment, ReplicaAssignmentSchema } from "@llmgw/proto";
import { deploymentSpecToProto } from "@llmgw/wire";

/** Replica `m-0` of deployment `m` (model `org/model`, the simulated engine) on GPU 0. */
export function simReplicaAssignment(): ReplicaAssignment {
  return create(ReplicaAssignmentSchema, {
    replicaId: "m-0",
    rank: 0,
    gpuIndices: [0],
    deployment: deploymentSpecToProto(
      parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "sim" }),
    ),
  });
}
