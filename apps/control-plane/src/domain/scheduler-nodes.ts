import type { NodeInventory } from "@llmgw/discovery";
import type { SchedulerGpu, SchedulerNode } from "@llmgw/scheduler";
import type { NodeState } from "./node-lifecycle.js";

/** What {@link SchedulerNodes.build} reads of one node. */
export interface SchedulerNodeSource {
  readonly id: string;
  readonly state: NodeState;
  readonly cordoned: boolean;
  readonly draining: boolean;
  readonly inventory: NodeInventory;
  /** Per GPU of `inventory.gpus`, in order: the current health verdict. */
  readonly healthy: readonly boolean[];
  /** Fabric id → why this node may not carry a gang on it. */
  readonly trouble: ReadonlyMap<string, string>;
}

/**
 * PCIe path to a NIC → the scheduler's distance, 0 PIX … 4 SYS. A switch, not a keyed
 * lookup: a decoded string used as a property key is internalized first, which was a third
 * of this builder's own time when a control plane started over 10,000 nodes.
 */
function nicDistance(path: string): number | undefined {
  switch (path) {
    case "PIX":
      return 0;
    case "PXB":
      return 1;
    case "PHB":
      return 2;
    case "NODE":
      return 3;
    case "SYS":
      return 4;
    default:
      return undefined;
  }
}

/**
 * Builds the scheduler's view of nodes, sharing every part two nodes have equal (their GPU
 * list without UUIDs, fabrics, NVLink list, NIC distances): a fleet has a handful of node
 * layouts, and the scheduler derives what it needs once per shared list (`layoutCache` in
 * `@llmgw/scheduler`). A control plane starting over 10,000 nodes then keeps one small object
 * per node plus the shared lists, instead of ~100 objects per node, and its first reconcile
 * derives each layout once. Equal parts are found by a hash and then compared, so sharing is
 * exact.
 */
export class SchedulerNodes {
  readonly #gpus = new Shared(sameGpus, makeGpus);
  readonly #fabrics = new Shared(sameFabrics, makeFabrics);
  readonly #nvlinks = new Shared(sameLinks, makeLinks);
  readonly #nicDistance = new Shared(sameHoley, (d: readonly number[]) => d.slice());
  /** Reused for each node's NIC distances; copied only when they are new. */
  readonly #distance: number[] = [];

  build(n: SchedulerNodeSource): SchedulerNode {
    const inventory = n.inventory;
    // Each part is hashed from the inventory and compared with the shared ones in place: a
    // node like one seen before allocates nothing but its own small object.
    let h = HASH_SEED;
    for (let i = 0; i < inventory.gpus.length; i++) {
      const g = inventory.gpus[i] as InventoryGpu;
      h = mix(h, g.index);
      h = mix(h, (n.healthy[i] === true ? 1 : 0) | (g.migEnabled ? 2 : 0) | (isAmd(g) ? 4 : 0));
      h = mixString(h, g.gpuClass ?? "");
    }
    let fh = HASH_SEED;
    for (const f of inventory.fabrics) if (!n.trouble.has(f.id)) fh = mixString(fh, f.id);
    const links = inventory.topology.gpuLinks;
    let lh = HASH_SEED;
    for (const l of links) if (l.nvlinks > 0) lh = mix(mix(mix(lh, l.gpuA), l.gpuB), l.nvlinks);
    // GPU index → distance, a holey array (a record with integer keys): compared and hashed
    // by position, without enumerating keys.
    const distance = this.#distance;
    distance.length = 0;
    for (const nic of inventory.topology.gpuNics) {
      const d = nicDistance(nic.path);
      if (d !== undefined && !(d >= (distance[nic.gpu] ?? 5))) distance[nic.gpu] = d;
    }
    let dh = HASH_SEED;
    for (let g = 0; g < distance.length; g++) dh = mix(mix(dh, g), distance[g] ?? -1);
    return {
      id: n.id,
      state: n.state,
      cordoned: n.cordoned,
      draining: n.draining,
      gpus: this.#gpus.get(h, inventory.gpus, n.healthy),
      fabrics: this.#fabrics.get(fh, inventory.fabrics, n.trouble),
      ...(n.trouble.size === 0 ? {} : { fabricTrouble: Object.fromEntries(n.trouble) }),
      nvlinks: this.#nvlinks.get(lh, links, undefined),
      nicDistance: this.#nicDistance.get(dh, distance, undefined),
    };
  }
}

