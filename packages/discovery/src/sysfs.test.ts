import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import fc from "fast-check";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  chooseRoceGid,
  ipv4FromGid,
  ipv4Subnet,
  isRoutableGid,
  type NetdevAddressSource,
  PORT_ERROR_COUNTERS,
  type PortCounterRead,
  parseLinkLayer,
  parsePortCounter,
  parseRateGbps,
  parseSysfsState,
  portCounterMax,
  readFabrics,
  readPortStates,
  readSysfsFile,
  type SysfsFileReader,
} from "./sysfs.js";
import { type TreeEntry, writeTree } from "./testing/index.js";

const ZERO = "0000:0000:0000:0000:0000:0000:0000:0000";

describe("sysfs value parsers", () => {
  it.each([
    ["4: ACTIVE", 4, "ACTIVE"],
    ["1: DOWN", 1, "DOWN"],
    ["2: INIT", 2, "INIT"],
    ["5: LinkUp", 5, "LinkUp"],
    ["7: Phy Test", 7, "Phy Test"],
    ["garbage", undefined, "garbage"],
    ["", undefined, "UNKNOWN"],
  ])("parseSysfsState(%j)", (text, code, name) => {
    expect(parseSysfsState(text)).toEqual(code === undefined ? { name } : { code, name });
  });

  it.each([
    ["400 Gb/sec (4X NDR)", 400],
    ["800 Gb/sec (4X XDR)", 800],
    ["25 Gb/sec (1X EDR)", 25],
    ["2.5 Gb/sec (1X SDR)", 2.5],
    ["10 Gb/sec (4X)", 10],
    ["", undefined],
    ["fast", undefined],
  ])("parseRateGbps(%j) = %j", (text, rate) => {
    expect(parseRateGbps(text)).toBe(rate);
  });

  it.each([
    ["InfiniBand", "infiniband"],
    ["Ethernet", "roce"],
    ["Unknown", "unknown"],
    [undefined, "unknown"],
  ])("parseLinkLayer(%j) = %j", (text, layer) => {
    expect(parseLinkLayer(text)).toBe(layer);
  });

  it.each([
    ["0000:0000:0000:0000:0000:ffff:0ac8:010a", "10.200.1.10", true],
    ["0000:0000:0000:0000:0000:ffff:c0a8:d3f2", "192.168.211.242", true],
    ["fe80:0000:0000:0000:0ac0:ebff:fe21:03da", undefined, false],
    [ZERO, undefined, false],
    ["2010:0200:0000:0002:a288:c2ff:fe3b:506a", undefined, true],
    ["::ffff:10.200.1.10", undefined, false],
  ])("GID %s: ipv4 %j, routable %j", (gid, ipv4, routable) => {
    expect(ipv4FromGid(gid)).toBe(ipv4);
    expect(isRoutableGid(gid)).toBe(routable);
  });

  it.each([
    ["10.200.1.10", 24, "10.200.1.0/24"],
    ["10.99.91.35", 31, "10.99.91.34/31"],
    ["192.168.211.242", 16, "192.168.0.0/16"],
    ["172.16.5.4", 32, "172.16.5.4/32"],
  ])("ipv4Subnet(%s, %i) = %s", (address, prefix, subnet) => {
    expect(ipv4Subnet(address, prefix)).toBe(subnet);
  });

  it("chooseRoceGid: the show_gids table picks index 3 (IPv4 RoCE v2)", () => {
    expect(
      chooseRoceGid([
        { index: 0, gid: "fe80:0000:0000:0000:0ac0:ebff:fe21:03da", type: "IB/RoCE v1" },
        { index: 1, gid: "fe80:0000:0000:0000:0ac0:ebff:fe21:03da", type: "RoCE v2" },
        { index: 2, gid: "0000:0000:0000:0000:0000:ffff:c0a8:d3f2", type: "IB/RoCE v1" },
        { index: 3, gid: "0000:0000:0000:0000:0000:ffff:c0a8:d3f2", type: "RoCE v2" },
      ])?.index,
    ).toBe(3);
  });

  it("chooseRoceGid prefers IPv4 over a lower-index global IPv6, skips unreadable types", () => {
    expect(
      chooseRoceGid([
        { index: 1, gid: "2010:0200:0000:0002:a288:c2ff:fe3b:506a", type: "RoCE v2" },
        { index: 2, gid: "0000:0000:0000:0000:0000:ffff:0ac8:010a" },
        { index: 5, gid: "0000:0000:0000:0000:0000:ffff:0ac8:010a", type: "RoCE v2" },
      ])?.index,
    ).toBe(5);
    expect(
      chooseRoceGid([{ index: 1, gid: "2010:0200:0000:0002:a288:c2ff:fe3b:506a", type: "RoCE v2" }])
        ?.index,
    ).toBe(1);
    expect(chooseRoceGid([])).toBeUndefined();
  });

  it("value parsers never throw on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        parseSysfsState(text);
        parseRateGbps(text);
        parseLinkLayer(text);
        ipv4FromGid(text);
        isRoutableGid(text);
      }),
    );
  });
});

