import { statSync } from "node:fs";
import { createSupervisor } from "@llmgw/supervisor";
import { afterEach, describe, expect, it } from "vitest";
import { engineSpec, tempDir, waitFor } from "./helpers.js";

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0)) cleanup();
});

describe("output flood", () => {
  it("100 MB of output keeps memory flat, the tail bounded and the log file capped", async () => {
    const { dir, cleanup } = tempDir("llmgw-flood-");
    cleanups.push(cleanup);
    const maxFileBytes = 1024 * 1024;
    const supervisor = createSupervisor({
      stateDir: `${dir}/state`,
      logMaxFileBytes: maxFileBytes,
      tailMaxLines: 100,
      tailMaxBytes: 16 * 1024,
      logPollIntervalMs: 20,
    });
    const spec = engineSpec(dir, "flood", [
      "--flood",
      String(100 * 1024 * 1024),
      // The engine's last line comes 200 ms after the flood, as a crash report would. Written
      // in the same instant as the flood's end, it can fall into the documented rotation race
      // (README: truncating under a writer that never pauses can drop that instant's bytes),
      // which made this test fail about once in ten full-suite runs on a loaded machine.
      "--exit-after",
      "200",
    ]);
    global.gc?.();
    const rssBefore = process.memoryUsage().rss;
    let rssPeak = rssBefore;
    const handle = await supervisor.launch("flood", spec);
    cleanups.push(() => {
      try {
        process.kill(-handle.pgid, "SIGKILL");
      } catch {}
    });
    await waitFor(
      "flood to finish",
      () => {
        rssPeak = Math.max(rssPeak, process.memoryUsage().rss);
        return handle.exit() !== undefined;
      },
      45_000,
    );
    const tail = handle.tail();

    expect(rssPeak - rssBefore).toBeLessThan(64 * 1024 * 1024);
    expect(tail.length).toBeLessThanOrEqual(100);
    expect(Buffer.byteLength(tail.join("\n"))).toBeLessThanOrEqual(16 * 1024 + 100);
    expect(tail.at(-1)).toBe("engine exiting with 0");
    expect(statSync(spec.logFile).size).toBeLessThanOrEqual(maxFileBytes);
    expect(statSync(`${spec.logFile}.1`).size).toBeLessThanOrEqual(maxFileBytes);
  }, 60_000);
});
