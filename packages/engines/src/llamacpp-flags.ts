/**
 * llama-server's options as alias groups, and the groups llmgw owns.
 *
 * llama.cpp gives one option several spellings (`-hf, -hfr, --hf-repo`), so owning
 * `--hf-repo` alone let `extraArgs: ["-hfr", "attacker/x"]` choose the model. The owned list
 * is therefore whole alias groups, copied from the pinned build's `--help`
 * (`packages/engines/test/fixtures/llama-server-help.txt`); a test parses that fixture with
 * {@link parseLlamaServerHelp} and fails when an owned group gained or lost a spelling, and an
 * integration test does the same against the live binary when it is built.
 */

/**
 * Alias groups of llama-server's `--help`: one array per option, its spellings in the order
 * printed (`["-hf", "-hfr", "--hf-repo"]`). Pure; section headers and description lines are
 * skipped. The option text is the first 40 columns of a line starting with `-` (descriptions
 * start at column 40) or the whole line when the option text is longer (the description then
 * starts on the next line); spellings are its comma-separated pieces' first words.
 */
export function parseLlamaServerHelp(help: string): string[][] {
  const groups: string[][] = [];
  for (const line of help.split("\n")) {
    if (!/^-{1,2}[A-Za-z]/.test(line)) continue;
    const options = line.length > 40 && line.slice(38, 40) === "  " ? line.slice(0, 40) : line;
    const aliases = options
      .split(",")
      .map((piece) => piece.trim().split(/\s+/)[0] ?? "")
      .filter((word) => /^-{1,2}[A-Za-z0-9][A-Za-z0-9-]*$/.test(word));
    if (aliases.length > 0) groups.push(aliases);
  }
  return groups;
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
];

/** Spellings of {@link LLAMACPP_OWNED_OPTIONS} that start with `--`. */
export const LLAMACPP_OWNED_LONG = LLAMACPP_OWNED_OPTIONS.flatMap((o) =>
  o.aliases.filter((a) => a.startsWith("--")),
);
/** Single-dash spellings of {@link LLAMACPP_OWNED_OPTIONS} (`-hfr`, `-no-ag`). */
export const LLAMACPP_OWNED_SHORT = LLAMACPP_OWNED_OPTIONS.flatMap((o) =>
  o.aliases.filter((a) => !a.startsWith("--")),
);
