import { EngineSimError } from "./errors.js";
import { createPrng } from "./tokenizer.js";

/**
 * A minimal GGUF v3 writer for small random-weight llama-architecture models: enough for
 * llama.cpp's `llama-server` to load and generate (gibberish) text, so real-engine tests can
 * run without downloading weights. Format: ggml `docs/gguf.md`; keys and tensor names as read
 * by llama.cpp `src/llama-model.cpp` (LLM_ARCH_LLAMA) and `src/llama-vocab.cpp` (SPM vocab).
 */

/** Shape of a generated model. */
export interface TinyLlamaSpec {
  readonly name: string;
  readonly embeddingLength: number;
  readonly blockCount: number;
  readonly feedForwardLength: number;
  readonly headCount: number;
  readonly headCountKv: number;
  readonly contextLength: number;
  readonly seed: number;
}

/** The two generated sizes: `tiny` (≈150k parameters, ≈0.6 MB) and `small` (≈25M, ≈100 MB). */
export type TinyModelKind = "tiny" | "small";

/** Built-in specs per {@link TinyModelKind}. */
export const TINY_MODEL_SPECS: Readonly<Record<TinyModelKind, TinyLlamaSpec>> = Object.freeze({
  tiny: {
    name: "llmgw-tiny-random",
    embeddingLength: 64,
    blockCount: 2,
    feedForwardLength: 128,
    headCount: 4,
    headCountKv: 4,
    contextLength: 4096,
    seed: 1,
  },
  small: {
    name: "llmgw-small-random",
    embeddingLength: 512,
    blockCount: 8,
    feedForwardLength: 1280,
    headCount: 8,
    headCountKv: 8,
    contextLength: 4096,
    seed: 2,
  },
});

/** The chat template (ChatML), which llama.cpp recognises with and without jinja. */
export const TINY_CHAT_TEMPLATE =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TOKEN_NORMAL = 1;
const TOKEN_UNKNOWN = 2;
const TOKEN_CONTROL = 3;
const TOKEN_BYTE = 6;
const WORD_PIECES = [
  "▁t",
  "he",
  "▁th",
  "▁the",
  "in",
  "er",
  "an",
  "▁a",
  "on",
  "re",
  "▁s",
  "▁w",
  "▁o",
  "at",
  "en",
  "▁c",
  "it",
  "is",
  "▁b",
  "or",
  "es",
  "▁f",
  "▁m",
  "ing",
  "▁p",
  "▁an",
  "▁and",
  "▁to",
  "▁of",
];

/** The vocabulary: `<unk> <s> </s>`, ChatML markers, 128 ASCII byte tokens, `▁`, printable ASCII, word pieces. */
export function tinyVocab(): { tokens: string[]; scores: number[]; types: number[] } {
  const tokens: string[] = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"];
  const types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_CONTROL, TOKEN_CONTROL];
  const scores = [0, 0, 0, 0, 0];
  // Only the 128 ASCII byte tokens: a random model sampling a lone 0x80–0xFF byte would emit
  // invalid UTF-8, which llama-server's chat output parser rejects (HTTP 500). Prompts must
  // therefore be ASCII (non-ASCII characters have no byte fallback).
  for (let b = 0; b < 128; b += 1) {
    tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    types.push(TOKEN_BYTE);
    scores.push(0);
  }
  const pieces = ["▁"];
  for (let c = 33; c < 127; c += 1) pieces.push(String.fromCharCode(c));
  pieces.push(...WORD_PIECES);
  pieces.forEach((piece, i) => {
    tokens.push(piece);
    types.push(TOKEN_NORMAL);
    // SPM merges prefer higher scores; longer pieces score higher so words win over letters.
    scores.push(-1000 + piece.length * 10 - i * 0.001);
  });
  return { tokens, scores, types };
}

const GGUF_UINT32 = 4;
const GGUF_INT32 = 5;
const GGUF_FLOAT32 = 6;
const GGUF_BOOL = 7;
const GGUF_STRING = 8;
const GGUF_ARRAY = 9;
const GGML_TYPE_F32 = 0;
const ALIGNMENT = 32;

type KvValue =
  | { type: "u32"; value: number }
  | { type: "f32"; value: number }
  | { type: "bool"; value: boolean }
  | { type: "str"; value: string }
  | { type: "str[]"; value: readonly string[] }
  | { type: "f32[]"; value: readonly number[] }
  | { type: "i32[]"; value: readonly number[] };

