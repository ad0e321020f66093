/**
 * How the console writes numbers and states. A reading nobody reported is "—", never 0:
 * every formatter takes `undefined` and says so.
 */
import { NodeState, ReplicaState, RetirementPhase, RolloutState } from "@llmgw/proto";

export const ABSENT = "—";

type Num = number | bigint | undefined;

function num(v: Num): number | undefined {
  if (v === undefined) return undefined;
  const n = typeof v === "bigint" ? Number(v) : v;
  return Number.isFinite(n) ? n : undefined;
}

/** 80 GiB, 512 MiB; "—" when unreported. */
export function bytes(v: Num): string {
  const n = num(v);
  if (n === undefined) return ABSENT;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value >= 100 || unit === 0 ? Math.round(value) : value.toFixed(1)} ${units[unit]}`;
}

/** "37 / 80 GiB" with either side "—" when unreported. */
export function memory(used: Num, total: Num): string {
  return `${bytes(used)} / ${bytes(total)}`;
}

/** A 0–100 reading: "42%". */
export function percent(v: Num): string {
  const n = num(v);
  return n === undefined ? ABSENT : `${Math.round(n)}%`;
}

/** A 0–1 fraction: "42%". */
export function fraction(v: Num): string {
  const n = num(v);
  return n === undefined ? ABSENT : `${Math.round(n * 100)}%`;
}

export function celsius(v: Num): string {
  const n = num(v);
  return n === undefined ? ABSENT : `${Math.round(n)} °C`;
}

export function watts(v: Num): string {
  const n = num(v);
  return n === undefined ? ABSENT : `${Math.round(n)} W`;
}

/** A count that may be unreported: "3" or "—". */
export function count(v: Num): string {
  const n = num(v);
  return n === undefined ? ABSENT : String(n);
}

/** A limit an admin may leave unset: "600", or "none" (no limit, which is not a reading). */
export function limit(v: number | undefined): string {
  return v === undefined ? "none" : String(v);
}

/** "12 s ago", "5 min ago", "3 h ago", "2 d ago"; "—" for no time. */
export function ago(atMs: Num, nowMs: number): string {
  const at = num(atMs);
  if (at === undefined || at <= 0) return ABSENT;
  const s = Math.max(0, Math.round((nowMs - at) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3_600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86_400) return `${Math.floor(s / 3_600)} h ago`;
  return `${Math.floor(s / 86_400)} d ago`;
}

/** A time as the operator's clock shows it, e.g. "2026-12-02 14:03:07". */
export function clock(atMs: Num): string {
  const at = num(atMs);
  if (at === undefined || at <= 0) return ABSENT;
  const d = new Date(at);
  const p = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** A duration in ms as "850 ms", "12 s", "3 min". */
export function duration(v: Num): string {
  const ms = num(v);
  if (ms === undefined) return ABSENT;
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${Math.round(ms / 1000)} s`;
  return `${Math.round(ms / 60_000)} min`;
}

const NODE_STATES: Record<NodeState, string> = {
  [NodeState.UNSPECIFIED]: "unknown",
  [NodeState.READY]: "ready",
  [NodeState.UNREACHABLE]: "unreachable",
  [NodeState.LOST]: "lost",
};
export const nodeState = (s: NodeState): string => NODE_STATES[s] ?? "unknown";

const REPLICA_STATES: Record<ReplicaState, string> = {
  [ReplicaState.UNSPECIFIED]: "unknown",
  [ReplicaState.PENDING]: "pending",
  [ReplicaState.STARTING]: "starting",
  [ReplicaState.LOADING]: "loading",
  [ReplicaState.READY]: "ready",
  [ReplicaState.UNHEALTHY]: "unhealthy",
  [ReplicaState.STOPPING]: "stopping",
  [ReplicaState.EXITED]: "exited",
  [ReplicaState.FAILED]: "failed",
};
export const replicaState = (s: ReplicaState): string => REPLICA_STATES[s] ?? "unknown";

/** The badge tone of a state word: good, busy, bad or quiet. */
export function tone(state: string): "good" | "busy" | "bad" | "quiet" {
  switch (state) {
    case "ready":
    case "complete":
      return "good";
    case "pending":
    case "starting":
    case "loading":
    case "stopping":
    case "in progress":
    case "draining":
    case "waiting":
    case "warning":
      return "busy";
    case "unreachable":
    case "lost":
    case "unhealthy":
    case "failed":
    case "rolled back":
    case "error":
      return "bad";
    default:
      return "quiet";
  }
}

const ROLLOUTS: Record<RolloutState, string> = {
  [RolloutState.UNSPECIFIED]: "unknown",
  [RolloutState.IN_PROGRESS]: "in progress",
  [RolloutState.COMPLETE]: "complete",
  [RolloutState.ROLLED_BACK]: "rolled back",
};
export const rolloutState = (s: RolloutState): string => ROLLOUTS[s] ?? "unknown";

export const retirementPhase = (p: RetirementPhase): string =>
  p === RetirementPhase.DRAINING ? "draining" : p === RetirementPhase.WAITING ? "waiting" : "";

/** "LLMGW_SCHEDULER_NO_FABRIC_CAPACITY" → "no fabric capacity": the code in words. */
export function codeWords(code: string): string {
  return code
    .replace(/^LLMGW_[A-Z]+(_PLANE)?_/, "")
    .toLowerCase()
    .replaceAll("_", " ");
}
