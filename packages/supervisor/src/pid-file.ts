import { chmodSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { SupervisorError } from "./errors.js";
import type { ProcessIdentity } from "./proc.js";

/** Content of one replica's pid file (JSON, mode 0600, in a 0700 directory). */
export interface PidRecord extends ProcessIdentity {
  readonly version: 1;
  readonly replicaId: string;
  /** Hash of the launch spec the process was started from (see `hashProcessSpec`). */
  readonly specHash: string;
  /** The replica's log file, so an adopting supervisor keeps tailing it. */
  readonly logFile: string;
  /**
   * The spec's stop settings (not part of `specHash`), so that an adopting supervisor stops the
   * process as its launcher would have. Absent in files written before they were recorded.
   */
  readonly stopSignal?: NodeJS.Signals;
  readonly stopGraceMs?: number;
  readonly writtenAtMs: number;
}

const REPLICA_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/** Throws `LLMGW_SUPERVISOR_INVALID_OPTIONS` unless `replicaId` is a safe file-name stem. */
export function validateReplicaId(replicaId: string): string {
  if (!REPLICA_ID.test(replicaId)) {
    throw new SupervisorError(
      "LLMGW_SUPERVISOR_INVALID_OPTIONS",
      `replica id must match ${REPLICA_ID.source}, got ${JSON.stringify(replicaId)}`,
    );
  }
  return replicaId;
}

/** Path of the pid file of `replicaId` under `stateDir`. */
export function pidFilePath(stateDir: string, replicaId: string): string {
  return join(stateDir, `${validateReplicaId(replicaId)}.pid.json`);
}

/** Atomically writes the pid file (0600; creates `stateDir` as 0700). Throws `LLMGW_SUPERVISOR_PID_FILE`. */
export function writePidFile(stateDir: string, record: PidRecord): void {
  const path = pidFilePath(stateDir, record.replicaId);
  try {
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    chmodSync(stateDir, 0o700);
    const tmp = `${path}.tmp`;
    writeFileSync(tmp, `${JSON.stringify(record)}\n`, { mode: 0o600 });
    chmodSync(tmp, 0o600);
    renameSync(tmp, path);
  } catch (cause) {
    throw new SupervisorError("LLMGW_SUPERVISOR_PID_FILE", `cannot write pid file ${path}`, {
      cause,
    });
  }
}

/** Result of reading a pid file. */
export type PidFileRead =
  | { readonly kind: "missing" }
  | { readonly kind: "invalid"; readonly reason: string }
  | { readonly kind: "ok"; readonly record: PidRecord };

/** Reads and validates the pid file of `replicaId`; never throws. */
export function readPidFile(stateDir: string, replicaId: string): PidFileRead {
  const path = pidFilePath(stateDir, replicaId);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (cause) {
    if ((cause as NodeJS.ErrnoException).code === "ENOENT") return { kind: "missing" };
    return { kind: "invalid", reason: `unreadable: ${(cause as Error).message}` };
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return { kind: "invalid", reason: "not JSON" };
  }
  const r = value as Partial<Record<keyof PidRecord, unknown>>;
  const ok =
    typeof value === "object" &&
    value !== null &&
    r.version === 1 &&
    r.replicaId === replicaId &&
    Number.isInteger(r.pid) &&
    (r.pid as number) > 1 &&
    Number.isInteger(r.pgid) &&
    (r.pgid as number) > 1 &&
    typeof r.startTime === "string" &&
    typeof r.cmdlineSha256 === "string" &&
    typeof r.specHash === "string" &&
    typeof r.logFile === "string" &&
    (r.stopSignal === undefined ||
      (typeof r.stopSignal === "string" && /^SIG[A-Z0-9]+$/.test(r.stopSignal))) &&
    (r.stopGraceMs === undefined ||
      (typeof r.stopGraceMs === "number" &&
        Number.isFinite(r.stopGraceMs) &&
        r.stopGraceMs >= 0)) &&
    typeof r.writtenAtMs === "number";
  if (!ok) return { kind: "invalid", reason: "missing or malformed fields" };
  return { kind: "ok", record: value as PidRecord };
}

/** Removes the pid file of `replicaId` if present; never throws. */
export function removePidFile(stateDir: string, replicaId: string): void {
  try {
    rmSync(pidFilePath(stateDir, replicaId), { force: true });
  } catch {
    // best effort
  }
}
