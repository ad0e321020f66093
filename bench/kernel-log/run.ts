// The kernel-log watcher's CPU on a node that logs 1,000 unrelated kernel lines per second
// (issue 20: goal < 1% of one core).
//
// A writer (this process) appends real, non-Xid kernel lines (cycled from
// shared/reference/health-formats.md §1.1 and §1.3, verbatim) to a regular file or a FIFO at
// --rate lines per second for --seconds, while a child process runs only `watchKernelLog` on
// it with the defaults an operator gets (poll 200 ms). The child's own process.cpuUsage()
// over the window, as % of one core, is compared with the same child idle (same imports, no
// watcher; for a FIFO this process drains the pipe instead) over an identical window. Median
// of --rounds rounds per source.
//
// Run: node --conditions=@llmgw/source --import tsx bench/kernel-log/run.ts
//   [--seconds 10] [--rounds 3] [--rate 1000] [--warmup 3] [--sources file,fifo] [--quick]
// or:  pnpm --filter @llmgw/bench kernel-log
import { type ChildProcess, fork, spawnSync } from "node:child_process";
import {
  closeSync,
  constants,
  mkdtempSync,
  openSync,
  readSync,
  rmSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { type KernelLogWatcher, watchKernelLog } from "@llmgw/discovery";
import { loadAverage } from "../lib/children.js";
import { printReport } from "../lib/report.js";
import { formatTable, quantile } from "../lib/table.js";

// Verbatim from health-formats.md: §1.1 (KDOC example, GPUD kmsg.1.log, front-end samples) and
// the non-Xid NVRM lines of §1.3 (they pass the watcher's cheap "NVRM" gate, the costlier path).
const LINES = [
  "7,160,424069,-;pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)",
  " SUBSYSTEM=acpi",
  " DEVICE=+acpi:PNP0A03:00",
  "6,339,5140900,-;NET: Registered protocol family 10",
  "6,3964,206764307,-;nvidia-nvswitch2: open (major=510)",
  "6,3973,227986636,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
  "[Sun Feb 23 16:24:18 2025] NVRM: GPU Board Serial Number: 1650124014249",
  "Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT",
  "NVRM: GPU at PCI:0000:06:00: GPU-0b6b7808-c002-f593-ac86-cd8e57757b94",
  "NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.",
  "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
];

type Source = "file" | "fifo";
type Role = "watcher" | "idle";

interface CpuMark {
  readonly cpuUs: number;
  readonly wallUs: number;
}
interface ChildReport extends CpuMark {
  readonly records?: number;
  readonly faults?: number;
}

// ---- child ------------------------------------------------------------------------------

function runChild(role: Role, path: string): void {
  let watcher: KernelLogWatcher | undefined;
  const mark = (): CpuMark => {
    const cpu = process.cpuUsage();
    return { cpuUs: cpu.user + cpu.system, wallUs: Number(process.hrtime.bigint() / 1000n) };
  };
  process.on("message", (message: { type: string }) => {
    if (message.type === "mark") process.send?.(mark());
    if (message.type === "report") {
      const stats = watcher?.stats();
      const report: ChildReport = {
        ...mark(),
        ...(stats ? { records: stats.records, faults: watcher!.faults().length } : {}),
      };
      process.send?.(report, () => {
        void watcher?.close().then(() => process.exit(0));
        if (!watcher) process.exit(0);
      });
    }
  });
  if (role === "idle") {
    process.send?.({ type: "ready" });
    return;
  }
  // The operator's defaults: only the path differs from the agent's watcher.
  watcher = watchKernelLog({ path });
  void watcher.caughtUp.then(() => process.send?.({ type: "ready" }));
}

// ---- parent -----------------------------------------------------------------------------

function request<T>(child: ChildProcess, type: string): Promise<T> {
  return new Promise((resolve) => {
    child.once("message", (m) => resolve(m as T));
    child.send({ type });
  });
}

function waitReady(child: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    child.once("message", () => resolve());
    child.once("exit", (code) => reject(new Error(`child exited (${code}) before it was ready`)));
  });
}

interface RoundResult {
  readonly source: Source;
  readonly role: Role;
  readonly cpuPercent: number;
  readonly linesWritten: number;
  readonly linesDropped: number;
  readonly records?: number;
  readonly faults?: number;
}