type InventoryGpu = NodeInventory["gpus"][number];
type InventoryFabric = NodeInventory["fabrics"][number];
type InventoryLink = NodeInventory["topology"]["gpuLinks"][number];
type Links = NonNullable<SchedulerNode["nvlinks"]>;

const isAmd = (g: InventoryGpu): boolean => g.vendor === "amd";

function makeGpus(gpus: readonly InventoryGpu[], healthy: readonly boolean[]): SchedulerGpu[] {
  return gpus.map((g, i) => ({
    index: g.index,
    gpuClass: g.gpuClass === "" ? undefined : g.gpuClass,
    healthy: healthy[i] === true,
    migEnabled: g.migEnabled,
    vendor: isAmd(g) ? ("amd" as const) : ("nvidia" as const),
  }));
}

function sameGpus(
  shared: readonly SchedulerGpu[],
  gpus: readonly InventoryGpu[],
  healthy: readonly boolean[],
): boolean {
  if (shared.length !== gpus.length) return false;
  for (let i = 0; i < gpus.length; i++) {
    const x = shared[i] as SchedulerGpu;
    const g = gpus[i] as InventoryGpu;
    if (
      x.index !== g.index ||
      (x.gpuClass ?? "") !== (g.gpuClass ?? "") ||
      x.healthy !== (healthy[i] === true) ||
      x.migEnabled !== g.migEnabled ||
      (x.vendor === "amd") !== isAmd(g)
    )
      return false;
  }
  return true;
}

/** A fabric with an unhealthy port on this node takes no new gangs here, and a gang on it goes. */
function makeFabrics(fabrics: readonly InventoryFabric[], trouble: ReadonlyMap<string, string>) {
  return fabrics.map((f) => f.id).filter((id) => !trouble.has(id));
}

function sameFabrics(
  shared: readonly string[],
  fabrics: readonly InventoryFabric[],
  trouble: ReadonlyMap<string, string>,
): boolean {
  let i = 0;
  for (const f of fabrics) {
    if (trouble.has(f.id)) continue;
    if (shared[i] !== f.id) return false;
    i++;
  }
  return i === shared.length;
}

function makeLinks(links: readonly InventoryLink[]): Links {
  return links
    .filter((l) => l.nvlinks > 0)
    .map((l) => ({ a: l.gpuA, b: l.gpuB, count: l.nvlinks }));
}

function sameLinks(shared: Links, links: readonly InventoryLink[]): boolean {
  let i = 0;
  for (const l of links) {
    if (l.nvlinks <= 0) continue;
    const x = shared[i];
    if (x === undefined || x.a !== l.gpuA || x.b !== l.gpuB || x.count !== l.nvlinks) return false;
    i++;
  }
  return i === shared.length;
}

/**
 * One shared value per distinct content: {@link get} returns the value made first from a
 * source `equal` to this one, and makes (and keeps) a new one only when there is none.
 * Bounded: past `max` distinct values it starts over (sharing saves memory and work; no
 * answer depends on it).
 */
class Shared<T, A, B> {
  readonly #byHash = new Map<number, T[]>();
  #count = 0;

  constructor(
    private readonly equal: (value: T, a: A, b: B) => boolean,
    private readonly make: (a: A, b: B) => T,
    private readonly max = 4_096,
  ) {}

  get(hash: number, a: A, b: B): T {
    const bucket = this.#byHash.get(hash);
    if (bucket !== undefined) {
      for (const seen of bucket) if (this.equal(seen, a, b)) return seen;
    }
    if (this.#count >= this.max) {
      this.#byHash.clear();
      this.#count = 0;
    }
    const value = this.make(a, b);
    const fresh = this.#byHash.get(hash);
    if (fresh === undefined) this.#byHash.set(hash, [value]);
    else fresh.push(value);
    this.#count++;
    return value;
  }
}

const HASH_SEED = 0x811c9dc5;

/** FNV-1a step over a 32-bit integer. */
function mix(h: number, v: number): number {
  return Math.imul(h ^ (v | 0), 0x01000193);
}

function mixString(h: number, s: string): number {
  let x = mix(h, s.length);
  for (let i = 0; i < s.length; i++) x = mix(x, s.charCodeAt(i));
  return x;
}

/** Equal arrays, holes included (a hole reads `undefined` on both sides). */
function sameHoley(a: readonly number[], b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
