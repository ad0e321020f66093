/**
 * Reused buffers for request bodies of 16 KiB and more, by power-of-two size class, in shared
 * memory.
 *
 * Why reuse: on the VMs this runs on, touching freshly mapped memory is the dearest thing a
 * large request does (a fresh 200 KB buffer costs ~150 µs to fill, a warm one ~5 µs), and
 * fresh buffers add to the external memory that drives V8's mark-compacts.
 * Why shared: the analysis worker reads the body in place and only a handle travels, so the
 * body's view never detaches and the proxy forwards from it while nothing else owns it. (Against
 * transferring the buffer there and back, main-thread GC measured the same — ~110–120 ms of
 * pauses per 8 s at 190 × 200 KB/s; what remains comes from Node's own 64 KiB socket-read
 * buffers — and the main loop's delay p99 slightly lower, within noise.)
 */

const MIN_CLASS = 14; // 16 KiB
const MAX_CLASS = 26; // 64 MiB: larger bodies are not worth keeping

/** The pool. */
export interface BufferPool {
  /** A view of exactly `length` bytes over a pooled (or new) `SharedArrayBuffer` it owns alone. */
  take(length: number): Uint8Array;
  /**
   * Returns `view.buffer` to the pool. The caller must be done with it, and nothing else
   * (a socket write still in progress included) may still read it.
   */
  give(view: Uint8Array): void;
  /** Buffers held, all classes together. */
  readonly held: number;
}

/** Smallest length that {@link BufferPool.take} pools (smaller bodies are cheap to allocate). */
export const POOLED_MIN_BYTES = 2 ** MIN_CLASS;

/**
 * Creates a {@link BufferPool} keeping at most `maxBytes` of free buffers (default 64 MiB: a
 * few hundred 200 KB bodies in flight reuse their buffers; memory held never exceeds what the
 * peak concurrency already needed).
 */
export function createBufferPool(maxBytes = 64 * 1024 * 1024): BufferPool {
  const free: SharedArrayBuffer[][] = [];
  let held = 0;
  let heldBytes = 0;
  return {
    take(length) {
      const cls = Math.max(MIN_CLASS, Math.ceil(Math.log2(Math.max(1, length))));
      const reused = free[cls]?.pop();
      if (reused !== undefined) {
        held--;
        heldBytes -= reused.byteLength;
      }
      return new Uint8Array(reused ?? new SharedArrayBuffer(2 ** cls), 0, length);
    },
    give(view) {
      const buffer = view.buffer;
      if (!(buffer instanceof SharedArrayBuffer)) return; // not one of ours
      const cls = Math.log2(buffer.byteLength);
      if (!Number.isInteger(cls) || cls < MIN_CLASS || cls > MAX_CLASS) return;
      const list = free[cls] ?? [];
      free[cls] = list;
      if (heldBytes + buffer.byteLength <= maxBytes && !list.includes(buffer)) {
        list.push(buffer);
        held++;
        heldBytes += buffer.byteLength;
      }
    },
    get held() {
      return held;
    },
  };
}
