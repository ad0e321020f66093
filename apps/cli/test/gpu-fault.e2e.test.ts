/**
 * Fail closed, end to end, with real processes: a control plane and two agents on simulated
 * nodes, each following a kernel-log FILE (`--kernel-log PATH`). A real Xid 79 line appended
 * to the log of the node running the only replica takes that GPU out: the replica leaves the
 * node (and with it the router's table, which the control plane derives from the same
 * placements in the same turn) and becomes READY on the other node. `llmgw gpu clear` makes
 * the GPU usable again: a replica placed there after the clear becomes READY, the Xid still
 * in the log notwithstanding. The measured times are printed.
 */
import { appendFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { DeploymentSchema, Engine, NodeState } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  AgentProc,
  allReady,
  ControlPlaneProc,
  deployment,
  ensureCliBuilt,
  freePort,
  runLlmgw,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const root = tempRoot("llmgw-e2e-xid-");
let cp: ControlPlaneProc;
const agents = new Map<string, { agent: AgentProc; log: string }>();

/**
 * health-formats.md §1.3, verbatim but for its PCI id: `PCI:0000:06:00` rewritten to the
 * simulated GPU 0's bus (`00000000:01:00.0` in simulate.ts).
 */
const XID79 = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.";

async function llmgw(args: string[]): Promise<{ code: number | null; out: string }> {
  const proc = runLlmgw(args, {
    LLMGW_CONTROL_PLANE: cp.controlUrl,
    LLMGW_ADMIN_TOKEN: cp.token(true),
  });
  const code = await proc.exited;
  return { code, out: proc.output() };
}

/** Node ids that rank 0 of `name`'s replicas sit on. */
async function servingNodes(name: string): Promise<string[]> {
  const d = await deployment(cp, name);
  return (d?.replicas ?? []).flatMap((r) => r.ranks.map((k) => k.nodeId));
}

beforeAll(async () => {
  ensureCliBuilt();
  cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
    "--heartbeat-interval",
    "300ms",
  ]);
  await cp.start();
  for (const name of ["xid-a", "xid-b"]) {
    const log = path.join(root, `${name}.kmsg`);
    writeFileSync(log, "");
    const agent = new AgentProc(root, name, "1xh100-80g", cp);
    agent.start(["--kernel-log", log]);
    agents.set(name, { agent, log });
  }
  await waitFor("both agents to register", async () => {
    const res = await cp.admin().listNodes({}, cp.adminHeaders());
    return res.nodes.filter((n) => n.state === NodeState.READY).length === 2 ? true : undefined;
  });
}, 120_000);

afterAll(async () => {
  await stopAll([root]);
});

describe("an Xid 79 in a node's kernel log", { timeout: 90_000 }, () => {
  it("drains the replica off the GPU, brings it up on the other node, and gpu clear returns the GPU", async () => {
    const admin = cp.admin();
    await admin.applyDeployment(
      {
        deployment: create(DeploymentSchema, {
          name: "xid",
          model: "sim/xid",
          engine: Engine.SIM,
          gpuClass: "h100-80g",
          replicas: 1,
        }),
      },
      cp.adminHeaders(),
    );
    await waitFor("xid to be ready", async () =>
      allReady(await deployment(cp, "xid"), 1) ? true : undefined,
    );
    const [faultyId] = await servingNodes("xid");
    const nodes = (await admin.listNodes({}, cp.adminHeaders())).nodes;
    const faulty = nodes.find((n) => n.nodeId === faultyId);
    const other = nodes.find((n) => n.nodeId !== faultyId);
    const log = agents.get(faulty?.hostname ?? "")?.log as string;

    const t0 = performance.now();
    appendFileSync(log, `${XID79}\n`);
    await waitFor(
      "the replica to leave the faulted GPU",
      async () => ((await servingNodes("xid")).includes(faultyId as string) ? undefined : true),
      10_000,
      10,
    );
    const goneMs = performance.now() - t0;
    await waitFor(
      "the replacement to be READY on the other node",
      async () => {
        const d = await deployment(cp, "xid");
        return allReady(d, 1) && (await servingNodes("xid"))[0] === other?.nodeId
          ? true
          : undefined;
      },
      30_000,
      20,
    );
    const readyMs = performance.now() - t0;
    console.log(
      `Xid 79 written → replica off the GPU (routing): ${goneMs.toFixed(0)} ms; → replacement READY: ${readyMs.toFixed(0)} ms`,
    );
    // Goal (issue 20): (a) ≤ 2 s; (b) ≤ 10 s plus the engine's own load time.
    expect(goneMs).toBeLessThan(2_000);

    const events = (await admin.listEvents({ limit: 200 }, cp.adminHeaders())).events;
    const fault = events.find((e) => e.kind === "gpu.fault" && e.subject === faultyId);
    // The catalog's action for Xid 79 (reboot in NVIDIA's catalog); any actionable one drains.
    expect(fault?.message).toMatch(
      /Xid 79 \((reset-gpu|drain-node|reboot): out of service until cleared\)/,
    );
    expect(fault?.message).toContain(`evidence: ${XID79}`);

    const shown = await llmgw(["nodes", "show", faulty?.hostname as string]);
    expect(shown.code, shown.out).toBe(0);
    expect(shown.out).toMatch(/^0 +h100-80g +nvidia +00000000:01:00\.0 +unhealthy/m);
    expect(shown.out).toMatch(
      /^0 +Xid 79 +(reset-gpu|drain-node|reboot) +1 +\S+ +NVRM: Xid \(PCI:0000:01:00\): 79, /m,
    );

    // Nothing comes back by itself: scaling up leaves the second replica unplaced.
    await admin.scaleDeployment({ name: "xid", replicas: 2 }, cp.adminHeaders());
    expect((await deployment(cp, "xid"))?.replicas).toHaveLength(1);

    const cleared = await llmgw(["gpu", "clear", faulty?.hostname as string, "0"]);
    expect(cleared.code, cleared.out).toBe(0);
    expect(cleared.out).toBe(
      `${faulty?.hostname} GPU 0: 1 fault cleared; a record seen after this counts again\n`,
    );
    // Usable again: the control plane places the second replica on the cleared GPU, and the
    // agent runs it although the Xid 79 is still in its kernel log: its launch check leaves
    // kernel-log faults to the control plane, which alone knows of the clear.
    await waitFor("a replica placed on the cleared GPU", async () =>
      (await servingNodes("xid")).includes(faultyId as string) ? true : undefined,
    );
    await waitFor(
      "both replicas READY, one of them on the cleared GPU",
      async () =>
        allReady(await deployment(cp, "xid"), 2) &&
        (await servingNodes("xid")).includes(faultyId as string)
          ? true
          : undefined,
      30_000,
      20,
    );
    const node = (await admin.getNode({ node: faultyId as string }, cp.adminHeaders())).node;
    expect(node?.gpuReadings[0]?.healthy).toBe(true);
    expect(node?.gpuReadings[0]?.faults).toEqual([]);
    const after = await llmgw(["nodes", "show", faulty?.hostname as string]);
    expect(after.out).toMatch(/^0 +h100-80g +nvidia +00000000:01:00\.0 +healthy/m);
    expect(after.out).toContain("no kernel-log faults");
  });
});
