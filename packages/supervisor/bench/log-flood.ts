// Engine output flood: supervisor (O_APPEND log file, incremental tail, size cap) vs the naive
// baseline of piping the engine's stdout into the agent and keeping a line tail.
// Run: node --conditions=@llmgw/source --import tsx packages/supervisor/bench/log-flood.ts [MB]
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { createSupervisor, LogTail } from "@llmgw/supervisor";

const megabytes = Number(process.argv[2] ?? "100");
const engine = fileURLToPath(new URL("../test/fixtures/engine.mjs", import.meta.url));
const floodArgs = [engine, "--flood", String(megabytes * 1024 * 1024), "--exit-after", "0"];

interface Row {
  variant: string;
  seconds: number;
  rssPeakGrowthMiB: number;
  cpuSeconds: number;
  tailLines: number;
  diskBytes: number;
}

function sampler() {
  const before = process.memoryUsage().rss;
  const cpu = process.cpuUsage();
  let peak = before;
  const timer = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage().rss);
  }, 10);
  return () => {
    clearInterval(timer);
    peak = Math.max(peak, process.memoryUsage().rss);
    const used = process.cpuUsage(cpu);
    return { growth: (peak - before) / 2 ** 20, cpu: (used.user + used.system) / 1e6 };
  };
}

async function supervisorRun(dir: string): Promise<Row> {
  const supervisor = createSupervisor({
    stateDir: join(dir, "state"),
    logMaxFileBytes: 16 * 2 ** 20,
    logPollIntervalMs: 100,
  });
  const logFile = join(dir, "flood.log");
  const stop = sampler();
  const started = performance.now();
  const handle = await supervisor.launch("flood", {
    argv: [process.execPath, ...floodArgs],
    env: {},
    logFile,
  });
  await handle.exited;
  const tail = handle.tail();
  const seconds = (performance.now() - started) / 1000;
  const { growth, cpu } = stop();
  let disk = statSync(logFile).size;
  try {
    disk += statSync(`${logFile}.1`).size;
  } catch {}
  return {
    variant: "supervisor log file",
    seconds,
    rssPeakGrowthMiB: growth,
    cpuSeconds: cpu,
    tailLines: tail.length,
    diskBytes: disk,
  };
}

async function pipeRun(): Promise<Row> {
  const tail = new LogTail(200, 64 * 1024);
  const stop = sampler();
  const started = performance.now();
  const child = spawn(process.execPath, floodArgs, { stdio: ["ignore", "pipe", "inherit"] });
  child.stdout.setEncoding("utf8");
  child.stdout.on("data", (chunk: string) => tail.push(chunk));
  await new Promise((resolve) => child.once("close", resolve));
  const seconds = (performance.now() - started) / 1000;
  const { growth, cpu } = stop();
  return {
    variant: "baseline: pipe to agent",
    seconds,
    rssPeakGrowthMiB: growth,
    cpuSeconds: cpu,
    tailLines: tail.lines().length,
    diskBytes: 0,
  };
}

const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-"));
try {
  const rows = [await supervisorRun(dir), await pipeRun()];
  console.log(`engine output flood of ${megabytes} MiB`);
  console.table(
    rows.map((r) => ({
      variant: r.variant,
      "wall s": r.seconds.toFixed(2),
      "agent CPU s": r.cpuSeconds.toFixed(2),
      "agent RSS peak growth MiB": r.rssPeakGrowthMiB.toFixed(1),
      "tail lines": r.tailLines,
      "disk bytes kept": r.diskBytes,
    })),
  );
  console.log(JSON.stringify({ bench: "supervisor-log-flood", megabytes, rows }));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
