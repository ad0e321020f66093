// A control plane upgraded to a release whose spec validation is stricter (it owns more engine
// flags and env names) than the one that stored a deployment: it starts, marks the deployment
// invalid, leaves its running replicas alone and launches nothing for it until a corrected spec
// is applied. Real Cluster over SQLite, a manual clock; the older release is played by writing
// the stored spec JSON directly, as that release's validation let it through.
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { schedule } from "@llmgw/scheduler";
import { describe, expect, it } from "vitest";
import { createClusterView } from "../cluster-view.js";
import { deploymentToProto } from "../convert/views.js";
import { isControlPlaneError } from "../errors.js";
import type { ClusterStore } from "../store/types.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { rankStatus } from "../testing/reports.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { Cluster } from "./cluster.js";
import { DRAIN_SETTLE_MS } from "./drains.js";
import type { ReplicaStateName } from "./replica-state.js";

let store: ClusterStore;
let clock: ManualClock;

sqliteStoreEachTest("llmgw-refused-", (f) => {
  ({ store, clock } = f);
});

const spec = (input: Record<string, unknown> = {}) =>
  parseDeploymentSpecOrThrow({
    engine: "vllm",
    model: "org/model",
    name: "chat",
    gpuClass: "h100-80g",
    replicas: 2,
    ...input,
  });

const newCluster = (options: { readOnly?: boolean; log?: (line: string) => void } = {}) =>
  new Cluster({
    store,
    schedule,
    clock,
    heartbeatIntervalMs: 1000,
    unreachableAfterMs: 3000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
    connectedRouters: () => ["r1"],
    ...options,
  });

/** Every node in `ids` reports every rank it was given, as `state` (per replica id). */
function beat(
  cluster: Cluster,
  ids: readonly string[],
  states: Record<string, ReplicaStateName> = {},
): void {
  for (const nodeId of ids) {
    cluster.heartbeat(nodeId, {
      gpus: [],
      problems: [],
      replicas: cluster.desiredSet(nodeId).assignments.map((x) =>
        rankStatus({
          replicaId: x.replicaId,
          rank: x.rank,
          state: states[x.replicaId] ?? "ready",
          apiPort: 8000 + Number(x.replicaId.split("-").at(-1)),
          revision: x.spec.revision,
        }),
      ),
    });
  }
}

/** Each node's assignments: replica, revision, GPUs and the extra args it is told to run. */
const assignments = (cluster: Cluster, ids: readonly string[]) =>
  ids.flatMap((id) =>
    cluster
      .desiredSet(id)
      .assignments.map(
        (a) => `${id}:${a.replicaId}@r${a.spec.revision}[${a.gpuIndices}] ${a.spec.extraArgs}`,
      ),
  );
const replicas = (cluster: Cluster) =>
  cluster
    .listReplicas()
    .map(
      (r) =>
        `${r.replicaId}@r${r.revision}${r.retirement === undefined ? "" : `:${r.retirement.phase}`}`,
    );
/** Events of `kind` the upgraded control plane recorded (the log is in the store). */
const events = (cluster: Cluster, kind: string) =>
  cluster.events.list({ afterId: upgradedAfter, limit: 500 }).filter((e) => e.kind === kind);
/** The last event the older release recorded. */
let upgradedAfter = 0;

/**
 * The release before: `chat` (2 replicas) placed and serving on four one-GPU nodes. Then what
 * that release's validation let through is written into its stored spec, current and revision
 * record alike: `patch` (an owned flag, by default).
 */
function olderRelease(patch: Record<string, unknown> = { extraArgs: ["-O3"] }) {
  const before = newCluster();
  const ids = ["node-a", "node-b", "node-c", "node-d"].map(
    (hostname, i) =>
      before.register({
        inventory: simulateInventory("1xh100-80g", {
          hostname,
          addresses: [`10.0.0.${i + 1}`],
          nowMs: clock.now(),
        }),
        advertiseAddress: `10.0.0.${i + 1}`,
        replicas: [],
      }).nodeId,
  );
  before.applyDeployment(spec());
  beat(before, ids);
  storeAsOlderRelease("chat", patch);
  upgradedAfter = Math.max(0, ...before.events.list({ limit: 10_000 }).map((e) => e.id));
  return { before, ids };
}

