import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  buildNcclEnv,
  NCCL_ENV_KEYS,
  type NcclFabric,
  type NcclGpuNic,
  type NcclPort,
} from "./build-nccl-env.js";
import { isNcclEnvError } from "./errors.js";

// Port facts from shared/reference/formats.md §2.2–2.6 (ACTIVE/LinkUp, RoCE v2 GID index 3,
// renamed ibp12s0, bonded mlx5_bond_0); GPU↔NIC distances from the real 8×H100 topo -m (§1.10).
const IB = "ib:fe80:0000:0000:0000:7cfe90030016aef1";
const IB_B = "ib:fe80:0000:0000:0000:248a0703005c1e20";
const ROCE = "roce:192.168.211.0/24";
const port = (
  device: string,
  linkLayer: NcclPort["linkLayer"],
  extra: Partial<NcclPort> = {},
): NcclPort => ({
  device,
  port: 1,
  linkLayer,
  state: "ACTIVE",
  physState: "LinkUp",
  ...extra,
});
const mlx = (from: number, to: number) =>
  Array.from({ length: to - from }, (_, i) => `mlx5_${from + i}`);
const matrix = (nics: readonly string[]): NcclGpuNic[] =>
  Array.from({ length: 8 }, (_, g) =>
    nics.map((nic, j) => ({
      gpu: g,
      nic,
      path: g === j ? "PIX" : Math.floor(g / 4) === Math.floor(j / 4) ? "NODE" : "SYS",
    })),
  ).flat();
const ibFabric = (id: string, devices: string[], netdevBase = 0): NcclFabric => ({
  id,
  linkLayer: "infiniband",
  ports: devices.map((d, i) => port(d, "infiniband", { netdev: `ib${netdevBase + i}` })),
});

