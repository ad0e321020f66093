/**
 * Closed-loop load generators for the overhead benchmark: wrk (C, one thread, a Lua script for
 * the POST body; what the calibration used) and autocannon (in-process Node, the fallback when
 * wrk is missing; it takes more of the box and flatters Node targets). Results carry the name of
 * the generator: a ratio goal means nothing without it.
 */
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import autocannon from "autocannon";
import { findBinary } from "./children.js";

/** One closed-loop measurement. */
export interface LoadResult {
  readonly generator: "wrk" | "autocannon";
  readonly requests: number;
  readonly seconds: number;
  readonly reqPerSec: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** Socket errors and timeouts. */
  readonly errors: number;
  readonly non2xx: number;
}

/** What to send. */
export interface LoadSpec {
  /** Full URL, e.g. `http://127.0.0.1:8000/v1/chat/completions`. */
  readonly url: string;
  readonly body: string;
  readonly connections: number;
  readonly seconds: number;
  /**
   * Extra request headers (e.g. `authorization`). wrk reads them from its Lua script, a file in
   * a 0700 temp dir removed after the run, never from argv.
   */
  readonly headers?: Readonly<Record<string, string>>;
}

/** A Lua string literal (headers go into wrk's script). */
const luaString = (s: string): string => JSON.stringify(s);

/** The generator this machine has: wrk when installed, else autocannon. */
export function defaultGenerator(): "wrk" | "autocannon" {
  return findBinary("wrk") === undefined ? "autocannon" : "wrk";
}

/** Runs wrk with one thread; the Lua script reads the body from a file and reports JSON. */
export async function runWrk(spec: LoadSpec): Promise<LoadResult> {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-wrk-"));
  try {
    const bodyFile = join(dir, "body.json");
    writeFileSync(bodyFile, spec.body);
    const script = join(dir, "post.lua");
    writeFileSync(
      script,
      `wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
${Object.entries(spec.headers ?? {})
  .map(([k, v]) => `wrk.headers[${luaString(k)}] = ${luaString(v)}\n`)
  .join("")}local f = io.open("${bodyFile}", "rb")
wrk.body = f:read("*a")
f:close()
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%d,"durationUs":%d,"p50Us":%d,"p99Us":%d,"errors":%d,"non2xx":%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
`,
    );
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(
        "wrk",
        [
          "-t1",
          `-c${spec.connections}`,
          `-d${spec.seconds}s`,
          "--timeout",
          "30s",
          "-s",
          script,
          spec.url,
        ],
        { maxBuffer: 1 << 20 },
        (err, out, stderr) =>
          err ? reject(new Error(`wrk: ${err.message} ${stderr}`)) : resolve(out),
      );
    });
    const line = stdout.split("\n").find((l) => l.startsWith("WRKJSON "));
    if (!line) throw new Error(`wrk printed no result: ${stdout}`);
    const r = JSON.parse(line.slice(8)) as {
      requests: number;
      durationUs: number;
      p50Us: number;
      p99Us: number;
      errors: number;
      non2xx: number;
    };
    const seconds = r.durationUs / 1e6;
    const none = r.requests === 0; // wrk reports 0 percentiles when nothing completed
    return {
      generator: "wrk",
      requests: r.requests,
      seconds,
      reqPerSec: r.requests / seconds,
      p50Ms: none ? Number.NaN : r.p50Us / 1000,
      p99Ms: none ? Number.NaN : r.p99Us / 1000,
      errors: r.errors,
      non2xx: r.non2xx,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Runs autocannon in this process. */
export async function runAutocannon(spec: LoadSpec): Promise<LoadResult> {
  const r = await autocannon({
    url: spec.url,
    method: "POST",
    headers: { "content-type": "application/json", ...spec.headers },
    body: spec.body,
    connections: spec.connections,
    duration: spec.seconds,
  });
  return {
    generator: "autocannon",
    requests: r.requests.total,
    seconds: r.duration,
    reqPerSec: r.requests.total / r.duration,
    p50Ms: r.latency.p50,
    p99Ms: r.latency.p99,
    errors: r.errors + r.timeouts,
    non2xx: r.non2xx,
  };
}

/** Runs `spec` with the named generator. */
export function runLoad(generator: "wrk" | "autocannon", spec: LoadSpec): Promise<LoadResult> {
  return generator === "wrk" ? runWrk(spec) : runAutocannon(spec);
}

/** Median of a non-empty list (mean of the middle two for even lengths). */
export function median(values: readonly number[]): number {
  const s = values.filter((v) => !Number.isNaN(v)).sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  if (s.length === 0) return Number.NaN;
  return s.length % 2 === 1
    ? (s[mid] as number)
    : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}
