import {
  type DeploymentSpec,
  deploymentGpusPerReplica,
  engineSupportsMultiNode,
  rolloutLimits,
  sameLaunch,
} from "@llmgw/engines";
import type {
  Reason,
  ScheduleInput,
  ScheduleResult,
  SchedulerDeployment,
  SchedulerNode,
  UnschedulableReasonCode,
} from "@llmgw/scheduler";
import type { PlacementRecord, RetirementRecord } from "../store/types.js";

/** The scheduler as the reconciler uses it: pure, deterministic for the same input. */
export type ScheduleFn = (input: ScheduleInput) => ScheduleResult;

/** Where a placed replica stands, as far as leaving it is concerned. */
export type ReplicaCondition =
  /** Takes traffic (ready, with an endpoint, on nodes not lost). */
  | "serving"
  /** Placed, not ready yet (pending, starting, loading): a replacement on its way. */
  | "coming"
  /** Its engine failed: the restart policy gave up. */
  | "failed"
  /** Anything else (exited, unhealthy, stopping, not reported). */
  | "idle";

/** What {@link planReconcile} works from. */
export interface ReconcileInput {
  /** Current specs by name. */
  readonly deployments: ReadonlyMap<string, DeploymentSpec>;
  /** The spec of an older revision still run by some replica; undefined when not kept. */
  readonly specOf: (deployment: string, revision: number) => DeploymentSpec | undefined;
  readonly placements: readonly PlacementRecord[];
  /** Every known, non-revoked node, in scheduler form (fabric trouble included). */
  readonly nodes: readonly SchedulerNode[];
  readonly condition: (replicaId: string) => ReplicaCondition;
  /**
   * True when a draining replica has nothing in flight any more (every connected router said
   * so, and its engine agrees): it may stop.
   */
  readonly drained: (replicaId: string) => boolean;
  readonly schedule: ScheduleFn;
  readonly nowMs: number;
  /** Replicas whose engines keep failing, to move where their deployment fits elsewhere. */
  readonly failing?: ScheduleInput["failing"];
  /** Nodes deployments avoid for new replicas (see `ScheduleInput.avoid`). */
  readonly avoid?: ScheduleInput["avoid"];
  /**
   * Deployments whose current spec this release refuses (an older release stored it; see
   * `deploymentSpecFromJson`): left as they are. Their placed replicas are held (their GPUs
   * stay taken, no scale-down, preemption, node drain or rolling update step touches them,
   * only a loss removes one), a drain already under way still ends, and the scheduler is not
   * asked for them: nothing new is placed, so no node is handed a spec this release refuses.
   * Absent: none.
   */
  readonly frozen?: ReadonlySet<string>;
}

/** Why a placement stops now. */
export type RemovalKind =
  /**
   * A loss (node lost or gone, GPU unusable, port trouble), or a replica that keeps failing
   * moved: nothing to drain.
   */
  | "lost"
  /** Leaving and serving nothing (not ready, or failed): stopped at once. */
  | "idle"
  /** Drained: no request in flight. */
  | "drained"
  /** Its drain timed out with requests still in flight. */
  | "drain-timeout";

/** A placement to drop now, and why. */
export interface PlacementRemovalPlan {
  readonly placement: PlacementRecord;
  readonly reason: Reason;
  readonly kind: RemovalKind;
}

/** What the control plane should do to converge; applied (and persisted) by the caller. */
export interface ReconcilePlan {
  /**
   * Placements to keep, with revisions brought up to date and retirements set; those whose
   * record changed are also in {@link changed}.
   */
  readonly keep: readonly PlacementRecord[];
  /** Kept placements whose record changed (revision, retirement), by replica id order. */
  readonly changed: readonly PlacementRecord[];
  readonly add: readonly PlacementRecord[];
  readonly remove: readonly PlacementRemovalPlan[];
  /** Reasons per deployment that misses replicas; absent = fully placed. */
  readonly unschedulable: ReadonlyMap<string, { missing: number; reasons: readonly Reason[] }>;
  /**
   * Deployments taking a replica away before its replacement is ready, because none could
   * be placed (no room for a surge): announced, never silent.
   */
  readonly dips: readonly { readonly deployment: string; readonly message: string }[];
}

