// What a spec's environment and a planted file may not do to the supervisor: choose the
// program (PATH in the child's env) or redirect the log writes (a symlink where the log goes).
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { createSupervisor, isSupervisorError, type SupervisorError } from "@llmgw/supervisor";
import { afterEach, describe, expect, it } from "vitest";
import { tempDir, waitFor } from "./helpers.js";

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0)) cleanup();
});

function setup() {
  const { dir, cleanup } = tempDir("llmgw-sup-hostile-");
  cleanups.push(cleanup);
  const supervisor = (searchPath?: string) =>
    createSupervisor({
      stateDir: join(dir, "state"),
      logPollIntervalMs: 50,
      ...(searchPath === undefined ? {} : { searchPath }),
    });
  return { dir, supervisor };
}

/** An executable shell script `name` in `binDir` that prints `says` and writes `marker`. */
function fakeEngine(binDir: string, name: string, says: string, marker: string): void {
  mkdirSync(binDir, { recursive: true });
  const file = join(binDir, name);
  // Shell builtins only: the child runs with the spec's PATH.
  writeFileSync(file, `#!/bin/sh\necho "${says}"\n: > "${marker}"\n`);
  chmodSync(file, 0o755);
}

async function refusal(run: () => Promise<unknown>): Promise<SupervisorError> {
  try {
    await run();
  } catch (error) {
    if (isSupervisorError(error)) return error;
    throw error;
  }
  throw new Error("expected a SupervisorError");
}

describe("the executable comes from the supervisor's search path", () => {
  it("a spec whose env PATH holds a fake vllm still runs the vllm of the search path", async () => {
    const { dir, supervisor } = setup();
    const planted = join(dir, "planted-ran");
    const real = join(dir, "real-ran");
    fakeEngine(join(dir, "deployment-bin"), "vllm", "planted vllm", planted);
    fakeEngine(join(dir, "agent-bin"), "vllm", "agent's vllm", real);
    const handle = await supervisor(join(dir, "agent-bin")).launch("r", {
      argv: ["vllm", "serve", "m"],
      env: { PATH: join(dir, "deployment-bin") },
      logFile: join(dir, "logs", "r.log"),
    });
    await handle.exited;
    expect(handle.tail()).toContain("agent's vllm");
    expect(existsSync(real)).toBe(true);
    expect(existsSync(planted)).toBe(false);
  });

  it("a name missing from the search path is a spawn failure naming the path, not a lookup in env.PATH", async () => {
    const { dir, supervisor } = setup();
    fakeEngine(join(dir, "deployment-bin"), "vllm", "planted vllm", join(dir, "planted-ran"));
    const error = await refusal(() =>
      supervisor(join(dir, "agent-bin")).launch("r", {
        argv: ["vllm"],
        env: { PATH: join(dir, "deployment-bin") },
        logFile: join(dir, "logs", "r.log"),
      }),
    );
    expect(error.code).toBe("LLMGW_SUPERVISOR_SPAWN_FAILED");
    expect(error.message).toBe(
      `cannot find executable "vllm" on the supervisor's search path (${join(dir, "agent-bin")})`,
    );
    expect(existsSync(join(dir, "planted-ran"))).toBe(false);
  });
});

describe("log files are never written through a link", () => {
  it("a symlink planted at the log path is refused and its target is untouched", async () => {
    const { dir, supervisor } = setup();
    const target = join(dir, "precious");
    writeFileSync(target, "do not touch\n");
    const before = statSync(target);
    mkdirSync(join(dir, "logs"));
    symlinkSync(target, join(dir, "logs", "r.log"));
    const error = await refusal(() =>
      supervisor().launch("r", {
        argv: ["/bin/echo", "written"],
        env: {},
        logFile: join(dir, "logs", "r.log"),
      }),
    );
    expect(error.code).toBe("LLMGW_SUPERVISOR_UNSAFE_LOG_FILE");
    expect(error.message).toBe(
      `refusing log file ${join(dir, "logs", "r.log")}: it is a symbolic link, not a plain file`,
    );
    expect(readFileSync(target, "utf8")).toBe("do not touch\n");
    expect(statSync(target).mtimeMs).toBe(before.mtimeMs);
    expect(lstatSync(join(dir, "logs", "r.log")).isSymbolicLink()).toBe(true);
  });

  it("a log file created by the supervisor is a private plain file the engine writes", async () => {
    const { dir, supervisor } = setup();
    const handle = await supervisor().launch("r", {
      argv: ["/bin/echo", "written"],
      env: {},
      logFile: join(dir, "logs", "r.log"),
    });
    await handle.exited;
    await waitFor("the line", () => handle.tail().includes("written"));
    expect(statSync(join(dir, "logs", "r.log")).mode & 0o777).toBe(0o600);
  });
});