class ByteWriter {
  readonly parts: Uint8Array[] = [];
  length = 0;
  readonly #enc = new TextEncoder();

  bytes(b: Uint8Array): void {
    this.parts.push(b);
    this.length += b.length;
  }
  u32(v: number): void {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setUint32(0, v, true);
    this.bytes(b);
  }
  i32(v: number): void {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setInt32(0, v, true);
    this.bytes(b);
  }
  u64(v: number): void {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setBigUint64(0, BigInt(v), true);
    this.bytes(b);
  }
  f32(v: number): void {
    const b = new Uint8Array(4);
    new DataView(b.buffer).setFloat32(0, v, true);
    this.bytes(b);
  }
  str(s: string): void {
    const b = this.#enc.encode(s);
    this.u64(b.length);
    this.bytes(b);
  }
  pad(): void {
    const rem = this.length % ALIGNMENT;
    if (rem !== 0) this.bytes(new Uint8Array(ALIGNMENT - rem));
  }
}

function writeKv(w: ByteWriter, key: string, v: KvValue): void {
  w.str(key);
  switch (v.type) {
    case "u32":
      w.u32(GGUF_UINT32);
      w.u32(v.value);
      break;
    case "f32":
      w.u32(GGUF_FLOAT32);
      w.f32(v.value);
      break;
    case "bool":
      w.u32(GGUF_BOOL);
      w.bytes(Uint8Array.of(v.value ? 1 : 0));
      break;
    case "str":
      w.u32(GGUF_STRING);
      w.str(v.value);
      break;
    case "str[]":
      w.u32(GGUF_ARRAY);
      w.u32(GGUF_STRING);
      w.u64(v.value.length);
      for (const s of v.value) w.str(s);
      break;
    case "f32[]":
      w.u32(GGUF_ARRAY);
      w.u32(GGUF_FLOAT32);
      w.u64(v.value.length);
      for (const x of v.value) w.f32(x);
      break;
    case "i32[]":
      w.u32(GGUF_ARRAY);
      w.u32(GGUF_INT32);
      w.u64(v.value.length);
      for (const x of v.value) w.i32(x);
      break;
  }
}

interface TensorSpec {
  readonly name: string;
  /** ggml order: ne[0] is the innermost (row length). */
  readonly dims: readonly number[];
  /** Uniform init half-width; 0 means all ones (norm weights). */
  readonly scale: number;
}

function tensorSpecs(spec: TinyLlamaSpec, vocab: number): TensorSpec[] {
  const e = spec.embeddingLength;
  const kv = (e / spec.headCount) * spec.headCountKv;
  const f = spec.feedForwardLength;
  const out: TensorSpec[] = [
    { name: "token_embd.weight", dims: [e, vocab], scale: 1 },
    { name: "output_norm.weight", dims: [e], scale: 0 },
    { name: "output.weight", dims: [e, vocab], scale: 1 / Math.sqrt(e) },
  ];
  for (let i = 0; i < spec.blockCount; i += 1) {
    out.push(
      { name: `blk.${i}.attn_norm.weight`, dims: [e], scale: 0 },
      { name: `blk.${i}.attn_q.weight`, dims: [e, e], scale: 1 / Math.sqrt(e) },
      { name: `blk.${i}.attn_k.weight`, dims: [e, kv], scale: 1 / Math.sqrt(e) },
      { name: `blk.${i}.attn_v.weight`, dims: [e, kv], scale: 1 / Math.sqrt(e) },
      { name: `blk.${i}.attn_output.weight`, dims: [e, e], scale: 1 / Math.sqrt(e) },
      { name: `blk.${i}.ffn_norm.weight`, dims: [e], scale: 0 },
      { name: `blk.${i}.ffn_gate.weight`, dims: [e, f], scale: 1 / Math.sqrt(e) },
      { name: `blk.${i}.ffn_up.weight`, dims: [e, f], scale: 1 / Math.sqrt(e) },
      { name: `blk.${i}.ffn_down.weight`, dims: [f, e], scale: 1 / Math.sqrt(f) },
    );
  }
  return out;
}