/**
 * Scheduler codes of planned removals: the replica drains instead of stopping. (A deleted
 * deployment's replicas, and older revisions, never reach the scheduler: step 1 sorts them,
 * so `deployment-deleted` and `shape-changed` do not come back from it.)
 */
const DRAIN_NOW = new Set(["scale-down", "preempted"]);
/**
 * Unschedulable codes a replica's GPUs, once freed, may cure: the fleet lacks free room, not
 * a fitting node (scheduler reasons.ts).
 */
const ROOM_CODES: ReadonlySet<string> = new Set<UnschedulableReasonCode>([
  "no-free-gpus",
  "no-node-fits",
  "no-fabric-fits",
  "preemption-insufficient",
]);

/** Scheduler codes of planned moves: the replacement is made before the replica drains. */
const MOVE = new Set(["node-draining"]);

/**
 * Decides placements and how replicas leave. The scheduler owns where replicas go and which
 * placement must leave and why (one code vocabulary); this adds the lifecycle around it:
 *
 * - A loss removes a replica at once: there is nothing left to drain.
 * - A planned removal (scale-down, preemption, undeploy) drains the replica first: it takes
 *   no new requests, and stops once nothing is in flight or its `drainTimeoutSeconds` ends.
 * - A planned move (node drain) and a new revision that changes how engines run make before
 *   they break: the leaving replica keeps serving (`waiting`) while its replacement starts,
 *   and drains once enough replicas serve (`replicas − maxUnavailable`). A rolling update
 *   marks at most `maxSurge + maxUnavailable` old replicas at a time. When no replacement can be placed and
 *   none is coming, one replica at a time goes anyway where its GPUs would help (see
 *   {@link dipHelps}), announced as a capacity dip.
 * - A new revision that runs engines the same way (routing policy, limits) keeps its
 *   replicas at that revision, untouched.
 * - A frozen deployment (a spec this release refuses; {@link ReconcileInput.frozen}) keeps
 *   its replicas as they are and gets no new one, not even for a lost one.
 *
 * Leaving replicas are held: their GPUs stay taken until they stop, so nothing new lands on
 * GPUs still serving. Pure apart from calling `schedule`.
 */
