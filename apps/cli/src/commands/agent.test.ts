import { describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { quietIo } from "../testing.js";
import { command } from "./agent.js";

const io = quietIo();

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
