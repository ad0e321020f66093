import { EngineSimError } from "./errors.js";

/**
 * Knobs of the continuous-batching timing model. Defaults approximate an 8B dense model in
 * bf16 on one H100 80GB under vLLM (see the README for the reasoning behind each number).
 */
export interface TimingModelOptions {
  /** Prefill throughput in prompt tokens per second. Default 10 000. */
  prefillTokensPerSecond?: number;
  /** Duration of a decode step with one running sequence, ms. Default 12. */
  decodeStepMs?: number;
  /** Extra decode-step time per additional sequence in the batch, ms. Default 0.14 (≈30 ms at 128). */
  decodeStepMsPerSeq?: number;
  /** Most sequences running at once (vLLM `--max-num-seqs`). Default 256. */
  maxRunningSeqs?: number;
  /** Token budget of one step, decode tokens plus prefill chunk (vLLM `--max-num-batched-tokens`). Default 8192. */
  maxBatchedTokens?: number;
  /** KV cache capacity in tokens. Default 400 000. */
  kvCacheTokens?: number;
  /** Tokens per KV block, the prefix-cache granularity. Default 16. */
  blockSizeTokens?: number;
  /** Fault knob: extra time added to every step, ms (a slow or throttled GPU). Default 0. */
  extraStepMs?: number;
}

/** {@link TimingModelOptions} with every default applied and validated. */
export interface ResolvedTimingModelOptions {
  readonly prefillTokensPerSecond: number;
  readonly decodeStepMs: number;
  readonly decodeStepMsPerSeq: number;
  readonly maxRunningSeqs: number;
  readonly maxBatchedTokens: number;
  readonly kvCacheTokens: number;
  readonly blockSizeTokens: number;
  readonly extraStepMs: number;
}

/** Defaults of {@link TimingModelOptions}. */
export const DEFAULT_TIMING_MODEL_OPTIONS: ResolvedTimingModelOptions = Object.freeze({
  prefillTokensPerSecond: 10_000,
  decodeStepMs: 12,
  decodeStepMsPerSeq: 0.14,
  maxRunningSeqs: 256,
  maxBatchedTokens: 8192,
  kvCacheTokens: 400_000,
  blockSizeTokens: 16,
  extraStepMs: 0,
});

function check(name: string, value: number, integer: boolean, min: number): number {
  if (!Number.isFinite(value) || value < min || (integer && !Number.isInteger(value))) {
    throw new EngineSimError(
      "LLMGW_ENGINE_SIM_INVALID_OPTION",
      `${name} must be ${integer ? "an integer" : "a number"} >= ${min}, got ${String(value)}`,
    );
  }
  return value;
}

/** Applies defaults and validates; throws `LLMGW_ENGINE_SIM_INVALID_OPTION` naming the option. */
export function resolveTimingModelOptions(
  options: TimingModelOptions = {},
): ResolvedTimingModelOptions {
  const d = DEFAULT_TIMING_MODEL_OPTIONS;
  const resolved: ResolvedTimingModelOptions = {
    prefillTokensPerSecond: check(
      "prefillTokensPerSecond",
      options.prefillTokensPerSecond ?? d.prefillTokensPerSecond,
      false,
      1,
    ),
    decodeStepMs: check("decodeStepMs", options.decodeStepMs ?? d.decodeStepMs, false, 0),
    decodeStepMsPerSeq: check(
      "decodeStepMsPerSeq",
      options.decodeStepMsPerSeq ?? d.decodeStepMsPerSeq,
      false,
      0,
    ),
    maxRunningSeqs: check("maxRunningSeqs", options.maxRunningSeqs ?? d.maxRunningSeqs, true, 1),
    maxBatchedTokens: check(
      "maxBatchedTokens",
      options.maxBatchedTokens ?? d.maxBatchedTokens,
      true,
      1,
    ),
    kvCacheTokens: check("kvCacheTokens", options.kvCacheTokens ?? d.kvCacheTokens, true, 1),
    blockSizeTokens: check(
      "blockSizeTokens",
      options.blockSizeTokens ?? d.blockSizeTokens,
      true,
      1,
    ),
    extraStepMs: check("extraStepMs", options.extraStepMs ?? d.extraStepMs, false, 0),
  };
  if (resolved.maxBatchedTokens < resolved.maxRunningSeqs) {
    throw new EngineSimError(
      "LLMGW_ENGINE_SIM_INVALID_OPTION",
      `maxBatchedTokens (${resolved.maxBatchedTokens}) must be >= maxRunningSeqs (${resolved.maxRunningSeqs})`,
    );
  }
  return Object.freeze(resolved);
}

