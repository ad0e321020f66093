import { describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { quietIo } from "../testing.js";
import { command } from "./events.js";

describe("llmgw events --limit", () => {
  it.each(["1e3", "0x10", " 5 ", "2.5", "0", "100001", ""])(
    "refuses %j before calling anyone",
    async (limit) => {
      const run = command.run(["--limit", limit, "--token", "t"], quietIo());
      await expect(run).rejects.toBeInstanceOf(UsageError);
      await expect(command.run(["--limit", limit, "--token", "t"], quietIo())).rejects.toThrow(
        `--limit must be a whole number in 1–100000, got "${limit}"`,
      );
    },
  );
});