export function planReconcile(input: ReconcileInput): ReconcilePlan {
  const now = input.nowMs;
  const remove: PlacementRemovalPlan[] = [];
  /** Replica id → its record as kept (retirement or revision possibly changed). */
  const kept = new Map<string, PlacementRecord>();
  const changed = new Set<string>();
  const held = new Set<string>();
  const fresh = new Set<string>();
  /** Deployment → ready replicas of older revisions still counted as its replicas. */
  const oldServing = new Map<string, PlacementRecord[]>();
  const dips: { deployment: string; message: string }[] = [];

  const retire = (p: PlacementRecord, retirement: RetirementRecord): void => {
    kept.set(p.replicaId, { ...p, retirement });
    changed.add(p.replicaId);
    held.add(p.replicaId);
    fresh.delete(p.replicaId);
  };
  const drainingOf = (p: PlacementRecord, code: string, message: string): RetirementRecord => {
    const spec = input.deployments.get(p.deployment) ?? input.specOf(p.deployment, p.revision);
    const timeout = spec === undefined ? 0 : rolloutLimits(spec).drainTimeoutMs;
    return {
      code,
      message,
      phase: "draining",
      sinceMs: p.retirement?.sinceMs ?? now,
      drainingSinceMs: now,
      deadlineMs: now + timeout,
    };
  };
  /** A planned removal: drains when serving, else stops now. */
  const leave = (p: PlacementRecord, reason: Reason, move: boolean): void => {
    const condition = input.condition(p.replicaId);
    if (condition !== "serving") {
      remove.push({ placement: p, reason, kind: "idle" });
      kept.delete(p.replicaId);
      fresh.delete(p.replicaId);
      return;
    }
    retire(
      p,
      move
        ? { code: reason.code, message: reason.message, phase: "waiting", sinceMs: now }
        : drainingOf(p, reason.code, reason.message),
    );
  };

  // 1. Sort what is placed: leaving already, of a deleted deployment, of an older revision.
  for (const p of input.placements) {
    const spec = input.deployments.get(p.deployment);
    const retirement = p.retirement;
    if (
      spec !== undefined &&
      input.frozen?.has(p.deployment) === true &&
      retirement?.phase !== "draining"
    ) {
      // Running as placed, with nothing to replace it: held (only a loss removes it).
      kept.set(p.replicaId, p);
      held.add(p.replicaId);
      continue;
    }
    if (
      retirement?.phase === "waiting" &&
      retirement.code === "rollout" &&
      spec !== undefined &&
      sameLaunchAs(p, spec)
    ) {
      // The deployment went back (a rollback) to what this replica runs: it stays.
      const { retirement: _, ...serving } = p;
      kept.set(p.replicaId, serving);
      changed.add(p.replicaId);
      fresh.add(p.replicaId);
      continue;
    }
    if (retirement !== undefined) {
      if (retirement.phase === "draining") {
        if (input.drained(p.replicaId)) {
          remove.push({ placement: p, reason: reasonOf(retirement), kind: "drained" });
          continue;
        }
        if (now >= (retirement.deadlineMs ?? 0)) {
          remove.push({ placement: p, reason: reasonOf(retirement), kind: "drain-timeout" });
          continue;
        }
      } else if (input.condition(p.replicaId) !== "serving") {
        remove.push({ placement: p, reason: reasonOf(retirement), kind: "idle" });
        continue;
      } else if (spec === undefined) {
        // Waiting for a replacement that went with its deployment: it drains now.
        retire(p, drainingOf(p, "deployment-deleted", `deployment ${p.deployment} was deleted`));
        continue;
      }
      kept.set(p.replicaId, p);
      held.add(p.replicaId);
      continue;
    }
    kept.set(p.replicaId, p);
    if (spec === undefined) {
      leave(
        p,
        { code: "deployment-deleted", message: `deployment ${p.deployment} was deleted` },
        false,
      );
      continue;
    }
    if (p.revision === spec.revision) {
      fresh.add(p.replicaId);
      continue;
    }
    const older = input.specOf(p.deployment, p.revision);
    if (older !== undefined && sameLaunch(older, spec)) {
      // Nothing the engine runs with changed: the scheduler keeps the replica at the new
      // revision (`revised`).
      fresh.add(p.replicaId);
      continue;
    }
    const rollout: Reason = {
      code: "rollout",
      message: `deployment ${p.deployment} moves from revision ${p.revision} to ${spec.revision}`,
    };
    if (older === undefined || input.condition(p.replicaId) !== "serving") {
      // Serving nothing (or its spec is gone): replaced without a wait.
      remove.push({ placement: p, reason: rollout, kind: "idle" });
      kept.delete(p.replicaId);
      continue;
    }
    held.add(p.replicaId);
    const list = oldServing.get(p.deployment) ?? [];
    list.push(p);
    oldServing.set(p.deployment, list);
  }

  function sameLaunchAs(p: PlacementRecord, spec: DeploymentSpec): boolean {
    const runs = input.specOf(p.deployment, p.revision);
    return runs !== undefined && sameLaunch(runs, spec);
  }

  /** Nodes new replicas may land on: ready, neither cordoned nor draining. */
  const schedulableNodes = new Set(
    input.nodes.filter((n) => n.state === "ready" && !n.cordoned && !n.draining).map((n) => n.id),
  );
  /**
   * 1 when a rank of `p` is on a node that takes no new replica (its GPUs, once freed, take no
   * replacement), else 0: sorts the replicas worth letting go for room first.
   */
  const stranded = (p: PlacementRecord): number =>
    p.ranks.every((r) => schedulableNodes.has(r.nodeId)) ? 0 : 1;

  // 2. Rolling updates: up to maxSurge + maxUnavailable old replicas at a time wait for a
  // replacement (those maxUnavailable allows drain at once, in step 4); old replicas beyond
  // the replica count (scaled down mid-update) drain.
  for (const [name, olds] of oldServing) {
    const spec = input.deployments.get(name) as DeploymentSpec;
    const limits = rolloutLimits(spec);
    let waiting = 0;
    for (const p of kept.values())
      if (p.deployment === name && p.retirement?.phase === "waiting") waiting += 1;
    const room = Math.max(0, limits.maxSurge + limits.maxUnavailable - waiting);
    // Scaled down mid-update: those on nodes that take no new replica first (they leave
    // anyway, and one kept there is replaced later at the cost of one that could stay, as the
    // scheduler's own scale-down does), then the oldest revision, then by id: deterministic.
    olds.sort(
      (a, b) =>
        stranded(b) - stranded(a) ||
        a.revision - b.revision ||
        a.replicaId.localeCompare(b.replicaId),
    );
    for (const p of olds.splice(0, Math.max(0, olds.length - spec.replicas))) {
      retire(
        p,
        drainingOf(
          p,
          "scale-down",
          `deployment ${name} scaled to ${spec.replicas} during an update`,
        ),
      );
    }
    // Those on schedulable nodes wait first, then the oldest revision, then by id. With no
    // room a waiting one is what a dip lets go (step 4); with maxSurge + maxUnavailable = 1,
    // one waiting on a cordoned node was its only choice, and its freed GPUs took no
    // replacement.
    olds.sort(
      (a, b) =>
        stranded(a) - stranded(b) ||
        a.revision - b.revision ||
        a.replicaId.localeCompare(b.replicaId),
    );
    for (const p of olds.splice(0, room)) {
      retire(p, {
        code: "rollout",
        message: `replaced by a replica at revision ${spec.revision} first (was ${p.revision})`,
        phase: "waiting",
        sinceMs: now,
      });
    }
  }

  // 3. Schedule: the current revision's replicas count, leaving ones hold their GPUs. A
  // planned removal turns into a drain and the plan is made again with it held, so that
  // nothing new is placed on GPUs that still serve.
  let result: ScheduleResult | undefined;
  /** What the last pass asked: a dip's what-if (step 4) asks it again without one replica. */
  let asked: ScheduleInput | undefined;
  // While preempted replicas drain (holding their GPUs), nothing preempts again: the
  // preemptor waits for them rather than evicting more, in this plan and the next ones.
  let preempted = false;
  for (const p of kept.values()) if (p.retirement?.code === "preempted") preempted = true;
  /** Conditions asked for a scale-down's order, once per plan. */
  const conditions = new Map<string, ReplicaCondition>();
  for (let pass = 0; pass < 4; pass++) {
    const deployments = schedulerDeployments(
      input.deployments,
      oldServing,
      preempted,
      input.frozen,
    );
    const placements = pick(kept, fresh);
    asked = {
      nodes: input.nodes,
      deployments,
      placements,
      held: pick(kept, held),
      retired: remove.map((r) => r.placement),
      failing: input.failing,
      avoid: input.avoid,
      notServing: notServingOf(deployments, placements, (id) => {
        let c = conditions.get(id);
        if (c === undefined) {
          c = input.condition(id);
          conditions.set(id, c);
        }
        return c;
      }),
    };
    result = input.schedule(asked);
    let replanned = false;
    if (result.remove.some((r) => r.reason.code === "preempted")) preempted = true;
    const revised = new Map(result.revised.map((p) => [p.replicaId, p.revision]));
    // A move of a replica that keeps failing is decided on this pass's free GPUs. Other
    // removals turn into drains that hold their GPUs in the next pass, where the replacement
    // could then land only on the node it failed on: the move waits for a pass without them.
    const others = result.remove.filter((r) => r.reason.code !== "replica-failed");
    for (const r of others.length > 0 ? others : result.remove) {
      const p = kept.get(r.replicaId);
      if (p === undefined) continue;
      if (held.has(r.replicaId)) {
        // A loss of a held replica: it goes now (a rollout's old one is replaced by the
        // scheduler next pass, since it no longer counts).
        remove.push({ placement: p, reason: r.reason, kind: "lost" });
        kept.delete(r.replicaId);
        held.delete(r.replicaId);
        removeOld(oldServing, p);
        replanned = true;
      } else if (DRAIN_NOW.has(r.reason.code) || MOVE.has(r.reason.code)) {
        leave(p, r.reason, MOVE.has(r.reason.code));
        replanned = true;
      } else {
        remove.push({ placement: p, reason: r.reason, kind: "lost" });
        kept.delete(r.replicaId);
        fresh.delete(r.replicaId);
        replanned = true;
      }
    }
    for (const [id, revision] of revised) {
      const p = kept.get(id);
      if (p !== undefined && p.revision !== revision && fresh.has(id)) {
        kept.set(id, { ...p, revision });
        changed.add(id);
      }
    }
    if (!replanned) break;
  }
  const final = result as ScheduleResult;
  const finalAsked = asked as ScheduleInput;

  // 4. Waiting replicas drain once enough others serve; a deployment that cannot get a
  // replacement lets one go at a time, announced.
  const adds = final.add.map<PlacementRecord>((p) => ({
    replicaId: p.replicaId,
    deployment: p.deployment,
    revision: p.revision,
    ranks: p.ranks.map((r) => ({ rank: r.rank, nodeId: r.nodeId, gpuIndices: [...r.gpuIndices] })),
    fabricId: p.fabricId,
    createdAtMs: now,
  }));
  const unschedulable = new Map(
    final.unschedulable.map((u) => [
      u.deployment,
      { missing: u.missingReplicas, reasons: u.reasons },
    ]),
  );
  // Only deployments with a waiting replica have a step to take.
  const stepping = new Set<string>();
  for (const p of kept.values()) if (p.retirement?.phase === "waiting") stepping.add(p.deployment);
  const byDeployment = new Map<string, PlacementRecord[]>();
  for (const p of stepping.size === 0 ? [] : kept.values()) {
    if (!stepping.has(p.deployment)) continue;
    const list = byDeployment.get(p.deployment) ?? [];
    list.push(p);
    byDeployment.set(p.deployment, list);
  }
  for (const [name, list] of byDeployment) {
    const spec = input.deployments.get(name);
    // A frozen deployment's waiting replica keeps serving: nothing is coming to replace it.
    if (spec === undefined || input.frozen?.has(name) === true) continue;
    const waiting = list
      .filter((p) => p.retirement?.phase === "waiting")
      .sort(
        (a, b) =>
          (a.retirement?.sinceMs ?? 0) - (b.retirement?.sinceMs ?? 0) ||
          a.replicaId.localeCompare(b.replicaId),
      );
    if (waiting.length === 0) continue;
    const { maxUnavailable } = rolloutLimits(spec);
    let serving = 0;
    let coming = false;
    let draining = false;
    for (const p of list) {
      if (p.retirement?.phase === "draining") {
        draining = true;
        continue;
      }
      const condition = input.condition(p.replicaId);
      if (condition === "serving") serving += 1;
      else if (condition === "coming") coming = true;
    }
    if (adds.some((p) => p.deployment === name)) coming = true;
    const floor = spec.replicas - maxUnavailable;
    let advanced = false;
    for (const p of waiting) {
      if (serving - 1 < floor) continue;
      retire(p, drainingOf(p, p.retirement?.code ?? "rollout", p.retirement?.message ?? ""));
      serving -= 1;
      advanced = true;
    }
    // A dip lets go first a replica whose GPUs can take the replacement: one on a node that is
    // cordoned or draining (or down) frees nothing a new replica may use, and the next plan was
    // stuck again, one replica less. Only when every waiting one is such (a node drain) does
    // one of them go.
    const stillWaiting = waiting.filter(
      (p) => kept.get(p.replicaId)?.retirement?.phase === "waiting",
    );
    const stuck = stillWaiting.find((p) => stranded(p) === 0) ?? stillWaiting[0];
    const blocked = unschedulable.get(name)?.reasons;
    if (
      stuck !== undefined &&
      !advanced &&
      !coming &&
      !draining &&
      blocked !== undefined &&
      blocked.length > 0 &&
      dipHelps(input.schedule, finalAsked, final, unschedulable, name, stuck.replicaId)
    ) {
      const why =
        unschedulable
          .get(name)
          ?.reasons.map((r) => r.message)
          .join("; ") ?? "";
      retire(
        stuck,
        drainingOf(stuck, stuck.retirement?.code ?? "rollout", stuck.retirement?.message ?? ""),
      );
      dips.push({
        deployment: name,
        message: `no room for a replacement (${why}): ${stuck.replicaId} drains first, ${serving - 1} of ${spec.replicas} replicas serve until its replacement is ready`,
      });
    }
  }

  const keep = [...kept.values()];
  return {
    keep,
    changed: keep
      .filter((p) => changed.has(p.replicaId))
      .sort((a, b) => a.replicaId.localeCompare(b.replicaId)),
    add: adds,
    remove,
    unschedulable,
    dips,
  };
}

