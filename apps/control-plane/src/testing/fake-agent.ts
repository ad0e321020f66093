import { create } from "@bufbuild/protobuf";
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  AgentService,
  type GpuReading,
  GpuReadingSchema,
  type NodeInventory,
  type ReplicaAssignment,
  ReplicaState,
  type ReplicaStatus,
  ReplicaStatusSchema,
} from "@llmgw/proto";

/** Options of {@link FakeAgent}. */
export interface FakeAgentOptions {
  /** The control listener, e.g. `cp.controlUrl`. */
  readonly controlUrl: string;
  readonly joinToken: string;
  readonly inventory: NodeInventory;
  /** Default "127.0.0.1". */
  readonly advertiseAddress?: string;
}

/** What the fake agent reports for one rank it was assigned; unset fields take defaults. */
export type FakeRankReport = Partial<Omit<ReplicaStatus, "replicaId" | "rank" | "$typeName">>;

/**
 * A lightweight agent over a real Connect client: registers an inventory, heartbeats, and
 * reports replica states it is told to (no engines run). For control-plane integration tests
 * and benchmarks; the real agent lives in `apps/agent`.
 */
export class FakeAgent {
  readonly client: Client<typeof AgentService>;
  readonly options: FakeAgentOptions;
  nodeId: string | undefined;
  credential: string | undefined;
  generation = 0n;
  assignments: readonly ReplicaAssignment[] = [];
  /** GPU readings sent with each heartbeat; default: every GPU healthy. */
  gpus: GpuReading[];
  readonly #reports = new Map<string, FakeRankReport>();
  /** Report used for assigned ranks without an explicit {@link report}. */
  defaultReport: FakeRankReport = { state: ReplicaState.STARTING };

  constructor(options: FakeAgentOptions) {
    this.options = options;
    this.client = createClient(
      AgentService,
      createConnectTransport({ httpVersion: "1.1", baseUrl: options.controlUrl }),
    );
    this.gpus = options.inventory.gpus.map((g) =>
      create(GpuReadingSchema, { index: g.index, uuid: g.uuid, healthy: true }),
    );
  }

  /**
   * Registers, keeping `nodeId` as previous id when set and proving it with `credential`,
   * like a restarted agent.
   */
  async register(joinToken = this.options.joinToken): Promise<string> {
    const res = await this.client.register(
      {
        inventory: this.options.inventory,
        previousNodeId: this.nodeId,
        previousNodeCredential: this.credential,
        advertiseAddress: this.options.advertiseAddress ?? "127.0.0.1",
        replicas: this.#statuses(),
      },
      { headers: { authorization: `Bearer ${joinToken}` } },
    );
    this.nodeId = res.nodeId;
    this.credential = res.nodeCredential;
    return res.nodeId;
  }

  /** Sets what to report for a rank from now on. */
  report(replicaId: string, rank: number, report: FakeRankReport): void {
    this.#reports.set(`${replicaId}#${rank}`, report);
  }

  /** Sends one heartbeat and stores the desired set it returns. */
  async heartbeat(): Promise<readonly ReplicaAssignment[]> {
    if (!this.nodeId || !this.credential) throw new Error("register first");
    const res = await this.client.heartbeat(
      {
        nodeId: this.nodeId,
        generationSeen: this.generation,
        gpus: this.gpus,
        replicas: this.#statuses(),
        sentAtUnixMs: BigInt(Date.now()),
      },
      { headers: { authorization: `Bearer ${this.credential}` } },
    );
    this.generation = res.generation;
    // `unchanged`: the set of the generation it reported, kept from before.
    if (!res.unchanged) this.assignments = res.assignments;
    return this.assignments;
  }

  /** Replica ids of the current desired set, sorted. */
  replicaIds(): string[] {
    return this.assignments.map((a) => a.replicaId).sort();
  }

  #statuses(): ReplicaStatus[] {
    return this.assignments.map((a) => {
      const report = this.#reports.get(`${a.replicaId}#${a.rank}`) ?? this.defaultReport;
      return create(ReplicaStatusSchema, {
        ...report,
        replicaId: a.replicaId,
        rank: a.rank,
        revision: a.deployment?.revision ?? 0n,
      });
    });
  }
}
