import { createHash, randomBytes } from "node:crypto";
import { mkdirSync } from "node:fs";
import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { create, fromJsonString, toJson, toJsonString } from "@bufbuild/protobuf";
import type { NodeInventory } from "@llmgw/discovery";
import {
  buildLaunchSpec,
  type DeploymentSpec,
  type LaunchSpec,
  NOT_LAUNCHED_FIELDS,
  type NodeEngineConfig,
  parseDeploymentSpec,
  SECRET_ENV_NAMES,
  validateLaunch,
} from "@llmgw/engines";
import { createKvBlockFeed, type KvBlockFeed, type KvFeedRegistry } from "@llmgw/kv-events";
import {
  type EngineCredential,
  EngineCredentialSchema,
  EngineLoadSchema,
  ExitInfoSchema,
  ReplicaState as ProtoReplicaState,
  type ReplicaAssignment,
  ReplicaAssignmentSchema,
  type ReplicaStatus,
  ReplicaStatusSchema,
} from "@llmgw/proto";
import type { EngineLoad } from "@llmgw/readiness";
import {
  createSupervisedReplica,
  freePort,
  hashProcessSpec,
  type ProbeOutcome,
  type ProcessSpec,
  type ReplicaState,
  type RestartPolicyOptions,
  type SupervisedReplica,
  type Supervisor,
  type SupervisorLogger,
} from "@llmgw/supervisor";
import { deploymentInputFromProto, deploymentSpecFromProto } from "@llmgw/wire";
import { AgentError } from "./errors.js";
import { withoutKernelLogFaults } from "./launch-health.js";
import { checkModelRoot } from "./model-root.js";
import { createRedactor } from "./redact.js";

/** Load signals of one engine; every field absent when not reported. */
export type EngineLoadSignals = EngineLoad;

/** The last load scrape of one ready rank-0 engine (see {@link ReplicaManager.loadSamples}). */
export interface ReplicaLoadSample {
  readonly replicaId: string;
  /** What the engine reported; undefined when the scrape failed or it reported no signal. */
  readonly load: EngineLoadSignals | undefined;
  /** When the scrape finished (epoch ms). */
  readonly scrapedAtMs: number;
}

/** How the agent asks an engine whether it is up and loaded, and how busy it is. */
export interface EngineProbes {
  /** One readiness probe against `baseUrl` (health + models), with the engine's key if any. */
  probe(
    baseUrl: string,
    readiness: NonNullable<LaunchSpec["readiness"]>,
    timeoutMs: number,
    apiKey: string | undefined,
  ): Promise<ProbeOutcome>;
  /** Scrapes `/metrics` into load signals; rejects or returns {} when unavailable. */
  scrapeLoad(
    metricsUrl: string,
    timeoutMs: number,
    apiKey: string | undefined,
  ): Promise<EngineLoadSignals>;
}

export interface ReplicaManagerOptions {
  readonly supervisor: Supervisor;
  readonly stateDir: string;
  /** The node as discovered (engines read GPUs and fabrics from it). */
  readonly inventory: () => NodeInventory;
  readonly nodeConfig: NodeEngineConfig;
  readonly probes: EngineProbes;
  /** Environment every engine starts from (PATH, HOME, …); llmgw's variables go on top. */
  readonly baseEnv: Readonly<Record<string, string>>;
  /** Secret variables (HF_TOKEN…) added at spawn time, never logged or reported. */
  readonly secretEnv: Readonly<Record<string, string>>;
  readonly logger: SupervisorLogger;
  readonly probeIntervalMs: number;
  readonly probeTimeoutMs: number;
  readonly defaultLoadingDeadlineMs: number;
  /** Address probes and scrapes use to reach local engines (IPv6 without brackets). */
  readonly localAddress: string;
  /**
   * The operator's `--model-root`, resolved with realpath: a deployment whose model is a
   * local path must resolve inside it, or the replica fails (see {@link checkModelRoot}).
   */
  readonly modelRoot?: string;
  /**
   * The operator's `--allow-trust-remote-code`: without it a deployment that sets
   * `trustRemoteCode` fails on this node, since the flag makes the engine run Python from the
   * model repository, which a deployment author would then choose.
   */
  readonly allowTrustRemoteCode?: boolean;
  /** The supervisor's restart policy for every engine (default: its defaults). */
  readonly restartPolicy?: RestartPolicyOptions;
  /**
   * When a `failed` replica is launched afresh (default: {@link RELAUNCH_DEFAULTS}); see
   * {@link RelaunchPolicy}.
   */
  readonly relaunch?: RelaunchPolicy;
}

/**
 * A replica is `failed` when its restart policy gave up (5 quick crashes, ~30 s), its
 * loading deadline passed, or its engine could not be spawned. The cause may be gone minutes
 * later (GPU memory a dying process held, a model path on a mount that came back, a port
 * something else held, a full disk, an engine installed after the agent started), so the agent
 * launches it afresh — a new port, a fresh restart budget — after `firstDelayMs`, then after
 * twice as long each time up to `maxDelayMs`, as kubelet backs off a crash loop. A replica
 * that then stays ready for `stableMs` starts over at the first delay.
 */