/** One port's files, relative to `<device>/ports/<port>/`. */
function port(
  device: string,
  n: number,
  files: Record<string, TreeEntry>,
): Record<string, TreeEntry> {
  return Object.fromEntries(
    Object.entries(files).map(([k, v]) => [`${device}/ports/${n}/${k}`, v]),
  );
}

const ibPort = (device: string, prefixGid = "fe80:0000:0000:0000:506b:4b03:00f5:ce9c") =>
  port(device, 1, {
    state: "4: ACTIVE\n",
    phys_state: "5: LinkUp\n",
    rate: "100 Gb/sec (4X EDR)\n",
    link_layer: "InfiniBand\n",
    lid: "0xf\n",
    sm_lid: "0x1\n",
    "gids/0": `${prefixGid}\n`,
    "gids/1": `${ZERO}\n`,
    "gid_attrs/types/0": "IB/RoCE v1\n",
    "gid_attrs/types/1": { dir: true },
    "gid_attrs/ndevs/0": { dir: true },
  });

const rocePort = (device: string, netdev: string, ipv4Hex: string) =>
  port(device, 1, {
    state: "4: ACTIVE\n",
    phys_state: "5: LinkUp\n",
    rate: "200 Gb/sec (4X HDR)\n",
    link_layer: "Ethernet\n",
    lid: "0x0\n",
    sm_lid: "0x0\n",
    "gids/0": "fe80:0000:0000:0000:0ac0:ebff:fe21:03da\n",
    "gids/1": "fe80:0000:0000:0000:0ac0:ebff:fe21:03da\n",
    "gids/2": `0000:0000:0000:0000:0000:ffff:${ipv4Hex}\n`,
    "gids/3": `0000:0000:0000:0000:0000:ffff:${ipv4Hex}\n`,
    "gids/4": `${ZERO}\n`,
    "gid_attrs/types/0": "IB/RoCE v1\n",
    "gid_attrs/types/1": "RoCE v2\n",
    "gid_attrs/types/2": "IB/RoCE v1\n",
    "gid_attrs/types/3": "RoCE v2\n",
    "gid_attrs/types/4": { dir: true },
    "gid_attrs/ndevs/3": `${netdev}\n`,
    "gid_attrs/ndevs/4": { dir: true },
  });

