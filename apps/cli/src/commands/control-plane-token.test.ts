import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { initDataDir } from "@llmgw/control-plane";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { UsageError } from "../command.js";
import { quietIo } from "../testing.js";
import { command } from "./control-plane-token.js";

let root: string;
beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), "llmgw-cp-token-"));
});
afterEach(() => rmSync(root, { recursive: true, force: true }));

async function run(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = "";
  let err = "";
  const code = await command.run(argv, {
    ...quietIo(),
    stdout: { write: (s: string) => (out += s) },
    stderr: { write: (s: string) => (err += s) },
  });
  return { code, out, err };
}

describe("llmgw control-plane token", () => {
  it.each<[string, string[], "joinToken" | "adminToken" | "routerToken"]>([
    ["join", [], "joinToken"],
    ["admin", ["--admin"], "adminToken"],
    ["router", ["--router"], "routerToken"],
  ])("prints the %s token", async (_kind, flags, field) => {
    const dir = initDataDir(join(root, "cp"));
    expect(await run([...flags, "--data-dir", dir.dir])).toEqual({
      code: 0,
      out: `${dir[field]}\n`,
      err: "",
    });
  });

  it("refuses --admin with --router, and explains a dir never started", async () => {
    await expect(run(["--admin", "--router", "--data-dir", root])).rejects.toThrow(
      new UsageError("--admin and --router name different tokens: give one of them"),
    );
    const missing = join(root, "never");
    expect(await run(["--router", "--data-dir", missing])).toEqual({
      code: 1,
      out: "",
      err: `llmgw control-plane token: no router token in ${missing}: start the control plane once with --data-dir ${missing} to create it\n`,
    });
  });
});