export interface RelaunchPolicy {
  /** Wait after the first failure; 0: never relaunch (the replica stays `failed`). */
  readonly firstDelayMs: number;
  readonly maxDelayMs: number;
  readonly stableMs: number;
}

/** `--relaunch-failed 60`: a minute, then 2, 4, … 30; reset after 10 ready minutes. */
export const RELAUNCH_DEFAULTS: RelaunchPolicy = {
  firstDelayMs: 60_000,
  maxDelayMs: 1_800_000,
  stableMs: 600_000,
};

/** The wait before relaunch number `attempt` (0 for the first): doubling, capped. */
export function relaunchDelayMs(policy: RelaunchPolicy, attempt: number): number {
  const cap = Math.max(policy.firstDelayMs, policy.maxDelayMs);
  return Math.min(cap, policy.firstDelayMs * 2 ** Math.min(attempt, 30));
}

/**
 * What of an assignment decides the engine process: all of it but the spec fields engines
 * never see (`NOT_LAUNCHED_FIELDS`, shared with the control plane's rolling updates).
 */
function launchKey(assignment: ReplicaAssignment): string {
  const json = toJson(ReplicaAssignmentSchema, assignment) as {
    deployment?: Record<string, unknown>;
  };
  if (json.deployment !== undefined) {
    for (const field of NOT_LAUNCHED_FIELDS) delete json.deployment[field];
  }
  return JSON.stringify(json);
}

/** Everything the agent keeps about one replica rank it runs. */
interface Managed {
  readonly key: string;
  /** Replaced in place by one that runs the same process (a scale, a routing change). */
  assignment: ReplicaAssignment;
  readonly launch: LaunchSpec;
  readonly specHash: string;
  readonly apiPort: number;
  readonly replica: SupervisedReplica;
  stateSinceMs: number;
  message: string;
  load: EngineLoadSignals | undefined;
  /** When {@link load} was last scraped (epoch ms); undefined until a scrape while ready. */
  loadScrapedAtMs: number | undefined;
  restarts: number;
  /**
   * The API key of the serving engine process running now, drawn at its launch (see
   * {@link generateEngineApiKey}); undefined for ranks that serve no API and engines that
   * take no key. Reported to the control plane, never logged.
   */
  apiKey: string | undefined;
  /**
   * Its engine's KV-cache events, subscribed from the endpoint it publishes on (a `kvEvents`
   * deployment's serving rank); served to routers by `KvCacheService`.
   */
  readonly kvFeed: KvBlockFeed | undefined;
  /**
   * Set on an engine adopted from a spec this release refuses (an engine flag or env name it
   * took over since an older release launched it; see {@link ReplicaManager.adoptPrevious}):
   * why it is never launched again, reported with its status. Its replica is `adoptOnly`.
   */
  readonly refused: string | undefined;
}

/** A replica the agent could not even start (bad spec, failed validation, spawn failed). */
interface Rejected {
  readonly assignment: ReplicaAssignment;
  readonly message: string;
  readonly atMs: number;
  /** Restarts of the replica before this launch, carried to the next one. */
  readonly restarts: number;
}

/**
 * What is persisted per replica so a restarted agent can adopt the same process, in an
 * owner-only file (0600 in a 0700 directory) because it holds the engine's API key.
 */
interface ReplicaRecord {
  readonly version: 1;
  readonly assignment: string;
  readonly apiPort: number;
  /** Key of the engine process running now; rewritten before every launch. */
  readonly engineApiKey?: string;
}

const PROTO_STATE: Readonly<Record<ReplicaState, ProtoReplicaState>> = {
  starting: ProtoReplicaState.STARTING,
  loading: ProtoReplicaState.LOADING,
  ready: ProtoReplicaState.READY,
  unhealthy: ProtoReplicaState.UNHEALTHY,
  stopping: ProtoReplicaState.STOPPING,
  exited: ProtoReplicaState.EXITED,
  failed: ProtoReplicaState.FAILED,
};

/**
 * Converges the node on the control plane's desired replica set: launches what is missing,
 * replaces what changed, stops what is no longer wanted, and adopts what a previous agent
 * left running. Never stops anything because the control plane is unreachable: it only acts
 * on a desired set it actually received.
 */
export class ReplicaManager {
  readonly #managed = new Map<string, Managed>();
  readonly #rejected = new Map<string, Rejected>();
  /** In-flight stops by replica id: a replacement waits for its predecessor to be gone. */
  readonly #stopping = new Map<string, Promise<void>>();
  #applying: Promise<void> = Promise.resolve();
  #loadTimer: NodeJS.Timeout | undefined;
  /** Replicas whose load scrape is in flight: one scrape per engine at a time. */
  readonly #scraping = new Set<Managed>();
  /** The port `KvCacheService` listens on (`--kv-listen`); undefined: none runs. */
  #kvEventsPort: number | undefined;
  /**
   * Failed replicas waiting to be launched afresh, and how often each was since it last
   * stayed ready for the relaunch policy's `stableMs`; by replica id.
   */
  readonly #relaunches = new Map<
    string,
    { attempts: number; timer: NodeJS.Timeout | undefined; atMs: number | undefined }
  >();

  constructor(private readonly options: ReplicaManagerOptions) {}

  private get recordsDir(): string {
    return path.join(this.options.stateDir, "replicas");
  }

