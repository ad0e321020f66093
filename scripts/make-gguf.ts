// Writes the generated random-weight llama GGUF models into the llmgw cache and prints their
// paths (deterministic; an existing file is kept). Usage:
//   npx tsx scripts/make-gguf.ts [tiny|small ...]      (default: tiny)
// Cache root: $LLMGW_CACHE_DIR, default ~/.cache/llmgw (models/ below it).
import {
  ensureTinyModel,
  TINY_MODEL_SPECS,
  type TinyModelKind,
  tinyModelParameters,
} from "../packages/engine-sim/src/index.js";

const kinds = process.argv.slice(2);
for (const kind of kinds.length > 0 ? kinds : ["tiny"]) {
  if (kind !== "tiny" && kind !== "small") {
    process.stderr.write(`make-gguf: unknown kind ${JSON.stringify(kind)} (tiny or small)\n`);
    process.exit(2);
  }
  const k: TinyModelKind = kind;
  const params = tinyModelParameters(TINY_MODEL_SPECS[k]);
  process.stderr.write(`make-gguf: ${k}: ${(params / 1e6).toFixed(2)}M parameters (F32)\n`);
  // biome-ignore lint/suspicious/noUndeclaredEnvVars: a cache location, not a turbo task input
  const path = await ensureTinyModel(k, { cacheDir: process.env.LLMGW_CACHE_DIR || undefined });
  process.stdout.write(`${path}\n`);
}
