import { open, readdir, readFile, readlink } from "node:fs/promises";
import { networkInterfaces } from "node:os";
import { basename, join } from "node:path";
import { ProblemCodes, problem } from "./problem-codes.js";
import type { Fabric, LinkLayer, Port, Problem } from "./types.js";

/** One address on a netdev, as `ip -o addr` would show it (`10.0.3.7/24`). */
export interface NetdevAddress {
  readonly address: string;
  readonly prefixLength: number;
}

/**
 * Where RoCE prefix lengths come from: the addresses of a netdev. The default reads
 * `os.networkInterfaces()` (the netdev must be visible in this network namespace); tests pass
 * a plain function.
 */
export type NetdevAddressSource = (
  netdev: string,
) => readonly NetdevAddress[] | Promise<readonly NetdevAddress[]>;

/** {@link NetdevAddressSource} over `os.networkInterfaces()`. */
export const osNetdevAddresses: NetdevAddressSource = (netdev) =>
  (networkInterfaces()[netdev] ?? []).flatMap((info) => {
    const prefix = info.cidr ? Number(info.cidr.split("/")[1]) : Number.NaN;
    return Number.isInteger(prefix) ? [{ address: info.address, prefixLength: prefix }] : [];
  });

/** Inputs of {@link readFabrics}. */
export interface FabricReadOptions {
  /** e.g. `/sys/class/infiniband`; a missing directory means no RDMA devices (no problem). */
  readonly sysfsRoot: string;
  /** Operator-given fabric ids by RDMA device name; they win over derived ids. */
  readonly fabricNames: ReadonlyMap<string, string>;
  readonly netdevAddresses: NetdevAddressSource;
}

/** Fabrics of this node: ACTIVE + LinkUp ports grouped by fabric id, and everything else. */
export interface FabricReport {
  readonly fabrics: readonly Fabric[];
  readonly inactivePorts: readonly Port[];
  readonly problems: readonly Problem[];
}

/** Assumed when a RoCE netdev's prefix length cannot be read (reported as a problem). */
export const ASSUMED_ROCE_PREFIX_LENGTH = 24;

/** State names are short words ("ACTIVE", "LinkErrorRecovery"); longer text is cut here. */
const MAX_STATE_NAME_CHARS = 64;

/**
 * `"4: ACTIVE"` → `{ code: 4, name: "ACTIVE" }`; text without a `<n>: ` prefix keeps its text
 * as the name and has no code.
 */
export function parseSysfsState(text: string | undefined): { code?: number; name: string } {
  const trimmed = (text ?? "").trim().slice(0, MAX_STATE_NAME_CHARS);
  const match = /^(\d{1,3}):\s*(.*)$/.exec(trimmed);
  if (!match) return { name: trimmed === "" ? "UNKNOWN" : trimmed };
  return { code: Number(match[1]), name: (match[2] ?? "").trim() || "UNKNOWN" };
}

/** `"400 Gb/sec (4X NDR)"` → 400, `"2.5 Gb/sec (1X SDR)"` → 2.5; anything else → undefined. */
export function parseRateGbps(text: string | undefined): number | undefined {
  const match = /^\s*(\d{1,7}(?:\.\d{1,3})?)\s*Gb\/sec/.exec(text ?? "");
  return match ? Number(match[1]) : undefined;
}

/** `link_layer` → "infiniband" | "roce" | "unknown" (Ethernet ports with RDMA are RoCE). */
export function parseLinkLayer(text: string | undefined): LinkLayer {
  const value = (text ?? "").trim().toLowerCase();
  if (value === "infiniband") return "infiniband";
  if (value === "ethernet") return "roce";
  return "unknown";
}

function gidGroups(gid: string): string[] | undefined {
  const groups = gid.trim().toLowerCase().split(":");
  return groups.length === 8 && groups.every((g) => /^[0-9a-f]{4}$/.test(g)) ? groups : undefined;
}