describe("readFabrics over a temp sysfs tree", () => {
  let base: string;
  let root: string;
  beforeEach(async () => {
    base = await mkdtemp(join(tmpdir(), "llmgw-sysfs-"));
    root = join(base, "infiniband");
  });
  afterEach(async () => {
    await rm(base, { recursive: true, force: true });
  });

  const addresses: NetdevAddressSource = (netdev) =>
    netdev === "ens1f0np0" ? [{ address: "192.168.211.242", prefixLength: 20 }] : [];
  const read = (overrides: { fabricNames?: Map<string, string>; sysfsRoot?: string } = {}) =>
    readFabrics({
      sysfsRoot: overrides.sysfsRoot ?? root,
      fabricNames: overrides.fabricNames ?? new Map(),
      netdevAddresses: addresses,
    });

  it("no infiniband directory at all: no fabrics and no problem (single-node island)", async () => {
    expect(await read({ sysfsRoot: join(root, "missing") })).toEqual({
      fabrics: [],
      inactivePorts: [],
      problems: [],
    });
  });

  it("native IB: fabric id from subnet prefix and SM LID, device facts attached", async () => {
    await writeTree(root, {
      ...ibPort("mlx5_0"),
      "mlx5_0/node_guid": "1070:fd03:0027:250b\n",
      "mlx5_0/device": { link: "../../devices/0000:3b:00.0" },
    });
    await writeTree(join(base, "devices"), {
      "0000:3b:00.0/numa_node": "1\n",
      "0000:3b:00.0/net/ib0": { dir: true },
    });
    const { fabrics, inactivePorts, problems } = await read();
    expect(problems).toEqual([]);
    expect(inactivePorts).toEqual([]);
    expect(fabrics).toEqual([
      {
        id: "ib:fe80:0000:0000:0000:0x1",
        linkLayer: "infiniband",
        idSource: "derived",
        ports: [
          {
            device: "mlx5_0",
            port: 1,
            linkLayer: "infiniband",
            state: "ACTIVE",
            physState: "LinkUp",
            rateGbps: 100,
            netdev: "ib0",
            numaNode: 1,
            guid: "1070:fd03:0027:250b",
            pciBusId: "0000:3b:00.0",
            subnetPrefix: "fe80:0000:0000:0000",
            smLid: "0x1",
          },
        ],
      },
    ]);
  });

  it("RoCE: GID index 3, ipv4, netdev from ndevs, subnet from the netdev's prefix length", async () => {
    await writeTree(root, {
      ...rocePort("mlx5_0", "ens1f0np0", "c0a8:d3f2"),
      "mlx5_0/device/net/ens1f0np0": { dir: true },
      "mlx5_0/device/numa_node": "-1\n",
    });
    const { fabrics, problems } = await read();
    expect(problems).toEqual([]);
    expect(fabrics).toEqual([
      {
        id: "roce:192.168.208.0/20",
        linkLayer: "roce",
        idSource: "derived",
        ports: [
          expect.objectContaining({
            device: "mlx5_0",
            linkLayer: "roce",
            gidIndex: 3,
            ipv4: "192.168.211.242",
            netdev: "ens1f0np0",
            rateGbps: 200,
          }),
        ],
      },
    ]);
    expect(fabrics[0]?.ports[0]?.numaNode).toBeUndefined();
  });

  it("RoCE with an unknown prefix length assumes /24 and says so", async () => {
    await writeTree(root, { ...rocePort("rocep193s0f0", "enp193s0f0np0", "0ac8:010a") });
    const { fabrics, problems } = await read();
    expect(fabrics.map((f) => f.id)).toEqual(["roce:10.200.1.0/24"]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_ROCE_PREFIX_ASSUMED"]);
    expect(problems[0]?.message).toContain("assumed /24");
  });

  it("RoCE port whose GIDs are all zero / link-local is inactive with a problem", async () => {
    await writeTree(
      root,
      port("mlx5_0", 1, {
        state: "4: ACTIVE\n",
        phys_state: "5: LinkUp\n",
        link_layer: "Ethernet\n",
        "gids/0": `${ZERO}\n`,
        "gids/1": "fe80:0000:0000:0000:0ac0:ebff:fe21:03da\n",
        "gid_attrs/types/0": { dir: true },
        "gid_attrs/types/1": "RoCE v2\n",
      }),
    );
    const { fabrics, inactivePorts, problems } = await read();
    expect(fabrics).toEqual([]);
    expect(inactivePorts.map((p) => p.device)).toEqual(["mlx5_0"]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_ROCE_NO_GID"]);
  });

  it("RoCE GID whose type file is unreadable (EINVAL) is skipped, the next one chosen", async () => {
    await writeTree(root, {
      ...rocePort("mlx5_0", "ens1f0np0", "c0a8:d3f2"),
      "mlx5_0/ports/1/gids/5": "0000:0000:0000:0000:0000:ffff:c0a8:d3f2\n",
      "mlx5_0/ports/1/gid_attrs/types/5": "RoCE v2\n",
    });
    // break index 3's type file: a directory where a file should be
    await rm(join(root, "mlx5_0/ports/1/gid_attrs/types/3"));
    await writeTree(root, { "mlx5_0/ports/1/gid_attrs/types/3": { dir: true } });
    const { fabrics } = await read();
    expect(fabrics[0]?.ports[0]?.gidIndex).toBe(5);
    expect(fabrics[0]?.ports[0]?.netdev).toBeUndefined();
  });

  it.each([
    ["1: DOWN", "3: Disabled"],
    ["2: INIT", "5: LinkUp"],
    ["1: DOWN", "2: Polling"],
  ])("%s / %s ports are inactive, not a fabric", async (state, phys) => {
    await writeTree(root, {
      ...ibPort("mlx5_0"),
      ...port("mlx5_2", 1, {
        state,
        phys_state: phys,
        link_layer: "InfiniBand\n",
        rate: "10 Gb/sec (4X)\n",
        sm_lid: "0x0\n",
      }),
    });
    const { fabrics, inactivePorts } = await read();
    expect(fabrics.map((f) => f.ports.map((p) => p.device))).toEqual([["mlx5_0"]]);
    expect(inactivePorts).toEqual([
      expect.objectContaining({
        device: "mlx5_2",
        state: state.slice(3),
        physState: phys.slice(3),
        rateGbps: 10,
      }),
    ]);
  });

  it("missing files: a port with nothing but state files is inactive, nothing throws", async () => {
    await writeTree(root, { "mlx5_0/ports/1/state": "4: ACTIVE\n", "mlx5_1/node_guid": "x\n" });
    const { fabrics, inactivePorts, problems } = await read();
    expect(fabrics).toEqual([]);
    expect(inactivePorts).toEqual([
      { device: "mlx5_0", port: 1, linkLayer: "unknown", state: "ACTIVE", physState: "UNKNOWN" },
    ]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_SYSFS_UNREADABLE"]);
  });

  it("a configured device joins its fabric only with numeric ACTIVE/LinkUp states", async () => {
    await writeTree(root, {
      ...port("mlx5_0", 1, {
        state: "ACTIVE\n",
        phys_state: "LinkUp\n",
        link_layer: "InfiniBand\n",
      }),
    });
    const { fabrics, inactivePorts } = await read({ fabricNames: new Map([["mlx5_0", "rail-0"]]) });
    expect(fabrics).toEqual([]);
    expect(inactivePorts.map((p) => [p.device, p.state, p.physState])).toEqual([
      ["mlx5_0", "ACTIVE", "LinkUp"],
    ]);
  });

  it("renamed devices (ibp12s0, rocep193s0f0, mlx5_bond_0) and operator fabric names", async () => {
    await writeTree(root, {
      ...ibPort("ibp12s0"),
      ...rocePort("rocep193s0f0", "ens1f0np0", "c0a8:d3f2"),
      ...rocePort("mlx5_bond_0", "bond0", "0a00:0107"),
    });
    const { fabrics } = await read({ fabricNames: new Map([["mlx5_bond_0", "rail-bond"]]) });
    expect(fabrics.map((f) => [f.id, f.idSource, f.ports.map((p) => p.device)])).toEqual([
      ["ib:fe80:0000:0000:0000:0x1", "derived", ["ibp12s0"]],
      ["rail-bond", "configured", ["mlx5_bond_0"]],
      ["roce:192.168.208.0/20", "derived", ["rocep193s0f0"]],
    ]);
  });

  it("two IB HCAs on the same subnet and SM share one fabric", async () => {
    await writeTree(root, { ...ibPort("mlx5_0"), ...ibPort("mlx5_1") });
    const { fabrics } = await read();
    expect(fabrics).toHaveLength(1);
    expect(fabrics[0]?.ports.map((p) => p.device)).toEqual(["mlx5_0", "mlx5_1"]);
  });
});

/** The real H100 tree of health-formats.md §3.1 (see test/fixtures/sys-class-infiniband-h100.md). */
const H100_TREE = fileURLToPath(
  new URL("../test/fixtures/sys-class-infiniband-h100", import.meta.url),
);

/** A reader over the real tree whose files named in `failures` fail with that errno. */
function failingReader(failures: Record<string, string>, calls: string[] = []): SysfsFileReader {
  return async (path) => {
    calls.push(path);
    for (const [suffix, code] of Object.entries(failures)) {
      if (path.endsWith(suffix)) {
        throw Object.assign(new Error(`${code}: read ${path}`), { code });
      }
    }
    return readSysfsFile(path);
  };
}

const counters = (values: Record<string, number | string>): PortCounterRead[] =>
  PORT_ERROR_COUNTERS.map(({ name }) => {
    const v = values[name] ?? "ENOENT";
    return typeof v === "number" ? { name, value: v } : ({ name, failure: v } as PortCounterRead);
  });

describe("port counters", () => {
  it.each([
    ["symbol_error", 65535],
    ["link_downed", 255],
    ["link_error_recovery", 255],
    ["port_rcv_errors", 65535],
    ["local_link_integrity_errors", 15],
    ["excessive_buffer_overrun_errors", 15],
    ["port_xmit_discards", 65535],
  ] as const)("%s saturates at %i (kernel PMA width, health-formats.md §3.1)", (name, max) => {
    expect(portCounterMax(name)).toBe(max);
  });

  it.each([
    ["14", { value: 14 }],
    ["0\n", { value: 0 }],
    ["230442669431839", { value: 230442669431839 }],
    // health-formats.md §3.2: old kernels print this for a failed counter read.
    ["N/A (no PMA)\n", { failure: "no-pma" }],
    ["", { failure: "invalid" }],
    ["-1", { failure: "invalid" }],
    ["0x10", { failure: "invalid" }],
    ["18446744073709551615", { failure: "invalid" }],
    ["1".repeat(21), { failure: "invalid" }],
  ])("parsePortCounter(%j)", (text, expected) => {
    expect(parsePortCounter(text)).toEqual(expected);
  });

  it("parsePortCounter never throws and only returns safe integers", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        const parsed = parsePortCounter(text);
        if ("value" in parsed) expect(Number.isSafeInteger(parsed.value)).toBe(true);
      }),
    );
  });
});

