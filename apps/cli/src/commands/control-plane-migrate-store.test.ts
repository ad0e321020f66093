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
    [
      ["--from", "sqlite:/d", "--to", "postgres://u:s3cret@db/x"],
      "--to holds a password, which every user of this host can read in the process list: put the URL in --to-file FILE",
    ],
    [["--from", "sqlite:/d", "--to", "x", "--to-file", "/f"], "give --to or --to-file, not both"],
    [
      ["--from", "sqlite:/d", "--to-file", "/nonexistent/url"],
      "cannot read --to-file /nonexistent/url",
    ],
  ])("%j → %s", async (argv, message) => {
    const run = command.run(argv, quietIo());
    await expect(run).rejects.toBeInstanceOf(UsageError);
    await expect(command.run(argv, quietIo())).rejects.toThrow(message);
    await expect(command.run(argv, quietIo())).rejects.not.toThrow("s3cret");
  });
});
