// The owned llama-server option groups (`@llmgw/engines`) were copied from the pinned build's
// --help; this checks them, and the committed fixture, against the binary the agent would run.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { findLlamaServer } from "@llmgw/engine-sim";
import { LLAMACPP_OWNED_OPTIONS, parseLlamaServerHelp } from "@llmgw/engines";
import { describe, expect, it } from "vitest";

const binary = findLlamaServer();
const FIXTURE = fileURLToPath(
  new URL("../../../packages/engines/test/fixtures/llama-server-help.txt", import.meta.url),
);

describe.skipIf(binary === undefined)("the pinned llama-server's --help", () => {
  const live = binary === undefined ? "" : execFileSync(binary, ["--help"], { encoding: "utf8" });

  it("still lists every owned option with exactly the owned spellings", () => {
    const groups = parseLlamaServerHelp(live);
    for (const owned of LLAMACPP_OWNED_OPTIONS) {
      const inHelp = groups.find((g) => g.some((alias) => owned.aliases.includes(alias)));
      expect(inHelp, owned.aliases.join(", ")).toEqual(owned.aliases);
    }
  });

  it("is the committed fixture (regenerate it with `llama-server --help > …/llama-server-help.txt`)", () => {
    expect(live).toBe(readFileSync(FIXTURE, "utf8"));
  });
});