  /**
   * Re-attaches to replicas a previous agent process started: each persisted record is
   * rebuilt into the same launch spec and adopted when its process is alive and matches,
   * launched afresh otherwise. A replica that cannot be launched either (its program gone, a
   * mount not back) is reported FAILED and launched again later, as in {@link apply}; the
   * other records are still adopted. Returns the replica ids adopted.
   *
   * A record whose spec this release refuses only for its policy rules (an engine flag or env
   * name taken over since an older release accepted the spec: `parseDeploymentSpec`'s
   * `policy: "report"`) is adopted all the same when its engine runs, with the refusal in its
   * status, and never launched: when that engine is gone, or exits later, the replica is
   * FAILED with the refusal until a corrected assignment replaces it. A record the agent
   * refuses to run at all (unreadable, a spec broken otherwise, a launch this node refuses)
   * is FAILED, and the engine a previous agent left running for it, if still the process it
   * launched, is stopped rather than left holding its GPUs unsupervised.
   */
  async adoptPrevious(): Promise<string[]> {
    let names: string[] = [];
    try {
      names = (await readdir(this.recordsDir)).filter((n) => n.endsWith(".json"));
    } catch {
      return [];
    }
    const adopted: string[] = [];
    for (const name of names.sort()) {
      const file = path.join(this.recordsDir, name);
      let record: ReplicaRecord;
      let assignment: ReplicaAssignment;
      try {
        record = JSON.parse(await readFile(file, "utf8")) as ReplicaRecord;
        assignment = fromJsonString(ReplicaAssignmentSchema, record.assignment);
      } catch (error) {
        this.options.logger.warn("ignoring an unreadable replica record", {
          file,
          error: (error as Error).message,
        });
        await rm(file, { force: true });
        this.#stopLeftover(name.slice(0, -".json".length));
        continue;
      }
      const managed = this.#prepare(assignment, record.apiPort, { apiKey: record.engineApiKey });
      if (!managed) {
        this.#stopLeftover(assignment.replicaId);
        continue;
      }
      try {
        await managed.replica.start({ adopt: true });
      } catch (cause) {
        this.#launchFailed(managed, cause);
        continue;
      }
      if (!managed.replica.handle?.adopted) continue;
      adopted.push(managed.key);
      if (managed.refused !== undefined) {
        this.options.logger.warn("adopted an engine whose deployment spec this release refuses", {
          replicaId: managed.key,
          pid: managed.replica.handle.pid,
          code: "LLMGW_ENGINES_INVALID_SPEC",
          error: managed.refused,
        });
      }
    }
    return adopted;
  }

