import { describe, expect, it } from "vitest";
// Regenerate after a llama.cpp upgrade (scripts/build-llamacpp.sh builds the pinned release):
//   "$(scripts/build-llamacpp.sh | tail -1)" --help > packages/engines/test/fixtures/llama-server-help.txt
import help from "../test/fixtures/llama-server-help.txt?raw";
import { ownedFlagIn, parseDeploymentSpec } from "./deployment-spec.js";
import {
  LLAMACPP_OWNED_OPTIONS,
  llamacppOptionMustBeOwned,
  parseLlamaServerHelp,
  parseLlamaServerHelpOptions,
} from "./llamacpp-flags.js";

const groups = parseLlamaServerHelp(help);
const options = parseLlamaServerHelpOptions(help);

describe("parseLlamaServerHelp", () => {
  it.each([
    [["-h", "--help", "--usage"]],
    [["-hf", "-hfr", "--hf-repo"]],
    [["-dr", "--docker-repo"]],
    [["-ngl", "--gpu-layers", "--n-gpu-layers"]],
    [["-n", "--predict", "--n-predict"]],
    [["--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"]],
    [["--ui-mcp-proxy", "--webui-mcp-proxy", "--no-ui-mcp-proxy", "--no-webui-mcp-proxy"]],
    [["--lora-scaled"]],
    [["--tools"]],
    [["--fim-qwen-1.5b-default"]],
  ])("reads the alias group %j from the pinned build's help", (aliases) => {
    expect(groups).toContainEqual(aliases);
  });

  it("skips section headers and description lines", () => {
    expect(
      parseLlamaServerHelp(
        "----- common params -----\n\n-t,    --threads N     x\n  --not-an-option\n",
      ),
    ).toEqual([["-t", "--threads"]]);
    expect(groups.length).toBeGreaterThan(200);
  });
});

describe("parseLlamaServerHelpOptions", () => {
  it("reads each option's value placeholder and its description over the indented lines", () => {
    expect(options).toContainEqual({
      aliases: ["-hf", "-hfr", "--hf-repo"],
      value: "<user>/<model>[:quant]",
      description: expect.stringMatching(
        /^Hugging Face model repository;.*\(env: LLAMA_ARG_HF_REPO\)$/,
      ),
    });
    expect(options).toContainEqual({
      aliases: ["--log-prompts-dir"],
      value: "PATH",
      description: expect.stringContaining("Log prompts to directory"),
    });
    expect(options.find((o) => o.aliases.includes("--no-mmproj"))?.value).toBe("");
    expect(options.map((o) => o.aliases)).toEqual(groups);
  });
});

describe("llamacppOptionMustBeOwned", () => {
  it.each([
    ["a file value", { aliases: ["--x"], value: "FNAME", description: "" }, true],
    ["a repository value", { aliases: ["--x"], value: "<user>/<model>", description: "" }, true],
    [
      "a value described as a path",
      { aliases: ["--x"], value: "V", description: "path to it" },
      true,
    ],
    ["a download", { aliases: ["--x"], value: "", description: "can download weights" }, true],
    ["a preset", { aliases: ["--new-model-default"], value: "", description: "use it" }, true],
    ["a number", { aliases: ["--x"], value: "N", description: "number of threads" }, false],
    ["a switch about a file", { aliases: ["--x"], value: "", description: "use the file" }, false],
  ])("%s: %j → %s", (_what, option, expected) => {
    expect(llamacppOptionMustBeOwned(option)).toBe(expected);
  });
});

describe("LLAMACPP_OWNED_OPTIONS against the pinned llama-server --help", () => {
  it("each owned group is exactly one group of the help: no spelling missing, none stale", () => {
    for (const owned of LLAMACPP_OWNED_OPTIONS) {
      const inHelp = groups.find((g) => g.some((alias) => owned.aliases.includes(alias)));
      expect(inHelp, owned.aliases.join(", ")).toEqual(owned.aliases);
    }
  });

  it("every option that picks a model, a download, a key, a host file or a tool is owned", () => {
    const mustOwn =
      /^--(model|hf-|docker|mmproj(-url)?$|api-key|ssl-|host$|port$|path$|media-path|slot-save-path|log-file|tools|mcp-|agent$|models-dir|models-preset|video-ffmpeg-dir)/;
    for (const group of groups) {
      if (!group.some((alias) => mustOwn.test(alias))) continue;
      if (group.includes("--models-max") || group.includes("--models-autoload")) continue;
      expect(
        LLAMACPP_OWNED_OPTIONS.some((o) => o.aliases.join() === group.join()),
        group.join(", "),
      ).toBe(true);
    }
  });

  // The derived rule, so a pinned build that adds a file, download or preset option fails here
  // until the option is owned (or the rule is taught why it is harmless).
  it("every option whose value or description names a file, path, URL, repo, download or preset is owned", () => {
    const mustOwn = options.filter(llamacppOptionMustBeOwned);
    for (const aliases of [
      ["--log-prompts-dir"],
      ["-lcd", "--lookup-cache-dynamic"],
      ["--chat-template-file"],
      ["--grammar-file"],
      ["-jf", "--json-schema-file"],
      ["--lora"],
      ["--lora-scaled"],
      ["--control-vector"],
      ["--control-vector-scaled"],
      ["--gpt-oss-20b-default"],
      ["--fim-qwen-7b-spec"],
    ]) {
      expect(mustOwn.map((o) => o.aliases)).toContainEqual(aliases);
    }
    const unowned = mustOwn
      .filter(
        (o) => !LLAMACPP_OWNED_OPTIONS.some((owned) => owned.aliases.join() === o.aliases.join()),
      )
      .map((o) => `${o.aliases.join(", ")} ${o.value}`);
    expect(unowned).toEqual([]);
  });

  it.each(LLAMACPP_OWNED_OPTIONS.flatMap((o) => o.aliases))(
    "extraArgs %s is refused for llamacpp",
    (alias) => {
      expect(ownedFlagIn("llamacpp", alias)).toBe(alias);
      const parsed = parseDeploymentSpec({
        name: "m",
        model: "/models/m.gguf",
        engine: "llamacpp",
        extraArgs: [alias, "attacker/x"],
      });
      expect(parsed.ok).toBe(false);
    },
  );

  it("free llama-server options stay usable", () => {
    for (const arg of [
      "-fa",
      "--flash-attn",
      "-ctk",
      "--lora-init-without-apply",
      "--grammar",
      "--chat-template",
      "-b",
      "--models-max",
      "--no-mmproj",
    ]) {
      expect(ownedFlagIn("llamacpp", arg), arg).toBeUndefined();
    }
  });
});
