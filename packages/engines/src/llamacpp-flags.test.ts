import { describe, expect, it } from "vitest";
// Regenerate after a llama.cpp upgrade (scripts/build-llamacpp.sh builds the pinned release):
//   "$(scripts/build-llamacpp.sh | tail -1)" --help > packages/engines/test/fixtures/llama-server-help.txt
import help from "../test/fixtures/llama-server-help.txt?raw";
import { ownedFlagIn, parseDeploymentSpec } from "./deployment-spec.js";
import { LLAMACPP_OWNED_OPTIONS, parseLlamaServerHelp } from "./llamacpp-flags.js";

const groups = parseLlamaServerHelp(help);

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
      "--lora",
      "-b",
      "--models-max",
      "--no-mmproj",
    ]) {
      expect(ownedFlagIn("llamacpp", arg), arg).toBeUndefined();
    }
  });
});