/** The IPv4 address of an IPv4-mapped GID (`…:0000:ffff:0ac8:010a` → `10.200.1.10`). */
export function ipv4FromGid(gid: string): string | undefined {
  const groups = gidGroups(gid);
  if (!groups || groups.slice(0, 5).some((g) => g !== "0000") || groups[5] !== "ffff") {
    return undefined;
  }
  const hi = Number.parseInt(groups[6] ?? "", 16);
  const lo = Number.parseInt(groups[7] ?? "", 16);
  return [hi >> 8, hi & 255, lo >> 8, lo & 255].join(".");
}

/** A GID usable for routed RoCE v2: not all-zero, not link-local `fe80::/64`. */
export function isRoutableGid(gid: string): boolean {
  const groups = gidGroups(gid);
  if (!groups) return false;
  if (groups.every((g) => g === "0000")) return false;
  return !(
    groups[0] === "fe80" &&
    groups[1] === "0000" &&
    groups[2] === "0000" &&
    groups[3] === "0000"
  );
}

/** One GID table entry as read from sysfs; `type` is undefined when its attr file was unreadable. */
export interface GidEntry {
  readonly index: number;
  readonly gid: string;
  readonly type?: string;
}

/**
 * Picks the RoCE v2 GID index (formats.md §2.4): entries typed `RoCE v2` with a routable GID
 * (all-zero and `fe80::` skipped; unreadable type = skipped), preferring IPv4-mapped GIDs
 * (NCCL's default address family is AF_INET), then the lowest index.
 */
export function chooseRoceGid(entries: readonly GidEntry[]): GidEntry | undefined {
  const candidates = entries
    .filter((e) => e.type?.trim() === "RoCE v2" && isRoutableGid(e.gid))
    .sort((a, b) => a.index - b.index);
  return candidates.find((e) => ipv4FromGid(e.gid) !== undefined) ?? candidates[0];
}

/** IPv4 subnet in CIDR form: (`10.200.1.10`, 24) → `10.200.1.0/24`. */
export function ipv4Subnet(address: string, prefixLength: number): string {
  const octets = address.split(".").map(Number);
  const value = octets.reduce((acc, o) => acc * 256 + (o & 255), 0);
  const size = 2 ** (32 - prefixLength);
  const network = Math.floor(value / size) * size;
  const out = [24, 16, 8, 0].map((shift) => Math.floor(network / 2 ** shift) % 256);
  return `${out.join(".")}/${prefixLength}`;
}

async function readText(path: string): Promise<string | undefined> {
  try {
    return (await readFile(path, "utf8")).trim();
  } catch {
    return undefined;
  }
}

async function list(path: string): Promise<string[] | undefined> {
  try {
    return (await readdir(path)).sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  } catch {
    return undefined;
  }
}

interface ReadPort {
  port: Port;
  /** State 4 (ACTIVE) and phys_state 5 (LinkUp): the only ports that join a fabric. */
  active: boolean;
  /** Derived fabric id, when the port can have one. */
  derivedId?: string;
}

async function readGids(portDir: string): Promise<GidEntry[]> {
  const names = (await list(join(portDir, "gids"))) ?? [];
  const entries: GidEntry[] = [];
  for (const name of names) {
    if (!/^\d+$/.test(name)) continue;
    const gid = await readText(join(portDir, "gids", name));
    if (gid === undefined || !isRoutableGid(gid)) continue;
    const type = await readText(join(portDir, "gid_attrs", "types", name));
    entries.push({ index: Number(name), gid, ...(type === undefined ? {} : { type }) });
  }
  return entries;
}

