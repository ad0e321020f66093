import { describe, expect, it } from "vitest";
import {
  type PrefixCacheEvent,
  type SequenceSpec,
  TimingModel,
  type TokenEvent,
} from "./timing-model.js";
import { blockHashes } from "./tokenizer.js";

/** Drives the model like the engine loop does, on a manual clock starting at `nowMs`. */
function runUntilIdle(
  model: TimingModel,
  nowMs = 0,
): { events: (TokenEvent & { atMs: number })[]; endMs: number } {
  const events: (TokenEvent & { atMs: number })[] = [];
  let t = nowMs;
  for (let guard = 0; guard < 100_000; guard += 1) {
    const plan = model.step(t);
    if (!plan) return { events, endMs: t };
    t = plan.endMs;
    for (const e of plan.events) events.push({ ...e, atMs: t });
  }
  throw new Error("model never became idle");
}

function seq(id: string, text: string, outputTokens: number, blockSize = 16): SequenceSpec {
  return {
    id,
    promptTokens: Math.ceil(text.length / 4),
    blockHashes: blockHashes(text, blockSize),
    outputTokens,
  };
}

const ttftOf = (events: readonly TokenEvent[], id: string): number =>
  events.find((e) => e.id === id && e.tokenIndex === 0)?.ttftMs ?? Number.NaN;

