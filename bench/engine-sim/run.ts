// How many concurrent streams one engine-sim process sustains at realistic token rates, and at
// what CPU cost. Starts the sim as its own process (real time, --time-scale 1, default 8B/H100
// timing), opens N concurrent streaming chat completions (ignore_eos, fixed length), and
// measures over a steady window: tokens/s the sim produced (its /sim/stats counter) and the
// client received, vs the timing model's ideal
// (N / decode-step), client-observed inter-chunk gap vs the model's step time, and the sim
// process's CPU from /proc/<pid>/stat (utime + stime). Prints a table and then JSON.
//
//   npx tsx bench/engine-sim/run.ts [--levels 50,100,200,400,800] [--window-s 5]
import { spawn } from "node:child_process";
import { request } from "node:http";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { freePort, processTreeCpuUs } from "../lib/children.js";
import { formatTable } from "../lib/table.js";

const { values } = parseArgs({
  options: {
    levels: { type: "string", default: "50,100,200,400,800" },
    "window-s": { type: "string", default: "5" },
  },
});
const levels = values.levels.split(",").map(Number);
const windowMs = Number(values["window-s"]) * 1000;
const DECODE_MS = 12;
const PER_SEQ_MS = 0.14;

interface LevelResult {
  streams: number;
  idealTokensPerS: number;
  /** Tokens the sim produced (its own counter), independent of how fast the client reads. */
  simTokensPerS: number;
  /** Chunks the benchmark client received. */
  tokensPerS: number;
  modelStepMs: number;
  meanGapMs: number;
  simCpuPercent: number;
  simCpuMsPerKTokens: number;
  rssMiB: number;
}

async function runLevel(streams: number): Promise<LevelResult> {
  const port = await freePort();
  const sim = spawn(
    process.execPath,
    [
      "--conditions=@llmgw/source",
      "--import",
      "tsx",
      fileURLToPath(new URL("./sim-process.ts", import.meta.url)),
      "--model",
      "bench",
      "--port",
      String(port),
      "--max-num-seqs",
      String(Math.max(256, streams)),
      "--max-num-batched-tokens",
      String(Math.max(8192, streams * 2)),
    ],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  await new Promise<void>((resolve, reject) => {
    let out = "";
    sim.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      if (out.includes("Application startup complete")) resolve();
    });
    sim.once("exit", (code) => reject(new Error(`engine-sim exited with ${code}:\n${out}`)));
  });
  const agent = new (await import("node:http")).Agent({ keepAlive: true, maxSockets: streams + 8 });
  let chunks = 0;
  let stop = false;
  const body = JSON.stringify({
    model: "bench",
    messages: [{ role: "user", content: "benchmark ".repeat(50) }],
    max_tokens: 4000,
    ignore_eos: true,
    stream: true,
  });
  const reqs_: ReturnType<typeof request>[] = [];
  const reqs = Array.from(
    { length: streams },
    () =>
      new Promise<void>((resolve) => {
        const req = request(
          {
            host: "127.0.0.1",
            port,
            path: "/v1/chat/completions",
            method: "POST",
            agent,
            headers: { "content-type": "application/json" },
          },
          (res) => {
            res.on("data", (d: Buffer) => {
              if (stop) return;
              let i = d.indexOf("data: ");
              while (i >= 0) {
                chunks += 1;
                i = d.indexOf("data: ", i + 6);
              }
            });
            res.on("close", resolve);
            res.on("error", () => resolve());
          },
        );
        req.on("error", () => resolve());
        req.end(body);
        reqs_.push(req);
      }),
  );
  // Warm up (all streams admitted and decoding), then measure a steady window.
  await new Promise((r) => setTimeout(r, 1500));
  const simStats = async () =>
    (await (await fetch(`http://127.0.0.1:${port}/sim/stats`)).json()) as {
      rssBytes: number;
      timing: { generationTokens: number };
    };
  const g0 = (await simStats()).timing.generationTokens;
  const c0 = chunks;
  const t0 = performance.now();
  const simCpuUs = (): number => {
    const us = processTreeCpuUs(sim.pid);
    if (us === undefined) throw new Error("engine-sim exited during the measurement");
    return us;
  };
  const cpu0 = simCpuUs();
  await new Promise((r) => setTimeout(r, windowMs));
  const c1 = chunks;
  const t1 = performance.now();
  const cpu1 = simCpuUs();
  const stats = await simStats();
  const g1 = stats.timing.generationTokens;
  stop = true;
  for (const r of reqs_) r.destroy();
  sim.kill("SIGTERM");
  await Promise.all(reqs);
  await new Promise((r) => sim.once("exit", r));
  agent.destroy();
  const elapsedS = (t1 - t0) / 1000;
  const tokensPerS = (c1 - c0) / elapsedS;
  const simTokensPerS = (g1 - g0) / elapsedS;
  const modelStepMs = DECODE_MS + PER_SEQ_MS * (streams - 1);
  const cpuS = (cpu1 - cpu0) / 1e6;
  return {
    streams,
    idealTokensPerS: Math.round((streams * 1000) / modelStepMs),
    simTokensPerS: Math.round(simTokensPerS),
    tokensPerS: Math.round(tokensPerS),
    modelStepMs: Number(modelStepMs.toFixed(1)),
    meanGapMs: Number(((streams / tokensPerS) * 1000).toFixed(1)),
    simCpuPercent: Number(((cpuS / elapsedS) * 100).toFixed(1)),
    simCpuMsPerKTokens: Number(((cpuS * 1000) / ((g1 - g0) / 1000)).toFixed(1)),
    rssMiB: Math.round(stats.rssBytes / 2 ** 20),
  };
}

const results: LevelResult[] = [];
for (const n of levels) results.push(await runLevel(n));
console.log(
  formatTable(
    [
      "streams",
      "ideal tok/s",
      "sim tok/s",
      "client tok/s",
      "model step ms",
      "observed gap ms",
      "sim CPU %",
      "CPU ms/1k tok",
      "RSS MiB",
    ],
    results.map((r) => [
      r.streams,
      r.idealTokensPerS,
      r.simTokensPerS,
      r.tokensPerS,
      r.modelStepMs,
      r.meanGapMs,
      r.simCpuPercent,
      r.simCpuMsPerKTokens,
      r.rssMiB,
    ]),
  ),
);
console.log(
  JSON.stringify({ bench: "engine-sim", windowMs, node: process.version, results }, null, 2),
);
