import { isIP } from "node:net";
import type { ReplicaLoad } from "@llmgw/router";
import { ControlPlaneError } from "../errors.js";

/**
 * What one agent may send, per Register, Heartbeat and ReportLoad. Every node's inventory is kept in
 * memory, stored, listed by the admin API and rendered into every /metrics scrape, so one
 * caller holding the join token must not be able to grow any of them without bound (one
 * Register with 100,000 GPUs once added 28 MB to every scrape).
 *
 * Keys are field paths in the request, camelCase, without indices. Counts and identifying
 * strings over their limit refuse the whole call with `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT`
 * naming the field and the limit: silently dropping GPUs or ports would schedule on a wrong
 * picture of the node. Free text (problem and status messages, log-tail lines) is truncated
 * with a visible marker instead, because a long engine error must still arrive. The largest
 * request within these (128 replicas × 40 log-tail lines × 512 characters, about 2.6 MB)
 * fits the 4 MiB `readMaxBytes` of the Connect handler, which bounds what arrives at all.
 */
export const AGENT_LIMITS = {
  /** Entries of a repeated field not listed in {@link AGENT_LIMITS.items}. */
  defaultItems: 64,
  /** Most entries per repeated field. */
  items: {
    // Every non-loopback address of the host: RDMA NICs, bridges and IPv6 add up.
    "inventory.addresses": 256,
    "inventory.gpus": 64,
    "inventory.gpus.healthProblems": 16,
    "inventory.fabrics": 16,
    "inventory.fabrics.ports": 64,
    "inventory.inactivePorts": 128,
    "inventory.problems": 64,
    // Every GPU pair once (64 · 63 / 2), every GPU against up to 64 NICs.
    "inventory.topology.gpuLinks": 2_016,
    "inventory.topology.gpuNics": 4_096,
    "inventory.topology.gpuAffinity": 64,
    // A replica holds at least one GPU; twice the GPUs leaves room for replicas being replaced.
    replicas: 128,
    "replicas.logTail": 40,
    engineCredentials: 128,
    gpus: 64,
    "gpus.healthProblems": 16,
    problems: 64,
    // Kernel-log faults arrive folded per (kind, device, code): 64 distinct ones per GPU is
    // already a GPU that should be out of service; an agent sends them in order first seen.
    "inventory.gpus.faults": 64,
    "gpus.faults": 64,
    // The heartbeat's live ports: every fabric port (16 fabrics share the 64-NIC budget of a
    // node in practice) plus the inactive ones, as inventory.fabrics.ports + inactivePorts.
    ports: 192,
    "ports.health.counters": 32,
    "ports.health.problems": 16,
    "inventory.fabrics.ports.health.counters": 32,
    "inventory.fabrics.ports.health.problems": 16,
    "inventory.inactivePorts.health.counters": 32,
    "inventory.inactivePorts.health.problems": 16,
  } as Readonly<Record<string, number>>,
  /**
   * Most entries per repeated field of one request type where it differs from
   * {@link AGENT_LIMITS.items} (the same path means another field there).
   */
  requestItems: {
    // Load of every replica whose rank 0 the node serves; small models packed by MIG or on
    // CPUs may run many more replicas than the 128 a heartbeat lists, and each report is small.
    ReportLoadRequest: { replicas: 1_024 },
    StreamLoadRequest: { replicas: 1_024 },
  } as Readonly<Record<string, Readonly<Record<string, number>>>>,
  /** Characters of a string field not listed in {@link AGENT_LIMITS.chars} or `textChars`. */
  defaultChars: 256,
  /** Most characters of particular string fields (refused beyond). */
  chars: {
    // RFC 1035: a full DNS name.
    "inventory.hostname": 253,
    // A release ("0.2.0", "0.3.0-rc.1+g1a2b3c4"): shown in every `llmgw status` and node list.
    "inventory.agentVersion": 64,
    advertiseAddress: 253,
    // HeartbeatRequest.session_id: the agent draws a UUID (36); kept per node in memory.
    sessionId: 64,
    "inventory.addresses": 253,
    "inventory.topology.gpuAffinity.cpuAffinity": 1_024,
  } as Readonly<Record<string, number>>,
  /** Free-text fields: truncated beyond this many characters, with a marker. */
  textChars: {
    "inventory.problems.message": 1_024,
    "inventory.gpus.healthProblems.message": 1_024,
    "problems.message": 1_024,
    "gpus.healthProblems.message": 1_024,
    "replicas.message": 1_024,
    "replicas.logTail": 512,
    // A fault's evidence is the kernel's record as printed; the agent bounds it already, and a
    // long one must still arrive (the code and device are what decide, not the text).
    "gpus.faults.evidence": 1_024,
    "gpus.faults.description": 256,
    "inventory.gpus.faults.evidence": 1_024,
    "inventory.gpus.faults.description": 256,
    "ports.health.problems.message": 1_024,
    "inventory.fabrics.ports.health.problems.message": 1_024,
    "inventory.inactivePorts.health.problems.message": 1_024,
  } as Readonly<Record<string, number>>,
  /** Bytes of a `bytes` field. */
  defaultBytes: 4_096,
  /** Most requests an engine may report running or waiting (a ReportLoad value beyond is refused). */
  maxQueuedRequests: 1_000_000,
  /**
   * How far a load report's `scrapedAtUnixMs` may be from the control plane's clock. A sanity
   * check: the control plane stamps load with its own clock when it arrives, so the agent's
   * clock never ages load; it only orders one node's reports (replica-loads.ts).
   */
  scrapedAtSkewMs: 24 * 60 * 60_000,
  /**
   * Largest GPU index an inventory may list. nvidia-smi numbers a host's GPUs from 0, and an
   * inventory holds at most 64: an index far beyond is a broken agent, and would become an
   * engine's `CUDA_VISIBLE_DEVICES`.
   */
  maxGpuIndex: 1_023,
} as const;

