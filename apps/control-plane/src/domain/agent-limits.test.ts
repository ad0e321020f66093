import { create } from "@bufbuild/protobuf";
import {
  GpuSchema,
  HeartbeatRequestSchema,
  NodeInventorySchema,
  RegisterRequestSchema,
  ReplicaStatusSchema,
} from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import { AGENT_LIMITS, boundAgentRequest } from "./agent-limits.js";

const gpus = (n: number) =>
  Array.from({ length: n }, (_, i) => create(GpuSchema, { index: i, uuid: `GPU-${i}` }));

const register = (inventory: Parameters<typeof create<typeof NodeInventorySchema>>[1]) =>
  create(RegisterRequestSchema, {
    inventory: create(NodeInventorySchema, { hostname: "node-a", ...inventory }),
  });

describe("boundAgentRequest", () => {
  it.each([
    ["64 GPUs", register({ gpus: gpus(64) }), undefined],
    [
      "100,000 GPUs",
      register({ gpus: gpus(100_000) }),
      "RegisterRequest.inventory.gpus has 100000 entries; the limit is 64",
    ],
    [
      "a 254-character hostname",
      register({ hostname: "h".repeat(254) }),
      "RegisterRequest.inventory.hostname has 254 characters; the limit is 253",
    ],
    [
      "a 300-character GPU name",
      register({ gpus: [create(GpuSchema, { name: "n".repeat(300) })] }),
      "RegisterRequest.inventory.gpus[0].name has 300 characters; the limit is 256",
    ],
    [
      "17 fabrics",
      register({ fabrics: Array.from({ length: 17 }, (_, i) => ({ id: `f${i}` })) }),
      "RegisterRequest.inventory.fabrics has 17 entries; the limit is 16",
    ],
    [
      "65 ports on a fabric",
      register({ fabrics: [{ id: "f", ports: Array.from({ length: 65 }, () => ({})) }] }),
      "RegisterRequest.inventory.fabrics[0].ports has 65 entries; the limit is 64",
    ],
    [
      "65 problems",
      register({ problems: Array.from({ length: 65 }, () => ({ code: "x" })) }),
      "RegisterRequest.inventory.problems has 65 entries; the limit is 64",
    ],
    [
      "129 replicas in a heartbeat",
      create(HeartbeatRequestSchema, {
        replicas: Array.from({ length: 129 }, () => create(ReplicaStatusSchema, {})),
      }),
      "HeartbeatRequest.replicas has 129 entries; the limit is 128",
    ],
    [
      "65 GPU readings",
      create(HeartbeatRequestSchema, {
        gpus: Array.from({ length: 65 }, (_, i) => ({ index: i })),
      }),
      "HeartbeatRequest.gpus has 65 entries; the limit is 64",
    ],
  ])("%s", (_name, request, refusal) => {
    const root =
      request.$typeName === "llmgw.v1.RegisterRequest" ? "RegisterRequest" : "HeartbeatRequest";
    const run = () => boundAgentRequest(root, request);
    if (refusal === undefined) expect(run).not.toThrow();
    else
      expect(run).toThrow(
        expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", message: refusal }),
      );
  });

  it("truncates free text with a marker instead of refusing it", () => {
    const request = create(HeartbeatRequestSchema, {
      problems: [{ code: "disk", message: "m".repeat(5_000) }],
      replicas: [
        create(ReplicaStatusSchema, {
          message: "ok",
          logTail: Array.from({ length: 100 }, (_, i) =>
            i === 99 ? "x".repeat(600) : `line ${i}`,
          ),
        }),
      ],
    });
    boundAgentRequest("HeartbeatRequest", request);
    expect(request.problems[0]?.message).toBe(`${"m".repeat(1_024)}… [3976 more characters]`);
    const tail = request.replicas[0]?.logTail ?? [];
    expect(tail).toHaveLength(AGENT_LIMITS.items["replicas.logTail"] as number);
    expect(tail[0]).toBe("[… 61 earlier lines dropped]");
    expect(tail[1]).toBe("line 61");
    expect(tail.at(-1)).toBe(`${"x".repeat(512)}… [88 more characters]`);
    expect(request.replicas[0]?.message).toBe("ok");
  });
});
