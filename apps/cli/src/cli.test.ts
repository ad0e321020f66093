import { describe, expect, it } from "vitest";
import { runCli } from "./cli.js";
import { capturedIo } from "./testing.js";

describe("runCli", () => {
  it("names an unknown command by its words only, never the flags after them (a --token's value)", async () => {
    const io = capturedIo({});
    expect(await runCli(["nodez", "list", "--token", "s3cret-admin-token", "--json"], io)).toBe(2);
    expect(io.err()).toMatch(/^llmgw: unknown command "nodez list"\n/);
    expect(io.err()).not.toContain("s3cret");
    // Flags first: no command word at all.
    const flagsFirst = capturedIo({});
    expect(await runCli(["--token=s3cret-admin-token", "nodes"], flagsFirst)).toBe(2);
    expect(flagsFirst.err()).toMatch(
      /^llmgw: unknown command "" \(arguments start with a flag\)\n/,
    );
    expect(flagsFirst.err()).not.toContain("s3cret");
  });
});