/** Rewrites `name`'s stored spec (and its current revision's record) as `patch` says. */
function storeAsOlderRelease(name: string, patch: Record<string, unknown>): void {
  const record = store.listDeployments().find((d) => d.name === name);
  if (record === undefined) throw new Error(`no stored deployment ${name}`);
  const specJson = JSON.stringify({ ...JSON.parse(record.specJson), ...patch });
  store.putDeployment({ ...record, specJson });
  store.putDeploymentRevision({ name, revision: record.revision, specJson });
}

/** Lets every draining replica go: routers report nothing in flight, the settle time passes. */
function finishDrains(cluster: Cluster): void {
  const draining = cluster
    .listReplicas()
    .filter((r) => r.retirement?.phase === "draining")
    .map((r) => ({ replicaId: r.replicaId, inFlight: 0 }));
  clock.advance(DRAIN_SETTLE_MS);
  cluster.reportInFlight("r1", { epoch: "e1", stateVersion: clock.now(), draining });
  cluster.tick();
}

describe("a stored spec this release refuses", () => {
  it("starts the control plane, marks the deployment invalid and keeps its replicas as placed", () => {
    const { before, ids } = olderRelease();
    const placed = assignments(before, ids).map((a) => a.replace(/ .*$/, ""));
    expect(placed).toHaveLength(2);

    // The upgraded control plane: before this change its constructor threw STORE_CORRUPT.
    const cluster = newCluster();
    const status = cluster.deploymentStatus("chat");
    expect(status.spec.extraArgs).toEqual(["-O3"]);
    expect(status.invalid?.code).toBe("LLMGW_CONTROL_PLANE_SPEC_REFUSED");
    expect(status.invalid?.message).toContain(
      'extraArgs[0]: "-O3" would set -O, which llmgw owns for vllm',
    );
    expect(status.invalid?.message).toContain("llmgw deploy -f");
    // Where every client (`llmgw deployments`, the console) shows a deployment's problems.
    expect(status.unschedulable[0]).toEqual(status.invalid);
    expect(deploymentToProto(status).unschedulable[0]?.code).toBe(
      "LLMGW_CONTROL_PLANE_SPEC_REFUSED",
    );

    // Its replicas stay where they were, and their nodes are told to keep running them.
    beat(cluster, ids);
    cluster.tick();
    expect(assignments(cluster, ids)).toEqual(placed.map((a) => `${a} -O3`));
    expect(replicas(cluster)).toEqual(["chat-0@r1", "chat-1@r1"]);
    expect(cluster.deploymentStatus("chat").readyReplicas).toBe(2);
    expect(
      cluster
        .routingMembership()
        .replicas.map((r) => `${r.id}:${r.state}`)
        .sort(),
    ).toEqual(["chat-0:ready", "chat-1:ready"]);

    // Said once, as it started, not at every reconcile.
    clock.advance(1000);
    beat(cluster, ids);
    cluster.tick();
    const invalid = events(cluster, "deployment.invalid");
    expect(invalid).toHaveLength(1);
    expect(invalid[0]).toMatchObject({ subject: "chat", severity: "error" });
    expect(invalid[0]?.message).toContain('"-O3" would set -O');

    // Nothing wrote the spec back: the next start finds it as stored, and marks it again.
    expect(JSON.parse(store.listDeployments()[0]?.specJson ?? "{}").extraArgs).toEqual(["-O3"]);
    expect(newCluster().deploymentStatus("chat").invalid?.code).toBe(
      "LLMGW_CONTROL_PLANE_SPEC_REFUSED",
    );
  });

  it("loads refused env names and an env over the bound too; a follower's copy records nothing", () => {
    const many = Object.fromEntries(Array.from({ length: 300 }, (_, i) => [`OMP_${i}`, "1"]));
    olderRelease({ env: { ...many, LD_PRELOAD: "/x.so" } });
    const follower = newCluster({ readOnly: true });
    expect(follower.deploymentStatus("chat").invalid?.message).toContain(
      "env may set at most 256 variables",
    );
    expect(events(follower, "deployment.invalid")).toEqual([]);
  });

  it("places no replica for it: not up to its count, not for a lost node, not for a failed one", () => {
    const { ids } = olderRelease({ extraArgs: ["-O3"], replicas: 3 });
    const cluster = newCluster();
    beat(cluster, ids);
    cluster.tick();
    // Two placed of three wanted, two nodes free: still two.
    expect(replicas(cluster)).toEqual(["chat-0@r1", "chat-1@r1"]);
    expect(cluster.deploymentStatus("chat").desiredReplicas).toBe(3);
    expect(events(cluster, "replica.placed")).toEqual([]);

    // The node of chat-0 goes silent until it is lost: chat-0 goes with it, and comes back
    // nowhere (it would hand a node the refused spec).
    const lostNode = cluster.listReplicas()[0]?.ranks[0]?.nodeId as string;
    const live = ids.filter((id) => id !== lostNode);
    for (let t = 0; t < 15; t++) {
      clock.advance(1000);
      beat(cluster, live);
      cluster.tick();
    }
    expect(cluster.nodeState(lostNode)).toBe("lost");
    expect(replicas(cluster)).toEqual(["chat-1@r1"]);
    expect(events(cluster, "replica.placed")).toEqual([]);

    // A failed replica is neither replaced nor moved: its agent's own restarts are all it gets.
    for (let t = 0; t < 20; t++) {
      clock.advance(60_000);
      beat(cluster, live, { "chat-1": "failed" });
      cluster.tick();
    }
    expect(replicas(cluster)).toEqual(["chat-1@r1"]);
    expect(events(cluster, "replica.placed")).toEqual([]);

    // A scale would write the refused spec back: refused, saying why.
    let error: unknown;
    try {
      cluster.scaleDeployment("chat", 4);
    } catch (e) {
      error = e;
    }
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");
    expect((error as Error).message).toMatch(/cannot scale chat: .*"-O3" would set -O/);
  });

  it("a corrected spec updates it as any change does and clears the mark", () => {
    const { ids } = olderRelease();
    const cluster = newCluster();
    beat(cluster, ids);
    // What llmgw_deployment_invalid (and its alert) reads.
    const view = createClusterView(cluster);
    expect(view.deployments()).toMatchObject([{ name: "chat", invalid: true }]);
    expect(cluster.invalidReason("chat")).toContain('"-O3" would set -O');
    const fixed = spec({ extraArgs: ["--optimization-level", "3"], maxSurge: 2 });
    const { changed, status } = cluster.applyDeployment(fixed);
    expect(changed).toBe(true);
    expect(status.invalid).toBeUndefined();
    expect(view.deployments()).toMatchObject([{ name: "chat", invalid: false }]);
    expect(cluster.invalidReason("chat")).toBeUndefined();
    expect(status.unschedulable).toEqual([]);
    expect(status.spec.revision).toBe(2);
    expect(status.rollout?.state).toBe("in-progress");
    // Make before break: the old replicas serve until the new ones do.
    expect(replicas(cluster)).toEqual([
      "chat-0@r1:waiting",
      "chat-1@r1:waiting",
      "chat-2@r2",
      "chat-3@r2",
    ]);
    beat(cluster, ids);
    expect(replicas(cluster)).toEqual([
      "chat-0@r1:draining",
      "chat-1@r1:draining",
      "chat-2@r2",
      "chat-3@r2",
    ]);
    finishDrains(cluster);
    beat(cluster, ids);
    expect(replicas(cluster)).toEqual(["chat-2@r2", "chat-3@r2"]);
    expect(assignments(cluster, ids).every((a) => a.endsWith("--optimization-level,3"))).toBe(true);
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("complete");
    expect(events(cluster, "deployment.updated")[0]?.message).toContain("is valid again");
    // Valid from now on, across a restart too.
    expect(newCluster().deploymentStatus("chat").invalid).toBeUndefined();
  });

  it("deletes as ever", () => {
    const { ids } = olderRelease();
    const cluster = newCluster();
    beat(cluster, ids);
    cluster.deleteDeployment("chat");
    expect(() => cluster.deploymentStatus("chat")).toThrow(/no deployment named "chat"/);
    expect(store.listDeployments()).toEqual([]);
    // Its serving replicas drain, then leave their nodes.
    expect(replicas(cluster)).toEqual(["chat-0@r1:draining", "chat-1@r1:draining"]);
    finishDrains(cluster);
    expect(replicas(cluster)).toEqual([]);
    expect(assignments(cluster, ids)).toEqual([]);
    expect(newCluster().listDeployments()).toEqual([]);
  });

  it("is never the target of a rollback: a failed corrected revision stays, saying why", () => {
    const { ids } = olderRelease();
    const cluster = newCluster();
    beat(cluster, ids);
    cluster.applyDeployment(spec({ extraArgs: ["--fail-load"] }));
    expect(replicas(cluster)).toEqual(["chat-0@r1:waiting", "chat-1@r1", "chat-2@r2"]);
    beat(cluster, ids, { "chat-2": "failed" });
    beat(cluster, ids, { "chat-2": "failed" });
    const status = cluster.deploymentStatus("chat");
    expect(events(cluster, "deployment.rolled-back")).toEqual([]);
    expect([status.spec.revision, status.spec.extraArgs, status.rollout?.state]).toEqual([
      2,
      ["--fail-load"],
      "in-progress",
    ]);
    expect(status.rollout?.message).toMatch(
      /revision 2 failed \(chat-2.*\); not rolled back: the spec of revision 1 is refused by this release \(.*"-O3" would set -O/,
    );
    const refused = events(cluster, "deployment.rollback-refused");
    expect(refused).toHaveLength(1);
    expect(refused[0]?.severity).toBe("error");
    // The old replicas still serve, as the failed update left them.
    expect(replicas(cluster).filter((r) => r.includes("@r1"))).toEqual([
      "chat-0@r1:waiting",
      "chat-1@r1",
    ]);
  });

  it("a kept revision a replica still runs is announced and not rolled back to", () => {
    // The older release was mid-update from revision 1 to 2 when it stopped.
    const { before, ids } = olderRelease({});
    before.applyDeployment(spec({ extraArgs: ["--seed", "2"] }));
    beat(before, ids, { "chat-2": "loading" });
    const one = store.listDeploymentRevisions().find((r) => r.revision === 1);
    if (one === undefined) throw new Error("revision 1 is not kept");
    store.putDeploymentRevision({
      ...one,
      specJson: JSON.stringify({ ...JSON.parse(one.specJson), extraArgs: ["-sc.model", "x"] }),
    });
    upgradedAfter = Math.max(...before.events.list({ limit: 10_000 }).map((e) => e.id));

    const cluster = newCluster();
    expect(cluster.deploymentStatus("chat").invalid).toBeUndefined();
    const announced = events(cluster, "deployment.invalid");
    expect(announced).toHaveLength(1);
    expect(announced[0]?.severity).toBe("warning");
    expect(announced[0]?.message).toMatch(
      /^revision 1 of chat, which replicas still run, is refused/,
    );
    beat(cluster, ids, { "chat-2": "failed" });
    expect(events(cluster, "deployment.rolled-back")).toEqual([]);
    expect(cluster.deploymentStatus("chat").spec.revision).toBe(2);
  });

  it("still refuses to start on a record that is not a spec at all", () => {
    olderRelease();
    for (const specJson of ["{not json", JSON.stringify({ ...spec(), replicas: -1 })]) {
      const record = store.listDeployments()[0];
      if (record === undefined) throw new Error("no stored deployment");
      store.putDeployment({ ...record, specJson });
      let error: unknown;
      try {
        newCluster();
      } catch (e) {
        error = e;
      }
      expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_STORE_CORRUPT");
      expect((error as Error).message).toContain('the stored deployment "chat"');
    }
  });
});
