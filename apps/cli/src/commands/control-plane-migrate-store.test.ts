import { describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { quietIo } from "../testing.js";
import { command } from "./control-plane-migrate-store.js";

describe("llmgw control-plane migrate-store usage", () => {
  it.each([
    [[], "--from sqlite:DIR is required"],
    [["--from", "/var/lib/llmgw"], "--from sqlite:DIR is required"],
    [["--from", "sqlite:"], "--from sqlite:DIR is required"],
    [["--from", "sqlite:/d"], "a postgres:// target is required"],
    [["--from", "sqlite:/d", "--to", "sqlite:"], "a postgres:// target is required"],
    [["--from", "sqlite:/d", "--to", "postgres://u:s3cret@db/x"], "process list"],
  ])("%j → %s", async (argv, message) => {
    const run = command.run(argv, quietIo());
    await expect(run).rejects.toBeInstanceOf(UsageError);
    await expect(command.run(argv, quietIo())).rejects.toThrow(message);
    await expect(command.run(argv, quietIo())).rejects.not.toThrow("s3cret");
  });
});