const truncatedMarker = (dropped: number) => `… [${dropped} more characters]`;

/** Options of {@link boundAgentRequest}. */
export interface BoundAgentRequestOptions {
  /** The control plane's clock (epoch ms) that agent-sent times are judged against. */
  readonly nowMs?: number;
}

/**
 * Checks an AgentService request against {@link AGENT_LIMITS}: throws
 * `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` for a count or identifying string over its limit,
 * and truncates free text in place (a marker says how much went). `root` names the message
 * in errors and selects {@link AGENT_LIMITS.requestItems}, e.g. "RegisterRequest". A
 * "ReportLoadRequest" or "StreamLoadRequest" also has its load values and scrape times checked (against
 * `options.nowMs`, default the system clock).
 */
export function boundAgentRequest(
  root: string,
  request: object,
  options: BoundAgentRequestOptions = {},
): void {
  const own = AGENT_LIMITS.requestItems[root];
  const items = (path: string) =>
    own?.[path] ?? AGENT_LIMITS.items[path] ?? AGENT_LIMITS.defaultItems;
  // Nearly every request is within every limit: checked first without building a name or a
  // path string per field (that walk was a third of a heartbeat's handling); only a request
  // with something to refuse or truncate takes the naming walk below.
  if (!withinLimits(limitTree(root, items), request as Record<string, unknown>))
    walk(items, root, "", request as Record<string, unknown>);
  validateFaults(root, request as Record<string, unknown>);
  validateAgentVersion(root, request as Record<string, unknown>);
  if (root === "ReportLoadRequest" || root === "StreamLoadRequest")
    validateLoadReports(root, request as Record<string, unknown>, options.nowMs ?? Date.now());
}

/** What an agent version may hold: visible ASCII, as releases and build metadata use. */
const AGENT_VERSION = /^[\x21-\x7e]*$/;

/**
 * Refuses an inventory whose `agentVersion` holds anything but visible ASCII (no spaces,
 * control characters or escapes): the control plane passes it unchecked to every admin
 * client and console, where a terminal escape in it would redraw an operator's screen. Its
 * length is bounded with the other identifying strings ({@link AGENT_LIMITS.chars}).
 */
