/**
 * llama-server's options as alias groups, and the groups llmgw owns.
 *
 * llama.cpp gives one option several spellings (`-hf, -hfr, --hf-repo`), so owning
 * `--hf-repo` alone let `extraArgs: ["-hfr", "attacker/x"]` choose the model. The owned list
 * is therefore whole alias groups, copied from the pinned build's `--help`
 * (`packages/engines/test/fixtures/llama-server-help.txt`); a test parses that fixture with
 * {@link parseLlamaServerHelp} and fails when an owned group gained or lost a spelling, and an
 * integration test does the same against the live binary when it is built. Which options must
 * be owned is not only this hand list: {@link llamacppOptionMustBeOwned} derives it from the
 * help text (any value naming a file, path, directory, URL or repository; downloads; presets),
 * and the test fails when the pinned help has such an option the list lacks.
 */

/** One option of llama-server's `--help`: its spellings, value placeholder and description. */
export interface LlamaServerHelpOption {
  /** Spellings in the order printed (`["-hf", "-hfr", "--hf-repo"]`). */
  readonly aliases: string[];
  /** The value placeholder after the last spelling (`<user>/<model>[:quant]`), "" for a switch. */
  readonly value: string;
  /** The description, its lines joined with single spaces. */
  readonly description: string;
}

/**
 * The options of llama-server's `--help`, in order. Pure; section headers are skipped. The
 * option text is the first 40 columns of a line starting with `-` (descriptions start at
 * column 40) or the whole line when the option text is longer (the description then starts on
 * the next line); spellings are its comma-separated pieces' first words, the value is what
 * follows the last spelling, and the description runs on over the indented lines below.
 */
export function parseLlamaServerHelpOptions(help: string): LlamaServerHelpOption[] {
  const options: LlamaServerHelpOption[] = [];
  let current: { aliases: string[]; value: string; description: string[] } | undefined;
  const finish = () => {
    if (current === undefined) return;
    options.push({
      aliases: current.aliases,
      value: current.value,
      description: current.description.join(" ").replace(/\s+/g, " ").trim(),
    });
    current = undefined;
  };
  for (const line of help.split("\n")) {
    if (/^-{1,2}[A-Za-z]/.test(line)) {
      finish();
      const sliced = line.length > 40 && line.slice(38, 40) === "  ";
      const text = sliced ? line.slice(0, 40) : line;
      const aliases = text
        .split(",")
        .map((piece) => piece.trim().split(/\s+/)[0] ?? "")
        .filter((word) => /^-{1,2}[A-Za-z0-9][A-Za-z0-9.-]*$/.test(word));
      if (aliases.length === 0) continue;
      const last = aliases[aliases.length - 1] ?? "";
      const value = text.slice(text.lastIndexOf(last) + last.length).trim();
      current = { aliases, value, description: sliced ? [line.slice(40)] : [] };
    } else if (current !== undefined && /^\s/.test(line)) {
      current.description.push(line);
    } else {
      finish();
    }
  }
  finish();
  return options;
}

/**
 * Alias groups of llama-server's `--help`: one array per option, its spellings in the order
 * printed; see {@link parseLlamaServerHelpOptions}.
 */
export function parseLlamaServerHelp(help: string): string[][] {
  return parseLlamaServerHelpOptions(help).map((o) => o.aliases);
}

// A value that names a file, directory, URL or repository (`--lora FNAME`, `-hf <user>/<model>`,
// `--video-ffmpeg-dir DIR`), or a description that says the value is one.
const FILE_VALUE = /FNAME|FILE|PATH|DIR\b|URL|<user>|<repo>|<model>/i;
const FILE_DESCRIPTION = /\b(files?|paths?|director(y|ies)|urls?|repository|repo)\b/i;

/**
 * True when llmgw must own a llama-server option going by its help text alone. This is the
 * rule {@link LLAMACPP_OWNED_OPTIONS} is checked against (a test runs it over the pinned build's
 * help), so a file, download or preset option a future build adds fails that test instead of
 * slipping through: an option whose value or description names a file, path, directory, URL or
 * repository (it reads or writes host files, or loads weights from outside `--model-root`), one
 * whose description says it downloads, and every `*-default` preset (each fetches a model).
 * Options that decide access or that llmgw sets are hand-listed on top of this.
 */
export function llamacppOptionMustBeOwned(
  option: Pick<LlamaServerHelpOption, "aliases" | "value" | "description">,
): boolean {
  if (option.aliases.some((a) => a.endsWith("-default")) || /download/i.test(option.description)) {
    return true;
  }
  // A switch ("--no-mmproj: whether to use multimodal projector file") names no file itself.
  if (option.value === "") return false;
  return FILE_VALUE.test(option.value) || FILE_DESCRIPTION.test(option.description);
}

/** Why llmgw owns a llama-server option. */
export type LlamacppOwnedReason =
  /** llmgw sets it from the deployment or node config. */
  | "set"
  /** It chooses the model or downloads something (a second way to pick what runs). */
  | "source"
  /** It decides who can reach the server or how (the router holds the only key). */
  | "access"
  /** It reads, writes or serves host files, or runs tools and programs. */
  | "host";

/**
 * Every llama-server option llmgw owns, as the pinned build's alias groups with the reason.
 * `extraArgs` may use none of these spellings.
 */
