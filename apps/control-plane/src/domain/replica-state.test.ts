import { ReplicaState as S } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import { aggregateReplicaState, joinHostPort, replicaStateName } from "./replica-state.js";

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

describe("joinHostPort", () => {
  it.each([
    ["10.0.0.5", 8000, "10.0.0.5:8000"],
    ["fd00::1", 8000, "[fd00::1]:8000"],
    ["node-a", 1, "node-a:1"],
  ])("%s %i → %s", (host, port, expected) => {
    expect(joinHostPort(host, port)).toBe(expected);
  });
});