describe("buildNcclEnv", () => {
  it("sets nothing at all for a single-node group, even on a node with IB", () => {
    const report = buildNcclEnv({
      fabrics: [ibFabric(IB, mlx(0, 8))],
      chosenFabricId: IB,
      rankGpus: [0, 1],
      multiNode: false,
    });
    expect(report.env).toEqual({});
    expect(report.reasons).toEqual([expect.stringContaining("single-node group")]);
  });

  it.each([
    {
      what: "8 IB HCAs, all 8 GPUs: every NIC is PIX to one GPU, name order",
      fabrics: [ibFabric(IB, mlx(0, 8))],
      chosen: IB,
      gpus: [0, 1, 2, 3, 4, 5, 6, 7],
      env: {
        NCCL_IB_HCA: "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1",
        NCCL_SOCKET_IFNAME: "=ib0",
        GLOO_SOCKET_IFNAME: "ib0",
      },
    },
    {
      what: "GPUs 6,7: their PIX NICs, then their NUMA half (NODE), then the far half (SYS)",
      fabrics: [ibFabric(IB, mlx(0, 8))],
      chosen: IB,
      gpus: [6, 7],
      env: {
        NCCL_IB_HCA: "=mlx5_6:1,mlx5_7:1,mlx5_4:1,mlx5_5:1,mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1",
        NCCL_SOCKET_IFNAME: "=ib6",
        GLOO_SOCKET_IFNAME: "ib6",
      },
    },
    {
      what: "RoCE: GID index and the Ethernet netdev",
      fabrics: [
        {
          id: ROCE,
          linkLayer: "roce",
          ports: mlx(0, 2).map((d, i) => port(d, "roce", { netdev: `rdma${i}`, gidIndex: 3 })),
        } as NcclFabric,
      ],
      chosen: ROCE,
      gpus: [1],
      env: {
        NCCL_IB_HCA: "=mlx5_1:1,mlx5_0:1",
        NCCL_IB_GID_INDEX: "3",
        NCCL_SOCKET_IFNAME: "=rdma1",
        GLOO_SOCKET_IFNAME: "rdma1",
      },
    },
    {
      what: "renamed device ibp12s0",
      fabrics: [
        {
          id: IB,
          linkLayer: "infiniband",
          ports: [port("ibp12s0", "infiniband", { netdev: "ibs12" })],
        } as NcclFabric,
      ],
      chosen: IB,
      gpus: [0],
      env: { NCCL_IB_HCA: "=ibp12s0:1", NCCL_SOCKET_IFNAME: "=ibs12", GLOO_SOCKET_IFNAME: "ibs12" },
    },
    {
      what: "bonded RoCE device",
      fabrics: [
        {
          id: ROCE,
          linkLayer: "roce",
          ports: [port("mlx5_bond_0", "roce", { netdev: "bond0", gidIndex: 3 })],
        } as NcclFabric,
      ],
      chosen: ROCE,
      gpus: [0],
      env: {
        NCCL_IB_HCA: "=mlx5_bond_0:1",
        NCCL_IB_GID_INDEX: "3",
        NCCL_SOCKET_IFNAME: "=bond0",
        GLOO_SOCKET_IFNAME: "bond0",
      },
    },
    {
      what: "mlx5_1 chosen, mlx5_10/11 on another fabric: exact names, never a prefix",
      fabrics: [ibFabric(IB, ["mlx5_1"]), ibFabric(IB_B, ["mlx5_10", "mlx5_11"], 10)],
      chosen: IB,
      gpus: [0],
      env: { NCCL_IB_HCA: "=mlx5_1:1", NCCL_SOCKET_IFNAME: "=ib0", GLOO_SOCKET_IFNAME: "ib0" },
    },
    {
      what: "two IB fabrics: only the deployment's fabric B",
      fabrics: [ibFabric(IB, mlx(0, 4)), ibFabric(IB_B, mlx(4, 8), 4)],
      chosen: IB_B,
      gpus: [0, 1, 2, 3],
      env: {
        NCCL_IB_HCA: "=mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1",
        NCCL_SOCKET_IFNAME: "=ib4",
        GLOO_SOCKET_IFNAME: "ib4",
      },
    },
    {
      what: "a DOWN port inside the fabric is skipped",
      fabrics: [
        {
          id: IB,
          linkLayer: "infiniband",
          ports: [
            port("mlx5_0", "infiniband", { state: "DOWN", physState: "Polling", netdev: "ib0" }),
            port("mlx5_1", "infiniband", { netdev: "ib1" }),
          ],
        } as NcclFabric,
      ],
      chosen: IB,
      gpus: [0],
      env: { NCCL_IB_HCA: "=mlx5_1:1", NCCL_SOCKET_IFNAME: "=ib1", GLOO_SOCKET_IFNAME: "ib1" },
    },
  ])("$what", (c) => {
    const report = buildNcclEnv({
      fabrics: c.fabrics,
      chosenFabricId: c.chosen,
      rankGpus: c.gpus,
      topology: { gpuNics: matrix([...mlx(0, 12), "ibp12s0", "mlx5_bond_0"]) },
      multiNode: true,
    });
    expect(report.env).toEqual(c.env);
    expect(report.reasons.length).toBeGreaterThanOrEqual(3);
  });

  it("explains each choice", () => {
    const report = buildNcclEnv({
      fabrics: [ibFabric(IB, mlx(0, 2)), ibFabric(IB_B, ["mlx5_10"], 10)],
      chosenFabricId: IB,
      rankGpus: [1],
      topology: { gpuNics: matrix(mlx(0, 2)) },
      multiNode: true,
    });
    expect(report.reasons).toEqual([
      `NCCL_IB_HCA lists the 2 ACTIVE infiniband port(s) of fabric ${IB} as exact names ("=" so e.g. mlx5_1 cannot match mlx5_10); ports of ${IB_B} are left out because the peers are not on them`,
      "ordered nearest to GPU(s) 1 first: mlx5_1:1 PIX, mlx5_0:1 NODE",
      "socket interface ib1: the netdev of mlx5_1:1, which is on the peers' fabric",
      "NCCL_SOCKET_IFNAME==ib1 (exact) and GLOO_SOCKET_IFNAME=ib1 (Gloo takes plain exact names) for bootstrap and CPU groups",
    ]);
  });

  it("uses a configured socket interface over the netdev", () => {
    const report = buildNcclEnv({
      fabrics: [ibFabric(IB, ["mlx5_0"])],
      chosenFabricId: IB,
      rankGpus: [0],
      multiNode: true,
      socketIfname: "bond0",
    });
    expect([report.env.NCCL_SOCKET_IFNAME, report.env.GLOO_SOCKET_IFNAME]).toEqual([
      "=bond0",
      "bond0",
    ]);
  });

  it("leaves the GID index to NCCL when ports disagree", () => {
    const fabric: NcclFabric = {
      id: ROCE,
      linkLayer: "roce",
      ports: [
        port("mlx5_0", "roce", { netdev: "r0", gidIndex: 3 }),
        port("mlx5_1", "roce", { netdev: "r1", gidIndex: 5 }),
      ],
    };
    const report = buildNcclEnv({
      fabrics: [fabric],
      chosenFabricId: ROCE,
      rankGpus: [],
      multiNode: true,
    });
    expect(report.env.NCCL_IB_GID_INDEX).toBeUndefined();
    expect(report.reasons).toContain(
      "NCCL_IB_GID_INDEX left unset: listed ports disagree (mlx5_0=3, mlx5_1=5), NCCL auto-selects per port",
    );
  });

  it.each([
    {
      what: "no fabric chosen",
      opts: { fabrics: [ibFabric(IB, ["mlx5_0"])] },
      code: "LLMGW_NCCL_ENV_NO_FABRIC_CHOSEN",
    },
    {
      what: "fabric not on the node",
      opts: { fabrics: [ibFabric(IB, ["mlx5_0"])], chosenFabricId: ROCE },
      code: "LLMGW_NCCL_ENV_FABRIC_MISSING",
      message: `fabric "${ROCE}" is not on this node (it has "${IB}")`,
    },
    {
      what: "a node with no fabric",
      opts: { fabrics: [], chosenFabricId: IB },
      code: "LLMGW_NCCL_ENV_FABRIC_MISSING",
      message: `fabric "${IB}" is not on this node (it has no fabric)`,
    },
    {
      what: "no ACTIVE port",
      opts: {
        fabrics: [
          {
            id: IB,
            linkLayer: "infiniband",
            ports: [port("mlx5_0", "infiniband", { state: "INIT" })],
          } as NcclFabric,
        ],
        chosenFabricId: IB,
      },
      code: "LLMGW_NCCL_ENV_NO_ACTIVE_PORTS",
    },
    {
      what: "no netdev and none configured",
      opts: {
        fabrics: [
          { id: IB, linkLayer: "infiniband", ports: [port("mlx5_0", "infiniband")] } as NcclFabric,
        ],
        chosenFabricId: IB,
      },
      code: "LLMGW_NCCL_ENV_NO_SOCKET_INTERFACE",
    },
    {
      what: "a device name that would break the list syntax",
      opts: {
        fabrics: [
          {
            id: IB,
            linkLayer: "infiniband",
            ports: [port("mlx5_0,mlx5_9", "infiniband", { netdev: "ib0" })],
          } as NcclFabric,
        ],
        chosenFabricId: IB,
      },
      code: "LLMGW_NCCL_ENV_INVALID_NAME",
    },
    {
      what: "a configured socket interface that would break the list syntax",
      opts: {
        fabrics: [ibFabric(IB, ["mlx5_0"])],
        chosenFabricId: IB,
        socketIfname: "ib0,eth0",
      },
      code: "LLMGW_NCCL_ENV_INVALID_NAME",
      message: 'interface name "ib0,eth0" cannot be listed in NCCL_SOCKET_IFNAME',
    },
  ])("throws $code: $what", (c) => {
    let caught: unknown;
    try {
      buildNcclEnv({ rankGpus: [0], multiNode: true, ...c.opts });
    } catch (error) {
      caught = error;
    }
    expect(isNcclEnvError(caught)).toBe(true);
    expect((caught as { code: string }).code).toBe(c.code);
    if (c.message !== undefined) expect((caught as Error).message).toBe(c.message);
  });
});

