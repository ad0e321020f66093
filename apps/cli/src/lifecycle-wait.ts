import { toJson } from "@bufbuild/protobuf";
import { type CallOptions, Code, ConnectError } from "@connectrpc/connect";
import {
  type DeploymentStatus,
  DeploymentStatusSchema,
  type Node,
  type Replica,
} from "@llmgw/proto";
import { classifyControlPlaneError } from "@llmgw/wire";
import { ADMIN_CALL_TIMEOUT_MS, type AdminContext } from "./admin-client.js";
import { rolloutText } from "./cluster-format.js";
import { type CliIo, UsageError } from "./command.js";
import {
  drainProgress,
  leftText,
  onNode,
  type ReplicaSnapshot,
  replicaProgressLines,
  retiringSummary,
  rolledBack,
  rolloutDone,
  rolloutProgress,
} from "./lifecycle-progress.js";
import { formatDuration, terminalText } from "./table.js";

/*
 * The `--wait` loops of `llmgw deploy`, `scale`, `undeploy` and `drain`: poll the control
 * plane every 500 ms, print what moved (lifecycle-progress.ts decides the lines) to stderr,
 * and end with an exit code: 0 done, 1 failed or timed out, 130 interrupted.
 */

/** Longest `--timeout` a wait takes: a day. */
const MAX_WAIT_S = 86_400;

/** What `--timeout S` means, for every `--wait` command's usage. */
export const WAIT_TIMEOUT_HELP = `seconds --wait waits (default 900, at most ${MAX_WAIT_S})`;

/** The `--wait` and `--timeout S` flags of the commands that follow a change. */
export const WAIT_FLAGS = {
  wait: { type: "boolean" },
  timeout: { type: "string" },
} as const;

/**
 * `--timeout` of {@link WAIT_FLAGS} in milliseconds ({@link parseWaitTimeoutMs}); a usage
 * error when it comes without `--wait`.
 */
export function waitTimeoutMs(values: { wait?: boolean; timeout?: string }): number {
  if (values.timeout !== undefined && !values.wait)
    throw new UsageError("--timeout applies only with --wait");
  return parseWaitTimeoutMs(values.timeout);
}

/**
 * `--timeout S` in milliseconds: whole seconds 0–86400, default 900 (15 minutes, a large
 * model's load). A usage error names the flag and echoes the value.
 */
export function parseWaitTimeoutMs(value: string | undefined): number {
  if (value === undefined) return 900_000;
  if (!/^\d{1,6}$/.test(value) || Number(value) > MAX_WAIT_S)
    throw new UsageError(`--timeout must be whole seconds 0–${MAX_WAIT_S}, got "${value}"`);
  return Number(value) * 1000;
}

/** How often the waits ask the control plane. */
const POLL_MS = 500;

/** The least time one read gets, even at the wait's timeout: `--timeout 0` still looks once. */
const MIN_READ_MS = 2_000;

const FAILED_CODE = "LLMGW_CONTROL_PLANE_REPLICA_FAILED";