function validateAgentVersion(root: string, request: Record<string, unknown>): void {
  const version = (request.inventory as { agentVersion?: unknown } | undefined)?.agentVersion;
  if (typeof version !== "string" || AGENT_VERSION.test(version)) return;
  throw new ControlPlaneError(
    "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
    `${root}.inventory.agentVersion must be visible ASCII characters (no spaces or control characters), got ${JSON.stringify(version.slice(0, 80))}`,
  );
}

/** Largest value of each load field (all are ≥ 0). */
const LOAD_FIELD_MAX = {
  running: AGENT_LIMITS.maxQueuedRequests,
  waiting: AGENT_LIMITS.maxQueuedRequests,
  kvCacheUsage: 1,
  prefixCacheHitRate: 1,
  kvCacheTokens: 2 ** 40,
} as const;

/** A load value within {@link LOAD_FIELD_MAX}'s range for `field`. */
const loadValueInRange = (field: keyof typeof LOAD_FIELD_MAX, v: unknown): v is number =>
  typeof v === "number" && Number.isFinite(v) && v >= 0 && v <= LOAD_FIELD_MAX[field];

/** What {@link loadWithinRange} kept and left out. */
export interface LoadWithinRange {
  /** `load` without its out-of-range fields (the same object when none was). */
  readonly load: ReplicaLoad;
  /** The fields left out, each with the value it had, e.g. `kvCacheUsage=1.02`. */
  readonly dropped: readonly string[];
}

/**
 * `load` without the fields routers could not use (not a finite number, negative, running or
 * waiting over {@link AGENT_LIMITS.maxQueuedRequests}, KV usage or prefix hit rate outside
 * [0, 1]): each left out is unreported, never 0. For heartbeat load, which is never refused
 * (the heartbeat carries the node's health; an old agent passes an engine's raw reading on).
 */
export function loadWithinRange(load: ReplicaLoad): LoadWithinRange {
  let kept: Record<string, number> | undefined;
  const dropped: string[] = [];
  for (const field of Object.keys(LOAD_FIELD_MAX) as (keyof typeof LOAD_FIELD_MAX)[]) {
    const v = load[field];
    if (v === undefined || loadValueInRange(field, v)) continue;
    kept ??= { ...load } as Record<string, number>;
    delete kept[field];
    dropped.push(`${field}=${String(v)}`);
  }
  return { load: kept === undefined ? load : (kept as ReplicaLoad), dropped };
}

/**
 * Refuses load routers could not use: a value that is not a finite number within its range
 * (a NaN or a negative queue would poison every router's scoring), a report without a replica
 * id, or a scrape time more than a day from the control plane's clock (an agent whose clock is
 * that far off is misconfigured; load is stamped on arrival, and the time only orders one node's
 * reports).
 */
function validateLoadReports(root: string, request: Record<string, unknown>, nowMs: number): void {
  const reports = request.replicas;
  if (!Array.isArray(reports)) return;
  reports.forEach(
    (
      r: { replicaId: string; load?: Record<string, unknown>; scrapedAtUnixMs: bigint },
      i: number,
    ) => {
      const name = `${root}.replicas[${i}]`;
      const refuse = (why: string): never => {
        throw new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", `${name}${why}`);
      };
      if (r.replicaId === "") refuse(".replicaId is required");
      for (const [field, max] of Object.entries(LOAD_FIELD_MAX)) {
        const v = r.load?.[field];
        if (v === undefined) continue;
        if (!loadValueInRange(field as keyof typeof LOAD_FIELD_MAX, v))
          refuse(`.load.${field} is ${String(v)}; it must be a number within [0, ${max}]`);
      }
      const at = Number(r.scrapedAtUnixMs);
      if (Math.abs(at - nowMs) > AGENT_LIMITS.scrapedAtSkewMs)
        refuse(
          `.scrapedAtUnixMs is ${r.scrapedAtUnixMs}, more than a day from the control plane's clock (${nowMs}); check the agent's clock`,
        );
    },
  );
}