/** One request as the timing model sees it. */
export interface SequenceSpec {
  /** Unique id; events refer to it. */
  readonly id: string;
  /** Prompt length in tokens (≥ 1). */
  readonly promptTokens: number;
  /**
   * Chained hashes of the sequence's full blocks (see `sequenceBlockHashes`), prompt first,
   * then the blocks its output tokens fill; may be empty. A block enters the prefix cache
   * once it is computed and full, as far as hashes are given.
   */
  readonly blockHashes: readonly string[];
  /** Tokens this request will generate before finishing (≥ 1). */
  readonly outputTokens: number;
  /**
   * The sequence's token ids (prompt, then output), passed through to
   * {@link PrefixCacheEvent}s (KV events carry them); the model itself never reads them.
   */
  readonly tokenIds?: ArrayLike<number>;
  /**
   * The request's `cache_salt`, passed through like `tokenIds`: its first block's extra key
   * in KV events (its `blockHashes` are already salted).
   */
  readonly cacheSalt?: string;
}

/**
 * A change of the prefix cache, as an engine's KV events report it:
 * - `stored`: blocks `[from, to)` of `seq.blockHashes` entered the cache (block `from - 1`,
 *   if any, is their parent and is cached);
 * - `removed`: blocks evicted;
 * - `cleared`: the whole cache dropped ({@link TimingModel.resetPrefixCache}).
 */
export type PrefixCacheEvent =
  | {
      readonly type: "stored";
      readonly seq: SequenceSpec;
      readonly from: number;
      readonly to: number;
    }
  | { readonly type: "removed"; readonly hashes: readonly string[] }
  | { readonly type: "cleared" };

/** Observers of a {@link TimingModel}. */
export interface TimingModelHooks {
  /** Called synchronously for every prefix-cache change, in order. */
  readonly onCacheEvent?: (event: PrefixCacheEvent) => void;
}

/** A token produced by a step, delivered at the step's `endMs`. */
export interface TokenEvent {
  readonly id: string;
  /** 0 for the first output token. */
  readonly tokenIndex: number;
  /** True on the sequence's last token. */
  readonly finished: boolean;
  /** Set on the first token: arrival → end of the step that produced it, ms (model time). */
  readonly ttftMs?: number;
  /** Set on later tokens: time since the previous token, ms (model time). */
  readonly itlMs?: number;
  /**
   * Set on the first token: prompt tokens found in the prefix cache when the sequence was
   * first admitted (vLLM's `num_cached_tokens`, reported as `cached_tokens`).
   */
  readonly cachedTokens?: number;
}

/** What one engine step does; the caller waits `durationMs` and then delivers `events`. */
export interface StepPlan {
  readonly startMs: number;
  readonly durationMs: number;
  readonly endMs: number;
  /** Sequences decoding one token in this step. */
  readonly decodeSeqs: number;
  /** Prompt tokens computed in this step (prefix-cache hits excluded). */
  readonly prefillTokens: number;
  readonly events: readonly TokenEvent[];
}

