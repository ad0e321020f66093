/**
 * Per-replica in-flight counters in a `SharedArrayBuffer` (Int32 slots, `Atomics`), so worker
 * threads can read current load without a message round trip. Slots are assigned per replica
 * id on first use and recycled by {@link InFlightCounters.forget}.
 */
import { RouterError } from "./errors.js";

/** Shared in-flight counters. */
export interface InFlightCounters {
  /** The shared memory (hand it to workers; slot indices come from {@link slotOf}). */
  readonly buffer: SharedArrayBuffer;
  /** The slot of `replicaId`, assigning one on first use. */
  slotOf(replicaId: string): number;
  increment(replicaId: string): number;
  decrement(replicaId: string): number;
  get(replicaId: string): number;
  /** Frees the replica's slot (only when its counter is 0; returns whether it was freed). */
  forget(replicaId: string): boolean;
}

/** Creates {@link InFlightCounters} with room for `slots` replicas (default 4096). */
export function createInFlightCounters(slots = 4096): InFlightCounters {
  const buffer = new SharedArrayBuffer(slots * 4);
  const view = new Int32Array(buffer);
  const ids = new Map<string, number>();
  const free: number[] = [];
  let next = 0;
  const slotOf = (id: string): number => {
    let slot = ids.get(id);
    if (slot !== undefined) return slot;
    slot = free.pop() ?? next++;
    if (slot >= slots) {
      throw new RouterError(
        "LLMGW_ROUTER_INVALID_OPTIONS",
        `more than ${slots} replicas tracked at once`,
      );
    }
    ids.set(id, slot);
    return slot;
  };
  return {
    buffer,
    slotOf,
    increment: (id) => Atomics.add(view, slotOf(id), 1) + 1,
    decrement: (id) => Atomics.sub(view, slotOf(id), 1) - 1,
    get: (id) => {
      const slot = ids.get(id);
      return slot === undefined ? 0 : Atomics.load(view, slot);
    },
    forget(id) {
      const slot = ids.get(id);
      if (slot === undefined || Atomics.load(view, slot) !== 0) return false;
      ids.delete(id);
      free.push(slot);
      return true;
    },
  };
}
