import { describe, expect, it } from "vitest";
import type { AvoidedNodeRecord } from "../store/types.js";
import {
  AVOID_MEMORY_MS,
  AVOID_MS,
  avoidPeriodMs,
  FailingReplicas,
  MAX_AVOID_MS,
  periodText,
  STABLE_MS,
} from "./failing-replicas.js";

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
    expect(f.avoidedBy("chat", 1)).toEqual([
      { deployment: "chat", nodeId: "n1", untilMs: AVOID_MS, moves: 1, movedAtMs: 0 },
    ]);
    f.deploymentGone("chat");
    expect(f.avoided(1)).toEqual([{ deployment: "embed", nodeId: "n2" }]);
  });

  it("doubles the period of each move in a row off a node, up to MAX_AVOID_MS", () => {
    expect([1, 2, 3, 4, 5, 6, 7, 99].map(avoidPeriodMs).map(periodText)).toEqual([
      "60 min",
      "2 h",
      "4 h",
      "8 h",
      "16 h",
      "24 h",
      "24 h",
      "24 h",
    ]);
    const f = new FailingReplicas(AFTER);
    let now = 0;
    for (const moves of [1, 2, 3, 4, 5, 6, 7]) {
      expect(f.periodMs("chat", ["n1"], now)).toBe(avoidPeriodMs(moves));
      f.moved("chat", ["n1"], now);
      const [record] = f.avoidedBy("chat", now);
      expect(record).toMatchObject({ moves, untilMs: now + avoidPeriodMs(moves) });
      // Back on the node once the avoidance ended (or while it lasts: nothing else fitted).
      now = (record?.untilMs ?? 0) + (moves % 2 === 0 ? 60_000 : -60_000);
    }
    expect(avoidPeriodMs(7)).toBe(MAX_AVOID_MS);
    // A node with no move yet beside one with six: the longest period counts.
    expect(f.periodMs("chat", ["n2", "n1"], now)).toBe(MAX_AVOID_MS);
    expect(f.periodMs("chat", ["n2"], now)).toBe(AVOID_MS);
  });

  it("counts a move AVOID_MEMORY_MS after the node's avoidance ended as a first again", () => {
    const f = new FailingReplicas(AFTER);
    f.moved("chat", ["n1"], 0);
    f.moved("chat", ["n1"], AVOID_MS + AVOID_MEMORY_MS - 1);
    expect(f.avoidedBy("chat", AVOID_MS + AVOID_MEMORY_MS)[0]?.moves).toBe(2);
    const ended = AVOID_MS + AVOID_MEMORY_MS - 1 + avoidPeriodMs(2);
    f.moved("chat", ["n1"], ended + AVOID_MEMORY_MS);
    expect(f.avoidedBy("chat", ended + AVOID_MEMORY_MS)[0]?.moves).toBe(1);
  });

  it("starts from the stored avoidances, and tells its sink each change", () => {
    const stored: AvoidedNodeRecord[] = [
      { deployment: "chat", nodeId: "n1", untilMs: 5_000, moves: 2, movedAtMs: 0 },
      { deployment: "chat", nodeId: "n2", untilMs: 1_000, moves: 1, movedAtMs: 0 },
    ];
    const told: string[] = [];
    const f = new FailingReplicas(AFTER, stored, {
      put: (r) => told.push(`put ${r.deployment}/${r.nodeId} ${r.moves}`),
      delete: (d, n) => told.push(`delete ${d}/${n}`),
    });
    expect(f.avoided(2_000)).toEqual([{ deployment: "chat", nodeId: "n1" }]);
    // n2's avoidance ended but is remembered: a move off it now is the second.
    f.moved("chat", ["n2"], 2_000);
    expect(f.avoidedBy("chat", 2_000).map((r) => [r.nodeId, r.moves])).toEqual([
      ["n1", 2],
      ["n2", 2],
    ]);
    expect(told).toEqual(["put chat/n2 2"]);
    // Forgotten AVOID_MEMORY_MS after their ends.
    expect(f.avoided(5_000 + AVOID_MEMORY_MS)).toEqual([]);
    expect(told).toEqual(["put chat/n2 2", "delete chat/n1"]);
    f.deploymentGone("chat");
    expect(told).toEqual(["put chat/n2 2", "delete chat/n1", "delete chat/n2"]);
  });

  it("unavoids one node or all of a deployment's, forgetting their moves", () => {
    const told: string[] = [];
    const f = new FailingReplicas(AFTER, [], {
      put: () => {},
      delete: (d, n) => told.push(`${d}/${n}`),
    });
    f.moved("chat", ["n1", "n2"], 0);
    f.moved("chat", ["n3"], -AVOID_MS - 1); // ended, remembered
    f.moved("embed", ["n1"], 0);
    expect(f.unavoid("chat", "n2", 1)).toEqual(["n2"]);
    expect(f.unavoid("chat", "n2", 1)).toEqual([]);
    expect(f.unavoid("chat", undefined, 1)).toEqual(["n1"]);
    expect(told).toEqual(["chat/n2", "chat/n1", "chat/n3"]);
    expect(f.avoided(1)).toEqual([{ deployment: "embed", nodeId: "n1" }]);
    // The next move off n3 counts as a first.
    f.moved("chat", ["n3"], 1);
    expect(f.avoidedBy("chat", 1)[0]?.moves).toBe(1);
    expect(f.unavoid("none", undefined, 1)).toEqual([]);
  });
});