async function readPort(
  options: FabricReadOptions,
  device: string,
  deviceFacts: { netdev?: string; numaNode?: number; guid?: string; pciBusId?: string },
  portName: string,
  problems: Problem[],
): Promise<ReadPort> {
  const dir = join(options.sysfsRoot, device, "ports", portName);
  const [stateText, physText, layerText, rateText, smLidText, gid0] = await Promise.all(
    ["state", "phys_state", "link_layer", "rate", "sm_lid", "gids/0"].map((f) =>
      readText(join(dir, f)),
    ),
  );
  const state = parseSysfsState(stateText);
  const phys = parseSysfsState(physText);
  const linkLayer = parseLinkLayer(layerText);
  const rateGbps = parseRateGbps(rateText);
  const base: { -readonly [K in keyof Port]: Port[K] } = {
    device,
    port: Number(portName),
    linkLayer,
    state: state.name,
    physState: phys.name,
    ...(rateGbps === undefined ? {} : { rateGbps }),
    ...deviceFacts,
  };
  const active = state.code === 4 && phys.code === 5;
  if (!active || linkLayer === "unknown") return { port: base, active };
  if (linkLayer === "infiniband") {
    const groups = gid0 === undefined ? undefined : gidGroups(gid0);
    if (groups) base.subnetPrefix = groups.slice(0, 4).join(":");
    if (smLidText) base.smLid = smLidText;
    return {
      port: base,
      active,
      derivedId: `ib:${base.subnetPrefix ?? "unknown"}:${base.smLid ?? "unknown"}`,
    };
  }
  const chosen = chooseRoceGid(await readGids(dir));
  if (!chosen) {
    if (!options.fabricNames.has(device)) {
      problems.push(
        problem(
          ProblemCodes.roceNoGid,
          "sysfs",
          `${device} port ${portName} is ACTIVE but has no RoCE v2 GID with an IPv4 or routable address; not part of any fabric`,
        ),
      );
    }
    return { port: base, active };
  }
  base.gidIndex = chosen.index;
  const ndev = await readText(join(dir, "gid_attrs", "ndevs", String(chosen.index)));
  if (ndev) base.netdev = ndev;
  const ipv4 = ipv4FromGid(chosen.gid);
  if (ipv4 === undefined) {
    return { port: base, active, derivedId: `roce:${chosen.gid}` };
  }
  base.ipv4 = ipv4;
  let prefixLength: number | undefined;
  if (base.netdev !== undefined) {
    try {
      const addresses = await options.netdevAddresses(base.netdev);
      prefixLength = addresses.find((a) => a.address === ipv4)?.prefixLength;
    } catch {
      prefixLength = undefined;
    }
  }
  if (prefixLength === undefined) {
    prefixLength = ASSUMED_ROCE_PREFIX_LENGTH;
    if (!options.fabricNames.has(device)) {
      problems.push(
        problem(
          ProblemCodes.rocePrefixAssumed,
          "sysfs",
          `prefix length of ${ipv4} on ${base.netdev ?? "an unknown netdev"} (${device} port ${portName}) unknown; assumed /${ASSUMED_ROCE_PREFIX_LENGTH} for the fabric id`,
        ),
      );
    }
  }
  return { port: base, active, derivedId: `roce:${ipv4Subnet(ipv4, prefixLength)}` };
}

/**
 * Reads RDMA ports from a sysfs tree laid out like `/sys/class/infiniband` and groups the
 * ACTIVE + LinkUp ones into fabrics. Fabric ids: configured (`fabricNames[device]`) first;
 * else IB = `ib:<subnet prefix>:<sm_lid>` and RoCE = `roce:<IPv4 subnet>`. The IB id is a weak
 * hint: most subnets keep the default prefix `fe80::` and SM LID 0x1, so two separate IB
 * fabrics look alike; the SM GUID (via `sminfo`, needs root and `/dev/infiniband/umad*`) would
 * tell them apart but is not in sysfs, so operators name such fabrics in config.
 * A missing root is a node without RDMA (single-node island): no fabrics and no problem.
 * Never throws; every read error (ENOENT, EINVAL, EISDIR, …) is treated alike.
 */
