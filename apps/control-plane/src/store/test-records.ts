import type {
  ApiKeyRecord,
  AvoidedNodeRecord,
  ClusterStore,
  DeploymentRecord,
  DeploymentRevisionRecord,
  NodeRecord,
  PlacementRecord,
  RetirementRecord,
  RolloutRecord,
  TenantRecord,
} from "./types.js";

/*
 * Records of the lifecycle's store fields (schema v6) for the store tests of both engines:
 * every new field set, and the same kinds of record with each left absent. Epoch ms are
 * real ones, beyond 32 bits.
 */

const T = 1_800_000_000_000;

export const WAITING: RetirementRecord = {
  code: "scale-down",
  message: "scaled from 3 to 2 replicas",
  phase: "waiting",
  sinceMs: T,
};

export const DRAINING: RetirementRecord = {
  code: "rollout",
  message: "replaced by revision 10",
  phase: "draining",
  sinceMs: T,
  drainingSinceMs: T + 1_000,
  deadlineMs: T + 301_000,
};

export const ROLLOUT: RolloutRecord = {
  state: "in-progress",
  fromRevision: 3,
  toRevision: 10,
  message: "1 of 3 replicas on revision 10",
  startedAtMs: T,
  updatedAtMs: T + 5_000,
};

export const deployment = (name: string, extra: Partial<DeploymentRecord> = {}) =>
  ({
    name,
    specJson: `{"name":"${name}"}`,
    revision: 10,
    createdAtMs: T,
    updatedAtMs: T + 5_000,
    ...extra,
  }) satisfies DeploymentRecord;

export const revision = (name: string, n: number): DeploymentRevisionRecord => ({
  name,
  revision: n,
  specJson: `{"name":"${name}","revision":${n}}`,
});

export const placement = (replicaId: string, extra: Partial<PlacementRecord> = {}) =>
  ({
    replicaId,
    deployment: "chat",
    revision: 10,
    ranks: [{ rank: 0, nodeId: "a-1", gpuIndices: [0, 1] }],
    createdAtMs: T,
    ...extra,
  }) satisfies PlacementRecord;

export const node = (id: string, extra: Partial<NodeRecord> = {}) =>
  ({
    id,
    hostname: id,
    credentialHash: "ee",
    inventory: new Uint8Array([1, 2, 3]),
    advertiseAddress: "10.0.0.1",
    cordoned: false,
    draining: false,
    revoked: false,
    registeredAtMs: T,
    ...extra,
  }) satisfies NodeRecord;

/** What {@link putLifecycleRecords} stores, each list in the order the stores list it. */
export const LIFECYCLE = {
  deployments: [deployment("chat", { rollout: ROLLOUT }), deployment("code")],
  // Revision 10 after 3: by number, not as text.
  revisions: [revision("chat", 3), revision("chat", 10), revision("code", 1)],
  placements: [
    placement("chat-0", { retirement: DRAINING }),
    placement("chat-1", { retirement: WAITING }),
    placement("chat-2"),
  ],
  nodes: [
    node("a-1", { draining: true, drainedBy: "agent" }),
    node("b-1", { draining: true, drainedBy: "operator", registeredAtMs: T + 1 }),
    node("c-1", { registeredAtMs: T + 2 }),
  ],
};

/** Stores every record of {@link LIFECYCLE}, revisions out of order. */
export function putLifecycleRecords(store: ClusterStore): void {
  for (const r of LIFECYCLE.deployments) store.putDeployment(r);
  for (const r of [...LIFECYCLE.revisions].reverse()) store.putDeploymentRevision(r);
  for (const r of LIFECYCLE.placements) store.putPlacement(r);
  for (const r of LIFECYCLE.nodes) store.putNode(r);
}

/** The lifecycle fields a record read back carries as own keys: absent must be absent. */
export function lifecycleKeys(store: ClusterStore): string[] {
  return [
    ...store.listDeployments().flatMap((d) => (Object.hasOwn(d, "rollout") ? [d.name] : [])),
    ...store.listPlacements().flatMap((p) => (Object.hasOwn(p, "retirement") ? [p.replicaId] : [])),
    ...store.listNodes().flatMap((n) => (Object.hasOwn(n, "drainedBy") ? [n.id] : [])),
  ];
}

/**
 * Tenants and keys of theirs with every field of schema 7 set or absent, as the stores list
 * them: tenants by name, keys oldest first.
 */
export const TENANCY = {
  tenants: [
    {
      name: "batch-jobs",
      budgets: [],
      weight: 1,
      createdAtMs: T,
      updatedAtMs: T,
    },
    {
      name: "search",
      requestsPerMinute: 600,
      tokensPerMinute: 4_294_967_295,
      maxConcurrency: 8,
      budgets: [
        { period: "day", tokens: 1_000_000 },
        { period: "month", model: "llama-3-8b", tokens: Number.MAX_SAFE_INTEGER },
      ],
      priority: "critical",
      weight: 1000,
      cacheIsolation: "key",
      createdAtMs: T + 1,
      updatedAtMs: T + 2,
    },
  ] satisfies TenantRecord[],
  keys: [
    {
      id: "key_a",
      name: "search-app",
      prefix: "sk-llmgw-aaaa",
      secretHash: "aa",
      models: [],
      budgets: [{ period: "day", model: "chat", tokens: 5 }],
      createdAtMs: T,
      tenant: "search",
      priority: "batch",
    },
    {
      id: "key_b",
      name: "plain",
      prefix: "sk-llmgw-bbbb",
      secretHash: "bb",
      models: ["chat"],
      budgets: [],
      createdAtMs: T + 1,
    },
  ] satisfies ApiKeyRecord[],
};

/** Stores every record of {@link TENANCY}, tenants out of order. */
export function putTenancyRecords(store: ClusterStore): void {
  for (const r of [...TENANCY.tenants].reverse()) store.putTenant(r);
  for (const r of TENANCY.keys) store.putApiKey(r);
}

/** Avoided nodes as the stores list them: by deployment, then node id (a-1 under both). */
export const AVOIDED: readonly AvoidedNodeRecord[] = [
  { deployment: "chat", nodeId: "a-1", untilMs: T + 3_600_000, moves: 1, movedAtMs: T },
  { deployment: "chat", nodeId: "b-1", untilMs: T + 14_400_000, moves: 3, movedAtMs: T + 5 },
  { deployment: "code", nodeId: "a-1", untilMs: T - 1, moves: 1, movedAtMs: T - 3_600_001 },
];

/**
 * Stores {@link AVOIDED} out of order, a record replaced and one deleted on the way; returns
 * what the store must list afterwards.
 */
export function putAvoidedRecords(store: ClusterStore): AvoidedNodeRecord[] {
  const [chatA, chatB, codeA] = AVOIDED as [
    AvoidedNodeRecord,
    AvoidedNodeRecord,
    AvoidedNodeRecord,
  ];
  store.putAvoidedNode(codeA);
  store.putAvoidedNode({ ...chatB, moves: 2, untilMs: T });
  store.putAvoidedNode(chatA);
  store.putAvoidedNode({ deployment: "gone", nodeId: "a-1", untilMs: T, moves: 1, movedAtMs: T });
  store.putAvoidedNode(chatB);
  store.deleteAvoidedNode("gone", "a-1");
  // Deleting what is not there is no error.
  store.deleteAvoidedNode("gone", "a-1");
  return [...AVOIDED];
}
