import { ReadinessError } from "./errors.js";

/** What a single readiness probe concluded (same strings the supervisor's replica consumes). */
export type ReadinessState = "starting" | "loading" | "ready" | "failed-probe";

/** The `fetch` the probes use; injectable, defaults to the global (undici) fetch. */
export type FetchLike = (
  input: string,
  init: { signal: AbortSignal; headers?: Record<string, string> },
) => Promise<Response>;

/**
 * A response body as text, refused past `maxBytes` (by its `Content-Length` before reading, or
 * once that many bytes arrived, the rest cancelled): an engine's answer is outside input, and
 * on loopback a broken or hostile one sends hundreds of MiB within any timeout.
 */
export async function boundedText(response: Response, maxBytes: number): Promise<string> {
  const declared = Number(response.headers.get("content-length") ?? Number.NaN);
  if (declared > maxBytes) {
    await response.body?.cancel().catch(() => {});
    throw new Error(`body of ${declared} bytes is over ${maxBytes}`);
  }
  const body = response.body;
  if (body === null) return "";
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    bytes += value.byteLength;
    if (bytes > maxBytes) {
      await reader.cancel().catch(() => {});
      throw new Error(`body over ${maxBytes} bytes`);
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks, bytes).toString("utf8");
}

/** `Authorization` for an engine's API key; no headers without one. */
export function authorizationHeaders(apiKey: string | undefined): Record<string, string> {
  return apiKey === undefined ? {} : { authorization: `Bearer ${apiKey}` };
}

/** `/v1/models` answers read at most (a list of thousands of LoRA adapters fits). */
export const MAX_MODELS_BYTES = 4 * 2 ** 20;

/** Outcome of one check against one endpoint. */
export interface CheckReport {
  /** `health` (`GET /health`) or `models` (`GET /v1/models`). */
  readonly check: "health" | "models";
  /** What this check alone implies. */
  readonly state: ReadinessState;
  /** HTTP status, when a response arrived. */
  readonly status?: number;
  /** Human-readable: names the check, the finding and the elapsed time. */
  readonly detail: string;
  readonly elapsedMs: number;
  /** Model ids listed (models check only). */
  readonly models?: readonly string[];
}

/** Options shared by the probes. */
export interface ProbeOptions {
  /** Per-check timeout. Default 2000 ms. */
  timeoutMs?: number;
  /** Aborts the probe (e.g. an overall deadline). */
  signal?: AbortSignal;
  fetch?: FetchLike;
  /**
   * The engine's API key, sent as `Authorization: Bearer` on every check (vLLM guards
   * `/v1/models`, llama-server everything but `/health`). Never appears in a report.
   */
  apiKey?: string;
}

interface ResolvedProbeOptions {
  readonly timeoutMs: number;
  readonly signal: AbortSignal | undefined;
  readonly fetch: FetchLike;
  readonly headers: Record<string, string>;
}

function resolveProbeOptions(options: ProbeOptions): ResolvedProbeOptions {
  const timeoutMs = options.timeoutMs ?? 2000;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new ReadinessError(
      "LLMGW_READINESS_INVALID_OPTIONS",
      `timeoutMs must be a finite number > 0, got ${String(timeoutMs)}`,
    );
  }
  return {
    timeoutMs,
    signal: options.signal,
    fetch: options.fetch ?? ((input, init) => fetch(input, init)),
    headers: authorizationHeaders(options.apiKey),
  };
}

function endpoint(baseUrl: string, path: string): string {
  return `${baseUrl.replace(/\/+$/, "")}${path}`;
}

type Fetched =
  | { kind: "response"; response: Response; elapsedMs: number }
  | { kind: "refused"; elapsedMs: number; message: string }
  | { kind: "error"; elapsedMs: number; message: string };

async function timedFetch(url: string, o: ResolvedProbeOptions): Promise<Fetched> {
  const started = performance.now();
  const timeout = AbortSignal.timeout(o.timeoutMs);
  const signal = o.signal === undefined ? timeout : AbortSignal.any([timeout, o.signal]);
  const elapsed = () => Math.round(performance.now() - started);
  try {
    const response = await o.fetch(url, { signal, headers: o.headers });
    return { kind: "response", response, elapsedMs: elapsed() };
  } catch (error) {
    const code = errorCode(error);
    if (code === "ECONNREFUSED")
      return { kind: "refused", elapsedMs: elapsed(), message: "connection refused" };
    if (timeout.aborted)
      return { kind: "error", elapsedMs: elapsed(), message: `timed out after ${o.timeoutMs} ms` };
    if (o.signal?.aborted === true) {
      return {
        kind: "error",
        elapsedMs: elapsed(),
        message: "aborted (overall deadline or caller)",
      };
    }
    return { kind: "error", elapsedMs: elapsed(), message: code ?? (error as Error).message };
  }
}

function errorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && typeof current === "object" && current !== null; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/** No response: refused → `starting` (not listening yet), anything else → `failed-probe`. */
function transportFailure(
  check: CheckReport["check"],
  got: Exclude<Fetched, { kind: "response" }>,
): CheckReport {
  return {
    check,
    state: got.kind === "refused" ? "starting" : "failed-probe",
    detail: `${check}: ${got.message} after ${got.elapsedMs} ms`,
    elapsedMs: got.elapsedMs,
  };
}

/**
 * `GET <baseUrl>/health`: 2xx → the process is up (`ready` for this check); connection
 * refused or 503 → `starting` (vLLM refuses until loaded, SGLang answers 503 while warming
 * up); anything else (timeout, reset, other status) → `failed-probe`. Never throws.
 */
export async function probeHealth(
  baseUrl: string,
  options: ProbeOptions = {},
): Promise<CheckReport> {
  const o = resolveProbeOptions(options);
  const got = await timedFetch(endpoint(baseUrl, "/health"), o);
  if (got.kind !== "response") return transportFailure("health", got);
  const { status } = got.response;
  await got.response.body?.cancel().catch(() => {});
  const state: ReadinessState =
    status >= 200 && status < 300 ? "ready" : status === 503 ? "starting" : "failed-probe";
  return {
    check: "health",
    state,
    status,
    detail: `health: HTTP ${status} after ${got.elapsedMs} ms`,
    elapsedMs: got.elapsedMs,
  };
}

/**
 * `GET <baseUrl>/v1/models`: `ready` when `data[].id` contains `expectedModelId`, `loading`
 * when the list answers without it (or with 503), `starting` when refused, `failed-probe`
 * for timeouts, other statuses and bodies that are not a model list. Never throws.
 */
export async function probeModels(
  baseUrl: string,
  expectedModelId: string,
  options: ProbeOptions = {},
): Promise<CheckReport> {
  const o = resolveProbeOptions(options);
  const got = await timedFetch(endpoint(baseUrl, "/v1/models"), o);
  if (got.kind !== "response") return transportFailure("models", got);
  const { response } = got;
  if (response.status !== 200) {
    await response.body?.cancel().catch(() => {});
    const state: ReadinessState = response.status === 503 ? "loading" : "failed-probe";
    // 401: the engine demands a key this probe lacks or has wrong (e.g. an engine left by
    // another agent); say so rather than a bare status.
    const why =
      response.status === 401
        ? o.headers.authorization === undefined
          ? " (the engine wants an API key and none was sent)"
          : " (the engine refused the API key)"
        : "";
    return {
      check: "models",
      state,
      status: response.status,
      detail: `models: HTTP ${response.status}${why} after ${got.elapsedMs} ms`,
      elapsedMs: got.elapsedMs,
    };
  }
  let ids: string[] | undefined;
  let unreadable = "";
  try {
    const text = await boundedText(response, MAX_MODELS_BYTES).catch((error: Error) => {
      unreadable = ` (${error.message})`;
      throw error;
    });
    const body = JSON.parse(text) as { data?: unknown };
    if (Array.isArray(body.data)) {
      ids = body.data.flatMap((m) =>
        typeof m === "object" && m !== null && typeof m.id === "string" ? [m.id as string] : [],
      );
    }
  } catch {
    ids = undefined;
  }
  const { elapsedMs } = got;
  if (ids === undefined) {
    return {
      check: "models",
      state: "failed-probe",
      status: 200,
      detail: `models: body is not a model list${unreadable} after ${elapsedMs} ms`,
      elapsedMs,
    };
  }
  const listed = ids.includes(expectedModelId);
  return {
    check: "models",
    state: listed ? "ready" : "loading",
    status: 200,
    models: ids,
    detail: listed
      ? `models: ${JSON.stringify(expectedModelId)} listed after ${elapsedMs} ms`
      : `models: ${JSON.stringify(expectedModelId)} not listed (have ${JSON.stringify(ids)}) after ${elapsedMs} ms`,
    elapsedMs,
  };
}

/** Result of {@link probeReadiness}: the combined state and every check that ran. */
export interface ReadinessReport {
  readonly state: ReadinessState;
  readonly checks: readonly CheckReport[];
  /** Details of the checks joined: names the check that decided and its elapsed time. */
  readonly detail: string;
  readonly elapsedMs: number;
}