/**
 * Whether letting `stuck` go gets `name` (stuck for want of a replacement) anything, as the
 * scheduler answers the last plan's input again with the GPUs `stuck` holds free. Asked only
 * of a deployment with nothing else to do this plan, and not asked where the answer is known:
 *
 * - `name` would be placed: yes. One that names no GPU class on a mixed fleet has a reason
 *   per class (full H100 nodes: no-free-gpus; L4 nodes too small for it: exceeds-node), and
 *   only the scheduler can tell that the freed GPUs are of a class it fits.
 * - Not placed, but every reason is room (`ROOM_CODES`): yes, unless another deployment short
 *   of replicas would be placed on them instead (it goes first: higher priority, larger). The
 *   next plan gave them to it, the update dipped again, and so drained the deployment down to
 *   nothing. Room the what-if cannot show is still worth a dip: a node drain (the freed GPUs
 *   are on the draining node; the replica leaves anyway), a replacement larger than the
 *   replica (a few dips free enough).
 * - Otherwise no: a replacement that fits nowhere (a GPU class no node has, more GPUs than a
 *   node holds) fits no better on freed GPUs, and draining them anyway took the deployment
 *   down one replica at a time until the rollout's progress deadline rolled it back.
 */
function dipHelps(
  schedule: ScheduleFn,
  asked: ScheduleInput,
  planned: ScheduleResult,
  unschedulable: ReadonlyMap<string, { readonly reasons: readonly Reason[] }>,
  name: string,
  stuck: string,
): boolean {
  const roomOnly = (unschedulable.get(name)?.reasons ?? []).every((r) => ROOM_CODES.has(r.code));
  // No other deployment is short of replicas: none could go onto the freed GPUs first.
  if (roomOnly && unschedulable.size === 1) return true;
  const whatIf = schedule({
    ...asked,
    held: asked.held?.filter((p) => p.replicaId !== stuck),
  });
  const gained = addedPer(whatIf);
  if ((gained.get(name) ?? 0) > 0) return true;
  if (!roomOnly) return false;
  const added = addedPer(planned);
  for (const [deployment, n] of gained) if (n > (added.get(deployment) ?? 0)) return false;
  return true;
}

