import { describe, expect, it } from "vitest";
import { isControlPlaneError } from "../errors.js";
import type { StoreSnapshot } from "./postgres-store.js";
import { snapshotStore } from "./snapshot-store.js";
import { LIFECYCLE, revision } from "./test-records.js";

const event = (id: number) => ({
  id,
  atMs: id,
  kind: "k",
  subject: "s",
  message: `m${id}`,
  severity: "info" as const,
});

const snapshot: StoreSnapshot = {
  deployments: [{ name: "chat", specJson: "{}", revision: 1, createdAtMs: 1, updatedAtMs: 1 }],
  deploymentRevisions: LIFECYCLE.revisions,
  placements: LIFECYCLE.placements,
  apiKeys: [],
  tenants: [],
  nodes: LIFECYCLE.nodes,
  faultClears: [],
  replicaStatuses: [],
  avoidedNodes: [],
  events: [event(3), event(4), event(5), event(6)],
  lastEventId: 6,
};

describe("snapshotStore", () => {
  it("lists what the snapshot holds, events as the stores do", () => {
    const store = snapshotStore(snapshot, "postgres://db/llmgw");
    expect(store.listDeployments().map((d) => d.name)).toEqual(["chat"]);
    expect(store.listDeploymentRevisions()).toEqual(LIFECYCLE.revisions);
    expect(store.listPlacements()).toEqual(LIFECYCLE.placements);
    expect(store.listNodes()).toEqual(LIFECYCLE.nodes);
    expect(store.listEvents({ limit: 2 }).map((e) => e.id)).toEqual([5, 6]);
    expect(store.listEvents({ afterId: 4, limit: 10 }).map((e) => e.id)).toEqual([5, 6]);
    // Paging: the oldest ones after the id, not the newest.
    expect(store.listEvents({ afterId: 3, limit: 2 }).map((e) => e.id)).toEqual([4, 5]);
    expect(store.listEvents({ afterId: 6, limit: 10 })).toEqual([]);
    // A caller changing what it got changes nothing held.
    store.listDeployments().pop();
    expect(store.listDeployments()).toHaveLength(1);
    store.listDeploymentRevisions().pop();
    expect(store.listDeploymentRevisions()).toHaveLength(3);
  });

  it("refuses every write: only the leader writes", () => {
    const store = snapshotStore(snapshot, "postgres://db/llmgw");
    const writes: (() => unknown)[] = [
      () => store.putDeployment(snapshot.deployments[0] as never),
      () => store.deleteDeployment("chat"),
      () => store.putDeploymentRevision(revision("chat", 2)),
      () => store.deleteDeploymentRevision("chat", 3),
      () => store.putPlacement(LIFECYCLE.placements[0]!),
      () => store.putNode(LIFECYCLE.nodes[0]!),
      () => store.deletePlacement("chat-0"),
      () => store.putNodeState("n1", "ready", 1),
      () => store.appendEvent({ atMs: 1, kind: "k", subject: "s", message: "m", severity: "info" }),
      () => store.transaction(() => store.deleteNode("n1")),
    ];
    for (const write of writes) {
      let thrown: unknown;
      try {
        write();
      } catch (error) {
        thrown = error;
      }
      expect(isControlPlaneError(thrown) && thrown.code).toBe("LLMGW_CONTROL_PLANE_NOT_LEADER");
      expect((thrown as Error).message).toContain("postgres://db/llmgw is read-only");
    }
  });
});