describe("TimingModel", () => {
  it("lowers TTFT by exactly the prefill a cached prefix skips", () => {
    const model = new TimingModel({
      prefillTokensPerSecond: 1000,
      decodeStepMs: 10,
      decodeStepMsPerSeq: 0,
    });
    const prompt = "x".repeat(4000); // 1000 tokens = 62 full blocks + 8 tokens
    model.submit(seq("cold", prompt, 4), 0);
    const cold = runUntilIdle(model, 0);
    model.submit(seq("warm", prompt, 4), cold.endMs);
    const warm = runUntilIdle(model, cold.endMs);
    // 62 blocks × 16 tokens are cached; at 1000 tok/s that is 992 ms of prefill skipped.
    expect(ttftOf(cold.events, "cold")).toBeCloseTo(10 + 1000, 6);
    expect(ttftOf(warm.events, "warm")).toBeCloseTo(10 + 8, 6);
    expect(model.snapshot()).toMatchObject({ prefixQueryTokens: 2000, prefixHitTokens: 992 });
  });

  it("lets a request admitted in the same step reuse the blocks an earlier one schedules", () => {
    // vLLM's scheduler calls get_computed_blocks, then allocate_slots (which caches the blocks
    // the scheduled tokens fill), request by request: the second sees the first's blocks.
    const model = new TimingModel({
      prefillTokensPerSecond: 1000,
      decodeStepMs: 10,
      decodeStepMsPerSeq: 0,
    });
    const system = "s".repeat(64 * 40); // 640 tokens = 40 full blocks
    model.submit(seq("first", `${system}${"a".repeat(64)}`, 2), 0);
    model.submit(seq("twin", `${system}${"b".repeat(64)}`, 2), 0);
    const { events } = runUntilIdle(model, 0);
    const first = events.find((e) => e.id === "first" && e.tokenIndex === 0);
    const twin = events.find((e) => e.id === "twin" && e.tokenIndex === 0);
    expect(first?.cachedTokens).toBe(0);
    expect(twin?.cachedTokens).toBe(640);
    // One step computes 656 + 16 prompt tokens, not 656 twice.
    expect(first?.ttftMs).toBeCloseTo(10 + 672, 6);
    expect(twin?.ttftMs).toBeCloseTo(10 + 672, 6);
  });

  it("always computes at least one prompt token even when the whole prompt is cached", () => {
    const model = new TimingModel({
      prefillTokensPerSecond: 1000,
      decodeStepMs: 10,
      decodeStepMsPerSeq: 0,
    });
    const prompt = "y".repeat(64 * 4); // exactly 4 blocks
    model.submit(seq("a", prompt, 1), 0);
    const a = runUntilIdle(model);
    model.submit(seq("b", prompt, 1), a.endMs);
    const b = runUntilIdle(model, a.endMs);
    expect(ttftOf(b.events, "b")).toBeCloseTo(10 + 16, 6); // 3 blocks hit, last block recomputed
  });

  it("makes requests beyond the running limit wait for a free slot", () => {
    const model = new TimingModel({ maxRunningSeqs: 2, decodeStepMs: 10, decodeStepMsPerSeq: 0 });
    model.submit(seq("a", "aaaa", 3), 0);
    model.submit(seq("b", "bbbb", 3), 0);
    model.submit(seq("c", "cccc", 3), 0);
    model.step(0);
    expect(model.snapshot()).toMatchObject({ running: 2, waiting: 1 });
    const { events } = runUntilIdle(model, 100);
    const lastOfA = events.find((e) => e.id === "a" && e.finished)!;
    const firstOfC = events.find((e) => e.id === "c" && e.tokenIndex === 0)!;
    expect(firstOfC.atMs).toBeGreaterThan(lastOfA.atMs);
    expect(model.snapshot()).toMatchObject({ running: 0, waiting: 0, generationTokens: 9 });
  });

  it("evicts the least recently used cached prefixes under KV pressure", () => {
    // 10 blocks of 16 tokens; a and b leave 4 cached blocks each, c needs 5.
    const model = new TimingModel({ kvCacheTokens: 160, maxRunningSeqs: 4, maxBatchedTokens: 64 });
    const a = "a".repeat(256);
    const b = "b".repeat(256);
    const c = "c".repeat(320);
    let t = 0;
    for (const [id, text] of [
      ["a", a],
      ["b", b],
    ] as const) {
      model.submit(seq(id, text, 1), t);
      t = runUntilIdle(model, t).endMs;
    }
    expect(model.snapshot().cachedFreeBlocks).toBe(8);
    model.submit(seq("c", c, 1), t);
    t = runUntilIdle(model, t).endMs;
    // c needed 5 blocks with 2 free: the 3 least recently used went. Blocks are freed tail
    // first, as vLLM does, so those were a's last three and its first block stays.
    const [a0, a1, a2, a3] = blockHashes(a, 16);
    expect([a0, a1, a2, a3].map((h) => model.hasCachedBlock(h!))).toEqual([
      true,
      false,
      false,
      false,
    ]);
    expect(blockHashes(b, 16).every((h) => model.hasCachedBlock(h))).toBe(true);
  });

  it("preempts the newest sequence when running ones cannot grow, and still finishes all", () => {
    const model = new TimingModel({
      kvCacheTokens: 64,
      maxRunningSeqs: 8,
      maxBatchedTokens: 64,
      blockSizeTokens: 16,
    });
    for (const id of ["p", "q", "r"]) model.submit(seq(id, `${id}`.repeat(40), 30), 0);
    const { events } = runUntilIdle(model);
    expect(model.snapshot().preemptions).toBeGreaterThan(0);
    for (const id of ["p", "q", "r"]) {
      expect(events.filter((e) => e.id === id).map((e) => e.tokenIndex)).toEqual(
        Array.from({ length: 30 }, (_, i) => i),
      );
    }
  });

  it.each([
    [1, 12],
    [128, 12 + 0.14 * 127],
    [256, 12 + 0.14 * 255],
  ])("takes longer per decode step with a bigger batch (%i seqs → %f ms)", (seqs, ms) => {
    expect(new TimingModel().decodeStepMsFor(seqs)).toBeCloseTo(ms, 9);
  });

  it("reports KV usage of running sequences and frees it when they finish", () => {
    const model = new TimingModel({ kvCacheTokens: 1600 });
    model.submit(seq("a", "z".repeat(64 * 4 * 2), 5), 0); // 128 tokens = 8 blocks
    model.step(0);
    expect(model.snapshot().kvUsage).toBeCloseTo(8 / 100, 9);
    model.step(100); // the first output token needs a 9th block
    expect(model.snapshot().kvUsage).toBeCloseTo(9 / 100, 9);
    runUntilIdle(model, 100);
    expect(model.snapshot().kvUsage).toBe(0);
  });

  it.each([
    [{ maxRunningSeqs: 0 }, "maxRunningSeqs must be an integer >= 1, got 0"],
    [
      { prefillTokensPerSecond: Number.NaN },
      "prefillTokensPerSecond must be a number >= 1, got NaN",
    ],
    [
      { maxBatchedTokens: 8, maxRunningSeqs: 16 },
      "maxBatchedTokens (8) must be >= maxRunningSeqs (16)",
    ],
  ])("rejects bad options %o", (options, message) => {
    expect(() => new TimingModel(options)).toThrow(message);
  });

  it("refuses a sequence that could never fit the KV cache", () => {
    const model = new TimingModel({ kvCacheTokens: 64 });
    expect(() =>
      model.submit({ id: "big", promptTokens: 60, blockHashes: [], outputTokens: 10 }, 0),
    ).toThrow("cannot fit a KV cache of 64 tokens");
  });
});

