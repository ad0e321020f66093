import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { ReplicaAssignmentSchema, ReplicaState } from "@llmgw/proto";
import { createSupervisor, silentLogger } from "@llmgw/supervisor";
import { deploymentSpecToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { ReplicaManager } from "./replica-manager.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function manager() {
  const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-replica-manager-"));
  dirs.push(stateDir);
  const node = simulateInventory("1xh100-80g", { hostname: "node-a" });
  return new ReplicaManager({
    supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids") }),
    stateDir,
    inventory: () => node,
    nodeConfig: {},
    probes: {
      probe: async () => "ready",
      scrapeLoad: async () => ({}),
    },
    baseEnv: {},
    secretEnv: {},
    logger: silentLogger,
    probeIntervalMs: 1000,
    probeTimeoutMs: 1000,
    defaultLoadingDeadlineMs: 60_000,
    localAddress: "127.0.0.1",
  });
}

/** An assignment the node cannot run: GPU 3 on a one-GPU node. */
function impossible(revision: bigint) {
  const deployment = deploymentSpecToProto(
    parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "sim" }),
  );
  deployment.revision = revision;
  return create(ReplicaAssignmentSchema, {
    replicaId: "m-0",
    rank: 0,
    gpuIndices: [3],
    deployment,
  });
}

describe("ReplicaManager", () => {
  it("reports an assignment it cannot run as FAILED without launching, until it is withdrawn", async () => {
    const m = manager();
    await m.apply([impossible(1n)]);
    const [status] = m.statuses();
    expect(status).toMatchObject({ replicaId: "m-0", state: ReplicaState.FAILED, revision: 1n });
    expect(status?.message).toContain("LLMGW_ENGINES_GPU_NOT_FOUND");
    expect(m.managedPids().size).toBe(0);

    await m.apply([impossible(2n)]);
    expect(m.statuses()).toMatchObject([{ state: ReplicaState.FAILED, revision: 2n }]);

    await m.apply([]);
    expect(m.statuses()).toEqual([]);
    await m.close(true);
  });
});