describe("property: the env never names an adapter outside the chosen fabric", () => {
  const names = fc.constantFrom(
    ...mlx(0, 20),
    "ibp12s0",
    "ibP16p3s0",
    "rocep193s0f0",
    "mlx5_bond_0",
    "mlx5_bond_1",
  );
  const portArb = fc.record({
    device: names,
    port: fc.integer({ min: 1, max: 2 }),
    linkLayer: fc.constantFrom("infiniband" as const, "roce" as const),
    state: fc.constantFrom("ACTIVE", "ACTIVE", "DOWN", "INIT"),
    physState: fc.constantFrom("LinkUp", "LinkUp", "Polling", "Disabled"),
    netdev: fc.constantFrom("ib0", "ib1", "bond0", "rdma3"),
    gidIndex: fc.option(fc.integer({ min: 0, max: 7 }), { nil: undefined }),
  });
  it("NCCL_IB_HCA is '=' + exactly the chosen fabric's ACTIVE/LinkUp ports, each once", () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(
          fc.record({
            id: fc.constantFrom(IB, IB_B, ROCE, "ib:x"),
            ports: fc.array(portArb, { maxLength: 6 }),
          }),
          {
            selector: (f) => f.id,
            minLength: 1,
            maxLength: 4,
          },
        ),
        fc.nat(),
        fc.uniqueArray(fc.integer({ min: 0, max: 7 }), { maxLength: 8 }),
        (raw, pick, gpus) => {
          // A device lives on one fabric only (as in sysfs): drop later duplicates.
          const taken = new Set<string>();
          const fabrics: NcclFabric[] = raw.map((f) => ({
            id: f.id,
            linkLayer: f.id.startsWith("roce") ? "roce" : "infiniband",
            ports: f.ports.filter((p) => {
              const key = `${p.device}:${p.port}`;
              if (taken.has(key)) return false;
              taken.add(key);
              return true;
            }),
          }));
          const chosen = fabrics[pick % fabrics.length] as NcclFabric;
          const expected = chosen.ports
            .filter((p) => p.state === "ACTIVE" && p.physState === "LinkUp")
            .map((p) => `${p.device}:${p.port}`);
          let env: Readonly<Record<string, string>>;
          try {
            env = buildNcclEnv({
              fabrics,
              chosenFabricId: chosen.id,
              rankGpus: gpus,
              topology: { gpuNics: matrix(mlx(0, 20)) },
              multiNode: true,
            }).env;
          } catch (error) {
            expect(isNcclEnvError(error) && expected.length === 0).toBe(true);
            return;
          }
          for (const key of Object.keys(env)) expect(NCCL_ENV_KEYS).toContain(key);
          const hca = env.NCCL_IB_HCA ?? "";
          expect(hca.startsWith("=")).toBe(true);
          const listed = hca.slice(1).split(",");
          expect([...listed].sort()).toEqual([...expected].sort());
          // A dual-port HCA may have port 1 on one fabric and port 2 on another: the port pins it.
          const others = fabrics
            .filter((f) => f !== chosen)
            .flatMap((f) => f.ports.map((p) => `${p.device}:${p.port}`));
          for (const entry of listed) expect(others).not.toContain(entry);
        },
      ),
      { numRuns: 500 },
    );
  });
});
