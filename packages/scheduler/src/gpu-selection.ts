/**
 * Choosing which GPUs of one node a rank gets: prefer sets whose GPUs are joined by NVLink (the
 * tensor-parallel all-reduce runs over it) and, among equals, GPUs close to a NIC (the
 * inter-node traffic of a gang leaves through it). Pure and small: a node has at most a few
 * dozen GPUs, so a greedy grow from every start is cheap and good enough.
 */

/** NVLink counts between GPU pairs of one node, symmetric; absent pairs are PCIe only. */
export type NvlinkMatrix = ReadonlyMap<number, ReadonlyMap<number, number>>;

/** Builds the symmetric {@link NvlinkMatrix} from a node's `nvlinks` list. */
export function buildNvlinkMatrix(
  nvlinks:
    | readonly { readonly a: number; readonly b: number; readonly count: number }[]
    | undefined,
): NvlinkMatrix {
  const matrix = new Map<number, Map<number, number>>();
  for (const { a, b, count } of nvlinks ?? []) {
    if (a === b || count <= 0) continue;
    for (const [x, y] of [
      [a, b],
      [b, a],
    ] as const) {
      let row = matrix.get(x);
      if (row === undefined) {
        row = new Map();
        matrix.set(x, row);
      }
      row.set(y, Math.max(row.get(y) ?? 0, count));
    }
  }
  return matrix;
}

/**
 * Picks `count` GPUs out of `candidates` (indices, any order). The result is sorted ascending.
 * Preference, in order: the most NVLink links inside the set, the smallest summed NIC distance
 * (unknown distances count as 4, SYS), the lexicographically smallest index list. Deterministic.
 * Returns all candidates when `count` ≥ their number and `[]` for `count` ≤ 0.
 */
export function selectGpus(
  candidates: readonly number[],
  count: number,
  nvlink: NvlinkMatrix,
  nicDistance: Readonly<Record<number, number>> | undefined,
): number[] {
  const sorted = [...candidates].sort((x, y) => x - y);
  if (count <= 0) return [];
  if (count >= sorted.length) return sorted;
  const nic = (gpu: number): number => nicDistance?.[gpu] ?? 4;
  if (nvlink.size === 0 && nicDistance === undefined) return sorted.slice(0, count);
  const link = (x: number, y: number): number => nvlink.get(x)?.get(y) ?? 0;
  if (uniformLinks(sorted, link)) {
    // Every set of this size has the same links (PCIe only, or an NVSwitch joining all pairs):
    // the nearest GPUs to a NIC, lowest indices among equals, are the optimum.
    return [...sorted]
      .sort((x, y) => nic(x) - nic(y) || x - y)
      .slice(0, count)
      .sort((x, y) => x - y);
  }

  let best: { set: number[]; links: number; nic: number } | undefined;
  for (const start of sorted) {
    const set = [start];
    let links = 0;
    let nicSum = nic(start);
    while (set.length < count) {
      let pick: number | undefined;
      let pickLinks = -1;
      for (const c of sorted) {
        if (set.includes(c)) continue;
        let l = 0;
        for (const s of set) l += link(c, s);
        if (
          pick === undefined ||
          l > pickLinks ||
          (l === pickLinks && nic(c) < nic(pick)) ||
          (l === pickLinks && nic(c) === nic(pick) && c < pick)
        ) {
          pick = c;
          pickLinks = l;
        }
      }
      if (pick === undefined) break;
      set.push(pick);
      links += pickLinks;
      nicSum += nic(pick);
    }
    set.sort((x, y) => x - y);
    if (
      best === undefined ||
      links > best.links ||
      (links === best.links && nicSum < best.nic) ||
      (links === best.links && nicSum === best.nic && compareIndexLists(set, best.set) < 0)
    ) {
      best = { set, links, nic: nicSum };
    }
  }
  return best?.set ?? sorted.slice(0, count);
}

function compareIndexLists(a: readonly number[], b: readonly number[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d;
  }
  return a.length - b.length;
}

function uniformLinks(gpus: readonly number[], link: (x: number, y: number) => number): boolean {
  const first = gpus.length > 1 ? link(gpus[0] ?? 0, gpus[1] ?? 0) : 0;
  for (let i = 0; i < gpus.length; i++) {
    for (let j = i + 1; j < gpus.length; j++) {
      if (link(gpus[i] ?? 0, gpus[j] ?? 0) !== first) return false;
    }
  }
  return true;
}
