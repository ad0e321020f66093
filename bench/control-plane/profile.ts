import { mkdirSync, writeFileSync } from "node:fs";
/**
 * CPU-profiling the control plane during the steady window only (`--cpu-prof`): the control
 * plane runs with `--inspect=127.0.0.1:PORT` and this file drives the V8 profiler over the
 * inspector's WebSocket, so registration and deploy-time reconciles stay out of the profile.
 */
import { WebSocket } from "undici";

/** A V8 `.cpuprofile` document (the fields this file reads). */
export interface CpuProfile {
  readonly nodes: readonly {
    readonly id: number;
    readonly callFrame: {
      readonly functionName: string;
      readonly url: string;
      readonly lineNumber: number;
    };
    readonly hitCount?: number;
    readonly children?: readonly number[];
  }[];
  readonly startTime: number;
  readonly endTime: number;
  readonly samples?: readonly number[];
}

/** One line of the self-time summary. */
export interface HotFunction {
  readonly fn: string;
  /** Share of the busy (non-idle) samples, 0..1. */
  readonly self: number;
  /**
   * Share of the busy samples in it or anything it called (a function on the stack twice is
   * counted once per stack), 0..1.
   */
  readonly total?: number;
}

/** A started profiler session; `stop` returns the profile and closes the socket. */
export interface ProfilerSession {
  stop(): Promise<CpuProfile>;
}

/** Connects to the inspector on `port` and starts the sampling profiler. */
export async function startProfiler(
  port: number,
  sampleIntervalUs = 500,
): Promise<ProfilerSession> {
  const list = (await (await fetch(`http://127.0.0.1:${port}/json/list`)).json()) as {
    webSocketDebuggerUrl: string;
  }[];
  const url = list[0]?.webSocketDebuggerUrl;
  if (!url) throw new Error(`no inspector target on port ${port}`);
  const ws = new WebSocket(url);
  await new Promise<void>((resolve, reject) => {
    ws.addEventListener("open", () => resolve(), { once: true });
    ws.addEventListener("error", () => reject(new Error("inspector WebSocket failed")), {
      once: true,
    });
  });
  let nextId = 1;
  const pending = new Map<
    number,
    (msg: { result?: unknown; error?: { message: string } }) => void
  >();
  ws.addEventListener("message", (ev) => {
    const msg = JSON.parse(String(ev.data)) as { id?: number; result?: unknown };
    if (msg.id !== undefined) pending.get(msg.id)?.(msg);
  });
  const call = (method: string, params: Record<string, unknown> = {}) =>
    new Promise<unknown>((resolve, reject) => {
      const id = nextId++;
      pending.set(id, (msg) => {
        pending.delete(id);
        if (msg.error) reject(new Error(`${method}: ${msg.error.message}`));
        else resolve(msg.result);
      });
      ws.send(JSON.stringify({ id, method, params }));
    });
  await call("Profiler.enable");
  await call("Profiler.setSamplingInterval", { interval: sampleIntervalUs });
  await call("Profiler.start");
  return {
    async stop() {
      const { profile } = (await call("Profiler.stop")) as { profile: CpuProfile };
      ws.close();
      return profile;
    },
  };
}

/**
 * Self time by function (name + file + line) as a share of the busy samples, largest first.
 * Idle samples are left out; `(program)` and `(garbage collector)` stay in.
 */
export function hotFunctions(profile: CpuProfile, top = 15): HotFunction[] {
  const byNode = new Map(profile.nodes.map((n) => [n.id, n]));
  const counts = new Map<string, number>();
  let total = 0;
  const add = (id: number, hits: number) => {
    const n = byNode.get(id);
    if (!n || n.callFrame.functionName === "(idle)") return;
    const { functionName, url, lineNumber } = n.callFrame;
    const file = url
      .replace(/^file:\/\//, "")
      .replace(/^.*\/(node_modules|apps|packages)\//, "$1/");
    const key = url ? `${functionName || "(anonymous)"} ${file}:${lineNumber + 1}` : functionName;
    counts.set(key, (counts.get(key) ?? 0) + hits);
    total += hits;
  };
  if (profile.samples && profile.samples.length > 0) {
    for (const id of profile.samples) add(id, 1);
  } else {
    for (const n of profile.nodes) add(n.id, n.hitCount ?? 0);
  }
  return [...counts]
    .sort((a, b) => b[1] - a[1])
    .slice(0, top)
    .map(([fn, c]) => ({ fn, self: total > 0 ? c / total : 0 }));
}

/**
 * Inclusive time by function among those whose file matches `only` (e.g. llmgw's own code),
 * largest first: where a hot path starts, which self time alone does not show.
 */
export function inclusiveFunctions(profile: CpuProfile, only: RegExp, top = 15): HotFunction[] {
  const byNode = new Map(profile.nodes.map((n) => [n.id, n]));
  const hits = new Map<number, number>();
  let total = 0;
  for (const id of profile.samples ?? []) {
    if (byNode.get(id)?.callFrame.functionName === "(idle)") continue;
    hits.set(id, (hits.get(id) ?? 0) + 1);
    total += 1;
  }
  const keyOf = (n: CpuProfile["nodes"][number]) => {
    const { functionName, url, lineNumber } = n.callFrame;
    const file = url
      .replace(/^file:\/\//, "")
      .replace(/^.*\/(node_modules|apps|packages)\//, "$1/");
    return { key: `${functionName || "(anonymous)"} ${file}:${lineNumber + 1}`, file };
  };
  const totals = new Map<string, number>();
  const walk = (id: number, onStack: ReadonlySet<string>): number => {
    const n = byNode.get(id);
    if (!n) return 0;
    const { key, file } = keyOf(n);
    const counted = only.test(file) && !onStack.has(key);
    const next = counted ? new Set([...onStack, key]) : onStack;
    let sum = hits.get(id) ?? 0;
    for (const c of n.children ?? []) sum += walk(c, next);
    if (counted) totals.set(key, (totals.get(key) ?? 0) + sum);
    return sum;
  };
  const root = profile.nodes[0];
  if (root) walk(root.id, new Set());
  return [...totals]
    .sort((a, b) => b[1] - a[1])
    .slice(0, top)
    .map(([fn, c]) => ({ fn, self: 0, total: total > 0 ? c / total : 0 }));
}

/**
 * Writes `profile` to `bench/results/control-plane-<kind>-<time>.cpuprofile` (git-ignored;
 * open it in Chrome DevTools) and returns the path.
 */
export function saveProfile(kind: string, profile: CpuProfile): string {
  mkdirSync("bench/results", { recursive: true });
  const file = `bench/results/control-plane-${kind}-${new Date().toISOString().replace(/[:.]/g, "-")}.cpuprofile`;
  writeFileSync(file, JSON.stringify(profile));
  return file;
}
