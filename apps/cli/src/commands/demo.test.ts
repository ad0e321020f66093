import { describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { quietIo } from "../testing.js";
import { command } from "./demo.js";

const io = quietIo();

describe("llmgw demo flags", () => {
  it.each([
    [["--port", "http"], /--port must be a TCP port/],
    [["--control-port", "70000"], /--control-port must be a TCP port/],
    [["--timeout", "soon"], /--timeout must be a duration/],
  ])("refuses %j before starting anything", async (argv, message) => {
    const run = command.run(argv, io);
    await expect(run).rejects.toBeInstanceOf(UsageError);
    await expect(run).rejects.toThrow(message);
  });
});