/** Options of {@link probeReadiness}. */
export interface ReadinessProbeOptions extends Omit<ProbeOptions, "timeoutMs"> {
  /** Timeout of the health check. Default 2000 ms. */
  healthTimeoutMs?: number;
  /** Timeout of the models check. Default 5000 ms. */
  modelsTimeoutMs?: number;
}

/**
 * The two questions in order: health (process up?) then models (weights loaded?). Health
 * `starting`/`failed-probe` decides alone; otherwise the models check decides. Never throws.
 */
export async function probeReadiness(
  baseUrl: string,
  expectedModelId: string,
  options: ReadinessProbeOptions = {},
): Promise<ReadinessReport> {
  const started = performance.now();
  const common = {
    ...(options.signal === undefined ? {} : { signal: options.signal }),
    ...(options.fetch === undefined ? {} : { fetch: options.fetch }),
    ...(options.apiKey === undefined ? {} : { apiKey: options.apiKey }),
  };
  const health = await probeHealth(baseUrl, {
    ...common,
    timeoutMs: options.healthTimeoutMs ?? 2000,
  });
  const checks: CheckReport[] = [health];
  let state = health.state;
  if (health.state === "ready") {
    const models = await probeModels(baseUrl, expectedModelId, {
      ...common,
      timeoutMs: options.modelsTimeoutMs ?? 5000,
    });
    checks.push(models);
    state = models.state === "starting" ? "failed-probe" : models.state;
  }
  return {
    state,
    checks,
    detail: checks.map((c) => c.detail).join("; "),
    elapsedMs: Math.round(performance.now() - started),
  };
}

/** Options of {@link waitForReadiness}. */
export interface WaitForReadinessOptions extends ReadinessProbeOptions {
  /** Overall deadline across attempts. Required. */
  deadlineMs: number;
  /** Pause between attempts. Default 500 ms. */
  intervalMs?: number;
  /** Called with every report (e.g. to drive starting → loading transitions). */
  onReport?: (report: ReadinessReport) => void;
}

/**
 * Probes until `ready` or the overall deadline. Resolves with the ready report; throws
 * `LLMGW_READINESS_NOT_READY` naming the last state, the deciding check and the elapsed time.
 */
export async function waitForReadiness(
  baseUrl: string,
  expectedModelId: string,
  options: WaitForReadinessOptions,
): Promise<ReadinessReport> {
  const { deadlineMs } = options;
  const intervalMs = options.intervalMs ?? 500;
  if (
    !Number.isFinite(deadlineMs) ||
    deadlineMs <= 0 ||
    !Number.isFinite(intervalMs) ||
    intervalMs < 0
  ) {
    throw new ReadinessError(
      "LLMGW_READINESS_INVALID_OPTIONS",
      `deadlineMs must be > 0 and intervalMs ≥ 0, got deadlineMs=${deadlineMs} intervalMs=${intervalMs}`,
    );
  }
  const started = performance.now();
  const deadline = AbortSignal.timeout(deadlineMs);
  const signal =
    options.signal === undefined ? deadline : AbortSignal.any([deadline, options.signal]);
  let last: ReadinessReport | undefined;
  for (;;) {
    const report = await probeReadiness(baseUrl, expectedModelId, { ...options, signal });
    // An attempt cut short by the deadline says less than the one before it: keep that one.
    if (!(signal.aborted && report.state === "failed-probe" && last !== undefined)) last = report;
    options.onReport?.(report);
    if (report.state === "ready") return report;
    const remaining = deadlineMs - (performance.now() - started);
    if (signal.aborted || remaining <= 0) break;
    await new Promise((resolve) => setTimeout(resolve, Math.min(intervalMs, remaining)));
    if (signal.aborted) break;
  }
  const elapsed = Math.round(performance.now() - started);
  throw new ReadinessError(
    "LLMGW_READINESS_NOT_READY",
    `${baseUrl} not ready for ${JSON.stringify(expectedModelId)} after ${elapsed} ms (deadline ${deadlineMs} ms): ${last.state}: ${last.detail}`,
  );
}

/**
 * A `() => Promise<state>` for `SupervisedReplica`'s `probe` option: one
 * {@link probeReadiness} per call.
 */
export function createReadinessProbe(
  baseUrl: string,
  expectedModelId: string,
  options: ReadinessProbeOptions = {},
): () => Promise<ReadinessState> {
  return async () => (await probeReadiness(baseUrl, expectedModelId, options)).state;
}