  /**
   * Stops in the background the engine a previous agent left running for replica `key`,
   * which this agent does not run (see {@link adoptPrevious}): only the process its pid file
   * names, still the same (`Supervisor.stopLeftover`), never one a replica of this agent
   * holds. A launch for `key` waits for it, like for a retired replica's stop.
   */
  #stopLeftover(key: string): void {
    const previous = this.#stopping.get(key) ?? Promise.resolve();
    const done: Promise<void> = previous
      .then(async () => {
        if (this.#managed.has(key) || this.options.supervisor.get(key) !== undefined) return;
        const report = await this.options.supervisor.stopLeftover(key);
        if (report !== undefined) {
          this.options.logger.warn("stopped an engine left running for a replica not run", {
            replicaId: key,
            forced: report.forced,
          });
        }
      })
      .catch((error: unknown) => {
        this.options.logger.warn("could not stop an engine left running", {
          replicaId: key,
          error: (error as Error).message,
        });
      })
      .finally(() => {
        if (this.#stopping.get(key) === done) this.#stopping.delete(key);
      });
    this.#stopping.set(key, done);
  }

  /** Applies one desired set (serialised: a slow apply never overlaps the next). */
  apply(assignments: readonly ReplicaAssignment[]): Promise<void> {
    const next = this.#applying.then(() => this.#apply(assignments));
    this.#applying = next.catch(() => {});
    return next;
  }

  async #apply(assignments: readonly ReplicaAssignment[]): Promise<void> {
    const wanted = new Map(assignments.map((a) => [a.replicaId, a]));
    for (const [key, managed] of this.#managed) {
      const desired = wanted.get(key);
      if (!desired) {
        this.#retire(managed, "no longer assigned to this node");
        continue;
      }
      if (launchKey(desired) !== launchKey(managed.assignment)) {
        this.#retire(managed, "assignment changed; replacing the replica");
      } else if (
        toJsonString(ReplicaAssignmentSchema, desired) !==
        toJsonString(ReplicaAssignmentSchema, managed.assignment)
      ) {
        // Only what the engine never sees changed (the replica count after a scale, the
        // routing policy, a revision that changed nothing else): the engine keeps running,
        // and reports the new revision.
        managed.assignment = desired;
        await this.#persist(managed);
      }
    }
    for (const key of this.#rejected.keys()) {
      if (wanted.has(key)) continue;
      this.#rejected.delete(key);
      // Its launch persisted a record (or a previous agent did) that nothing else removes: a
      // restarted agent would launch the withdrawn replica again.
      await rm(this.#recordPath(key), { force: true });
      // And an engine a previous agent left for it must not outlive it (stopped already when
      // the adoption refused it: this finds none then).
      this.#stopLeftover(key);
    }
    for (const [key, assignment] of wanted) {
      if (this.#managed.has(key)) continue;
      const rejected = this.#rejected.get(key);
      if (
        rejected &&
        toJsonString(ReplicaAssignmentSchema, rejected.assignment) ===
          toJsonString(ReplicaAssignmentSchema, assignment)
      ) {
        continue;
      }
      // A new or changed assignment starts the relaunch backoff over.
      this.#forgetRelaunch(key);
      await this.#launch(assignment, 0);
    }
    for (const key of this.#relaunches.keys()) if (!wanted.has(key)) this.#forgetRelaunch(key);
  }

  /** Launches `assignment` on a port drawn now; a launch that throws is rejected. */
  async #launch(assignment: ReplicaAssignment, restarts: number): Promise<void> {
    const key = assignment.replicaId;
    // A replacement (changed assignment, re-placed after a removal, relaunched after failing)
    // must not race its predecessor's stop for the same pid file and supervisor slot.
    await this.#stopping.get(key);
    const port = await freePort();
    const managed = this.#prepare(assignment, port);
    if (!managed) return;
    managed.restarts = restarts;
    try {
      await this.#persist(managed);
      await managed.replica.start({ adopt: true });
    } catch (cause) {
      this.#launchFailed(managed, cause);
    }
  }

  /**
   * Rejects `managed`, whose record or spawn failed (a full disk, a missing program): it is
   * launched again as a failed engine would be, since the node may be fixed meanwhile.
   */
  #launchFailed(managed: Managed, cause: unknown): void {
    const key = managed.key;
    const error = new AgentError(
      "LLMGW_AGENT_LAUNCH_FAILED",
      `launch failed: ${(cause as Error).message}`,
      { cause },
    );
    this.options.logger.warn("replica failed to launch", {
      replicaId: key,
      code: error.code,
      error: error.message,
    });
    this.#managed.delete(key);
    void managed.kvFeed?.close();
    const rejected = {
      assignment: managed.assignment,
      message: error.message,
      atMs: Date.now(),
      restarts: managed.restarts,
    };
    this.#rejected.set(key, rejected);
    this.#scheduleRelaunch(key, rejected);
  }

  /** The relaunch policy in force; undefined when failed replicas stay failed. */
  get #relaunchPolicy(): RelaunchPolicy | undefined {
    const policy = this.options.relaunch ?? RELAUNCH_DEFAULTS;
    return policy.firstDelayMs > 0 ? policy : undefined;
  }

