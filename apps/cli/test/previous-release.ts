/**
 * The `llmgw` CLI as an earlier commit built it, for mixed-version tests: the commit's tree
 * from git (`git archive`), its locked dependencies from pnpm's store (offline, no install
 * scripts: the agent needs no native module), its CLI bundle. Cached by commit under
 * `$LLMGW_CACHE_DIR/previous/` (default `~/.cache/llmgw`), so it is built once per machine.
 */
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, readdirSync, renameSync, rmSync } from "node:fs";
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

/**
 * The previous tree installs without running install scripts, so it has no compiled
 * better-sqlite3: its control plane borrows this checkout's build when both lock the same
 * version (a native module depends on the Node.js ABI and the package version only).
 * Returns why it cannot, or undefined once the previous tree has one.
 */
function borrowSqlite(previousDir: string): string | undefined {
  const pnpmDir = (root: string) => path.join(root, "node_modules", ".pnpm");
  const versions = (root: string) =>
    existsSync(pnpmDir(root))
      ? readdirSync(pnpmDir(root)).filter((d) => d.startsWith("better-sqlite3@"))
      : [];
  const ours = versions(repoRoot)[0];
  const theirs = versions(previousDir)[0];
  if (ours === undefined || theirs === undefined) return "no better-sqlite3 in one of the trees";
  if (ours !== theirs) return `better-sqlite3 differs (${ours} here, ${theirs} there)`;
  const addon = (root: string) =>
    path.join(
      pnpmDir(root),
      ours,
      "node_modules",
      "better-sqlite3",
      "build",
      "Release",
      "better_sqlite3.node",
    );
  if (existsSync(addon(previousDir))) return undefined;
  if (!existsSync(addon(repoRoot))) return "this checkout's better-sqlite3 is not built";
  mkdirSync(path.dirname(addon(previousDir)), { recursive: true });
  copyFileSync(addon(repoRoot), addon(previousDir));
  return undefined;
}

/**
 * Path of the previous CLI's `dist/main.js` with what its control plane needs to open a store,
 * or the reason it has not (its agent still runs).
 */
export function previousControlPlane(commit = PREVIOUS_MAIN): {
  main: string;
  unavailable?: string;
} {
  const main = previousCli(commit);
  const unavailable = borrowSqlite(path.resolve(path.dirname(main), "..", "..", ".."));
  return unavailable === undefined ? { main } : { main, unavailable };
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