export async function readFabrics(options: FabricReadOptions): Promise<FabricReport> {
  const problems: Problem[] = [];
  const devices = await list(options.sysfsRoot);
  if (devices === undefined) return { fabrics: [], inactivePorts: [], problems };
  const byId = new Map<
    string,
    { linkLayer: "infiniband" | "roce"; idSource: Fabric["idSource"]; ports: Port[] }
  >();
  const inactivePorts: Port[] = [];
  for (const device of devices) {
    const deviceDir = join(options.sysfsRoot, device);
    const ports = await list(join(deviceDir, "ports"));
    if (ports === undefined) {
      problems.push(
        problem(
          ProblemCodes.sysfsUnreadable,
          "sysfs",
          `cannot list ${join(deviceDir, "ports")}; ${device} skipped`,
        ),
      );
      continue;
    }
    const netdevs = await list(join(deviceDir, "device", "net"));
    const numaText = await readText(join(deviceDir, "device", "numa_node"));
    const numa = numaText !== undefined && /^\d+$/.test(numaText) ? Number(numaText) : undefined;
    const guid = await readText(join(deviceDir, "node_guid"));
    let pciBusId: string | undefined;
    try {
      pciBusId = basename(await readlink(join(deviceDir, "device")));
    } catch {
      pciBusId = undefined;
    }
    const facts = {
      ...(netdevs?.[0] === undefined ? {} : { netdev: netdevs[0] }),
      ...(numa === undefined ? {} : { numaNode: numa }),
      ...(guid ? { guid } : {}),
      ...(pciBusId ? { pciBusId } : {}),
    };
    for (const portName of ports.filter((p) => /^\d+$/.test(p))) {
      const { port, active, derivedId } = await readPort(
        options,
        device,
        facts,
        portName,
        problems,
      );
      const configured = options.fabricNames.get(device);
      const id = configured ?? derivedId;
      if (!active || port.linkLayer === "unknown" || id === undefined) {
        inactivePorts.push(port);
        continue;
      }
      const fabric = byId.get(id) ?? {
        linkLayer: port.linkLayer,
        idSource: configured === undefined ? "derived" : "configured",
        ports: [],
      };
      fabric.ports.push(port);
      byId.set(id, fabric);
    }
  }
  const fabrics = [...byId].map(
    ([id, f]): Fabric => ({ id, linkLayer: f.linkLayer, idSource: f.idSource, ports: f.ports }),
  );
  return { fabrics, inactivePorts, problems };
}

// ---------------------------------------------------------------------------------------------
// Port state and error counters: the light read for the heartbeat path (no GID scanning).
// Layout and widths: shared/reference/health-formats.md §3.1, read failures §3.2, tolerance §3.4.

/**
 * The error counters of `ports/<n>/counters/` that port health reads, with the width the kernel
 * gives each PMA counter (`drivers/infiniband/core/sysfs.c`, health-formats.md §3.1). PMA
 * counters saturate at `2^bits - 1` (they stop; they do not wrap), so a counter at its maximum
 * hides every new error until someone resets it (`perfquery -x -R`, or a reboot).
 */
export const PORT_ERROR_COUNTERS = [
  { name: "symbol_error", bits: 16 },
  { name: "link_downed", bits: 8 },
  { name: "link_error_recovery", bits: 8 },
  { name: "port_rcv_errors", bits: 16 },
  { name: "local_link_integrity_errors", bits: 4 },
  { name: "excessive_buffer_overrun_errors", bits: 4 },
  { name: "port_xmit_discards", bits: 16 },
] as const;

/** One of {@link PORT_ERROR_COUNTERS}' names. */
export type PortErrorCounterName = (typeof PORT_ERROR_COUNTERS)[number]["name"];

/** The value a counter stops at: 255 for an 8-bit one, 15 for 4 bits, 65535 for 16. */
export function portCounterMax(name: PortErrorCounterName): number {
  const bits = PORT_ERROR_COUNTERS.find((c) => c.name === name)?.bits ?? 16;
  return 2 ** bits - 1;
}

/**
 * Why a counter file gave no number: the errno of the read (`EINVAL` on restricted PFs,
 * `EPERM`/`EACCES` without permission, `ENOENT` for a file this driver lacks, `EOPNOTSUPP`),
 * `no-pma` for old kernels' `N/A (no PMA)` text, `invalid` for any other text, `error` for any
 * other failure.
 */
export type PortCounterFailure =
  | "EINVAL"
  | "EPERM"
  | "EACCES"
  | "ENOENT"
  | "EOPNOTSUPP"
  | "EIO"
  | "no-pma"
  | "invalid"
  | "error";

/** One counter file as read: a value, or why there is none. */
export type PortCounterRead =
  | { readonly name: PortErrorCounterName; readonly value: number }
  | { readonly name: PortErrorCounterName; readonly failure: PortCounterFailure };

/** Longest counter text accepted: 20 digits hold any 64-bit value. */
const MAX_COUNTER_DIGITS = 20;

