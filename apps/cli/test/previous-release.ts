/**
 * The `llmgw` CLI as an earlier commit built it, for mixed-version tests: the commit's tree
 * from git (`git archive`), its locked dependencies from pnpm's store (offline, no install
 * scripts: the agent needs no native module), its CLI bundle. Cached by commit under
 * `$LLMGW_CACHE_DIR/previous/` (default `~/.cache/llmgw`), so it is built once per machine.
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, renameSync, rmSync } from "node:fs";
import { homedir } from "node:os";
import path from "node:path";
import { repoRoot } from "./cluster-harness.js";

/** main before issue 19 (heartbeat streams, one control-plane URL). */
export const PREVIOUS_MAIN = "11b49abfbaf6d107585ae9c9193c7e09d6c6cc31";

/** Why the previous CLI cannot be built here, or undefined when it can. */
export function previousCliUnavailable(commit = PREVIOUS_MAIN): string | undefined {
  try {
    execFileSync("git", ["-C", repoRoot, "cat-file", "-e", `${commit}^{commit}`], {
      stdio: "ignore",
    });
  } catch {
    return `commit ${commit.slice(0, 7)} is not in this clone's history (a shallow clone?)`;
  }
  try {
    execFileSync("pnpm", ["--version"], { stdio: "ignore" });
  } catch {
    return "pnpm is not installed";
  }
  return undefined;
}

/** Path of the previous CLI's `dist/main.js`, building it first when not cached. */
export function previousCli(commit = PREVIOUS_MAIN): string {
  const cache =
    process.env.LLMGW_CACHE_DIR ??
    path.join(process.env.XDG_CACHE_HOME ?? path.join(homedir(), ".cache"), "llmgw");
  const dir = path.join(cache, "previous", commit);
  const main = path.join(dir, "apps", "cli", "dist", "main.js");
  if (existsSync(main)) return main;
  const building = `${dir}.building-${process.pid}`;
  rmSync(building, { recursive: true, force: true });
  mkdirSync(building, { recursive: true });
  const run = (cmd: string, args: string[], cwd: string) =>
    execFileSync(cmd, args, { cwd, stdio: ["ignore", "ignore", "pipe"], timeout: 300_000 });
  try {
    execFileSync(
      "bash",
      ["-c", `git -C "${repoRoot}" archive ${commit} | tar -x -C "${building}"`],
      { stdio: ["ignore", "ignore", "pipe"] },
    );
    run(
      "pnpm",
      ["install", "--offline", "--frozen-lockfile", "--ignore-scripts", "--reporter=silent"],
      building,
    );
    run("pnpm", ["exec", "tsup"], path.join(building, "apps", "cli"));
    rmSync(dir, { recursive: true, force: true });
    renameSync(building, dir);
  } catch (error) {
    rmSync(building, { recursive: true, force: true });
    const stderr = (error as { stderr?: Buffer }).stderr?.toString() ?? "";
    throw new Error(
      `cannot build llmgw at ${commit.slice(0, 7)}: ${(error as Error).message}\n${stderr}`,
    );
  }
  return main;
}