/** Counters and gauges read at scrape time. */
export interface TimingSnapshot {
  readonly running: number;
  readonly waiting: number;
  /** Blocks referenced by running sequences / all blocks, 0–1 (vLLM `kv_cache_usage_perc`). */
  readonly kvUsage: number;
  /** Blocks held by the prefix cache with no running sequence using them. */
  readonly cachedFreeBlocks: number;
  readonly totalBlocks: number;
  readonly prefixQueryTokens: number;
  readonly prefixHitTokens: number;
  readonly promptTokens: number;
  readonly generationTokens: number;
  readonly preemptions: number;
  readonly steps: number;
}

interface Seq {
  readonly spec: SequenceSpec;
  readonly arrivalMs: number;
  /** Tokens generated so far. */
  generated: number;
  /** Prompt (+ recomputed output) tokens still to prefill; 0 once decoding. */
  prefillRemaining: number;
  /** Hashes of this sequence's leading blocks, referenced in the cache (computed and full). */
  shared: string[];
  /** Blocks owned only by this sequence (not yet computed, or not yet full). */
  privateBlocks: number;
  lastTokenMs: number;
  /** Prefix-cache hit tokens at the first admission; undefined before it. */
  cachedTokens: number | undefined;
  /** In the running set (false while waiting, after preemption and once finished). */
  running: boolean;
}

interface CacheEntry {
  refs: number;
}

/**
 * A pure continuous-batching scheduler in the style of vLLM V1: every step decodes one token
 * for each running sequence, spends the rest of the token budget on (chunked) prefill of new
 * or partially prefilled sequences, and admits waiting sequences FIFO while there are free
 * sequence slots and KV blocks. As vLLM's `allocate_slots` does, each step puts the blocks its
 * scheduled tokens fill (prompt chunks and output alike) into a prefix cache keyed by chained
 * block hash; unreferenced cached blocks are evicted least-recently-used when space is
 * needed; when a running sequence cannot grow, the newest running sequence is preempted
 * (recompute). Time is injected: callers pass `nowMs` and sleep `durationMs` themselves.
 */
export class TimingModel {
  readonly options: ResolvedTimingModelOptions;
  readonly totalBlocks: number;
  #running: Seq[] = [];
  readonly #waiting: Seq[] = [];
  /** Insertion order is LRU order (touch = delete + set). */
  readonly #cache = new Map<string, CacheEntry>();
  #privateBlocks = 0;
  #referencedCacheBlocks = 0;
  #prefixQueryTokens = 0;
  #prefixHitTokens = 0;
  #promptTokens = 0;
  #generationTokens = 0;
  #preemptions = 0;
  #steps = 0;
  readonly #onCacheEvent: ((event: PrefixCacheEvent) => void) | undefined;

  constructor(options: TimingModelOptions = {}, hooks: TimingModelHooks = {}) {
    this.options = resolveTimingModelOptions(options);
    this.#onCacheEvent = hooks.onCacheEvent;
    this.totalBlocks = Math.floor(this.options.kvCacheTokens / this.options.blockSizeTokens);
  }