/**
 * Parses a counter file's text: `"14\n"` → `{ value: 14 }`; old kernels' `N/A (no PMA)` →
 * `{ failure: "no-pma" }`; anything else (signs, hex, text, a number past 2^53) →
 * `{ failure: "invalid" }`. Never throws.
 */
export function parsePortCounter(
  text: string,
): { readonly value: number } | { readonly failure: "no-pma" | "invalid" } {
  const trimmed = text.trim();
  if (/^N\/A\b/.test(trimmed)) return { failure: "no-pma" };
  if (trimmed.length > MAX_COUNTER_DIGITS || !/^\d+$/.test(trimmed)) return { failure: "invalid" };
  const value = Number(trimmed);
  return Number.isSafeInteger(value) ? { value } : { failure: "invalid" };
}

/**
 * Reads one sysfs file's text; throws the read's error (with its `code`) on failure. Injected so
 * that tests can make a real tree's file fail with `EINVAL`, which no ordinary file does.
 */
export type SysfsFileReader = (path: string) => Promise<string>;

/** Sysfs attributes are at most one page; anything past that is not a sysfs value. */
const MAX_SYSFS_FILE_BYTES = 4096;

/** {@link SysfsFileReader} over the real file system, reading at most 4 KiB of each file. */
export const readSysfsFile: SysfsFileReader = async (path) => {
  const handle = await open(path, "r");
  try {
    const buffer = Buffer.alloc(MAX_SYSFS_FILE_BYTES);
    const { bytesRead } = await handle.read(buffer, 0, buffer.length, 0);
    return buffer.subarray(0, bytesRead).toString("utf8");
  } finally {
    await handle.close();
  }
};

function counterFailure(error: unknown): PortCounterFailure {
  const code = (error as { code?: unknown } | null)?.code;
  switch (code) {
    case "EINVAL":
    case "EPERM":
    case "EACCES":
    case "ENOENT":
    case "EIO":
      return code;
    // libuv names errno 95 ENOTSUP; the kernel's name for it is EOPNOTSUPP.
    case "EOPNOTSUPP":
    case "ENOTSUP":
      return "EOPNOTSUPP";
    default:
      return "error";
  }
}

/** The state of one RDMA port at one moment, as {@link readPortStates} read it. */
export interface PortStateSample {
  readonly device: string;
  readonly port: number;
  readonly linkLayer: LinkLayer;
  /** Name part of `state`, e.g. "ACTIVE"; "UNKNOWN" when unreadable. */
  readonly state: string;
  /** Number part of `state` (4 = ACTIVE); undefined when unreadable or not `<n>: <name>`. */
  readonly stateCode?: number;
  readonly physState: string;
  /** Number part of `phys_state` (5 = LinkUp). */
  readonly physStateCode?: number;
  /** Leading number of `rate`; a DOWN port reports a meaningless 10 (health-formats.md §3.2). */
  readonly rateGbps?: number;
  /**
   * One entry per {@link PORT_ERROR_COUNTERS} name, in that order; empty when the port has no
   * `counters/` at all (every file ENOENT: a driver without PMA, e.g. some bond or EFA devices).
   */
  readonly counters: readonly PortCounterRead[];
}

/** Inputs of {@link readPortStates}. */
export interface PortStateReadOptions {
  /** e.g. `/sys/class/infiniband`; a missing directory means no RDMA devices (no problem). */
  readonly sysfsRoot: string;
  /** Default {@link readSysfsFile}. */
  readonly readFile?: SysfsFileReader;
  /**
   * Counter files that failed with EINVAL before: they are not read again and report EINVAL.
   * On restricted PFs every such read logs an `mlx5_cmd_out_err … err(-22)` kernel line
   * (health-formats.md §3.2), so a poller that retries them floods the kernel log. New EINVAL
   * paths are added here (at most {@link MAX_EINVAL_PATHS}). Omit for a one-shot read.
   */
  readonly einvalPaths?: Set<string>;
}

/** Paths remembered in {@link PortStateReadOptions.einvalPaths}; past it, EINVAL files are retried. */
export const MAX_EINVAL_PATHS = 4096;

/** Devices and ports per device read at most; more is not a real host (a problem says so). */
export const MAX_RDMA_DEVICES = 256;
export const MAX_PORTS_PER_DEVICE = 256;

