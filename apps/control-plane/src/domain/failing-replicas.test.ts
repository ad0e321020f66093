import { describe, expect, it } from "vitest";
import { AVOID_MS, FailingReplicas, STABLE_MS } from "./failing-replicas.js";

const AFTER = 5 * 60_000;
const failed = () => true;

describe("FailingReplicas", () => {
  it("is due once the streak's first failure is older than moveAfterMs, and offered once", () => {
    const f = new FailingReplicas(AFTER);
    f.failed("chat-0", "n1", 0);
    f.failed("chat-0", "n2", 60_000);
    expect(f.anyNewlyDue(AFTER - 1, failed)).toBe(false);
    expect(f.due(AFTER - 1, failed)).toEqual([]);
    expect(f.anyNewlyDue(AFTER, failed)).toBe(true);
    expect(f.anyNewlyDue(AFTER, () => false)).toBe(false);
    const due = f.due(AFTER, failed);
    expect(due).toEqual([{ replicaId: "chat-0", sinceMs: 0, nodes: ["n1", "n2"] }]);
    // Not offered until a plan took it (a reconcile that throws leaves it due for a tick).
    expect(f.anyNewlyDue(AFTER, failed)).toBe(true);
    f.offered(due);
    // Offered: a tick does not ask again, a reconcile for another cause still passes it.
    expect(f.anyNewlyDue(AFTER + 1, failed)).toBe(false);
    expect(f.due(AFTER + 1, failed)).toHaveLength(1);
    // Failing again makes it new.
    f.failed("chat-0", "n1", AFTER + 2);
    expect(f.anyNewlyDue(AFTER + 2, failed)).toBe(true);
    f.forget("chat-0");
    expect(f.due(AFTER * 10, failed)).toEqual([]);
  });

  it("starts a new streak on a failure STABLE_MS after the replica last turned ready", () => {
    const f = new FailingReplicas(AFTER);
    f.failed("chat-0", "n1", 0);
    f.ready("chat-0", 1_000);
    f.failed("chat-0", "n1", 1_000 + STABLE_MS - 1);
    expect(f.due(AFTER * 10, failed)[0]?.sinceMs).toBe(0);
    f.ready("chat-0", 20 * STABLE_MS);
    f.failed("chat-0", "n2", 21 * STABLE_MS);
    expect(f.due(21 * STABLE_MS + AFTER, failed)).toEqual([
      { replicaId: "chat-0", sinceMs: 21 * STABLE_MS, nodes: ["n2"] },
    ]);
  });

  it("never moves with moveAfterMs 0", () => {
    const f = new FailingReplicas(0);
    f.failed("chat-0", "n1", 0);
    expect(f.anyNewlyDue(1e9, failed)).toBe(false);
    expect(f.due(1e9, failed)).toEqual([]);
  });

  it("avoids a moved replica's nodes for AVOID_MS", () => {
    const f = new FailingReplicas(AFTER);
    f.moved("chat", ["n1"], 0);
    f.moved("embed", ["n1", "n2"], 1_000);
    expect(f.avoided(AVOID_MS - 1)).toEqual([
      { deployment: "chat", nodeId: "n1" },
      { deployment: "embed", nodeId: "n1" },
      { deployment: "embed", nodeId: "n2" },
    ]);
    expect(f.avoided(AVOID_MS)).toEqual([
      { deployment: "embed", nodeId: "n1" },
      { deployment: "embed", nodeId: "n2" },
    ]);
    expect(f.avoided(AVOID_MS + 1_000)).toEqual([]);
  });

  it("forgets a deleted deployment's avoided nodes", () => {
    const f = new FailingReplicas(AFTER);
    f.moved("chat", ["n1"], 0);
    f.moved("embed", ["n2"], 0);
    expect(f.avoidedBy("chat", 1)).toEqual([{ nodeId: "n1", untilMs: AVOID_MS }]);
    f.deploymentGone("chat");
    expect(f.avoided(1)).toEqual([{ deployment: "embed", nodeId: "n2" }]);
  });
});