/** Replicas a plan adds, by deployment. */
function addedPer(result: ScheduleResult): Map<string, number> {
  const out = new Map<string, number>();
  for (const p of result.add) out.set(p.deployment, (out.get(p.deployment) ?? 0) + 1);
  return out;
}

/** The retirement's reason as a scheduler-style reason. */
function reasonOf(r: RetirementRecord): Reason {
  return { code: r.code, message: r.message };
}

/**
 * The placed replicas that serve nothing now, of deployments with more placed than wanted
 * (only a scale-down reads them): failed first, then starting, unhealthy or unreported, so
 * that a scale-down never drains a serving replica while one of these stays.
 */
function notServingOf(
  deployments: readonly SchedulerDeployment[],
  placements: readonly PlacementRecord[],
  condition: (replicaId: string) => ReplicaCondition,
): NonNullable<ScheduleInput["notServing"]> {
  const placed = new Map<string, number>();
  for (const p of placements) placed.set(p.deployment, (placed.get(p.deployment) ?? 0) + 1);
  const surplus = new Set<string>();
  for (const d of deployments) if ((placed.get(d.name) ?? 0) > d.replicas) surplus.add(d.name);
  if (surplus.size === 0) return [];
  const out: { replicaId: string; failed: boolean }[] = [];
  for (const p of placements) {
    if (!surplus.has(p.deployment)) continue;
    const c = condition(p.replicaId);
    if (c !== "serving") out.push({ replicaId: p.replicaId, failed: c === "failed" });
  }
  return out;
}

