import { create } from "@bufbuild/protobuf";
import {
  DeploymentSchema,
  type DeploymentStatus,
  DeploymentStatusSchema,
  ReplicaRetirementSchema,
  ReplicaState,
  RetirementPhase,
} from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import { capacity, whole } from "./lifecycle.js";

type Leaving = "waiting" | "draining" | undefined;
/** A deployment at `revision` with replicas [state, revision, leaving]. */
const status = (revision: bigint, replicas: [ReplicaState, bigint, Leaving][]): DeploymentStatus =>
  create(DeploymentStatusSchema, {
    spec: create(DeploymentSchema, { name: "chat", replicas: replicas.length, revision }),
    replicas: replicas.map(([state, rev, leaving], i) => ({
      replicaId: `chat-${i}`,
      deployment: "chat",
      revision: rev,
      state,
      ranks: [{ replicaId: `chat-${i}`, rank: 0, nodeId: "n", status: { state } }],
      ...(leaving === undefined
        ? {}
        : {
            retirement: create(ReplicaRetirementSchema, {
              phase: leaving === "waiting" ? RetirementPhase.WAITING : RetirementPhase.DRAINING,
            }),
          }),
    })),
  });
const { READY, STARTING } = ReplicaState;

describe("capacity: replicas taking new requests", () => {
  it.each([
    [
      "all ready",
      status(1n, [
        [READY, 1n, undefined],
        [READY, 1n, undefined],
      ]),
      2,
    ],
    [
      "one starting",
      status(1n, [
        [READY, 1n, undefined],
        [STARTING, 1n, undefined],
      ]),
      1,
    ],
    [
      "an old one waiting for its replacement",
      status(2n, [
        [READY, 1n, "waiting"],
        [STARTING, 2n, undefined],
      ]),
      1,
    ],
    [
      "an old one draining",
      status(2n, [
        [READY, 1n, "draining"],
        [READY, 2n, undefined],
      ]),
      1,
    ],
    ["none known", undefined, 0],
  ])("%s → %i", (_what, d, expected) => {
    expect(capacity(d)).toBe(expected);
  });
});

describe("whole: count, all ready, current revision, none leaving", () => {
  it.each([
    [
      "whole",
      status(2n, [
        [READY, 2n, undefined],
        [READY, 2n, undefined],
      ]),
      2,
      true,
    ],
    ["one short", status(2n, [[READY, 2n, undefined]]), 2, false],
    [
      "one extra",
      status(2n, [
        [READY, 2n, undefined],
        [READY, 2n, undefined],
      ]),
      1,
      false,
    ],
    [
      "one at the old revision",
      status(2n, [
        [READY, 1n, undefined],
        [READY, 2n, undefined],
      ]),
      2,
      false,
    ],
    [
      "one starting",
      status(2n, [
        [STARTING, 2n, undefined],
        [READY, 2n, undefined],
      ]),
      2,
      false,
    ],
    [
      "one still draining",
      status(2n, [
        [READY, 2n, "draining"],
        [READY, 2n, undefined],
      ]),
      2,
      false,
    ],
    ["unknown", undefined, 0, false],
  ])("%s → %s", (_what, d, count, expected) => {
    expect(whole(d, count)).toBe(expected);
  });
});