/** Parameter count of a spec (for reports). */
export function tinyModelParameters(spec: TinyLlamaSpec): number {
  return tensorSpecs(spec, tinyVocab().tokens.length).reduce(
    (sum, t) => sum + t.dims.reduce((a, b) => a * b, 1),
    0,
  );
}

/**
 * Builds the GGUF file of `spec` as a list of byte chunks (header, metadata, tensor infos,
 * then each tensor's F32 data, aligned to 32 bytes). Deterministic: same spec, same bytes.
 */
export function buildTinyLlamaGguf(spec: TinyLlamaSpec): Uint8Array[] {
  if (spec.embeddingLength % spec.headCount !== 0 || spec.headCount % spec.headCountKv !== 0) {
    throw new EngineSimError(
      "LLMGW_ENGINE_SIM_GGUF_INVALID",
      `embeddingLength ${spec.embeddingLength} must divide by headCount ${spec.headCount}, which must divide by headCountKv ${spec.headCountKv}`,
    );
  }
  const vocab = tinyVocab();
  const kvs: [string, KvValue][] = [
    ["general.architecture", { type: "str", value: "llama" }],
    ["general.name", { type: "str", value: spec.name }],
    ["general.alignment", { type: "u32", value: ALIGNMENT }],
    ["llama.context_length", { type: "u32", value: spec.contextLength }],
    ["llama.embedding_length", { type: "u32", value: spec.embeddingLength }],
    ["llama.block_count", { type: "u32", value: spec.blockCount }],
    ["llama.feed_forward_length", { type: "u32", value: spec.feedForwardLength }],
    ["llama.attention.head_count", { type: "u32", value: spec.headCount }],
    ["llama.attention.head_count_kv", { type: "u32", value: spec.headCountKv }],
    ["llama.rope.dimension_count", { type: "u32", value: spec.embeddingLength / spec.headCount }],
    ["llama.rope.freq_base", { type: "f32", value: 10000 }],
    ["llama.attention.layer_norm_rms_epsilon", { type: "f32", value: 1e-5 }],
    ["llama.vocab_size", { type: "u32", value: vocab.tokens.length }],
    ["tokenizer.ggml.model", { type: "str", value: "llama" }],
    ["tokenizer.ggml.tokens", { type: "str[]", value: vocab.tokens }],
    ["tokenizer.ggml.scores", { type: "f32[]", value: vocab.scores }],
    ["tokenizer.ggml.token_type", { type: "i32[]", value: vocab.types }],
    ["tokenizer.ggml.unknown_token_id", { type: "u32", value: 0 }],
    ["tokenizer.ggml.bos_token_id", { type: "u32", value: 1 }],
    ["tokenizer.ggml.eos_token_id", { type: "u32", value: 2 }],
    ["tokenizer.ggml.add_bos_token", { type: "bool", value: true }],
    ["tokenizer.ggml.add_eos_token", { type: "bool", value: false }],
    ["tokenizer.chat_template", { type: "str", value: TINY_CHAT_TEMPLATE }],
  ];
  const tensors = tensorSpecs(spec, vocab.tokens.length);
  const head = new ByteWriter();
  head.bytes(new TextEncoder().encode("GGUF"));
  head.u32(3);
  head.u64(tensors.length);
  head.u64(kvs.length);
  for (const [key, value] of kvs) writeKv(head, key, value);
  let offset = 0;
  const sizes: number[] = [];
  for (const t of tensors) {
    head.str(t.name);
    head.u32(t.dims.length);
    for (const d of t.dims) head.u64(d);
    head.u32(GGML_TYPE_F32);
    head.u64(offset);
    const bytes = t.dims.reduce((a, b) => a * b, 1) * 4;
    sizes.push(bytes);
    offset += Math.ceil(bytes / ALIGNMENT) * ALIGNMENT;
  }
  head.pad();
  const parts = [...head.parts];
  const next = createPrng(spec.seed);
  tensors.forEach((t, i) => {
    const bytes = sizes[i] ?? 0;
    const padded = Math.ceil(bytes / ALIGNMENT) * ALIGNMENT;
    const buf = new ArrayBuffer(padded);
    const data = new Float32Array(buf, 0, bytes / 4);
    if (t.scale === 0) data.fill(1);
    else for (let j = 0; j < data.length; j += 1) data[j] = (next() * 2 - 1) * t.scale;
    parts.push(new Uint8Array(buf));
  });
  return parts;
}
