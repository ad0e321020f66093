import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { isAgentError } from "./errors.js";
import { prepareStateDir, STATE_SUBDIRS } from "./state-dir.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});
function tempDir(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-state-"));
  dirs.push(dir);
  return dir;
}
const mode = (p: string) => statSync(p).mode & 0o777;
const uid = process.getuid?.();

describe("prepareStateDir", () => {
  it("tightens a state dir and logs/ left 0777 to 0700", async () => {
    const stateDir = path.join(tempDir(), "agent");
    mkdirSync(path.join(stateDir, "logs"), { recursive: true });
    chmodSync(stateDir, 0o777);
    chmodSync(path.join(stateDir, "logs"), 0o777);
    await prepareStateDir(stateDir, uid);
    expect(mode(stateDir)).toBe(0o700);
    for (const sub of STATE_SUBDIRS) expect(mode(path.join(stateDir, sub)), sub).toBe(0o700);
  });

  it("creates a missing state dir and its subdirectories 0700", async () => {
    const stateDir = path.join(tempDir(), "a", "agent");
    await prepareStateDir(stateDir, uid);
    expect(mode(stateDir)).toBe(0o700);
    expect(mode(path.join(stateDir, "logs"))).toBe(0o700);
  });

  it("refuses a logs/ that is a symlink, and leaves its target alone", async () => {
    const base = tempDir();
    const stateDir = path.join(base, "agent");
    const elsewhere = path.join(base, "elsewhere");
    mkdirSync(stateDir);
    mkdirSync(elsewhere, { mode: 0o755 });
    chmodSync(elsewhere, 0o755);
    symlinkSync(elsewhere, path.join(stateDir, "logs"));
    await expect(prepareStateDir(stateDir, uid)).rejects.toThrow(
      `state directory ${path.join(stateDir, "logs")} is a symbolic link; refusing to use it`,
    );
    expect(mode(elsewhere)).toBe(0o755);
  });

  it("refuses a state dir owned by another user", async () => {
    const stateDir = tempDir();
    const other = (uid ?? 0) + 1;
    await expect(prepareStateDir(stateDir, other)).rejects.toThrow(
      `state directory ${stateDir} is owned by uid ${uid}, not the agent's uid ${other}; refusing to use it`,
    );
  });

  it.each([
    ["a logs/ that is a symlink", "symlink"],
    ["a state dir owned by another user", "owner"],
  ])("refuses %s with LLMGW_AGENT_STATE_DIR_UNSAFE", async (_, why) => {
    const base = tempDir();
    const stateDir = path.join(base, "agent");
    mkdirSync(stateDir);
    if (why === "symlink") symlinkSync(base, path.join(stateDir, "logs"));
    const error = await prepareStateDir(stateDir, why === "owner" ? (uid ?? 0) + 1 : uid).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isAgentError(error) && error.code).toBe("LLMGW_AGENT_STATE_DIR_UNSAFE");
  });
});