function pick(from: ReadonlyMap<string, PlacementRecord>, ids: ReadonlySet<string>) {
  const out: PlacementRecord[] = [];
  for (const id of ids) {
    const p = from.get(id);
    if (p !== undefined) out.push(p);
  }
  return out;
}

function removeOld(oldServing: Map<string, PlacementRecord[]>, p: PlacementRecord): void {
  const list = oldServing.get(p.deployment);
  if (list === undefined) return;
  const i = list.findIndex((q) => q.replicaId === p.replicaId);
  if (i >= 0) list.splice(i, 1);
}

/**
 * The scheduler's view of each spec. Ready replicas of an older revision still count during
 * a rolling update (they are held, not placed): the scheduler is asked for that many fewer.
 */
function schedulerDeployments(
  specs: ReadonlyMap<string, DeploymentSpec>,
  oldServing: ReadonlyMap<string, readonly PlacementRecord[]>,
  noPreemption: boolean,
  frozen: ReadonlySet<string> | undefined,
): SchedulerDeployment[] {
  const out: SchedulerDeployment[] = [];
  for (const spec of specs.values()) {
    // Not asked for: its replicas are all held, and none is to be added.
    if (frozen?.has(spec.name) === true) continue;
    let d = schedulerDeployment(spec);
    const olds = oldServing.get(spec.name)?.length ?? 0;
    if (olds > 0) d = { ...d, replicas: Math.max(0, d.replicas - olds) };
    if (noPreemption && d.allowPreemption) d = { ...d, allowPreemption: false };
    out.push(d);
  }
  return out;
}

/** The scheduler's view of a spec, one object per spec object (reconciles reuse it). */
const schedulerDeploymentCache = new WeakMap<DeploymentSpec, SchedulerDeployment>();
function schedulerDeployment(spec: DeploymentSpec): SchedulerDeployment {
  let d = schedulerDeploymentCache.get(spec);
  if (d === undefined) {
    d = {
      name: spec.name,
      revision: spec.revision,
      gpuClass: spec.gpuClass,
      gpusPerReplica: deploymentGpusPerReplica(spec),
      replicas: spec.replicas,
      nodesPerReplica: spec.nodesPerReplica,
      fabric: spec.fabric,
      multiNode: engineSupportsMultiNode(spec.engine),
      priority: spec.priority,
      allowPreemption: spec.allowPreemption,
    };
    schedulerDeploymentCache.set(spec, d);
  }
  return d;
}