/**
 * Refuses a fault the control plane could not key or compare: no device, or times that are
 * negative or run backwards (a clear compares `lastSeenUnixMs`). An unknown kind or action is
 * accepted: it comes from a newer agent, and counts as actionable (fail closed) rather than
 * failing the node's every heartbeat.
 */
function validateFaults(root: string, request: Record<string, unknown>): void {
  const gpuLists: [string, unknown][] = [
    [`${root}.gpus`, request.gpus],
    [`${root}.inventory.gpus`, (request.inventory as Record<string, unknown> | undefined)?.gpus],
  ];
  for (const [where, gpus] of gpuLists) {
    if (!Array.isArray(gpus)) continue;
    gpus.forEach((gpu: { faults?: unknown }, i) => {
      if (!Array.isArray(gpu.faults)) return;
      gpu.faults.forEach(
        (
          f: {
            firstSeenUnixMs: bigint;
            lastSeenUnixMs: bigint;
            pciBusId: string;
          },
          j: number,
        ) => {
          const name = `${where}[${i}].faults[${j}]`;
          const refuse = (why: string): never => {
            throw new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", `${name}${why}`);
          };
          if (f.pciBusId === "") refuse(".pciBusId is required");
          if (f.firstSeenUnixMs < 0n || f.lastSeenUnixMs < f.firstSeenUnixMs)
            refuse(
              ` has firstSeenUnixMs ${f.firstSeenUnixMs} and lastSeenUnixMs ${f.lastSeenUnixMs}; times must be ≥ 0 and not run backwards`,
            );
        },
      );
    });
  }
}

const MAX_EXACT = BigInt(Number.MAX_SAFE_INTEGER);

/**
 * Whether a 64-bit field's value survives the control plane's plain numbers exactly: past
 * 2^53 it would come back as another value (and one past the wire type's range would make
 * every admin answer that carries it fail to encode). No agent reading comes near: times are
 * milliseconds, sizes bytes.
 */
const exact = (v: bigint): boolean => v <= MAX_EXACT && v >= -MAX_EXACT;

/** Most entries of the repeated field at a path. */
type ItemLimit = (path: string) => number;

/**
 * The limits of one field path, resolved once per request type: what {@link walk} looks up by
 * path string for every field, with the children met so far.
 */
interface LimitNode {
  readonly items: number;
  /** Free text: truncated beyond this many characters. */
  readonly textChars: number | undefined;
  /** Identifying strings: refused beyond this many characters. */
  readonly chars: number;
  readonly children: Map<string, LimitNode>;
  readonly path: string;
  readonly limit: ItemLimit;
}

const limitTrees = new Map<string, LimitNode>();

function limitNode(limit: ItemLimit, path: string): LimitNode {
  return {
    items: limit(path),
    textChars: AGENT_LIMITS.textChars[path],
    chars: AGENT_LIMITS.chars[path] ?? AGENT_LIMITS.defaultChars,
    children: new Map(),
    path,
    limit,
  };
}

/** The root of `root`'s limit tree (its request items fixed by the first call). */
function limitTree(root: string, limit: ItemLimit): LimitNode {
  let tree = limitTrees.get(root);
  if (tree === undefined) {
    tree = limitNode(limit, "");
    limitTrees.set(root, tree);
  }
  return tree;
}

function childLimits(node: LimitNode, field: string): LimitNode {
  let child = node.children.get(field);
  if (child === undefined) {
    // Field names come from the generated schemas: the tree stays as small as they are.
    child = limitNode(node.limit, node.path === "" ? field : `${node.path}.${field}`);
    node.children.set(field, child);
  }
  return child;
}

/**
 * True when {@link walk} would neither refuse nor change anything in `message`: the same rules
 * on the same fields, without names.
 */
