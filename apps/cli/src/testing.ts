import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { create } from "@bufbuild/protobuf";
import type { ServiceImpl } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import {
  ClusterService,
  type Replica,
  ReplicaSchema,
  ReplicaState,
  RetirementPhase,
} from "@llmgw/proto";
import type { CliIo } from "./command.js";

/** A `CliIo` for command tests: output discarded, no environment, never aborted. */
export function quietIo(): CliIo {
  return {
    stdout: { write: () => true },
    stderr: { write: () => true },
    env: {},
    cwd: process.cwd(),
    signal: new AbortController().signal,
  };
}

/** A `CliIo` that keeps what a command writes, with an abort controller to interrupt it. */
export interface CapturedIo extends CliIo {
  readonly out: () => string;
  readonly err: () => string;
  readonly abort: AbortController;
}

/** A {@link CapturedIo} with `env` (e.g. LLMGW_CONTROL_PLANE, LLMGW_ADMIN_TOKEN). */
export function capturedIo(env: Record<string, string>): CapturedIo {
  let out = "";
  let err = "";
  const abort = new AbortController();
  return {
    stdout: { write: (chunk: string) => (out += chunk) },
    stderr: { write: (chunk: string) => (err += chunk) },
    env,
    cwd: process.cwd(),
    signal: abort.signal,
    out: () => out,
    err: () => err,
    abort,
  };
}

/** A ClusterService on loopback (port 0) that serves `routes`; every other method is Unimplemented. */
export interface FakeClusterService {
  readonly url: string;
  /** The environment an admin command needs to reach it. */
  readonly env: Record<string, string>;
  close(): Promise<void>;
}

/**
 * Starts a real Connect server on 127.0.0.1:0 with a partial ClusterService, for testing
 * admin commands over the wire (auth is not checked: the token only has to be present).
 */
export async function startFakeClusterService(
  routes: Partial<ServiceImpl<typeof ClusterService>>,
): Promise<FakeClusterService> {
  const server = createServer(
    connectNodeAdapter({ routes: (router) => router.service(ClusterService, routes) }),
  );
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    env: { LLMGW_CONTROL_PLANE: url, LLMGW_ADMIN_TOKEN: "test-admin-token" },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A fixed "now" for tests that build cluster data (2026-11-30T…). */
export const TEST_NOW_MS = 1_796_000_000_000;
const T0 = TEST_NOW_MS;

export interface TestReplicaOptions {
  state?: ReplicaState;
  revision?: number;
  /** What the agent reports it runs; default: `revision`. */
  runs?: number;
  nodes?: string[];
  endpoint?: string;
  stateSinceMs?: number;
  message?: string;
  waiting?: string;
  draining?: { reason: string; inFlight?: number; deadlineMs?: number };
}

/**
 * A replica as the control plane lists it, for tests: one rank per node (GPU index = rank),
 * each with a status unless PENDING; `waiting`/`draining` give it a retirement with that
 * reason code.
 */
export function testReplica(id: string, o: TestReplicaOptions = {}): Replica {
  const state = o.state ?? ReplicaState.READY;
  const revision = BigInt(o.revision ?? 1);
  return create(ReplicaSchema, {
    replicaId: id,
    deployment: id.replace(/-\d+$/, ""),
    revision,
    state,
    endpoint: o.endpoint ?? "",
    createdAtUnixMs: BigInt(T0 - 60_000),
    ranks: (o.nodes ?? ["node-a"]).map((nodeId, rank) => ({
      replicaId: id,
      rank,
      nodeId,
      gpuIndices: [rank],
      ...(state === ReplicaState.PENDING
        ? {}
        : {
            status: {
              replicaId: id,
              rank,
              state,
              stateSinceUnixMs: BigInt(o.stateSinceMs ?? 0),
              revision: BigInt(o.runs ?? o.revision ?? 1),
              message: o.message ?? "",
            },
          }),
    })),
    ...(o.waiting !== undefined
      ? {
          retirement: {
            reason: { code: o.waiting, message: "" },
            phase: RetirementPhase.WAITING,
            sinceUnixMs: BigInt(T0),
          },
        }
      : o.draining !== undefined
        ? {
            retirement: {
              reason: { code: o.draining.reason, message: "" },
              phase: RetirementPhase.DRAINING,
              sinceUnixMs: BigInt(T0),
              drainingSinceUnixMs: BigInt(T0),
              ...(o.draining.deadlineMs === undefined
                ? {}
                : { drainDeadlineUnixMs: BigInt(o.draining.deadlineMs) }),
              ...(o.draining.inFlight === undefined ? {} : { inFlight: o.draining.inFlight }),
            },
          }
        : {}),
  });
}
