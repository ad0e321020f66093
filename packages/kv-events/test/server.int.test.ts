import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { KvCacheService } from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import { MAX_WATCH_REQUEST_BYTES, startKvCacheServer } from "../src/server.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

describe("KvCacheService's HTTP server", () => {
  it("refuses a request message larger than MAX_WATCH_REQUEST_BYTES before reading it", async () => {
    // The request is read whole before the engine key is checked; Connect's default bound is
    // 4 GiB, so anyone who reached the port could make the agent buffer that much.
    const server = await startKvCacheServer({ registry: { get: () => undefined } });
    cleanups.push(() => server.close());
    const client = createClient(
      KvCacheService,
      createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" }),
    );
    const watch = async (replicaId: string): Promise<unknown> => {
      try {
        for await (const _ of client.watchBlocks({ replicaId })) return undefined;
      } catch (error) {
        return error;
      }
    };
    const big = (await watch("r".repeat(MAX_WATCH_REQUEST_BYTES + 1))) as ConnectError;
    expect(big).toBeInstanceOf(ConnectError);
    expect(big.code).toBe(Code.ResourceExhausted);
    // A request within the bound reaches the key check.
    const small = (await watch("r")) as ConnectError;
    expect(small.code).toBe(Code.Unauthenticated);
  });
});