async function round(
  source: Source,
  role: Role,
  seconds: number,
  rate: number,
  warmupS: number,
): Promise<RoundResult> {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-kernel-log-"));
  const path = join(dir, source === "file" ? "kern.log" : "kmsg.fifo");
  let drain: number | undefined;
  try {
    if (source === "file") writeFileSync(path, "");
    else if (spawnSync("mkfifo", [path]).status !== 0) throw new Error("mkfifo failed");
    // The idle child reads nothing; for a FIFO someone must, or the writer stalls.
    if (source === "fifo" && role === "idle") {
      drain = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
    }
    const child = fork(process.argv[1]!, ["--child", role, "--path", path], {
      execArgv: process.execArgv,
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    await waitReady(child);
    // Past the child's start-up work (module compilation, V8's first idle-time GC), which
    // both roles pay and would otherwise dominate the idle baseline.
    await new Promise((r) => setTimeout(r, warmupS * 1000));
    const out = openSync(
      path,
      source === "file"
        ? constants.O_WRONLY | constants.O_APPEND
        : constants.O_WRONLY | constants.O_NONBLOCK,
    );
    const scratch = Buffer.alloc(64 * 1024);
    const start = await request<CpuMark>(child, "mark");
    const startedAt = performance.now();
    let written = 0;
    let dropped = 0;
    let next = 0;
    await new Promise<void>((resolve) => {
      const timer = setInterval(() => {
        const elapsedS = (performance.now() - startedAt) / 1000;
        const due = Math.min(Math.floor(elapsedS * rate), Math.floor(seconds * rate));
        if (due > written) {
          const batch: string[] = [];
          for (let i = written; i < due; i++) batch.push(LINES[next++ % LINES.length]!);
          try {
            writeSync(out, `${batch.join("\n")}\n`);
          } catch {
            dropped += batch.length; // FIFO full (EAGAIN): the reader fell behind
          }
          written = due;
        }
        if (drain !== undefined) {
          try {
            while (readSync(drain, scratch, 0, scratch.length, null) > 0) {}
          } catch {
            // EAGAIN: drained
          }
        }
        if (elapsedS >= seconds) {
          clearInterval(timer);
          resolve();
        }
      }, 10);
    });
    // Let the watcher's next poll pick up the tail before the window closes.
    await new Promise((r) => setTimeout(r, 400));
    const end = await request<ChildReport>(child, "report");
    closeSync(out);
    await new Promise((r) => child.once("exit", r));
    const cpuPercent = ((end.cpuUs - start.cpuUs) / (end.wallUs - start.wallUs)) * 100;
    return {
      source,
      role,
      cpuPercent,
      linesWritten: written,
      linesDropped: dropped,
      ...(end.records === undefined ? {} : { records: end.records }),
      ...(end.faults === undefined ? {} : { faults: end.faults }),
    };
  } finally {
    if (drain !== undefined) closeSync(drain);
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      child: { type: "string" },
      path: { type: "string" },
      seconds: { type: "string" },
      rounds: { type: "string" },
      rate: { type: "string" },
      warmup: { type: "string" },
      sources: { type: "string" },
      quick: { type: "boolean" },
    },
  });
  if (values.child !== undefined) {
    runChild(values.child as Role, values.path!);
    return;
  }
  const quick = values.quick === true;
  const seconds = Number(values.seconds ?? (quick ? 2 : 10));
  const rounds = Number(values.rounds ?? (quick ? 1 : 3));
  const rate = Number(values.rate ?? 1000);
  const warmupS = Number(values.warmup ?? (quick ? 0 : 3));
  const sources = (values.sources ?? "file,fifo").split(",") as Source[];
  const load = loadAverage();
  const results: RoundResult[] = [];
  for (const source of sources) {
    for (let r = 0; r < rounds; r++) {
      // Idle and watcher back to back, so both see the same machine.
      for (const role of ["idle", "watcher"] as const) {
        const result = await round(source, role, seconds, rate, warmupS);
        results.push(result);
        console.error(
          `${source} round ${r + 1} ${role}: ${result.cpuPercent.toFixed(3)}% of a core` +
            (result.records === undefined ? "" : ` (${result.records} records read)`),
        );
      }
    }
  }
  const median = (source: Source, role: Role) =>
    quantile(
      results.filter((x) => x.source === source && x.role === role).map((x) => x.cpuPercent),
      0.5,
    ) ?? Number.NaN;
  const rows = sources.map((source) => {
    const watcher = median(source, "watcher");
    const idle = median(source, "idle");
    const runs = results.filter((x) => x.source === source && x.role === "watcher");
    return {
      source,
      watcher,
      idle,
      net: watcher - idle,
      records: runs.map((x) => x.records ?? 0),
      written: runs.map((x) => x.linesWritten),
      dropped: runs.reduce((a, x) => a + x.linesDropped, 0),
      faults: runs.reduce((a, x) => a + (x.faults ?? 0), 0),
    };
  });
  const table = formatTable(
    [
      "source",
      "lines/s",
      "watcher %core",
      "idle %core",
      "net %core",
      "records read / written",
      "faults",
    ],
    rows.map((r) => [
      r.source,
      rate,
      r.watcher.toFixed(3),
      r.idle.toFixed(3),
      r.net.toFixed(3),
      r.records.map((n, i) => `${n}/${r.written[i]}`).join(" "),
      r.faults,
    ]),
  );
  const goals = rows.map((r) => ({
    goal: `${r.source}: watcher CPU at ${rate} unrelated lines/s < 1% of a core (median of ${rounds})`,
    measured: `${r.net.toFixed(3)}% net (${r.watcher.toFixed(3)}% − idle ${r.idle.toFixed(3)}%)`,
    met: r.net < 1 && r.faults === 0,
  }));
  printReport("kernel-log", table, goals, {
    rate,
    seconds,
    rounds,
    warmupS,
    loadAverage: load,
    rows,
    results,
  });
}

void main();