/** Waits `ms`, or less when `signal` aborts. */
function pause(signal: AbortSignal, ms: number): Promise<void> {
  return new Promise<void>((r) => {
    if (signal.aborted) return r();
    // One listener at a time: a wait of many polls must not pile them up on the signal.
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      r();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

/** One wait: what to ask, what each answer means, and what to say when time runs out. */
interface FollowSpec<T> {
  readonly timeoutMs: number;
  /** Printed when Ctrl-C stops the wait, e.g. "the deployment keeps rolling out". */
  readonly goesOn: string;
  /** One read; `call` carries its deadline and `io.signal`, to pass to the client. */
  readonly read: (call: CallOptions) => Promise<T>;
  /** Handles one answer: an exit code ends the wait, undefined asks again. */
  readonly step: (answer: T, nowMs: number, elapsedMs: number) => number | undefined;
  /** Says what is left once `timeoutMs` passed; returns the exit code. */
  readonly timedOut: (last: T, nowMs: number, elapsedMs: number) => number;
}

/** How long {@link callAgainAfterBreak} keeps asking: a leader lease (2 s) and more to spare. */
const BROKEN_CALL_WINDOW_MS = 30_000;

/**
 * Calls `call` — one that is safe to repeat, such as applying a declarative spec — and, when its
 * connection broke mid-call (the leader died, so it may or may not have run: the failover
 * transport will not guess), asks again until a control plane answers, for at most 30 s. A
 * refusal, or a control plane that never took the call, is thrown at once as before.
 */
export async function callAgainAfterBreak<T>(
  io: CliIo,
  what: string,
  call: () => Promise<T>,
  windowMs = BROKEN_CALL_WINDOW_MS,
): Promise<T> {
  let brokeAt: number | undefined;
  for (;;) {
    try {
      return await call();
    } catch (error) {
      const verdict = classifyControlPlaneError(error);
      if (brokeAt === undefined && verdict.action !== "move") throw error;
      if (verdict.action === "stay" || io.signal.aborted) throw error;
      const now = Date.now();
      if (brokeAt === undefined) {
        brokeAt = now;
        io.stderr.write(
          `${terminalText(`the control plane's connection broke during ${what} (${verdict.why}); asking again`)}\n`,
        );
      } else if (now - brokeAt >= windowMs) throw error;
      await pause(io.signal, POLL_MS);
    }
  }
}

/**
 * The polling loop every wait shares. A control plane restarting, handing the lead over or
 * not answering only delays the wait (the change goes on without us; each read is safe to
 * repeat), with one line when it stops and one when it answers again. Each read ends by the
 * wait's timeout (or within {@link ADMIN_CALL_TIMEOUT_MS}, to ask again) and at Ctrl-C, so
 * a frozen leader cannot hold the wait past either. At the timeout the last answer says how
 * far it got; a refusal that asking again cannot fix (bad token, unknown name), or an outage
 * past the timeout with no answer at all, is thrown for `runAdmin` to print.
 */
async function follow<T>(
  ctx: AdminContext,
  io: CliIo,
  out: (line: string) => void,
  spec: FollowSpec<T>,
): Promise<number> {
  const started = Date.now();
  let last: { readonly answer: T } | undefined;
  let waitingOut = false;
  for (;;) {
    if (io.signal.aborted) {
      out(`interrupted; ${spec.goesOn}`);
      return 130;
    }
    const leftMs = spec.timeoutMs - (Date.now() - started);
    let answer: T;
    try {
      answer = await spec.read({
        signal: io.signal,
        timeoutMs: Math.min(Math.max(leftMs, MIN_READ_MS), ADMIN_CALL_TIMEOUT_MS),
      });
    } catch (error) {
      if (io.signal.aborted) continue;
      const noAnswer = ConnectError.from(error).code === Code.DeadlineExceeded;
      if (!noAnswer && classifyControlPlaneError(error).action === "stay") throw error;
      const now = Date.now();
      if (now - started >= spec.timeoutMs) {
        if (last === undefined) throw error;
        return spec.timedOut(last.answer, now, now - started);
      }
      if (!waitingOut)
        out(`control plane unavailable (${ConnectError.from(error).rawMessage}); still waiting`);
      waitingOut = true;
      await pause(io.signal, POLL_MS);
      continue;
    }
    if (waitingOut) out(`control plane ${ctx.url} answers again`);
    waitingOut = false;
    last = { answer };
    const now = Date.now();
    const code = spec.step(answer, now, now - started);
    if (code !== undefined) return code;
    // At the timeout, not past it: `--timeout 0` looks once.
    if (now - started >= spec.timeoutMs) return spec.timedOut(answer, now, now - started);
    await pause(io.signal, POLL_MS);
  }
}

/** Everything the waits print carries cluster text (reasons, messages, log tails). */
function printer(io: CliIo): (line: string) => void {
  return (line) => io.stderr.write(`${terminalText(line)}\n`);
}

/** Prints `text` through `out` when it differs from what `last` holds; returns the new value. */
function onChange(out: (line: string) => void, last: string, text: string): string {
  if (text !== last && text !== "") out(text);
  return text;
}

/** What {@link waitForRollout} follows. */
export interface RolloutWait {
  readonly name: string;
  /** The spec revision the replicas must run (what the apply or scale answered). */
  readonly revision: bigint;
  readonly timeoutMs: number;
  /** "rolling out" (deploy) or "scaling" (scale), for the line Ctrl-C prints. */
  readonly doing: string;
}

/**
 * Follows a deployment until every replica runs `revision`, is ready, and none is leaving
 * (exit 0; with `--json` the final status goes to stdout). Prints each replica's steps
 * (placed → loading → ready; an old one waiting → draining with its in-flight count →
 * stopped), the rollout's state when it changes, a progress line ("2/4 ready at revision 3,
 * 1 draining") when it changes, and the scheduler's reasons when replicas cannot be placed.
 * Exit 1 when the rollout to `revision` was rolled back (with its message), when a replica
 * failed (with its engine's lines), when another change replaced `revision`, or on timeout.
 */
export function waitForRollout(ctx: AdminContext, io: CliIo, wait: RolloutWait): Promise<number> {
  const out = printer(io);
  const { name, revision } = wait;
  let prev: ReplicaSnapshot | undefined;
  let shownReasons = "";
  let shownRollout = "";
  let shownProgress = "";
  return follow<DeploymentStatus>(ctx, io, out, {
    timeoutMs: wait.timeoutMs,
    goesOn: `the deployment keeps ${wait.doing}`,
    async read(call) {
      const d = (await ctx.client.getDeployment({ name }, call)).deployment;
      if (!d) throw new Error(`deployment ${name} disappeared`);
      return d;
    },
    step(d, now, elapsedMs) {
      const reasons = d.unschedulable
        .filter((r) => r.code !== FAILED_CODE)
        .map((r) => r.message)
        .join("; ");
      if (reasons !== shownReasons && reasons)
        out(`${name}: cannot place every replica: ${reasons}`);
      shownReasons = reasons;
      const snapshot = { replicas: d.replicas, atMs: now };
      for (const line of replicaProgressLines(prev, snapshot)) out(line);
      prev = snapshot;
      // Only the rollout to this revision is news; an older one's outcome was shown before.
      const rollout = d.rollout?.toRevision === revision ? d.rollout : undefined;
      shownRollout = onChange(out, shownRollout, rollout ? `${name}: ${rolloutText(rollout)}` : "");
      // `failed` apart from placement problems; a control plane before it lists them only
      // among the unschedulable reasons.
      const failed =
        d.failed.length > 0 ? d.failed : d.unschedulable.filter((r) => r.code === FAILED_CODE);
      for (const f of failed) out(f.message);
      if (rolledBack(d.rollout, revision)) {
        out(`${name}: revision ${revision} did not roll out; see 'llmgw events'`);
        return 1;
      }
      if (failed.length > 0) {
        out(
          `${name}: ${failed.length} replica(s) failed; see 'llmgw events' and the agent's engine logs`,
        );
        return 1;
      }
      const current = d.spec?.revision;
      if (current !== undefined && current !== revision) {
        out(`${name}: revision ${current} replaced revision ${revision} while waiting`);
        return 1;
      }
      if (rolloutDone(d, revision)) {
        out(
          `${name}: ${d.readyReplicas}/${d.desiredReplicas} ready after ${formatDuration(elapsedMs)}`,
        );
        if (ctx.json)
          io.stdout.write(`${JSON.stringify(toJson(DeploymentStatusSchema, d), null, 2)}\n`);
        return 0;
      }
      shownProgress = onChange(out, shownProgress, rolloutProgress(d, revision));
      return undefined;
    },
    timedOut(d, _now, elapsedMs) {
      out(
        `${name}: timed out after ${formatDuration(elapsedMs)}: ${rolloutProgress(d, revision)}${
          shownReasons ? `; ${shownReasons}` : ""
        }`,
      );
      return 1;
    },
  });
}

/** What {@link waitForDrain} follows: the node as the drain call answered it. */
export interface DrainWait {
  readonly node: Node;
  readonly timeoutMs: number;
}

/**
 * Follows a node's drain until no replica has a rank on it (exit 0). Follows every
 * deployment with a replica on the node: its replacements (placed → ready elsewhere) and the
 * node's own replicas (waiting → draining with their in-flight count → stopped), with a
 * progress line ("gpu-07: 2 replica(s) left (1 draining, 3 in flight); 1 ready elsewhere")
 * when it changes. Exit 1 on timeout, naming each replica left.
 */
export function waitForDrain(ctx: AdminContext, io: CliIo, wait: DrainWait): Promise<number> {
  const out = printer(io);
  const { nodeId } = wait.node;
  const label = wait.node.hostname || nodeId;
  const followed = new Set<string>();
  let prev: ReplicaSnapshot | undefined;
  let shownProgress = "";
  return follow<readonly Replica[]>(ctx, io, out, {
    timeoutMs: wait.timeoutMs,
    goesOn: "the node keeps draining",
    async read(call) {
      return (await ctx.client.listReplicas({}, call)).replicas;
    },
    step(all, now, elapsedMs) {
      for (const r of all) if (onNode(r, nodeId)) followed.add(r.deployment);
      const replicas = all.filter((r) => followed.has(r.deployment));
      const snapshot = { replicas, atMs: now };
      for (const line of replicaProgressLines(prev, snapshot)) out(line);
      prev = snapshot;
      if (!replicas.some((r) => onNode(r, nodeId))) {
        out(`${label}: no replica left on the node after ${formatDuration(elapsedMs)}`);
        return 0;
      }
      shownProgress = onChange(out, shownProgress, drainProgress(label, replicas, nodeId));
      return undefined;
    },
    timedOut(all, now, elapsedMs) {
      const left = all.filter((r) => onNode(r, nodeId));
      out(
        `${label}: timed out after ${formatDuration(elapsedMs)} with ${left.length} replica(s) on the node: ${leftText(left, now)}`,
      );
      return 1;
    },
  });
}

/** What {@link waitForReplicasGone} follows. */
export interface UndeployWait {
  readonly deployment: string;
  readonly timeoutMs: number;
}

/**
 * Follows a deleted deployment's replicas until none is listed (exit 0): each one's steps
 * (draining with its in-flight count → stopped) and a progress line ("chat: 2 replica(s)
 * left (2 draining, 3 in flight)") when it changes. Exit 1 on timeout, naming each replica
 * left.
 */
export function waitForReplicasGone(
  ctx: AdminContext,
  io: CliIo,
  wait: UndeployWait,
): Promise<number> {
  const out = printer(io);
  const name = wait.deployment;
  let prev: ReplicaSnapshot | undefined;
  let shownProgress = "";
  return follow<readonly Replica[]>(ctx, io, out, {
    timeoutMs: wait.timeoutMs,
    goesOn: "the replicas keep stopping",
    async read(call) {
      return (await ctx.client.listReplicas({ deployment: name }, call)).replicas;
    },
    step(replicas, now, elapsedMs) {
      const snapshot = { replicas, atMs: now };
      for (const line of replicaProgressLines(prev, snapshot)) out(line);
      prev = snapshot;
      if (replicas.length === 0) {
        out(`${name}: every replica stopped after ${formatDuration(elapsedMs)}`);
        return 0;
      }
      const retiring = retiringSummary(replicas);
      shownProgress = onChange(
        out,
        shownProgress,
        `${name}: ${replicas.length} replica(s) left${retiring ? ` (${retiring})` : ""}`,
      );
      return undefined;
    },
    timedOut(replicas, now, elapsedMs) {
      out(
        `${name}: timed out after ${formatDuration(elapsedMs)} with ${replicas.length} replica(s) left: ${leftText(replicas, now)}`,
      );
      return 1;
    },
  });
}