  /** Queues a sequence arriving at `nowMs`. Throws if it could never fit in the KV cache. */
  submit(spec: SequenceSpec, nowMs: number): void {
    const need = Math.ceil((spec.promptTokens + spec.outputTokens) / this.options.blockSizeTokens);
    if (spec.promptTokens < 1 || spec.outputTokens < 1 || need > this.totalBlocks) {
      throw new EngineSimError(
        "LLMGW_ENGINE_SIM_INVALID_OPTION",
        `sequence ${spec.id} (${spec.promptTokens} prompt + ${spec.outputTokens} output tokens) cannot fit a KV cache of ${this.options.kvCacheTokens} tokens`,
      );
    }
    this.#promptTokens += spec.promptTokens;
    this.#waiting.push({
      spec,
      arrivalMs: nowMs,
      generated: 0,
      prefillRemaining: spec.promptTokens,
      shared: [],
      privateBlocks: 0,
      lastTokenMs: nowMs,
      cachedTokens: undefined,
      running: false,
    });
  }

  /** Drops a sequence (client went away); returns whether it was known. */
  cancel(id: string): boolean {
    const r = this.#running.findIndex((s) => s.spec.id === id);
    if (r >= 0) {
      const [seq] = this.#running.splice(r, 1);
      if (seq) {
        seq.running = false;
        this.#release(seq);
      }
      return true;
    }
    const w = this.#waiting.findIndex((s) => s.spec.id === id);
    if (w >= 0) {
      this.#waiting.splice(w, 1);
      return true;
    }
    return false;
  }

  /** True when nothing is running or waiting. */
  get idle(): boolean {
    return this.#running.length === 0 && this.#waiting.length === 0;
  }

  /** Decode-step duration for a batch of `seqs` sequences, ms. */
  decodeStepMsFor(seqs: number): number {
    return this.options.decodeStepMs + this.options.decodeStepMsPerSeq * Math.max(0, seqs - 1);
  }

  /**
   * Plans and applies one step starting at `nowMs`; returns `undefined` when idle. Tokens in
   * the plan are considered produced at `endMs`.
   */
  step(nowMs: number): StepPlan | undefined {
    if (this.idle) return undefined;
    const o = this.options;
    let budget = o.maxBatchedTokens;
    // 1. decode: every running sequence past prefill needs room for one more token.
    const decoding: Seq[] = [];
    for (const seq of [...this.#running]) {
      // A sequence preempted earlier in this loop is no longer running.
      if (!seq.running || seq.prefillRemaining > 0) continue;
      if (!this.#growTo(seq, seq.spec.promptTokens + seq.generated + 1)) continue;
      decoding.push(seq);
      this.#cacheScheduled(seq);
    }
    budget -= decoding.length;
    // 2. continue chunked prefill of running sequences.
    let prefillTokens = 0;
    const prefilling: Seq[] = [];
    for (const seq of this.#running) {
      if (seq.prefillRemaining === 0 || budget <= 0) continue;
      const chunk = Math.min(seq.prefillRemaining, budget);
      seq.prefillRemaining -= chunk;
      budget -= chunk;
      prefillTokens += chunk;
      prefilling.push(seq);
      this.#cacheScheduled(seq);
    }
    // 3. admit waiting sequences FIFO.
    while (budget > 0 && this.#running.length < o.maxRunningSeqs && this.#waiting.length > 0) {
      const seq = this.#waiting[0]!;
      if (!this.#admit(seq)) break;
      this.#waiting.shift();
      seq.running = true;
      this.#running.push(seq);
      const chunk = Math.min(seq.prefillRemaining, budget);
      seq.prefillRemaining -= chunk;
      budget -= chunk;
      prefillTokens += chunk;
      prefilling.push(seq);
      this.#cacheScheduled(seq);
    }
    const batch = decoding.length + prefilling.length;
    if (batch === 0) return undefined;
    const durationMs =
      (decoding.length > 0 ? this.decodeStepMsFor(decoding.length) : o.decodeStepMs) +
      (prefillTokens / o.prefillTokensPerSecond) * 1000 +
      o.extraStepMs;
    const endMs = nowMs + durationMs;
    const events: TokenEvent[] = [];
    const emit = (seq: Seq): void => {
      const tokenIndex = seq.generated;
      seq.generated += 1;
      this.#generationTokens += 1;
      const finished = seq.generated >= seq.spec.outputTokens;
      const timing =
        tokenIndex === 0
          ? { ttftMs: endMs - seq.arrivalMs, cachedTokens: seq.cachedTokens ?? 0 }
          : { itlMs: endMs - seq.lastTokenMs };
      seq.lastTokenMs = endMs;
      events.push({ id: seq.spec.id, tokenIndex, finished, ...timing });
      if (finished) {
        seq.running = false;
        this.#release(seq);
      }
    };
    for (const seq of decoding) emit(seq);
    for (const seq of prefilling) {
      // A recomputed (preempted) sequence resumes decoding without re-emitting old tokens.
      if (seq.prefillRemaining === 0) emit(seq);
    }
    if (events.some((e) => e.finished)) this.#running = this.#running.filter((s) => s.running);
    this.#steps += 1;
    return {
      startMs: nowMs,
      durationMs,
      endMs,
      decodeSeqs: decoding.length,
      prefillTokens,
      events,
    };
  }

  /** Gauges and counters at this instant. */
  snapshot(): TimingSnapshot {
    const used = this.#privateBlocks + this.#referencedCacheBlocks;
    return {
      running: this.#running.length,
      waiting: this.#waiting.length,
      kvUsage: this.totalBlocks === 0 ? 0 : used / this.totalBlocks,
      cachedFreeBlocks: this.#cache.size - this.#referencedCacheBlocks,
      totalBlocks: this.totalBlocks,
      prefixQueryTokens: this.#prefixQueryTokens,
      prefixHitTokens: this.#prefixHitTokens,
      promptTokens: this.#promptTokens,
      generationTokens: this.#generationTokens,
      preemptions: this.#preemptions,
      steps: this.#steps,
    };
  }

  /** Whether the prefix cache holds the block with this hash (for tests and debugging). */
  hasCachedBlock(hash: string): boolean {
    return this.#cache.has(hash);
  }

  /** The hashes of every cached block, least recently used first (for tests and debugging). */
  cachedBlockHashes(): string[] {
    return [...this.#cache.keys()];
  }

  /**
   * Drops the whole prefix cache, as vLLM's `reset_prefix_cache` does; like it, refuses
   * (returns false, nothing changed) while running sequences reference cached blocks.
   */
  resetPrefixCache(): boolean {
    if (this.#referencedCacheBlocks > 0) return false;
    this.#cache.clear();
    this.#onCacheEvent?.({ type: "cleared" });
    return true;
  }

  #freeBlocks(): number {
    return this.totalBlocks - this.#privateBlocks - this.#cache.size;
  }

  /** Evicts unreferenced cached blocks, oldest first, until `n` blocks are free. */
  #reserve(n: number): boolean {
    if (this.#freeBlocks() >= n) return true;
    const evicted: string[] = [];
    for (const [hash, entry] of this.#cache) {
      if (entry.refs > 0) continue;
      this.#cache.delete(hash);
      evicted.push(hash);
      if (this.#freeBlocks() >= n) break;
    }
    if (evicted.length > 0) this.#onCacheEvent?.({ type: "removed", hashes: evicted });
    return this.#freeBlocks() >= n;
  }

  #ref(hash: string): void {
    const entry = this.#cache.get(hash);
    if (entry) {
      this.#cache.delete(hash);
      if (entry.refs === 0) this.#referencedCacheBlocks += 1;
      entry.refs += 1;
      this.#cache.set(hash, entry);
    } else {
      this.#cache.set(hash, { refs: 1 });
      this.#referencedCacheBlocks += 1;
    }
  }

  #unref(hash: string): void {
    const entry = this.#cache.get(hash);
    if (!entry) return;
    entry.refs -= 1;
    if (entry.refs === 0) {
      this.#referencedCacheBlocks -= 1;
      // Touch: the most recently released prefix is the last to be evicted.
      this.#cache.delete(hash);
      this.#cache.set(hash, entry);
    }
  }

  #admit(seq: Seq): boolean {
    const bs = this.options.blockSizeTokens;
    const hashes = seq.spec.blockHashes;
    const tokens = seq.spec.promptTokens + seq.generated;
    // At least one token is always computed (it produces the next token's logits).
    const maxHitBlocks = Math.min(Math.floor((tokens - 1) / bs), hashes.length);
    let hitBlocks = 0;
    while (hitBlocks < maxHitBlocks && this.#cache.has(hashes[hitBlocks]!)) hitBlocks += 1;
    const hits = hashes.slice(0, hitBlocks);
    for (const h of hits) this.#ref(h);
    const privateBlocks = Math.ceil(tokens / bs) - hitBlocks;
    if (!this.#reserve(privateBlocks)) {
      for (const h of hits) this.#unref(h);
      return false;
    }
    seq.shared = hits;
    seq.privateBlocks = privateBlocks;
    this.#privateBlocks += privateBlocks;
    const hitTokens = hitBlocks * bs;
    this.#prefixQueryTokens += seq.spec.promptTokens;
    this.#prefixHitTokens += Math.min(hitTokens, seq.spec.promptTokens);
    seq.cachedTokens ??= hitTokens;
    seq.prefillRemaining = tokens - hitTokens;
    return true;
  }

  /**
   * Caches the blocks `seq`'s tokens scheduled in this step fill, the moment it is scheduled,
   * as vLLM's `allocate_slots` caches min(computed + scheduled, num_tokens) for each request
   * in turn: a sequence admitted later in the same step finds them (its prefix is computed in
   * the same forward pass), so two requests sharing a new prefix that arrive together compute
   * it once. Caching after every admission, as this did before, charged the second a whole
   * prefill (bench/routing's cold rungs: 33 of 97 first-turn misses were such twins).
   */
  #cacheScheduled(seq: Seq): void {
    this.#cacheComputed(seq, seq.spec.promptTokens + seq.generated - seq.prefillRemaining);
  }

  /**
   * Moves the sequence's full blocks among its first `computed` tokens from its private
   * blocks into the prefix cache; blocks new to the cache are reported as `stored` runs (a
   * block another sequence cached meanwhile is shared instead, freeing this one's copy).
   */
  #cacheComputed(seq: Seq, computed: number): void {
    const hashes = seq.spec.blockHashes;
    const full = Math.min(Math.floor(computed / this.options.blockSizeTokens), hashes.length);
    let run = -1;
    for (let i = seq.shared.length; i <= full; i += 1) {
      const hash = hashes[i];
      const fresh = i < full && hash !== undefined && !this.#cache.has(hash);
      if (i < full && hash !== undefined) {
        this.#ref(hash);
        seq.shared.push(hash);
        seq.privateBlocks -= 1;
        this.#privateBlocks -= 1;
      }
      if (fresh) {
        if (run < 0) run = i;
      } else if (run >= 0) {
        this.#onCacheEvent?.({ type: "stored", seq: seq.spec, from: run, to: i });
        run = -1;
      }
    }
  }

  /** Makes sure `seq` has blocks for `tokens` tokens, preempting newer sequences if needed. */
  #growTo(seq: Seq, tokens: number): boolean {
    const need = Math.ceil(tokens / this.options.blockSizeTokens) - seq.shared.length;
    while (need > seq.privateBlocks) {
      if (this.#reserve(1)) {
        seq.privateBlocks += 1;
        this.#privateBlocks += 1;
        continue;
      }
      const victim = this.#running[this.#running.length - 1]!;
      this.#preempt(victim);
      if (victim === seq) return false;
    }
    return true;
  }

  #preempt(seq: Seq): void {
    this.#running.splice(this.#running.indexOf(seq), 1);
    seq.running = false;
    this.#release(seq);
    seq.prefillRemaining = seq.spec.promptTokens + seq.generated;
    this.#waiting.unshift(seq);
    this.#preemptions += 1;
  }

  #release(seq: Seq): void {
    // Tail first, as vLLM's block pool frees a request's blocks (`reversed(blocks)`): the
    // prompt's first blocks become the most recently used, so a shared prefix outlives the
    // turns after it (and an eviction never leaves a later block without its parent).
    for (let i = seq.shared.length - 1; i >= 0; i--) this.#unref(seq.shared[i] as string);
    seq.shared = [];
    this.#privateBlocks -= seq.privateBlocks;
    seq.privateBlocks = 0;
  }
}
