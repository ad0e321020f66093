// `llmgw … --json | head`: the reader closes the pipe after one line; llmgw must exit 0
// without a stack trace instead of dying on EPIPE.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const MAIN = fileURLToPath(new URL("../src/main.ts", import.meta.url));

describe("stdout closed by the reader", () => {
  it("exits 0 quietly when the reader closes the pipe after the first line", async () => {
    // ~570 KB of JSON: far more than a pipe buffer, so llmgw is still writing when we close.
    const child = spawn(
      process.execPath,
      [
        "--conditions=@llmgw/source",
        "--import",
        "tsx",
        MAIN,
        "agent",
        "inventory",
        "--simulate",
        "1024xh100-80g",
        "--json",
      ],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
      stderr += chunk;
    });
    const exited = new Promise<number | null>((resolve) =>
      child.once("exit", (code) => resolve(code)),
    );
    const lines = createInterface({ input: child.stdout });
    const first = await new Promise<string>((resolve) => lines.once("line", resolve));
    lines.close();
    child.stdout.destroy();
    expect(first).toBe("{");
    expect(await exited).toBe(0);
    expect(stderr).toBe("");
  }, 30_000);
});
