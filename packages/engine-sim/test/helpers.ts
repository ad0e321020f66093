import { type ChildProcess, spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

const BIN = fileURLToPath(new URL("./fixtures/engine-sim-bin.ts", import.meta.url));
const REPO = fileURLToPath(new URL("../../..", import.meta.url));

/** A port free a moment ago, from below the ephemeral range (see the supervisor's `freePort`). */
export { freePort } from "@llmgw/supervisor";

/** A simulated engine running as its own process (like `llmgw engine-sim`). */
export interface SimProcess {
  readonly child: ChildProcess;
  output(): string;
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<void>;
  readonly exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): void;
}

/** Spawns the engine-sim bin through tsx with `args` (and `env` on top of ours); kill it in `afterEach`. */
export function spawnSim(args: readonly string[], env: Record<string, string> = {}): SimProcess {
  const child = spawn(
    process.execPath,
    ["--conditions=@llmgw/source", "--import", "tsx", BIN, ...args],
    {
      cwd: REPO,
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let out = "";
  const waiters = new Set<() => void>();
  const onData = (d: Buffer): void => {
    out += d.toString("utf8");
    for (const w of waiters) w();
  };
  child.stdout?.on("data", onData);
  child.stderr?.on("data", onData);
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once("exit", (code, signal) => resolve({ code, signal }));
  });
  return {
    child,
    exit,
    output: () => out,
    kill: (signal = "SIGKILL") => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    },
    waitFor: (pattern, timeoutMs = 20_000) =>
      new Promise<void>((resolve, reject) => {
        const check = (): void => {
          if (pattern.test(out)) {
            waiters.delete(check);
            clearTimeout(timer);
            resolve();
          }
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(new Error(`timed out waiting for ${pattern} in:\n${out}`));
        }, timeoutMs);
        waiters.add(check);
        check();
        void exit.then(() => {
          if (!pattern.test(out)) {
            waiters.delete(check);
            clearTimeout(timer);
            reject(new Error(`process exited before ${pattern} appeared:\n${out}`));
          }
        });
      }),
  };
}

/** `fetch` that reports a refused connection as `"refused"` instead of throwing. */
export async function probe(url: string): Promise<number | "refused"> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(5000) });
    await res.arrayBuffer();
    return res.status;
  } catch {
    return "refused";
  }
}

/** Polls `check` every 50 ms until it returns true or `timeoutMs` passes. */
export async function eventually(check: () => Promise<boolean>, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`condition not met within ${timeoutMs} ms`);
}