export const LLAMACPP_OWNED_OPTIONS: readonly {
  readonly aliases: readonly string[];
  readonly reason: LlamacppOwnedReason;
}[] = [
  { aliases: ["-m", "--model"], reason: "set" },
  { aliases: ["--host"], reason: "set" },
  { aliases: ["--port"], reason: "set" },
  { aliases: ["-a", "--alias"], reason: "set" },
  { aliases: ["-c", "--ctx-size"], reason: "set" },
  { aliases: ["-np", "--parallel"], reason: "set" },
  { aliases: ["-t", "--threads"], reason: "set" },
  { aliases: ["-ngl", "--gpu-layers", "--n-gpu-layers"], reason: "set" },
  { aliases: ["--metrics"], reason: "set" },
  { aliases: ["-mu", "--model-url"], reason: "source" },
  { aliases: ["-dr", "--docker-repo"], reason: "source" },
  { aliases: ["-hf", "-hfr", "--hf-repo"], reason: "source" },
  { aliases: ["-hff", "--hf-file"], reason: "source" },
  { aliases: ["-hft", "--hf-token"], reason: "source" },
  { aliases: ["--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"], reason: "source" },
  { aliases: ["--spec-draft-model", "-md", "--model-draft"], reason: "source" },
  { aliases: ["-mm", "--mmproj"], reason: "source" },
  { aliases: ["-mmu", "--mmproj-url"], reason: "source" },
  { aliases: ["--models-dir"], reason: "source" },
  { aliases: ["--models-preset"], reason: "source" },
  { aliases: ["--api-key"], reason: "access" },
  { aliases: ["--api-key-file"], reason: "access" },
  { aliases: ["--ssl-key-file"], reason: "access" },
  { aliases: ["--ssl-cert-file"], reason: "access" },
  { aliases: ["--reuse-port"], reason: "access" },
  { aliases: ["--api-prefix"], reason: "access" },
  { aliases: ["--path"], reason: "host" },
  { aliases: ["--media-path"], reason: "host" },
  { aliases: ["--slot-save-path"], reason: "host" },
  { aliases: ["--log-file"], reason: "host" },
  { aliases: ["--video-ffmpeg-dir"], reason: "host" },
  { aliases: ["--ui-config-file", "--webui-config-file"], reason: "host" },
  {
    aliases: ["--ui-mcp-proxy", "--webui-mcp-proxy", "--no-ui-mcp-proxy", "--no-webui-mcp-proxy"],
    reason: "host",
  },
  { aliases: ["--tools"], reason: "host" },
  { aliases: ["--tools-runtime"], reason: "host" },
  { aliases: ["--mcp-servers-config"], reason: "host" },
  { aliases: ["--mcp-servers-json"], reason: "host" },
  { aliases: ["-ag", "--agent", "-no-ag", "--no-agent"], reason: "host" },
  // Files read or written on the host: every user's prompts, lookup caches, templates,
  // grammars and schemas by path.
  { aliases: ["--log-prompts-dir"], reason: "host" },
  { aliases: ["-lcs", "--lookup-cache-static"], reason: "host" },
  { aliases: ["-lcd", "--lookup-cache-dynamic"], reason: "host" },
  { aliases: ["--chat-template-file"], reason: "host" },
  { aliases: ["--grammar-file"], reason: "host" },
  { aliases: ["-jf", "--json-schema-file"], reason: "host" },
  // Weights by path, outside --model-root's reach: adapters and control vectors.
  { aliases: ["--lora"], reason: "source" },
  { aliases: ["--lora-scaled"], reason: "source" },
  { aliases: ["--control-vector"], reason: "source" },
  { aliases: ["--control-vector-scaled"], reason: "source" },
  // Presets that pick (and download) a model of their own.
  { aliases: ["--embd-gemma-default"], reason: "source" },
  { aliases: ["--fim-qwen-1.5b-default"], reason: "source" },
  { aliases: ["--fim-qwen-3b-default"], reason: "source" },
  { aliases: ["--fim-qwen-7b-default"], reason: "source" },
  { aliases: ["--fim-qwen-7b-spec"], reason: "source" },
  { aliases: ["--fim-qwen-14b-spec"], reason: "source" },
  { aliases: ["--fim-qwen-30b-default"], reason: "source" },
  { aliases: ["--gpt-oss-20b-default"], reason: "source" },
  { aliases: ["--gpt-oss-120b-default"], reason: "source" },
  { aliases: ["--vision-gemma-4b-default"], reason: "source" },
  { aliases: ["--vision-gemma-12b-default"], reason: "source" },
  { aliases: ["--spec-default"], reason: "source" },
];

/** Spellings of {@link LLAMACPP_OWNED_OPTIONS} that start with `--`. */
export const LLAMACPP_OWNED_LONG = LLAMACPP_OWNED_OPTIONS.flatMap((o) =>
  o.aliases.filter((a) => a.startsWith("--")),
);
/** Single-dash spellings of {@link LLAMACPP_OWNED_OPTIONS} (`-hfr`, `-no-ag`). */
export const LLAMACPP_OWNED_SHORT = LLAMACPP_OWNED_OPTIONS.flatMap((o) =>
  o.aliases.filter((a) => !a.startsWith("--")),
);