function withinLimits(node: LimitNode, message: Record<string, unknown>): boolean {
  for (const key of Object.keys(message)) {
    if (key.startsWith("$")) continue;
    const value = message[key];
    if (typeof value === "bigint") {
      if (!exact(value)) return false;
      continue;
    }
    if (typeof value !== "string" && (typeof value !== "object" || value === null)) continue;
    const child = childLimits(
      node,
      key === "value" && typeof message.case === "string" ? message.case : key,
    );
    if (Array.isArray(value)) {
      if (value.length > child.items) return false;
      for (const entry of value) if (!valueWithinLimits(child, entry)) return false;
    } else if (!valueWithinLimits(child, value)) return false;
  }
  return true;
}

function valueWithinLimits(node: LimitNode, value: unknown): boolean {
  if (typeof value === "string") return value.length <= (node.textChars ?? node.chars);
  if (value instanceof Uint8Array) return value.length <= AGENT_LIMITS.defaultBytes;
  if (typeof value !== "object" || value === null) return true;
  const record = value as Record<string, unknown>;
  if ("$typeName" in record || "case" in record) return withinLimits(node, record);
  // A map field: its keys are the sender's, so no limit nodes are made for them; one with
  // values to bound is left to the naming walk.
  const keys = Object.keys(record);
  if (keys.length > node.items) return false;
  for (const key of keys) {
    const v = record[key];
    if (typeof v === "string" || (typeof v === "object" && v !== null)) return false;
  }
  return true;
}

function walk(
  items: ItemLimit,
  where: string,
  path: string,
  message: Record<string, unknown>,
): void {
  for (const key of Object.keys(message)) {
    if (key.startsWith("$")) continue;
    const value = message[key];
    if (typeof value === "bigint") {
      if (!exact(value)) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          `${where}.${key} is ${value}; the control plane keeps 64-bit values as numbers, exact up to ${Number.MAX_SAFE_INTEGER} either way`,
        );
      }
      continue;
    }
    // Numbers and booleans have nothing to bound (most of a heartbeat's fields): no paths
    // built for them.
    if (typeof value !== "string" && (typeof value !== "object" || value === null)) continue;
    // A oneof is { case, value }: its value stands for the field named by its case.
    const field = key === "value" && typeof message.case === "string" ? message.case : key;
    const fieldPath = path === "" ? field : `${path}.${field}`;
    const name = `${where}.${field}`;
    if (Array.isArray(value)) {
      message[key] = boundList(items, name, fieldPath, value);
    } else {
      const bounded = boundValue(items, name, fieldPath, value);
      if (bounded !== value) message[key] = bounded;
    }
  }
}

function boundList(items: ItemLimit, name: string, path: string, list: unknown[]): unknown[] {
  const max = items(path);
  let entries = list;
  if (list.length > max) {
    if (AGENT_LIMITS.textChars[path] === undefined) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `${name} has ${list.length} entries; the limit is ${max}`,
      );
    }
    // Lines of text: the last ones say most about why an engine died.
    const dropped = list.length - (max - 1);
    entries = [`[… ${dropped} earlier lines dropped]`, ...list.slice(dropped)];
  }
  for (let i = 0; i < entries.length; i++) {
    entries[i] = boundValue(items, `${name}[${i}]`, path, entries[i]);
  }
  return entries;
}

function boundValue(items: ItemLimit, name: string, path: string, value: unknown): unknown {
  if (typeof value === "string") return boundString(name, path, value);
  if (value instanceof Uint8Array) {
    if (value.length > AGENT_LIMITS.defaultBytes) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `${name} has ${value.length} bytes; the limit is ${AGENT_LIMITS.defaultBytes}`,
      );
    }
    return value;
  }
  if (typeof value === "object" && value !== null) {
    const record = value as Record<string, unknown>;
    // Neither a message nor a oneof: a map field, bounded like a repeated one.
    if (!("$typeName" in record) && !("case" in record)) {
      const entries = Object.keys(record).length;
      const max = items(path);
      if (entries > max) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          `${name} has ${entries} entries; the limit is ${max}`,
        );
      }
    }
    walk(items, name, path, record);
  }
  return value;
}

