import { describe, expect, it } from "vitest";
import { buildTinyLlamaGguf, TINY_MODEL_SPECS, tinyModelParameters, tinyVocab } from "./gguf.js";

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

/** Reads the GGUF header and metadata keys back (a tiny reader, enough to check the writer). */
function readHeader(bytes: Uint8Array): {
  magic: string;
  version: number;
  tensors: number;
  keys: string[];
  arch: string;
} {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const dec = new TextDecoder();
  let o = 0;
  const u32 = () => {
    o += 4;
    return view.getUint32(o - 4, true);
  };
  const u64 = () => {
    o += 8;
    return Number(view.getBigUint64(o - 8, true));
  };
  const str = () => {
    const n = u64();
    o += n;
    return dec.decode(bytes.subarray(o - n, o));
  };
  const magic = dec.decode(bytes.subarray(0, 4));
  o = 4;
  const version = u32();
  const tensors = u64();
  const kvCount = u64();
  const keys: string[] = [];
  let arch = "";
  const skip = (type: number): void => {
    const sizes: Record<number, number> = {
      0: 1,
      1: 1,
      2: 2,
      3: 2,
      4: 4,
      5: 4,
      6: 4,
      7: 1,
      10: 8,
      11: 8,
      12: 8,
    };
    if (type === 8) str();
    else if (type === 9) {
      const t = u32();
      const n = u64();
      for (let i = 0; i < n; i += 1) skip(t);
    } else o += sizes[type] ?? 0;
  };
  for (let i = 0; i < kvCount; i += 1) {
    const key = str();
    keys.push(key);
    const type = u32();
    if (key === "general.architecture") arch = str();
    else skip(type);
  }
  return { magic, version, tensors, keys, arch };
}

describe("tiny llama GGUF writer", () => {
  it("writes a GGUF v3 llama header with the keys llama.cpp requires", () => {
    const h = readHeader(concat(buildTinyLlamaGguf(TINY_MODEL_SPECS.tiny)));
    expect([h.magic, h.version, h.arch, h.tensors]).toEqual(["GGUF", 3, "llama", 3 + 9 * 2]);
    for (const key of [
      "llama.context_length",
      "llama.embedding_length",
      "llama.block_count",
      "llama.feed_forward_length",
      "llama.attention.head_count",
      "llama.attention.layer_norm_rms_epsilon",
      "tokenizer.ggml.model",
      "tokenizer.ggml.tokens",
      "tokenizer.ggml.scores",
      "tokenizer.ggml.token_type",
      "tokenizer.chat_template",
    ]) {
      expect(h.keys).toContain(key);
    }
  });

  it("is deterministic and sized as documented", () => {
    const a = concat(buildTinyLlamaGguf(TINY_MODEL_SPECS.tiny));
    const b = concat(buildTinyLlamaGguf(TINY_MODEL_SPECS.tiny));
    expect(Buffer.compare(a, b)).toBe(0);
    expect(a.length).toBeGreaterThan(200_000);
    expect(a.length).toBeLessThan(1_000_000);
    expect(tinyModelParameters(TINY_MODEL_SPECS.small)).toBeGreaterThan(20e6);
    expect(tinyModelParameters(TINY_MODEL_SPECS.small)).toBeLessThan(30e6);
  });

  it("has a vocabulary with unique tokens, ASCII byte fallbacks and the newline byte", () => {
    const v = tinyVocab();
    expect(new Set(v.tokens).size).toBe(v.tokens.length);
    expect(v.tokens).toContain("<0x0A>");
    expect(v.tokens).not.toContain("<0x80>");
    expect(
      [v.tokens.length, v.scores.length, v.types.length].every((n) => n === v.tokens.length),
    ).toBe(true);
  });
});
