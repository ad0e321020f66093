import { afterAll, describe, expect, it } from "vitest";
import { isolatedSalt } from "./cache-isolation.js";
import { createRequestAnalyzer } from "./request-analyzer.js";

// Threshold 1 KiB: the small body stays inline, the large ones go through a real worker.
const analyzer = createRequestAnalyzer({ inlineThresholdBytes: 1024, pool: { maxThreads: 1 } });
const inlineOnly = createRequestAnalyzer({ pool: false });
afterAll(() => Promise.all([analyzer.close(), inlineOnly.close()]));

const body = (content: string) =>
  Buffer.from(
    JSON.stringify({
      model: "m",
      stream: true,
      max_tokens: 5,
      messages: [{ role: "user", content }],
    }),
  );

describe("request analyzer", () => {
  it("analyses small bodies inline and large ones in the pool, with identical results", async () => {
    const small = await analyzer.analyze(body("hi"));
    expect(small).toMatchObject({
      ok: true,
      mode: "inline",
      model: "m",
      stream: true,
      maxTokens: 5,
    });
    for (const size of [5000, 20_000, 70_000, 5000]) {
      const big = body("é".repeat(size));
      const viaPool = await analyzer.analyze(big);
      const viaInline = await inlineOnly.analyze(big);
      expect(viaPool.mode).toBe("pool");
      expect({ ...viaPool, mode: "inline" }).toEqual(viaInline);
      // "user\n" + content ("é" is 2 UTF-8 bytes) + "\n", in 1 KiB blocks.
      if (viaPool.ok) expect(viaPool.chain.length).toBe(Math.floor((2 * size + 6) / 1024));
    }
  });

  it("analyses an owned pooled body in place, without copying or changing it", async () => {
    const bytes = body("x".repeat(30_000));
    const owned = analyzer.buffers.take(bytes.length);
    expect(owned.buffer).toBeInstanceOf(SharedArrayBuffer);
    owned.set(bytes);
    const a = await analyzer.analyze(owned, true);
    expect(a).toMatchObject({ ok: true, mode: "pool", model: "m" });
    expect(Buffer.from(owned).equals(bytes)).toBe(true);
    analyzer.buffers.give(owned);
    expect(analyzer.buffers.take(bytes.length).buffer).toBe(owned.buffer);
  });

  it("analyses shared-memory bodies on both paths, below and above the scan threshold", async () => {
    for (const size of [20_000, 100_000]) {
      const bytes = body(`é ${"y".repeat(size)}`);
      const owned = analyzer.buffers.take(bytes.length);
      owned.set(bytes);
      const viaPool = await analyzer.analyze(owned, true);
      const viaInline = await inlineOnly.analyze(bytes);
      expect({ ...viaPool, mode: "inline" }).toEqual(viaInline);
      analyzer.buffers.give(owned);
    }
  });

  it("keeps a salted body's mark and salted keys inline and through the pool", async () => {
    const content = "z".repeat(5000);
    const salted = Buffer.from(
      JSON.stringify({ model: "m", cache_salt: "tenant-a", messages: [{ role: "user", content }] }),
    );
    const viaPool = await analyzer.analyze(salted);
    const viaInline = await inlineOnly.analyze(salted);
    const plain = await inlineOnly.analyze(body(content));
    expect(viaPool).toMatchObject({ ok: true, mode: "pool", salt: "tenant-a" });
    expect({ ...viaPool, mode: "inline" }).toEqual(viaInline);
    if (!viaInline.ok || !plain.ok) throw new Error("both bodies are valid");
    expect(viaInline.chain.length).toBe(plain.chain.length);
    expect(plain).not.toHaveProperty("salt");
    expect(viaInline.chain[0]).not.toBe(plain.chain[0]);
  });

  it("keys a body under its isolation scope's salt through the pool as inline", async () => {
    const content = "y".repeat(5000);
    const scope = "tenant\0search";
    const viaPool = await analyzer.analyze(body(content), false, scope);
    const viaInline = await inlineOnly.analyze(body(content), false, scope);
    const plain = await inlineOnly.analyze(body(content));
    expect(viaPool).toMatchObject({
      ok: true,
      mode: "pool",
      isolatedSalt: isolatedSalt(scope, undefined),
    });
    expect({ ...viaPool, mode: "inline" }).toEqual(viaInline);
    if (!viaInline.ok || !plain.ok) throw new Error("both bodies are valid");
    expect(viaInline.chain[0]).not.toBe(plain.chain[0]);
  });

  it("reports refusals from the pool like inline ones", async () => {
    const junk = Buffer.from(`{"model": ${"1".repeat(3000)}`);
    await expect(analyzer.analyze(junk)).resolves.toMatchObject({
      ok: false,
      reason: "invalid_json",
      mode: "pool",
    });
  });
});