describe("readPortStates", () => {
  it("reads the real H100 tree (§3.1): states, rates, counters; hw_counters ignored", async () => {
    const { ports, problems } = await readPortStates({ sysfsRoot: H100_TREE });
    expect(problems).toEqual([]);
    expect(ports).toEqual([
      {
        device: "mlx5_0",
        port: 1,
        linkLayer: "infiniband",
        state: "ACTIVE",
        stateCode: 4,
        physState: "LinkUp",
        physStateCode: 5,
        rateGbps: 400,
        counters: counters({
          symbol_error: 0,
          link_downed: 0,
          link_error_recovery: 0,
          port_rcv_errors: 14,
          local_link_integrity_errors: 0,
          excessive_buffer_overrun_errors: 15,
          port_xmit_discards: 0,
        }),
      },
      {
        // The reference quotes only counters/link_downed of mlx5_1: the rest is ENOENT here.
        device: "mlx5_1",
        port: 1,
        linkLayer: "unknown",
        state: "UNKNOWN",
        physState: "UNKNOWN",
        counters: counters({ link_downed: 255 }),
      },
      {
        // A bond (RoCE) with no counters/ directory: no counters, no failure.
        device: "mlx5_bond_0",
        port: 1,
        linkLayer: "roce",
        state: "ACTIVE",
        stateCode: 4,
        physState: "LinkUp",
        physStateCode: 5,
        rateGbps: 200,
        counters: [],
      },
    ]);
  });

  it.each([
    ["EINVAL", "EINVAL"],
    ["EPERM", "EPERM"],
    ["EACCES", "EACCES"],
    ["ENOENT", "ENOENT"],
    ["EOPNOTSUPP", "EOPNOTSUPP"],
    ["ENOTSUP", "EOPNOTSUPP"],
    ["EIO", "EIO"],
    ["EBUSY", "error"],
  ])(
    "a counter read failing with %s is that counter's failure %s, the rest still read",
    async (code, failure) => {
      const { ports } = await readPortStates({
        sysfsRoot: H100_TREE,
        readFile: failingReader({ "mlx5_0/ports/1/counters/port_rcv_errors": code }),
      });
      expect(ports[0]?.counters).toEqual(
        counters({
          symbol_error: 0,
          link_downed: 0,
          link_error_recovery: 0,
          port_rcv_errors: failure,
          local_link_integrity_errors: 0,
          excessive_buffer_overrun_errors: 15,
          port_xmit_discards: 0,
        }),
      );
      expect(ports[0]?.state).toBe("ACTIVE");
    },
  );

  it("EINVAL files (restricted PFs) are remembered and never read again", async () => {
    const calls: string[] = [];
    const einvalPaths = new Set<string>();
    const readFile = failingReader(
      {
        "mlx5_0/ports/1/counters/symbol_error": "EINVAL",
        "mlx5_0/ports/1/counters/link_downed": "EPERM",
      },
      calls,
    );
    for (let i = 0; i < 3; i++) {
      const { ports } = await readPortStates({ sysfsRoot: H100_TREE, readFile, einvalPaths });
      expect(ports[0]?.counters.slice(0, 2)).toEqual([
        { name: "symbol_error", failure: "EINVAL" },
        { name: "link_downed", failure: "EPERM" },
      ]);
    }
    expect(calls.filter((p) => p.endsWith("mlx5_0/ports/1/counters/symbol_error"))).toHaveLength(1);
    // EPERM may be fixed by the operator (capabilities): it is retried.
    expect(calls.filter((p) => p.endsWith("mlx5_0/ports/1/counters/link_downed"))).toHaveLength(3);
    expect([...einvalPaths]).toEqual([join(H100_TREE, "mlx5_0/ports/1/counters/symbol_error")]);
  });

  it("state files that fail are UNKNOWN, without a code; the rest of the port is read", async () => {
    const { ports } = await readPortStates({
      sysfsRoot: H100_TREE,
      readFile: failingReader({
        "mlx5_0/ports/1/state": "EIO",
        "mlx5_0/ports/1/phys_state": "EIO",
      }),
    });
    expect(ports[0]).toMatchObject({ state: "UNKNOWN", physState: "UNKNOWN", rateGbps: 400 });
    expect(ports[0]?.stateCode).toBeUndefined();
  });

  describe("over a temp tree", () => {
    let root: string;
    beforeEach(async () => {
      root = await mkdtemp(join(tmpdir(), "llmgw-ports-"));
    });
    afterEach(async () => {
      await rm(root, { recursive: true, force: true });
    });

    it("no root: no ports, no problem; an unlistable ports/ is a problem naming the device", async () => {
      expect(await readPortStates({ sysfsRoot: join(root, "missing") })).toEqual({
        ports: [],
        problems: [],
      });
      await writeTree(root, { "mlx5_3/ports": "not a directory\n", "mlx5_4/node_guid": "x\n" });
      const { ports, problems } = await readPortStates({ sysfsRoot: root });
      expect(ports).toEqual([]);
      expect(problems).toEqual([
        {
          code: "LLMGW_DISCOVERY_SYSFS_UNREADABLE",
          source: "sysfs",
          message: `cannot list ${join(root, "mlx5_3/ports")}; mlx5_3 skipped`,
        },
        {
          code: "LLMGW_DISCOVERY_SYSFS_UNREADABLE",
          source: "sysfs",
          message: `cannot list ${join(root, "mlx5_4/ports")}; mlx5_4 skipped`,
        },
      ]);
    });

    it("old kernels' N/A (no PMA) and a directory in place of a file are counter failures", async () => {
      await writeTree(
        root,
        port("mlx5_0", 1, {
          // health-formats.md §3.2 (down port) and §3.2 (N/A (no PMA)).
          state: "1: DOWN\n",
          phys_state: "2: Polling\n",
          "counters/symbol_error": "N/A (no PMA)\n",
          "counters/link_downed": { dir: true },
          "counters/port_rcv_errors": "14\n",
        }),
      );
      const { ports } = await readPortStates({ sysfsRoot: root });
      expect(ports[0]?.counters.slice(0, 4)).toEqual([
        { name: "symbol_error", failure: "no-pma" },
        { name: "link_downed", failure: "error" },
        { name: "link_error_recovery", failure: "ENOENT" },
        { name: "port_rcv_errors", value: 14 },
      ]);
      expect(ports[0]).toMatchObject({ state: "DOWN", stateCode: 1, physStateCode: 2 });
    });

    it("readSysfsFile reads at most 4 KiB of a file", async () => {
      await writeFile(join(root, "big"), "7".repeat(10_000));
      expect(await readSysfsFile(join(root, "big"))).toHaveLength(4096);
    });
  });
});