/** What {@link readPortStates} found. */
export interface PortStatesReport {
  readonly ports: readonly PortStateSample[];
  /** A device whose `ports/` cannot be listed, a truncated listing. */
  readonly problems: readonly Problem[];
}

async function readCounter(
  path: string,
  name: PortErrorCounterName,
  readFile: SysfsFileReader,
  einvalPaths: Set<string> | undefined,
): Promise<PortCounterRead> {
  if (einvalPaths?.has(path)) return { name, failure: "EINVAL" };
  let text: string;
  try {
    text = await readFile(path);
  } catch (error) {
    const failure = counterFailure(error);
    if (failure === "EINVAL" && einvalPaths !== undefined && einvalPaths.size < MAX_EINVAL_PATHS) {
      einvalPaths.add(path);
    }
    return { name, failure };
  }
  return { name, ...parsePortCounter(text) };
}

async function readOptional(readFile: SysfsFileReader, path: string): Promise<string | undefined> {
  try {
    return await readFile(path);
  } catch {
    return undefined;
  }
}

/**
 * Reads every RDMA port's `state`, `phys_state`, `link_layer`, `rate` and the
 * {@link PORT_ERROR_COUNTERS} under `sysfsRoot` — about eleven small files per port and no GID
 * table, cheap enough for every heartbeat. Each file fails on its own: an unreadable state is
 * `UNKNOWN`, an unreadable counter carries its {@link PortCounterFailure}. `hw_counters/` is not
 * read. Never throws.
 */
export async function readPortStates(options: PortStateReadOptions): Promise<PortStatesReport> {
  const readFile = options.readFile ?? readSysfsFile;
  const problems: Problem[] = [];
  const samples: PortStateSample[] = [];
  const devices = await list(options.sysfsRoot);
  if (devices === undefined) return { ports: samples, problems };
  if (devices.length > MAX_RDMA_DEVICES) {
    problems.push(
      problem(
        ProblemCodes.sysfsUnreadable,
        "sysfs",
        `${options.sysfsRoot} lists ${devices.length} devices; only the first ${MAX_RDMA_DEVICES} are read`,
      ),
    );
  }
  for (const device of devices.slice(0, MAX_RDMA_DEVICES)) {
    const portsDir = join(options.sysfsRoot, device, "ports");
    const listed = await list(portsDir);
    if (listed === undefined) {
      problems.push(
        problem(
          ProblemCodes.sysfsUnreadable,
          "sysfs",
          `cannot list ${portsDir}; ${device} skipped`,
        ),
      );
      continue;
    }
    const portNames = listed.filter((p) => /^\d{1,5}$/.test(p));
    if (portNames.length > MAX_PORTS_PER_DEVICE) {
      problems.push(
        problem(
          ProblemCodes.sysfsUnreadable,
          "sysfs",
          `${portsDir} lists ${portNames.length} ports; only the first ${MAX_PORTS_PER_DEVICE} are read`,
        ),
      );
    }
    for (const portName of portNames.slice(0, MAX_PORTS_PER_DEVICE)) {
      const dir = join(portsDir, portName);
      const [stateText, physText, layerText, rateText] = await Promise.all(
        ["state", "phys_state", "link_layer", "rate"].map((f) =>
          readOptional(readFile, join(dir, f)),
        ),
      );
      const counters = await Promise.all(
        PORT_ERROR_COUNTERS.map((c) =>
          readCounter(join(dir, "counters", c.name), c.name, readFile, options.einvalPaths),
        ),
      );
      const state = parseSysfsState(stateText);
      const phys = parseSysfsState(physText);
      const rateGbps = parseRateGbps(rateText);
      const noCounters = counters.every((c) => "failure" in c && c.failure === "ENOENT");
      samples.push({
        device,
        port: Number(portName),
        linkLayer: parseLinkLayer(layerText),
        state: state.name,
        ...(state.code === undefined ? {} : { stateCode: state.code }),
        physState: phys.name,
        ...(phys.code === undefined ? {} : { physStateCode: phys.code }),
        ...(rateGbps === undefined ? {} : { rateGbps }),
        counters: noCounters ? [] : counters,
      });
    }
  }
  return { ports: samples, problems };
}