  /**
   * Schedules the relaunch of replica `key`, whose engine just failed or could not be spawned
   * (`failed`; see {@link RelaunchPolicy}).
   */
  #scheduleRelaunch(key: string, failed: Managed | Rejected): void {
    const policy = this.#relaunchPolicy;
    if (policy === undefined) return;
    const entry = this.#relaunches.get(key) ?? {
      attempts: 0,
      timer: undefined,
      atMs: undefined,
    };
    if (entry.timer !== undefined) clearTimeout(entry.timer);
    const delayMs = relaunchDelayMs(policy, entry.attempts);
    entry.atMs = Date.now() + delayMs;
    entry.timer = setTimeout(() => {
      entry.timer = undefined;
      entry.atMs = undefined;
      const run = this.#applying.then(() => this.#relaunch(key, failed));
      this.#applying = run.catch((error: unknown) => {
        this.options.logger.warn("relaunching a failed replica failed", {
          replicaId: key,
          error: (error as Error).message,
        });
      });
    }, delayMs);
    entry.timer.unref();
    this.#relaunches.set(key, entry);
  }

  /** Launches a failed replica afresh, unless it was withdrawn or replaced meanwhile. */
  async #relaunch(key: string, failed: Managed | Rejected): Promise<void> {
    const entry = this.#relaunches.get(key);
    const ran = "replica" in failed ? failed : undefined;
    const current = ran === undefined ? this.#rejected.get(key) : this.#managed.get(key);
    if (entry === undefined || current !== failed) return;
    if (ran !== undefined && ran.replica.state !== "failed") return;
    entry.attempts += 1;
    this.options.logger.warn("launching a failed replica afresh", {
      replicaId: key,
      attempt: entry.attempts,
      failure: ran?.replica.failure?.reason ?? failed.message,
      ...(ran === undefined ? {} : { previousPort: ran.apiPort }),
    });
    if (ran === undefined) this.#rejected.delete(key);
    else this.#retire(ran, "failed; launching it afresh on a new port");
    await this.#launch(failed.assignment, failed.restarts + 1);
  }

  #forgetRelaunch(key: string): void {
    const entry = this.#relaunches.get(key);
    if (entry?.timer !== undefined) clearTimeout(entry.timer);
    this.#relaunches.delete(key);
  }

  /**
   * The replica of `assignment`, or undefined when the agent refuses it (then `#rejected`).
   * `adoption`: for the engine a previous agent launched (see {@link adoptPrevious}), with
   * its key; the spec's policy rules are then reported, not enforced, and a spec that breaks
   * them gives an `adoptOnly` replica. Every launch comes without: the strict parse.
   */
  #prepare(
    assignment: ReplicaAssignment,
    apiPort: number,
    adoption?: { readonly apiKey: string | undefined },
  ): Managed | undefined {
    const key = assignment.replicaId;
    const apiKey = adoption?.apiKey;
    try {
      if (!assignment.deployment) {
        throw new AgentError("LLMGW_AGENT_ASSIGNMENT_REFUSED", "assignment carries no deployment");
      }
      let deployment: DeploymentSpec;
      let refused: string | undefined;
      if (adoption === undefined) {
        deployment = deploymentSpecFromProto(assignment.deployment);
      } else {
        const parsed = parseDeploymentSpec(deploymentInputFromProto(assignment.deployment), {
          policy: "report",
        });
        if (!parsed.ok) throw parsed.error;
        deployment = parsed.spec;
        if (parsed.refused !== undefined) {
          refused = `this release refuses the deployment spec its engine was launched from, so the agent does not launch it again (deploy a corrected spec): ${parsed.refused.message}`;
        }
      }
      const node = this.options.inventory();
      const world = assignment.world;
      const nnodes = Math.max(1, world?.nnodes ?? 1);
      if (nnodes === 1) {
        // Kernel-log faults are the control plane's to weigh (it alone knows of clears).
        const launchNode = withoutKernelLogFaults(node);
        const violations = validateLaunch({
          deployment,
          ranks: [{ nodeId: node.hostname, node: launchNode, gpuIndices: assignment.gpuIndices }],
        });
        if (violations.length > 0) {
          throw new AgentError(
            "LLMGW_AGENT_ASSIGNMENT_REFUSED",
            violations.map((v) => `${v.code}: ${v.message}`).join("; "),
          );
        }
      }
      if (deployment.trustRemoteCode && this.options.allowTrustRemoteCode !== true) {
        throw new AgentError(
          "LLMGW_AGENT_ASSIGNMENT_REFUSED",
          "trustRemoteCode runs the model repository's own Python code on this node; its operator allows that with `llmgw agent --allow-trust-remote-code` (LLMGW_ALLOW_TRUST_REMOTE_CODE=1)",
        );
      }
      if (this.options.modelRoot !== undefined) {
        const cwd = this.options.nodeConfig.cwd ?? process.cwd();
        checkModelRoot(deployment.model, deployment.engine, this.options.modelRoot, cwd);
      }
      const kvEventsEndpoint = deployment.kvEvents ? this.#kvEventsEndpoint(key) : undefined;
      const launch = buildLaunchSpec({
        ...(kvEventsEndpoint === undefined ? {} : { kvEventsEndpoint }),
        deployment,
        placement: {
          rank: assignment.rank,
          nnodes,
          ...(world?.rank0Address ? { rank0Address: world.rank0Address } : {}),
          ...(world?.rendezvousPort ? { rendezvousPort: world.rendezvousPort } : {}),
          gpuIndices: assignment.gpuIndices,
          ...(assignment.fabricId ? { fabricId: assignment.fabricId } : {}),
        },
        ports: { api: apiPort },
        node,
        nodeConfig: this.options.nodeConfig,
        ...(refused === undefined ? {} : { policy: "report" as const }),
      });
      const spec: ProcessSpec = {
        argv: launch.argv,
        env: { ...this.options.baseEnv, ...launch.env },
        ...(launch.cwd ? { cwd: launch.cwd } : {}),
        stopSignal: launch.stopSignal,
        stopGraceMs: launch.stopGraceMs,
        logFile: path.join(this.options.stateDir, "logs", `${key}.log`),
      };
      // The hash covers what identifies the process, secrets excluded, so a rotated token
      // does not restart a serving model.
      const specHash = hashProcessSpec(spec);
      const withSecrets: ProcessSpec = {
        ...spec,
        env: { ...spec.env, ...pickSecrets(this.options.secretEnv) },
        specHash,
      };
      const apiKeyEnv = launch.apiKeyEnv;
      const replica = createSupervisedReplica({
        supervisor: this.options.supervisor,
        replicaId: key,
        spec: withSecrets,
        // A fresh key for every process (first start and each restart), recorded before the
        // engine starts so that a restarted agent adopting it knows it.
        ...(apiKeyEnv === undefined
          ? {}
          : {
              launchEnv: async () => {
                managed.apiKey = generateEngineApiKey();
                if (this.#managed.get(key) === managed) await this.#persist(managed);
                return { [apiKeyEnv]: managed.apiKey };
              },
            }),
        probe: this.#probeFor(launch, apiPort, () => managed.apiKey),
        loadingDeadlineMs:
          deployment.loadingDeadlineSeconds !== undefined
            ? deployment.loadingDeadlineSeconds * 1000
            : this.options.defaultLoadingDeadlineMs,
        probeIntervalMs: this.options.probeIntervalMs,
        ...(refused === undefined ? {} : { adoptOnly: refused }),
        ...(this.options.restartPolicy === undefined
          ? {}
          : { restartPolicy: this.options.restartPolicy }),
      });
      const managed: Managed = {
        key,
        assignment,
        launch,
        specHash,
        apiPort,
        replica,
        stateSinceMs: Date.now(),
        message: "",
        load: undefined,
        loadScrapedAtMs: undefined,
        restarts: 0,
        refused,
        apiKey: apiKeyEnv === undefined ? undefined : apiKey,
        kvFeed:
          launch.kvEventsEndpoint === undefined
            ? undefined
            : createKvBlockFeed({
                endpoint: launch.kvEventsEndpoint,
                logger: {
                  info: (message, fields) =>
                    this.options.logger.info(message, { replicaId: key, ...fields }),
                  warn: (message, fields) =>
                    this.options.logger.warn(message, { replicaId: key, ...fields }),
                },
              }),
      };
      /** The engine process the KV feed's blocks come from. */
      let feedPid: number | undefined;
      replica.subscribe((t) => {
        // Leaving a state: how long the replica was in it.
        const stayedMs = t.atMs - managed.stateSinceMs;
        managed.stateSinceMs = t.atMs;
        managed.message = t.reason;
        if (t.to === "starting" && t.from === "exited" && t.reason.startsWith("restart")) {
          managed.restarts += 1;
        }
        // The engine's process ended, or another one runs now (not a probe's loading →
        // starting, nor an adopted process, the first this feed knows): its prefix cache is
        // gone. Routers must stop trusting its blocks now, not when the new process publishes.
        if (t.to === "exited") managed.kvFeed?.engineReplaced();
        if (t.to === "starting") {
          const pid = replica.handle?.pid;
          if (feedPid !== undefined && pid !== feedPid) managed.kvFeed?.engineReplaced();
          feedPid = pid;
        }
        if (t.to !== "ready") {
          managed.load = undefined;
          managed.loadScrapedAtMs = undefined;
        }
        const stableMs = this.#relaunchPolicy?.stableMs;
        if (t.from === "ready" && stableMs !== undefined && stayedMs >= stableMs) {
          // It served long enough: a later failure starts the backoff over.
          this.#forgetRelaunch(key);
        }
        // One adopted from a refused spec stays failed: a relaunch would run that spec (and
        // the strict parse of #launch would refuse it anyway).
        if (t.to === "failed" && this.#managed.get(key) === managed && refused === undefined) {
          this.#scheduleRelaunch(key, managed);
        }
      });
      this.#rejected.delete(key);
      this.#managed.set(key, managed);
      return managed;
    } catch (error) {
      const message = (error as Error).message;
      // Codes of the agent (refusal, model root) and of the engines (env allow-list) alike.
      const code = (error as { code?: unknown }).code;
      this.options.logger.warn("cannot run assigned replica", {
        replicaId: key,
        ...(typeof code === "string" ? { code } : {}),
        error: message,
      });
      this.#rejected.set(key, { assignment, message, atMs: Date.now(), restarts: 0 });
      return undefined;
    }
  }

  #probeFor(
    launch: LaunchSpec,
    apiPort: number,
    apiKey: () => string | undefined,
  ): () => Promise<ProbeOutcome> {
    const readiness = launch.readiness;
    if (!readiness) return async () => "ready";
    const baseUrl = `http://${this.#localHost}:${apiPort}`;
    return () =>
      this.options.probes.probe(baseUrl, readiness, this.options.probeTimeoutMs, apiKey());
  }

  /** {@link ReplicaManagerOptions.localAddress} as a URL host (IPv6 in brackets). */
  get #localHost(): string {
    const address = this.options.localAddress;
    return address.includes(":") ? `[${address}]` : address;
  }

  #retire(managed: Managed, reason: string): void {
    const key = managed.key;
    this.#managed.delete(key);
    void managed.kvFeed?.close();
    this.options.logger.info("stopping replica", { replicaId: key, reason });
    const previous = this.#stopping.get(key) ?? Promise.resolve();
    const done: Promise<void> = previous
      .then(() => managed.replica.stop())
      .then(
        () => undefined,
        (error: unknown) => {
          this.options.logger.warn("stop failed", {
            replicaId: key,
            error: (error as Error).message,
          });
        },
      )
      .then(async () => {
        // Keep the record if a replacement for the same id was started meanwhile.
        if (!this.#managed.has(key)) await rm(this.#recordPath(key), { force: true });
      })
      .finally(() => {
        if (this.#stopping.get(key) === done) this.#stopping.delete(key);
      });
    this.#stopping.set(key, done);
  }

  /**
   * Where replica `key`'s engine publishes its KV-cache events: a unix socket in the agent's
   * state directory (owner-only; events carry the prompts' token ids, so they never leave the
   * node). Named by a hash of the id: socket paths are short (108 bytes on Linux), and the same
   * id gets the same path, so an adopted engine is found again.
   */
  #kvEventsEndpoint(key: string): string {
    const dir = path.join(this.options.stateDir, "kv");
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const name = createHash("sha256").update(key).digest("hex").slice(0, 16);
    return `ipc://${path.join(dir, `${name}.ipc`)}`;
  }

  /** Where `KvCacheService` serves the feeds below: reported with each replica that has one. */
  setKvEventsPort(port: number | undefined): void {
    this.#kvEventsPort = port;
  }

  /** The KV-cache feeds of the replicas that publish events, for `KvCacheService`. */
  kvFeeds(): KvFeedRegistry {
    return {
      get: (replicaId) => {
        const m = this.#managed.get(replicaId);
        return m?.kvFeed === undefined ? undefined : { feed: m.kvFeed, apiKey: m.apiKey };
      },
    };
  }

  #recordPath(key: string): string {
    return path.join(this.recordsDir, `${key}.json`);
  }

  async #persist(managed: Managed): Promise<void> {
    await mkdir(this.recordsDir, { recursive: true, mode: 0o700 });
    const record: ReplicaRecord = {
      version: 1,
      assignment: toJsonString(ReplicaAssignmentSchema, managed.assignment),
      apiPort: managed.apiPort,
      ...(managed.apiKey === undefined ? {} : { engineApiKey: managed.apiKey }),
    };
    const target = this.#recordPath(managed.key);
    await writeFile(`${target}.tmp`, JSON.stringify(record), { mode: 0o600 });
    await rename(`${target}.tmp`, target);
  }

  /**
   * Starts scraping engine load signals of ready rank-0 replicas every `intervalMs`. Engines
   * are scraped side by side, and an engine whose previous scrape has not finished is skipped
   * at that tick: a slow `/metrics` (a busy engine, a scrape timeout longer than the
   * interval) then costs one connection, not one more every interval. A scrape that fails
   * leaves the engine's load unknown until one succeeds. Calling it again restarts the timer.
   *
   * `onScraped` (the load reporter) runs once the scrapes a tick started have all finished,
   * and at the start of every tick, so that the result of a scrape slower than the interval
   * goes out at the next tick instead of waiting for a round it did not start in. It reads
   * {@link loadSamples}; a throw is logged, never stops the scraping.
   */
  startLoadScraping(intervalMs: number, onScraped?: () => void): void {
    const scrape = async (managed: Managed) => {
      const url = `http://${this.#localHost}:${managed.apiPort}${managed.launch.metricsPath}`;
      let load: EngineLoadSignals | undefined;
      try {
        load = await this.options.probes.scrapeLoad(
          url,
          this.options.probeTimeoutMs,
          managed.apiKey,
        );
      } catch {
        load = undefined;
      } finally {
        this.#scraping.delete(managed);
      }
      // A replica that stopped being ready during the scrape keeps its load cleared.
      if (managed.replica.state !== "ready") return;
      managed.load = load;
      managed.loadScrapedAtMs = Date.now();
    };
    const notify = () => {
      if (onScraped === undefined) return;
      try {
        onScraped();
      } catch (error) {
        this.options.logger.warn("handing on engine load failed", {
          error: (error as Error).message,
        });
      }
    };
    const tick = () => {
      notify();
      const round: Promise<void>[] = [];
      for (const managed of this.#managed.values()) {
        if (managed.replica.state !== "ready" || managed.launch.apiPort === undefined) continue;
        if (this.#scraping.has(managed)) continue;
        this.#scraping.add(managed);
        round.push(scrape(managed));
      }
      if (round.length > 0) void Promise.all(round).then(notify);
    };
    if (this.#loadTimer) clearInterval(this.#loadTimer);
    this.#loadTimer = setInterval(tick, intervalMs);
    this.#loadTimer.unref();
  }

  /**
   * The last scrape of every ready rank-0 replica scraped since it became ready: what the
   * load reporter compares with what it last sent. A replica not ready is left out (its state
   * goes with the heartbeat), and so is one not scraped yet.
   */
  loadSamples(): ReplicaLoadSample[] {
    const out: ReplicaLoadSample[] = [];
    for (const m of this.#managed.values()) {
      if (m.replica.state !== "ready" || m.loadScrapedAtMs === undefined) continue;
      out.push({ replicaId: m.key, load: m.load, scrapedAtMs: m.loadScrapedAtMs });
    }
    return out;
  }

  /** Pids of every engine this agent manages (discovery must not flag their GPU memory). */
  managedPids(): Set<number> {
    const pids = new Set<number>();
    for (const m of this.#managed.values()) if (m.replica.handle) pids.add(m.replica.handle.pid);
    return pids;
  }

  /**
   * Restarts the engine processes of the replicas that use GPU `index`, for a live kernel-log
   * fault whose catalog action is to restart the application (Xid 13, 31, 45, 94: the engine's
   * context on the GPU is broken, the GPU is fine). The process group is stopped with the
   * replica's own stop signal and grace, and the supervisor's crash path relaunches it (its
   * backoff and give-up policy apply, and the restart is counted like a crash's). Calls that
   * arrive while that stop is under way join it. Returns the replica ids being restarted.
   */
  restartReplicasOnGpu(index: number, reason: string): string[] {
    const restarting: string[] = [];
    for (const managed of this.#managed.values()) {
      if (!managed.assignment.gpuIndices.includes(index)) continue;
      const handle = managed.replica.handle;
      if (handle === undefined || handle.exit() !== undefined) continue;
      restarting.push(managed.key);
      this.options.logger.warn("restarting the engine: its GPU reported a fault", {
        replicaId: managed.key,
        gpu: index,
        reason,
      });
      handle
        .stop({ signal: managed.launch.stopSignal, graceMs: managed.launch.stopGraceMs })
        .catch((error: unknown) => {
          this.options.logger.warn("could not stop the engine for a restart", {
            replicaId: managed.key,
            error: (error as Error).message,
          });
        });
    }
    return restarting;
  }

  /**
   * The API keys of the serving engines running now, for Register and every heartbeat: the
   * control plane keeps them in memory and hands them to routers only.
   */
  engineCredentials(): EngineCredential[] {
    const out: EngineCredential[] = [];
    for (const m of this.#managed.values()) {
      if (m.apiKey === undefined) continue;
      out.push(create(EngineCredentialSchema, { replicaId: m.key, apiKey: m.apiKey }));
    }
    return out;
  }

  /**
   * Every engine API key this agent holds, for scrubbing text that leaves the node (log
   * tails): an engine may print its own key.
   */
  engineApiKeys(): string[] {
    const keys: string[] = [];
    for (const m of this.#managed.values()) if (m.apiKey !== undefined) keys.push(m.apiKey);
    return keys;
  }

  /**
   * What the heartbeat reports: one status per replica rank, rejected ones as FAILED. Log
   * tails and messages are redacted first (see {@link createRedactor}): every secret the agent
   * holds — its secret env (HF_TOKEN…) and the engine API keys — and common token shapes.
   */
  statuses(): ReplicaStatus[] {
    const out: ReplicaStatus[] = [];
    const redact = createRedactor([
      ...Object.values(this.options.secretEnv),
      ...this.engineApiKeys(),
    ]);
    for (const m of this.#managed.values()) {
      const handle = m.replica.handle;
      const failure = m.replica.failure;
      const lastExit = handle?.exit();
      out.push(
        create(ReplicaStatusSchema, {
          replicaId: m.key,
          rank: m.assignment.rank,
          state: PROTO_STATE[m.replica.state],
          pid: handle?.pid,
          apiPort: m.launch.apiPort,
          startedAtUnixMs: handle ? BigInt(Math.round(handle.startedAtMs)) : undefined,
          restarts: m.restarts,
          lastExit: lastExit
            ? create(ExitInfoSchema, {
                code: lastExit.code ?? undefined,
                signal: lastExit.signal ?? undefined,
                atUnixMs: BigInt(Math.round(lastExit.atMs)),
              })
            : undefined,
          logTail: failure ? failure.tail.slice(-40).map(redact) : [],
          load: m.load ? create(EngineLoadSchema, m.load) : undefined,
          // The scrape that load (or its absence, a failed scrape) came from, which orders it
          // against the load reports at the control plane.
          loadScrapedAtUnixMs:
            m.loadScrapedAtMs === undefined ? undefined : BigInt(Math.round(m.loadScrapedAtMs)),
          message: redact(
            failure
              ? this.#failureMessage(m.key, failure.reason)
              : m.refused === undefined
                ? m.message
                : [m.message, m.refused].filter((s) => s !== "").join("; "),
          ),
          stateSinceUnixMs: BigInt(Math.round(m.stateSinceMs)),
          specHash: m.specHash,
          revision: m.assignment.deployment?.revision ?? 0n,
          adopted: handle?.adopted ?? false,
          kvEventsPort: m.kvFeed === undefined ? undefined : this.#kvEventsPort,
        }),
      );
    }
    for (const [key, r] of this.#rejected) {
      out.push(
        create(ReplicaStatusSchema, {
          replicaId: key,
          rank: r.assignment.rank,
          state: ProtoReplicaState.FAILED,
          message: redact(this.#failureMessage(key, r.message)),
          stateSinceUnixMs: BigInt(r.atMs),
          revision: r.assignment.deployment?.revision ?? 0n,
        }),
      );
    }
    return out;
  }

  /** A failure's reason, and when the agent launches the replica afresh. */
  #failureMessage(key: string, reason: string): string {
    const atMs = this.#relaunches.get(key)?.atMs;
    if (atMs === undefined) return reason;
    return `${reason}; the agent launches it afresh at ${new Date(atMs).toISOString()}`;
  }

  /**
   * Stops load scraping. With `stopEngines`, stops every engine and forgets it; otherwise
   * engines keep running (own process groups, output to files), unsupervised, for the next
   * agent to adopt, and the caller ends the process.
   */
  async close(stopEngines: boolean): Promise<void> {
    if (this.#loadTimer) clearInterval(this.#loadTimer);
    for (const key of [...this.#relaunches.keys()]) this.#forgetRelaunch(key);
    await this.#applying;
    if (stopEngines) {
      for (const managed of [...this.#managed.values()]) this.#retire(managed, "agent stopping");
    } else {
      // Left to the next agent, which adopts them: this one no longer probes or restarts them.
      for (const managed of this.#managed.values()) managed.replica.release();
    }
    await Promise.all([
      ...this.#stopping.values(),
      ...[...this.#managed.values()].map((m) => m.kvFeed?.close()),
    ]);
  }
}

function pickSecrets(env: Readonly<Record<string, string>>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of SECRET_ENV_NAMES) {
    const value = env[name];
    if (value) out[name] = value;
  }
  return out;
}

/**
 * A new engine API key: `llmgw-engine-` and 32 random bytes, base64url (a header-safe token
 * that every engine accepts).
 */
export function generateEngineApiKey(): string {
  return `llmgw-engine-${randomBytes(32).toString("base64url")}`;
}