function boundString(name: string, path: string, value: string): string {
  const text = AGENT_LIMITS.textChars[path];
  if (text !== undefined) {
    if (value.length <= text) return value;
    const marker = truncatedMarker(value.length - text);
    return `${value.slice(0, text)}${marker}`;
  }
  const max = AGENT_LIMITS.chars[path] ?? AGENT_LIMITS.defaultChars;
  if (value.length > max) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
      `${name} has ${value.length} characters; the limit is ${max}`,
    );
  }
  return value;
}

/**
 * Why a node's GPU list cannot be scheduled on, or undefined when it can: every GPU needs its
 * own index, a whole number within [0, {@link AGENT_LIMITS.maxGpuIndex}]. The scheduler keys
 * a node's GPUs by index (a duplicate makes it refuse the whole input, so one node would stop
 * scheduling for every deployment). `field` names the list in the message, e.g.
 * "RegisterRequest.inventory.gpus".
 */
export function gpuIndexProblem(
  gpus: readonly { readonly index: number }[],
  field: string,
): string | undefined {
  const seen = new Map<number, number>();
  for (let i = 0; i < gpus.length; i++) {
    const index = (gpus[i] as { readonly index: number }).index;
    if (!Number.isInteger(index) || index < 0 || index > AGENT_LIMITS.maxGpuIndex)
      return `${field}[${i}].index is ${index}; it must be a whole number within [0, ${AGENT_LIMITS.maxGpuIndex}]`;
    const first = seen.get(index);
    if (first !== undefined)
      return `${field}[${i}].index is ${index}, the same as ${field}[${first}].index; each GPU needs its own index`;
    seen.set(index, i);
  }
  return undefined;
}

/**
 * Throws `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` when {@link gpuIndexProblem} finds one:
 * such an inventory is refused before it is stored.
 */
export function validateGpuIndices(
  gpus: readonly { readonly index: number }[],
  field: string,
): void {
  const problem = gpuIndexProblem(gpus, field);
  if (problem !== undefined)
    throw new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", problem);
}

/** Largest TCP port. */
const MAX_PORT = 65_535;

/**
 * `status` without a reported `apiPort` or `kvEventsPort` outside 1–65535 (the same object
 * when both are within): such a port is unset, never 0 or wrapped, so the replica has no
 * endpoint and routers are not sent to it. A status is not refused for it: it arrives with
 * the heartbeat that carries the node's health.
 */
export function portsWithinRange<
  T extends { readonly apiPort?: number; readonly kvEventsPort?: number },
>(status: T): T {
  const bad = (port: number | undefined) =>
    port !== undefined && !(Number.isInteger(port) && port >= 1 && port <= MAX_PORT);
  const api = bad(status.apiPort);
  const kv = bad(status.kvEventsPort);
  if (!api && !kv) return status;
  const kept: { apiPort?: number; kvEventsPort?: number } = { ...status };
  if (api) delete kept.apiPort;
  if (kv) delete kept.kvEventsPort;
  return kept as T;
}

/** One DNS label: letters, digits, '-' (not at either end) and, as hosts use it, '_'. */
const DNS_LABEL = /^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$/;

/**
 * Throws `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` unless `address` is an IPv4 or IPv6 literal
 * (no brackets, no zone) or a DNS host name of at most 253 characters: it becomes the host
 * part of every engine URL the router dials and of multi-node rendezvous addresses, so a
 * scheme, port, path, user info or whitespace smuggled in here would redirect them. `field`
 * names the source in the message.
 */
export function validateAdvertiseAddress(address: string, field: string): void {
  const ok =
    address.length <= 253 &&
    (isIP(address) !== 0
      ? !address.includes("%")
      : address.split(".").every((label) => DNS_LABEL.test(label)));
  if (!ok) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
      `${field} must be an IP address or a DNS host name (no scheme, port, path or spaces; at most 253 characters), got ${JSON.stringify(address.length > 80 ? `${address.slice(0, 80)}…` : address)}`,
    );
  }
}
