import { ReplicaState as S } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  aggregateRankStates,
  aggregateReplicaState,
  joinHostPort,
  replicaStateFromProto,
  replicaStateFromRecord,
  replicaStateName,
  replicaStateToProto,
} from "./replica-state.js";

describe("aggregateReplicaState", () => {
  it.each<[string, (S | undefined)[], S]>([
    ["no ranks reported", [undefined, undefined], S.PENDING],
    ["one rank ready, one loading", [S.READY, S.LOADING], S.LOADING],
    ["one rank not reported", [S.READY, undefined], S.PENDING],
    ["all ready", [S.READY, S.READY], S.READY],
    ["a failed rank wins", [S.READY, S.FAILED], S.FAILED],
    ["unhealthy beats loading", [S.UNHEALTHY, S.LOADING], S.UNHEALTHY],
    ["failed beats exited", [S.EXITED, S.FAILED], S.FAILED],
    ["single starting", [S.STARTING], S.STARTING],
  ])("%s", (_, ranks, expected) => {
    expect(replicaStateName(aggregateReplicaState(ranks))).toBe(replicaStateName(expected));
  });
});

describe("aggregateRankStates", () => {
  it("decides by name as the wire form does", () => {
    expect(aggregateRankStates([])).toBe("pending");
    expect(aggregateRankStates(["ready", "loading"])).toBe("loading");
    expect(aggregateRankStates(["ready", undefined])).toBe("pending");
    expect(aggregateRankStates(["unhealthy", "exited", "ready"])).toBe("exited");
    expect(aggregateRankStates(["ready", "ready"])).toBe("ready");
  });
});

describe("replica state names", () => {
  it("round-trips every wire state, and reads unset or unknown ones as pending", () => {
    for (const s of [
      S.PENDING,
      S.STARTING,
      S.LOADING,
      S.READY,
      S.UNHEALTHY,
      S.STOPPING,
      S.EXITED,
      S.FAILED,
    ])
      expect(replicaStateToProto(replicaStateFromProto(s))).toBe(s);
    expect(replicaStateFromProto(S.UNSPECIFIED)).toBe("pending");
    // A newer agent's state: never ready, never failed.
    expect(replicaStateFromProto(99 as S)).toBe("pending");
  });

  it("takes back only names it wrote", () => {
    expect(replicaStateFromRecord("ready")).toBe("ready");
    expect(replicaStateFromRecord("toString")).toBeUndefined();
    expect(replicaStateFromRecord("READY")).toBeUndefined();
  });
});

describe("joinHostPort", () => {
  it.each([
    ["10.0.0.5", 8000, "10.0.0.5:8000"],
    ["fd00::1", 8000, "[fd00::1]:8000"],
    ["node-a", 1, "node-a:1"],
  ])("%s %i → %s", (host, port, expected) => {
    expect(joinHostPort(host, port)).toBe(expected);
  });
});
