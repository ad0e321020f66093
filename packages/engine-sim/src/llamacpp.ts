import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { mkdir, open, rename, rm, stat } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { EngineSimError } from "./errors.js";
import { buildTinyLlamaGguf, TINY_MODEL_SPECS, type TinyModelKind } from "./gguf.js";

/** Where llama.cpp builds and generated models are cached. */
export interface LlamaCacheOptions {
  /** Cache root. Default `~/.cache/llmgw` (callers pass `$LLMGW_CACHE_DIR` when set). */
  cacheDir?: string;
}

/** Options of {@link ensureLlamaServer}. */
export interface EnsureLlamaServerOptions extends LlamaCacheOptions {
  /** Receives each progress line of the build script (e.g. `build-llamacpp: [ 42%]`). */
  onProgress?: (line: string) => void;
}

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

/** The default cache root, `~/.cache/llmgw`. */
export function defaultLlamaCacheDir(): string {
  return join(homedir(), ".cache", "llmgw");
}

function releaseTag(): string | undefined {
  try {
    const info = JSON.parse(
      readFileSync(join(repoRoot, "node_modules/node-llama-cpp/llama/llama.cpp.info.json"), "utf8"),
    ) as { tag?: unknown };
    return typeof info.tag === "string" ? info.tag : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The cached `llama-server` binary for the llama.cpp release bundled with node-llama-cpp, or
 * `undefined` when it has not been built (never builds; see {@link ensureLlamaServer}).
 */
export function findLlamaServer(options: LlamaCacheOptions = {}): string | undefined {
  const root = join(options.cacheDir ?? defaultLlamaCacheDir(), "llama.cpp");
  const tag = releaseTag();
  const candidates = tag
    ? [tag]
    : existsSync(root)
      ? readdirSync(root).filter((d) => !d.includes(".build."))
      : [];
  for (const dir of candidates) {
    const bin = join(root, dir, "bin", "llama-server");
    if (existsSync(bin)) return bin;
  }
  return undefined;
}

/**
 * Returns the path of `llama-server`, building it with `scripts/build-llamacpp.sh` when it is
 * missing (about 6 minutes on 2 cores, once; concurrent callers wait on the script's lock).
 * Throws `LLMGW_ENGINE_SIM_LLAMACPP_BUILD_FAILED` with the script's last lines on failure.
 */
export async function ensureLlamaServer(options: EnsureLlamaServerOptions = {}): Promise<string> {
  const found = findLlamaServer(options);
  if (found) return found;
  const cacheDir = options.cacheDir ?? defaultLlamaCacheDir();
  const script = join(repoRoot, "scripts", "build-llamacpp.sh");
  if (!existsSync(script)) {
    // An installed llmgw (npm or .deb) carries no llama.cpp source: it builds from a checkout.
    throw new EngineSimError(
      "LLMGW_ENGINE_SIM_LLAMACPP_NOT_BUILT",
      `no llama-server is built in ${join(cacheDir, "llama.cpp")}, and this install cannot build one (it has no llama.cpp source: run scripts/build-llamacpp.sh in a checkout of llmgw, with LLMGW_CACHE_DIR pointing here), or skip it with --no-llamacpp`,
    );
  }
  const tail: string[] = [];
  let stdout = "";
  const code = await new Promise<number | null>((resolve, reject) => {
    const child = spawn("bash", [script], {
      env: { ...process.env, LLMGW_CACHE_DIR: cacheDir },
      stdio: ["ignore", "pipe", "pipe"],
    });
    child.stdout.on("data", (d: Buffer) => {
      stdout += d.toString("utf8");
    });
    let partial = "";
    child.stderr.on("data", (d: Buffer) => {
      partial += d.toString("utf8");
      const lines = partial.split("\n");
      partial = lines.pop() ?? "";
      for (const line of lines) {
        tail.push(line);
        if (tail.length > 40) tail.shift();
        options.onProgress?.(line);
      }
    });
    child.once("error", reject);
    child.once("close", resolve);
  });
  const bin = stdout.trim().split("\n").pop() ?? "";
  if (code !== 0 || !bin || !existsSync(bin)) {
    throw new EngineSimError(
      "LLMGW_ENGINE_SIM_LLAMACPP_BUILD_FAILED",
      `scripts/build-llamacpp.sh exited with ${String(code)}:\n${tail.join("\n")}`,
    );
  }
  return bin;
}

/**
 * Returns the path of a generated random-weight llama GGUF of the given kind in
 * `<cacheDir>/models/`, writing it first when missing (tiny: well under a second; small:
 * ≈100 MB, a few seconds). Deterministic and written atomically (temp file + rename).
 */
export async function ensureTinyModel(
  kind: TinyModelKind = "tiny",
  options: LlamaCacheOptions = {},
): Promise<string> {
  const spec = TINY_MODEL_SPECS[kind];
  const dir = join(options.cacheDir ?? defaultLlamaCacheDir(), "models");
  const path = join(dir, `${spec.name}-v1.gguf`);
  const exists = await stat(path).then(
    (s) => s.isFile() && s.size > 0,
    () => false,
  );
  if (exists) return path;
  await mkdir(dir, { recursive: true });
  const tmp = `${path}.${process.pid}.tmp`;
  const file = await open(tmp, "w");
  try {
    for (const part of buildTinyLlamaGguf(spec)) await file.write(part);
  } finally {
    await file.close();
  }
  try {
    await rename(tmp, path);
  } catch (error) {
    await rm(tmp, { force: true });
    throw error;
  }
  return path;
}
