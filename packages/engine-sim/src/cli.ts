import { startEngineSim } from "./engine-sim.js";
import { isEngineSimError } from "./errors.js";
import { ENGINE_SIM_USAGE, parseEngineSimArgv } from "./options.js";

/** The variable the simulated engine's API key is read from (as the agent hands it over). */
export const ENGINE_SIM_API_KEY_ENV = "LLMGW_ENGINE_API_KEY";

/** Streams a command-line front end writes to, plus the signal that stops it. */
export interface EngineSimCliIo {
  readonly stdout: { write(chunk: string): unknown };
  readonly stderr: { write(chunk: string): unknown };
  /** Aborting it closes the engine gracefully (exit 0). */
  readonly signal: AbortSignal;
  /** The process environment; {@link ENGINE_SIM_API_KEY_ENV} sets `apiKey`. Default: none. */
  readonly env?: Readonly<Record<string, string | undefined>>;
}

/**
 * Runs `engine-sim` with command-line flags until `io.signal` aborts or the engine fails.
 * Returns the process exit code: 0 after a graceful stop, 1 when the engine failed (load
 * fault, lost rank, crash fault), 2 for bad flags. Log lines go to stdout like a real engine's.
 */
export async function runEngineSimCli(
  argv: readonly string[],
  io: EngineSimCliIo,
): Promise<number> {
  let parsed: ReturnType<typeof parseEngineSimArgv>;
  const apiKey = io.env?.[ENGINE_SIM_API_KEY_ENV] || undefined;
  try {
    parsed = parseEngineSimArgv(argv, apiKey === undefined ? {} : { apiKey });
  } catch (error) {
    if (!isEngineSimError(error)) throw error;
    io.stderr.write(`engine-sim: ${error.message}\n\n${ENGINE_SIM_USAGE}`);
    return 2;
  }
  if (parsed.help) {
    io.stdout.write(ENGINE_SIM_USAGE);
    return 0;
  }
  // A stop request must work while "loading" too (real engines exit promptly on SIGTERM
  // during load), so race the start against the signal instead of awaiting it first.
  const stopRequested = new Promise<"stop">((resolve) => {
    if (io.signal.aborted) resolve("stop");
    io.signal.addEventListener("abort", () => resolve("stop"), { once: true });
  });
  const starting = startEngineSim({
    ...parsed.options,
    log: (line) => io.stdout.write(`${line}\n`),
  });
  let sim: Awaited<ReturnType<typeof startEngineSim>>;
  try {
    const first = await Promise.race([starting, stopRequested]);
    if (first === "stop") {
      io.stdout.write("engine-sim: stop requested while loading; exiting\n");
      starting.then((s) => s.close()).catch(() => {});
      return 0;
    }
    sim = first;
  } catch (error) {
    io.stderr.write(`engine-sim: ${error instanceof Error ? error.message : String(error)}\n`);
    return 1;
  }
  const onAbort = (): void => {
    void sim.close();
  };
  if (io.signal.aborted) onAbort();
  io.signal.addEventListener("abort", onAbort, { once: true });
  const report = await sim.exited;
  io.signal.removeEventListener("abort", onAbort);
  return report.exitCode;
}