describe("TimingModel prefix-cache events", () => {
  const compact = (events: PrefixCacheEvent[]) =>
    events.map((e) =>
      e.type === "stored"
        ? `stored ${e.seq.id} ${e.from}..${e.to}`
        : e.type === "removed"
          ? `removed ${e.hashes.length}`
          : "cleared",
    );

  it("reports blocks entering the cache once, in runs, and reports cached tokens per request", () => {
    const events: PrefixCacheEvent[] = [];
    const model = new TimingModel({}, { onCacheEvent: (e) => events.push(e) });
    const shared = "s".repeat(128); // 2 blocks of 16 tokens
    model.submit(seq("a", `${shared}${"a".repeat(130)}`, 2), 0); // 4 full blocks
    const first = runUntilIdle(model);
    model.submit(seq("b", `${shared}${"b".repeat(70)}`, 2), first.endMs); // 3 full blocks
    const second = runUntilIdle(model, first.endMs);
    expect(compact(events)).toEqual(["stored a 0..4", "stored b 2..3"]);
    const cached = (r: typeof first, id: string) =>
      r.events.find((e) => e.id === id && e.tokenIndex === 0)?.cachedTokens;
    expect(cached(first, "a")).toBe(0);
    expect(cached(second, "b")).toBe(32);
    expect(
      second.events.filter((e) => e.tokenIndex > 0).every((e) => e.cachedTokens === undefined),
    ).toBe(true);
  });

  it.each([
    // [what, prompt tokens, output tokens, step budget, stored runs step by step]
    ["a chunked prefill, chunk by chunk", 200, 1, 64, ["a 0..4", "a 4..8", "a 8..12"]],
    // computed after the last step: 32 + 40 - 1 = 71 tokens, 4 full blocks.
    ["output blocks, each as it fills", 32, 40, 256, ["a 0..2", "a 2..3", "a 3..4"]],
  ])("caches only computed full blocks: %s", (_what, prompt, output, budget, runs) => {
    const events: PrefixCacheEvent[] = [];
    const model = new TimingModel(
      { maxBatchedTokens: budget, maxRunningSeqs: 4 },
      { onCacheEvent: (e) => events.push(e) },
    );
    const hashes = Array.from({ length: Math.floor((prompt + output) / 16) }, (_, i) => `h${i}`);
    model.submit({ id: "a", promptTokens: prompt, blockHashes: hashes, outputTokens: output }, 0);
    const perStep: string[][] = [];
    for (let t = 0; ; ) {
      const plan = model.step(t);
      if (!plan) break;
      t = plan.endMs;
      perStep.push(compact(events.splice(0)).map((e) => e.replace("stored ", "")));
    }
    expect(perStep.filter((e) => e.length > 0).flat()).toEqual(runs);
    expect(perStep.every((e) => e.length <= 1)).toBe(true); // one run per step at most
  });

  it("reports evictions, and a reset as cleared (refused while blocks are in use)", () => {
    const events: PrefixCacheEvent[] = [];
    // 6 blocks in all: the second prompt (4 blocks + output) must evict the first's.
    const model = new TimingModel(
      { kvCacheTokens: 96, maxBatchedTokens: 256, maxRunningSeqs: 4 },
      { onCacheEvent: (e) => events.push(e) },
    );
    model.submit(seq("a", "a".repeat(256), 1), 0);
    const { endMs } = runUntilIdle(model);
    model.submit(seq("b", "b".repeat(256), 3), endMs);
    model.step(endMs);
    expect(model.resetPrefixCache()).toBe(false); // b runs and references its blocks
    runUntilIdle(model, endMs);
    expect(model.resetPrefixCache()).toBe(true);
    // b's 4 blocks evict 2 of a's at admission, its first output token a third.
    expect(compact(events)).toEqual([
      "stored a 0..4",
      "removed 2",
      "stored b 0..4",
      "removed 1",
      "cleared",
    ]);
    expect(model.cachedBlockHashes()).toEqual([]);
  });
});
