import { describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { command } from "./agent.js";

const io = {
  stdout: { write: () => true },
  stderr: { write: () => true },
  env: {},
  cwd: process.cwd(),
  signal: new AbortController().signal,
};

describe("llmgw agent flags", () => {
  it.each([["mlx5_0"], ["=rail-0"], ["mlx5_0="]])(
    "refuses --fabric-name %j like 'agent inventory' does, before starting",
    async (pair) => {
      const run = command.run(
        ["--control-plane", "http://127.0.0.1:1", "--join-token", "t", "--fabric-name", pair],
        io,
      );
      await expect(run).rejects.toBeInstanceOf(UsageError);
      await expect(run).rejects.toThrow(/--fabric-name expects DEV=ID/);
    },
  );
});
