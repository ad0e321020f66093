/**
 * Runs a benchmark script with `--quick` in a child process (as CI does) and returns its exit
 * code and output; the smoke tests assert completion and the printed table, never numbers.
 */
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";

/**
 * Exit code, stdout and stderr of `node --import tsx <script> --quick [...args]`, killed after
 * `timeoutMs`.
 */
export function runQuick(
  scriptUrl: URL,
  timeoutMs: number,
  args: readonly string[] = [],
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const proc = spawn(
    process.execPath,
    ["--conditions=@llmgw/source", "--import", "tsx", fileURLToPath(scriptUrl), "--quick", ...args],
    { stdio: ["ignore", "pipe", "pipe"], cwd: fileURLToPath(new URL("../..", import.meta.url)) },
  );
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (d: Buffer) => {
    stdout += d.toString();
  });
  proc.stderr.on("data", (d: Buffer) => {
    stderr += d.toString();
  });
  const timer = setTimeout(() => proc.kill("SIGKILL"), timeoutMs);
  return new Promise((resolve) =>
    proc.once("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    }),
  );
}

/** The JSON document a benchmark prints last (from the first line that is exactly `{`). */
export function lastJson<T>(stdout: string): T {
  const start = stdout.lastIndexOf("\n{\n");
  return JSON.parse(stdout.slice(start + 1)) as T;
}
