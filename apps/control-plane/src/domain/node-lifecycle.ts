/**
 * Node lifecycle (DESIGN §6): `ready` → `unreachable` (missed heartbeats; its replicas keep
 * serving and stay placed, since losing the control channel is not losing the engines) →
 * `lost` (grace exceeded; its replicas are rescheduled). A heartbeat brings any state back to
 * `ready`. Cordon and drain are operator flags beside the state, not states.
 */
export type NodeState = "ready" | "unreachable" | "lost";

/** Timing rules of the lifecycle, resolved from the control plane's options. */
export interface NodeLifecycleTiming {
  /** Silence after which a ready node is unreachable (e.g. 3 × heartbeat interval). */
  readonly unreachableAfterMs: number;
  /** Further silence after which an unreachable node is lost. */
  readonly lostAfterMs: number;
}

/**
 * The state a node should be in at `nowMs`, given when it was last heard from. Pure: the
 * caller applies the transition, logs it and reacts (reschedules on `lost`).
 */
export function nextNodeState(
  current: NodeState,
  lastSeenMs: number,
  nowMs: number,
  timing: NodeLifecycleTiming,
): NodeState {
  const silentMs = nowMs - lastSeenMs;
  if (silentMs >= timing.unreachableAfterMs + timing.lostAfterMs) return "lost";
  if (silentMs >= timing.unreachableAfterMs) return current === "lost" ? "lost" : "unreachable";
  return current;
}
